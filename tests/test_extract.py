import numpy as np
import pytest
import torch
import tvm
from tvm import te
from tvm.s_tir import Schedule

from calo import graphs, paths
from calo.correction import store_devices
from calo.dataset import load_graphs, to_data
from calo.errors import CaloError
from calo.models.training import predict
from calo.records import iter_records
from calo.schedule_graph import (
    DATAFLOW,
    EDGE_TYPES,
    FEATURES,
    FUSION,
    NEST,
    NUM_FEATURES,
    device_of,
    extract_graph,
)
from calo.tasks.extract import extract
from calo.tasks.pretrain import donor_splits, train_on_donor
from tests.conftest import DONOR, search_batch

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
    graphs = load_graphs(paths.graphs_path(DONOR), params.graph.kind)
    assert len(graphs) == extracted[DONOR]["graphs"] >= 20
    assert extracted[DONOR]["graphs"] + extracted[DONOR]["failed_records_skipped"] == 28
    for g in graphs.graphs:
        assert g.x.shape[1] == NUM_FEATURES
        assert int(g.edge_index.max()) < g.x.shape[0]
        assert int(g.edge_type.max()) < len(EDGE_TYPES)
        assert g.y.item() < 0  # log of a latency well under a second
    assert set(graphs.workload) == {"mm-64", "mm-relu-32x64"}


def test_access_pattern_vector_width_and_innermost_loops():
    g = extract_graph(_matmul_relu_schedule())
    loops = g.x[g.x[:, COL["is_loop"]] == 1]
    vector = loops[loops[:, COL["vectorized"]] == 1][0]
    # j drives the last index of B[k, j] and C[i, j]; the parallel i_0 drives no last index
    assert np.isclose(vector[COL["log_inner_dim_accesses"]], np.log2(1 + 2))
    assert np.isclose(vector[COL["log_vector_width"]], np.log2(1 + 32))
    parallel = loops[loops[:, COL["parallel"]] == 1][0]
    assert parallel[COL["log_inner_dim_accesses"]] == 0 and parallel[COL["innermost"]] == 0
    assert loops[:, COL["innermost"]].sum() == 2  # k under the matmul, ax0 under the relu


def test_loop_footprint_counts_the_bytes_a_tile_touches():
    g = extract_graph(_matmul_relu_schedule())
    loops = g.x[g.x[:, COL["is_loop"]] == 1]  # program order: i_0, i_1, j, k, ax0
    footprint = np.round(2 ** loops[:, COL["log_footprint"]] - 1).astype(int)
    f32 = 4
    # k: a row of A, a column of B, one element of C
    assert footprint[3] == (32 + 32 + 1) * f32
    # j: the same row of A, all of B, a row of C (k and j drive nothing of A's rows)
    assert footprint[2] == (32 + 32 * 32 + 32) * f32
    # i_1 (8 rows): the matmul's A, B and C tiles, and the relu's C and output tiles
    assert footprint[1] == (8 * 32 + 32 * 32 + 8 * 32 + 8 * 32 + 8 * 32) * f32
    # spans never exceed the buffer: the outermost loop touches each buffer once per block
    assert footprint[0] == (3 * 32 * 32 + 2 * 32 * 32) * f32
    rel = loops[:, COL["rel_footprint"]]
    assert np.all(np.diff(rel[:4]) < 0)  # shrinks toward the innermost loop


@pytest.mark.parametrize("target, cores, lanes", [
    ({"kind": "llvm", "mcpu": "x86-64", "num-cores": 1}, 1, 4),     # SSE2: 4 floats
    ({"kind": "llvm", "mcpu": "haswell", "num-cores": 2}, 2, 8),    # AVX2
    ({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 8}, 4, 16),  # i_0 has 4 rows
])
def test_loops_are_read_against_the_devices_cores_and_vector_width(target, cores, lanes):
    g = extract_graph(_matmul_relu_schedule(), tvm.target.Target(target))
    loops = g.x[g.x[:, COL["is_loop"]] == 1]  # program order: i_0, i_1, j, k, ax0

    def count(column: str) -> np.ndarray:
        return np.round(2 ** loops[:, COL[column]] - 1).astype(int)

    assert count("log_parallel_ways")[0] == cores and count("log_parallel_ways")[1:].sum() == 0
    assert count("log_vector_ops")[2] == 32 // lanes  # j: 32 floats
    rows, vector_ops = -(-4 // cores) * 8, 32 // lanes
    assert count("log_core_trip_count").tolist() == [
        -(-4 // cores), rows, rows * vector_ops, rows * vector_ops * 32, rows * 32]
    assert count("log_trip_count").tolist() == [4, 32, 32 * 32, 32 * 32 * 32, 32 * 32]


def test_without_a_target_the_device_columns_are_zero():
    from calo.schedule_graph import DEVICE_COLUMNS

    g = extract_graph(_matmul_relu_schedule())
    assert len(DEVICE_COLUMNS) == 4 and not g.x[:, DEVICE_COLUMNS].any()
    two_cores = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    read = extract_graph(_matmul_relu_schedule(), two_cores)
    assert read.x[:, DEVICE_COLUMNS].any()
    others = [i for i in range(g.x.shape[1]) if i not in DEVICE_COLUMNS]
    np.testing.assert_array_equal(g.x[:, others], read.x[:, others])


def test_normalized_columns_are_relative_to_the_workload_itself():
    def rel(n: int, tile: int) -> np.ndarray:
        from tvm.s_tir.meta_schedule.testing import te_workload

        sch = Schedule(te.create_prim_func(te_workload.matmul(n, n, n)))
        i, _, _ = sch.get_loops(sch.get_sblock("C"))
        sch.split(i, [None, tile])
        return extract_graph(sch.mod["main"]).x

    small, large = rel(32, 8), rel(128, 32)
    for x in (small, large):
        block = x[x[:, COL["is_block"]] == 1][0]
        assert block[COL["rel_trip_count"]] == 1.0  # the block runs the workload's whole domain
        assert block[COL["rel_extent"]] == 1.0
        for col in ("rel_extent", "rel_trip_count", "rel_bytes"):
            assert 0 <= x[:, COL[col]].min() and x[:, COL[col]].max() <= 1
    # absolute sizes differ by shape, the workload-relative ones much less
    loops = [x[x[:, COL["is_loop"]] == 1] for x in (small, large)]
    abs_gap = np.abs(loops[0][:, COL["log_trip_count"]] - loops[1][:, COL["log_trip_count"]])
    rel_gap = np.abs(loops[0][:, COL["rel_trip_count"]] - loops[1][:, COL["rel_trip_count"]])
    assert (rel_gap < 0.1).all() and (abs_gap >= 1).any()


def test_buffer_features_read_once_per_task_match_a_cold_extraction():
    from tvm.s_tir.meta_schedule.testing import te_workload

    from calo import schedule_graph

    func = _matmul_relu_schedule()
    schedule_graph._BUFFERS.clear()
    cold = extract_graph(func)
    assert len(schedule_graph._BUFFERS) == 4  # A, B, C, compute
    warm = extract_graph(func)
    assert np.array_equal(cold.x, warm.x) and np.array_equal(cold.edge_index, warm.edge_index)
    # Same buffer names, other objects and sizes: never served from the cache.
    other = extract_graph(te.create_prim_func(te_workload.matmul(64, 64, 64)))
    buffers = other.x[other.x[:, COL["is_buffer"]] == 1]
    assert np.isclose(buffers[:, COL["log_bytes"]].max(), np.log2(1 + 64 * 64 * 4))


def test_ast_graph_holds_every_statement_and_expression():
    from calo import ast_graph

    g = ast_graph.extract_graph(_matmul_relu_schedule())
    assert g.x.shape[1] == ast_graph.NUM_FEATURES
    types = [ast_graph.NODE_TYPES[i] for i in g.x[:, :len(ast_graph.NODE_TYPES)].argmax(1)]
    assert types.count("BufferStore") == 3      # C's init, C's update, the relu
    assert types.count("BufferLoad") == 4       # C, A, B in the update; C in the relu
    assert types.count("For:parallel") == types.count("For:vectorized") == 1
    assert types.count("Buffer") == 4           # one node per buffer, shared by its accesses
    value = ast_graph.FEATURES.index("log_value")
    assert np.isclose(g.x[:, value], np.log2(1 + 32)).any()  # the vectorized extent, a constant
    src, dst = g.edge_index
    buffer_edges = g.edge_type == ast_graph.BUFFER
    assert buffer_edges.sum() == 7              # every load and store points at its buffer
    # every use of the vectorized loop's variable is linked to the loop that binds it
    vector = types.index("For:vectorized")
    uses = dst[(g.edge_type == ast_graph.VAR) & (src == vector)]
    assert len(uses) >= 1 and all(types[u] == "Var" for u in uses)
    tree = g.edge_type == ast_graph.CHILD
    assert np.bincount(dst[tree], minlength=len(types)).max() == 1  # a tree: one parent each


def test_the_ast_kind_runs_extract_pretrain_and_prediction(params, harvested, tmp_path,
                                                          monkeypatch):
    ast = params.override({"graph.kind": "ast", "train.max_epochs": 2})
    # Its own data/ (the session's schedule graphs stay), reading the session's records.
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "records").symlink_to(paths.records_dir(DONOR).resolve().parent)
    monkeypatch.chdir(tmp_path)
    assert extract(ast, DONOR)["kind"] == "ast"
    with pytest.raises(CaloError, match="holds ast graphs"):
        load_graphs(paths.graphs_path(DONOR), "schedule")
    trained, metrics = train_on_donor(ast, *donor_splits(ast))
    assert trained.graph_kind == "ast" and np.isfinite(metrics["test_nll"])
    rec = next(r for r in iter_records(paths.records_dir(DONOR)) if r.latency is not None)
    d = predict(trained.net, [to_data(graphs.of_record("ast", rec.record))])
    assert torch.isfinite(d.gamma).all()


def test_per_store_features_run_extract_pretrain_save_and_search_prediction(
        params, harvested, tmp_path, monkeypatch):

    from calo import store_features
    from calo.artifact import TrainedModel
    from calo.costmodel import CaloCostModel

    # a fine-tune rule whose trees read no donor records, so the donor's graphs go without
    params = params.override({"finetune.rule": [
        {"up_to": None, "layers": "head", "epochs": 1, "lr": 1.0e-3}]})
    assert not params.extracts_stores(DONOR)
    with_stores = params.override({"graph.stores": True, "train.max_epochs": 2})
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "records").symlink_to(paths.records_dir(DONOR).resolve().parent)
    monkeypatch.chdir(tmp_path)
    extract(params, DONOR)
    with pytest.raises(CaloError, match="without per-store features"):
        load_graphs(paths.graphs_path(DONOR), "schedule", stores=True)
    extract(with_stores, DONOR)
    saved = load_graphs(paths.graphs_path(DONOR), "schedule", stores=True)
    rows = [g.store_rows for g in saved.graphs]
    assert all(r.shape[1] == store_features.NUM_FEATURES and len(r) >= 1 for r in rows)
    assert len({r.numpy().tobytes() for r in rows}) > len(rows) // 2  # schedules differ
    # beside them, the device of each record's target, as the trees read it
    device = device_of(next(iter_records(paths.records_dir(DONOR))).record.target)
    assert store_devices(saved.graphs).tolist() == [[device.cores, device.vector_bytes]] * len(rows)
    assert saved.graphs[0].store_device.tolist() == [[device.cores, device.vector_bytes]]
    trained, metrics = train_on_donor(with_stores, *donor_splits(with_stores))
    assert trained.reads_stores and np.isfinite(metrics["test_nll"])
    loaded = TrainedModel.load(trained.save(tmp_path / "model"))
    assert loaded.config.stores == store_features.NUM_FEATURES
    # The search's path: candidates of one workload, featurized together, scored and learned.
    context, cands, results, group = search_batch(DONOR, 6)
    model = CaloCostModel.from_settings(loaded, with_stores, constant_kappa=0.0)  # mean only
    scores = model.predict(context, cands)
    assert scores.shape == (6,) and np.isfinite(scores).all()
    mu = predict(loaded.net, graphs.graph_set("schedule", group, stores=True).graphs).gamma
    assert np.allclose(np.argsort(-scores), np.argsort(mu.numpy()))
    model.update(context, cands, results)
    assert np.isfinite(model.predict(context, cands)).all()
