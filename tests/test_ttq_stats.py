import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from ttq import summarize, ttq, welch_p  # noqa: E402


def test_ttq_counts_trials_to_five_percent_and_censors_a_miss():
    assert ttq([3.0, 2.0, 1.04], oracle=1.0, budget=3) == 3
    assert ttq([3.0, 2.0, 1.2], oracle=1.0, budget=3) == 4


def test_welch_handles_unequal_seed_counts_and_constant_samples():
    assert 0 < welch_p([10, 12, 11], [30, 31, 29, 33, 30, 28, 32, 30, 31, 29]) < 0.01
    assert welch_p([161, 161, 161], [161] * 10) == 1.0
    assert welch_p([1, 1, 1], [63] * 10) == 0.0


def test_summary_mixes_ablations_with_fewer_seeds():
    report = summarize({"w": {"calo": [10] * 10, "xgb": [20, 22, 18, 20, 21, 19, 20, 20, 20, 20],
                              "kappa=1": [15, 16, 14]}})
    assert abs(report["geomean_ratio_vs_xgb"]["calo"] - 0.5) < 1e-9
    assert report["per_workload"]["w"]["kappa=1"]["welch_p"] < 0.05
