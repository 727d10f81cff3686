"""Stage 3: pre-train the evidential GraphSAGE model on the donor device's graphs."""

from __future__ import annotations

import mlflow
import torch
from prefect import task
from prefect.cache_policies import NONE

from calo import registry
from calo.config import CaloError, Params
from calo.dataset import load_graphs
from calo.evaluation import evaluate
from calo.log import Progress, get_logger
from models.training import fit


def train_kwargs(train_cfg: dict) -> dict:
    return {k: train_cfg[k] for k in ("lr", "weight_decay", "lam", "batch_size", "max_epochs",
                                      "warmup_epochs", "patience", "rank_weight", "seed")}


def log_epoch(stage: str, max_epochs: int):
    """Per-epoch MLflow metrics and a progress line (epochs done, rate, ETA at the epoch cap;
    early stopping may end sooner)."""
    progress = Progress(stage, max_epochs, "epochs", every=0)

    def on_epoch(epoch: int, train_loss: float, val_nll: float) -> None:
        mlflow.log_metrics({"train_loss": train_loss, "val_nll": val_nll}, step=epoch)
        progress.advance(note=f"train loss {train_loss:.4f}, val NLL {val_nll:.4f}")

    return on_epoch


def donor_splits(params: Params):
    graphs = load_graphs(params.graphs_path(params.donor), params.graph_kind)
    train, val, test = (graphs.split(s, params["split"]) for s in ("train", "val", "test"))
    if len(train) < 2 or len(val) < 1:
        raise CaloError(f"donor '{params.donor}' has too few graphs to train ({len(graphs)})")
    return train, val, test


def train_on_donor(params: Params, train, val, test, cfg: dict, on_epoch=None):
    """A fresh model fitted on the donor's training split; metrics on its val and test splits."""
    torch.manual_seed(cfg["seed"])
    model, config = registry.new_model(params)
    model.set_normalization(torch.cat([g.x for g in train.graphs]),
                            torch.cat([g.y for g in train.graphs]))
    result = fit(model, train.graphs, val.graphs, on_epoch=on_epoch, **cfg)
    levels = params["calibrate"]["levels"]
    metrics = {f"{name}_{k}": v for name, part in (("val", val), ("test", test))
               for k, v in evaluate(model, part, levels).items()}
    return model, config, {**metrics, "epochs": result["epochs"]}


@task(name="pretrain", cache_policy=NONE)
def pretrain(params: Params) -> dict:
    donor = params.donor
    train, val, test = donor_splits(params)
    cfg = train_kwargs(params["train"])
    with registry.start_run(params, "pretrain", f"pretrain-{donor}"):
        mlflow.log_params({**cfg, **params["model"], "donor": donor, "train_graphs": len(train),
                           "val_graphs": len(val)})
        model, config, metrics = train_on_donor(params, train, val, test, cfg,
                                                log_epoch("pretrain", cfg["max_epochs"]))
        mlflow.log_metrics(metrics)
        out = params.model_dir(donor)
        registry.save_model(model, config, out)
        version = registry.register(params, out, alias="donor",
                                    tags={"device": donor, "role": "donor",
                                          **registry.data_version(params, donor), **metrics})
    summary = {"version": version, **metrics}
    get_logger().info(f"pretrain: registered version {version} as 'donor': {summary}")
    return summary
