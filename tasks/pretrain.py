"""Stage 3: pre-train the evidential GraphSAGE model on the donor device's graphs."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import mlflow
import torch

from calo import compute, locks, paths, registry
from calo import config as cfg
from calo.artifact import TrainedModel
from calo.correction import donor_trees, tree_rows
from calo.dataset import GraphSet, load_graphs
from calo.errors import CaloError
from calo.evaluation import checked_temperature, evaluate
from calo.log import Progress, get_logger
from calo.models.training import fit
from calo.records import store_targets

# split.donor_calibration: workload keeps whole workloads out of training only when the donor
# has this many: with a handful, each one held out is a large share of what it could learn.
MIN_CALIBRATION_WORKLOADS = 10


def log_epoch(stage: str, max_epochs: int):
    """Per-epoch MLflow metrics and a progress line (epochs done, rate, ETA at the epoch cap;
    early stopping may end sooner)."""
    progress = Progress(stage, max_epochs, "epochs")

    def on_epoch(epoch: int, train_loss: float, val_nll: float) -> None:
        if mlflow.active_run() is not None:
            mlflow.log_metrics({"train_loss": train_loss, "val_nll": val_nll}, step=epoch)
        progress.advance(note=f"train loss {train_loss:.4f}, val NLL {val_nll:.4f}")

    return on_epoch


def donor_graphs(settings: cfg.Settings, also: Sequence[str] = ()) -> GraphSet:
    """The donor's graphs and, for a donor shared by several devices, those of the devices in
    `also`, whose workload names gain their device's ("device/name"): each device's candidates
    of a workload are compared, split and held out as a workload of their own."""
    load = lambda device: load_graphs(paths.graphs_path(device), settings.graph.kind,  # noqa: E731
                                      settings.graph.stores)
    graphs = load(settings.donor)
    if not also:
        return graphs
    others = [(device, load(device)) for device in also]
    return GraphSet([*graphs.graphs, *(g for _, part in others for g in part.graphs)],
                    [*graphs.workload, *(f"{device}/{w}" for device, part in others
                                         for w in part.workload)],
                    [*graphs.record, *(r for _, part in others for r in part.record)],
                    graphs.kind)


def donor_splits(settings: cfg.Settings, also: Sequence[str] = ()
                 ) -> tuple[GraphSet, GraphSet, GraphSet, GraphSet]:
    """(train, val, test, calibration) of the donor's graphs. The calibration set fits the
    temperature: the validation records, or (split.donor_calibration: workload) whole
    workloads kept out of training, so the variance is scaled for workloads never seen. `also`:
    other devices whose graphs join the donor's (donor_graphs)."""
    graphs = donor_graphs(settings, also)
    calibration = None
    workloads = len(set(graphs.workload))
    if settings.split.donor_calibration == "workload" and workloads < MIN_CALIBRATION_WORKLOADS:
        get_logger().info(f"pretrain: {workloads} donor workloads, too few to keep some out "
                          "for the temperature: it is fitted on validation records")
    elif settings.split.donor_calibration == "workload":
        held = graphs.workload_share(settings.split.val)
        calibration = graphs.select([w in held for w in graphs.workload])
        graphs = graphs.select([w not in held for w in graphs.workload])
    if settings.split.donor_val == "workload":
        train, val, test = graphs.held_out_workloads(settings.split)
    else:
        train, val, test = (graphs.split(s, settings.split) for s in ("train", "val", "test"))
    train, noisy = train.steady(settings.labels.max_spread)
    if noisy:
        get_logger().info(f"pretrain: {noisy} training records dropped, their repeated runs "
                          f"disagree by more than labels.max_spread {settings.labels.max_spread}")
    if len(train) < 2 or len(val) < 1:
        raise CaloError(f"donor '{settings.donor}' has too few graphs to train ({len(graphs)})")
    return train, val, test, calibration if calibration else val


def set_normalization(trained: TrainedModel, graphs, limit: int) -> None:
    """The model standardizes with the training graphs' moments: from the graphs at once when
    at most `limit`, else accumulated a window of a graph store at a time."""
    if len(graphs) <= limit or not hasattr(graphs, "windows"):
        stores = (torch.cat([g.store_rows for g in graphs]) if trained.reads_stores else None)
        trained.net.set_normalization(torch.cat([g.x for g in graphs]),
                                      torch.cat([_target(trained, g) for g in graphs]), stores)
        return
    sums: dict[str, list] = {}
    for window in graphs.windows(limit):
        parts = {"x": torch.cat([g.x for g in window]),
                 "y": torch.cat([_target(trained, g) for g in window])}
        if trained.reads_stores:
            parts["stores"] = torch.cat([g.store_rows for g in window])
        for key, rows in parts.items():
            rows = rows.double().reshape(len(rows), -1)
            n, total, squares = sums.get(key, (0, 0.0, 0.0))
            sums[key] = [n + len(rows), total + rows.sum(0), squares + (rows ** 2).sum(0)]

    def moments(key: str) -> tuple[torch.Tensor, torch.Tensor]:
        n, total, squares = sums[key]
        mean = total / n
        std = ((squares - n * mean ** 2).clamp_min(0) / max(n - 1, 1)).sqrt()
        return mean.float().squeeze(), std.float().squeeze()

    trained.net.set_moments(moments("x"), moments("y"),
                            moments("stores") if trained.reads_stores else None)


def _target(trained: TrainedModel, graph) -> torch.Tensor:
    """What the head predicts of a graph: its log latency less its work (model.per_iteration)."""
    return graph.y - trained.net.work(graph.x)


def train_on_donor(settings: cfg.Settings, train: GraphSet, val: GraphSet, test: GraphSet,
                   calibration: GraphSet | None = None, on_epoch=None, also: Sequence[str] = ()
                   ) -> tuple[TrainedModel, dict]:
    """A fresh model fitted on the donor's training split (early stopping on validation), its
    temperature fitted on the calibration set (default: validation); metrics on each. `also`:
    the other devices whose graphs the split holds (donor_graphs), counted among the targets
    the model trained on."""
    calibration = calibration if calibration is not None else val
    torch.manual_seed(settings.train.seed)
    trained = TrainedModel.new(settings)
    trained.info["targets"] = sorted(set().union(*(
        store_targets(paths.records_dir(d)) for d in (settings.donor, *also))))
    set_normalization(trained, train.graphs, settings.train.graphs_in_memory)
    options = compute.fit_options(settings.train)
    result = fit(trained.net, train.graphs, val.graphs, workloads=train.workload,
                 on_epoch=on_epoch, **options)
    levels = settings.calibrate.levels
    if settings.finetune.keeps_donor_rows:
        trained.donor_rows = tree_rows(train.graphs, train.workload)
        trained.correction = donor_trees(settings.finetune, trained.donor_rows, settings.train.seed)
    # kept at 1 where the calibrate section's fit does not earn its place on these workloads
    trained.temperature = checked_temperature(
        trained.net, calibration, 1.0, levels,
        by_workload=settings.calibrate.donor_fit == "workload-median",
        objective=settings.calibrate.objective)
    # train: how well it fits what it learned from (tau far below the validation split's
    # ceiling there means it underfits rather than overfits)
    parts = [("train", train), ("val", val), ("test", test)] + (
        [("calibration", calibration)] if calibration is not val else [])
    metrics = {f"{name}_{k}": v for name, part in parts
               for k, v in evaluate(trained.net, part, levels, trained.temperature).items()}
    return trained, {**metrics, "epochs": result["epochs"], "temperature": trained.temperature,
                     "train_graphs_per_s": result["graphs_per_s"]}


def pretrain(settings: cfg.Settings) -> dict:
    """Holds the donor's lock throughout (calo.locks): one writer of its model at a time. In a
    data-parallel run (calo.compute) every process trains and only the main one writes."""
    if not compute.is_main():
        train, val, test, calibration = donor_splits(settings)
        train_on_donor(settings, train, val, test, calibration)
        return {}
    with locks.device_lock(settings.donor, "calo pretrain"):
        return _pretrain(settings)


def _pretrain(settings: cfg.Settings) -> dict:
    donor = settings.donor
    train, val, test, calibration = donor_splits(settings)
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    with registry.start_run(settings, "pretrain", f"pretrain-{donor}"):
        mlflow.log_params({**dataclasses.asdict(settings.train),
                           **dataclasses.asdict(settings.model), "donor": donor,
                           "train_graphs": len(train), "val_graphs": len(val),
                           "train_device_used": compute.training_device(settings.train.device),
                           "processes": world})
        trained, metrics = train_on_donor(settings, train, val, test, calibration,
                                          log_epoch("pretrain", settings.train.max_epochs))
        mlflow.log_metrics(metrics)
        trained.info.update({"device": donor, "role": "donor", "train_graphs": len(train),
                             **registry.data_version(donor)})
        out = trained.save(paths.model_dir(donor))
        version = registry.register(
            settings, out, tags={**trained.info, **metrics},
            description=(f"Donor model pre-trained on {len(train)} graphs of device "
                         f"'{donor}' (records {trained.info['data_sha256']}); "
                         f"test Kendall tau {metrics.get('test_kendall_tau', float('nan')):.3f}"
                         f", test NLL {metrics.get('test_nll', float('nan')):.3f}."))
        registry.set_alias(settings, "donor", version)
    get_logger().info(f"pretrain: version {version} is 'donor': {len(train)} graphs, "
                      f"{metrics['epochs']} epochs, test Kendall tau "
                      f"{metrics.get('test_kendall_tau', float('nan')):.3f}")
    return {"version": version, **metrics}
