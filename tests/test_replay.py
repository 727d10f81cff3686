import numpy as np
from ttq import load_pool, replay_runs, ttq

from calo import paths
from tests.conftest import DONOR


class Untrained:
    """Scores every candidate alike, so the replay picks in its seed's random order."""

    def __init__(self):
        self.updates = 0

    def predict(self, context, candidates):
        return np.zeros(len(candidates))

    def update(self, context, candidates, results):
        self.updates += 1


def test_replay_runs_pad_each_curve_to_the_budget_and_resume_without_rerunning(harvested):
    pool = load_pool(paths.records_dir(DONOR), min_pool=1)
    target = next(iter(pool.values()))[0].record.target
    models: list[Untrained] = []

    def build(seed):
        models.append(Untrained())
        return models[-1]

    methods = {"a": build, "b": build, "skipped": build}
    seeds = {"a": 2, "b": 1, "skipped": 0}
    batch, budget = 4, 20  # more trials than a workload has candidates
    done, saved = {}, []
    first = list(replay_runs(pool, target, methods, seeds, batch, budget, done, saved.append,
                             keeps_curve="a".__eq__))

    assert [(w, m) for w, m, _, _ in first] == [(w, m) for w in pool for m in ("a", "b")]
    assert saved == [f"{w} {m} {s}" for w in pool for m, n in seeds.items() for s in range(n)]
    assert all(m.updates == 4 for m in models)  # 14 candidates in batches of 4
    for workload, method, runs, oracle in first:
        latencies = [r.latency for r in pool[workload] if r.latency is not None]
        assert oracle == min(latencies) and len(runs) == seeds[method]
        for run in runs:
            if method == "a":
                curve = run["curve"]
                assert len(curve) == budget and curve[-1] == oracle
                assert all(x >= y for x, y in zip(curve, curve[1:]))
                assert run["ttq"] == ttq(curve, oracle, budget) <= len(pool[workload])
            else:
                assert "curve" not in run

    saved.clear()
    again = list(replay_runs(pool, target, methods, seeds, batch, budget, done, saved.append))
    assert saved == [] and again == first and len(models) == 3 * len(pool)
