"""Figures written next to metrics: PNGs for DVC plots and MLflow artifacts."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import LogLocator, ScalarFormatter  # noqa: E402


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")  # a legend below the axes is kept
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
    """Best-so-far latency against measured trials, one line per tuning run (styled as in
    latency_over_time)."""
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    style = _styles(list(curves))
    for label, curve in curves.items():
        ax.plot(range(1, len(curve) + 1), curve, label=label, linewidth=1.2, **style[label])
    ax.set(xlabel="measured trials", ylabel=ylabel, title=title, yscale="log")
    _log_ticks_and_legend(ax)
    return _save(fig, path)


def _styles(labels: list[str]) -> dict[str, dict]:
    """"<subject> <model>" labels: one colour per subject, one line style per model."""
    split = {label: label.rsplit(" ", 1) if " " in label else (label, label) for label in labels}
    subjects = list(dict.fromkeys(s for s, _ in split.values()))
    models = list(dict.fromkeys(m for _, m in split.values()))
    return {label: {"color": f"C{subjects.index(s) % 10}",
                    "linestyle": ("-", "--", ":", "-.")[models.index(m) % 4]}
            for label, (s, m) in split.items()}


def _log_ticks_and_legend(ax) -> None:
    """Plain numbers on a log latency axis, and the legend below the axes, off the curves."""
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 1.2, 1.5, 2.0, 3.0, 5.0)))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(plt.NullFormatter())
    if ax.lines:
        ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.15),
                  frameon=False)


def latency_over_time(path: Path, curves: dict[str, list[tuple[float, float]]], title: str,
                      ylabel: str = "tuned tasks' latency (us)") -> Path:
    """Best-so-far latency against tuning wall time, one line per tuning run. Labels are
    "<subject> <model>": one colour per subject, one line style per model."""
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    style = _styles(list(curves))
    for label, points in curves.items():
        if points:
            seconds, values = zip(*points)
            ax.step(seconds, values, where="post", label=label, linewidth=1.2, **style[label])
    ax.set(xlabel="tuning time (s)", ylabel=ylabel, title=title, yscale="log")
    _log_ticks_and_legend(ax)
    return _save(fig, path)
