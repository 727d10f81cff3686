"""The sharded graph store and incremental extraction, on the session's measured records."""

import json
import shutil

import numpy as np
import pytest
import torch

from calo import graphs, paths
from calo.config import Split
from calo.dataset import GraphSet, load_graphs, save_graphs
from calo.errors import CaloError
from calo.graph_store import MANIFEST
from calo.records import RECORD_FILE, count_by_workload, iter_records
from calo.tasks.extract import extract
from tests.conftest import DONOR, with_devices

TOPPED = "cpu-topped"  # a copy of the donor's records that a harvest tops up


def _same(a: GraphSet, b: GraphSet) -> None:
    assert a.workload == b.workload and a.record == b.record and len(a) == len(b)
    for x, y in zip(a.graphs, b.graphs):
        for key in ("x", "edge_index", "edge_type", "y"):
            assert torch.equal(x[key], y[key]), key
        assert torch.equal(x.spread, y.spread) or (x.spread.isnan() & y.spread.isnan()).all()


def test_the_store_holds_exactly_the_in_memory_graphs(params, extracted, tmp_path):
    measured = [r for r in iter_records(paths.records_dir(DONOR)) if r.latency is not None]
    in_memory = graphs.graph_set(params.graph.kind, measured)
    stored = load_graphs(paths.graphs_path(DONOR), params.graph.kind)
    _same(in_memory, stored)
    save_graphs(tmp_path / "small-shards", in_memory, 5)
    sharded = load_graphs(tmp_path / "small-shards", params.graph.kind)
    assert len(json.loads((tmp_path / "small-shards" / MANIFEST).read_text())["shards"]) == \
        -(-len(in_memory) // 5)
    _same(in_memory, sharded)
    fractions = Split(val=0.2, test=0.2)
    for name in ("train", "val", "test"):
        _same(in_memory.split(name, fractions), sharded.split(name, fractions))


def test_windows_hand_out_every_graph_once_a_few_shards_at_a_time(params, extracted, tmp_path):
    stored = load_graphs(paths.graphs_path(DONOR), params.graph.kind)
    save_graphs(tmp_path / "s", stored, 4)
    view = load_graphs(tmp_path / "s", params.graph.kind).split("train", params.split).graphs
    windows = list(view.window_positions(9, torch.Generator().manual_seed(1)))
    assert sorted(np.concatenate(windows).tolist()) == list(range(len(view)))
    assert all(len(w) <= 9 for w in windows) and len(windows) >= len(view) // 9
    again = list(view.window_positions(9, torch.Generator().manual_seed(2)))
    assert [w.tolist() for w in again] != [w.tolist() for w in windows]  # a new order


def test_a_top_up_harvest_then_extract_builds_only_the_new_graphs(params, extracted):
    from calo.tasks.harvest import harvest

    store = paths.records_dir(TOPPED)
    shutil.copytree(paths.records_dir(DONOR), store)
    settings = with_devices(params, **{TOPPED: params.raw["devices"][DONOR]})
    first = extract(settings, TOPPED)
    assert first["new_graphs"] == first["graphs"] == extracted[DONOR]["graphs"]
    assert sorted(count_by_workload(store).values()) == [14, 14]
    more = harvest(settings, TOPPED, ["mm-64"], 17)
    assert more["measured"] == 3
    ok = sum(r.latency is not None for r in iter_records(store))
    second = extract(settings, TOPPED)
    assert second["new_graphs"] == ok - first["graphs"] >= 1
    assert second["graphs"] == ok
    again = extract(settings, TOPPED)
    assert again["new_graphs"] == 0 and again["graphs"] == ok
    # Rebuilt from scratch whenever the graphs would differ: here smaller shards.
    smaller = extract(settings.override({"extract.shard_size": 8}), TOPPED)
    assert smaller["new_graphs"] == ok and smaller["shards"] == -(-ok // 8)
    measured = [r for r in iter_records(store) if r.latency is not None]
    _same(graphs.graph_set(params.graph.kind, measured),
          load_graphs(paths.graphs_path(TOPPED), params.graph.kind))
    # ... and when the records it covers changed: here the first one is gone.
    lines = (store / RECORD_FILE).read_text().splitlines(keepends=True)
    (store / RECORD_FILE).write_text("".join(lines[1:]))
    rebuilt = extract(settings.override({"extract.shard_size": 8}), TOPPED)
    assert rebuilt["new_graphs"] == rebuilt["graphs"] == ok - (measured[0].index == 0)
    # ... and when it was written in another format (an older version's).
    manifest = json.loads((paths.graphs_path(TOPPED) / MANIFEST).read_text())
    (paths.graphs_path(TOPPED) / MANIFEST).write_text(json.dumps({**manifest, "format": 1}))
    with pytest.raises(CaloError, match="format 1"):
        load_graphs(paths.graphs_path(TOPPED), params.graph.kind)
    upgraded = extract(settings.override({"extract.shard_size": 8}), TOPPED)
    assert upgraded["new_graphs"] == upgraded["graphs"] == rebuilt["graphs"]
    # A store rebuilt into fewer shards leaves none of the old ones behind (DVC would keep them).
    fewer = extract(settings.override({"extract.shard_size": 4096}), TOPPED)
    assert fewer["shards"] == 1
    assert [f.name for f in paths.graphs_path(TOPPED).glob("shard-*.pt")] == ["shard-00000.pt"]


def test_workers_and_a_dask_cluster_build_the_same_store(params, extracted, monkeypatch):
    from dask.distributed import LocalCluster

    from calo.tasks import extract as stage

    monkeypatch.setattr(stage, "POOL_MIN_RECORDS", 1)
    device = "cpu-parallel"
    shutil.copytree(paths.records_dir(DONOR), paths.records_dir(device))
    settings = with_devices(params, **{device: params.raw["devices"][DONOR]})
    reference = load_graphs(paths.graphs_path(DONOR), params.graph.kind)
    two = extract(settings.override({"extract.workers": 2}), device)
    assert two["graphs"] == len(reference)
    _same(reference, load_graphs(paths.graphs_path(device), params.graph.kind))
    shutil.rmtree(paths.graphs_path(device))
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        extract(settings.override({"extract.cluster": cluster.scheduler_address}), device)
    _same(reference, load_graphs(paths.graphs_path(device), params.graph.kind))


def test_an_old_single_file_store_is_named_not_misread(params, tmp_path):
    (tmp_path / "dev.pt").write_bytes(b"old")
    with pytest.raises(CaloError, match="older version"):
        load_graphs(tmp_path / "dev", params.graph.kind)
    with pytest.raises(CaloError, match="run `calo extract`"):
        load_graphs(tmp_path / "absent", params.graph.kind)
