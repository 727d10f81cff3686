"""CALO-GNN as a Meta-Schedule cost model, with the uncertainty-decaying UCB rule (UEC-UCB).

Meta-Schedule keeps the candidates with the highest scores, so a candidate's score is its
optimistic latency bound, exp(-(mu - kappa_t * sigma)), relative to the best bound of the
round's first scoring, so that every generation of one search round is scored on one scale.
mu and sigma are the calibrated mean and epistemic standard deviation of the log latency, and
kappa_t = c / sqrt(t + offset) decays with the tuning round t (one round per `update`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import tvm_ffi
from torch_geometric.data import Data
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.cost_model import PyCostModel

from calo import config as cfg
from calo import store_features
from calo.artifact import TrainedModel
from calo.compute import training_device
from calo.correction import fit_correction
from calo.dataset import collate, collate_union, device_row, to_data
from calo.graphs import of_candidates, union_of_candidates
from calo.memory import keep_freed_memory
from calo.models.training import Anchor, torch_threads, train_step, workload_batches
from calo.records import latency_of, target_key
from calo.schedule_graph import ScheduleGraph, device_of

ONLINE_STATE = "online.pt"   # beside the artifact: round and measured graphs of this search
# Graphs and per-store rows kept per search, by program (its structural hash), for the online
# update's measured candidates and for scoring where the Python walker runs: a mutation often
# lands on a program an earlier generation or round already scored, and hashing a program costs
# far less than the Python walker's extraction (not than the native walker's: with it, scoring
# walks every candidate and keeps nothing). Bounded so a long search cannot grow without limit
# (a few KB per program).
MAX_CACHED_PROGRAMS = 50_000
# Scores are exp(reference - bound); the exponent is clipped so that no score overflows.
MAX_LOG_SCORE = 300.0


def _targets(context) -> set[str]:
    """The search's target as records.target_key names it (none without a target)."""
    return {target_key(context.target)} if context.target is not None else set()


@derived_object
class CaloCostModel(PyCostModel):
    def __init__(self, trained: TrainedModel, *, kappa_c: float, kappa_offset: float,
                 update_steps: int, finetune: cfg.Finetune, train: cfg.Train,
                 constant_kappa: float | None = None, seed: int = 0, correct_top: int = 0,
                 trees: bool = True):
        super().__init__()
        keep_freed_memory()   # scoring's tensors would otherwise fault their pages in every call
        self.trained = trained
        self.model = trained.net
        self.kappa_c, self.kappa_offset, self.constant_kappa = kappa_c, kappa_offset, constant_kappa
        self.update_steps, self.finetune, self.train = update_steps, finetune, train
        self.correct_top = correct_top
        self.trees = trees  # score with the rule's trees (calo.correction) and refit them
        self.step: cfg.FinetuneStep | None = None   # the fine-tune rule's row now in use
        self.optimizer: torch.optim.Optimizer | None = None
        self.round = 0
        self.measured: list = []
        self.tasks: list[str] = []  # the tuning task of each measured graph
        self.generator = torch.Generator().manual_seed(seed)
        self.graphs_of: dict[int, ScheduleGraph] = {}   # structural hash of a program -> graph
        self.store_rows_of: dict[int, np.ndarray] = {}  # ... -> its per-store rows
        self.anchor = Anchor(self.model)  # the weights tuning started from
        # Best bound of each task's first scoring since the last update, by task name.
        self.reference: dict[str, float] = {}
        # Per task, the summarized rows of the candidates it first scored with trees that read
        # rows against their workload's (Corrector.relative): every later generation is read
        # against the same ones, so a candidate scores alike in each.
        self.tree_reference: dict[str, np.ndarray] = {}

    @classmethod
    def from_settings(cls, trained: TrainedModel, settings: cfg.Settings,
                      **overrides) -> CaloCostModel:
        """The tuning model as params.yaml configures it (overrides: ablations)."""
        tune = settings.tune
        kwargs = dict(kappa_c=tune.kappa_c, kappa_offset=tune.kappa_offset,
                      update_steps=tune.update_steps, finetune=settings.finetune,
                      train=settings.train, seed=tune.seed, correct_top=tune.correct_top,
                      trees=tune.trees)
        return cls(trained, **{**kwargs, **overrides})

    def kappa(self) -> float:
        if self.constant_kappa is not None:
            return self.constant_kappa
        return self.kappa_c / math.sqrt(self.round + self.kappa_offset)

    def save(self, path: str) -> None:
        """The whole state: the artifact (weights, config, temperature) and what this search
        measured, so a loaded model scores and updates exactly as this one would."""
        self.trained.save(Path(path))
        torch.save({"round": self.round, "measured": [g.to_dict() for g in self.measured],
                    "tasks": self.tasks,
                    "tree_reference": {task: torch.from_numpy(rows)
                                       for task, rows in self.tree_reference.items()}},
                   Path(path) / ONLINE_STATE)

    def load(self, path: str) -> None:
        loaded = TrainedModel.load(Path(path))
        self.model.load_state_dict(loaded.net.state_dict())
        self.trained.temperature = loaded.temperature
        self.trained.correction = loaded.correction
        state_file = Path(path) / ONLINE_STATE
        if state_file.is_file():
            state = torch.load(state_file, weights_only=True)
            self.round = state["round"]
            self.measured = [Data(**fields) for fields in state["measured"]]
            self.tasks = state.get("tasks", [""] * len(self.measured))  # older states: one task
            self.tree_reference = {task: rows.numpy()
                                   for task, rows in state.get("tree_reference", {}).items()}

    def update(self, context, candidates, results) -> None:
        """Learn from the round's measurements with a bounded number of gradient steps."""
        secs = [latency_of(res) if res.error_msg is None else None for res in results]
        ok = [(cand, s) for cand, s in zip(candidates, secs) if s is not None]
        graphs = self.featurize(context, [cand for cand, _ in ok], self.learns_stores)
        self.measured += [to_data(g, math.log(secs)) for g, (_, secs) in zip(graphs, ok)]
        # A state saved before graphs kept their device holds this search's records without
        # it; one batch must not mix graphs with and without it.
        for g in self.measured:
            if "store_rows" in g and "store_device" not in g:
                g.store_device = device_row(device_of(context.target))
        self.tasks += [str(context.task_name)] * len(ok)
        self.round += 1
        self.reference.clear()  # kappa and (below) the weights change: a new scale
        if not self.measured or self.update_steps <= 0:
            return
        # The warm-up fine-tune's rule, at the records per task this search has measured (a
        # network's search measures many tasks), for its device: one the model has learned, or
        # a new one.
        per_task = len(self.measured) / len(set(self.tasks))
        step = self.finetune.step_for(per_task, self.trained.trained_on(_targets(context)),
                                      self.train.fast_weight)
        if step != self.step:
            self.step = step
            self.model.set_trainable(step.layers)
            self.optimizer = torch.optim.AdamW(
                [p for p in self.model.parameters() if p.requires_grad], lr=step.lr,
                weight_decay=self.train.weight_decay)
        # Batches and ranking pairs as the fine-tune draws them: within one task, its throughput
        # relative to the task's best, never one task's kernels ranked against another's.
        batches = workload_batches(self.measured, self.tasks, self.finetune.batch_size,
                                   self.train.batches, self.generator)
        self.model.to(training_device(self.train.device))  # scoring stays on the CPU
        steps = 0
        with torch_threads(self.train.threads):
            while steps < self.update_steps:
                for batch in batches:
                    train_step(self.model, self.optimizer, batch, lam=self.train.lam,
                               rank_weight=self.train.rank_weight,
                               rank_pairs=self.train.rank_pairs,
                               rank_weighting=self.finetune.weighting(self.train),
                               fast_weight=step.fast_weight)
                    self.anchor.pull(self.model, step.lr, step.anchor)
                    steps += 1
                    if steps >= self.update_steps:
                        break
        self.model.to("cpu")
        self.model.eval()
        if self.trees and step.correction > 0:  # refitted to this search's records
            self.trained.correction = fit_correction(self.model, self.finetune.correction,
                                                     step.correction, self.measured, self.tasks,
                                                     self.train.seed, step.blend,
                                                     self.trained.rows_for(step))

    @property
    def learns_stores(self) -> bool:
        """Measured candidates keep their store rows: the network reads them, or the rule
        refits a correction on them."""
        return self.trained.reads_stores or (self.trees and self.finetune.corrects)

    def scores_with_trees(self, context) -> bool:
        """The correction takes part in this task's scores: on, fitted, and ordering this
        task (Corrector.orders), as the offline evaluation orders it."""
        c = self.trained.correction
        return self.trees and c is not None and c.orders(str(context.task_name))

    def featurize(self, context, candidates, stores: bool | None = None
                  ) -> list[ScheduleGraph]:
        """Graphs of candidates, with per-store features where the network (or `stores`)
        asks; each program's extracted once per search."""
        keys = program_keys(candidates)
        graphs = cached(self.graphs_of, keys, candidates, lambda missing: of_candidates(
            self.trained.graph_kind, context.mod, context.target, missing))
        if self.trained.reads_stores if stores is None else stores:
            rows = self.store_rows(context, candidates, keys)
            device = device_of(context.target)
            graphs = [dataclasses.replace(g, stores=r, device=device) for g, r in zip(graphs, rows)]
        return graphs

    def store_rows(self, context, candidates, keys: list[int] | None = None
                   ) -> list[np.ndarray]:
        """TVM's per-store rows of candidates, each program's extracted once per search."""
        return cached(self.store_rows_of, keys or program_keys(candidates), candidates,
                      lambda missing: store_features.of_candidates(context.mod, context.target,
                                                                   missing))

    @torch.inference_mode()
    def predict(self, context, candidates) -> np.ndarray:
        if not candidates:
            return np.zeros(0, dtype=np.float64)
        self.model.eval()
        trees = self.scores_with_trees(context)
        batch, graphs = self.batch(context, candidates, trees)
        d = self.model.to_log_latency(self.model(*batch))
        d = d.scaled(self.trained.temperature)
        mean = d.gamma.double().numpy()
        bound = mean - self.kappa() * d.epistemic_var.sqrt().double().numpy()
        if trees:
            bound = self.corrected(context, candidates, graphs, mean, bound)
        # TVM's evolutionary search keeps the best-scored candidates of all its generations in
        # one heap: scored relative to each call's own best, every generation's best would tie
        # at 1, whatever its bound, and the heap would fill with the last generation's
        # near-copies of one parent.
        ref = self.reference.setdefault(str(context.task_name), float(bound.min()))
        return np.exp(np.clip(ref - bound, -MAX_LOG_SCORE, MAX_LOG_SCORE))

    def batch(self, context, candidates, trees: bool = False
              ) -> tuple[tuple, list[ScheduleGraph] | None]:
        """The network's input for candidates, and their graphs where the correction needs
        them. A network of graphs alone gets the native walker's concatenated graphs, every
        candidate walked again: that costs less than hashing the programs to find the graphs
        already made. The correction's store rows are extracted for its drafts only
        (corrected())."""
        if not self.trained.reads_stores and not trees:
            union = union_of_candidates(self.trained.graph_kind, context.target, candidates)
            if union is not None:
                return collate_union(union), None
        graphs = self.featurize(context, candidates)
        return collate(graphs), graphs

    def corrected(self, context, candidates, graphs, mean: np.ndarray, bound: np.ndarray
                  ) -> np.ndarray:
        """The bounds moved as the correction moves the means (or reorders them): on every
        candidate where the network reads store rows or correct_top is 0, else on the
        network's best correct_top (the drafts), the rest shifted by the largest of their moves
        so that no draft falls behind a candidate the correction never saw. Rows the graphs
        carry are used, not extracted."""
        k = self.correct_top
        top = (np.arange(len(candidates)) if self.trained.reads_stores
               or not 0 < k < len(candidates) else np.argsort(bound, kind="stable")[:k])
        rows = ([graphs[i].stores for i in top] if graphs[0].stores is not None else
                self.store_rows(context, [candidates[i] for i in top]))
        correction, task = self.trained.correction, str(context.task_name)
        devices = device_row(device_of(context.target)).numpy().repeat(len(top), 0)
        reference = None
        if correction.relative != "none":
            if task not in self.tree_reference:  # summarized once, on the task's first call
                self.tree_reference[task] = correction.summary_of(rows, devices)
            reference = {task: self.tree_reference[task]}
        drafts = correction.adjust(mean[top], rows, [task] * len(top), devices,
                                   reference) - mean[top]
        out = bound + drafts.max()
        out[top] = bound[top] + drafts
        return out


def program_keys(candidates) -> list[int]:
    return [tvm_ffi.structural_hash(c.sch.mod) for c in candidates]


def cached(cache: dict, keys: list[int], candidates: list, compute: Callable[[list], list]
           ) -> list:
    """cache[key] for each candidate's key, computing those missing in one call (a program
    that appears twice among them once); the cache is emptied when it would outgrow
    MAX_CACHED_PROGRAMS."""
    missing = {k: c for k, c in zip(keys, candidates) if k not in cache}
    found = dict(zip(missing, compute(list(missing.values())))) if missing else {}
    out = [cache[k] if k in cache else found[k] for k in keys]
    if len(cache) + len(found) > MAX_CACHED_PROGRAMS:
        cache.clear()
    cache.update(found)
    return out
