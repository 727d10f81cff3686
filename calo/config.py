"""The one reader of params.yaml: every section becomes a frozen, typed settings object.

`load_settings` reads and checks the file once; a missing section or key, an unknown key, a
value of the wrong type or outside its choices stops with one line naming the key. Code reads
`settings.train.lr`, never the raw mapping. Benchmarks and tests derive variants with
`settings.override({"train.seed": 3})`, which goes through the same checks.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from calo import suite
from calo.errors import CaloError

PARAMS_ENV = "CALO_PARAMS"
DEFAULT_PARAMS = "params.yaml"

GraphKind = Literal["schedule", "device-schedule", "ast"]
Layers = Literal["head", "all"]
RankWeighting = Literal["uniform", "throughput", "lambda"]


@dataclass(frozen=True)
class Device:
    name: str
    target: dict[str, Any]
    runner: dict[str, Any] = field(default_factory=lambda: {"kind": "local"})
    candidates_per_workload: int = 0
    evolved_fraction: float | None = None   # share of candidates evolved by the search


@dataclass(frozen=True)
class Workload:
    name: str
    op: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Evolution:
    population_size: int
    genetic_num_iters: int
    eps_greedy: float = 0.05  # share of each round's picks drawn at random (TVM's default)


@dataclass(frozen=True)
class Harvest:
    workloads: tuple[str, ...]
    evolved_fraction: float
    evolution: Evolution
    batch_size: int
    build_workers: int
    warm_builders: bool
    build_timeout_s: float
    run_timeout_s: float
    number: int
    repeat: int
    min_repeat_ms: int
    seed: int


@dataclass(frozen=True)
class Split:
    val: float
    test: float
    donor_val: Literal["record", "workload"] = "record"
    donor_calibration: Literal["record", "workload"] = "record"


@dataclass(frozen=True)
class Labels:
    # Drop training records whose repeated runs disagree by more than this share of their
    # mean (calo.records.spread_of); null keeps every record.
    max_spread: float | None


@dataclass(frozen=True)
class Graph:
    kind: GraphKind
    stores: bool = False   # TVM's per-store features beside the graph (calo.store_features)


@dataclass(frozen=True)
class Extract:
    workers: int           # processes (1: in this one); a Dask scheduler's address if cluster
    shard_size: int        # graphs per shard file of the store (calo.graph_store)
    cluster: str | None = None


@dataclass(frozen=True)
class Model:
    hidden: int
    layers: int
    encoder: Literal["sage", "gcn"]
    pooling: Literal["meanmax", "topk"]
    head: Literal["evidential", "deterministic"]
    attention: bool
    per_iteration: bool = False


@dataclass(frozen=True)
class Train:
    lr: float
    weight_decay: float
    lam: float
    batch_size: int
    max_epochs: int
    warmup_epochs: int
    patience: int | None
    rank_weight: float
    rank_pairs: Literal["all", "workload"]
    rank_weighting: RankWeighting
    batches: Literal["shuffled", "workload"]
    seed: int
    fast_weight: float = 0.0
    keep: Literal["best", "last"] = "best"   # the donor's: best validation NLL's epoch, or last
    device: Literal["auto", "cpu", "cuda"] = "auto"
    graphs_in_memory: int = 16384
    threads: int | None = None   # torch's CPU threads while training (models.training.fit)


@dataclass(frozen=True)
class Sweep:
    lr: tuple[float, ...]
    weight_decay: tuple[float, ...]
    lam: tuple[float, ...]


@dataclass(frozen=True)
class FinetuneStep:
    up_to: int | None   # the most warm-up records per workload this row is for; null: any
    layers: Layers
    epochs: int
    lr: float
    correction: int = 0  # boosting rounds of the correction (calo.correction); 0: none
    # 0: the correction's trees fit the network's residuals; w in (0, 1]: they fit normalized
    # throughput and candidates are ordered by a blend, w on theirs (calo.correction)
    blend: float = 0.0
    anchor: float = 0.0  # decay toward the donor's weights (L2-SP, models.training.Anchor); 0: none
    # The regression loss's weight on the fast end (models.training.fit); null: train.fast_weight
    fast_weight: float | None = None
    keep: Literal["best", "last"] | None = None   # which weights it ends with; null: finetune.keep
    # the throughput trees also learn from the donor's training records (the donor's artifact
    # keeps their per-store rows: calo.correction.tree_rows), as TVM's XGBModel on both does
    donor_records: bool = False


@dataclass(frozen=True)
class Correction:
    """The boosted residual correction's trees (calo.correction); the rule gives the rounds."""

    depth: int = 3
    lr: float = 0.1
    min_child_weight: float = 2.0
    subsample: float = 0.8     # of the records per tree, and of the features
    threads: int = 2
    # The throughput trees' kinds, their predictions averaged (calo.correction)
    members: tuple[Literal["summary", "packed", "tvm"], ...] = ("summary",)
    # Fits of each kind that samples (subsample < 1: summary, packed) with this many seeds,
    # averaged with the rest; TVM's kind samples nothing and is fitted once
    seeds: int = 1
    # How the donor's own trees read the store columns: as they are, or against the
    # candidates of their workload (calo.correction.relative_columns)
    relative: Literal["none", "median", "rank"] = "none"
    # How the trees that learn from the donor's records weigh each record's squared error:
    # alike, or by its normalized throughput (the fast end counts most, as in TVM's
    # XGBModel); beside a warm-up, and in the donor's own (zero-shot) trees
    row_weight: Literal["none", "throughput"] = "none"
    zero_shot_row_weight: Literal["none", "throughput"] = "none"


@dataclass(frozen=True)
class Finetune:
    batch_size: int
    rule: tuple[FinetuneStep, ...]           # records of another device than the model's
    # records of a device the model was trained on (new workloads only); empty: `rule`
    same_device_rule: tuple[FinetuneStep, ...] = ()
    keep: Literal["best", "last"] = "best"   # the weights of the best validation NLL, or the last
    correction: Correction = Correction()
    # the ranking term's pair weights in fine-tunes and online updates; null: the donor's
    rank_weighting: RankWeighting | None = None

    def weighting(self, train: Train) -> RankWeighting:
        """The ranking term's pair weights of a fine-tune or an online update."""
        return self.rank_weighting or train.rank_weighting

    @property
    def rules(self) -> dict[str, tuple[FinetuneStep, ...]]:
        return {"rule": self.rule, "same_device_rule": self.same_device_rule}

    @property
    def keeps_donor_rows(self) -> bool:
        """Some row's trees learn from the donor's records: the donor keeps their store rows."""
        return any(step.donor_records for rule in self.rules.values() for step in rule)

    @property
    def corrects(self) -> bool:
        """Some warm-up size gets a residual correction (calo.correction)."""
        return any(step.correction > 0 for rule in self.rules.values() for step in rule)

    def step_for(self, per_workload: float, same_device: bool = False,
                 fast_weight: float = 0.0) -> FinetuneStep:
        """The row for a warm-up of `per_workload` records per workload: of the same-device
        rule when the records are of a device the model was trained on. What the row leaves
        out is filled in: `keep` from this section, `fast_weight` from the argument (the
        donor's, train.fast_weight)."""
        rule = self.same_device_rule if same_device and self.same_device_rule else self.rule
        step = next((s for s in rule if s.up_to is None or per_workload <= s.up_to), rule[-1])
        return dataclasses.replace(
            step, keep=step.keep or self.keep,
            fast_weight=fast_weight if step.fast_weight is None else step.fast_weight)


@dataclass(frozen=True)
class Promotion:
    min_nll_gain: float
    max_tau_drop: float


@dataclass(frozen=True)
class Calibrate:
    levels: int
    donor_fit: Literal["pooled", "workload-median"] = "pooled"
    after_finetune: Literal["temperature", "width", "no-wider"] = "temperature"
    warmup_refit: Literal["off", "replace", "blend"] = "replace"
    warmup_donor_fit: bool = False  # refit the donor's temperature on every warm-up probe first
    objective: Literal["ece", "nll"] = "ece"   # what every temperature fit minimizes


@dataclass(frozen=True)
class Tune:
    workloads: tuple[str, ...]
    max_trials: int
    trials_per_iter: int
    search: Evolution
    calo_search: Evolution
    seed: int
    kappa_c: float
    kappa_offset: float
    quality_eps: float
    update_steps: int
    correct_top: int = 64
    trees: bool = False   # a search scores with the fine-tune rule's trees and refits them


@dataclass(frozen=True)
class Networks:
    tune: tuple[str, ...]
    batch: int
    trials: int
    trials_per_iter: int
    repeat: int
    min_repeat_ms: int
    rtol: float
    atol: float


@dataclass(frozen=True)
class Mlflow:
    tracking_uri: str
    model_name: str


@dataclass(frozen=True)
class Settings:
    """params.yaml, checked. `raw` is the file's mapping, kept for overrides and rewrites."""

    path: Path
    raw: dict[str, Any]
    donor: str
    targets: tuple[str, ...]
    devices: dict[str, Device]
    workloads: dict[str, Workload]
    harvest: Harvest
    split: Split
    labels: Labels
    graph: Graph
    extract: Extract
    model: Model
    train: Train
    sweep: Sweep
    finetune: Finetune
    promotion: Promotion
    calibrate: Calibrate
    tune: Tune
    networks: Networks
    mlflow: Mlflow

    def device(self, name: str) -> Device:
        if name not in self.devices:
            raise CaloError(f"unknown device '{name}' (known: {', '.join(sorted(self.devices))})")
        return self.devices[name]

    def target_device(self, name: str) -> Device:
        """A device that is fine-tuned and tuned for (not the donor)."""
        device = self.device(name)
        if name not in self.targets:
            raise CaloError(
                f"device '{name}' is not a target device (targets: {', '.join(self.targets)})")
        return device

    def workload(self, name: str) -> Workload:
        """A workload of params.yaml, else of the built-in suite (`calo workloads` lists both)."""
        if name in self.workloads:
            return self.workloads[name]
        found = suite.resolve(name)
        if found is None:
            raise CaloError(f"unknown workload '{name}' (params.yaml has "
                            f"{', '.join(sorted(self.workloads))}; "
                            f"`calo workloads` lists the suite)")
        return Workload(name=name, op=found[0], args=found[1])

    def extracts_stores(self, device: str) -> bool:
        """A device's graphs carry TVM's per-store features: the model reads them, or, on a
        target device, the fine-tune's correction does, or, on the donor, the correction's
        trees learn from its records too."""
        return (self.graph.stores or (device in self.targets and self.finetune.corrects)
                or (device == self.donor and self.finetune.keeps_donor_rows))

    def workloads_named(self, names: typing.Iterable[str]) -> list[Workload]:
        return [self.workload(n) for n in names]

    def override(self, changes: dict[str, Any]) -> Settings:
        """These settings with dotted keys replaced (`{"train.seed": 1}`), checked again."""
        raw = copy.deepcopy(self.raw)
        for dotted, value in changes.items():
            *parents, leaf = dotted.split(".")
            node = raw
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = copy.deepcopy(value)
        return from_mapping(raw, self.path)


# Sections that are documentation for the user (copied into `devices:` by hand), not settings.
_FREE_SECTIONS = ("device_templates",)


def load_settings(path: str | os.PathLike | None = None) -> Settings:
    """Read params.yaml (or $CALO_PARAMS) and check every value."""
    path = Path(path or os.environ.get(PARAMS_ENV, DEFAULT_PARAMS))
    if not path.is_file():
        raise CaloError(f"parameters file not found: {path.resolve()} (run calo in the project's "
                        f"directory, or name the file with --params or ${PARAMS_ENV})")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise CaloError(f"{path} is not valid YAML: {str(err).splitlines()[0]}") from None
    return from_mapping(raw, path)


def from_mapping(raw: Any, path: Path) -> Settings:
    if not isinstance(raw, dict):
        raise CaloError(f"{path} must hold a mapping at the top level")
    file = path.name
    body = {k: v for k, v in raw.items() if k not in _FREE_SECTIONS}
    for section, cls in (("devices", Device), ("workloads", Workload)):
        entries = _mapping(body.get(section), file, section)
        body[section] = {
            name: _build(cls, {"name": name, **_mapping(spec, file, f"{section}.{name}")},
                         file, f"{section}.{name}")
            for name, spec in entries.items()}
    settings = _build(Settings, {"path": path, "raw": raw, **body}, file, "")
    _check_references(settings, file)
    return settings


def _check_references(s: Settings, where: str) -> None:
    """Names that must refer to something defined elsewhere in the file."""
    s.device(s.donor)
    for name in s.targets:
        s.device(name)
        if name == s.donor:
            raise CaloError(f"{where}: targets: '{name}' is the donor")
    for name, device in s.devices.items():
        check_target(device.target, where=f"{where}: devices.{name}")
    for name in (*s.harvest.workloads, *s.tune.workloads):
        s.workload(name)
    for name, rule in s.finetune.rules.items():
        if name != "rule" and not rule:
            continue
        bounds = [step.up_to for step in rule]
        if not bounds or bounds[-1] is not None or None in bounds[:-1] or bounds[:-1] != sorted(
                set(bounds[:-1])):
            raise CaloError(f"{where}: finetune.{name} must list rows by increasing up_to, the "
                            f"last with up_to: null (any warm-up size), got up_to {bounds}")
        if any(step.correction < 0 for step in rule):
            raise CaloError(f"{where}: finetune.{name}: correction is a number of boosting "
                            "rounds, >= 0")
        if any(not 0 <= step.blend <= 1 or (step.blend and not step.correction)
               for step in rule):
            raise CaloError(f"{where}: finetune.{name}: blend is the throughput trees' weight "
                            "in the ordering, in [0, 1], and needs correction rounds > 0")
        if any(step.donor_records and not step.blend for step in rule):
            raise CaloError(f"{where}: finetune.{name}: donor_records is for the throughput "
                            "trees (blend > 0)")
        if any(step.anchor < 0 for step in rule):
            raise CaloError(f"{where}: finetune.{name}: anchor must be >= 0 (0: no pull toward "
                            "the donor's weights)")
        if any(step.fast_weight is not None and step.fast_weight < 0 for step in rule):
            raise CaloError(f"{where}: finetune.{name}: fast_weight must be >= 0 (0: every "
                            "record's loss weighs alike)")
    for name, search in (("tune.search", s.tune.search), ("tune.calo_search", s.tune.calo_search)):
        if not 0 <= search.eps_greedy <= 1:
            raise CaloError(f"{where}: {name}.eps_greedy is a share of each round's picks, in "
                            f"[0, 1], got {search.eps_greedy}")
    if s.tune.correct_top < 0:
        raise CaloError(f"{where}: tune.correct_top must be >= 0 (0: every candidate), got "
                        f"{s.tune.correct_top}")
    c = s.finetune.correction
    if (c.depth < 1 or c.lr <= 0 or not 0 < c.subsample <= 1 or c.threads < 1
            or not c.members or c.seeds < 1):
        raise CaloError(f"{where}: finetune.correction needs depth >= 1, lr > 0, subsample in "
                        f"(0, 1], threads >= 1, one or more members and seeds >= 1, got {c}")
    if s.extract.workers < 1 or s.extract.shard_size < 1 or s.train.graphs_in_memory < 1:
        raise CaloError(f"{where}: extract.workers, extract.shard_size and "
                        "train.graphs_in_memory must be >= 1")
    if s.train.threads is not None and s.train.threads < 1:
        raise CaloError(f"{where}: train.threads must be >= 1 (null: torch's default, one per "
                        f"core), got {s.train.threads}")
    if not (0 <= s.split.val and 0 <= s.split.test and s.split.val + s.split.test < 1):
        raise CaloError(f"{where}: split.val and split.test must be >= 0 and leave some "
                        f"records for training, got {s.split.val} and {s.split.test}")


def _mapping(value: Any, file: str, key: str) -> dict:
    if value is None:
        raise CaloError(f"{file}: {key} is missing")
    if not isinstance(value, dict):
        raise CaloError(f"{file}: {key} must be a mapping, got {value!r}")
    return value


def _build(cls: type, raw: dict, file: str, prefix: str):
    """A settings dataclass from a mapping: every key known, every value of its declared type."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        known = ", ".join(n for n in fields if n not in ("path", "raw", "name"))
        raise CaloError(f"{file}: unknown key '{_join(prefix, unknown[0])}' (known: {known})")
    values = {}
    for name, f in fields.items():
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise CaloError(f"{file}: {_join(prefix, name)} is missing")
            continue
        values[name] = _convert(raw[name], hints[name], file, _join(prefix, name))
    return cls(**values)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _convert(value: Any, hint: Any, file: str, key: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is Path:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(value, inner, file, key)
    if origin is Literal:
        if value not in args:
            choices = ", ".join(map(str, args))
            raise CaloError(f"{file}: {key} must be one of {choices}, got {value!r}")
        return value
    if dataclasses.is_dataclass(hint):
        return _build(hint, _mapping(value, file, key), file, key)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise CaloError(f"{file}: {key} must be a list, got {value!r}")
        return tuple(_convert(v, args[0], file, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        return dict(_mapping(value, file, key))
    if hint is bool:
        if not isinstance(value, bool):
            raise CaloError(f"{file}: {key} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise CaloError(f"{file}: {key} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CaloError(f"{file}: {key} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise CaloError(f"{file}: {key} must be a string, got {value!r}")
        return value
    raise TypeError(f"no conversion for {hint}")  # a settings class the code got wrong


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
