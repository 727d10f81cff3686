"""Evidential GraphSAGE cost model: one forward pass gives a latency mean and its uncertainty.

The head outputs a Normal-Inverse-Gamma distribution (Amini et al., Deep Evidential Regression)
over the standardized log latency. Its marginal is a Student-t, so NLL, intervals and ECE all
come from closed forms; a temperature tau multiplies beta by tau^2, which scales every variance
(aleatoric, epistemic and predictive) by tau^2.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GCNConv, SAGEConv, TopKPooling, global_max_pool, global_mean_pool

from calo.models.ranking import pairwise_rank_loss
from calo.models.relations import RelationSegments

_EPS = 1e-6
# The deterministic head's fixed NIG: nu = 1, alpha = 50, beta = 25 is a near-Gaussian with unit
# scale in standardized units, so one global temperature is its whole variance model.
_DET_NU, _DET_ALPHA, _DET_BETA = 1.0, 50.0, 25.0
ENCODERS, POOLINGS, HEADS = ("sage", "gcn"), ("meanmax", "topk"), ("evidential", "deterministic")


class NIG(NamedTuple):
    gamma: Tensor  # mean
    nu: Tensor     # > 0, virtual observations of the mean
    alpha: Tensor  # > 1, so the variances exist
    beta: Tensor   # > 0

    @property
    def epistemic_var(self) -> Tensor:
        return self.beta / (self.nu * (self.alpha - 1))

    @property
    def aleatoric_var(self) -> Tensor:
        return self.beta / (self.alpha - 1)

    @property
    def df(self) -> Tensor:
        return 2 * self.alpha

    @property
    def t_scale(self) -> Tensor:
        """Scale of the Student-t predictive."""
        return torch.sqrt(self.beta * (1 + self.nu) / (self.nu * self.alpha))

    def scaled(self, tau: float) -> NIG:
        return NIG(self.gamma, self.nu, self.alpha, self.beta * tau**2)

    def affine(self, shift: Tensor | float, scale: Tensor | float) -> NIG:
        """The same distribution for y' = shift + scale * y."""
        return NIG(shift + scale * self.gamma, self.nu, self.alpha, self.beta * scale**2)


class EvidentialSAGE(nn.Module):
    """GraphSAGE over a typed multigraph, mean+max readout, NIG head.

    Each edge type is a relation in both directions, with its own SAGE aggregation; relations are
    summed with a shared root transform, as in a relational GNN. Variants for ablations: a GCN
    encoder, TopK pooling before the readout, attention across the candidates of a batch, and a
    deterministic head (a mean only, trained with MSE).
    """

    def __init__(self, num_features: int, num_edge_types: int, hidden: int = 64, layers: int = 2,
                 encoder: str = "sage", pooling: str = "meanmax", head: str = "evidential",
                 attention: bool = False, store_features: int = 0,
                 work_columns: tuple[int, int] | None = None):
        super().__init__()
        if encoder not in ENCODERS or pooling not in POOLINGS or head not in HEADS:
            raise ValueError(f"unknown variant: encoder={encoder!r} pooling={pooling!r} "
                             f"head={head!r}")
        self.deterministic = head == "deterministic"
        self.encoder = encoder
        # SAGE layers aggregate all relations in one pass (RelationSegments); off, each relation
        # runs its own SAGEConv: the same function, kept as the reference and for benchmarks.
        self.fuse_relations = encoder == "sage"
        self.num_edge_types = num_edge_types
        self.num_relations = 2 * num_edge_types
        # (is_block, log_extent) columns: with them the head predicts latency per iteration of
        # the program's largest block, and that work (fixed by the workload, not the schedule)
        # is added back, so training spends its capacity on the schedule, not the workload's size.
        self.work_columns = work_columns
        # Standardization statistics live with the weights so a saved model is self-contained.
        self.register_buffer("x_mean", torch.zeros(num_features))
        self.register_buffer("x_std", torch.ones(num_features))
        self.register_buffer("y_mean", torch.zeros(()))
        self.register_buffer("y_std", torch.ones(()))
        self.embed = nn.Linear(num_features, hidden)
        self.roots = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers))

        def conv() -> nn.Module:
            if encoder == "gcn":
                return GCNConv(hidden, hidden, add_self_loops=False, bias=False)
            return SAGEConv(hidden, hidden, root_weight=False, bias=False)

        self.convs = nn.ModuleList(
            nn.ModuleList(conv() for _ in range(self.num_relations)) for _ in range(layers))
        self.pool = TopKPooling(hidden, ratio=0.5) if pooling == "topk" else None
        # Cross-candidate attention: each candidate's embedding sees the others in its batch.
        self.attend = (nn.MultiheadAttention(2 * hidden, num_heads=4, batch_first=True)
                       if attention else None)
        # Per-store feature rows (0: none): an MLP per row, summed per program, read beside
        # the graph's readout.
        self.stores = None
        if store_features:
            self.register_buffer("s_mean", torch.zeros(store_features))
            self.register_buffer("s_std", torch.ones(store_features))
            self.stores = nn.Sequential(nn.Linear(store_features, hidden), nn.ReLU(),
                                        nn.Linear(hidden, hidden))
        readout = (3 if store_features else 2) * hidden
        self.head = nn.Sequential(nn.Linear(readout, hidden), nn.ReLU(), nn.Linear(hidden, 4))

    def forward(self, x: Tensor, edge_index: Tensor, edge_type: Tensor, batch: Tensor,
                num_graphs: int, stores: Tensor | None = None,
                stores_batch: Tensor | None = None) -> NIG:
        """NIG over the standardized log latency of each graph in the batch (stores: the
        per-store feature rows of every graph, stores_batch: the graph of each row)."""
        work = self.work(x, batch, num_graphs) if self.work_columns is not None else None
        h = F.relu(self.embed((x - self.x_mean) / self.x_std))
        edge_index = torch.cat([edge_index, edge_index.flip(0)], dim=1)
        edge_type = torch.cat([edge_type, edge_type + self.num_edge_types])
        if self.fuse_relations:
            segments = RelationSegments(edge_index, edge_type, len(h), self.num_relations)
        else:
            relations = [edge_index[:, edge_type == r] for r in range(self.num_relations)]
        for root, convs in zip(self.roots, self.convs):
            if self.fuse_relations:
                out = segments.aggregate(h, [conv.lin_l.weight for conv in convs], root(h))
            else:
                out = root(h)
                for conv, rel_edges in zip(convs, relations):
                    out = out + conv(h, rel_edges)
            h = F.relu(out) + h  # residual: keeps two layers from washing out node identity
        if self.pool is not None:
            h, _, _, batch, _, _ = self.pool(h, edge_index, batch=batch)
        pooled = torch.cat([global_mean_pool(h, batch, num_graphs),
                            global_max_pool(h, batch, num_graphs)], dim=-1)
        if self.stores is not None:
            if stores is None:
                raise ValueError("this model reads per-store features; the batch has none")
            rows = self.stores((stores - self.s_mean) / self.s_std)
            summed = rows.new_zeros(num_graphs, rows.shape[1]).index_add_(0, stores_batch, rows)
            pooled = torch.cat([pooled, summed], dim=-1)
        if self.attend is not None:
            seq = pooled.unsqueeze(0)
            pooled = pooled + self.attend(seq, seq, seq, need_weights=False)[0].squeeze(0)
        gamma, nu, alpha, beta = self.head(pooled).unbind(-1)
        if work is not None:
            gamma = gamma + work / self.y_std
        if self.deterministic:
            one = torch.ones_like(gamma)
            return NIG(gamma, one * _DET_NU, one * _DET_ALPHA, one * _DET_BETA)
        return NIG(gamma, F.softplus(nu) + _EPS, F.softplus(alpha) + 1 + _EPS,
                   F.softplus(beta) + _EPS)

    def work(self, x: Tensor, batch: Tensor | None = None, num_graphs: int = 1) -> Tensor:
        """ln(1 + iterations) of each graph's largest block, read from its log2(1 + x) extent
        column (0 without work_columns): the part of the log latency the head does not
        predict. x: raw node features."""
        if self.work_columns is None:
            return x.new_zeros(num_graphs)
        is_block, log_extent = self.work_columns
        size = torch.where(x[:, is_block] > 0, x[:, log_extent], 0.0) * math.log(2.0)
        batch = x.new_zeros(len(x), dtype=torch.long) if batch is None else batch
        return size.new_zeros(num_graphs).scatter_reduce(0, batch, size, "amax")

    def set_trainable(self, layers: str) -> None:
        """"head": only the evidential head adapts (the paper's stage-2 transfer); "all": all."""
        for name, param in self.named_parameters():
            param.requires_grad = layers == "all" or name.startswith("head.")

    def to_log_latency(self, out: NIG) -> NIG:
        """Map a standardized prediction back to natural-log seconds."""
        return out.affine(self.y_mean, self.y_std)

    def standardize(self, y: Tensor) -> Tensor:
        return (y - self.y_mean) / self.y_std

    def set_normalization(self, x: Tensor, y: Tensor, stores: Tensor | None = None) -> None:
        """y: what the head predicts, each graph's log latency less its work (self.work)."""
        self.set_moments((x.mean(0), x.std(0)), (y.mean(), y.std()),
                         None if stores is None else (stores.mean(0), stores.std(0)))

    def set_moments(self, x: tuple[Tensor, Tensor], y: tuple[Tensor, Tensor],
                    stores: tuple[Tensor, Tensor] | None = None) -> None:
        """Standardize with these (mean, std) pairs: set_normalization's, or ones accumulated
        over more graphs than fit in memory."""
        self.x_mean.copy_(x[0])
        self.x_std.copy_(x[1].nan_to_num(1.0).clamp_min(1e-3))
        if self.stores is not None:
            self.s_mean.copy_(stores[0])
            self.s_std.copy_(stores[1].nan_to_num(1.0).clamp_min(1e-3))
        self.y_mean.copy_(y[0])
        self.y_std.copy_(y[1].nan_to_num(1.0).clamp_min(1e-3))


def nig_nll(y: Tensor, d: NIG) -> Tensor:
    """Negative log-likelihood of y under the NIG marginal (a Student-t), per sample."""
    omega = 2 * d.beta * (1 + d.nu)
    return (0.5 * torch.log(math.pi / d.nu)
            - d.alpha * torch.log(omega)
            + (d.alpha + 0.5) * torch.log(d.nu * (y - d.gamma) ** 2 + omega)
            + torch.lgamma(d.alpha) - torch.lgamma(d.alpha + 0.5))


def evidential_loss(y: Tensor, d: NIG, lam: float, weight: Tensor | None = None) -> Tensor:
    """NIG NLL plus the evidence regularizer: confident (high-evidence) errors cost more.
    `weight`: per-sample weights (a weighted mean)."""
    evidence = 2 * d.nu + d.alpha
    return _mean(nig_nll(y, d) + lam * (y - d.gamma).abs() * evidence, weight)


def _mean(loss: Tensor, weight: Tensor | None) -> Tensor:
    return loss.mean() if weight is None else (loss * weight).sum() / weight.sum()


def cost_loss(y: Tensor, d: NIG, lam: float, deterministic: bool = False,
              rank_weight: float = 0.0, group: Tensor | None = None,
              throughput: Tensor | None = None, weight: Tensor | None = None,
              discount: bool = False) -> Tensor:
    """The training loss of a head variant, plus an optional pairwise ranking term. `weight`
    weighs each sample's regression loss (e.g. more on the fast end, which is what a search
    keeps)."""
    loss = (_mean((d.gamma - y).pow(2), weight) if deterministic
            else evidential_loss(y, d, lam, weight))
    if rank_weight:
        loss = loss + rank_weight * pairwise_rank_loss(y, d.gamma, group, throughput, discount)
    return loss
