import copy
import json

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from calo import registry
from calo.config import Params
from calo.dataset import load_graphs
from calo.evaluation import predictive
from tests.conftest import DONOR, TARGET


def test_pretrain_registers_the_donor_alias(params, pretrained):
    client = MlflowClient()
    version = client.get_model_version_by_alias("calo-gnn", "donor")
    assert version.version == pretrained["version"]
    assert version.tags["device"] == DONOR
    assert (params.model_dir(DONOR) / registry.WEIGHTS).is_file()
    assert np.isfinite(pretrained["val_nll"])


def test_finetune_registers_a_new_version_under_the_device_alias(params, pretrained, finetuned):
    client = MlflowClient()
    donor = client.get_model_version_by_alias("calo-gnn", "donor")
    device = client.get_model_version_by_alias("calo-gnn", TARGET)
    assert int(device.version) > int(donor.version)
    assert device.tags["donor"] == DONOR
    donor_model, _ = registry.load_model(params.model_dir(DONOR))
    tuned_model, _ = registry.load_model(params.model_dir(TARGET))
    donor_w, tuned_w = donor_model.state_dict(), tuned_model.state_dict()
    head = [k for k in donor_w if k.startswith("head.")]
    assert head and any(not torch.equal(donor_w[k], tuned_w[k]) for k in head)
    # finetune.layers = head: the encoder keeps the donor's weights
    assert all(torch.equal(donor_w[k], tuned_w[k]) for k in donor_w if k not in head)


def test_registered_model_loads_back_with_weights_only(params, calibrated):
    model, config, version = registry.load_registered(params, TARGET)
    local, _ = registry.load_model(params.model_dir(TARGET))
    graphs = load_graphs(params.graphs_path(TARGET), params.graph_kind)
    assert np.allclose(predictive(model, graphs)[1], predictive(local, graphs)[1])
    stored = json.loads(params.calibration_path(TARGET).read_text())["temperature"]
    assert config["temperature"] == stored


def test_calibrate_writes_metrics_and_never_worsens_validation_ece(params, calibrated):
    metrics = json.loads(params.metrics_path("calibration", TARGET).read_text())
    for key in ("ece", "nll"):
        assert f"val_{key}_before" in metrics and f"val_{key}_after" in metrics
    # tau = 1 is among the candidates, so the fitted tau is never worse on its own data
    assert metrics["val_ece_after"] <= metrics["val_ece_before"] + 1e-12
    assert metrics["temperature"] > 0
    stored = json.loads(params.calibration_path(TARGET).read_text())
    assert stored["temperature"] == metrics["temperature"]


def test_calibrate_draws_the_reliability_diagram_it_scores(params, calibrated):
    base = params.metrics_path("calibration", TARGET)
    png = base.with_name(f"{TARGET}-reliability.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = json.loads(base.with_name(f"{TARGET}-reliability.json").read_text())
    assert len(rows) == params["calibrate"]["levels"]
    metrics = json.loads(base.read_text())
    # the plotted curves are the ECE's: mean |observed - level| on the held-out probes
    split = "test" if metrics["test_count"] else "val"
    for when in ("before", "after"):
        gap = np.mean([abs(r[when] - r["level"]) for r in rows])
        assert gap == pytest.approx(metrics[f"{split}_ece_{when}"], abs=1e-9)


def test_sweep_trains_every_setting_as_an_mlflow_run_and_reports_the_best(params, extracted):
    import copy

    from calo.config import Params
    from tasks.sweep import sweep

    raw = copy.deepcopy(params.raw)
    raw["sweep"] = {"lr": [3e-3, 1e-4], "weight_decay": [0.0], "lam": [1e-2]}
    raw["train"]["max_epochs"] = 4
    out = sweep.fn(Params(raw=raw, path=params.path))
    assert [(r["lr"], r["lam"]) for r in out["results"]] == [(3e-3, 1e-2), (1e-4, 1e-2)]
    assert out["best"]["val_nll"] == min(r["val_nll"] for r in out["results"])
    client = MlflowClient()
    experiment = client.get_experiment_by_name("calo-sweep")
    runs = client.search_runs([experiment.experiment_id])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 2 and all("val_nll" in r.data.metrics for r in children)


def test_a_worse_challenger_is_registered_but_does_not_take_the_alias(params, calibrated):
    from tasks.finetune import finetune

    client = MlflowClient()
    champion = client.get_model_version_by_alias("calo-gnn", TARGET)
    assert champion.tags["promoted"] == "True" and "data_sha256" in champion.tags
    weights = (params.model_dir(TARGET) / registry.WEIGHTS).read_bytes()
    raw = copy.deepcopy(params.raw)
    raw["finetune"].update({"lr": 50.0, "layers": "all"})  # a step size that wrecks the model
    summary = finetune.fn(Params(raw=raw, path=params.path), TARGET)
    assert summary["promoted"] is False and "not better than the champion" in summary["promotion"]
    challenger = client.get_model_version("calo-gnn", summary["version"])
    assert int(challenger.version) > int(champion.version)
    assert challenger.tags["promoted"] == "False"
    assert challenger.tags["promotion"] == summary["promotion"]
    # the alias and the device's model directory still hold the champion
    assert client.get_model_version_by_alias("calo-gnn", TARGET).version == champion.version
    assert (params.model_dir(TARGET) / registry.WEIGHTS).read_bytes() == weights
