"""Figures written next to metrics: PNGs for DVC plots and MLflow artifacts."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import LogLocator, ScalarFormatter  # noqa: E402


def _save(fig, path: Path, rect: tuple[float, float, float, float] = (0, 0, 1, 1)) -> Path:
    fig.tight_layout(rect=rect)
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
    """Best-so-far latency against measured trials, one line per tuning run (laid out as in
    latency_over_time)."""
    return _lines(path, {label: list(enumerate(curve, 1)) for label, curve in curves.items()},
                  title, "measured trials", ylabel, step=False)


def latency_over_time(path: Path, curves: dict[str, list[tuple[float, float]]], title: str,
                      ylabel: str = "tuned tasks' latency (us)") -> Path:
    """Best-so-far latency against tuning wall time, one line per tuning run. Labels are
    "<subject> <model>": one colour per subject and one line style per model, or, past
    MAX_SUBJECTS_PER_AXES subjects, one small panel per subject and one colour per model."""
    return _lines(path, curves, title, "tuning time (s)", ylabel, step=True)


# More subjects than this on one axes is a tangle of lines: one panel per subject instead.
MAX_SUBJECTS_PER_AXES = 3
PANEL_COLUMNS = 3
# A panel's title as wide as its panel, in two lines at most: TVM names a workload read from a
# plain database after its blocks, which can run across the next panel.
PANEL_TITLE_CHARS = 40


def _panel_title(subject: str) -> str:
    return "\n".join(textwrap.wrap(subject, PANEL_TITLE_CHARS, max_lines=2, placeholder=" ..."))


def _lines(path: Path, curves: dict[str, list[tuple[float, float]]], title: str,
           xlabel: str, ylabel: str, step: bool) -> Path:
    split = {label: label.rsplit(" ", 1) if " " in label else (label, label) for label in curves}
    subjects = list(dict.fromkeys(s for s, _ in split.values()))
    models = list(dict.fromkeys(m for _, m in split.values()))
    panels = len(subjects) > MAX_SUBJECTS_PER_AXES
    rows = -(-len(subjects) // PANEL_COLUMNS) if panels else 1
    cols = PANEL_COLUMNS if panels else 1
    fig, grid = plt.subplots(rows, cols, figsize=(4 * cols if panels else 7, 3 * rows + 1.5),
                             dpi=120, squeeze=False)
    axes = {s: grid.flat[subjects.index(s) if panels else 0] for s in subjects}
    for label, points in curves.items():
        subject, model = split[label]
        colour = models.index(model) if panels else subjects.index(subject)
        style = {"color": f"C{colour % 10}",
                 "linestyle": "-" if panels else ("-", "--", ":", "-.")[models.index(model) % 4]}
        if points:
            x, y = zip(*points)
            draw = axes[subject].step if step else axes[subject].plot
            draw(x, y, label=model if panels else label, linewidth=1.2,
                 **({"where": "post"} if step else {}), **style)
    for subject, ax in axes.items():
        ax.set(xlabel=xlabel, ylabel=ylabel, yscale="log")
        ax.set_title(_panel_title(subject) if panels else title, fontsize=10 if panels else None)
        _log_ticks(ax)
    for ax in grid.flat[len(subjects):] if panels else []:
        ax.set_visible(False)
    first = grid.flat[0]
    if first.lines:
        handles, labels = first.get_legend_handles_labels()
        fig.legend(handles, labels, fontsize=8, ncol=3, loc="lower center", frameon=False)
    if panels:
        fig.suptitle(title)
    return _save(fig, path, rect=(0, 0.08 if rows == 1 else 0.05, 1, 1))  # room for the legend


def _log_ticks(ax) -> None:
    """Plain numbers on a log latency axis."""
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 1.2, 1.5, 2.0, 3.0, 5.0)))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(plt.NullFormatter())
