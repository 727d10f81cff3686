"""Training and inference loops for the evidential model (pure torch; progress via a callback)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Literal

import torch
from torch.utils.data import Sampler
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader

from calo.models.evidential import NIG, EvidentialSAGE, cost_loss, nig_nll

EpochCallback = Callable[[int, float, float], None]
GRAD_CLIP = 5.0  # max gradient norm: one wild batch of a small warm-up set cannot wreck the model


def _forward(model: EvidentialSAGE, batch) -> NIG:
    stores = (batch.store_rows, batch.store_rows_batch) if "store_rows" in batch else ()
    return model(batch.x, batch.edge_index, batch.edge_type, batch.batch, batch.num_graphs,
                 *stores)


def loader(graphs: Sequence[Data], **kwargs) -> DataLoader:
    """PyG's DataLoader, which also indexes each per-store feature row's graph."""
    return DataLoader(list(graphs), follow_batch=["store_rows"], **kwargs)


RankPairs = Literal["all", "workload"]
RankWeighting = Literal["uniform", "throughput"]
RankLoss = Literal["pairwise", "listwise"]
Batches = Literal["shuffled", "workload"]


def annotate_workloads(graphs: Sequence[Data], workloads: Sequence[str]) -> None:
    """Tag each graph with its workload's index (`group`) and its normalized throughput there
    (`throughput`: the workload's best latency / its latency), which ranking losses read."""
    index = {w: i for i, w in enumerate(dict.fromkeys(workloads))}
    best: dict[str, float] = {}
    for data, w in zip(graphs, workloads):
        best[w] = min(best.get(w, math.inf), data.y.item())
    for data, w in zip(graphs, workloads):
        data.group = torch.tensor([index[w]])
        data.throughput = torch.exp(best[w] - data.y)


class WorkloadBatches(Sampler):
    """Batches that each hold one workload's graphs, in a new random order every epoch: every
    pair in a batch is then a pair the tuner has to order."""

    def __init__(self, groups: Sequence[int], batch_size: int, generator: torch.Generator):
        self.members: dict[int, list[int]] = {}
        for i, g in enumerate(groups):
            self.members.setdefault(g, []).append(i)
        self.batch_size, self.generator = batch_size, generator

    def _batches(self) -> list[list[int]]:
        out = []
        for idx in self.members.values():
            order = torch.randperm(len(idx), generator=self.generator).tolist()
            out += [[idx[i] for i in order[k:k + self.batch_size]]
                    for k in range(0, len(idx), self.batch_size)]
        return [out[i] for i in torch.randperm(len(out), generator=self.generator).tolist()]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches())

    def __len__(self) -> int:
        return sum(math.ceil(len(m) / self.batch_size) for m in self.members.values())


def train_step(model: EvidentialSAGE, optimizer: torch.optim.Optimizer, batch, *, lam: float,
               rank_weight: float, rank_pairs: RankPairs = "all",
               rank_weighting: RankWeighting = "uniform", rank_loss: RankLoss = "pairwise",
               rank_sharpness: float = 1.0, fast_weight: float = 0.0) -> float:
    """One optimizer step on one batch, as pre-training, fine-tuning and online updates take it.

    A batch without workload tags (an online update: one workload's measurements) is one group,
    its throughput relative to its own best. `rank_sharpness` (listwise) is per unit of natural
    log latency; the loss sees standardized latencies, hence the factor y_std. `fast_weight`
    weighs each record's regression loss by 1 + fast_weight x its normalized throughput.
    """
    model.train()
    group = batch.group if rank_pairs == "workload" and "group" in batch else None
    throughput = (batch.throughput if "throughput" in batch
                  else torch.exp(batch.y.min() - batch.y))
    sharpness = rank_sharpness * model.y_std.item() if rank_loss == "listwise" else None
    loss = cost_loss(model.standardize(batch.y), _forward(model, batch), lam,
                     model.deterministic, rank_weight, group,
                     throughput if rank_weighting == "throughput" else None, sharpness,
                     1 + fast_weight * throughput if fast_weight else None)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
    return loss.item()


class Anchor:
    """Decoupled decay toward the weights a fine-tune started from (L2-SP) rather than toward
    zero: what the donor learned stays unless the warm-up records argue against it."""

    def __init__(self, model: EvidentialSAGE, strength: float) -> None:
        self.strength = strength
        self.start = {n: p.detach().clone() for n, p in model.named_parameters()}

    @torch.no_grad()
    def pull(self, model: EvidentialSAGE, lr: float) -> None:
        if self.strength <= 0:
            return
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.sub_(lr * self.strength * (p - self.start[name]))


@torch.no_grad()
def mean_nll(model: EvidentialSAGE, graphs: Sequence[Data], batch_size: int = 4096) -> float:
    """Mean NLL of the standardized targets."""
    model.eval()
    total, count = 0.0, 0
    for batch in loader(graphs, batch_size=batch_size):
        total += nig_nll(model.standardize(batch.y), _forward(model, batch)).sum().item()
        count += batch.num_graphs
    return total / max(count, 1)


def fit(
    model: EvidentialSAGE,
    train: Sequence[Data],
    val: Sequence[Data],
    *,
    lr: float,
    weight_decay: float,
    lam: float,
    batch_size: int,
    max_epochs: int,
    warmup_epochs: int = 1,
    patience: int | None = None,
    rank_weight: float = 0.0,
    rank_pairs: RankPairs = "all",
    rank_weighting: RankWeighting = "uniform",
    rank_loss: RankLoss = "pairwise",
    rank_sharpness: float = 1.0,
    fast_weight: float = 0.0,
    batches: Batches = "shuffled",
    workloads: Sequence[str] | None = None,
    seed: int = 0,
    anchor: float = 0.0,
    keep: Literal["best", "last"] = "best",
    on_epoch: EpochCallback | None = None,
) -> dict:
    """AdamW with linear warm-up then cosine decay; keeps the weights of the best validation NLL.

    patience=None trains all max_epochs (the fine-tune); otherwise stops after `patience` epochs
    without improvement. `workloads` names each training graph's workload: ranking within
    workloads and workload batches need them. `anchor` > 0 pulls the weights toward where they
    started (Anchor), for fine-tunes. keep="last" returns the last epoch's weights instead of
    the best validation NLL's (a fine-tune's validation set is a few records per workload).
    """
    torch.manual_seed(seed)
    train = list(train)
    if workloads is not None:
        train = [copy.copy(g) for g in train]  # the tags stay with this fit's copies
        annotate_workloads(train, workloads)
    elif rank_pairs == "workload" or batches == "workload":
        raise ValueError("workload pairs or batches need the training graphs' workloads")
    if batches == "workload":
        sampler = WorkloadBatches([g.group.item() for g in train], batch_size,
                                  torch.Generator().manual_seed(seed))
        batches_of = loader(train, batch_sampler=sampler)
    else:
        batches_of = loader(train, batch_size=batch_size, shuffle=True, drop_last=False)
    steps_per_epoch = max(len(batches_of), 1)
    total_steps = steps_per_epoch * max_epochs
    warmup_steps = steps_per_epoch * warmup_epochs

    def schedule(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
        return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                                  weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    pull = Anchor(model, anchor)
    best_nll, best_state, best_epoch, stale = math.inf, None, -1, 0
    history = []
    for epoch in range(max_epochs):
        running, seen = 0.0, 0
        for batch in batches_of:
            loss = train_step(model, optimizer, batch, lam=lam, rank_weight=rank_weight,
                              rank_pairs=rank_pairs, rank_weighting=rank_weighting,
                              rank_loss=rank_loss, rank_sharpness=rank_sharpness,
                              fast_weight=fast_weight)
            pull.pull(model, scheduler.get_last_lr()[0])
            scheduler.step()
            running += loss * batch.num_graphs
            seen += batch.num_graphs
        val_nll = mean_nll(model, val) if val else running / max(seen, 1)
        history.append({"epoch": epoch, "train_loss": running / max(seen, 1), "val_nll": val_nll})
        if on_epoch:
            on_epoch(epoch, running / max(seen, 1), val_nll)
        if val_nll < best_nll:
            best_nll, best_epoch, stale = val_nll, epoch, 0
            best_state = copy.deepcopy(model.state_dict())
        else:
            stale += 1
            if patience is not None and stale >= patience:
                break
    if best_state is not None and keep == "best":
        model.load_state_dict(best_state)
    kept = best_epoch if keep == "best" and best_state is not None else len(history) - 1
    return {"best_val_nll": best_nll, "best_epoch": best_epoch, "kept_epoch": kept,
            "epochs": len(history), "history": history}


@torch.no_grad()
def recenter(model: EvidentialSAGE, graphs: Sequence[Data]) -> float:
    """Move the model's latency scale so its mean prediction on `graphs` equals their mean
    label, and return the shift (natural log).

    A new device is mostly faster or slower across the board. Fitted in closed form before a
    fine-tune, that shift no longer drives the first gradient steps through every weight, and
    the steps that follow are left to what changes the order of candidates.
    """
    if not graphs:
        return 0.0
    shift = (torch.cat([g.y for g in graphs]) - predict(model, graphs).gamma).mean()
    model.y_mean += shift
    return shift.item()


@torch.no_grad()
def predict(model: EvidentialSAGE, graphs: Sequence[Data], batch_size: int = 4096) -> NIG:
    """NIG over natural-log seconds for each graph, in input order."""
    model.eval()
    parts = [model.to_log_latency(_forward(model, b))
             for b in loader(graphs, batch_size=batch_size)]
    return NIG(*(torch.cat([getattr(p, f) for p in parts]) for f in NIG._fields))
