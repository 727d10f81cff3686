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
    return rows
