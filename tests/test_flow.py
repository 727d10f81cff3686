"""The pipeline flow on a real Prefect engine (a temporary local server) running the project's
real DVC stages."""

import json
import shutil
import subprocess
import sys

import pytest
from prefect.testing.utilities import prefect_test_harness

from calo import paths
from tests.conftest import DONOR, TARGET, copy_project


@pytest.fixture(scope="module")
def prefect_server():
    with prefect_test_harness(server_startup_timeout=120):
        yield


def test_device_flow_runs_the_devices_dvc_stages_then_promotes(
        params, harvested, prefect_server, tmp_path, monkeypatch):
    from calo.flows.pipeline import device_flow, planned_stages

    # A project of its own with the session's measured records (so nothing is re-measured)
    # and a registry of its own.
    project = copy_project(tmp_path / "project")
    shutil.copy2(params.path, project / "params.yaml")
    for device in (DONOR, TARGET):
        shutil.copytree(paths.records_dir(device).resolve(), project / paths.records_dir(device))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    order = planned_stages(project, [f"tune@{TARGET}"])
    assert len(order) == 8 and set(order) == {
        f"harvest@{DONOR}", f"extract@{DONOR}", "pretrain", f"harvest@{TARGET}",
        f"extract@{TARGET}", f"finetune@{TARGET}", f"calibrate@{TARGET}", f"tune@{TARGET}"}
    assert order.index(f"extract@{DONOR}") < order.index("pretrain") < order.index(
        f"finetune@{TARGET}") < order.index(f"calibrate@{TARGET}") < order.index(f"tune@{TARGET}")
    assert order.index(f"extract@{TARGET}") < order.index(f"finetune@{TARGET}")

    state = device_flow(TARGET, project=str(project), return_state=True)
    assert state.is_completed(), state
    result = state.result()
    assert list(result["stages"]) == order
    assert result["promotion"][TARGET]["promoted"]  # the first model of this registry
    assert f"== {TARGET}" in result["summary"] and "geo-mean trials ratio" in result["summary"]
    assert max(map(len, result["summary"].splitlines())) <= 120
    report = json.loads((project / paths.report_path("tune", TARGET)).read_text())
    assert set(report["workloads"]["mm-64"]) >= {"calo", "xgb"}
    # every stage ran through DVC, so the lock file records it: nothing of them is left to do
    # (the session's other devices have stages that this device does not need, never run)
    status = subprocess.run([sys.executable, "-m", "dvc", "status", "--json", "dvc.yaml"],
                            cwd=project, capture_output=True, text=True, check=True)
    stale = set(json.loads(status.stdout))
    assert stale and not stale & set(order)

    again = device_flow(TARGET, project=str(project))  # a second run: every stage skipped
    assert set(again["stages"].values()) == {"skipped"}
    assert again["promotion"][TARGET]["promotion"] == "already the device's model"
