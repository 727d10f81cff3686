"""Build errors, run errors and timeouts are stored as failed measurements; harvesting goes on."""

import tempfile

import pytest
import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.script import tirx as T

from calo import paths, records
from calo.errors import CaloError
from calo.measure import (
    BUILD_ERROR,
    OK,
    RUN_ERROR,
    TIMEOUT,
    close_builder,
    make_builder,
    make_runner,
    measure,
    status_of,
)
from calo.workloads import create_mod
from tests.conftest import with_devices


@T.prim_func
def _no_llvm_lowering(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
    # A GPU warp intrinsic: LLVM's CPU code generator rejects it, a genuine build error.
    for i in range(16):
        B[i] = T.call_intrin("float32", "tirx.tvm_warp_shuffle", T.uint32(0), A[i], 0, 32, 32)


def _candidate(mod: tvm.IRModule) -> ms.MeasureCandidate:
    return ms.MeasureCandidate(tvm.s_tir.Schedule(mod),
                               ms.arg_info.ArgInfo.from_prim_func(mod["main"]))


def in_tmp_path(monkeypatch, tmp_path) -> None:
    """Every artifact folder lands in tmp_path: the builder's (this process's tempfile) and any
    a build worker makes (workers inherit TMPDIR)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))


@pytest.mark.slow
def test_a_build_error_is_reported_in_place_and_the_batch_goes_on(params, tmp_path,
                                                                  monkeypatch):
    in_tmp_path(monkeypatch, tmp_path)
    good = _candidate(create_mod(params.workload("mm-64")))
    bad = _candidate(tvm.IRModule({"main": _no_llvm_lowering}))
    seen = []
    device = params.device("cpu-b")
    builder = make_builder(params.harvest)
    try:
        results = measure(builder, make_runner(device, params.harvest),
                          tvm.target.Target({"kind": "llvm"}), [good, bad, good],
                          lambda i, r: seen.append(i))
    finally:
        close_builder(builder)
    assert [status_of(r.error_msg) for r in results] == [OK, BUILD_ERROR, OK]
    assert "tvm_warp_shuffle" in results[1].error_msg
    assert sorted(seen) == [0, 1, 2]  # every result, failed or not, reached the caller
    assert all(s > 0 for s in results[0].run_secs)
    assert list(tmp_path.iterdir()) == []  # measured artifacts are removed, not left behind


@pytest.mark.slow
def test_a_build_timeout_leaves_no_artifact_folder_behind(params, tmp_path, monkeypatch):
    in_tmp_path(monkeypatch, tmp_path)
    cfg = params.override({"harvest.build_timeout_s": 0.01}).harvest
    builder = make_builder(cfg)
    try:
        results = measure(builder, make_runner(params.device("cpu-b"), cfg),
                          tvm.target.Target({"kind": "llvm"}),
                          [_candidate(create_mod(params.workload("mm-64")))] * 2)
    finally:
        close_builder(builder)
    assert [status_of(r.error_msg) for r in results] == [TIMEOUT, TIMEOUT]
    assert list(tmp_path.iterdir()) == []  # the killed workers' folders are removed too


@pytest.mark.slow
def test_a_run_timeout_is_a_timeout(params):
    slow = _candidate(create_mod(params.workload("matmul@paper")))  # 4096x4096x1024, untuned
    fast = _candidate(create_mod(params.workload("mm-64")))
    cfg = params.override({"harvest.run_timeout_s": 1}).harvest
    builder = make_builder(cfg)
    try:
        results = measure(builder, make_runner(params.device("cpu-b"), cfg),
                          tvm.target.Target({"kind": "llvm"}), [slow, fast])
    finally:
        close_builder(builder)
    assert [status_of(r.error_msg) for r in results] == [TIMEOUT, OK]


@pytest.mark.slow
def test_harvest_keeps_failed_runs_and_build_timeouts_as_failed_records(params):
    from calo.tasks.extract import extract
    from calo.tasks.harvest import harvest

    # Code for another CPU builds here but cannot be loaded here: every run fails.
    arm = {"target": {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "num-cores": 1},
           "runner": {"kind": "local", "num_threads": 1}, "candidates_per_workload": 2}
    p = with_devices(params, **{"fault-arm": arm})
    summary = harvest(p, "fault-arm", ["mm-64"])
    assert summary["measured"] == summary["failed"] == 2
    recs = list(records.iter_records(paths.records_dir("fault-arm")))
    assert [r.status for r in recs] == [RUN_ERROR] * 2 and all(r.latency is None for r in recs)
    meta = records.load_meta(paths.records_dir("fault-arm")).values()
    assert all("error" in m for m in meta)

    # A build that cannot finish in time is a timeout, stored and skipped over the same way.
    slow = with_devices(params, {"build_timeout_s": 0.01}, **{
        "fault-slow-build": dict(arm, target={"kind": "llvm", "num-cores": 1})})
    summary = harvest(slow, "fault-slow-build", ["mm-64"])
    assert summary["measured"] == summary["failed"] == 2
    recs = list(records.iter_records(paths.records_dir("fault-slow-build")))
    assert {r.status for r in recs} == {TIMEOUT}

    # Failed measurements are never labels: nothing to extract from these stores.
    with pytest.raises(CaloError, match="no successful measurements"):
        extract(p, "fault-arm")
