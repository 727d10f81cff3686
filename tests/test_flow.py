"""The per-device flow on a real Prefect engine (a temporary local server)."""

import json

import pytest
from mlflow.tracking import MlflowClient
from prefect.testing.utilities import prefect_test_harness

from tests.conftest import TARGET


@pytest.fixture(scope="module")
def prefect_server():
    with prefect_test_harness(server_startup_timeout=120):
        yield


def test_device_flow_runs_every_stage_and_gates_the_alias(params, calibrated, prefect_server):
    from flows.pipeline import device_flow

    client = MlflowClient()
    before = int(client.get_model_version_by_alias("calo-gnn", TARGET).version)
    state = device_flow(TARGET, params_path=str(params.path), return_state=True)
    assert state.is_completed(), state
    result = state.result()
    assert set(result) == {"finetune", "calibration", "tune"}
    new = int(result["finetune"]["version"])
    assert new > before  # every run registers a version...
    after = int(client.get_model_version_by_alias("calo-gnn", TARGET).version)
    assert after == (new if result["finetune"]["promoted"] else before)  # ...the gate decides
    report = json.loads(params.metrics_path("tune", TARGET).read_text())
    assert set(report["workloads"]["mm-64"]) >= {"calo", "xgb"}
