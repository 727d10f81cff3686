"""The within-workload ranking figures every stage reports."""

import numpy as np
from scipy import stats

from calo.evaluation import mean_ranking


def test_mean_ranking_averages_each_workloads_tau_and_top_k():
    rng = np.random.default_rng(0)
    y = np.log(rng.uniform(1e-4, 1e-2, size=16))
    mu = y + rng.normal(0, 1.0, size=16)
    groups = ["a"] * 7 + ["b"] * 7 + ["c"] * 2  # c: too few records to rank, left out
    out = mean_ranking(y, mu, groups)

    taus, top1, top5 = [], [], []
    for idx in (slice(0, 7), slice(7, 14)):
        lat, pred = np.exp(y[idx]), mu[idx]
        taus.append(stats.kendalltau(lat, pred).statistic)
        order = np.argsort(pred)
        top1.append(lat.min() / lat[order[0]])
        top5.append(lat.min() / lat[order[:5]].min())
    assert np.isclose(out["kendall_tau"], np.mean(taus))
    assert np.isclose(out["top1"], np.mean(top1))
    assert np.isclose(out["top5"], np.mean(top5))
    # a perfect prediction finds each workload's best
    assert mean_ranking(y, y, groups) == {"kendall_tau": 1.0, "top1": 1.0, "top5": 1.0}
