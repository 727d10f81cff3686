"""Regression calibration of a Student-t predictive: ECE, NLL and a variance temperature.

ECE follows Kuleshov et al.: for confidence levels p, the share of targets inside the central
p-interval should be p; ECE is the mean absolute gap. The temperature tau scales the predictive
scale (variance by tau^2) and is fitted by BFGS on a smoothed ECE, started from a grid, or
(objective "nll") by the NLL, which is unimodal in log tau.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from scipy import optimize, special

Objective = Literal["ece", "nll"]

MIN_GROUP_POINTS = 20  # a group's own temperature from fewer points is mostly noise
MIN_GROUPS = 3         # the median of fewer groups' temperatures is no better than a pooled fit


def confidence_levels(count: int) -> np.ndarray:
    return np.linspace(0.0, 1.0, count + 2)[1:-1]


def _pit(y: np.ndarray, mu: np.ndarray, scale: np.ndarray, df: np.ndarray) -> np.ndarray:
    """Probability integral transform: the predictive CDF at each target."""
    return special.stdtr(df, (y - mu) / scale)


def coverage(y, mu, scale, df, levels: np.ndarray) -> np.ndarray:
    """Observed share of targets inside each central interval."""
    spread = np.abs(2 * _pit(y, mu, scale, df) - 1)
    return (spread[None, :] <= levels[:, None]).mean(axis=1)


def regression_ece(y, mu, scale, df, levels: np.ndarray) -> float:
    return float(np.abs(coverage(y, mu, scale, df, levels) - levels).mean())


def student_t_nll(y, mu, scale, df) -> float:
    z = (y - mu) / scale
    logpdf = (special.gammaln((df + 1) / 2) - special.gammaln(df / 2)
              - 0.5 * np.log(df * np.pi) - np.log(scale)
              - (df + 1) / 2 * np.log1p(z**2 / df))
    return float(-logpdf.mean())


def fit_temperature(y, mu, scale, df, levels: np.ndarray, smoothing: float = 0.02,
                    objective: Objective = "ece") -> float:
    """tau minimizing validation ECE (or NLL) when the predictive scale becomes tau * scale.
    The ECE counts only which side of each interval a target falls, so a few folds of
    differently wide workloads can pull it far apart; the NLL weighs how far out each is."""
    y, mu, scale, df = (np.asarray(a, dtype=np.float64) for a in (y, mu, scale, df))
    if objective == "nll":
        result = optimize.minimize_scalar(
            lambda t: student_t_nll(y, mu, scale * np.exp(t), df), bounds=(-4.0, 4.0),
            method="bounded")
        return float(np.exp(result.x))

    def hard(log_tau: float) -> float:
        return regression_ece(y, mu, scale * np.exp(log_tau), df, levels)

    def soft(params: np.ndarray) -> float:
        # The counting ECE is piecewise constant in tau; a sigmoid count makes it smooth for BFGS.
        spread = np.abs(2 * _pit(y, mu, scale * np.exp(params[0]), df) - 1)
        inside = special.expit((levels[:, None] - spread[None, :]) / smoothing).mean(axis=1)
        return float(np.abs(inside - levels).mean())

    grid = np.linspace(-4.0, 4.0, 81)
    start = grid[int(np.argmin([hard(t) for t in grid]))]
    result = optimize.minimize(soft, x0=np.array([start]), method="BFGS")
    best = min((start, float(result.x[0])), key=hard)
    return float(np.exp(best))


def median_temperature(y, mu, scale, df, groups, levels: np.ndarray,
                       least: int = MIN_GROUP_POINTS, objective: Objective = "ece",
                       known: dict | None = None) -> float:
    """The median of each group's own fitted temperature (groups of `least` points or
    more; with fewer than MIN_GROUPS of them, the pooled fit). A pooled fit lets a few groups
    whose level the model misses, their residuals a shift rather than a spread, widen every
    group's intervals; the median scales the spread of a typical group. `known`: group ->
    its own fit, read and filled (for calls on whole groups of the same points)."""
    fits = _group_fits(y, mu, scale, df, groups, levels, least, objective, known)
    if len(fits) < MIN_GROUPS:
        return fit_temperature(y, mu, scale, df, levels, objective=objective)
    return float(np.median(list(fits.values())))


def _group_fits(y, mu, scale, df, groups, levels, least=MIN_GROUP_POINTS,
                objective: Objective = "ece", known: dict | None = None) -> dict:
    """Each group's own temperature, for the groups of `least` points or more."""
    y, mu, scale, df = (np.asarray(a, dtype=np.float64) for a in (y, mu, scale, df))
    groups, known = np.asarray(groups), {} if known is None else known
    names, counts = np.unique(groups, return_counts=True)
    for g in (g for g in names[counts >= least] if g not in known):
        m = groups == g
        known[g] = fit_temperature(y[m], mu[m], scale[m], df[m], levels, objective=objective)
    return {g: known[g] for g in names[counts >= least]}


def checked_temperature(parts: Sequence[tuple], current: float, levels: np.ndarray,
                        groups: Sequence | None = None, objective: Objective = "ece") -> float:
    """A temperature that must earn its place. Disjoint parts (y, mu, scale, df; e.g. the
    probes of each workload) each get the temperature fitted on all the others: only if these
    cross-fitted predictions have lower NLL and ECE than `current` gives them, pooled, is the
    temperature refitted on every part, and it is returned only if it too lowers both there;
    otherwise `current` is kept (fitted by `objective`, both checked: a temperature that
    trades one for the other is noise). With `groups` (each part's labels, e.g. workloads) a
    fit is median_temperature's. A fit on fewer than MIN_GROUP_POINTS probes keeps `current`:
    on a dozen probes two parts' ECEs differ by more than any temperature changes them."""
    sizes = [len(p[0]) for p in parts]
    if len(parts) < 2 or sum(sizes) - max(sizes) < MIN_GROUP_POINTS:
        return current
    both = tuple(np.concatenate(x) for x in zip(*parts))
    labels = None if groups is None else np.concatenate(groups)
    owner = np.repeat(np.arange(len(parts)), sizes)
    # Groups each whole in one part fit alike wherever they are left in: fitted once.
    whole = labels is not None and len(set(labels)) == sum(len(set(g)) for g in groups)
    known = {} if whole else None

    def fit(mask: np.ndarray) -> float:
        part = tuple(x[mask] for x in both)
        return (fit_temperature(*part, levels, objective=objective) if labels is None
                else median_temperature(*part, labels[mask], levels, objective=objective,
                                        known=known))

    crossed = np.array([fit(owner != i) for i in range(len(parts))])[owner]
    if not all(np.less(_nll_ece(both, crossed, levels), _nll_ece(both, current, levels))):
        return current
    return refit_temperature(both, current, levels, labels, objective, known)


def carried_temperature(temperature: float, before: np.ndarray, after: np.ndarray) -> float:
    """The temperature that keeps intervals as wide as `temperature` made them on predictive
    scales `before`, now that the same points have scales `after` (a fine-tune moved them):
    `temperature` times the geometric mean of before / after. A temperature calibrates a
    width, not a network: a fine-tune that widens every scale by a third leaves the old
    temperature that much underconfident."""
    before, after = np.asarray(before, dtype=np.float64), np.asarray(after, dtype=np.float64)
    return float(temperature * np.exp(np.mean(np.log(before) - np.log(after))))


def blended_temperature(prior: float, refit: float) -> float:
    """The geometric mean of two estimates of one width that err in kind: a warm-up's refit
    answers for its random probes, the donor's carried width for new workloads' candidates; a
    search asks about evolved ones, which the two tend to miss on opposite sides."""
    return float(np.sqrt(prior * refit))


def refit_temperature(part: tuple, current: float, levels: np.ndarray,
                      groups: np.ndarray | None = None, objective: Objective = "ece",
                      known: dict | None = None) -> float:
    """The temperature fitted on these probes (y, mu, scale, df; median_temperature's with
    `groups`, and its `known`) if it lowers both their NLL and their ECE against `current`,
    else `current`. Fewer than 2 * MIN_GROUP_POINTS probes keep `current`."""
    y, mu, scale, df = part
    if len(y) < 2 * MIN_GROUP_POINTS:
        return current
    tau = (fit_temperature(y, mu, scale, df, levels, objective=objective) if groups is None
           else median_temperature(y, mu, scale, df, groups, levels, objective=objective,
                                   known=known))
    better = np.less(_nll_ece(part, tau, levels), _nll_ece(part, current, levels))
    return tau if all(better) else current


def _nll_ece(part: tuple, tau: np.ndarray | float, levels: np.ndarray) -> tuple[float, float]:
    y, mu, scale, df = part
    return student_t_nll(y, mu, scale * tau, df), regression_ece(y, mu, scale * tau, df, levels)
