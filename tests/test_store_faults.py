"""Faults the stores and the registry must survive: torn writes, two runs of one device,
servers that are down, corrupt model artifacts. Every case ends in one line or carries on,
and loses nothing already measured or trained."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from calo import locks, paths
from calo.records import META_FILE, RECORD_FILE, TORN_SUFFIX, candidate_id, iter_records
from tests.conftest import TARGET, with_devices
from tests.test_cli import cli, tree_digest

ONE_CORE = {"target": {"kind": "llvm", "num-cores": 1},
            "runner": {"kind": "local", "num_threads": 1}, "candidates_per_workload": 6}


def calo(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "calo.cli", *args], cwd=cwd,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=300)


def _params_with(params, tmp_path: Path, device: str) -> Path:
    """A params file with one more device, for CLI runs in the session's project."""
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(with_devices(params, **{device: ONE_CORE}).raw))
    return path


def _tear(file: Path) -> str:
    """Append the first half of the file's last line, without a newline: an append cut short."""
    half = file.read_text().splitlines()[-1]
    half = half[: len(half) // 2]
    with open(file, "a") as f:
        f.write(half)
    return half


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


@pytest.mark.slow
def test_a_torn_last_line_is_set_aside_and_the_harvest_goes_on(params, workdir, tmp_path, capsys):
    device = "fault-torn"
    pfile = _params_with(params, tmp_path, device)
    store = paths.records_dir(device)
    assert cli(capsys, "harvest", "--device", device, "--workload", "mm-64", cwd=workdir,
               params=pfile)[0] == 0
    complete, meta = (store / RECORD_FILE).read_text(), (store / META_FILE).read_text()
    torn = [_tear(store / RECORD_FILE), _tear(store / META_FILE)]

    out = calo("--params", str(pfile), "records", "--device", device, cwd=workdir)
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stderr.splitlines() if "torn last line" in line]
    assert len(warnings) == 2  # one line per repaired file
    assert out.stdout.splitlines()[-1].split()[-1] == "6"  # every complete record counted
    assert out.stdout.splitlines()[0] == "measured on llvm -num-cores=1 (6 records)"
    assert (store / RECORD_FILE).read_text() == complete
    assert (store / META_FILE).read_text() == meta
    assert (store / (RECORD_FILE + TORN_SUFFIX)).read_text() == torn[0] + "\n"
    assert (store / (META_FILE + TORN_SUFFIX)).read_text() == torn[1] + "\n"

    # A crash during the next harvest's first append: that harvest's own open repairs it.
    again = _tear(store / RECORD_FILE)
    assert cli(capsys, "harvest", "--device", device, "--workload", "mm-64", "--count", "9",
               cwd=workdir, params=pfile)[0] == 0
    assert (store / RECORD_FILE).read_text().startswith(complete)
    recs = list(iter_records(store))
    assert len(recs) == 9 and all(r.latency for r in recs)  # new records parse
    assert len({candidate_id(r.workload_key, r.record.trace) for r in recs}) == 9
    assert (store / (RECORD_FILE + TORN_SUFFIX)).read_text() == f"{torn[0]}\n{again}\n"
    assert len((store / META_FILE).read_text().splitlines()) == 9
    # Repeated runs: each new record keeps the spread of its repeats in the side file.
    spreads = [json.loads(line).get("spread") for line in
               (store / META_FILE).read_text().splitlines()]
    assert all(s is not None and s >= 0 for s in spreads)


@pytest.mark.slow
def test_two_harvests_of_one_device_measure_the_asked_count_once(params, workdir, tmp_path):
    device = "fault-two"
    pfile = _params_with(params, tmp_path, device)
    args = ["--params", str(pfile), "harvest", "--device", device, "--workload", "mm-64",
            "--count", "8"]
    with locks.device_lock(device, "a test holding the device"):
        refused = calo("--no-wait", *args, cwd=workdir)
    assert refused.returncode == 2
    assert refused.stderr.strip().count("\n") == 0
    assert f"device '{device}' is busy: `a test holding the device`" in refused.stderr
    assert not (paths.records_dir(device) / RECORD_FILE).exists()  # nothing was measured

    runs = [subprocess.Popen([sys.executable, "-m", "calo.cli", *args], cwd=workdir,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outs
    errs = [err for _, err in outs]
    assert sum("waits for it" in err for err in errs) == 1
    second = next(err for err in errs if "waits for it" in err)
    assert f"harvest {device}: every workload already has 8 records" in second
    assert sum(f"harvest {device}: 8 measured" in err for err in errs) == 1
    recs = list(iter_records(paths.records_dir(device)))
    assert len(recs) == 8
    assert len({candidate_id(r.workload_key, r.record.trace) for r in recs}) == 8


def _one_line_within(out: subprocess.CompletedProcess, seconds: float, started: float) -> None:
    assert time.monotonic() - started < seconds
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().count("\n") == 0, out.stderr
    assert "Traceback" not in out.stderr


def test_a_server_that_is_down_stops_the_command_in_one_line(workdir, calibrated):
    before = tree_digest(workdir / "data")
    mlflow_uri = f"http://127.0.0.1:{_closed_port()}"
    start = time.monotonic()
    out = calo("finetune", "--device", TARGET, cwd=workdir,
               env={"MLFLOW_TRACKING_URI": mlflow_uri})
    _one_line_within(out, 30, start)
    assert f"MLflow tracking server {mlflow_uri} does not answer" in out.stderr
    assert "mlflow server" in out.stderr  # what to start

    prefect_url = f"http://127.0.0.1:{_closed_port()}/api"
    start = time.monotonic()
    out = calo("run", "--device", TARGET, "--no-tune", cwd=workdir,
               env={"PREFECT_API_URL": prefect_url})
    _one_line_within(out, 30, start)
    assert f"Prefect server {prefect_url} does not answer" in out.stderr
    assert "prefect server start" in out.stderr
    assert tree_digest(workdir / "data") == before


@pytest.mark.parametrize("corrupt, message", [
    (lambda d: (d / "weights.pt").write_bytes((d / "weights.pt").read_bytes()[:100]),
     "does not hold this model's weights"),
    (lambda d: torch.save({"other.weight": torch.zeros(3)}, d / "weights.pt"),
     "does not hold this model's weights"),
    (lambda d: (d / "model.json").write_text(json.dumps(
        {**json.loads((d / "model.json").read_text()), "hidden": 7})),
     "does not hold this model's weights"),
    (lambda d: (d / "model.json").write_text("{"), "is not a model configuration"),
    (lambda d: (d / "model.json").write_text(json.dumps(
        {**json.loads((d / "model.json").read_text()), "device_temperatures": [1.5]})),
     "is not a model configuration"),
    (lambda d: (d / "model.json").write_text(json.dumps(
        {**json.loads((d / "model.json").read_text()), "scale_power": 0.6})),
     "serves its scales to the power 0.6"),
    (lambda d: (d / "model.json").write_text(json.dumps(
        {**json.loads((d / "model.json").read_text()), "device_temperatures": {"host": 1.5}})),
     "has a temperature per target (host)"),
])
def test_a_corrupt_model_is_refused_in_one_line_and_nothing_is_overwritten(
        workdir, calibrated, tmp_path, capsys, corrupt, message):
    model = paths.model_dir(TARGET)
    keep = tmp_path / "intact"
    shutil.copytree(model, keep)
    before = tree_digest(paths.calibrated_dir(TARGET))
    try:
        corrupt(model)
        code, err = cli(capsys, "calibrate", "--device", TARGET, cwd=workdir)
    finally:
        shutil.rmtree(model)
        shutil.copytree(keep, model)
    assert code == 2 and message in err, err
    assert err.strip().count("\n") == 0
    assert tree_digest(paths.calibrated_dir(TARGET)) == before


def test_a_registry_version_without_its_files_is_refused_in_one_line(workdir, promoted, capsys):
    from calo.config import load_settings
    from calo.registry import aliased_version

    version = aliased_version(load_settings(), TARGET)
    files = Path(version.source.removeprefix("file://"))
    assert files.is_dir(), version.source
    aside = files.with_name(files.name + ".aside")
    files.rename(aside)
    try:
        code, err = cli(capsys, "evaluate", "--model", TARGET, "--records",
                        str(paths.records_dir(TARGET)), cwd=workdir)
    finally:
        aside.rename(files)
    assert code == 2, err
    assert err.strip().count("\n") == 0, err
    assert f"registry version {version.version} ('{TARGET}') has no readable model files" in err
