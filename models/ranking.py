"""Ranking terms beside the evidential loss: within one workload, the faster candidate should
score lower (a tuner ranks one workload's candidates)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

_EPS = 1e-6


def pairwise_rank_loss(y: Tensor, pred: Tensor, group: Tensor | None = None,
                       throughput: Tensor | None = None, discount: bool = False) -> Tensor:
    """Logistic loss on ordered pairs: the faster schedule of a pair should score lower.

    The tuner ranks the candidates of one workload, so with `group` only pairs within a group
    count (a pair of a LayerNorm and a matmul teaches what the regression already knows). With
    `throughput` (best latency / latency, in (0, 1]) a pair weighs its difference in throughput:
    swapping the fastest candidate for a slow one costs the most, swapping two 1000x-slow ones
    next to nothing. With `discount` too, a pair also weighs the change in DCG's position
    discount, 1 / log2(1 + rank), were its two predicted ranks in its group swapped
    (LambdaRank): order among the candidates predicted fastest, which a search measures, costs
    more than order far down the list.
    """
    same = (torch.ones_like(y, dtype=torch.bool)[:, None] if group is None
            else group[:, None] == group[None, :])
    pairs = (y[:, None] < y[None, :]) & same
    if not pairs.any():
        return pred.sum() * 0.0
    loss = F.softplus(pred[:, None] - pred[None, :])[pairs]
    if throughput is None:
        return loss.mean()
    weight = (throughput[:, None] - throughput[None, :]).abs()
    if discount:
        rank = 1 + ((pred.detach()[None, :] < pred.detach()[:, None]) & same).sum(1)
        position = 1 / torch.log2(1 + rank.to(pred.dtype))
        weight = weight * (position[:, None] - position[None, :]).abs()
    weight = weight[pairs]
    return (loss * weight).sum() / weight.sum().clamp_min(_EPS)
