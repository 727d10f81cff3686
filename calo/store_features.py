"""TVM's per-store features of a scheduled program: the model's second input (graph.stores).

Meta-Schedule's own cost models (XGBModel, MLPModel) read one row per buffer store: arithmetic
counts by type, how each accessed buffer is touched (stride, reuse, bytes per iteration),
arithmetic intensity, allocation and loop-annotation summaries, mostly on a log scale. The
schedule graph says how loops nest and what they are bound to; these rows say how much each
store computes and moves. The model reads them as a set (an MLP per row, summed per program, as
TVM's MLPModel does) beside the graph.
"""

from __future__ import annotations

import numpy as np
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

_EXTRACTOR = ms.feature_extractor.PerStoreFeature(extract_workload=False)
NUM_FEATURES = 164  # PerStoreFeature's row width at its default buffers_per_store
# A TuneContext per (workload, target), kept: building one inspects the Python stack (TVMScript
# parsing), which costs up to a second in a process that has imported torch and Prefect.
_CONTEXTS: dict[tuple[int, str], ms.TuneContext] = {}
MAX_CONTEXTS = 256


# Where a row keeps its accessed buffers (PerStoreFeature's second group): BUFFERS slots of
# SLOT features from column FIRST_SLOT; within a slot, BYTES and LINES are the two sizes TVM
# sorts the buffers by (then by name).
FIRST_SLOT, SLOT, BUFFERS = 57, 18, 5
BYTES, LINES = 3, 5
BUFFER_COLUMNS = slice(FIRST_SLOT, FIRST_SLOT + SLOT * BUFFERS)


def canonical(rows: np.ndarray) -> np.ndarray:
    """`rows` with the buffer slots that tie on bytes and lines in one fixed order (by their
    features, largest first). TVM orders such buffers by name, and buffers of equal names by
    where they lie in memory, so the same program's row could differ from one process to the
    next (benchmarks/feature_stability.py); the trees fitted on these rows then differ too."""
    slots = rows[:, BUFFER_COLUMNS].reshape(len(rows), BUFFERS, SLOT).copy()
    for row in slots:
        start = 0
        for end in range(1, BUFFERS + 1):
            if end < BUFFERS and np.array_equal(row[end, [BYTES, LINES]],
                                                row[start, [BYTES, LINES]]):
                continue
            if end - start > 1:  # lexsort's last key is its first: slot features reversed
                order = np.lexsort(row[start:end, ::-1].T)[::-1]
                row[start:end] = row[start:end][order]
            start = end
    out = rows.copy()
    out[:, BUFFER_COLUMNS] = slots.reshape(len(rows), -1)
    return out


def _context(mod, target) -> ms.TuneContext:
    key = (tvm_ffi.structural_hash(mod), str(target))
    if key not in _CONTEXTS:
        if len(_CONTEXTS) >= MAX_CONTEXTS:
            _CONTEXTS.pop(next(iter(_CONTEXTS)))
        _CONTEXTS[key] = ms.TuneContext(mod=mod, target=target, task_name="store-features")
    return _CONTEXTS[key]


def of_candidates(mod, target, candidates: list) -> list[np.ndarray]:
    """[stores, NUM_FEATURES] float32 per MeasureCandidate of one workload (mod) on target."""
    if not candidates:
        return []
    context = _context(mod, target)
    rows = [f.numpy().astype(np.float32) for f in _EXTRACTOR.extract_from(context, candidates)]
    for r in rows:
        if r.ndim != 2 or r.shape[1] != NUM_FEATURES:
            raise ValueError(f"PerStoreFeature gave rows of shape {r.shape}, expected "
                             f"[stores, {NUM_FEATURES}]")
    return [canonical(r) for r in rows]
