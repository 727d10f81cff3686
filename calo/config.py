"""The one reader of params.yaml, and the checks that stop bad input before any work starts."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from calo import suite

PARAMS_ENV = "CALO_PARAMS"
DEFAULT_PARAMS = "params.yaml"
DATA_DIR = Path("data")        # relative to the working directory, as in dvc.yaml
METRICS_DIR = Path("metrics")


class CaloError(Exception):
    """A problem with the user's input or state, reported as one line without a traceback."""


def reason(err: Exception) -> str:
    """The last line of an exception's message (TVM puts its C++ backtrace first)."""
    lines = str(err).strip().splitlines()
    return lines[-1][:200] if lines else type(err).__name__


@dataclass(frozen=True)
class Device:
    name: str
    target: dict[str, Any]
    runner: dict[str, Any]
    candidates_per_workload: int
    evolved_fraction: float | None = None   # share of candidates evolved by the search


@dataclass(frozen=True)
class Workload:
    name: str
    op: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Params:
    raw: dict[str, Any]
    path: Path

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    @property
    def donor(self) -> str:
        return self.raw["donor"]

    @property
    def graph_kind(self) -> str:
        return self.raw["graph"].get("kind", "schedule")

    @property
    def targets(self) -> list[str]:
        return list(self.raw["targets"])

    @property
    def data_dir(self) -> Path:
        return DATA_DIR

    # Where each stage reads and writes; dvc.yaml names the same paths.
    def records_dir(self, device: str) -> Path:
        return self.data_dir / "records" / device

    def graphs_path(self, device: str) -> Path:
        return self.data_dir / "graphs" / f"{device}.pt"

    def model_dir(self, device: str) -> Path:
        return self.data_dir / "models" / device

    def calibration_path(self, device: str) -> Path:
        return self.data_dir / "calibration" / f"{device}.json"

    def tune_dir(self, device: str) -> Path:
        return self.data_dir / "tune" / device

    def metrics_path(self, stage: str, device: str) -> Path:
        return METRICS_DIR / stage / f"{device}.json"

    def device(self, name: str) -> Device:
        devices = self.raw["devices"]
        if name not in devices:
            raise CaloError(f"unknown device '{name}' (known: {', '.join(sorted(devices))})")
        spec = devices[name]
        return Device(
            name=name,
            target=dict(spec["target"]),
            runner=dict(spec.get("runner", {"kind": "local"})),
            candidates_per_workload=int(spec.get("candidates_per_workload", 0)),
            evolved_fraction=spec.get("evolved_fraction"),
        )

    def target_device(self, name: str) -> Device:
        """A device that is fine-tuned and tuned for (not the donor)."""
        device = self.device(name)
        if name not in self.targets:
            raise CaloError(
                f"device '{name}' is not a target device (targets: {', '.join(self.targets)})"
            )
        return device

    def workload(self, name: str) -> Workload:
        """A workload of params.yaml, else of the built-in suite (`calo workloads` lists both)."""
        spec = self.raw["workloads"].get(name)
        if spec is not None:
            return Workload(name=name, op=spec["op"], args=dict(spec.get("args", {})))
        found = suite.resolve(name)
        if found is None:
            raise CaloError(f"unknown workload '{name}' (params.yaml has "
                            f"{', '.join(sorted(self.raw['workloads']))}; "
                            f"`calo workloads` lists the suite)")
        return Workload(name=name, op=found[0], args=found[1])

    def workloads(self, names: list[str]) -> list[Workload]:
        return [self.workload(n) for n in names]


_REQUIRED = ["donor", "targets", "devices", "workloads", "harvest", "split", "graph", "model",
             "train", "finetune", "promotion", "calibrate", "tune", "mlflow"]


# Checked here so a typo stops before any work (models.evidential checks them again).
_MODEL_VARIANTS = {"encoder": ("sage", "gcn"), "pooling": ("meanmax", "topk"),
                   "head": ("evidential", "deterministic"), "attention": (True, False)}


def load_params(path: str | os.PathLike | None = None) -> Params:
    """Read params.yaml (or $CALO_PARAMS) and check its structure."""
    path = Path(path or os.environ.get(PARAMS_ENV, DEFAULT_PARAMS))
    if not path.is_file():
        raise CaloError(f"parameters file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise CaloError(f"{path} is not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise CaloError(f"{path} must hold a mapping at the top level")
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise CaloError(f"{path} lacks section(s): {', '.join(missing)}")
    params = Params(raw=raw, path=path)
    params.device(params.donor)
    for name in params.targets:
        params.device(name)
    for name in raw["devices"]:
        check_target(raw["devices"][name].get("target"), where=f"device '{name}'")
    for name in raw["harvest"]["workloads"] + raw["tune"]["workloads"]:
        params.workload(name)
    for key, allowed in _MODEL_VARIANTS.items():
        if key in raw["model"] and raw["model"][key] not in allowed:
            raise CaloError(f"{path}: model.{key} must be one of {', '.join(map(str, allowed))}, "
                            f"got {raw['model'][key]!r}")
    from calo.graphs import KINDS  # here: calo.graphs imports this module

    if params.graph_kind not in KINDS:
        raise CaloError(f"{path}: graph.kind must be one of {', '.join(KINDS)}, "
                        f"got {params.graph_kind!r}")
    for section, key in (("finetune", "layers"), ("tune", "update_layers")):
        if raw[section].get(key) not in ("head", "all"):
            raise CaloError(f"{path}: {section}.{key} must be 'head' or 'all', "
                            f"got {raw[section].get(key)!r}")
    return params


def parse_target_json(text: str) -> dict[str, Any]:
    """A target given on the command line as JSON."""
    try:
        target = json.loads(text)
    except json.JSONDecodeError as err:
        raise CaloError(f"target is not valid JSON: {err.msg} at column {err.colno}") from None
    check_target(target, where="target")
    return target


_KNOWN_KINDS = {"llvm", "cuda", "rocm", "vulkan", "metal", "opencl"}


def check_target(target: Any, where: str) -> None:
    """Cheap structural checks; tvm.target.Target does the full check when a stage builds it."""
    if not isinstance(target, dict):
        raise CaloError(f"{where}: target must be a mapping such as {{kind: llvm}}, got {target!r}")
    kind = target.get("kind")
    if kind not in _KNOWN_KINDS:
        raise CaloError(
            f"{where}: unknown target kind {kind!r} "
            f"(expected one of {', '.join(sorted(_KNOWN_KINDS))})"
        )
