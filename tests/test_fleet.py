"""Devices added from the command line, deployed to a real local Prefect server and run by a real
process worker (the device's stages of dvc.yaml, through DVC, then promotion); bad input is
refused before anything changes."""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from calo import paths
from calo.artifact import WEIGHTS
from calo.cli import main
from calo.flows.pipeline import planned_stages
from tests.conftest import DONOR, TARGET, copy_project

BIN = Path(sys.executable).parent
POOL = "calo-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, server: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"prefect server exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"prefect server at {url} not healthy after {timeout_s} s")


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    """A Prefect server bound to 127.0.0.1 and a process worker on its pool (one flow run at a
    time, as the README starts it), both real."""
    home = tmp_path_factory.mktemp("prefect-home")
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    # A registry of its own: the deployed project's runs leave the session's aliases alone.
    base = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "DO_NOT_TRACK": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}"}
    base.pop("PREFECT_API_URL", None)
    logs = home / "server.log"
    server = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
                               "--port", str(port)], env=base, stdout=open(logs, "w"),
                              stderr=subprocess.STDOUT)
    worker = None
    try:
        _wait_healthy(url, server)
        env = {**base, "PREFECT_API_URL": url}
        subprocess.run([str(BIN / "prefect"), "work-pool", "create", POOL, "--type", "process"],
                       env=env, check=True, capture_output=True)
        worker = subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", POOL,
                                   "--limit", "1"],
                                  env=env, stdout=open(home / "worker.log", "w"),
                                  stderr=subprocess.STDOUT)
        yield env
    finally:
        for proc in (worker, server):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:  # a worker waits for its flow runs' processes
                    proc.kill()
                    proc.wait(timeout=15)


def _stale(project: Path) -> set[str]:
    out = subprocess.run([sys.executable, "-m", "dvc", "status", "--json", "dvc.yaml"],
                         cwd=project, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


def _calo(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "calo"), *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def _run_deployment(name: str, env: dict, cwd: Path, parameters: dict | None = None) -> str:
    code = ("import sys; from prefect.deployments import run_deployment; "
            f"r = run_deployment({name!r}, parameters={parameters or {}!r}, timeout=900, "
            "poll_interval=2); print(r.state.type.value)")
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=960)
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]


@pytest.mark.slow
def test_added_device_runs_through_a_prefect_server_and_worker_and_is_promoted(
        params, pretrained, prefect_api, tmp_path):
    # A project of its own whose donor is already trained: its records, graphs and model, as
    # the session made them with these settings, copied in.
    project = copy_project(tmp_path / "project")
    (project / "params.yaml").write_text(params.path.read_text())
    for path in (paths.records_dir(DONOR), paths.graphs_path(DONOR), paths.model_dir(DONOR)):
        shutil.copytree(path.resolve(), project / path)
    env = {**prefect_api, "CALO_PARAMS": str(project / "params.yaml")}
    device = "new-cpu"
    added = _calo(["device", "add", device, "--target", '{"kind": "llvm", "num-cores": 1}',
                   "--threads", "1", "--count", "4", "--cron", "0 3 * * *", "--pool", POOL],
                  env, project)
    assert added.returncode == 0, added.stderr[-2000:]
    result = json.loads(added.stdout)
    assert result["deployment"] == f"device-run/{device}" and result["schedule"] == "0 3 * * *"
    recorded = yaml.safe_load((project / "params.yaml").read_text())
    assert device in recorded["targets"] and recorded["devices"][device]["target"]["kind"] == "llvm"
    # DVC records the donor's stages as done, so the deployment runs only the new device's.
    donor_stages = [f"harvest@{DONOR}", f"extract@{DONOR}", "pretrain"]
    subprocess.run([sys.executable, "-m", "dvc", "commit", "--force", *donor_stages],
                   cwd=project, check=True, capture_output=True)
    assert not _stale(project) & set(donor_stages)
    donor_lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]["pretrain"]
    weights = project / paths.model_dir(DONOR) / WEIGHTS
    trained_at = weights.stat().st_mtime_ns

    # Tuning is covered by the pipeline's own tests; here the flow refreshes the model only.
    no_tuning = {"tune": False}
    assert _run_deployment(f"device-run/{device}", env, project, no_tuning) == "COMPLETED"
    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    first = client.get_model_version_by_alias("calo-gnn", device)
    assert first.tags["device"] == device and first.tags["promoted"] == "True"
    assert "temperature" in first.tags  # calibrate ran in the deployment too
    # The scheduled run went through DVC: every stage the device's model needs ran in the
    # project (the donor's were already done) and is recorded in its dvc.lock, none stale.
    chain = planned_stages(project, [f"calibrate@{device}"])
    assert {f"harvest@{device}", f"extract@{device}", "pretrain", f"finetune@{device}",
            f"calibrate@{device}"} <= set(chain)
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    assert set(chain) <= set(lock)
    assert not _stale(project) & set(chain)
    assert lock["pretrain"] == donor_lock
    assert weights.stat().st_mtime_ns == trained_at  # the donor's model was not retrained

    # Changed fine-tune settings make the device's fine-tune stale, so the next scheduled run
    # redoes it; what the gate does with a worse challenger is test_training_stages's.
    worse = copy.deepcopy(recorded)
    worse["finetune"]["rule"] = [{"up_to": None, "layers": "all", "epochs": 5, "lr": 50.0}]
    (project / "params.yaml").write_text(yaml.safe_dump(worse, sort_keys=False))
    assert f"finetune@{device}" in _stale(project)
    (project / "params.yaml").write_text(yaml.safe_dump(recorded, sort_keys=False))

    listed = _calo(["device", "list"], env, project)
    row = next(r for r in json.loads(listed.stdout)["devices"] if r["device"] == device)
    assert row["deployment"]["schedule"] == "0 3 * * *"
    assert row["model"]["version"] == first.version


@pytest.mark.parametrize("args, message", [
    (["--target", '{"kind": "llvm"'], "target is not valid JSON"),
    (["--target", '{"kind": "tpu"}'], "unknown target kind 'tpu'"),
    (["--target", '{"kind": "llvm"}', "--runner", "rpc", "--host", "127.0.0.1", "--port", "1",
      "--key", "board"], "RPC tracker 127.0.0.1:1 unreachable"),
    (["--target", '{"kind": "llvm"}', "--runner", "rpc"], "--runner rpc needs --host"),
    (["--target", '{"kind": "llvm"}', "--cron", "every day"], "is not a cron schedule"),
])
def test_bad_device_input_is_one_line_and_changes_nothing(params, capsys, args, message):
    before = params.path.read_bytes()
    assert main(["device", "add", "bad-device", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert params.path.read_bytes() == before


def test_an_existing_device_name_is_refused(params, capsys):
    assert main(["device", "add", TARGET, "--target", '{"kind": "llvm"}']) == 2
    assert f"device '{TARGET}' already exists" in capsys.readouterr().err
