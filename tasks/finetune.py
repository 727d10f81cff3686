"""Stage 4: adapt the donor model to a new device on its warm-up probes (two-stage transfer)."""

from __future__ import annotations

import mlflow
from prefect import task
from prefect.cache_policies import NONE

from calo import registry
from calo.config import CaloError, Params
from calo.dataset import load_graphs
from calo.evaluation import evaluate
from calo.log import get_logger
from models.training import fit
from tasks.pretrain import log_epoch, train_kwargs


def load_donor(params: Params):
    """The donor model from this checkout's pipeline output, else from the registry."""
    path = params.model_dir(params.donor)
    if (path / registry.WEIGHTS).is_file():
        return registry.load_model(path)
    model, config, _ = registry.load_registered(params, "donor")
    return model, config


def adapt(params: Params, model, train, val, on_epoch=None) -> dict:
    """Stage 2 of the transfer: train the donor model (its head, by default) on warm-up graphs."""
    ft = params["finetune"]
    if ft["layers"] == "head":
        model.freeze_encoder()
    cfg = {**train_kwargs(params["train"]), "lr": ft["lr"], "batch_size": ft["batch_size"],
           "max_epochs": ft["epochs"], "warmup_epochs": 0, "patience": None}
    return {**fit(model, train, val, on_epoch=on_epoch, **cfg), "config": cfg}


@task(name="finetune", cache_policy=NONE)
def finetune(params: Params, device_name: str) -> dict:
    params.target_device(device_name)
    model, config = load_donor(params)
    graphs = load_graphs(params.graphs_path(device_name), registry.graph_kind(config))
    train, val = graphs.split("train", params["split"]), graphs.split("val", params["split"])
    if len(train) < 2:
        raise CaloError(f"device '{device_name}' has too few warm-up graphs ({len(graphs)})")
    levels = params["calibrate"]["levels"]
    with registry.start_run(params, "finetune", f"finetune-{device_name}"):
        before = evaluate(model, val, levels)
        result = adapt(params, model, train.graphs, val.graphs, log_epoch("finetune"))
        mlflow.log_params({**result["config"], "layers": params["finetune"]["layers"],
                           "device": device_name, "donor": params.donor,
                           "warmup_graphs": len(train)})
        after = evaluate(model, val, levels)
        metrics = {**{f"zero_shot_val_{k}": v for k, v in before.items()},
                   **{f"val_{k}": v for k, v in after.items()}}
        mlflow.log_metrics(metrics)
        out = params.model_dir(device_name)
        registry.save_model(model, config, out)
        version = registry.register(params, out, alias=device_name,
                                    tags={"device": device_name, "donor": params.donor, **metrics})
    summary = {"version": version, "epochs": result["epochs"], **metrics}
    get_logger().info(f"finetune {device_name}: registered version {version}: {summary}")
    return summary
