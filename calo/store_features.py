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
from tvm.s_tir import meta_schedule as ms

_EXTRACTOR = ms.feature_extractor.PerStoreFeature(extract_workload=False)
NUM_FEATURES = 164  # PerStoreFeature's row width at its default buffers_per_store


def of_candidates(mod, target, candidates: list) -> list[np.ndarray]:
    """[stores, NUM_FEATURES] float32 per MeasureCandidate of one workload (mod) on target."""
    if not candidates:
        return []
    context = ms.TuneContext(mod=mod, target=target, task_name="store-features")
    rows = [f.numpy().astype(np.float32) for f in _EXTRACTOR.extract_from(context, candidates)]
    for r in rows:
        if r.ndim != 2 or r.shape[1] != NUM_FEATURES:
            raise ValueError(f"PerStoreFeature gave rows of shape {r.shape}, expected "
                             f"[stores, {NUM_FEATURES}]")
    return rows
