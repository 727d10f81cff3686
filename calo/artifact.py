"""A trained cost model as one artifact: network weights, its configuration and its temperature.

On disk it is a directory of two files, `weights.pt` (a state dict, standardization included,
loaded with `weights_only=True`: nothing unpickles code) and `model.json` (the configuration,
the graph schema it reads and the calibration temperatures), a third, `correction.json`,
when a fine-tune fitted a correction (calo.correction; XGBoost's own JSON format), and
`donor_rows.npz` when the fine-tune rule's trees learn from the donor's records too (their
summarized per-store rows and throughputs, calo.correction.tree_rows).
The pipeline's stages, the MLflow registry, `calo evaluate`, the benchmarks and the
Meta-Schedule cost model all save and load it here.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from calo import config as cfg
from calo import paths, store_features
from calo.correction import Corrector, TreeRows
from calo.dataset import GraphSet, load_graphs
from calo.errors import CaloError, reason
from calo.graphs import schema
from calo.models.evidential import EvidentialSAGE

WEIGHTS, CONFIG, CORRECTION = "weights.pt", "model.json", "correction.json"
DONOR_ROWS = "donor_rows.npz"


@dataclass(frozen=True)
class ModelConfig:
    """What it takes to rebuild the network and feed it: architecture and graph schema."""

    graph: str
    features: tuple[str, ...]
    edge_types: tuple[str, ...]
    hidden: int
    layers: int
    encoder: str = "sage"
    pooling: str = "meanmax"
    head: str = "evidential"
    attention: bool = False
    stores: int = 0          # per-store feature columns it reads beside the graph (0: none)
    per_iteration: bool = False  # the head predicts latency per iteration of the largest block

    @classmethod
    def of(cls, graph: cfg.Graph, model: cfg.Model) -> ModelConfig:
        features, edge_types = schema(graph.kind)
        return cls(graph.kind, tuple(features), tuple(edge_types), model.hidden, model.layers,
                   model.encoder, model.pooling, model.head, model.attention,
                   store_features.NUM_FEATURES if graph.stores else 0, model.per_iteration)

    def build(self) -> EvidentialSAGE:
        features, edge_types = schema(self.graph)
        if self.features != tuple(features) or self.edge_types != tuple(edge_types):
            raise CaloError(f"model reads a different {self.graph} graph schema than this code "
                            "extracts: re-run extract and pretrain")
        work = None
        if self.per_iteration:
            if not {"is_block", "log_extent"} <= set(features):
                raise CaloError(f"model.per_iteration needs block extents, which {self.graph} "
                                "graphs do not have: use graph.kind schedule")
            work = (features.index("is_block"), features.index("log_extent"))
        return EvidentialSAGE(len(features), len(edge_types), self.hidden, self.layers,
                              encoder=self.encoder, pooling=self.pooling, head=self.head,
                              attention=self.attention, store_features=self.stores,
                              work_columns=work)


@dataclass
class TrainedModel:
    net: EvidentialSAGE
    config: ModelConfig
    temperature: float = 1.0        # served variance = temperature^2 * variance
    info: dict[str, Any] = dataclasses.field(default_factory=dict)  # lineage: donor, records
    correction: Corrector | None = None  # the device's residual correction, if fitted
    donor_rows: TreeRows | None = None  # the donor's records, for trees that learn from them

    @classmethod
    def new(cls, settings: cfg.Settings) -> TrainedModel:
        config = ModelConfig.of(settings.graph, settings.model)
        return cls(config.build(), config)

    def trained_on(self, targets: set[str]) -> bool:
        """Whether all these targets (records.target_key) are of devices this model was
        trained on: adapting to them is then learning new workloads, not a new device."""
        return bool(targets) and targets <= set(self.info.get("targets", ()))

    def rows_for(self, step: cfg.FinetuneStep) -> TreeRows | None:
        """The donor's records for the trees of a fine-tune rule's row that asks for them."""
        if not step.donor_records:
            return None
        if self.donor_rows is None:
            raise CaloError("the fine-tune rule's trees learn from the donor's records "
                            "(donor_records: true), but this model keeps none: re-run `calo "
                            "pretrain` with this params.yaml")
        return self.donor_rows

    @property
    def graph_kind(self) -> str:
        return self.config.graph

    @property
    def reads_stores(self) -> bool:
        return self.config.stores > 0

    @property
    def needs_stores(self) -> bool:
        """Its inputs include TVM's per-store features (the network's or the correction's)."""
        return self.reads_stores or self.correction is not None

    def save(self, path: Path) -> Path:
        """Write both files; a file of a previous model at path is replaced whole."""
        path.mkdir(parents=True, exist_ok=True)
        for name, write in ((WEIGHTS, lambda p: torch.save(self.net.state_dict(), p)),
                            (CONFIG, lambda p: p.write_text(json.dumps(self.describe(),
                                                                       indent=1)))):
            tmp = path / f".{name}.tmp"
            write(tmp)
            tmp.replace(path / name)
        if self.correction is None:
            (path / CORRECTION).unlink(missing_ok=True)
        else:
            tmp = path / f".{CORRECTION}.tmp.json"  # XGBoost picks the format by suffix
            self.correction.save(tmp)
            tmp.replace(path / CORRECTION)
        if self.donor_rows is None:
            (path / DONOR_ROWS).unlink(missing_ok=True)
        else:
            with open(path / f".{DONOR_ROWS}.tmp", "wb") as tmp_file:
                groups = {} if self.donor_rows[2] is None else {"workload": self.donor_rows[2]}
                np.savez_compressed(tmp_file, rows=self.donor_rows[0],
                                    throughput=self.donor_rows[1], **groups)
            (path / f".{DONOR_ROWS}.tmp").replace(path / DONOR_ROWS)
        return path

    def describe(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.config), "temperature": self.temperature,
                "correction": None if self.correction is None else self.correction.describe(),
                "donor_rows": None if self.donor_rows is None else len(self.donor_rows[1]),
                "info": self.info}

    @classmethod
    def load(cls, path: Path) -> TrainedModel:
        """The model saved at path, in eval mode; anything missing or inconsistent is refused
        with one line."""
        if not (path / WEIGHTS).is_file() or not (path / CONFIG).is_file():
            raise CaloError(f"no model at {path} (expected {WEIGHTS} and {CONFIG})")
        try:
            blob = json.loads((path / CONFIG).read_text())
            fields = {f.name for f in dataclasses.fields(ModelConfig)}
            config = ModelConfig(**{k: tuple(v) if isinstance(v, list) else v
                                    for k, v in blob.items() if k in fields})
            temperature = float(blob["temperature"])
            scale_power = float(blob.get("scale_power", 1.0))
            per_target = dict(blob.get("device_temperatures", {}))
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise CaloError(f"{path / CONFIG} is not a model configuration: {reason(err)}") \
                from None
        # Two calibration options since removed (docs/ranking.md, "Options not taken, removed
        # from the code"): a model saved with one in use would be served otherwise.
        if scale_power != 1.0:
            raise CaloError(f"{path / CONFIG} serves its scales to the power {scale_power:g}, "
                            "which this version of calo cannot: train the model again")
        if per_target:
            raise CaloError(f"{path / CONFIG} has a temperature per target "
                            f"({', '.join(map(str, per_target))}), which this version of calo "
                            "does not serve: train the model again")
        net = config.build()
        try:
            state = torch.load(path / WEIGHTS, weights_only=True)
            net.load_state_dict(state)
        except Exception as err:  # truncated file, foreign pickle, or other shapes
            raise CaloError(f"{path / WEIGHTS} does not hold this model's weights: "
                            f"{reason(err)[:160]}") from None
        net.eval()
        correction = None
        if blob.get("correction"):
            try:
                correction = Corrector.load(path / CORRECTION, blob["correction"])
            except Exception as err:  # missing, or not an XGBoost model
                raise CaloError(f"{path / CORRECTION} does not hold this model's correction: "
                                f"{reason(err)[:160]}") from None
        donor_rows = None
        if blob.get("donor_rows"):
            try:
                with np.load(path / DONOR_ROWS) as saved:  # older rows: no workloads
                    donor_rows = (saved["rows"], saved["throughput"],
                                  saved["workload"] if "workload" in saved else None)
                if len(donor_rows[0]) != blob["donor_rows"] or len(donor_rows[1]) != len(
                        donor_rows[0]) or (donor_rows[2] is not None
                                           and len(donor_rows[2]) != len(donor_rows[0])):
                    raise ValueError(f"{len(donor_rows[0])} rows, {blob['donor_rows']} expected")
            except Exception as err:  # missing, truncated, or another model's
                raise CaloError(f"{path / DONOR_ROWS} does not hold this model's donor records: "
                                f"{reason(err)[:160]}") from None
        return cls(net, config, temperature, dict(blob.get("info", {})), correction,
                   donor_rows)


def load_with_graphs(device: str, model_dir: Path, made_by: str) -> tuple[TrainedModel, GraphSet]:
    """A device's model from one stage's output and the device's graphs, of the kind it reads.
    `made_by` names the stage that writes model_dir, for the error when it has not run."""
    if not model_dir.is_dir():
        raise CaloError(f"no model for '{device}' in {model_dir}: run `calo {made_by}` first")
    trained = TrainedModel.load(model_dir)
    return trained, load_graphs(paths.graphs_path(device), trained.graph_kind,
                                trained.needs_stores)
