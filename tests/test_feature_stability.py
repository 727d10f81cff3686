import numpy as np
from feature_stability import differing


def test_only_the_programs_whose_inputs_changed_between_runs_are_named(tmp_path):
    rows = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((1, 3), np.float32)]
    runs = []
    for i in range(3):
        swapped = rows[0][::-1] if i == 2 else rows[0]  # the last run orders program 0's rows
        arrays = {"x_0": np.zeros(4), "store_rows_0": swapped,
                  "x_1": np.zeros(4), "store_rows_1": rows[1]}
        runs.append(tmp_path / f"run{i}.npz")
        np.savez(runs[-1], names=np.array(["a", "b"]), **arrays)
    assert differing(runs) == {0: ["store_rows"]}
    assert differing(runs[:2]) == {}
