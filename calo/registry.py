"""Models on disk (weights + JSON config, never pickled code) and in the MLflow model registry."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import mlflow
import torch
import yaml
from mlflow.tracking import MlflowClient

from calo.config import CaloError, Params
from calo.graphs import schema
from models.evidential import EvidentialSAGE

WEIGHTS, CONFIG, VERSION = "weights.pt", "config.json", "registry.json"
VARIANTS = ("encoder", "pooling", "head", "attention")


def new_model(params: Params) -> tuple[EvidentialSAGE, dict]:
    features, edge_types = schema(params.graph_kind)
    config = {
        "graph": params.graph_kind,
        "features": features,
        "edge_types": edge_types,
        "hidden": int(params["model"]["hidden"]),
        "layers": int(params["model"]["layers"]),
        **{k: params["model"][k] for k in VARIANTS},
    }
    return build_model(config), config


def build_model(config: dict) -> EvidentialSAGE:
    features, edge_types = schema(graph_kind(config))
    if config["features"] != features or config["edge_types"] != edge_types:
        raise CaloError("model was trained on a different graph schema; re-run pretrain")
    variants = {k: config[k] for k in VARIANTS if k in config}  # older configs: the defaults
    return EvidentialSAGE(len(features), len(edge_types), config["hidden"], config["layers"],
                          **variants)


def graph_kind(config: dict) -> str:
    """The graph kind a model reads (configs from before the AST option: schedule graphs)."""
    return config.get("graph", "schedule")


def save_model(model: EvidentialSAGE, config: dict, path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / VERSION).unlink(missing_ok=True)  # belongs to the previous model, if any
    torch.save(model.state_dict(), path / WEIGHTS)
    (path / CONFIG).write_text(json.dumps(config, indent=1))


def load_model(path: Path) -> tuple[EvidentialSAGE, dict]:
    if not (path / WEIGHTS).is_file():
        raise CaloError(f"no model at {path}")
    config = json.loads((path / CONFIG).read_text())
    model = build_model(config)
    model.load_state_dict(torch.load(path / WEIGHTS, weights_only=True))
    model.eval()
    return model, config


def connect(params: Params) -> MlflowClient:
    mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI", params["mlflow"]["tracking_uri"]))
    return MlflowClient()


def start_run(params: Params, experiment: str, run_name: str):
    connect(params)
    mlflow.set_experiment(f"calo-{experiment}")
    return mlflow.start_run(run_name=run_name)


def register(params: Params, model_dir: Path, alias: str, tags: dict[str, Any],
             promote: bool = True) -> str:
    """Log the model directory to the active run and add a registry version.

    With promote (the default), `alias` moves to the new version; without, the version stays
    registered and the alias stays where it was.
    """
    client = connect(params)
    name = params["mlflow"]["model_name"]
    mlflow.log_artifacts(str(model_dir), artifact_path="model")
    run = mlflow.active_run()
    if not client.search_registered_models(filter_string=f"name = '{name}'"):
        client.create_registered_model(name)
    version = client.create_model_version(
        name, source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id,
        tags={k: str(v) for k, v in tags.items()},
    ).version
    if promote:
        client.set_registered_model_alias(name, alias, version)
    (model_dir / VERSION).write_text(json.dumps({"name": name, "version": version, "alias": alias,
                                                 "run_id": run.info.run_id}))
    return version


def set_version_tags(params: Params, model_dir: Path, tags: dict[str, Any]) -> None:
    info = json.loads((model_dir / VERSION).read_text())
    client = connect(params)
    for key, value in tags.items():
        client.set_model_version_tag(info["name"], info["version"], key, str(value))


def aliased_version(params: Params, alias: str):
    """The registry version an alias points at, or None."""
    client = connect(params)
    try:
        return client.get_model_version_by_alias(params["mlflow"]["model_name"], alias)
    except mlflow.exceptions.MlflowException:
        return None


def fetch(params: Params, alias: str, dest: Path):
    """Download the model an alias points at into dest (weights, config, registry.json);
    returns its registry version."""
    version = aliased_version(params, alias)
    if version is None:
        raise CaloError(f"no '{params['mlflow']['model_name']}' model with alias '{alias}' "
                        "in the registry")
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=version.source,
                                                         dst_path=tmp))
        dest.mkdir(parents=True, exist_ok=True)
        for item in (WEIGHTS, CONFIG):
            shutil.copy(local / item, dest / item)
    (dest / VERSION).write_text(json.dumps({"name": version.name, "version": version.version,
                                            "alias": alias, "run_id": version.run_id}))
    return version


def load_registered(params: Params, alias: str) -> tuple[EvidentialSAGE, dict, str]:
    """The model a registry alias points at, with its calibration temperature."""
    with tempfile.TemporaryDirectory() as tmp:
        version = fetch(params, alias, Path(tmp))
        model, config = load_model(Path(tmp))
    config["temperature"] = float(version.tags.get("temperature", 1.0))
    return model, config, version.version


def data_version(params: Params, device: str) -> dict[str, str]:
    """Tags naming the records a model learned from: their content hash, and DVC's hash of them
    as the last `dvc repro` recorded it in dvc.lock (when there is one)."""
    store = params.records_dir(device)
    digest = hashlib.sha256()
    for path in sorted(p for p in store.rglob("*") if p.is_file()) if store.is_dir() else []:
        digest.update(path.relative_to(store).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    tags = {"data_sha256": digest.hexdigest()[:16]}
    lock = Path("dvc.lock")
    if lock.is_file():
        stage = (yaml.safe_load(lock.read_text()) or {}).get("stages", {}).get(
            f"harvest@{device}", {})
        for out in stage.get("outs", []):
            if out.get("path") == store.as_posix() and out.get("md5"):
                tags["dvc_md5"] = out["md5"]
    return tags
