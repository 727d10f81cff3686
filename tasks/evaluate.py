"""Offline evaluation on any TVM JSON database, side by side with TVM's own cost models.

Each workload's measured records are taken in measurement order (in a database measured on
several targets, each target's records of a workload are a workload of their own); its warm-up
probes are the first `warmup_fraction` of them, or `warmup_records` of them, and the rest are
held out. With `choose="uncertainty"` the probes are picked among the workload's random samples
where the model's epistemic variance is largest, one per band of predicted latency (spread over
the design space) instead of in measurement order. With warm-up probes, our model is fine-tuned
on them (as the finetune stage does); its temperature starts from the donor's (with
calibrate.warmup_donor_fit, pooled with the donor's refit on every probe), or (setting
calibrate.after_finetune) from that calibrated width carried over the fine-tune, and is
refitted on a hash-split share of them (taken only if it lowers their NLL and ECE:
calo.evaluation.checked_temperature, cross=False; calibrate.warmup_refit says whether the refit
replaces it or is pooled with it).
TVM's XGBModel and MLPModel are each trained twice: on exactly the warm-up records (`xgb`,
`mlp`), and on the donor's records plus the warm-up records, the data our model saw
(`xgb_donor`, `mlp_donor`: XGBoost trained on both at once; the MLP pre-trained on the donor's,
then updated on each workload's warm-up as tuning updates it). Every model is scored on the same
held-out records; a baseline that cannot train on what it is given is listed as not run, with
why.

TVM's models predict a relative throughput, not a latency distribution: they have ranking
metrics (Kendall tau, top-k, regret) but no ECE, NLL or RMSE, which are reported as null.
Ranking metrics are also given per candidate source (random samples; evolved by the search,
the fast end a search visits).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from calo import config as cfg
from calo import paths, registry
from calo.artifact import WEIGHTS, TrainedModel
from calo.baselines import context_of, mlp_on_groups, mlp_updated, train_on_groups, xgb_model
from calo.dataset import GraphSet, split_of
from calo.environment import environment
from calo.errors import CaloError, reason
from calo.evaluation import calibration, checked_temperature, predictive, ranking, ranking_scores
from calo.graphs import graph_set
from calo.log import Progress, get_logger
from calo.models.calibration import (
    blended_temperature,
    carried_temperature,
    confidence_levels,
    refit_temperature,
)
from calo.models.training import predict
from calo.records import (
    APPEND_ONLY,
    EVOLVED,
    RANDOM,
    RECORD_FILE,
    Record,
    describe_target,
    describe_targets,
    iter_records,
    target_key,
)
from calo.tasks.finetune import adapt

RANKING = ("kendall_tau", "top1", "top5", "regret")
CALIBRATION = ("ece", "nll", "rmse")
CHOICES = ("first", "random", "uncertainty")
MLP_MIN_WORKLOADS = 5


def load_model_spec(settings: cfg.Settings, spec: str) -> tuple[TrainedModel, str]:
    """A saved model directory, or a registry alias; and a label naming it."""
    path = Path(spec)
    if path.is_dir():
        return TrainedModel.load(path), str(path)
    if path.exists() or "/" in spec:
        raise CaloError(f"{spec} is not a saved model directory (with {WEIGHTS})")
    trained, version = registry.load_registered(settings, spec)
    return trained, f"{settings.mlflow.model_name}@{spec} (v{version})"


def split_warmup(recs: list[Record], fraction: float = 0.0, count: int | None = None,
                 random_first: bool = False) -> dict[str, tuple[list, list]]:
    """(warm-up, held-out) records of each workload: the first `count` (or `fraction`) of its
    records in measurement order, and the rest. `random_first`: its random samples come
    first, as on a new device, whose warm-up probes are random and whose search then asks
    about evolved candidates (a pool that interleaves the two would mix them in the warm-up)."""
    out, unsampled = {}, []
    for name, group in by_workload(recs).items():
        if random_first and not any(r.source == RANDOM for r in group):
            unsampled.append(name)
        elif random_first:
            group = sorted(group, key=lambda r: r.source != RANDOM)  # stable: order kept within
        n_warm = count if count is not None else (math.ceil(fraction * len(group))
                                                   if fraction > 0 else 0)
        out[name] = (group[:n_warm], group[n_warm:])
    _warn_unsampled(unsampled, "their warm-up is the first measured")
    return out


def _warn_unsampled(names: list[str], instead: str) -> None:
    """Says which workloads' records do not say how they were sampled (a plain TVM database's,
    imported ones), so a warm-up meant to be random samples cannot be."""
    if names:
        shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
        get_logger().warning(f"evaluate: no record of {len(names)} workload(s) says it was a "
                             f"random sample ({shown}): {instead}")


def one_device_per_workload(recs: list[Record], where: str) -> list[Record]:
    """The records of a database measured on several targets, each target's records of a
    workload renamed into a workload of their own ("name @ target"): candidates are ranked
    within one device, never across two."""
    keys = [target_key(r.record.target) if r.record.target is not None else None for r in recs]
    targets = set(keys) - {None}
    if len(targets) < 2:
        return recs
    get_logger().warning(f"evaluate: {where} holds records of {len(targets)} targets "
                         f"({describe_targets(targets)}): each target's records of a workload "
                         "are scored as a workload of their own")
    return [dataclasses.replace(r, workload_name=f"{r.workload_name} @ {describe_target(k)}")
            if k is not None else r for r, k in zip(recs, keys)]


def by_workload(recs: list[Record]) -> dict[str, list[Record]]:
    groups: dict[str, list[Record]] = defaultdict(list)
    for rec in recs:
        groups[rec.workload_name].append(rec)
    return dict(groups)


def choose_by_uncertainty(trained: TrainedModel, recs: list[Record], count: int,
                          progress: Callable[[], None] = lambda: None,
                          graphs_of: Callable[..., GraphSet] | None = None
                          ) -> dict[str, tuple[list, list]]:
    """(warm-up, held-out) records of each workload, the warm-up chosen by the model: its random
    samples (all its records, where none says it is one) split into `count` bands of predicted
    latency, and in each band the one with the largest epistemic variance (the most to learn,
    spread over the design space)."""
    out, unsampled = {}, []
    for name, group in by_workload(recs).items():
        pool = [i for i, r in enumerate(group) if r.source == RANDOM]
        if not pool:
            unsampled.append(name)
            pool = list(range(len(group)))
        chosen_from = [group[i] for i in pool]
        graphs = (graphs_of(chosen_from, progress) if graphs_of is not None else
                  graph_set(trained.graph_kind, chosen_from, progress, trained.reads_stores))
        d = predict(trained.net, graphs.graphs)
        mu, var = d.gamma.numpy(), d.epistemic_var.numpy()
        chosen = []
        for band in np.array_split(np.argsort(mu, kind="stable"), min(count, len(pool))):
            if len(band):
                chosen.append(pool[int(band[np.argmax(var[band])])])
        keep = set(chosen)
        out[name] = ([group[i] for i in chosen],
                     [r for i, r in enumerate(group) if i not in keep])
    _warn_unsampled(unsampled, "their warm-up is chosen among all their records")
    return out


def _mlp(settings: cfg.Settings, groups: list[list[Record]]):
    """TVM's MLPModel trained in full on record groups: it holds out a fifth of them to pick
    the best epoch, so it needs five workloads or more."""
    if len(groups) < MLP_MIN_WORKLOADS:
        raise CaloError(f"MLPModel trains on {MLP_MIN_WORKLOADS} or more workloads, "
                        f"got {len(groups)}")
    return mlp_on_groups(groups, settings.train.seed)


_DONOR_MLP: dict[tuple, object] = {}  # the donor's groups -> MLPModel trained on them


def _mlp_donor(settings: cfg.Settings, warm_groups: list[list[Record]],
               donor: list[list[Record]]):
    """TVM's MLPModel as tuning uses a pre-trained one: trained in full on the donor's records
    (once per donor: an evaluation at several warm-up sizes shares it), then updated on each
    workload's warm-up records."""
    key = (settings.train.seed, *((target_key(g[0].record.target), g[0].workload_key, len(g))
                                  for g in donor))
    if key not in _DONOR_MLP:
        _DONOR_MLP.clear()
        _DONOR_MLP[key] = _mlp(settings, donor)
    return mlp_updated(_DONOR_MLP[key], warm_groups, settings.train.seed)


def _baselines(settings: cfg.Settings, warm_groups: list[list[Record]],
               donor: list[list[Record]], donor_stores: Sequence[Path] = ()) -> tuple[dict, dict]:
    """TVM's cost models on the warm-up records alone and on donor + warm-up records (the
    latter not at all without donor records: they would be the former under another name).

    Returns the trained models and, for those that could not be trained, why.
    """
    log = get_logger()
    warm_groups, donor = [g for g in warm_groups if g], [g for g in donor if g]
    workers, both = settings.harvest.build_workers, donor + warm_groups
    trainers = {
        "xgb": (warm_groups, lambda: train_on_groups(xgb_model(workers), warm_groups)),
        "xgb_donor": (both, lambda: train_on_groups(xgb_model(workers), both)),
        "mlp": (warm_groups, lambda: _mlp(settings, warm_groups)),
        "mlp_donor": (both, lambda: _mlp_donor(settings, warm_groups, donor)),
    }
    trained, not_run = {}, {}
    for name, (groups, train) in trainers.items():
        count, start = sum(map(len, groups)), time.perf_counter()
        try:
            if not groups:
                raise CaloError("no training records (warm-up fraction 0 and no donor records)")
            if name.endswith("_donor") and not donor:
                raise CaloError(f"no donor records in {', '.join(map(str, donor_stores))} "
                                "(--donor-records: the databases the model was trained on)")
            log.info(f"evaluate: training TVM's {name} on {count} records")
            trained[name] = train()
            took = time.perf_counter() - start
            log.info(f"evaluate: {name} trained in {took:.0f} s ({count / took:.0f} records/s)")
        except Exception as err:  # a baseline that cannot train is reported, not fatal
            not_run[name] = reason(err)
    return trained, not_run


def summarize(per_workload: dict[str, dict], pooled: dict | None) -> dict:
    """Ranking metrics averaged over workloads (the tuner ranks within one workload);
    calibration metrics over all held-out records pooled.

    ECE is a statement about a set of predictions: on one workload's few dozen records its
    sampling noise alone is several hundredths, so averaging per-workload ECEs would report
    that noise, not miscalibration.
    """
    overall = {}
    for key in RANKING:
        values = [m[key] for m in per_workload.values()
                  if m.get(key) is not None and not np.isnan(m[key])]
        overall[key] = float(np.mean(values)) if values else None
        # Standard error of that mean over workloads: how far the workloads alone move it.
        overall[f"{key}_se"] = (float(np.std(values, ddof=1) / np.sqrt(len(values)))
                                if len(values) > 1 else None)
    for key in CALIBRATION:
        overall[key] = pooled[key] if pooled else None
    return overall


def donor_groups(stores: Sequence[Path]) -> list[list[Record]]:
    """The measured records of `stores`, one group per workload and store: a workload's
    records of two devices are two rankings, not one."""
    groups: dict[tuple[int, str], list[Record]] = defaultdict(list)
    for i, store in enumerate(stores):
        for rec in _measured(store):
            groups[i, rec.workload_key].append(rec)
    return list(groups.values())


_MEASURED: dict[str, tuple[tuple, list[Record]]] = {}
_GRAPHS: dict[tuple, dict[int, object]] = {}  # (store, its state, kind, stores) -> index -> graph
_GRAPH_STORES = 2  # stores whose graphs are kept: the held-out store and one before it


def _state(store: Path) -> tuple:
    """Sizes and times of a store's files: changes whenever a record is appended."""
    return tuple((s.st_size, s.st_mtime_ns) for s in (
        (store / name).stat() for name in APPEND_ONLY if (store / name).is_file()))


def store_graphs(store: Path, kind: str, stores: bool) -> Callable[..., GraphSet]:
    """graph_set for records of `store`, each record's graph extracted once per state of the
    store: an evaluation at several warm-up sizes scores the same records at each, and
    extracting them is most of its time."""
    key = (str(store.resolve()), _state(store), kind, stores)
    if key not in _GRAPHS:
        for old in list(_GRAPHS)[:max(len(_GRAPHS) - _GRAPH_STORES + 1, 0)]:
            del _GRAPHS[old]
    cache = _GRAPHS.setdefault(key, {})

    def graphs_of(recs: list[Record], on_graph: Callable[[], None] = lambda: None) -> GraphSet:
        missing = [r for r in recs if r.index not in cache]
        cache.update(zip((r.index for r in missing),
                         graph_set(kind, missing, on_graph, stores).graphs))
        for _ in range(len(recs) - len(missing)):
            on_graph()
        return GraphSet([cache[r.index] for r in recs], [r.workload_name for r in recs],
                        [r.index for r in recs], kind)

    return graphs_of


def _measured(store: Path) -> list[Record]:
    """A store's measured records, parsed once per state of its files: an evaluation
    at several warm-up sizes asks for the same donor stores at each, and building TVM's
    records of a large one takes minutes."""
    if not (store / RECORD_FILE).is_file():
        return []
    path, state = str(store.resolve()), _state(store)
    if _MEASURED.get(path, (None,))[0] != state:
        _MEASURED[path] = state, [r for r in iter_records(store) if r.latency is not None]
    return _MEASURED[path][1]


def scored_records(store: Path) -> list[Record]:
    """A store's measured records as an evaluation ranks them: in a database of several
    targets, each target's records of a workload a workload of their own."""
    return one_device_per_workload(_measured(store), str(store))


def evaluate_records(settings: cfg.Settings, model_spec: str, records_dir: str,
                     warmup_fraction: float = 0.0, warmup_records: int | None = None,
                     choose: str = "first", baselines: bool = True,
                     donor_stores: Sequence[Path] | None = None) -> dict:
    """Score our model and TVM's (unless not `baselines`) on the held-out records of every
    workload in a store. TVM's `_donor` models train on the records of `donor_stores` (default:
    the donor's) beside the warm-up: the records our model saw."""
    log = get_logger()
    if not 0 <= warmup_fraction < 1:
        raise CaloError(f"--warmup-fraction must be in [0, 1), got {warmup_fraction}")
    if warmup_records is not None and warmup_records < 0:
        raise CaloError(f"--warmup must be >= 0 records, got {warmup_records}")
    if choose not in CHOICES:
        raise CaloError(f"--choose must be one of {', '.join(CHOICES)}, got {choose!r}")
    recs = scored_records(Path(records_dir))
    if not recs:
        raise CaloError(f"no successful measurements in {records_dir}")
    trained, label = load_model_spec(settings, model_spec)
    kind, stores = trained.graph_kind, trained.needs_stores
    if choose == "uncertainty" and warmup_records:
        splits = choose_by_uncertainty(trained, recs, warmup_records,
                                       Progress("evaluate: choosing warm-up", len(recs),
                                                "records").advance,
                                       store_graphs(Path(records_dir), kind, stores))
    else:
        splits = split_warmup(recs, warmup_fraction, warmup_records, choose == "random")
    warm = [r for w, h in splits.values() for r in w]
    held = {name: h for name, (_, h) in splits.items() if len(h) >= 2}
    if not held:
        raise CaloError(f"no workload in {records_dir} keeps 2 or more held-out records")
    levels = settings.calibrate.levels

    # zero-shot, trees of the donor's records (if the model keeps any) order every workload's
    # candidates at their weight
    general = trained.correction is not None and trained.correction.general
    finetune: dict = {"finetune_s": 0.0, "finetune_epoch": None, "correction_rounds": 0,
                      "correction_blend": trained.correction.blend if general else 0.0}
    if warm:
        warm_graphs = store_graphs(Path(records_dir), kind, stores or settings.finetune.corrects)(
            warm, Progress("evaluate: warm-up graphs", len(warm), "records").advance)
        trained, finetune = fine_tuned(trained, settings, warm_graphs, warm)
        stores = trained.needs_stores
    if donor_stores is None:
        donor_stores = [paths.records_dir(settings.donor)]
    donor = donor_groups(donor_stores)
    warm_groups = [w for w, _ in splits.values()]
    baselines, not_run = (_baselines(settings, warm_groups, donor, donor_stores) if baselines
                          else ({}, {}))

    # Counted from here: the baselines' training above is not graph extraction.
    progress = Progress("evaluate: held-out graphs", sum(map(len, held.values())), "records")
    graphs_of = store_graphs(Path(records_dir), kind, stores)
    per_source, pooled = score_held_out(
        trained, held, lambda name: graphs_of(held[name], progress.advance), levels, baselines)
    per_workload = per_source["all"]
    report = {
        "model": label, "temperature": trained.temperature,
        "at_temperature_1": pooled["at_temperature_1"], "records": records_dir,
        "warmup_fraction": warmup_fraction, "warmup_per_workload": warmup_records,
        "warmup_choice": choose, "warmup_records": len(warm), **finetune,
        "held_out_records": sum(map(len, held.values())), "donor_records": sum(map(len, donor)),
        "overall": {m: summarize(pw, pooled if m == "calo" else None)
                    for m, pw in per_workload.items() if pw},
        "by_source": {source: {m: summarize(pw, pooled["by_source"].get(source)
                                            if m == "calo" else None)
                               for m, pw in table.items() if pw}
                      for source, table in per_source.items()
                      if source != "all" and any(table.values())},
        "per_workload": {w: {m: pw[w] for m, pw in per_workload.items() if w in pw}
                         for w in held},
        "not_run": not_run,
        "environment": environment(),
    }
    log.info(f"evaluate: {len(held)} workloads, {report['held_out_records']} held-out records")
    return report


def fine_tuned(trained: TrainedModel, settings: cfg.Settings, warm_graphs: GraphSet,
               warm: list[Record]) -> tuple[TrainedModel, dict]:
    """A copy of the model fine-tuned on the graphs of the warm-up records `warm` as the
    finetune stage does (the rule's row for their size and device), its temperature the
    donor's (or its refit on every probe, calibrate.warmup_donor_fit: donor_on_probes; or
    that width carried over the fine-tune, calibrate.after_finetune), replaced by or
    pooled with (calibrate.warmup_refit) a refit on a hash-split share of them where that
    lowers their NLL and ECE; and how the fine-tune went."""
    donor, trained = trained, copy.deepcopy(trained)
    fractions = cfg.Split(val=settings.split.val, test=0.0)
    is_val = [split_of(w, r, fractions) == "val"
              for w, r in zip(warm_graphs.workload, warm_graphs.record)]
    fit_set = warm_graphs.select([not v for v in is_val])
    cal_set = warm_graphs.select(is_val)
    start = time.perf_counter()
    targets = {target_key(r.record.target) for r in warm if r.record.target is not None}
    tuned = adapt(trained, settings.finetune, settings.train, fit_set, cal_set or fit_set,
                  targets)
    took = time.perf_counter() - start
    probes = predictive(donor.net, warm_graphs, correction=donor.correction)
    trained.temperature = start_temperature = donor_on_probes(donor, settings, probes)
    rule = settings.calibrate.after_finetune
    if rule != "temperature":
        _, _, donor_scale, _ = probes
        tuned_scale = predict(trained.net, warm_graphs.graphs).t_scale.numpy()
        carried = carried_temperature(start_temperature, donor_scale, tuned_scale)
        trained.temperature = carried if rule == "width" else min(carried, start_temperature)
    # Too few points keep the temperature (calibration.refit_temperature's floor). Not
    # cross-fitted by workload: the model is asked about other candidates of these workloads.
    refit = settings.calibrate.warmup_refit
    if refit != "off":
        before = trained.temperature
        trained.temperature = checked_temperature(trained.net, cal_set, before,
                                                  settings.calibrate.levels,
                                                  trained.correction, cross=False,
                                                  objective=settings.calibrate.objective)
        if refit == "blend" and trained.temperature != before:
            trained.temperature = blended_temperature(before, trained.temperature)
    return trained, {"finetune_s": took, "finetune_epoch": tuned["kept_epoch"],
                     "same_device": tuned["config"]["same_device"],
                     "correction_rounds": tuned["config"]["correction_rounds"],
                     "correction_blend": tuned["config"]["blend"]}


def donor_on_probes(donor: TrainedModel, settings: cfg.Settings, probes: tuple) -> float:
    """The temperature a warm-up's fine-tune starts from: the donor's, or with
    calibrate.warmup_donor_fit its refit on every warm-up probe (taken where it lowers their
    NLL and ECE; pooled with the donor's as calibrate.warmup_refit pools). The donor's
    predictions of the probes were made before it saw them, so all of them can check its
    width, where the fine-tuned model's can only be checked on the share it held back.
    `probes`: the donor's prediction of them at temperature 1 (calo.evaluation.predictive)."""
    refit = settings.calibrate.warmup_refit
    if not settings.calibrate.warmup_donor_fit or refit == "off":
        return donor.temperature
    fitted = refit_temperature(probes, donor.temperature,
                               confidence_levels(settings.calibrate.levels),
                               objective=settings.calibrate.objective)
    return blended_temperature(donor.temperature, fitted) if refit == "blend" else fitted


def score_held_out(trained: TrainedModel, held: dict[str, list[Record]],
                   graphs_of: Callable[[str], GraphSet], levels: int,
                   baselines: dict | None = None) -> tuple[dict, dict]:
    """Ranking metrics per candidate source, model and workload (ours and the baselines' on
    the same records), and our calibration on all of them pooled, and on each source's pooled
    (`by_source`: a search asks about evolved candidates, a random warm-up shows random ones).
    A workload's graphs are asked for (`graphs_of(name)`) when it is scored, so they need not
    all be held at once."""
    baselines = baselines or {}
    per_source: dict[str, dict[str, dict[str, dict]]] = {
        source: {m: {} for m in ("calo", *baselines)} for source in ("all", RANDOM, EVOLVED)}
    pooled, sources_of = [], []
    for name, group in held.items():
        latency = np.array([r.latency for r in group])
        graphs = graphs_of(name)
        y, mu, scale, df = predictive(trained.net, graphs, trained.temperature,
                                      trained.correction)
        pooled.append((y, mu, scale, df))
        cands = [r.record.as_measure_candidate() for r in group]
        scores = {"calo": ranking_scores(mu, graphs, trained.correction),
                  **{which: -np.asarray(baseline.predict(context_of(group[0]), cands))
                     for which, baseline in baselines.items()}}
        sources = np.array([r.source for r in group])
        sources_of.append(sources)
        for source, table in per_source.items():
            idx = np.arange(len(group)) if source == "all" else np.flatnonzero(sources == source)
            if len(idx) < 2:
                continue
            for which, score in scores.items():
                table[which][name] = {**ranking(latency[idx], score[idx]),
                                      **dict.fromkeys(CALIBRATION)}
        per_source["all"]["calo"][name].update(calibration(y, mu, scale, df, levels))
    y, mu, scale, df = (np.concatenate(part) for part in zip(*pooled))
    # The same predictions at temperature 1 say whether the temperature helped them.
    plain = calibration(y, mu, scale / trained.temperature, df, levels)
    sources = np.concatenate(sources_of)
    by_source = {source: calibration(y[m], mu[m], scale[m], df[m], levels)
                 for source in (RANDOM, EVOLVED) if (m := sources == source).sum() >= 2}
    return per_source, {**calibration(y, mu, scale, df, levels),
                        "at_temperature_1": {k: plain[k] for k in ("ece", "nll")},
                        "by_source": by_source}


def format_table(report: dict) -> str:
    cols = RANKING + CALIBRATION
    per = report.get("warmup_per_workload")
    # a fraction's warm-up is in measurement order, or random samples first (never uncertain)
    how = (f"{per} per workload, {report['warmup_choice']}" if per is not None
           else f"fraction {report['warmup_fraction']}"
           + (", random" if report["warmup_choice"] == "random" else ""))
    lines = [f"{report['model']} on {report['records']}: {report['held_out_records']} held-out "
             f"records, {report['warmup_records']} warm-up ({how})"]
    rows = [(w, m, v) for w, ms_ in sorted(report["per_workload"].items()) for m, v in ms_.items()]
    rows += [("overall", m, v) for m, v in report["overall"].items()]
    rows += [(f"overall {source}", m, v) for source, table in report["by_source"].items()
             for m, v in table.items()]
    # as wide as the longest name: held-out workloads carry their shape in it
    wide = max([len("workload"), *(len(w) for w, _, _ in rows)]) + 2
    model_wide = max([len("model"), *(len(m) for _, m, _ in rows)]) + 2
    lines.append(f"{'workload':<{wide}}{'model':<{model_wide}}"
                 + "".join(f"{c:>12}" for c in cols))
    for workload, model, values in rows:
        cells = "".join(f"{'-' if values.get(c) is None else format(values[c], '.3f'):>12}"
                        for c in cols)
        lines.append(f"{workload:<{wide}}{model:<{model_wide}}{cells}")
    for model, why in report["not_run"].items():
        lines.append(f"{model}: not run: {why}")
    if (plain := report.get("at_temperature_1")) and "calo" in report["overall"]:
        ours = report["overall"]["calo"]
        lines.append(f"calo's pooled ECE / NLL at temperature 1: {plain['ece']:.3f} / "
                     f"{plain['nll']:.3f}; at its {report['temperature']:.3f}: "
                     f"{ours['ece']:.3f} / {ours['nll']:.3f}")
    return "\n".join(lines)
