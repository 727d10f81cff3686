"""The built-in workload suite: 38+ operators, the paper's seven, each builds and measures."""

import sys

import pytest
from harvest_pools import HELD_OUT, UNSEEN_OPERATORS, heldout_workloads, pool_name, pool_settings
from harvest_pools import main as harvest_pools_main

from calo import paths, records, suite
from calo.cli import main
from tests.conftest import with_devices

PAPER_SEVEN = {"gelu-mlp", "sdp-attention", "conv2d", "depthwise-conv2d", "matmul", "layer-norm",
               "group-conv2d"}


def test_calo_workloads_lists_38_operators_and_the_paper_seven(params, capsys):
    assert main(["workloads"]) == 0
    listed = {line.split()[0] for line in capsys.readouterr().out.splitlines()
              if line and line[0].isalpha()}
    assert len(set(suite.names()) & listed) >= 38
    assert PAPER_SEVEN <= listed
    ops = {suite.SUITE[n].op for n in suite.names()}
    assert len(ops) >= 38  # distinct operator functions, not just shapes
    assert set(suite.PAPER_OPERATORS) == PAPER_SEVEN
    assert main(["workloads", "--paper"]) == 0
    assert capsys.readouterr().out.count("@paper") == 7


@pytest.mark.slow
def test_every_suite_operator_builds_and_measures_at_its_small_shape(params):
    from calo.tasks.harvest import harvest

    device = {"target": {"kind": "llvm", "num-cores": 2}, "runner": {"kind": "local"},
              "candidates_per_workload": 1}
    p = with_devices(params, **{"suite-cpu": device})
    summary = harvest(p, "suite-cpu", suite.names())
    recs = {r.workload_name: r for r in records.iter_records(paths.records_dir("suite-cpu"))}
    assert summary["measured"] == len(suite.names()) == len(recs)
    failed = {name: r.status for name, r in recs.items() if r.latency is None}
    assert not failed
    assert all(0 < r.latency < 0.1 for r in recs.values())


def test_unknown_suite_shape_is_an_error(params):
    from calo.config import CaloError

    with pytest.raises(CaloError, match="unknown workload 'conv1d@paper'"):
        params.workload("conv1d@paper")  # only the paper's seven have the paper's shape
    assert params.workload("matmul@paper").args == {"n": 4096, "m": 4096, "k": 1024}


def test_three_shapes_per_operator_and_held_out_shapes_none_of_them(params):
    from calo.workloads import create_mod, workload_key

    everything = suite.names("all")
    assert len(everything) == 3 * len(suite.SUITE)
    keys = {}
    for workload in params.workloads_named(everything):
        keys.setdefault(workload_key(create_mod(workload)), []).append(workload.name)
    assert all(len(names) == 1 for names in keys.values())  # three different programs each
    held = params.override({f"workloads.{n}": w for n, w in heldout_workloads().items()})
    for workload in held.workloads_named(HELD_OUT):
        assert workload_key(create_mod(workload)) not in keys
    assert {suite.operator(n) for n in HELD_OUT} >= set(UNSEEN_OPERATORS)


def test_a_held_out_harvest_refuses_a_workload_its_pool_lacks(params, monkeypatch):
    from tests.conftest import TARGET

    monkeypatch.setattr(sys, "argv", ["harvest_pools.py", "heldout", "--device", TARGET,
                                      "--count", "1", "--workload", "matmul@384x192x320",
                                      "--workload", "matmul@7x7x7"])
    with pytest.raises(SystemExit, match="not a workload of the heldout pool: matmul@7x7x7"):
        harvest_pools_main()
    assert not paths.records_dir(pool_name("heldout", TARGET)).exists()


def test_a_named_pool_is_its_own_store_measured_like_its_device(params):
    from tests.conftest import TARGET

    named = pool_settings(params, "donor", TARGET, pool="selection-x")
    assert named.raw["devices"]["selection-x"] == params.raw["devices"][TARGET]
    assert pool_name("donor", TARGET) not in named.raw["devices"]
