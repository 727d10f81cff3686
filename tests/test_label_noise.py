import numpy as np
import pytest
from label_noise import MIN_CANDIDATES, runs_of, single_run_scores


def test_separated_runs_order_perfectly_and_noise_lowers_the_other_runs_figure_most():
    latency = np.linspace(1.0, 2.0, 10)
    steady = np.stack([latency, latency * 1.001, latency * 0.999], axis=1)
    got = single_run_scores(steady)
    assert got["single_run_vs_label"]["kendall_tau"] == pytest.approx(1.0)
    assert got["single_run_vs_other_runs"]["kendall_tau"] == pytest.approx(1.0)

    # Neighbours swap places from run to run: the run inside its own label agrees with it
    # more than with the others' mean alone.
    noisy = steady.copy()
    noisy[::2, 0] += 0.15
    noisy[1::2, 1] -= 0.15
    got = single_run_scores(noisy)
    with_own, others = (got[b]["kendall_tau"] for b in ("single_run_vs_label",
                                                           "single_run_vs_other_runs"))
    assert others < with_own < 1.0


def test_runs_are_kept_per_source_for_workloads_with_enough_of_them():
    row = [1.0, 1.1, 1.2]
    runs = {("w", "random"): [row] * MIN_CANDIDATES, ("w", "evolved"): [row] * 3,
            ("v", "evolved"): [row] * MIN_CANDIDATES, ("u", "random"): [row, [1.0, 1.1]] * 8}
    assert set(runs_of(runs)) == {"w", "v"}  # u's records were measured with unequal runs
    assert runs_of(runs)["w"].shape == (MIN_CANDIDATES + 3, 3)
    assert set(runs_of(runs, "random")) == {"w"}
    assert set(runs_of(runs, "evolved")) == {"v"}  # w has too few evolved ones
