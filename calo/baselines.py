"""TVM's own cost models (XGBoost, and the MLP), built and trained one way for every stage and
benchmark."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from tvm.s_tir import meta_schedule as ms

from calo.records import Record


def xgb_model(cores: int, warmup: bool = False) -> ms.cost_model.XGBModel:
    """XGBModel. With warmup, as tune_tir configures it: random scores until 100 measurements;
    without, its own predictions from the first measurement on (the stronger baseline)."""
    if warmup:
        return ms.cost_model.XGBModel(num_tuning_cores=cores)
    return ms.cost_model.XGBModel(num_warmup_samples=0, verbose_eval=10**6,
                                  num_tuning_cores=cores)


def train_on(model: ms.cost_model.XGBModel, context: ms.TuneContext,
             records: Sequence[Record]) -> ms.cost_model.XGBModel:
    """Feed measured records of one workload to the model, as tuning would."""
    if records:
        model.update(context, [r.record.as_measure_candidate() for r in records],
                     [ms.runner.RunnerResult(r.record.run_secs, None) for r in records])
    return model


def context_of(record: Record) -> ms.TuneContext:
    """The tuning context TVM's models featurize a record's workload in."""
    return ms.TuneContext(mod=record.record.workload.mod, target=record.record.target,
                          task_name=record.workload_name)


class _StepLR(torch.optim.lr_scheduler.StepLR):
    """StepLR that takes the `verbose` argument newer torch removed (MLPModel passes it)."""

    def __init__(self, *args, verbose=None, **kwargs):
        super().__init__(*args, **kwargs)


@contextlib.contextmanager
def mlp_training() -> Iterator[None]:
    """While TVM's MLPModel trains: its StepLR call works on this torch (nothing else changes)."""
    original = torch.optim.lr_scheduler.StepLR
    torch.optim.lr_scheduler.StepLR = _StepLR
    try:
        yield
    finally:
        torch.optim.lr_scheduler.StepLR = original
