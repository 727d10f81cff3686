"""CALO-GNN as a Meta-Schedule cost model, with the uncertainty-decaying UCB rule (UEC-UCB).

Meta-Schedule keeps the candidates with the highest scores, so a candidate's score is its
optimistic latency bound, exp(-(mu - kappa_t * sigma)), shifted so the best candidate scores 1.
mu and sigma are the calibrated mean and epistemic standard deviation of the log latency, and
kappa_t = c / sqrt(t + offset) decays with the tuning round t (one round per `update`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch_geometric.loader import DataLoader
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.cost_model import PyCostModel

from calo.dataset import collate, to_data
from calo.graphs import of_candidate
from calo.records import latency_of
from calo.schedule_graph import ScheduleGraph
from models.evidential import EvidentialSAGE, cost_loss


@derived_object
class CaloCostModel(PyCostModel):
    def __init__(self, model: EvidentialSAGE, temperature: float, *, graph_kind: str,
                 kappa_c: float,
                 kappa_offset: float, update_steps: int, update_lr: float, lam: float,
                 rank_weight: float = 0.0, head_only: bool = False, batch_size: int = 64,
                 constant_kappa: float | None = None, seed: int = 0):
        super().__init__()
        self.model = model
        self.temperature = temperature
        self.graph_kind = graph_kind
        self.kappa_c, self.kappa_offset, self.constant_kappa = kappa_c, kappa_offset, constant_kappa
        self.update_steps, self.lam, self.batch_size = update_steps, lam, batch_size
        self.rank_weight = rank_weight
        if head_only:
            # Online rounds see a few dozen records of one task: adapting only the head keeps
            # the donor's encoder, as the warm-up fine-tune does.
            model.freeze_encoder()
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                           lr=update_lr)
        self.round = 0
        self.measured: list = []
        self.generator = torch.Generator().manual_seed(seed)

    def kappa(self) -> float:
        if self.constant_kappa is not None:
            return self.constant_kappa
        return self.kappa_c / math.sqrt(self.round + self.kappa_offset)

    def load(self, path: str) -> None:
        self.model.load_state_dict(torch.load(path, weights_only=True))

    def save(self, path: str) -> None:
        torch.save(self.model.state_dict(), path)

    def update(self, context, candidates, results) -> None:
        """Learn from the round's measurements with a bounded number of gradient steps."""
        secs = [latency_of(res) if res.error_msg is None else None for res in results]
        ok = [(cand, s) for cand, s in zip(candidates, secs) if s is not None]
        graphs = self.featurize([cand for cand, _ in ok])
        self.measured += [to_data(g, math.log(secs)) for g, (_, secs) in zip(graphs, ok)]
        self.round += 1
        if not self.measured or self.update_steps <= 0:
            return
        loader = DataLoader(self.measured, batch_size=self.batch_size, shuffle=True,
                            generator=self.generator)
        self.model.train()
        steps = 0
        while steps < self.update_steps:
            for batch in loader:
                out = self.model(batch.x, batch.edge_index, batch.edge_type, batch.batch,
                                 batch.num_graphs)
                loss = cost_loss(self.model.standardize(batch.y), out, self.lam,
                                 self.model.deterministic, self.rank_weight)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                steps += 1
                if steps >= self.update_steps:
                    break
        self.model.eval()

    def featurize(self, candidates) -> list[ScheduleGraph]:
        return [of_candidate(self.graph_kind, c) for c in candidates]

    @torch.inference_mode()
    def predict(self, context, candidates) -> np.ndarray:
        if not candidates:
            return np.zeros(0, dtype=np.float64)
        self.model.eval()
        d = self.model.to_log_latency(self.model(*collate(self.featurize(candidates))))
        d = d.scaled(self.temperature)
        bound = (d.gamma - self.kappa() * d.epistemic_var.sqrt()).double().numpy()
        return np.exp(-(bound - bound.min()))
