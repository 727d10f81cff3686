"""The device correction: a small boosted ensemble on the graph model's residuals.

The graph model carries what transfers from the donor; once a new device has a few dozen
measured records per workload, they also say where it is wrong there. A gradient-boosted
ensemble fits those residuals (measured minus predicted log latency) from TVM's per-store
features, the inputs TVM's own XGBModel learns quickly from, each program summarized by the
sum and the maximum of its store rows. It shifts the predicted mean only: the variance stays
the evidential head's. The fine-tune rule says how many boosting rounds a warm-up of a given
size gets (0: none); the rest of its settings are `finetune.correction` in params.yaml.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch_geometric.data import Data

from calo import config as cfg
from calo import store_features
from calo.errors import CaloError
from calo.models.evidential import EvidentialSAGE
from calo.models.training import predict

if TYPE_CHECKING:
    import xgboost


def summarize(rows: Sequence) -> np.ndarray:
    """[programs, 2 x NUM_FEATURES]: each program's per-store rows summed, then maxed."""
    width = store_features.NUM_FEATURES
    out = np.zeros((len(rows), 2 * width), np.float32)
    for i, r in enumerate(rows):
        r = np.asarray(r, np.float32)
        if len(r):
            out[i, :width], out[i, width:] = r.sum(0), r.max(0)
    return out


class Corrector:
    def __init__(self, booster: xgboost.XGBRegressor):
        self.booster = booster

    @classmethod
    def fit(cls, settings: cfg.Correction, rounds: int, rows: Sequence, residual: np.ndarray,
            seed: int = 0) -> Corrector:
        """Boosted trees fitted to `residual` (log latency) from each program's store `rows`."""
        import xgboost  # with sklearn, over a second of every stage's start-up: only here

        booster = xgboost.XGBRegressor(
            n_estimators=rounds, max_depth=settings.depth, learning_rate=settings.lr,
            min_child_weight=settings.min_child_weight, subsample=settings.subsample,
            colsample_bytree=settings.subsample, random_state=seed, n_jobs=settings.threads)
        booster.fit(summarize(rows), np.asarray(residual, np.float32))
        return cls(booster)

    def shift(self, rows: Sequence) -> np.ndarray:
        """The correction to add to each program's predicted mean log latency."""
        if not len(rows):
            return np.zeros(0)
        return self.booster.predict(summarize(rows)).astype(np.float64)

    def save(self, path: Path) -> None:
        self.booster.save_model(path)

    @classmethod
    def load(cls, path: Path) -> Corrector:
        import xgboost

        booster = xgboost.XGBRegressor()
        booster.load_model(path)
        return cls(booster)


def store_rows(graphs: Sequence[Data]) -> list:
    """Each graph's per-store rows, which the correction reads; graphs extracted without them
    are refused in one line."""
    if graphs and "store_rows" not in graphs[0]:
        raise CaloError("the residual correction reads per-store features these graphs lack: "
                        "re-run `calo extract` with the params.yaml whose finetune.rule asks "
                        "for it")
    return [g.store_rows for g in graphs]


def fit_residuals(net: EvidentialSAGE, settings: cfg.Correction, rounds: int,
                  graphs: Sequence[Data], seed: int = 0) -> Corrector | None:
    """The correction of `net`'s mean on measured graphs (with store rows), or None for 0
    rounds."""
    if rounds <= 0 or not graphs:
        return None
    rows = store_rows(graphs)
    y = torch.cat([g.y for g in graphs]).numpy()
    residual = y - predict(net, list(graphs)).gamma.numpy()
    return Corrector.fit(settings, rounds, rows, residual, seed)
