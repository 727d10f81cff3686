"""The native schedule-graph walker gives the Python walker's graphs exactly, and the Python
walker runs wherever the native one is off or does not build."""

import logging
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tvm
from harvest_pools import unpack

from calo import native, records
from calo.schedule_graph import FEATURES, extract_graph, extract_graphs, extract_union

REPO = Path(__file__).resolve().parents[1]

needs_native = pytest.mark.skipif(native.walker() is None,
                                  reason="the native walker does not build here")


def pool_programs(pool: str, per_workload: int) -> list[tuple]:
    """(workload, PrimFunc, target) of the first records of every workload of a committed pool:
    random and evolved schedules of every suite operator, CPU and GPU."""
    seen = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        store = unpack(REPO / "benchmarks" / "data" / pool, Path(tmp))
        chosen = []  # lines picked unparsed: parsing all of a pool's records takes minutes
        for index, line in enumerate(records.complete_lines(store / records.RECORD_FILE)):
            workload = records._workload_index(line)
            if seen[workload] < per_workload:
                seen[workload] += 1
                chosen.append((index, line))
        return [(rec.workload_name, rec.record.as_measure_candidate().sch.mod["main"],
                 rec.record.target)
                for rec in records.records_of_lines(records.store_context(store), chosen)]


@pytest.fixture(scope="module")
def programs() -> list[tuple]:
    # The host's pool holds every CPU operator of the suite; the GPU pool binds threads.
    return pool_programs("suite-cpu-host.tar.gz", 2) + pool_programs("suite-cuda.tar.gz", 1)


def same(a, b) -> bool:
    return (a.x.shape == b.x.shape and np.array_equal(a.x, b.x)
            and np.array_equal(a.edge_index, b.edge_index)
            and np.array_equal(a.edge_type, b.edge_type))


@needs_native
@pytest.mark.parametrize("with_target", [False, True], ids=["schedule", "device-schedule"])
def test_native_graphs_equal_the_python_walkers_bit_for_bit(programs, with_target):
    assert len({name for name, *_ in programs}) > 100
    targets = [target if with_target else None for _, _, target in programs]
    for target in set(map(str, targets)):  # one call per target: a batch, as a search scores
        batch = [(name, func) for (name, func, _), t in zip(programs, targets) if str(t) == target]
        t = next(t for t in targets if str(t) == target)
        graphs = extract_graphs([func for _, func in batch], t)
        for (name, func), graph in zip(batch, graphs):
            assert same(graph, extract_graph(func, t)), name


@needs_native
def test_the_union_is_the_graphs_concatenated(programs):
    funcs = [func for _, func, _ in programs[:64]]
    union = extract_union(funcs)
    graphs = [extract_graph(func) for func in funcs]
    assert union.nodes.tolist() == [len(g.x) for g in graphs]
    assert union.edges.tolist() == [g.edge_index.shape[1] for g in graphs]
    assert np.array_equal(union.x, np.concatenate([g.x for g in graphs]))
    assert np.array_equal(union.edge_index, np.concatenate([g.edge_index for g in graphs], 1))


@needs_native
def test_a_module_is_walked_as_its_main_function(programs):
    funcs = [func for _, func, _ in programs[:8]]
    modules = [tvm.IRModule({"main": func}) for func in funcs]
    assert np.array_equal(extract_union(modules).x, extract_union(funcs).x)


@needs_native
def test_a_wrong_input_is_named():
    with pytest.raises(Exception, match="expected a tirx.PrimFunc, got ir.IntImm"):
        native.extract([tvm.tirx.IntImm("int32", 1)], list(FEATURES), 1, 0, False)


@needs_native
def test_the_walk_shares_torchs_openmp_runtime():
    """Built with OpenMP, the walker's threads are the workers torch's forward leaves spinning,
    not a second runtime's competing with them for the cores."""
    import torch  # noqa: F401 - torch's libgomp.so.1 is loaded first, as in a search

    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("no /proc/self/maps to read the loaded libraries from")
    assert b"libgomp.so.1" in native.library_path().read_bytes()  # it links OpenMP
    runtimes = {line.split()[-1] for line in maps.read_text().splitlines()
                if line.endswith("/libgomp.so.1")}
    assert len(runtimes) == 1, runtimes


def test_the_python_walker_runs_where_the_native_one_does_not_build(monkeypatch, tmp_path,
                                                                     programs, caplog):
    monkeypatch.setenv("CALO_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(native, "_walker", None)
    monkeypatch.setattr(native, "_tried", False)
    with caplog.at_level(logging.WARNING):
        funcs = [func for _, func, _ in programs[:3]]
        graphs = extract_graphs(funcs)
    assert "Python walker" in caplog.text and "no-such-compiler" in caplog.text
    assert extract_union(funcs) is None
    assert all(same(g, extract_graph(f)) for g, f in zip(graphs, funcs))
    assert not list(tmp_path.rglob("*.so"))  # nothing half-built left behind


@needs_native
@pytest.mark.slow
def test_a_compiler_without_openmp_builds_the_walker_with_threads_of_its_own(monkeypatch,
                                                                           tmp_path):
    monkeypatch.setenv("CALO_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "OPENMP", ("-fno-such-openmp-option",))
    built = native.build()
    assert built.is_file() and b"libgomp.so.1" not in built.read_bytes()
    assert [p.name for p in built.parent.iterdir()] == [built.name]  # no half-built file left


def test_calo_native_0_turns_it_off(monkeypatch):
    monkeypatch.setenv("CALO_NATIVE", "0")
    monkeypatch.setattr(native, "_walker", None)
    monkeypatch.setattr(native, "_tried", False)
    assert native.walker() is None


@needs_native
def test_a_search_scores_the_same_with_either_walker():
    from tvm.s_tir import meta_schedule as ms

    from calo.artifact import TrainedModel
    from calo.config import load_settings
    from calo.costmodel import CaloCostModel

    with tempfile.TemporaryDirectory() as tmp:
        store = unpack(REPO / "benchmarks" / "data" / "heldout-cpu-host.tar.gz", Path(tmp))
        lines = records.complete_lines(store / records.RECORD_FILE)[:48]
        recs = list(records.records_of_lines(records.store_context(store), enumerate(lines)))
    recs = [r for r in recs if r.workload_key == recs[0].workload_key]
    context = ms.TuneContext(mod=recs[0].record.workload.mod, target=recs[0].record.target,
                             task_name="t")
    candidates = [r.record.as_measure_candidate() for r in recs]
    settings = load_settings(REPO / "params.yaml")
    trained = TrainedModel.new(settings)

    def scores():
        return CaloCostModel.from_settings(trained, settings).predict(context, candidates)

    native_scores = scores()
    with native.off():
        python_scores = scores()
    assert len(candidates) > 16 and np.array_equal(native_scores, python_scores)
