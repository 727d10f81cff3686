"""Stage 4: adapt the donor model to a new device on its warm-up probes (two-stage transfer)."""

from __future__ import annotations

import shutil

import mlflow
from prefect import task
from prefect.cache_policies import NONE

from calo import registry
from calo.config import CaloError, Params
from calo.dataset import load_graphs
from calo.evaluation import evaluate, predictive
from calo.log import get_logger
from models.calibration import confidence_levels, fit_temperature
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


def held_out_score(model, val, probes, levels: int, tau: float | None = None) -> dict:
    """NLL and Kendall tau on the held-out probes; without tau, one is fitted on val first
    (as calibrate would), so a fresh model and a calibrated champion compare fairly."""
    if tau is None:
        tau = fit_temperature(*predictive(model, val), confidence_levels(levels))
    scores = evaluate(model, probes, levels, tau)
    return {"nll": scores["nll"], "kendall_tau": scores["kendall_tau"], "temperature": tau}


def challenge(params: Params, device: str, challenger: dict, val, probes) -> tuple[bool, str]:
    """Champion/challenger: promote only a model better than the device's current one on its
    held-out probes, on NLL and on Kendall tau."""
    if registry.aliased_version(params, device) is None:
        return True, "first model for this device"
    champion, config, version = registry.load_registered(params, device)
    rule = params["promotion"]
    champ = held_out_score(champion, val, probes, params["calibrate"]["levels"],
                           config["temperature"])
    nll_gain = champ["nll"] - challenger["nll"]
    tau_drop = champ["kendall_tau"] - challenger["kendall_tau"]
    verdict = (f"NLL {challenger['nll']:.4f} vs champion v{version} {champ['nll']:.4f}, "
               f"Kendall tau {challenger['kendall_tau']:.4f} vs {champ['kendall_tau']:.4f}")
    if nll_gain > rule["min_nll_gain"] and not tau_drop > rule["max_tau_drop"]:
        return True, f"beats the champion: {verdict}"
    return False, f"not better than the champion: {verdict}"


@task(name="finetune", cache_policy=NONE)
def finetune(params: Params, device_name: str) -> dict:
    params.target_device(device_name)
    model, config = load_donor(params)
    graphs = load_graphs(params.graphs_path(device_name), registry.graph_kind(config))
    train, val, probes = (graphs.split(s, params["split"]) for s in ("train", "val", "test"))
    if len(train) < 2:
        raise CaloError(f"device '{device_name}' has too few warm-up graphs ({len(graphs)})")
    levels = params["calibrate"]["levels"]
    log = get_logger()
    with registry.start_run(params, "finetune", f"finetune-{device_name}"):
        before = evaluate(model, val, levels)
        result = adapt(params, model, train.graphs, val.graphs,
                       log_epoch("finetune", params["finetune"]["epochs"]))
        mlflow.log_params({**result["config"], "layers": params["finetune"]["layers"],
                           "device": device_name, "donor": params.donor,
                           "warmup_graphs": len(train)})
        after = evaluate(model, val, levels)
        probes = probes if len(probes) >= 2 else val  # too few test probes: judge on val
        held = held_out_score(model, val, probes, levels)
        metrics = {**{f"zero_shot_val_{k}": v for k, v in before.items()},
                   **{f"val_{k}": v for k, v in after.items()},
                   **{f"probe_{k}": v for k, v in held.items()}}
        mlflow.log_metrics(metrics)
        promote, why = challenge(params, device_name, held, val, probes)
        out = params.model_dir(device_name)
        # The model directory holds the device's champion: calibrate and tune read it.
        staging = out if promote else out.with_name(f"{out.name}.challenger")
        registry.save_model(model, config, staging)
        tags = {"device": device_name, "donor": params.donor, "promoted": promote,
                "promotion": why, **registry.data_version(params, device_name), **metrics}
        version = registry.register(params, staging, alias=device_name, tags=tags,
                                    promote=promote)
        mlflow.set_tags({"promoted": promote, "promotion": why})
    if not promote:
        shutil.rmtree(staging)
        if not (out / registry.VERSION).is_file():
            registry.fetch(params, device_name, out)
    log.info(f"finetune {device_name}: version {version} "
             f"{'promoted to' if promote else 'registered; not promoted to'} "
             f"'{device_name}': {why}")
    return {"version": version, "promoted": promote, "promotion": why,
            "epochs": result["epochs"], **metrics}
