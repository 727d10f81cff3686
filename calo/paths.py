"""Where each stage reads and writes, relative to the project directory; dvc.yaml names the same
paths (tests/test_dvc.py checks that they agree)."""

from __future__ import annotations

from pathlib import Path

DATA = Path("data")
METRICS = Path("metrics")


def records_dir(device: str) -> Path:
    return DATA / "records" / device


def lock_path(device: str) -> Path:
    """The lock one writer of a device holds (calo.locks); outside every DVC output."""
    return DATA / "locks" / f"{device}.lock"


def graphs_path(device: str) -> Path:
    """The device's graph store: a directory of shards and a manifest (calo.graph_store)."""
    return DATA / "graphs" / device


def model_dir(device: str) -> Path:
    """The trained model of a device: the donor's from pretrain, a target's from finetune."""
    return DATA / "models" / device


def calibrated_dir(device: str) -> Path:
    """A target's fine-tuned model with its fitted temperature: what tune and promote use."""
    return DATA / "calibrated" / device


def tune_dir(device: str) -> Path:
    return DATA / "tune" / device


def network_dir(device: str, network: str) -> Path:
    """A network's tuning on a device: each model's database and compiled libraries."""
    return DATA / "networks" / device / network.replace(":", "-").replace("/", "-")


def metrics_path(stage: str, device: str) -> Path:
    """A stage's headline figures: DVC metrics, a few short keys (`dvc metrics show`)."""
    return METRICS / stage / f"{device}.json"


def report_path(stage: str, device: str) -> Path:
    """A stage's full report beside its metrics (what `calo summary` reads)."""
    return METRICS / stage / f"{device}-report.json"


def promotion_path(device: str) -> Path:
    """The last promotion decision of a device (the registry is the record; this is a copy)."""
    return DATA / "promotion" / f"{device}.json"
