"""Training and inference loops for the evidential model (pure torch; progress via a callback)."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, RandomSampler, Sampler
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
RankWeighting = Literal["uniform", "throughput", "lambda"]
Batches = Literal["shuffled", "workload"]


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
               rank_weighting: RankWeighting = "uniform", fast_weight: float = 0.0,
               forward: torch.nn.Module | None = None) -> float:
    """One optimizer step on one batch, as pre-training, fine-tuning and online updates take it.

    A batch without workload tags is one group, its throughput relative to its own best.
    `fast_weight` weighs each record's regression loss by 1 + fast_weight x its normalized
    throughput.
    `forward` runs the forward pass instead of the model (data parallel: its DDP wrapper).
    """
    model.train()
    batch = batch.to(model.y_std.device)
    group = batch.group if rank_pairs == "workload" and "group" in batch else None
    throughput = (batch.throughput if "throughput" in batch
                  else torch.exp(batch.y.min() - batch.y))
    loss = cost_loss(model.standardize(batch.y), _forward(forward or model, batch), lam,
                     model.deterministic, rank_weight, group,
                     throughput if rank_weighting != "uniform" else None,
                     1 + fast_weight * throughput if fast_weight else None,
                     discount=rank_weighting == "lambda")
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
    return loss.item()


class Anchor:
    """Decoupled decay toward the weights a fine-tune started from (L2-SP) rather than toward
    zero: what the donor learned stays unless the warm-up records argue against it."""

    def __init__(self, model: EvidentialSAGE) -> None:
        self.start = {n: p.detach().clone() for n, p in model.named_parameters()}

    @torch.no_grad()
    def pull(self, model: EvidentialSAGE, lr: float, strength: float) -> None:
        """Per step the distance to the start shrinks by lr * strength (0: no pull)."""
        if strength <= 0:
            return
        for name, p in model.named_parameters():
            if p.requires_grad:
                if self.start[name].device != p.device:  # the model moved to train elsewhere
                    self.start[name] = self.start[name].to(p.device)
                p.sub_(lr * strength * (p - self.start[name]))


def _eval_batches(model: EvidentialSAGE, graphs: Sequence[Data], batch_size: int,
                  window: int | None) -> Iterator:
    """Batches of the graphs in order on the model's device; a graph store's (anything with
    `windows`) read at least a batch, at most about `window` graphs (whole shards) at a time."""
    parts = (graphs.windows(max(window or 0, batch_size)) if hasattr(graphs, "windows")
             else [graphs])
    for part in parts:
        for batch in loader(part, batch_size=batch_size):
            yield batch.to(model.y_std.device)
        del part  # before the next window loads


@torch.no_grad()
def mean_nll(model: EvidentialSAGE, graphs: Sequence[Data], batch_size: int = 4096,
             window: int | None = None) -> float:
    """Mean NLL of the standardized targets (over every process's share when data parallel:
    each process scores graphs[rank::world])."""
    model.eval()
    rank, world = _rank_world()
    total, count = 0.0, 0
    for batch in _eval_batches(model, graphs[rank::world] if world > 1 else graphs, batch_size,
                               window):
        total += nig_nll(model.standardize(batch.y), _forward(model, batch)).sum().item()
        count += batch.num_graphs
    if world > 1:
        sums = torch.tensor([total, count], dtype=torch.float64)
        dist.all_reduce(sums)
        total, count = sums.tolist()
    return total / max(count, 1)


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch's CPU threads set to `threads` (None: left as they are), restored after."""
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class RankShare(Sampler):
    """This process's share of another batch sampler's batches when training data parallel:
    every process draws the same batches (same seed) and takes every world-th one, the same
    number each, so their gradient all-reduces pair up."""

    def __init__(self, batches: Sampler, rank: int, world: int):
        self.batches, self.rank, self.world = batches, rank, world

    def __iter__(self) -> Iterator[list[int]]:
        drawn = list(self.batches)
        return iter(drawn[self.rank::self.world][:len(drawn) // self.world])

    def __len__(self) -> int:
        return len(self.batches) // self.world


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
    fast_weight: float = 0.0,
    batches: Batches = "shuffled",
    workloads: Sequence[str] | None = None,
    seed: int = 0,
    anchor: float = 0.0,
    keep: Literal["best", "last"] = "best",
    device: str = "cpu",
    graphs_in_memory: int | None = None,
    threads: int | None = None,
    on_epoch: EpochCallback | None = None,
) -> dict:
    """AdamW with linear warm-up then cosine decay; keeps the weights of the best validation NLL.

    patience=None trains all max_epochs (the fine-tune); otherwise stops after `patience` epochs
    without improvement. `workloads` names each training graph's workload: ranking within
    workloads and workload batches need them. `anchor` > 0 pulls the weights toward where they
    started (Anchor), for fine-tunes. keep="last" returns the last epoch's weights instead of
    the best validation NLL's (a fine-tune's validation set is a few records per workload).

    Trains on `device` and returns the model where it was. A graph store's graphs (anything
    with `window_positions`, calo.graph_store) beyond `graphs_in_memory` are read a window of
    shards at a time, in a new random order every epoch. Inside torch.distributed (torchrun),
    every process takes its share of each epoch's batches (RankShare) and the gradients are
    averaged: the batch is batch_size per process.

    `threads`: torch's CPU threads while training (None: as they are; under torchrun at most
    the process's share of the cores). The order of a parallel reduction's partial sums follows
    the thread count, so the same data and seed train other weights at another count.
    """
    torch.manual_seed(seed)
    if workloads is None and (rank_pairs == "workload" or batches == "workload"):
        raise ValueError("workload pairs or batches need the training graphs' workloads")
    rank, world = _rank_world()
    if threads is not None and world > 1:
        threads = min(threads, torch.get_num_threads())
    windowed = (graphs_in_memory is not None and hasattr(train, "window_positions")
                and len(train) > graphs_in_memory)
    resident = None if windowed else list(train)
    tags = _workload_tags(train, workloads) if workloads is not None else {}
    generator = torch.Generator().manual_seed(seed)

    def epoch_batches() -> Iterator:
        """This epoch's batches: of the graphs in memory, or of each window in turn."""
        parts = ([np.arange(len(train))] if not windowed
                 else train.window_positions(graphs_in_memory, generator))
        for positions in parts:
            graphs = ([resident[i] for i in positions] if resident is not None
                      else list(train.subset(positions)))
            if tags:
                graphs = _tagged(graphs, tags, positions)
            yield from _batches_of(graphs, batches, batch_size, generator, rank, world)
            del graphs  # this window's shards go before the next window's load

    n_workloads = len(set(workloads)) if workloads is not None else 1
    windows = math.ceil(len(train) / graphs_in_memory) if windowed else 1
    steps_per_epoch = max((math.ceil(len(train) / batch_size)
                           + (n_workloads * windows if batches == "workload" else 0)) // world, 1)
    if not windowed and world == 1:  # exact: the resident batches are fixed in number
        steps_per_epoch = max(_count_batches(resident, batches, batch_size, tags), 1)
    total_steps = steps_per_epoch * max_epochs
    warmup_steps = steps_per_epoch * warmup_epochs

    def schedule(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
        return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    home = model.y_std.device
    model.to(device)
    wrapper = (torch.nn.parallel.DistributedDataParallel(model)
               if world > 1 else None)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                                  weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    pull = Anchor(model) if anchor > 0 else None
    best_nll, best_state, best_epoch, stale = math.inf, None, -1, 0
    history, trained_graphs, train_secs = [], 0, 0.0
    with torch_threads(threads):
        for epoch in range(max_epochs):
            running, seen = 0.0, 0
            started = time.perf_counter()
            for batch in epoch_batches():
                loss = train_step(model, optimizer, batch, lam=lam, rank_weight=rank_weight,
                                  rank_pairs=rank_pairs, rank_weighting=rank_weighting,
                                  fast_weight=fast_weight, forward=wrapper)
                if pull:
                    pull.pull(model, scheduler.get_last_lr()[0], anchor)
                scheduler.step()
                running += loss * batch.num_graphs
                seen += batch.num_graphs
            train_secs += time.perf_counter() - started
            trained_graphs += seen
            val_nll = (mean_nll(model, val, window=graphs_in_memory) if val
                       else running / max(seen, 1))
            history.append({"epoch": epoch, "train_loss": running / max(seen, 1),
                            "val_nll": val_nll})
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
    model.to(home)
    kept = best_epoch if keep == "best" and best_state is not None else len(history) - 1
    return {"best_val_nll": best_nll, "best_epoch": best_epoch, "kept_epoch": kept,
            "epochs": len(history), "history": history,
            "graphs_per_s": trained_graphs * world / max(train_secs, 1e-9)}


def _workload_tags(train: Sequence[Data], workloads: Sequence[str]) -> dict[str, torch.Tensor]:
    """Each training graph's workload index (`group`) and normalized throughput there (best
    latency of its workload / its latency), from the labels alone (a store's, unloaded)."""
    y = (train.y if hasattr(train, "window_positions")
         else torch.cat([g.y for g in train]) if len(train) else torch.zeros(0))
    groups, count = _codes(workloads)
    best = torch.full((count,), math.inf).scatter_reduce(0, groups, y, "amin")
    return {"group": groups, "throughput": torch.exp(best[groups] - y)}


def _codes(names: Sequence[str]) -> tuple[torch.Tensor, int]:
    """Each name's index among the distinct names (in order of first appearance), and how
    many there are."""
    index = {name: i for i, name in enumerate(dict.fromkeys(names))}
    return torch.tensor([index[name] for name in names], dtype=torch.long), len(index)


def _tagged(graphs: Sequence[Data], tags: dict[str, torch.Tensor],
            positions: Sequence[int]) -> list[Data]:
    """Copies of graphs carrying their tags (each graph's slice of every tensor in `tags`)."""
    out = [copy.copy(g) for g in graphs]
    for g, i in zip(out, positions):
        for name, values in tags.items():
            g[name] = values[i:i + 1]
    return out


def workload_batches(graphs: Sequence[Data], workloads: Sequence[str], batch_size: int,
                     batches: Batches, generator: torch.Generator) -> DataLoader:
    """fit's batches of graphs in memory, tagged by workload as fit tags them; each pass over
    the loader is a new random epoch. An online update's: the records a search measured, over
    as many tuning tasks as it has (a network's), ranked within each task."""
    tagged = _tagged(graphs, _workload_tags(graphs, workloads), range(len(graphs)))
    return _batches_of(tagged, batches, batch_size, generator, 0, 1)


def _sampler(graphs: list[Data], batches: Batches, batch_size: int, generator: torch.Generator
             ) -> Sampler:
    if batches == "workload":
        return WorkloadBatches([g.group.item() for g in graphs], batch_size, generator)
    return BatchSampler(RandomSampler(graphs, generator=generator), batch_size, drop_last=False)


def _batches_of(graphs: list[Data], batches: Batches, batch_size: int,
                generator: torch.Generator, rank: int, world: int) -> DataLoader:
    sampler = _sampler(graphs, batches, batch_size, generator)
    return loader(graphs, batch_sampler=RankShare(sampler, rank, world) if world > 1 else sampler)


def _count_batches(graphs: list[Data], batches: Batches, batch_size: int, tags) -> int:
    if batches == "workload":
        return sum(math.ceil(n / batch_size) for n in tags["group"].bincount().tolist() if n)
    return math.ceil(len(graphs) / batch_size)


@torch.no_grad()
def predict(model: EvidentialSAGE, graphs: Sequence[Data], batch_size: int = 4096,
            window: int | None = None) -> NIG:
    """NIG over natural-log seconds for each graph, in input order (on the CPU)."""
    model.eval()
    parts = [model.to_log_latency(_forward(model, b))
             for b in _eval_batches(model, graphs, batch_size, window)]
    return NIG(*(torch.cat([getattr(p, f).cpu() for p in parts]) for f in NIG._fields))
