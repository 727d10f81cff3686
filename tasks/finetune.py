"""Stage 4: adapt the donor model to a new device on its warm-up probes (two-stage transfer).

The result is the device's challenger; `calibrate` fits its temperature and `promote` decides,
against the registry, whether it replaces the device's current model.
"""

from __future__ import annotations

import mlflow

from calo import compute, locks, paths, registry
from calo import config as cfg
from calo.artifact import TrainedModel
from calo.correction import fit_correction
from calo.dataset import GraphSet, load_graphs
from calo.errors import CaloError
from calo.evaluation import evaluate
from calo.log import get_logger
from calo.models.training import fit
from calo.records import store_targets
from calo.tasks.pretrain import log_epoch


def load_donor(settings: cfg.Settings) -> TrainedModel:
    path = paths.model_dir(settings.donor)
    if not path.is_dir():
        raise CaloError(f"no donor model at {path}: run `calo pretrain` (or `dvc pull "
                        "pretrain`) first")
    return TrainedModel.load(path)


def adapt(trained: TrainedModel, finetune: cfg.Finetune, train: cfg.Train, graphs: GraphSet,
          val: GraphSet, targets: set[str], label: str | None = None) -> dict:
    """Stage 2 of the transfer: train the donor model on warm-up graphs of `targets`
    (records.target_key), with the rule's row for their number per workload (which layers,
    epochs, learning rate, pull toward the donor, weight on the fast end, which epoch's
    weights it keeps): the same-device rule's if the model was trained on those targets
    already. The model then counts them among its own. With `label`, each epoch logs a
    progress line under it."""
    same_device = trained.trained_on(targets)
    step = finetune.step_for(graphs.per_workload(), same_device, train.fast_weight)
    on_epoch = log_epoch(label, step.epochs) if label else None
    trained.net.set_trainable(step.layers)
    schedule = {**compute.fit_options(train), "lr": step.lr, "batch_size": finetune.batch_size,
                "max_epochs": step.epochs, "warmup_epochs": 0, "patience": None,
                "anchor": step.anchor, "keep": step.keep, "fast_weight": step.fast_weight,
                "rank_weighting": finetune.weighting(train)}
    result = fit(trained.net, graphs.graphs, val.graphs, workloads=graphs.workload,
                 on_epoch=on_epoch, **schedule)
    # The throughput trees leave the mean and variance to the head, so the records held back
    # to check those can train them too.
    tree_graphs, tree_workloads = graphs.graphs, graphs.workload
    if step.blend and val is not graphs:
        tree_graphs, tree_workloads = [*tree_graphs, *val.graphs], [*tree_workloads, *val.workload]
    trained.correction = fit_correction(trained.net, finetune.correction, step.correction,
                                        tree_graphs, tree_workloads, train.seed, step.blend,
                                        trained.rows_for(step))
    trained.info["targets"] = sorted(set(trained.info.get("targets", ())) | targets)
    return {**result, "config": {**schedule, "layers": step.layers,
                                 "correction_rounds": step.correction, "blend": step.blend,
                                 "same_device": same_device,
                                 "warmup_per_workload": graphs.per_workload()}}


def finetune(settings: cfg.Settings, device: str) -> dict:
    """Holds the device's lock throughout (calo.locks): one writer of its model at a time."""
    with locks.device_lock(device, "calo finetune"):
        return _finetune(settings, device)


def _finetune(settings: cfg.Settings, device: str) -> dict:
    settings.target_device(device)
    targets = store_targets(paths.records_dir(device))
    trained = load_donor(settings)
    graphs = load_graphs(paths.graphs_path(device), trained.graph_kind,
                         settings.extracts_stores(device))
    train, val = (graphs.split(s, settings.split) for s in ("train", "val"))
    train, noisy = train.steady(settings.labels.max_spread)
    if len(train) < 2:
        raise CaloError(f"device '{device}' has too few warm-up graphs ({len(graphs)})")
    levels = settings.calibrate.levels
    with registry.start_run(settings, "finetune", f"finetune-{device}"):
        before = evaluate(trained.net, val, levels, trained.temperature)
        result = adapt(trained, settings.finetune, settings.train, train, val, targets,
                       f"finetune {device}")
        mlflow.log_params({**result["config"], "train_device_used": result["config"]["device"],
                           "device": device, "donor": settings.donor,
                           "warmup_graphs": len(train), "noisy_dropped": noisy})
        mlflow.log_metric("train_graphs_per_s", result["graphs_per_s"])
        # The donor's temperature was fitted to the donor: calibrate fits this model's own.
        trained.temperature = 1.0
        # The throughput trees learned from these records too: here the network's order is
        # scored, and promote scores theirs on the test split.
        mean_mover = trained.correction if trained.correction and trained.correction.moves_mean \
            else None
        after = evaluate(trained.net, val, levels, correction=mean_mover)
        metrics = {**{f"zero_shot_val_{k}": v for k, v in before.items()},
                   **{f"val_{k}": v for k, v in after.items()}}
        mlflow.log_metrics(metrics)
    trained.info = {"device": device, "donor": settings.donor, "targets": trained.info["targets"],
                    "donor_sha256": registry.artifact_digest(paths.model_dir(settings.donor)),
                    "warmup_graphs": len(train),
                    **registry.data_version(device)}
    trained.save(paths.model_dir(device))
    get_logger().info(f"finetune {device}: {len(train)} warm-up graphs ({noisy} noisy ones "
                      f"dropped), {result['epochs']} "
                      f"epochs; val Kendall tau {before.get('kendall_tau', float('nan')):.3f} "
                      f"-> {after.get('kendall_tau', float('nan')):.3f}")
    return {"epochs": result["epochs"], **metrics}
