"""A tiny real pipeline shared by the tests: two CPU devices, two small matmuls, a few candidates.

Stages run once per session, in order, in a temporary project: a copy of the repository's
tracked files (so `dvc repro` there finds dvc.yaml and the code it depends on) with a tiny
params.yaml; data/, metrics/, mlflow.db and MLflow artifacts all land there. Every latency is
measured on this machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml


def share_cores_among_workers() -> None:
    """Each pytest-xdist worker's OpenMP threads (torch's, the graph walker's) to its share of
    the cores, unless OMP_NUM_THREADS says otherwise. At one thread per core per worker, two
    workers' threads outnumber the cores, and OpenMP's barriers wait on threads the other
    worker's spinning ones keep off a core: a test of seconds ran for minutes while the other
    worker trained. Read by the OpenMP runtime when it loads, so before anything imports torch
    or TVM; the tests' subprocesses inherit it. The share is calo.compute.launch's for
    torchrun's processes, written out here because importing that module loads torch."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))


share_cores_among_workers()

from calo.devices import preload_tensor_intrinsics  # noqa: E402 - after the threads are set

# Before any test module imports torch_geometric: see preload_tensor_intrinsics.
preload_tensor_intrinsics()

REPO = Path(__file__).resolve().parent.parent
DONOR, TARGET = "cpu-a", "cpu-b"
SPARE = "cpu-c"  # receives imports only, so they do not change the other stages' data
KILLED = "cpu-d"  # harvested by a process that gets killed


def pytest_collection_modifyitems(items: list) -> None:
    """The slow tests first. `make test` hands whole files to two workers (xdist's loadfile) in
    this order, so the files with the longest tests start first and neither worker starts one
    last; a file's other tests keep their written order."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def tiny_params() -> dict:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params.update({
        "donor": DONOR,
        "targets": [TARGET],
        "devices": {
            DONOR: {"target": {"kind": "llvm", "num-cores": 2, "mcpu": "host"},
                    "runner": {"kind": "local", "num_threads": 2},
                    "candidates_per_workload": 14},
            TARGET: {"target": {"kind": "llvm", "num-cores": 1, "mcpu": "x86-64"},
                     "runner": {"kind": "local", "num_threads": 1},
                     "candidates_per_workload": 14},
            SPARE: {"target": {"kind": "llvm", "num-cores": 1}, "candidates_per_workload": 0},
            KILLED: {"target": {"kind": "llvm", "num-cores": 1},
                     "runner": {"kind": "local", "num_threads": 1},
                     "candidates_per_workload": 12},
        },
        "workloads": {
            "mm-64": {"op": "matmul", "args": {"n": 64, "m": 64, "k": 64}},
            "mm-relu-32x64": {"op": "matmul_relu", "args": {"n": 32, "m": 64, "k": 64}},
        },
    })
    # One build worker: a second one costs each harvest and search its own TVM start-up
    # while the two pytest workers already keep both cores busy.
    params["harvest"].update({"workloads": ["mm-64", "mm-relu-32x64"], "batch_size": 8,
                              "min_repeat_ms": 2, "build_workers": 1,
                              "evolution": {"population_size": 32, "genetic_num_iters": 1}})
    params["train"].update({"max_epochs": 8})
    for row in params["finetune"]["rule"] + params["finetune"]["same_device_rule"]:
        row["epochs"] = min(row["epochs"], 8)
    params["tune"].update({"workloads": ["mm-64"], "max_trials": 8, "trials_per_iter": 4,
                           "update_steps": 3,
                           "search": {"population_size": 64, "genetic_num_iters": 2},
                           "calo_search": {"population_size": 64, "genetic_num_iters": 1}})
    params["networks"].update({"trials_per_iter": 4, "repeat": 5, "min_repeat_ms": 5})
    return params


def copy_project(dest: Path) -> Path:
    """The repository's tracked files in dest, as a git repository of its own (DVC needs one)."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    return dest


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    root = copy_project(tmp_path_factory.mktemp("calo"))
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params(), sort_keys=False))
    old = Path.cwd()
    os.chdir(root)
    os.environ["CALO_PARAMS"] = str(root / "params.yaml")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / 'mlflow.db'}"
    yield root
    os.chdir(old)


def search_batch(device: str, count: int) -> tuple:
    """(context, candidates, runner results, records): the first `count` measured records of
    one workload of a device's store, as a search round hands them to a cost model."""
    from tvm.s_tir import meta_schedule as ms

    from calo.paths import records_dir
    from calo.records import iter_records

    recs = [r for r in iter_records(records_dir(device)) if r.latency is not None]
    group = [r for r in recs if r.workload_name == recs[0].workload_name][:count]
    context = ms.TuneContext(mod=group[0].record.workload.mod, target=group[0].record.target)
    return (context, [r.record.as_measure_candidate() for r in group],
            [ms.runner.RunnerResult(r.record.run_secs, None) for r in group], group)


def with_devices(params, harvest: dict | None = None, **devices: dict):
    """The session's settings plus extra devices (and harvest settings), for one test."""
    return params.override({**{f"devices.{name}": spec for name, spec in devices.items()},
                            **{f"harvest.{k}": v for k, v in (harvest or {}).items()}})


@pytest.fixture(scope="session")
def params(workdir):
    """The session's settings (calo.config.Settings), read from its params.yaml."""
    from calo.config import load_settings

    return load_settings(workdir / "params.yaml")


@pytest.fixture(scope="session")
def harvested(params) -> dict:
    from calo.tasks.harvest import harvest

    return {d: harvest(params, d) for d in (DONOR, TARGET)}


@pytest.fixture(scope="session")
def extracted(params, harvested) -> dict:
    from calo.tasks.extract import extract

    return {d: extract(params, d) for d in (DONOR, TARGET)}


@pytest.fixture(scope="session")
def pretrained(params, extracted) -> dict:
    from calo.tasks.pretrain import pretrain

    return pretrain(params)


@pytest.fixture(scope="session")
def finetuned(params, pretrained) -> dict:
    from calo.tasks.finetune import finetune

    return finetune(params, TARGET)


@pytest.fixture(scope="session")
def calibrated(params, finetuned) -> dict:
    from calo.tasks.calibrate import calibrate

    return calibrate(params, TARGET)


@pytest.fixture(scope="session")
def tuned(params, calibrated) -> dict:
    from calo.tasks.tune import tune, write_report

    report = tune(params, TARGET, "mm-64")
    summary = write_report(params, TARGET, {"mm-64": report})
    return {"report": report, "summary": summary}


@pytest.fixture(scope="session")
def promoted(params, calibrated) -> dict:
    from calo.tasks.promote import promote

    return promote(params, TARGET)
