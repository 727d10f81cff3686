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
from calo.log import get_logger
from models.training import fit


def train_kwargs(train_cfg: dict) -> dict:
    return {k: train_cfg[k] for k in ("lr", "weight_decay", "lam", "batch_size", "max_epochs",
                                      "warmup_epochs", "patience", "seed")}


def log_epoch(stage: str):
    log = get_logger()

    def on_epoch(epoch: int, train_loss: float, val_nll: float) -> None:
        mlflow.log_metrics({"train_loss": train_loss, "val_nll": val_nll}, step=epoch)
        log.info(f"{stage} epoch {epoch + 1}: train loss {train_loss:.4f}, val NLL {val_nll:.4f}")

    return on_epoch


@task(name="pretrain", cache_policy=NONE)
def pretrain(params: Params) -> dict:
    donor = params.donor
    graphs = load_graphs(params.graphs_path(donor))
    split = params["split"]
    train, val, test = (graphs.split(s, split) for s in ("train", "val", "test"))
    if len(train) < 2 or len(val) < 1:
        raise CaloError(f"donor '{donor}' has too few graphs to train ({len(graphs)})")
    cfg = train_kwargs(params["train"])
    torch.manual_seed(cfg["seed"])
    model, config = registry.new_model(params)
    model.set_normalization(torch.cat([g.x for g in train.graphs]),
                            torch.cat([g.y for g in train.graphs]))
    levels = params["calibrate"]["levels"]
    with registry.start_run(params, "pretrain", f"pretrain-{donor}"):
        mlflow.log_params({**cfg, **params["model"], "donor": donor, "train_graphs": len(train),
                           "val_graphs": len(val)})
        result = fit(model, train.graphs, val.graphs, on_epoch=log_epoch("pretrain"), **cfg)
        metrics = {f"{name}_{k}": v for name, part in (("val", val), ("test", test))
                   for k, v in evaluate(model, part, levels).items()}
        mlflow.log_metrics({**metrics, "epochs": result["epochs"]})
        out = params.model_dir(donor)
        registry.save_model(model, config, out)
        version = registry.register(params, out, alias="donor",
                                    tags={"device": donor, "role": "donor", **metrics})
    summary = {"version": version, "epochs": result["epochs"], **metrics}
    get_logger().info(f"pretrain: registered version {version} as 'donor': {summary}")
    return summary
