"""All relations' SAGE mean aggregations of a typed multigraph in one pass."""

from __future__ import annotations

import torch
from torch import Tensor


class RelationSegments:
    """All relations' SAGE mean aggregations at once, over the (relation, target) pairs with edges.

    Equal to summing each relation's SAGEConv (mean aggregation, no root weight, no bias) with
    the same weights, but a node gets no work for a relation it has no edge of. Called per
    relation, SAGEConv aggregates, divides and transforms every node for all 2 x 4 relations; in
    a search population most of those rows are zeros and they were most of the forward time.
    The segments depend only on the graph, so they are built once and shared by the layers.
    """

    def __init__(self, edge_index: Tensor, edge_type: Tensor, num_nodes: int, num_relations: int):
        # Slots are the (relation, target) pairs with edges, sorted by relation, then by target:
        # counted over the dense pair space, in time linear in edges and pairs, rather than
        # sorting every edge's key (torch.unique) on each scoring call.
        key = edge_type * num_nodes + edge_index[1]
        edges_of = torch.bincount(key, minlength=num_relations * num_nodes)
        keys = edges_of.nonzero().squeeze(1)
        self.slot = (edges_of > 0).cumsum(0)[key] - 1
        self.source, self.target = edge_index[0], keys % num_nodes
        self.inv_count = (1.0 / edges_of[keys]).unsqueeze(-1)
        slots_per_relation = (edges_of.view(num_relations, num_nodes) > 0).sum(1)
        self.bounds = [0, *slots_per_relation.cumsum(0).tolist()]

    def aggregate(self, h: Tensor, weights: list[Tensor], out: Tensor) -> Tensor:
        """out + sum over relations r of W_r (mean of h over the r-neighbours), per node."""
        neighbours = h.index_select(0, self.source)
        mean = h.new_zeros(len(self.target), h.shape[1]).index_add_(0, self.slot, neighbours)
        if not torch.is_grad_enabled() and not torch.is_autocast_enabled(h.device.type):
            # Scoring: every relation's messages in one buffer, added to the nodes in one call.
            # Slots run relation by relation, so each node sums the same terms in the same order
            # as below, bit for bit, in fewer passes. `out=` has no gradient and is not cast
            # by autocast, hence two paths.
            messages = torch.empty_like(mean.mul_(self.inv_count))
            for w, lo, hi in zip(weights, self.bounds, self.bounds[1:]):
                torch.mm(mean[lo:hi], w.T, out=messages[lo:hi])
            return out.index_add_(0, self.target, messages)
        mean = mean * self.inv_count
        for w, lo, hi in zip(weights, self.bounds, self.bounds[1:]):
            out.index_add_(0, self.target[lo:hi], mean[lo:hi] @ w.T)
        return out
