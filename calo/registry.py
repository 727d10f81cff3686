"""The MLflow side: tracking runs per stage, and the `calo-gnn` model registry.

A registry version is a model artifact (calo.artifact: weights, model.json and a correction
where fitted) logged by the run that registered it, with tags a program reads and a description
a person reads. Aliases name the model in use: `donor`, and one per target device.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import mlflow
import yaml
from mlflow.tracking import MlflowClient

from calo import paths
from calo.artifact import CONFIG, CORRECTION, WEIGHTS, TrainedModel
from calo.config import Settings
from calo.errors import CaloError, reason

MODEL_DESCRIPTION = (
    "Evidential GraphSAGE cost models for TVM Meta-Schedule. One forward pass over a scheduled "
    "program's graph gives a latency mean and a calibrated uncertainty. Alias `donor` is the "
    "pre-trained model; every target device has an alias of its own name, moved only to a "
    "version that beats the current one on the device's held-out probes. A version holds "
    "weights.pt and model.json (configuration, graph schema, temperature)."
)


def connect(settings: Settings) -> MlflowClient:
    logging.getLogger("mlflow").setLevel(logging.WARNING)  # not a line per new experiment
    mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI", settings.mlflow.tracking_uri))
    return MlflowClient()


def start_run(settings: Settings, experiment: str, run_name: str):
    connect(settings)
    mlflow.set_experiment(f"calo-{experiment}")
    return mlflow.start_run(run_name=run_name)


def artifact_digest(model_dir: Path) -> str:
    """Content hash of a model artifact: the same model is never registered twice."""
    digest = hashlib.sha256()
    for name in (WEIGHTS, CONFIG, CORRECTION):
        if (model_dir / name).is_file():
            digest.update((model_dir / name).read_bytes())
    return digest.hexdigest()[:16]


def find_version(settings: Settings, digest: str):
    """The registered version holding exactly this artifact, or None."""
    client = connect(settings)
    name = settings.mlflow.model_name
    if not client.search_registered_models(filter_string=f"name = '{name}'"):
        return None
    for version in client.search_model_versions(f"name = '{name}'"):
        if version.tags.get("artifact_sha256") == digest:
            return version
    return None


def register(settings: Settings, model_dir: Path, tags: dict[str, Any], description: str) -> str:
    """The registry version holding this artifact: the existing one if it is registered
    already, else a new one logged to the active run."""
    digest = artifact_digest(model_dir)
    found = find_version(settings, digest)
    if found is not None:
        return found.version
    client = connect(settings)
    name = settings.mlflow.model_name
    mlflow.log_artifacts(str(model_dir), artifact_path="model")
    run = mlflow.active_run()
    if not client.search_registered_models(filter_string=f"name = '{name}'"):
        client.create_registered_model(name, description=MODEL_DESCRIPTION)
    return client.create_model_version(
        name, source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id,
        tags={k: str(v) for k, v in {**tags, "artifact_sha256": digest}.items()},
        description=description,
    ).version


def move_alias(settings: Settings, alias: str, version: str, expected: str | None) -> None:
    """Point alias at version if it still points where it did when the decision was made
    (compare-and-set): a promotion decided against a champion that has since changed is void."""
    current = aliased_version(settings, alias)
    now = current.version if current is not None else None
    if now != expected:
        raise CaloError(f"alias '{alias}' moved to version {now} while version {version} was "
                        f"compared with version {expected}: run promote again")
    set_alias(settings, alias, version)


def set_alias(settings: Settings, alias: str, version: str) -> None:
    connect(settings).set_registered_model_alias(settings.mlflow.model_name, alias, version)


def aliased_version(settings: Settings, alias: str):
    """The registry version an alias points at, or None."""
    client = connect(settings)
    try:
        return client.get_model_version_by_alias(settings.mlflow.model_name, alias)
    except mlflow.exceptions.MlflowException:
        return None


def load_registered(settings: Settings, alias: str) -> tuple[TrainedModel, str]:
    """The model an alias points at, and its version number."""
    version = aliased_version(settings, alias)
    if version is None:
        raise CaloError(f"no '{settings.mlflow.model_name}' model with alias '{alias}' "
                        "in the registry")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=version.source,
                                                             dst_path=tmp))
        except Exception as err:  # files deleted or the artifact store unreachable
            raise CaloError(f"registry version {version.version} ('{alias}') has no readable "
                            f"model files at {version.source}: {reason(err)}") from None
        return TrainedModel.load(local), version.version


def data_version(device: str) -> dict[str, str]:
    """Tags naming the records a model learned from: their content hash, and DVC's hash of them
    as the last `dvc repro` recorded it in dvc.lock (when there is one)."""
    store = paths.records_dir(device)
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
