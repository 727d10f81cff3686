import numpy as np
from feature_stability import differing

from calo.store_features import BUFFER_COLUMNS, BUFFERS, BYTES, LINES, NUM_FEATURES, SLOT, canonical


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


def test_buffers_that_tie_on_bytes_and_lines_take_one_order():
    rng = np.random.default_rng(0)
    slots = rng.random((BUFFERS, SLOT)).astype(np.float32)
    slots[:, [BYTES, LINES]] = [[9, 9], [5, 4], [5, 4], [5, 4], [1, 1]]  # TVM's order: sizes down
    row = rng.random((1, NUM_FEATURES)).astype(np.float32)
    row[0, BUFFER_COLUMNS] = slots.ravel()
    orders = [row.copy() for _ in range(3)]
    for o, perm in zip(orders, ([0, 1, 2, 3, 4], [0, 3, 1, 2, 4], [0, 2, 3, 1, 4])):
        o[0, BUFFER_COLUMNS] = slots[perm].ravel()
    out = [canonical(o) for o in orders]
    assert all(np.array_equal(out[0], o) for o in out[1:])
    kept = out[0][0, BUFFER_COLUMNS].reshape(BUFFERS, SLOT)
    # the untied slots keep their places, and no feature outside the slots moves
    assert np.array_equal(kept[[0, 4]], slots[[0, 4]])
    assert sorted(map(tuple, kept[1:4])) == sorted(map(tuple, slots[1:4]))
    outside = np.r_[0:BUFFER_COLUMNS.start, BUFFER_COLUMNS.stop:NUM_FEATURES]
    assert np.array_equal(out[0][0, outside], row[0, outside])
    # slots that only share their bytes are told apart by lines and stay in TVM's order
    apart = row.copy()
    split = slots.copy()
    split[1:4, LINES] = [6, 5, 4]
    apart[0, BUFFER_COLUMNS] = split.ravel()
    assert np.array_equal(canonical(apart), apart)
