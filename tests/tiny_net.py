"""Networks for tests/test_tune_network.py, passed to the CLI as module:function."""

import torch
from torch import nn


def tiny(batch: int):
    """Two linear layers and a ReLU: two tasks with arithmetic, tuned in seconds."""
    module = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    return module, (torch.randn(batch, 16, generator=torch.Generator().manual_seed(0)),)


class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # control flow on a tensor's value: torch.export refuses it
            return x * 2
        return x


def does_not_export():
    return DataDependent(), (torch.randn(4),)
