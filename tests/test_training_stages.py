import json

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from calo import paths, registry
from calo.artifact import TrainedModel
from calo.dataset import load_graphs, split_of
from calo.evaluation import predictive
from tests.conftest import DONOR, TARGET


def test_pretrain_registers_the_donor_alias(params, pretrained):
    client = MlflowClient()
    version = client.get_model_version_by_alias("calo-gnn", "donor")
    assert version.version == pretrained["version"]
    assert version.tags["device"] == DONOR
    assert "pre-trained on" in version.description
    assert TrainedModel.load(paths.model_dir(DONOR)).temperature == pretrained["temperature"]
    assert np.isfinite(pretrained["val_nll"])
    # how well it fits its own training records is reported beside the held-out splits
    graphs = load_graphs(paths.graphs_path(DONOR), params.graph.kind)
    train_count = sum(split_of(w, r, params.split) == "train"
                      for w, r in zip(graphs.workload, graphs.record))
    assert pretrained["train_count"] == train_count
    assert -1 <= pretrained["train_kendall_tau"] <= 1
    assert 0 < pretrained["train_top1"] <= pretrained["train_top5"] <= 1


def test_finetune_adapts_the_layers_its_rule_names_for_the_warmup_size(params, pretrained,
                                                                        finetuned):
    donor = TrainedModel.load(paths.model_dir(DONOR)).net.state_dict()
    tuned = TrainedModel.load(paths.model_dir(TARGET)).net.state_dict()
    head = [k for k in donor if k.startswith("head.")]
    # A handful of probes per workload: params.yaml's first row, which adapts every layer.
    assert params.finetune.rule[0].layers == "all"
    assert head and any(not torch.equal(donor[k], tuned[k]) for k in head)
    assert any(not torch.equal(donor[k], tuned[k]) for k in donor if k not in head)


def test_finetune_trains_its_trees_on_the_held_back_records_and_scores_the_network_there(
        params, finetuned):
    from calo.evaluation import evaluate

    tuned = TrainedModel.load(paths.model_dir(TARGET))
    assert tuned.correction is not None and not tuned.correction.moves_mean  # as params.yaml
    graphs = load_graphs(paths.graphs_path(TARGET), tuned.graph_kind,
                         params.extracts_stores(TARGET))
    val = graphs.split("val", params.split)
    y = val.labels().double().numpy()
    for w in set(val.workload):  # each workload's best is the best of its validation records too
        assert tuned.correction.best[w] <= y[np.asarray(val.workload) == w].min() + 1e-9
    # Those records taught the trees: the stage scores the network's order on them.
    plain = evaluate(tuned.net, val, params.calibrate.levels)
    assert finetuned["val_kendall_tau"] == pytest.approx(plain["kendall_tau"])
    assert finetuned["val_top1"] == pytest.approx(plain["top1"])


def test_a_fine_tune_trains_with_its_rows_fast_end_weight_and_keeps_its_rows_epoch(
        params, pretrained):
    from calo.tasks.finetune import adapt

    graphs = load_graphs(paths.graphs_path(DONOR), params.graph.kind)
    row = {"up_to": None, "layers": "all", "epochs": 3, "lr": 3.0e-3}
    results = {}
    for fast_weight in (0.0, 4.0):
        settings = params.override({"finetune.keep": "best", "finetune.rule": [
            {**row, "fast_weight": fast_weight, "keep": "last"}]})
        results[fast_weight] = adapt(TrainedModel.load(paths.model_dir(DONOR)),
                                     settings.finetune, settings.train, graphs, graphs, set())
    for fast_weight, result in results.items():
        assert result["config"]["fast_weight"] == fast_weight
        assert result["kept_epoch"] == result["epochs"] - 1 == 2
    # The same draws from the same start: only the weighting can set the two runs apart.
    losses = [[h["train_loss"] for h in r["history"]] for r in results.values()]
    assert losses[0] != losses[1]


def test_a_fine_tune_takes_its_own_ranking_weights_where_given(params, pretrained):
    from calo.tasks.finetune import adapt

    graphs = load_graphs(paths.graphs_path(DONOR), params.graph.kind)
    rule = [{"up_to": None, "layers": "all", "epochs": 2, "lr": 3.0e-3}]
    losses = {}
    for weighting in (None, "throughput", "lambda"):
        settings = params.override({"train.rank_weighting": "throughput", "train.rank_weight": 1.0,
                                    "finetune.rank_weighting": weighting, "finetune.rule": rule})
        result = adapt(TrainedModel.load(paths.model_dir(DONOR)), settings.finetune,
                       settings.train, graphs, graphs, set())
        assert result["config"]["rank_weighting"] == (weighting or "throughput")
        losses[weighting] = [h["train_loss"] for h in result["history"]]
    assert losses[None] == losses["throughput"] != losses["lambda"]


def test_promote_registers_the_calibrated_artifact_under_the_device_alias(params, promoted):
    client = MlflowClient()
    donor = client.get_model_version_by_alias("calo-gnn", "donor")
    device = client.get_model_version_by_alias("calo-gnn", TARGET)
    assert device.version == promoted["version"] and promoted["promoted"]
    assert int(device.version) > int(donor.version)
    assert device.tags["donor"] == DONOR and "data_sha256" in device.tags
    assert f"donor version {donor.version}" in device.description
    assert client.get_registered_model("calo-gnn").description == registry.MODEL_DESCRIPTION


def test_registered_model_loads_back_as_the_same_artifact(params, promoted):
    trained, version = registry.load_registered(params, TARGET)
    local = TrainedModel.load(paths.calibrated_dir(TARGET))
    graphs = load_graphs(paths.graphs_path(TARGET), params.graph.kind)
    assert np.allclose(predictive(trained.net, graphs)[1], predictive(local.net, graphs)[1])
    assert trained.temperature == local.temperature == json.loads(
        paths.report_path("calibration", TARGET).read_text())["temperature"]


def test_promoting_the_same_model_again_registers_nothing(params, promoted):
    from calo.tasks.promote import promote

    client = MlflowClient()
    count = len(client.search_model_versions("name = 'calo-gnn'"))
    again = promote(params, TARGET)
    assert again["version"] == promoted["version"]
    assert len(client.search_model_versions("name = 'calo-gnn'")) == count


def test_calibrate_writes_metrics_and_never_worsens_validation_ece(params, calibrated):
    metrics = json.loads(paths.report_path("calibration", TARGET).read_text())
    headline = json.loads(paths.metrics_path("calibration", TARGET).read_text())
    assert headline["temperature"] == metrics["temperature"]
    assert headline["ece"]["after"] == metrics["test_ece_after"]
    for key in ("ece", "nll"):
        assert f"val_{key}_before" in metrics and f"val_{key}_after" in metrics
    # tau = 1 is among the candidates, so the fitted tau is never worse on its own data
    assert metrics["val_ece_after"] <= metrics["val_ece_before"] + 1e-12
    assert metrics["temperature"] > 0
    assert TrainedModel.load(paths.model_dir(TARGET)).temperature == 1.0
    assert TrainedModel.load(paths.calibrated_dir(TARGET)).temperature == metrics["temperature"]


def test_calibrate_draws_the_reliability_diagram_it_scores(params, calibrated):
    base = paths.metrics_path("calibration", TARGET)
    png = base.with_name(f"{TARGET}-reliability.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = json.loads(base.with_name(f"{TARGET}-reliability.json").read_text())
    assert len(rows) == params.calibrate.levels
    metrics = json.loads(paths.report_path("calibration", TARGET).read_text())
    # the plotted curves are the ECE's: mean |observed - level| on the held-out probes
    split = "test" if metrics["test_count"] else "val"
    for when in ("before", "after"):
        gap = np.mean([abs(r[when] - r["level"]) for r in rows])
        assert gap == pytest.approx(metrics[f"{split}_ece_{when}"], abs=1e-9)


def test_sweep_trains_every_setting_as_an_mlflow_run_and_reports_the_best(params, extracted):
    from calo.tasks.sweep import sweep

    out = sweep(params.override({"sweep": {"lr": [3e-3, 1e-4], "weight_decay": [0.0],
                                           "lam": [1e-2]}, "train.max_epochs": 4}))
    assert [(r["lr"], r["lam"]) for r in out["results"]] == [(3e-3, 1e-2), (1e-4, 1e-2)]
    assert out["best"]["val_nll"] == min(r["val_nll"] for r in out["results"])
    client = MlflowClient()
    experiment = client.get_experiment_by_name("calo-sweep")
    runs = client.search_runs([experiment.experiment_id])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 2 and all("val_nll" in r.data.metrics for r in children)


def test_a_worse_challenger_is_registered_but_does_not_take_the_alias(
        params, promoted, workdir, tmp_path, monkeypatch):
    from calo.tasks.calibrate import calibrate
    from calo.tasks.finetune import finetune
    from calo.tasks.promote import promote

    # The challenger's stages write into a project of their own; the registry is shared.
    for shared in (paths.graphs_path(TARGET), paths.model_dir(DONOR)):
        (tmp_path / shared).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / shared).symlink_to(workdir / shared)
    monkeypatch.chdir(tmp_path)
    client = MlflowClient()
    champion = client.get_model_version_by_alias("calo-gnn", TARGET)
    wrecked = params.override({"finetune.rule": [  # a wild step
        {"up_to": None, "layers": "all", "epochs": 5, "lr": 50.0}]})
    finetune(wrecked, TARGET)
    calibrate(wrecked, TARGET)
    summary = promote(wrecked, TARGET)
    assert summary["promoted"] is False and "not better than the champion" in summary["promotion"]
    challenger = client.get_model_version("calo-gnn", summary["version"])
    assert int(challenger.version) > int(champion.version)
    assert challenger.tags["promoted"] == "False"
    assert challenger.tags["promotion"] == summary["promotion"]
    assert "Not promoted" in challenger.description
    assert client.get_model_version_by_alias("calo-gnn", TARGET).version == champion.version


def test_a_promotion_decided_against_a_moved_alias_is_refused(params, promoted):
    from calo.errors import CaloError

    current = registry.aliased_version(params, TARGET).version
    with pytest.raises(CaloError, match="moved"):
        registry.move_alias(params, TARGET, current, expected=str(int(current) - 1))
    assert registry.aliased_version(params, TARGET).version == current


def test_donor_calibration_by_workload_keeps_whole_workloads_out_of_training(
        params, extracted, monkeypatch, tmp_path):
    from calo.dataset import GraphSet, save_graphs
    from calo.tasks import pretrain

    measured = load_graphs(paths.graphs_path(DONOR), params.graph.kind)
    # The same measured graphs under twelve workload names: enough workloads to hold some out.
    many = GraphSet(measured.graphs, [f"w{i % 12}" for i in range(len(measured))],
                    measured.record, measured.kind)
    save_graphs(tmp_path / "donor", many, params.extract.shard_size)
    monkeypatch.setattr(paths, "graphs_path", lambda device: tmp_path / "donor")
    by_workload = params.override({"split.donor_calibration": "workload"})
    train, val, test, calibration = pretrain.donor_splits(by_workload)
    held = set(calibration.workload)
    assert 1 <= len(held) < 12 and len(calibration) == sum(w in held for w in many.workload)
    assert not held & (set(train.workload) | set(val.workload) | set(test.workload))
    by_record = params.override({"split.donor_calibration": "record"})
    train_r, val_r, _, calibration_r = pretrain.donor_splits(by_record)
    assert calibration_r is val_r and len(train_r) > len(train)


def test_a_donor_shared_by_two_devices_keeps_each_devices_workloads_apart(params, extracted):
    from calo.records import store_targets
    from calo.tasks import pretrain

    alone = pretrain.donor_graphs(params)
    shared = pretrain.donor_graphs(params, [TARGET])
    target = load_graphs(paths.graphs_path(TARGET), params.graph.kind)
    assert len(shared) == len(alone) + len(target)
    # the same workload measured on two devices is two rankings, not one
    assert set(shared.workload) == set(alone.workload) | {f"{TARGET}/{w}"
                                                          for w in target.workload}
    assert set(alone.workload) & set(target.workload)
    parts = pretrain.donor_splits(params, [TARGET])
    assert sum(map(len, parts[:3])) > sum(map(len, pretrain.donor_splits(params)[:3]))
    one_epoch = params.override({"train.max_epochs": 1})
    trained, _ = pretrain.train_on_donor(one_epoch, *parts, also=[TARGET])
    assert trained.trained_on(store_targets(paths.records_dir(TARGET)))
    assert trained.trained_on(store_targets(paths.records_dir(DONOR)))
