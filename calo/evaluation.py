"""Accuracy and calibration of a model's predictions on a set of measured graphs."""

from __future__ import annotations

import numpy as np
from scipy import stats

from calo.dataset import GraphSet
from models.calibration import confidence_levels, regression_ece, student_t_nll
from models.evidential import NIG, EvidentialSAGE
from models.training import predict


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
    return {
        "count": len(graphs),
        "nll": student_t_nll(y, mu, scale, df),
        "ece": regression_ece(y, mu, scale, df, confidence_levels(levels)),
        "rmse": float(np.sqrt(np.mean((y - mu) ** 2))),
        "kendall_tau": mean_kendall_tau(y, mu, graphs.workload),
    }
