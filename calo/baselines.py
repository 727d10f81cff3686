"""TVM's own cost models (XGBoost, and the MLP), built and trained one way for every stage and
benchmark."""

from __future__ import annotations

import contextlib
import copy
import random
import tempfile
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import torch
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.utils import shash2hex

from calo.records import Record


def xgb_model(cores: int, warmup: bool = False) -> ms.cost_model.XGBModel:
    """XGBModel. With warmup, as tune_tir configures it: random scores until 100 measurements;
    without, its own predictions from the first measurement on (the stronger baseline)."""
    if warmup:
        return ms.cost_model.XGBModel(num_tuning_cores=cores)
    return ms.cost_model.XGBModel(num_warmup_samples=0, verbose_eval=10**6,
                                  num_tuning_cores=cores)


def _as_measured(records: Sequence[Record]) -> tuple[list, list]:
    """Records as the candidates and runner results TVM's cost models are updated with."""
    return ([r.record.as_measure_candidate() for r in records],
            [ms.runner.RunnerResult(r.record.run_secs, None) for r in records])


def _group_key(group: Sequence[Record], i: int, tag: str = "") -> str:
    """A group's own key: TVM's models key groups by the workload's module alone, so one
    workload's records on two devices would share one best latency."""
    return f"{shash2hex(group[0].record.workload.mod)}/{tag}{i}"


def train_on(model: ms.cost_model.XGBModel, context: ms.TuneContext,
             records: Sequence[Record]) -> ms.cost_model.XGBModel:
    """Feed measured records of one workload to the model, as tuning would."""
    if records:
        model.update(context, *_as_measured(records))
    return model


def train_on_groups(model: ms.cost_model.XGBModel,
                    groups: Sequence[Sequence[Record]]) -> ms.cost_model.XGBModel:
    """Feed measured records of several workloads (one group each, normalized on its own),
    then train once on all.

    Fed group by group, XGBModel retrains only when its data grew by a fifth since it last
    trained, so it can end untrained on the last groups (the warm-up records, fed after a
    donor's): training is held off until the last group, then done once on every record.
    """
    groups = [g for g in groups if g]
    model.adaptive_training = True  # TVM's rule: skip while data_size - last < last / 5
    for i, group in enumerate(groups):
        model.last_train_size = 0 if i == len(groups) - 1 else 2**62
        context = context_of(group[0])
        train_on(model, context, group)
        if (key := shash2hex(context.mod)) in model.data:
            model.data[_group_key(group, i)] = model.data.pop(key)
    return model


def _mlp_features(model, group: Sequence[Record]) -> tuple[list, object]:
    """MLPModel's features and mean costs of one group's records."""
    from tvm.s_tir.meta_schedule.cost_model.mlp_model import extract_features

    return extract_features(context_of(group[0]), *_as_measured(group),
                            model.trainer.state.extractor)


def _seeded_mlp(seed: int):
    """A fresh MLPModel, its initialization and data order fixed by `seed`."""
    from tvm.s_tir.meta_schedule.cost_model.mlp_model import MLPModel

    random.seed(seed)
    torch.manual_seed(seed)
    return MLPModel()


def mlp_on_groups(groups: Sequence[Sequence[Record]], seed: int):
    """TVM's MLPModel (a segment-sum MLP on per-store features) trained in full on record
    groups, each normalized on its own. Its full training holds out a fifth of the groups to
    pick the best epoch."""
    model = _seeded_mlp(seed)
    for i, group in enumerate(g for g in groups if g):
        model.trainer.state.add_to_group(*_mlp_features(model, group), _group_key(group, i))
    with mlp_training():
        model.trainer.train_full()
    return model


def mlp_updated(pretrained, groups: Sequence[Sequence[Record]], seed: int):
    """A copy of a trained MLPModel updated on each group as tuning updates it (a short
    incremental training per group, a full one once over a fifth of its data is untrained);
    `pretrained` is left as it was."""
    from tvm.s_tir.meta_schedule.cost_model.mlp_model import FeatureGroup

    model = _seeded_mlp(seed)
    state, source = model.trainer.state, pretrained.trainer.state
    state.model.load_state_dict(copy.deepcopy(source.model.state_dict()))
    state.data = OrderedDict((k, FeatureGroup(k, list(g.features), g.costs))
                             for k, g in source.data.items())
    state.data_size, state.untrained_size = source.data_size, source.untrained_size
    with mlp_training():
        for i, group in enumerate(g for g in groups if g):
            model.trainer.update(*_mlp_features(model, group), _group_key(group, i, "update"))
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
    """While TVM's MLPModel trains: its StepLR call works on this torch, and the copy of its
    best weights it saves under a temporary file's name (and never removes) goes into a
    directory removed afterwards. Nothing else changes."""
    original, tempdir = torch.optim.lr_scheduler.StepLR, tempfile.tempdir
    torch.optim.lr_scheduler.StepLR = _StepLR
    with tempfile.TemporaryDirectory(prefix="calo-mlp-") as scratch:
        tempfile.tempdir = scratch
        try:
            yield
        finally:
            torch.optim.lr_scheduler.StepLR, tempfile.tempdir = original, tempdir
