"""Hyperparameter sweep on the donor: the paper's grid (lr x weight decay x evidence penalty).

Each setting trains a fresh model on the donor's training split, as pretrain does, in its own
MLflow run of the experiment `calo-sweep`; the best setting by validation NLL is reported.
Nothing is registered: pretrain with the chosen values in params.yaml does that. The same grid
also runs as DVC experiments, e.g. `dvc exp run --queue -S train.lr=5e-4 -S train.lam=2e-2`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import mlflow

from calo import config as cfg
from calo import registry
from calo.errors import CaloError
from calo.log import Progress, get_logger
from calo.tasks.pretrain import donor_splits, train_on_donor

AXES = ("lr", "weight_decay", "lam")


def sweep(settings: cfg.Settings) -> dict:
    grid = settings.sweep
    missing = [a for a in AXES if not getattr(grid, a)]
    if missing:
        raise CaloError(f"sweep: give at least one value for {', '.join(missing)}")
    train, val, test, calibration = donor_splits(settings)
    points = [dict(zip(AXES, values))
              for values in itertools.product(*(getattr(grid, a) for a in AXES))]
    progress = Progress("sweep", len(points), "settings", every=0)
    results = []
    with registry.start_run(settings, "sweep", f"sweep-{settings.donor}"):
        for setting in points:
            variant = settings.override({f"train.{k}": v for k, v in setting.items()})
            with mlflow.start_run(run_name=" ".join(f"{k}={v}" for k, v in setting.items()),
                                  nested=True):
                mlflow.log_params({**dataclasses.asdict(variant.train),
                                   "donor": settings.donor})
                _, metrics = train_on_donor(variant, train, val, test, calibration)
                mlflow.log_metrics(metrics)
            results.append({**setting, **metrics})
            progress.advance(note=f"val NLL {metrics['val_nll']:.3f}")
        best = min(results, key=lambda r: r["val_nll"] if not math.isnan(r["val_nll"])
                   else math.inf)
        mlflow.log_params({f"best_{a}": best[a] for a in AXES})
        mlflow.log_metrics({f"best_{k}": v for k, v in best.items() if k not in AXES})
    get_logger().info(f"sweep: best of {len(results)} by validation NLL: {best}")
    return {"best": best, "results": results}
