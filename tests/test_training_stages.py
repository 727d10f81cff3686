import json

import numpy as np
import torch
from mlflow.tracking import MlflowClient

from calo import registry
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
    graphs = load_graphs(params.graphs_path(TARGET))
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
