"""Networks to tune end to end: three built in, or a user's `module:function`.

A network is a torch.nn.Module in eval mode and the example inputs it is exported with; the
batch size is the inputs' first dimension. Weights are random (seeded): latency does not depend
on their values. Shapes are small enough to tune on 2 cores in minutes.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn

from calo.errors import CaloError


class Network(NamedTuple):
    module: nn.Module
    inputs: tuple[Tensor, ...]


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions and a shortcut (projected when it strides)."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x: Tensor) -> Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    def __init__(self, width: int = 16, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.Sequential(BasicBlock(width, width), BasicBlock(width, 2 * width, 2))
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.blocks(self.stem(x)).mean(dim=(2, 3)))


class EncoderLayer(nn.Module):
    """A post-norm transformer encoder layer: self-attention, LayerNorm, GeLU MLP."""

    def __init__(self, dim: int = 64, heads: int = 4, ffn: int = 128):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(), nn.Linear(ffn, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = self.norm1(x + self.attn(x, x, x, need_weights=False)[0])
        return self.norm2(x + self.mlp(x))


class Recommender(nn.Module):
    """DLRM-style: dense features through a bottom MLP, sparse ids through embedding tables,
    everything concatenated into a top MLP that gives a click probability."""

    def __init__(self, dense: int = 13, tables: int = 3, rows: int = 1000, dim: int = 16):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(dense, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
        self.embeddings = nn.ModuleList(nn.Embedding(rows, dim) for _ in range(tables))
        self.top = nn.Sequential(nn.Linear(dim * (tables + 1), 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, dense: Tensor, sparse: Tensor) -> Tensor:
        parts = [self.bottom(dense)] + [e(sparse[:, i]) for i, e in enumerate(self.embeddings)]
        return torch.sigmoid(self.top(torch.cat(parts, dim=1)))


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def small_cnn(batch: int) -> Network:
    return Network(SmallResNet(), (torch.randn(batch, 3, 32, 32, generator=_generator(1)),))


def encoder(batch: int) -> Network:
    return Network(EncoderLayer(), (torch.randn(batch, 32, 64, generator=_generator(1)),))


def recommender(batch: int) -> Network:
    g = _generator(1)
    return Network(Recommender(), (torch.randn(batch, 13, generator=g),
                                   torch.randint(0, 1000, (batch, 3), generator=g)))


BUILT_IN: dict[str, Callable[[int], Network]] = {
    "small-cnn": small_cnn, "encoder": encoder, "recommender": recommender}


def check_spec(spec: str) -> None:
    """A built-in name or module:function; anything else is a CaloError naming the choices."""
    if spec not in BUILT_IN and ":" not in spec:
        raise CaloError(f"unknown network '{spec}': one of {', '.join(BUILT_IN)}, or "
                        "package.module:function returning (module, example inputs)")


def load_network(spec: str, batch: int, seed: int = 0) -> Network:
    """A built-in network by name, or `package.module:function` returning (module, inputs);
    a user's function is called with the batch size if it takes an argument."""
    if batch < 1:
        raise CaloError(f"--batch must be >= 1, got {batch}")
    torch.manual_seed(seed)  # the random weights
    check_spec(spec)
    net = BUILT_IN[spec](batch) if spec in BUILT_IN else _user_network(spec, batch)
    return Network(net.module.eval(), net.inputs)


def _user_network(spec: str, batch: int) -> Network:
    module_name, _, func_name = spec.partition(":")
    if os.getcwd() not in sys.path:  # as `python -m` would: the user's own package, from here
        sys.path.insert(0, os.getcwd())
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as err:
        raise CaloError(f"network '{spec}': cannot import it ({err})") from None
    result = func(batch) if inspect.signature(func).parameters else func()
    if (not isinstance(result, tuple) or len(result) != 2
            or not isinstance(result[0], nn.Module)):
        raise CaloError(f"network '{spec}' must return (torch.nn.Module, example inputs), got "
                        f"{type(result).__name__}")
    module, inputs = result
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    if not all(isinstance(t, Tensor) for t in inputs):
        raise CaloError(f"network '{spec}': example inputs must be tensors")
    return Network(module, inputs)
