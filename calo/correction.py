"""The device correction: a small boosted ensemble beside the graph model, fitted on the
device's own measurements.

The graph model carries what transfers from the donor; once a new device has measured records
of a workload, they also say how that workload's candidates order there. Boosted trees learn
that from TVM's per-store features, the inputs TVM's own XGBModel learns quickly from, each
program summarized by the sum and the maximum of its store rows, in one of two ways:

- residual (the rule's `blend` 0): the trees fit what the network still gets wrong (measured
  minus predicted log latency), and their prediction is added to its mean;
- throughput (`blend` w > 0): the trees fit what TVM's XGBModel fits, each record's normalized
  throughput (its workload's best measured latency / its latency), so their loss sits on the
  fast end; candidates are ordered by (1 - w) x the network's mean + w x the trees' log
  latency (the workload's best, less the log of the predicted throughput), for workloads they
  have measurements of (named as the fit's were: workload names, or a search's task names);
  trees that learned from the donor's records too order every workload, and the donor keeps
  such trees of its records alone for workloads no warm-up has measured (`donor_trees`).
  The mean stays the network's (calo.evaluation.ranking_scores).

The donor's own trees learn from several devices' measurements at once; their rows also
carry the device each program was measured on (its target's cores and vector bytes,
calo.schedule_graph.device_of), so a split can keep one device's order apart from another's
where the two differ. Beside a warm-up the trees read the donor's rows without it: there the
columns did not lead (docs/ranking.md, "The device beside the donor's tree rows, built").
The trees that learn from the donor's records can also read each program's summarized
columns against its workload's (`finetune.correction.relative`: less the workload's median, or
as a percentile among its candidates): a shape the donor never measured moves every absolute
column, and a split learned on the donor's shapes then falls on one side for all of a new
workload's candidates. The donor's records are read against the donor's records of their
workload, a warm-up's against that workload's warm-up records, candidates scored against the
candidates scored with them (a search: those it first scored for the task).

Those trees fit many records per workload, most of them far from its fast end; they can
weigh each record's squared error by its normalized throughput, as TVM's XGBModel weighs its
own, so the split points serve the candidates a search keeps: beside a warm-up
(`finetune.correction.row_weight`), and in the donor's own trees
(`zero_shot_row_weight`).

The throughput trees can be an ensemble of kinds (below), their predictions averaged.
Neither touches the variance, the evidential head's. The fine-tune rule says how many boosting
rounds, and which blend, a warm-up of a given size gets (0 rounds: none); the trees' settings
and kinds are `finetune.correction` in params.yaml.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch_geometric.data import Data

from calo import config as cfg
from calo import store_features
from calo.errors import CaloError
from calo.graph_store import ShardedGraphs
from calo.models.evidential import EvidentialSAGE
from calo.models.training import predict

if TYPE_CHECKING:
    import xgboost


def summarize(rows: Sequence, devices: np.ndarray | None = None) -> np.ndarray:
    """[programs, 2 x NUM_FEATURES]: each program's per-store rows summed, then maxed; with
    `devices` ([programs, 2], store_devices) their cores and vector bytes as two more columns."""
    width = store_features.NUM_FEATURES
    out = np.zeros((len(rows), 2 * width), np.float32)
    for i, r in enumerate(rows):
        r = np.asarray(r, np.float32)
        if len(r):
            out[i, :width], out[i, width:] = r.sum(0), r.max(0)
    if devices is None:
        return out
    return np.concatenate([out, np.asarray(devices, np.float32).reshape(len(rows), 2)], 1)


def relative_columns(summary: np.ndarray, workloads: Sequence, how: str,
                     reference: dict | None = None) -> np.ndarray:
    """Summarized rows (summarize) with each store column read against the candidates of
    its program's workload: `how` "median", less their median; "rank", its percentile among
    them (ties at their middle). The device columns stay as they are. The candidates are
    `reference[workload]` (summarized rows) where given, else the workload's rows here."""
    width = summary_width(devices=False)
    out = np.array(summary, np.float32, copy=True)
    workloads = np.asarray(workloads)
    for workload in np.unique(workloads):
        mine = workloads == workload
        base = np.asarray((reference or {}).get(workload, summary[mine]))[:, :width]
        if how == "median":
            out[mine, :width] -= np.median(base, 0)
            continue
        ordered = np.sort(base, 0)
        for j in range(width):
            below = np.searchsorted(ordered[:, j], summary[mine, j], "left")
            upto = np.searchsorted(ordered[:, j], summary[mine, j], "right")
            out[mine, j] = (below + upto) / (2.0 * len(ordered))
    return out


def store_devices(graphs: Sequence[Data]) -> np.ndarray:
    """[programs, 2]: the device (cores, vector bytes) each graph's store rows were extracted
    for; graphs extracted before graphs kept it are refused in one line."""
    if isinstance(graphs, ShardedGraphs):  # the store's index holds them: no shard is loaded
        devices = graphs.device.numpy()
    elif all("store_device" in g for g in graphs):
        devices = np.zeros((len(graphs), 2), np.float32)
        for i, g in enumerate(graphs):
            devices[i] = g.store_device.reshape(2).numpy()
    else:
        devices = None
    if devices is None or np.isnan(devices).any():
        raise CaloError("the trees that learn from several devices' records read the device "
                        "beside each program's store rows, which these graphs lack: re-run "
                        "`calo extract`")
    return devices


# Predicted throughputs are floored here before their log is taken: a tree can predict zero
# or less for a candidate far slower than anything measured.
MIN_THROUGHPUT = 1e-3


# The throughput trees' kinds (finetune.correction.members), their throughputs averaged:
# - summary: trees on each program's summed and maxed store rows (`summarize`);
# - packed: TVM's XGBModel's form: a score per store row, summed per program, its squared
#   error weighted by the record's throughput; finetune.correction's settings and the rule's
#   rounds;
# - tvm: packed with XGBModel's own settings (its XGBConfig, deeper trees), boosted until the
#   training error has not improved for XGBModel's early-stopping rounds.
# Fits of one kind on slightly different inputs pick different first candidates; averaging
# kinds that err differently steadies the pick (docs/ranking.md). So does averaging fits of a
# kind that samples records and features (summary, packed) with several seeds
# (finetune.correction.seeds); a kind's further fits are kept as "kind#1", "kind#2", ...
SEED_MARK = "#"


def member_keys(settings: cfg.Correction, members: Sequence[str]) -> list[str]:
    """The fits a Corrector of these kinds holds: each sampling kind once per seed."""
    return [kind if copy == 0 else f"{kind}{SEED_MARK}{copy}" for kind in members
            for copy in range(settings.seeds if kind != "tvm" else 1)]


def _packed(rows: Sequence) -> tuple[np.ndarray, np.ndarray]:
    """Every program's store rows stacked, and the program each row belongs to."""
    rows = [np.asarray(r, np.float32).reshape(-1, store_features.NUM_FEATURES) for r in rows]
    owner = np.repeat(np.arange(len(rows)), [len(r) for r in rows])
    return np.concatenate(rows), owner


def _tree_params(settings: cfg.Correction, seed: int) -> dict:
    """finetune.correction's tree settings, in XGBoost's own names."""
    return {"max_depth": settings.depth, "eta": settings.lr,
            "min_child_weight": settings.min_child_weight, "subsample": settings.subsample,
            "colsample_bytree": settings.subsample, "seed": seed, "nthread": settings.threads,
            "verbosity": 0}


def _fit_packed(params: dict, x: np.ndarray, owner: np.ndarray, target: np.ndarray,
                rounds: int | None, patience: int = 0) -> xgboost.Booster:
    """Trees whose scores of the stacked store rows `x`, summed per program (`owner`, as
    `_packed` gives them), regress `target` (TVM's pack-sum objective); `rounds` None: until
    the error has not fallen for `patience` rounds more."""
    import xgboost

    y = np.asarray(target, np.float64)
    data = xgboost.DMatrix(x)

    def program_scores(scores: np.ndarray) -> np.ndarray:
        return np.bincount(owner, weights=scores, minlength=len(y))

    def objective(scores: np.ndarray, _data) -> tuple[np.ndarray, np.ndarray]:
        weight = y[owner]
        return (program_scores(scores)[owner] - weight) * weight, weight

    def error(scores: np.ndarray, _data) -> tuple[str, float]:
        return "p-rmse", float(np.sqrt(np.mean((program_scores(scores) - y) ** 2)))

    if rounds is not None:
        return xgboost.train(params, data, num_boost_round=rounds, obj=objective)
    # XGBModel's own cap on the rounds; the trees are kept whole, the rounds past the best
    # too, as XGBModel keeps them.
    return xgboost.train({**params, "disable_default_eval_metric": 1}, data,
                         num_boost_round=10_000, obj=objective, custom_metric=error,
                         evals=[(data, "train")], early_stopping_rounds=patience,
                         verbose_eval=False)


def _tvm_settings(threads: int) -> tuple[dict, int]:
    """XGBModel's tree settings and early-stopping rounds, as TVM's defaults give them."""
    import inspect

    from tvm.s_tir.meta_schedule.cost_model import xgb_model

    params = {**xgb_model.XGBConfig().to_dict(), "nthread": threads, "verbosity": 0}
    patience = inspect.signature(xgb_model.XGBModel).parameters["early_stopping_rounds"]
    return params, int(patience.default)


class Corrector:
    def __init__(self, members: dict[str, xgboost.Booster], blend: float = 0.0,
                 best: dict[str, float] | None = None, general: bool = False,
                 device_columns: bool = False, relative: str = "none",
                 row_weight: str = "none"):
        self.members = members          # kind (finetune.correction.members, #seed) -> its trees
        self.blend = blend              # 0: residual trees; else the throughput trees' weight
        self.best = dict(best or {})    # workload -> its best measured log latency (throughput)
        # Throughput trees that learned from the donor's records know workloads beyond `best`
        # and order those too; trees of a warm-up alone leave them to the network.
        self.general = general
        # Whether the summary trees read each program's device beside its rows (summarize):
        # the donor's own trees do; models saved before they did, not.
        self.device_columns = device_columns
        # How the summary trees read the store columns: as they are ("none"), or against their
        # workload's candidates (relative_columns); models saved before: "none".
        self.relative = relative
        # How the summary trees weighed their records when fitted (finetune.correction's
        # row_weight, or zero_shot_row_weight for the donor's own); kept so a saved donor's
        # trees can be told from what the settings would fit now.
        self.row_weight = row_weight

    @classmethod
    def fit(cls, settings: cfg.Correction, rounds: int, rows: Sequence, target: np.ndarray,
            seed: int = 0, blend: float = 0.0, best: dict[str, float] | None = None,
            members: Sequence[str] = ("summary",), summary_rows: np.ndarray | None = None,
            general: bool = False, device_columns: bool = False, relative: str = "none",
            row_weight: str = "none") -> Corrector:
        """Boosted trees of each kind in `members` (once per seed: member_keys) fitted to
        `target` (residual log latency, or normalized throughput where `blend` > 0) from each
        program's store `rows` (`summary_rows`: the summary member's inputs where they are
        given summarized; `general`: trees of the donor's records too; `device_columns`:
        those rows carry their devices; `relative`: they are read against their workloads'
        candidates, as relative_columns gives them; `row_weight` "throughput": the summary
        trees weigh each record's squared error by its target, a normalized throughput)."""
        import xgboost  # with sklearn, over a second of every stage's start-up: only here

        if row_weight != "none" and not blend:
            raise ValueError("only throughput trees (blend > 0) weigh their records by target")
        target = np.asarray(target, np.float32)
        stacked = _packed(rows) if set(members) - {"summary"} else None
        summary = None
        if "summary" in members:  # once for all of the kind's seeds
            summary = summarize(rows) if summary_rows is None else summary_rows
        weight = target if row_weight == "throughput" else None
        fitted = {}
        for key in member_keys(settings, members):
            kind, _, copy = key.partition(SEED_MARK)
            params = _tree_params(settings, seed + int(copy or 0))
            if kind == "summary":
                booster = xgboost.XGBRegressor(n_estimators=rounds, **params)
                fitted[key] = booster.fit(summary, target, sample_weight=weight).get_booster()
            elif kind == "packed":
                fitted[key] = _fit_packed(params, *stacked, target, rounds)
            else:
                tvm_params, patience = _tvm_settings(settings.threads)
                fitted[key] = _fit_packed(tvm_params, *stacked, target, None, patience)
        return cls(fitted, blend, best, general, device_columns, relative, row_weight)

    def summary_of(self, rows: Sequence, devices: np.ndarray | None = None) -> np.ndarray:
        """Programs' summarized rows as these trees read them, before relative_columns: with
        their `devices` (store_devices) where the trees read those."""
        if self.device_columns and devices is None:
            raise ValueError("these trees read each program's device beside its store rows")
        return summarize(rows, devices if self.device_columns else None)

    def predict(self, rows: Sequence, devices: np.ndarray | None = None,
                workloads: Sequence[str] | None = None, reference: dict | None = None
                ) -> np.ndarray:
        """The members' mean prediction for programs of these store rows, measured on these
        `devices` (store_devices; the trees that read them need them), of these `workloads`
        (the trees that read rows against their workload's candidates need them: those given
        here, or `reference`'s, summary_of rows per workload)."""
        import xgboost

        out = np.zeros(len(rows))
        if not len(rows):
            return out
        kinds = {key: key.partition(SEED_MARK)[0] for key in self.members}
        summary = None
        if "summary" in kinds.values():
            summary = self.summary_of(rows, devices)
            if self.relative != "none":
                if workloads is None:
                    raise ValueError("these trees read rows against their workload's candidates")
                summary = relative_columns(summary, workloads, self.relative, reference)
            summary = xgboost.DMatrix(summary)
        if set(kinds.values()) - {"summary"}:
            x, owner = _packed(rows)
            stacked = xgboost.DMatrix(x)
        for key, booster in self.members.items():
            if kinds[key] == "summary":
                out += booster.predict(summary)
            else:
                out += np.bincount(owner, weights=booster.predict(stacked),
                                   minlength=len(rows))
        return out / len(self.members)

    def adjust(self, mu: np.ndarray, rows: Sequence, workloads: Sequence[str],
               devices: np.ndarray | None = None, reference: dict | None = None
               ) -> np.ndarray:
        """For programs whose network means are `mu`: the corrected means (residual trees),
        or the blended log latencies that order them (throughput trees)."""
        mu = np.asarray(mu, np.float64)
        if not len(rows):
            return mu
        if not self.blend:
            return mu + self.predict(rows, devices, workloads, reference)
        trees = self.log_latency(rows, workloads, devices, reference)
        ordered = np.array([self.orders(w) for w in workloads])
        return np.where(ordered, (1 - self.blend) * mu + self.blend * trees, mu)

    def log_latency(self, rows: Sequence, workloads: Sequence[str],
                    devices: np.ndarray | None = None, reference: dict | None = None
                    ) -> np.ndarray:
        """Throughput trees' log latency of each program: its workload's best measured log
        latency less the log of the predicted normalized throughput."""
        # A workload of no measurement has no best to anchor the trees' log latency; any
        # constant orders its candidates alike.
        best = np.array([self.best.get(w, 0.0) for w in workloads])
        return best - np.log(np.maximum(self.predict(rows, devices, workloads, reference),
                                        MIN_THROUGHPUT))

    def orders(self, workload: str) -> bool:
        """Whether it moves this workload's candidates: residual trees move every one;
        throughput trees order the workloads they measured, or every workload where they
        learned from the donor's records (`general`)."""
        return self.moves_mean or self.general or workload in self.best

    @property
    def moves_mean(self) -> bool:
        """The residual trees correct the predicted mean; the throughput trees only reorder
        candidates (calo.evaluation.ranking_scores, the search's scores), leaving the mean and
        variance the evidential head calibrated."""
        return not self.blend

    def describe(self) -> dict:
        """What model.json keeps of it beside the trees' own file."""
        return {"blend": self.blend, "best": self.best, "members": list(self.members),
                "general": self.general, "device_columns": self.device_columns,
                "relative": self.relative, "row_weight": self.row_weight}

    def save(self, path: Path) -> None:
        """One member: XGBoost's own JSON model; several: {kind: that model}."""
        if len(self.members) == 1:
            next(iter(self.members.values())).save_model(path)
            return
        path.write_text(json.dumps({kind: json.loads(booster.save_raw("json"))
                                    for kind, booster in self.members.items()}))

    @classmethod
    def load(cls, path: Path, described: dict | bool = True) -> Corrector:
        """The trees at `path`, with what `describe` said (True: a residual correction, as
        models saved before the throughput blend)."""
        import xgboost

        kinds = ["summary"] if described is True else described.get("members", ["summary"])
        if len(kinds) == 1:
            booster = xgboost.Booster()
            booster.load_model(path)
            members = {kinds[0]: booster}
        else:
            saved = json.loads(path.read_text())
            members = {}
            for kind in kinds:
                members[kind] = xgboost.Booster()
                members[kind].load_model(bytearray(json.dumps(saved[kind]).encode()))
        if described is True:
            return cls(members)
        return cls(members, float(described["blend"]),
                   {str(k): float(v) for k, v in described["best"].items()},
                   bool(described.get("general", False)),
                   bool(described.get("device_columns", False)),
                   str(described.get("relative", "none")),
                   str(described.get("row_weight", "none")))


def store_rows(graphs: Sequence[Data]) -> list:
    """Each graph's per-store rows, which the correction reads; graphs extracted without them
    are refused in one line."""
    if graphs and "store_rows" not in graphs[0]:
        raise CaloError("the residual correction reads per-store features these graphs lack: "
                        "re-run `calo extract` with the params.yaml whose finetune.rule asks "
                        "for it")
    return [g.store_rows for g in graphs]


# The donor's records as the throughput trees read them: each program's summarized store rows
# with its device, its throughput relative to its workload's best, and its workload (an index;
# None in rows kept before they had it). Kept at full precision: rounded, a donor's row would
# sit on the other side of a split from an equal row of the device.
TreeRows = tuple[np.ndarray, np.ndarray, np.ndarray | None]


def summary_width(devices: bool) -> int:
    """Columns of a summarized row (summarize), with its device's or without."""
    return 2 * store_features.NUM_FEATURES + (2 if devices else 0)


def fit_correction(net: EvidentialSAGE, settings: cfg.Correction, rounds: int,
                   graphs: Sequence[Data], workloads: Sequence[str], seed: int = 0,
                   blend: float = 0.0, donor: TreeRows | None = None) -> Corrector | None:
    """The correction of `net`'s mean on measured graphs (with store rows) of `workloads`
    (one name each): residual trees, or with `blend` > 0 throughput trees blended at that
    weight, fitted on the `donor`'s records too where given; None for 0 rounds."""
    if rounds <= 0 or not graphs:
        return None
    rows = store_rows(graphs)
    y = torch.cat([g.y for g in graphs]).double().numpy()
    if not blend:
        residual = y - predict(net, list(graphs)).gamma.numpy()
        return Corrector.fit(settings, rounds, rows, residual, seed)
    best, throughput = normalized_throughput(y, workloads)
    if donor is None:
        return Corrector.fit(settings, rounds, rows, throughput, seed, blend, best,
                             settings.members)
    # The donor keeps its records summarized: only the summary member can learn from them.
    # Beside a warm-up the trees read them without their devices: the columns led the donor's
    # trees zero-shot, not these at 8 records (docs/ranking.md). With relative columns each
    # warm-up row is read against its workload's warm-up records, as each donor row against
    # its workload's donor records.
    donor_rows = _summarized(donor)[:, :summary_width(devices=False)]
    warm_rows = summarize(rows)
    if settings.relative != "none":
        donor_rows = _relative_donor_rows(donor_rows, donor, settings.relative)
        warm_rows = relative_columns(warm_rows, workloads, settings.relative)
    return Corrector.fit(settings, rounds, rows, np.concatenate([donor[1], throughput]), seed,
                         blend, best, summary_rows=np.concatenate([donor_rows, warm_rows]),
                         general=True, relative=settings.relative,
                         row_weight=settings.row_weight)


def donor_trees(finetune: cfg.Finetune, donor: TreeRows, seed: int = 0) -> Corrector | None:
    """The donor's own throughput trees, which order its candidates of workloads it has no
    measurement of (zero-shot): those of the fine-tune rule's row for no warm-up, fitted on the
    donor's records alone, where that row's trees learn from them; else None. (Settings refuse
    donor_records without a blend, and a blend without rounds.)"""
    step = finetune.step_for(0)
    if not step.donor_records:
        return None
    relative = finetune.correction.relative
    rows = _summarized(donor)
    if relative != "none":
        rows = _relative_donor_rows(rows, donor, relative)
    return Corrector.fit(finetune.correction, step.correction, [], donor[1], seed, step.blend,
                         summary_rows=rows, general=True, device_columns=True,
                         relative=relative,
                         row_weight=finetune.correction.zero_shot_row_weight)


def _relative_donor_rows(rows: np.ndarray, donor: TreeRows, how: str) -> np.ndarray:
    """The donor's summarized `rows`, each read against its workload's records."""
    if donor[2] is None:
        raise CaloError("the donor's trees read each record against its workload's, and "
                        "the donor's records were kept without their workloads: re-run "
                        "`calo pretrain` with this version")
    return relative_columns(rows, donor[2], how)


def _summarized(donor: TreeRows) -> np.ndarray:
    """The donor's summarized rows, which must carry their devices."""
    if donor[0].shape[1] != summary_width(True):
        raise CaloError(f"the donor's records are kept {donor[0].shape[1]} columns wide, the "
                        f"trees read {summary_width(True)} (each program's device beside its "
                        "rows): re-run `calo pretrain` with this version")
    return donor[0]


def normalized_throughput(y: np.ndarray, workloads: Sequence[str]
                          ) -> tuple[dict[str, float], np.ndarray]:
    """Each workload's best log latency, and each record's throughput relative to it."""
    best: dict[str, float] = {}
    for w, v in zip(workloads, y):
        best[w] = min(best.get(w, math.inf), float(v))
    return best, np.exp(np.array([best[w] for w in workloads]) - y)


def tree_rows(graphs: Sequence[Data], workloads: Sequence[str]) -> TreeRows:
    """The donor's measured graphs (with store rows) as the throughput trees learn from them."""
    y = torch.cat([g.y for g in graphs]).double().numpy()
    index = {w: i for i, w in enumerate(dict.fromkeys(workloads))}
    return (summarize(store_rows(graphs), store_devices(graphs)),
            normalized_throughput(y, workloads)[1].astype(np.float32),
            np.array([index[w] for w in workloads], np.int32))
