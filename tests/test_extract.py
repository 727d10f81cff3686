import numpy as np
import tvm
from tvm import te
from tvm.s_tir import Schedule

from calo.dataset import load_graphs
from calo.schedule_graph import (
    DATAFLOW,
    EDGE_TYPES,
    FEATURES,
    FUSION,
    NEST,
    NUM_FEATURES,
    extract_graph,
)
from tests.conftest import DONOR

COL = {name: i for i, name in enumerate(FEATURES)}


def _matmul_relu_schedule() -> tvm.tirx.PrimFunc:
    from tvm.s_tir.meta_schedule.testing import te_workload

    sch = Schedule(te.create_prim_func(te_workload.matmul_relu(32, 32, 32)))
    c = sch.get_sblock("C")
    i, j, k = sch.get_loops(c)
    i0, i1 = sch.split(i, [4, 8])
    sch.parallel(i0)
    sch.vectorize(sch.get_loops(c)[2])
    relu = sch.get_sblock("compute")
    sch.reverse_compute_at(relu, i1)
    return sch.mod["main"]


def test_graph_of_a_known_schedule():
    g = extract_graph(_matmul_relu_schedule())
    assert g.x.shape[1] == NUM_FEATURES >= 16
    loops = g.x[g.x[:, COL["is_loop"]] == 1]
    blocks = g.x[g.x[:, COL["is_block"]] == 1]
    buffers = g.x[g.x[:, COL["is_buffer"]] == 1]
    assert len(blocks) == 2                 # C and the relu, now computed inside C's loop
    assert len(buffers) == 4                # A, B, C, compute
    assert loops[:, COL["parallel"]].sum() == 1
    assert loops[:, COL["vectorized"]].sum() == 1
    parallel = loops[loops[:, COL["parallel"]] == 1][0]
    assert np.isclose(parallel[COL["log_extent"]], np.log2(1 + 4))
    types = set(g.edge_type.tolist())
    assert {NEST, DATAFLOW, FUSION} <= types
    # dataflow: the relu block reads the buffer the matmul block writes
    src, dst = g.edge_index
    flow = g.edge_type == DATAFLOW
    block_ids = np.flatnonzero(g.x[:, COL["is_block"]] == 1)
    written = {d for s, d in zip(src[flow], dst[flow]) if s in block_ids}
    read_by_blocks = {s for s, d in zip(src[flow], dst[flow]) if d in block_ids}
    assert written & read_by_blocks, "the intermediate buffer links the two blocks"


def test_extract_saves_a_graph_per_successful_record(params, extracted):
    graphs = load_graphs(params.graphs_path(DONOR))
    assert len(graphs) == extracted[DONOR]["graphs"] >= 20
    assert extracted[DONOR]["graphs"] + extracted[DONOR]["failed_records_skipped"] == 28
    for g in graphs.graphs:
        assert g.x.shape[1] == NUM_FEATURES
        assert int(g.edge_index.max()) < g.x.shape[0]
        assert int(g.edge_type.max()) < len(EDGE_TYPES)
        assert g.y.item() < 0  # log of a latency well under a second
    assert set(graphs.workload) == {"mm-64", "mm-relu-32x64"}
