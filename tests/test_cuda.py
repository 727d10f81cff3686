"""The CUDA device template: its candidates come from a GPU design space and build for CUDA.

Measuring needs a CUDA GPU and compiling needs nvcc; each part runs where its tool is present.
"""

import shutil

import pytest
import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.utils import remove_build_dir

from calo import paths, records
from calo.build import build_and_export
from calo.devices import make_target
from calo.measure import device_type
from calo.workloads import create_mod
from tests.conftest import with_devices


@pytest.fixture(scope="module")
def cuda_params(params):
    return with_devices(params, **{"gpu": dict(params.raw["device_templates"]["cuda"],
                                               candidates_per_workload=2)})


def test_cuda_candidates_are_thread_bound_and_build(cuda_params):
    target = make_target(cuda_params.device("gpu"))
    assert device_type(target) == "cuda"
    ctx = ms.TuneContext(mod=create_mod(cuda_params.workload("mm-64")), target=target,
                         space_generator="post-order-apply", search_strategy="replay-trace",
                         task_name="mm-64")
    ctx.pre_tuning(max_trials=2, num_trials_per_iter=2, design_spaces=ctx.generate_design_space())
    cands = ctx.generate_measure_candidates()
    assert cands and "blockIdx.x" in str(cands[0].sch.mod) and "threadIdx.x" in str(
        cands[0].sch.mod)
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc: CUDA candidates were generated, not compiled")
    artifact = build_and_export(cands[0].sch.mod, target)
    remove_build_dir(artifact)
    assert artifact.endswith(".tar")


def test_a_workload_without_a_cuda_design_space_is_skipped_and_named(cuda_params):
    from calo.tasks.harvest import harvest

    # TVM's CUDA schedule rules fail on attention; nothing is built or measured for it.
    summary = harvest(cuda_params, "gpu", ["sdp-attention"])
    assert summary["measured"] == 0 and summary["failed"] == 0
    assert list(summary["skipped"]) == ["sdp-attention"]
    assert "out of bounds" in summary["skipped"]["sdp-attention"]


@pytest.mark.skipif(not tvm.cuda(0).exist, reason="needs a CUDA GPU")
def test_cuda_harvest_measures_on_the_gpu(cuda_params):
    from calo.tasks.harvest import harvest

    summary = harvest(cuda_params, "gpu", ["mm-64"])
    assert summary["measured"] == 2 and summary["failed"] == 0
    assert all(r.latency for r in records.iter_records(paths.records_dir("gpu")))
