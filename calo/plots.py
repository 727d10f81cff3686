"""Figures written next to metrics: PNGs for DVC plots and MLflow artifacts."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt  # noqa: E402


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def reliability_diagram(path: Path, levels, curves: dict[str, list[float]], title: str) -> Path:
    """Observed coverage of central predictive intervals against their confidence level."""
    fig, ax = plt.subplots(figsize=(4.5, 4.5), dpi=120)
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="ideal")
    for label, observed in curves.items():
        ax.plot(levels, observed, marker="o", markersize=3, label=label)
    ax.set(xlabel="confidence level of the central interval", ylabel="observed coverage",
           xlim=(0, 1), ylim=(0, 1), title=title)
    ax.legend(loc="upper left", fontsize=8)
    return _save(fig, path)


def best_so_far(path: Path, curves: dict[str, list[float]], title: str,
                ylabel: str = "best latency so far (us)") -> Path:
    """Best-so-far latency against measured trials, one line per tuning run."""
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for label, curve in curves.items():
        ax.plot(range(1, len(curve) + 1), curve, label=label, linewidth=1.2)
    ax.set(xlabel="measured trials", ylabel=ylabel, title=title, yscale="log")
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def latency_over_time(path: Path, curves: dict[str, list[tuple[float, float]]], title: str,
                      ylabel: str = "tuned tasks' latency (us)") -> Path:
    """Best-so-far latency against tuning wall time, one line per tuning run. Labels are
    "<subject> <model>": one colour per subject, one line style per model."""
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    subjects = list(dict.fromkeys(label.rsplit(" ", 1)[0] for label in curves))
    models = list(dict.fromkeys(label.rsplit(" ", 1)[-1] for label in curves))
    for label, points in curves.items():
        if points:
            seconds, values = zip(*points)
            subject, model = label.rsplit(" ", 1) if " " in label else (label, label)
            ax.step(seconds, values, where="post", label=label, linewidth=1.2,
                    color=f"C{subjects.index(subject) % 10}",
                    linestyle=("-", "--", ":", "-.")[models.index(model) % 4])
    ax.set(xlabel="tuning time (s)", ylabel=ylabel, title=title, yscale="log")
    if ax.lines:
        ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)
