"""Accuracy and calibration of a model's predictions on a set of measured graphs."""

from __future__ import annotations

import numpy as np
from scipy import stats

from calo.dataset import GraphSet
from calo.models.calibration import confidence_levels, regression_ece, student_t_nll
from calo.models.evidential import NIG, EvidentialSAGE
from calo.models.training import predict


def predictive(model: EvidentialSAGE, graphs: GraphSet, tau: float = 1.0) -> tuple:
    """(y, mean, t-scale, df) as numpy arrays, log-seconds, with the temperature applied."""
    d: NIG = predict(model, graphs.graphs).scaled(tau)
    y = np.array([g.y.item() for g in graphs.graphs])
    return y, d.gamma.numpy(), d.t_scale.numpy(), d.df.numpy()


def mean_kendall_tau(y: np.ndarray, mu: np.ndarray, groups: list[str]) -> float:
    """Rank agreement within each workload (what the tuner needs), averaged over workloads."""
    taus = []
    for group in sorted(set(groups)):
        idx = [i for i, g in enumerate(groups) if g == group]
        if len(idx) >= 3:
            tau = stats.kendalltau(y[idx], mu[idx]).statistic
            if not np.isnan(tau):
                taus.append(tau)
    return float(np.mean(taus)) if taus else float("nan")


def evaluate(model: EvidentialSAGE, graphs: GraphSet, levels: int, tau: float = 1.0) -> dict:
    if len(graphs) == 0:
        return {"count": 0}
    y, mu, scale, df = predictive(model, graphs, tau)
    return {"count": len(graphs), **calibration(y, mu, scale, df, levels),
            "kendall_tau": mean_kendall_tau(y, mu, graphs.workload)}


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
