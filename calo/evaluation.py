"""Accuracy and calibration of a model's predictions on a set of measured graphs."""

from __future__ import annotations

import numpy as np
from scipy import stats

from calo.config import Split
from calo.correction import Corrector, store_devices, store_rows
from calo.dataset import GraphSet, split_of
from calo.models import calibration as cal
from calo.models.calibration import confidence_levels, regression_ece, student_t_nll
from calo.models.evidential import NIG, EvidentialSAGE
from calo.models.training import predict


def predictive(model: EvidentialSAGE, graphs: GraphSet, tau: float = 1.0,
               correction: Corrector | None = None) -> tuple:
    """(y, mean, t-scale, df) as numpy arrays, log-seconds, with the temperature (and the
    residual correction's shift of the mean) applied."""
    d: NIG = predict(model, graphs.graphs).scaled(tau)
    y = graphs.labels().double().numpy()
    mu = d.gamma.numpy()
    if correction is not None and correction.moves_mean:
        mu = correction.adjust(mu, store_rows(graphs.graphs), graphs.workload,
                               _devices(graphs, correction))
    return y, mu, d.t_scale.numpy(), d.df.numpy()


def ranking_scores(mu: np.ndarray, graphs: GraphSet, correction: Corrector | None = None
                   ) -> np.ndarray:
    """What orders the graphs' candidates (lower = faster): the mean `predictive` gave,
    blended with the throughput trees where the correction is theirs."""
    if correction is None or correction.moves_mean:
        return mu
    return correction.adjust(mu, store_rows(graphs.graphs), graphs.workload,
                             _devices(graphs, correction))


def _devices(graphs: GraphSet, correction: Corrector) -> np.ndarray | None:
    """The graphs' devices, where the correction's trees read them."""
    return store_devices(graphs.graphs) if correction.device_columns else None


def mean_ranking(y: np.ndarray, mu: np.ndarray, groups: list[str]) -> dict:
    """Kendall tau, top-1 and top-5 within each workload (what the tuner needs; `ranking`, on
    log latencies), averaged over the workloads of 3 or more records."""
    members: dict[str, list[int]] = {}
    for i, group in enumerate(groups):
        members.setdefault(group, []).append(i)
    scores = [ranking(np.exp(y[idx]), mu[idx]) for group in sorted(members)
              if len(idx := members[group]) >= 3]
    out = {}
    for key in ("kendall_tau", "top1", "top5"):
        values = [s[key] for s in scores if not np.isnan(s[key])]
        out[key] = float(np.mean(values)) if values else float("nan")
    return out


def evaluate(model: EvidentialSAGE, graphs: GraphSet, levels: int, tau: float = 1.0,
             correction: Corrector | None = None) -> dict:
    if len(graphs) == 0:
        return {"count": 0}
    y, mu, scale, df = predictive(model, graphs, tau, correction)
    return {"count": len(graphs), **calibration(y, mu, scale, df, levels),
            **mean_ranking(y, ranking_scores(mu, graphs, correction), graphs.workload)}


def ranking(latency: np.ndarray, predicted: np.ndarray, ks: tuple[int, ...] = (1, 5)) -> dict:
    """How well `predicted` (lower = predicted faster) picks fast schedules of one workload.

    top-k score: best latency / best latency among the k predicted fastest (1.0 = found the
    best); regret: how much slower the predicted fastest is than the best, as a fraction.
    """
    order = np.argsort(predicted, kind="stable")
    best = float(latency.min())
    tau = stats.kendalltau(latency, predicted).statistic if len(latency) >= 2 else np.nan
    out = {"kendall_tau": float(tau)}
    for k in ks:
        out[f"top{k}"] = best / float(latency[order[:k]].min())
    out["regret"] = float(latency[order[0]]) / best - 1.0
    return out


def calibration(y: np.ndarray, mu: np.ndarray, scale: np.ndarray, df: np.ndarray,
                levels: int) -> dict:
    return {"ece": regression_ece(y, mu, scale, df, confidence_levels(levels)),
            "nll": student_t_nll(y, mu, scale, df),
            "rmse": float(np.sqrt(np.mean((y - mu) ** 2)))}


def checked_temperature(model: EvidentialSAGE, graphs: GraphSet, current: float,
                        levels: int, correction: Corrector | None = None,
                        by_workload: bool = False, cross: bool = True,
                        objective: cal.Objective = "ece") -> float:
    """A temperature for these held-out graphs that never makes calibration worse: each
    workload's graphs are predicted at a temperature fitted on the other workloads' (by record
    halves, for one workload), and these must have NLL and ECE at least as good as `current`
    gives them. `by_workload`: each fit is the median of the workloads' own
    (cal.median_temperature). `objective`: what a fit minimizes, ECE or NLL (both are checked
    either way).
    `cross=False` checks the refit on the graphs themselves instead: for a temperature asked to
    serve other candidates of the same workloads (a warm-up's refit), where workloads whose
    errors differ in width make the folds' fits misfit each other and refuse a temperature
    that serves every workload's other candidates better."""
    if not cross:
        if len(graphs) < 2 * cal.MIN_GROUP_POINTS:  # refit_temperature's floor, unpredicted
            return current
        return cal.refit_temperature(predictive(model, graphs, correction=correction), current,
                                     confidence_levels(levels), objective=objective)
    parts = graphs.by_workload()
    # Workloads are left out one at a time (no draw of folds decides); one is cut in halves.
    if len(parts) < 2:
        halves = Split(val=0.5, test=0.0)
        fold = [split_of(w, r, halves) == "val" for w, r in zip(graphs.workload, graphs.record)]
        parts = [p for p in (graphs.select([not f for f in fold]), graphs.select(fold)) if len(p)]
    groups = [p.workload for p in parts] if by_workload else None
    return cal.checked_temperature([predictive(model, p, correction=correction) for p in parts],
                                   current, confidence_levels(levels), groups, objective)
