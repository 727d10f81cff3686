"""Offline evaluation on the committed pools: workloads the donor never saw, on two devices.

The unseen-shape split: the donor model trains on the committed suite pools of both CPU
devices (every suite operator at its small, medium and large shapes; each device's records of a
workload a workload of their own, its loops read against the device: graph kind
device-schedule) minus the operators in harvest_pools.UNSEEN_OPERATORS; `--pretrain-also`
with no device trains it on the cpu-host pool alone. It is scored with `calo evaluate`
(tasks.evaluate) on the held-out pools of both devices: suite operators at shapes no donor
record has, and the unseen operators, 256 measured candidates each, half random and half
evolved. Every row sits beside TVM's XGBModel and MLPModel trained on the warm-up records alone
and on the donor records (the same pools) plus the warm-up.

`--split dev` is the selection split, where settings are chosen (the unseen-shape split only
reports): the donor pool without the unseen-shape split's operators, a third of the operators
of each family held out (by a stable hash of the name) at every shape they have with at least
DEV_MIN_HELD records past the largest warm-up, the rest the donor; warm-up 0, 8 and 32, our
model alone (`--tvm`: TVM's too). `--devices cpu-generic-1core` scores the same workloads from
that device's pool, a new device too. `--split dev-shape` also holds out every second kept
operator at one of its larger shapes: seen operators at shapes the donor lacks, as the
unseen-shape split has them.

Warm-up sizes: records per held-out workload (the first measured, random samples), 0 being
zero-shot; at --compare sizes the warm-up is also chosen by the donor's uncertainty
(`calo evaluate --choose uncertainty`). The donor's temperature and early stopping use its own
validation workloads, as pretrain does. Run from the repository root:

    python benchmarks/offline_eval.py [--warmups 0 8 32 96] [--compare 8 32] [--set K=V]
    python benchmarks/offline_eval.py --split dev --set train.rank_weight=2 --out results/x.json

Prints each table and writes benchmarks/results/offline_eval.json (or --out) after each split.
A run of the same evaluation (split, settings, donor model) finds the splits already in --out
and goes on after them; runs for different --devices given one --donor-model (trained by the
first, reused by the others) and one --out merge into it, so the devices can run side by side:

    python benchmarks/offline_eval.py --donor-model /tmp/donor --devices cpu-host
    python benchmarks/offline_eval.py --donor-model /tmp/donor --devices cpu-generic-1core

Transfer between devices: `--donor-pool` trains the donor on another device's pool (scored on
the CPU held-out pools), `--held-out` scores on other pools (a GPU's, where a CPU donor never
saw the device):

    python benchmarks/offline_eval.py --donor-pool benchmarks/data/suite-cuda.tar.gz \
        --warmups 0 8 32 --compare --out benchmarks/results/transfer_gpu_to_cpu.json
    python benchmarks/offline_eval.py --held-out benchmarks/data/suite-cuda.tar.gz \
        --warmups 0 8 --compare --out benchmarks/results/transfer_cpu_to_gpu.json

A device's model, as the pipeline makes it: `--device-records` scores, on a device other than
the donor's, the donor fine-tuned and calibrated on that device's suite pool (the finetune and
calibrate stages; the unseen operators left out) instead of the donor, and trains TVM's donor
models on those records too (each device's records of a workload a group of their own):

    python benchmarks/offline_eval.py --device-records --devices cpu-generic-1core \
        --donor-model /tmp/donor --out benchmarks/results/offline_eval_device_records.json

`--fit` also ranks the donor's own training records, and its validation and test records (new
candidates of the workloads it trained on), with the donor and with TVM's XGBModel trained on
the same records (the report's `donor_fit`): how well each fits, and how well that carries over.

TVM's rows depend on the records only, not on our settings: `--baselines-from REPORT` takes them
from an earlier report's splits on the same donor, warm-up and held-out records (checked)
instead of training the baselines again, most of each split's time.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from calo.devices import preload_tensor_intrinsics

preload_tensor_intrinsics()  # before torch_geometric is imported

import numpy as np  # noqa: E402
from harvest_pools import UNSEEN_OPERATORS, open_pool, overrides, unpack  # noqa: E402

from calo import paths, records, suite  # noqa: E402
from calo.artifact import TrainedModel  # noqa: E402
from calo.baselines import context_of, train_on_groups, xgb_model  # noqa: E402
from calo.config import Settings, load_settings  # noqa: E402
from calo.correction import donor_trees, member_keys, summary_width, tree_rows  # noqa: E402
from calo.dataset import GraphSet  # noqa: E402
from calo.environment import code_version  # noqa: E402
from calo.evaluation import predictive, ranking  # noqa: E402
from calo.log import get_logger  # noqa: E402
from calo.tasks.calibrate import calibrate  # noqa: E402
from calo.tasks.evaluate import evaluate_records, format_table  # noqa: E402
from calo.tasks.extract import extract  # noqa: E402
from calo.tasks.finetune import finetune  # noqa: E402
from calo.tasks.pretrain import donor_splits, log_epoch, train_on_donor  # noqa: E402

ROOT = Path(__file__).resolve().parent
WORK_DONOR = Path("models", "donor")  # a run's own donor, without --donor-model
DATA = ROOT / "data"
POOLS = {"cpu-host": DATA / "suite-cpu-host.tar.gz",
         "cpu-generic-1core": DATA / "suite-cpu-generic-1core.tar.gz"}
HELD_OUT_POOLS = {"cpu-host": DATA / "heldout-cpu-host.tar.gz",
                  "cpu-generic-1core": DATA / "heldout-cpu-generic-1core.tar.gz"}
SUMMARY = ("kendall_tau", "top1", "top5")
DEV_SHARE = 3       # dev split: every third operator of a family, in hash order, is held out
DEV_WARMUPS = (0, 8, 32)
DEV_MIN_HELD = 32  # a scored workload keeps >= this many candidates after the largest warm-up


def dev_held_out(operators: list[str]) -> set[str]:
    by_family: dict[str, list[str]] = {}
    for name in operators:
        by_family.setdefault(suite.family(name), []).append(name)
    held = set()
    for group in by_family.values():
        ranked = sorted(group, key=lambda n: hashlib.sha1(n.encode()).hexdigest())
        held |= set(ranked[::DEV_SHARE])
    return held


def dev_held_shapes(names: list[str], held: set[str]) -> set[str]:
    """dev-shape: workloads of the operators the donor keeps, each of every second of them (in
    hash order) held out at one of its larger shapes: seen operators at shapes the donor lacks,
    as the unseen-shape split asks."""
    kept = sorted({suite.operator(n) for n in names} - held,
                  key=lambda n: hashlib.sha1(f"shape/{n}".encode()).hexdigest())
    out = set()
    for op in kept[::2]:
        shape = ("medium", "large")[int(hashlib.sha1(op.encode()).hexdigest(), 16) % 2]
        out |= {n for n in names if n == f"{op}@{shape}"}
    return out


def with_overrides(settings: Settings, donor: str, items: list[str]) -> Settings:
    """The settings with `donor` as the donor device and SECTION.KEY=VALUE overrides."""
    return settings.override({
        "donor": donor,
        f"devices.{donor}": {"target": {"kind": "llvm"}, "candidates_per_workload": 0},
        **overrides(items)})


def pool_label(pool: Path) -> str:
    """A held-out pool's name in the report: its file or directory name without .tar.gz."""
    return pool.name.removesuffix(".tar.gz")


def train_donor(settings: Settings, out: Path, also: Sequence[str] = ()) -> dict:
    """Train and calibrate a donor model on settings.donor's extracted store and those of the
    devices in `also`; save it to out, with the code that trained it."""
    train, val, test, calibration = donor_splits(settings, also)
    start = time.perf_counter()
    trained, metrics = train_on_donor(settings, train, val, test, calibration,
                                      log_epoch("donor", settings.train.max_epochs),
                                      also)
    trained.save(out)
    return {"train_graphs": len(train), "val_graphs": len(val),
            "train_s": time.perf_counter() - start, **metrics,
            "code": code_version()}


def with_donor_records(settings: Settings, model_dir: Path, out: Path, trained_on: int,
                       also: Sequence[str] = ()) -> Path:
    """A saved donor as the rule's trees that learn from the donor's records (finetune.rule's
    donor_records) need it: one that predates them, or whose records predate their devices, is
    copied to `out` with its training records (its training split's, not learned: the donor
    itself is kept rather than trained anew) and its own trees of them
    (calo.correction.donor_trees) added. One whose trees the rule now weighs otherwise is
    copied with the rule's weight: the weight enters only the blend, not the trees' fit, so the
    copy is what pretrain would save now; one whose trees were fitted with other seeds
    (finetune.correction.seeds), read their rows otherwise (finetune.correction.relative) or
    weighed them otherwise (finetune.correction.zero_shot_row_weight) gets them fitted
    again."""
    trained = TrainedModel.load(model_dir)
    relative = settings.finetune.correction.relative
    row_weight = settings.finetune.correction.zero_shot_row_weight
    # rows kept before they carried each program's device (or, where the trees read them
    # against their workload's, its workload) are derived again
    had_rows = (trained.donor_rows is not None
                and trained.donor_rows[0].shape[1] == summary_width(devices=True)
                and (trained.donor_rows[2] is not None or relative == "none"))
    step = settings.finetune.step_for(0)
    fits = member_keys(settings.finetune.correction, ("summary",))
    if had_rows and trained.correction is not None and (
            not step.donor_records or (list(trained.correction.members) == fits
                                       and trained.correction.relative == relative
                                       and trained.correction.row_weight == row_weight)):
        weight = step.blend
        if not step.donor_records or trained.correction.blend == weight:
            return model_dir
        get_logger().info(f"offline eval: the donor's trees weighed {trained.correction.blend:g}, "
                          f"the rule {weight:g}")
        trained.correction.blend = weight
        return _saved_donor(trained, model_dir, out)
    if not had_rows:
        for device in ("donor", *also):
            extract(settings, device)
        train = donor_splits(settings, also)[0]
        if len(train) != trained_on:
            raise SystemExit(f"the donor in {model_dir} trained on {trained_on} graphs, this "
                             f"split has {len(train)}: train a new donor (another --donor-model)")
        trained.donor_rows = tree_rows(train.graphs, train.workload)
    trained.correction = donor_trees(settings.finetune, trained.donor_rows, settings.train.seed)
    if had_rows and trained.correction is None:
        return model_dir
    return _saved_donor(trained, model_dir, out)


def _saved_donor(trained: TrainedModel, model_dir: Path, out: Path) -> Path:
    trained.save(out)
    shutil.copy(model_dir / "donor.json", out / "donor.json")
    get_logger().info(f"offline eval: the donor in {model_dir} with its "
                      f"{len(trained.donor_rows[1])} training records and their trees for the "
                      f"rule, in {out}")
    return out


def device_model(settings: Settings, device: str, donor_dir: Path, pools: Path,
                 keep: Path | None) -> tuple[Path, dict]:
    """The device's model as the pipeline makes it: the donor fine-tuned on the device's suite
    pool (without the unseen operators) by the finetune stage, then calibrated by the calibrate
    stage. Saved to (and, run again, reused from) `keep` when given. Returns the model's
    directory and what the stages reported."""
    store = paths.records_dir(device)
    kept = records.subset_store(unpack(POOLS[device], pools), store,
                                lambda n: suite.operator(n) not in UNSEEN_OPERATORS)
    if keep is not None and (keep / "device.json").is_file():  # written last: complete
        return keep, json.loads((keep / "device.json").read_text())
    extract(settings, device)
    shutil.copytree(donor_dir, paths.model_dir(settings.donor), dirs_exist_ok=True)
    report = {"records": kept, "finetune": finetune(settings, device),
              "calibrate": calibrate(settings, device)}
    if keep is None:
        return paths.calibrated_dir(device), report
    shutil.copytree(paths.calibrated_dir(device), keep, dirs_exist_ok=True)
    (keep / "device.json").write_text(json.dumps(report, default=float))
    return keep, report


def donor_fit(settings: Settings, model_dir: Path) -> dict:
    """How the donor and TVM's XGBModel, both trained on the donor's training records, rank
    each workload's candidates among those records (the fit) and among the validation and test
    records of the same workloads (new candidates of seen workloads): mean tau / top-1 / top-5
    over the workloads with 3 or more records in a part."""
    train, val, test, _ = donor_splits(settings)
    measured = {r.index: r for r in records.iter_records(paths.records_dir(settings.donor))
                if r.latency is not None}

    def groups(part: GraphSet, least: int = 3) -> list[list[records.Record]]:
        out: dict[str, list[records.Record]] = {}
        for index in part.record:
            out.setdefault(measured[index].workload_key, []).append(measured[index])
        return [g for g in out.values() if len(g) >= least]

    # every record the donor saw
    xgb = train_on_groups(xgb_model(settings.harvest.build_workers), groups(train, least=1))
    net = TrainedModel.load(model_dir).net
    out = {}
    for name, part in (("train", train), ("val", val), ("test", test)):
        ours = dict(zip(part.record, predictive(net, part)[1]))
        rows: dict[str, list[dict]] = {"calo": [], "xgb": []}
        for group in groups(part):
            latency = np.array([r.latency for r in group])
            candidates = [r.record.as_measure_candidate() for r in group]
            rows["calo"].append(ranking(latency, np.array([ours[r.index] for r in group])))
            rows["xgb"].append(ranking(latency, -np.asarray(
                xgb.predict(context_of(group[0]), candidates))))
        out[name] = {m: {k: float(np.mean([r[k] for r in scored])) for k in SUMMARY}
                     | {"workloads": len(scored)} for m, scored in rows.items()}
    return out


def headline(result: dict) -> dict:
    """Mean tau / top-1 / top-5 per model, on all held-out candidates and per source."""
    parts = {"all": result["overall"], **result["by_source"]}
    return {part: {m: {k: v[k] for k in SUMMARY} for m, v in table.items()}
            for part, table in parts.items()}


def verdict(result: dict) -> dict:
    """Whether calo beats every TVM model on each summary metric, on all and evolved ones."""
    out = {}
    for part in ("all", "evolved"):
        table = result["overall"] if part == "all" else result["by_source"].get(part, {})
        calo = table.get("calo")
        if not calo:
            continue
        for key in SUMMARY:
            rivals = [v[key] for m, v in table.items() if m != "calo" and v[key] is not None]
            out[f"{part}_{key}"] = bool(rivals) and calo[key] > max(rivals)
    return out


def paired(result: dict) -> dict:
    """Per summary metric on all held-out candidates, calo against the TVM model with the best
    mean: the mean over workloads of the per-workload difference, its standard error, and on
    how many workloads calo is ahead. A difference within about two standard errors is one
    that another draw of eight workloads could reverse."""
    per = result.get("per_workload", {})
    names = sorted(w for w, models in per.items() if "calo" in models)
    rivals = [m for m in (per[names[0]] if names else {}) if m != "calo"]
    if len(names) < 2 or not rivals:
        return {}
    out = {}
    for key in SUMMARY:
        means = {m: np.mean([per[w][m][key] for w in names]) for m in rivals}
        best = max(means, key=means.get)
        diff = np.array([per[w]["calo"][key] - per[w][best][key] for w in names])
        out[key] = {"rival": best, "mean_diff": float(diff.mean()),
                    "se": float(diff.std(ddof=1) / np.sqrt(len(diff))),
                    "ahead": int((diff > 0).sum()), "workloads": len(diff)}
    return out


def print_paired(report: dict) -> bool:
    """Prints the per-workload comparison; False where there is none."""
    rows = {name: "; ".join(f"{k} {v['mean_diff']:+.3f} +- {v['se']:.3f} vs {v['rival']}, "
                            f"{v['ahead']}/{v['workloads']}" for k, v in paired(result).items())
            for name, result in report["splits"].items()}
    rows = {name: cells for name, cells in rows.items() if cells}
    if not rows:  # TVM's models not run: nothing to compare with
        return False
    print("\ncalo minus the best TVM model, per workload (all held-out candidates): "
          "mean +- standard error, workloads ahead")
    for name, cells in rows.items():
        print(f"{name:<34} {cells}")
    return True


def across_donors(reports: list[dict]) -> dict:
    """Reports of one split whose donors differ only in their draw (train.seed): each cell's
    figures (tau / top-1 / top-5, all and evolved candidates) as the mean over the donors, with
    their standard deviation, against the best TVM model's mean over the same reports; and the
    comparisons won (calo ahead of the best TVM model) by each donor and by the mean. One
    donor's figures move by as much as the gaps they are compared on (docs/ranking.md, "The
    donor the current code trains"): the mean is the figure a freshly trained donor is
    expected to reach."""
    first = reports[0]
    for report in reports[1:]:
        for key in ("split", "donor_records", "device_records"):
            if report.get(key) != first.get(key):
                raise SystemExit(f"--summarize: the reports differ in {key}: not one split")
    cells = [c for c in first["splits"] if "calo" in first["splits"][c]["overall"]
             and all(c in r["splits"] for r in reports)]
    table, won, each = {}, {"all": 0, "after_warmup": 0}, [0] * len(reports)
    for cell in cells:
        held = {r["splits"][cell]["held_out_records"] for r in reports}
        if len(held) > 1:
            raise SystemExit(f"--summarize: {cell} holds out different records in the reports")
        parts, heads = {}, [headline(r["splits"][cell]) for r in reports]
        for part in ("all", "evolved"):
            views = [head.get(part, {}) for head in heads]
            rivals = sorted(set.intersection(*(set(v) for v in views)) - {"calo"})
            if not rivals or not all("calo" in v for v in views):
                continue
            row = {}
            for key in SUMMARY:
                ours = np.array([v["calo"][key] for v in views])
                theirs = {m: float(np.mean([v[m][key] for v in views])) for m in rivals}
                best = max(theirs, key=theirs.get)
                row[key] = {"calo": ours.tolist(), "mean": float(ours.mean()),
                            "sd": float(ours.std(ddof=1)) if len(ours) > 1 else 0.0,
                            "rival": best, "rival_mean": theirs[best]}
                ahead = row[key]["mean"] > theirs[best]
                won["all"] += ahead
                won["after_warmup"] += ahead and not cell.endswith("@0")
                for i, value in enumerate(ours):
                    each[i] += bool(value > theirs[best])
            parts[part] = row
        if parts:
            table[cell] = parts
    comparisons = sum(len(row) for cell in table.values() for row in cell.values())
    return {"donors": [{k: r.get("donor", {}).get(k) for k in ("epochs", "val_nll", "code")}
                       | {"settings": r.get("settings", [])} for r in reports],
            "cells": table, "comparisons": comparisons, "won_by_mean": won["all"],
            "won_by_mean_after_warmup": won["after_warmup"], "won_by_each": each}


def print_across_donors(summary: dict) -> None:
    """The table of across_donors: mean +- sd over donors, the best TVM model's mean."""
    print(f"\n{len(summary['donors'])} donors: calo's mean +- sd over donors | the best TVM "
          "model (tau / top-1 / top-5)")
    for cell, parts in summary["cells"].items():
        for part, row in parts.items():
            ours = " / ".join(f"{row[k]['mean']:.3f}+-{row[k]['sd']:.3f}" for k in SUMMARY)
            theirs = " / ".join(f"{row[k]['rival_mean']:.3f}" for k in SUMMARY)
            print(f"{cell:<24} {part:<8} {ours} | {theirs}")
    print(f"won of {summary['comparisons']}: by the mean {summary['won_by_mean']} "
          f"({summary['won_by_mean_after_warmup']} after a warm-up), by each donor "
          f"{', '.join(map(str, summary['won_by_each']))}")


def joined(reports: list[dict]) -> dict:
    """Reports of one evaluation (split, settings, donor) on different held-out pools of the
    same devices, e.g. the unseen-shape split's two halves (`--held-out` their second pools):
    the i-th pool each report scored joined with the i-th of the others, one cell per warm-up,
    workload by workload. Eight workloads leave each cell's top-1 a standard error of 0.06 to
    0.13; joined, the comparison with TVM's models rests on all of them. Means over the joined
    workloads (the evolved candidates' weighted by each report's workloads, as the reports keep
    only their means), the paired per-workload comparison on all candidates, and the
    comparisons won (calo ahead of the best TVM model's mean)."""
    first = reports[0]
    for report in reports[1:]:
        if not same_run(report, first):
            raise SystemExit("--join: the reports differ in split, settings or donor: not one "
                             "evaluation")

    def pools(report: dict) -> list[dict[str, dict]]:
        """Each pool's cells (warm-up label -> result), in the order the report scored them."""
        out: dict[str, dict[str, dict]] = {}
        for cell, result in report["splits"].items():
            out.setdefault(result["records"], {})[cell.split("@", 1)[1]] = result
        return list(out.values())

    layouts = [pools(r) for r in reports]
    if len({len(layout) for layout in layouts}) > 1:
        raise SystemExit("--join: the reports scored different numbers of pools")
    table, won = {}, {"all": 0, "after_warmup": 0}
    for group in zip(*layouts):
        for size in [s for s in group[0] if all(s in cells for cells in group)]:
            results = [cells[size] for cells in group]
            per: dict[str, dict] = {}
            for result in results:
                if set(per) & set(result["per_workload"]):
                    raise SystemExit(f"--join: {min(set(per) & set(result['per_workload']))} "
                                     "is held out in more than one report")
                per.update(result["per_workload"])
            models = set.intersection(*(set(r["overall"]) for r in results))
            if "calo" not in models or len(models) < 2:
                continue
            weights = np.array([len(r["per_workload"]) for r in results], float)
            parts = {"all": {m: {k: float(np.mean([per[w][m][k] for w in per]))
                                 for k in SUMMARY} for m in models}}
            if all(set(models) <= set(r["by_source"].get("evolved", {})) for r in results):
                parts["evolved"] = {m: {k: float(np.average(
                    [r["by_source"]["evolved"][m][k] for r in results], weights=weights))
                    for k in SUMMARY} for m in models}
            for means in parts.values():
                for key in SUMMARY:
                    ahead = means["calo"][key] > max(v[key] for m, v in means.items()
                                                     if m != "calo")
                    won["all"] += ahead
                    won["after_warmup"] += ahead and size != "0"
            name = "+".join(r["records"] for r in results) + f"@{size}"
            table[name] = {"workloads": len(per), **parts, "paired": paired({"per_workload": per})}
    comparisons = len(SUMMARY) * sum(part in c for c in table.values()
                                     for part in ("all", "evolved"))
    return {"cells": table, "comparisons": comparisons, "won": won["all"],
            "won_after_warmup": won["after_warmup"]}


def print_joined(summary: dict) -> None:
    """The table of `joined`: calo | the best TVM model per figure, and the paired comparison."""
    print("\njoined pools: calo | the best TVM model (tau / top-1 / top-5, mean over workloads)")
    for cell, row in summary["cells"].items():
        for part in ("all", "evolved"):
            if part not in row:
                continue
            means = row[part]
            best = {k: max(v[k] for m, v in means.items() if m != "calo") for k in SUMMARY}
            print(f"{cell} ({row['workloads']} workloads) {part:<8} "
                  + " / ".join(f"{means['calo'][k]:.3f}" for k in SUMMARY) + " | "
                  + " / ".join(f"{best[k]:.3f}" for k in SUMMARY))
        print("    per workload, calo minus the best TVM model: " + "; ".join(
            f"{k} {v['mean_diff']:+.3f} +- {v['se']:.3f} vs {v['rival']}, "
            f"{v['ahead']}/{v['workloads']}" for k, v in row["paired"].items()))
    print(f"won of {summary['comparisons']}: {summary['won']} ({summary['won_after_warmup']} "
          "after a warm-up)")


def same_run(a: dict, b: dict) -> bool:
    """Two reports of one evaluation: split, settings, donor pool and the donor model itself
    (its validation NLL; its training time differs from run to run)."""
    return (all(a.get(k) == b.get(k)
                for k in ("split", "settings", "donor_records", "device_records"))
            and a.get("donor", {}).get("val_nll") == b.get("donor", {}).get("val_nll"))


def _previous(out: Path, report: dict) -> dict:
    """What `out` holds if it is a report of the same evaluation as `report`, else {}."""
    try:
        previous = json.loads(out.read_text()) if out.is_file() else {}
    except json.JSONDecodeError:
        return {}
    return previous if same_run(previous, report) else {}


def baselines_of(path: Path | None) -> dict:
    """The splits of a previous report whose TVM rows can stand in for training the baselines
    again: theirs do not depend on our model's settings, only on the records."""
    if path is None:
        return {}
    if not path.is_file():
        raise SystemExit(f"--baselines-from: no report at {path}")
    return json.loads(path.read_text()).get("splits", {})


def with_baselines(result: dict, previous: dict) -> bool:
    """Copy TVM's rows from a previous result of the same split (same donor, warm-up and
    held-out records) into `result`; False, and nothing copied, if they differ."""
    same = ("donor_records", "warmup_records", "warmup_per_workload", "held_out_records")
    if not previous or any(previous.get(k) != result.get(k) for k in same):
        return False
    if set(previous["per_workload"]) != set(result["per_workload"]):
        return False
    tvm = lambda table: {m: v for m, v in table.items() if m != "calo"}  # noqa: E731
    result["overall"].update(tvm(previous["overall"]))
    for source, table in previous["by_source"].items():
        result["by_source"].setdefault(source, {}).update(tvm(table))
    for workload, table in previous["per_workload"].items():
        result["per_workload"][workload].update(tvm(table))
    result["not_run"] = previous.get("not_run", {})
    return True


def load_finished(out: Path, report: dict) -> dict:
    """The splits a previous run of the same evaluation already wrote to `out`: an
    interrupted run resumes after them."""
    return _previous(out, report).get("splits", {})


def save(out: Path, report: dict) -> dict:
    """Write the report merged with the splits another run of the same evaluation wrote there
    meanwhile (two runs with different --devices share one file), under a file lock."""
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = os.open(out.parent, os.O_RDONLY)  # the folder's lock: no lock file left beside
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        previous = _previous(out, report)
        report = {**previous, **report}  # e.g. extract_s, which the first run measured
        for key in ("splits", "headline", "beats_tvm", "paired"):
            report[key] = {**previous.get(key, {}), **report[key]}
        out.write_text(json.dumps(report, indent=1, default=float))
    finally:
        os.close(lock)  # closing releases the lock
    return report


def run_splits(args: argparse.Namespace, base: Settings, work: Path,
               donor_model: Path | None) -> dict:
    """Train (or reuse) the donor and score each held-out pool at each warm-up size, in the
    work directory; the report is saved to args.out after every split."""
    log = get_logger()
    os.chdir(work)  # data/ and mlflow.db of this evaluation stay out of the project's
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
    pools = work / "pools"
    if args.donor_pool.is_dir():  # a live store: its complete records, copied as they are
        host = pools / args.donor_pool.name
        records.subset_store(args.donor_pool, host, lambda n: True)
    else:
        host = unpack(args.donor_pool, pools)
    if args.split.startswith("dev"):
        names = {k: n for k, n in records.load_names(host).items()
                 if suite.operator(n) not in UNSEEN_OPERATORS}
        held = dev_held_out(sorted({suite.operator(n) for n in names.values()}))
        shapes = (dev_held_shapes(sorted(names.values()), held) if args.split == "dev-shape"
                  else set())
        out_of_donor = lambda n: suite.operator(n) in held or n in shapes  # noqa: E731
        in_donor = lambda n: n in names.values() and not out_of_donor(n)  # noqa: E731
        kept = records.subset_store(host, work / "data/records/donor", in_donor)
        runs = [(n, args.choose) for n in args.warmups or DEV_WARMUPS]
        least = max(n for n, _ in runs) + DEV_MIN_HELD
        held_out = {}
        # The held-out workloads from --selection-pool where given (its one device); else on
        # the donor's device its pool's, on another device the same workloads in that
        # device's pool (a new device too).
        for device in args.devices or ["cpu-host"]:
            if args.selection_pool:
                store = open_pool(args.selection_pool, pools)
                name = f"{args.split}-{pool_label(args.selection_pool)}"
            elif device == "cpu-host":
                store, name = host, args.split
            else:
                store, name = unpack(POOLS[device], pools), f"{args.split}-{device}"
            counts = records.count_by_workload(store)
            scored = {n for k, n in records.load_names(store).items()
                      if n in names.values() and out_of_donor(n) and counts.get(k, 0) >= least}
            held_out[name] = pools / f"{name}-held-out"
            records.subset_store(store, held_out[name], lambda n, s=scored: n in s)
            log.info(f"{name}: {len(held)} operators held out, {len(shapes)} workloads of kept "
                     f"operators held out at their shape; {len(scored)} workloads scored, "
                     f"their records in {held_out[name]}")
    else:
        in_donor = lambda n: suite.operator(n) not in UNSEEN_OPERATORS  # noqa: E731
        kept = records.subset_store(host, work / "data/records/donor", in_donor)
        held_out = ({pool_label(p): p for p in args.held_out} if args.held_out
                    else {d: HELD_OUT_POOLS[d] for d in args.devices or HELD_OUT_POOLS})
        runs = ([(n, args.choose) for n in args.warmups or (0, 8, 32, 96)]
                + [(n, "uncertainty") for n in args.compare])
    log.info(f"offline eval ({args.split}): donor pool {kept} records")

    report: dict = {"split": args.split, "settings": args.set,
                    "device_records": args.device_records,
                    "unseen_operators": list(UNSEEN_OPERATORS),
                    "donor_records": kept, "splits": {}, "headline": {}, "beats_tvm": {},
                    "paired": {}}
    settings = with_overrides(base, "donor", args.set)
    if args.pretrain_also and not any(o.startswith("graph.kind=") for o in args.set):
        settings = settings.override({"graph.kind": "device-schedule"})
    for device in args.pretrain_also:
        kept += records.subset_store(unpack(POOLS[device], pools), paths.records_dir(device),
                                     in_donor)
    report.update(donor_records=kept, pretrain_also=args.pretrain_also)
    model_dir = donor_model or work / WORK_DONOR
    if (model_dir / "model.json").is_file():
        report["donor"] = json.loads((model_dir / "donor.json").read_text())
        log.info(f"offline eval: the donor model in {model_dir}")
    else:
        start = time.perf_counter()
        for device in ("donor", *args.pretrain_also):
            extract(settings, device)
        report["extract_s"] = time.perf_counter() - start
        report["donor"] = train_donor(settings, model_dir, args.pretrain_also)
        (model_dir / "donor.json").write_text(json.dumps(report["donor"], default=float))
        log.info(f"offline eval: donor trained on {report['donor']['train_graphs']} graphs in "
                 f"{report['donor']['train_s']:.0f} s")
    if settings.finetune.keeps_donor_rows:
        model_dir = with_donor_records(settings, model_dir, work / "models" / "donor-rows",
                                       report["donor"]["train_graphs"], args.pretrain_also)
    if args.fit:
        extract(settings, "donor")  # the donor's graphs, where a saved donor was reused
        report["donor_fit"] = donor_fit(settings, model_dir)
        for part, table in report["donor_fit"].items():
            print(f"donor fit, {part} records: " + "; ".join(
                f"{m} {v['kendall_tau']:.3f}/{v['top1']:.3f}/{v['top5']:.3f}"
                for m, v in table.items()), flush=True)
    finished = load_finished(args.out, report)
    earlier = baselines_of(args.baselines_from)
    # TVM's donor models train on what our donor trained on (None: the donor's store alone)
    shared_stores = args.pretrain_also and [paths.records_dir(d)
                                            for d in (settings.donor, *args.pretrain_also)]
    for device, pool in held_out.items():
        store = open_pool(pool, pools)
        scored, donor_stores = model_dir, shared_stores or None
        if args.device_records and device != "cpu-host":
            keep = donor_model and donor_model.with_name(f"{donor_model.name}-{device}")
            scored, report.setdefault("device_models", {})[device] = device_model(
                settings, device, model_dir, pools, keep)
            donor_stores = [paths.records_dir(settings.donor), paths.records_dir(device)]
            log.info(f"offline eval: {device}'s model, fine-tuned on "
                     f"{report['device_models'][device]['records']} of its suite records")
        for count, choose in runs:
            name = f"{device}@{count}" + (f"-{choose}" if count and choose != "first" else "")
            if name in finished:
                log.info(f"offline eval: {name} is in {args.out} already")
                continue
            start = time.perf_counter()
            # TVM's models are compared on the measured-order warm-ups; the uncertainty-chosen
            # one is about our model's warm-up, and selection runs choose our settings only.
            compare = choose != "uncertainty" and (args.tvm if args.tvm is not None
                                                   else args.split == "unseen-shape")
            result = evaluate_records(settings, str(scored), str(store),
                                      warmup_records=count, choose=choose,
                                      baselines=compare and name not in earlier,
                                      donor_stores=donor_stores)
            result["wall_s"] = time.perf_counter() - start
            result["records"] = store.name  # not temporary paths
            result["model"] = f"{device} model" if scored != model_dir else "donor"
            if compare and name in earlier:
                if not with_baselines(result, earlier[name]):
                    raise SystemExit(f"{args.baselines_from} has {name} on other records: "
                                     "run without --baselines-from")
                result["baselines_from"] = str(args.baselines_from)
                log.info(f"offline eval: TVM's rows of {name} from {args.baselines_from}")
            report["splits"][name] = result
            report["headline"][name] = headline(result)
            if len(result["overall"]) > 1:
                report["beats_tvm"][name] = verdict(result)
                report["paired"][name] = paired(result)
            print(f"\n== {name}\n{format_table(result)}", flush=True)
            report = save(args.out, report)
    return report


def clear_work(work: Path, keep_donor: bool) -> None:
    """Remove a run's work directory (its unpacked pools, graphs and tracking store: some
    hundreds of MB each run); a donor trained there without --donor-model stays, so nothing
    trained is lost, and a later run reuses it by that path."""
    donor = work / WORK_DONOR
    if keep_donor and (donor / "model.json").is_file():
        for part in work.iterdir():
            if part.is_dir() and part != donor.parent:
                shutil.rmtree(part)
            elif part.is_file():
                part.unlink()
        get_logger().info(f"offline eval: the donor stays in {donor} (--donor-model reuses it)")
    else:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=["unseen-shape", "dev", "dev-shape"],
                        default="unseen-shape")
    parser.add_argument("--warmups", type=int, nargs="+", default=None,
                        help="warm-up records per held-out workload (default: 0 8 32 96; on "
                             "the selection splits 0 8 32)")
    parser.add_argument("--choose", choices=["first", "random"], default="first",
                        help="the warm-up: each workload's first measured records (default), "
                             "or its first random samples, as a new device's probes (on the "
                             "selection splits, whose pools interleave random and evolved "
                             "candidates, this leaves mostly evolved ones held out, as the "
                             "unseen-shape split's pools do from any warm-up)")
    parser.add_argument("--compare", type=int, nargs="*", default=[8, 32],
                        help="warm-up sizes also chosen by uncertainty (default: 8 32; "
                             "--compare alone: none)")
    parser.add_argument("--devices", nargs="+", default=None, choices=list(HELD_OUT_POOLS),
                        help="held-out devices (default: both; cpu-host on the selection "
                             "splits, where another device scores the same workloads from its "
                             "pool)")
    parser.add_argument("--held-out", type=Path, nargs="+", default=None, metavar="POOL",
                        help="unseen-shape split: score on these pools instead (packed .tar.gz "
                             "or store directories, any TVM database), e.g. another device's "
                             "suite pool for transfer to that device")
    parser.add_argument("--selection-pool", type=Path, default=None, metavar="POOL",
                        help="selection splits: score the one device of --devices from "
                             "this pool (packed .tar.gz or a store directory) instead of its "
                             "suite pool, e.g. benchmarks/data/selection-cpu-generic-1core.tar.gz"
                             ", the split's held-out workloads measured deep enough for "
                             "warm-ups past 8 records, or the selection-searched-* pools, "
                             "measured as the unseen-shape split's pools are")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a params.yaml value, e.g. train.rank_weight=0")
    parser.add_argument("--donor-pool", type=Path, default=POOLS["cpu-host"],
                        help="the donor pool: a packed pool (.tar.gz) or a store directory")
    parser.add_argument("--donor-model", type=Path, default=None,
                        help="reuse the donor model saved here (trained and saved there if "
                             "absent): for comparing fine-tune settings on one donor")
    parser.add_argument("--out", type=Path, default=None,
                        help="the report (default: benchmarks/results/offline_eval.json)")
    parser.add_argument("--tvm", action=argparse.BooleanOptionalAction, default=None,
                        help="train and score TVM's models too (default: on the unseen-shape "
                             "split, off on the selection split)")
    parser.add_argument("--device-records", action="store_true",
                        help="unseen-shape split: on a device other than the donor's, score "
                             "the device's model instead of the donor (the donor fine-tuned and "
                             "calibrated on the device's suite pool by the pipeline's stages, "
                             "the unseen operators left out), and train TVM's donor models on "
                             "those records too")
    parser.add_argument("--fit", action="store_true",
                        help="also rank the donor's own training records (and its validation "
                             "and test records) with the donor and with TVM's XGBModel trained "
                             "on the same records: the report's donor_fit")
    parser.add_argument("--baselines-from", type=Path, default=None, metavar="REPORT",
                        help="take TVM's rows from this earlier report where a split has the "
                             "same donor, warm-up and held-out records, instead of training "
                             "them again (they do not depend on our settings)")
    parser.add_argument("--pretrain-also", nargs="*", default=None, choices=list(POOLS),
                        metavar="DEVICE",
                        help="the donor also pre-trains on these devices' suite pools (the "
                             "records the split leaves the donor; each device's records of a "
                             "workload a workload of their own; graph kind device-schedule), and "
                             "TVM's donor models train on them too. Default: the other CPU's "
                             "pool, with the committed cpu-host donor pool; give it no devices "
                             "for a donor of one device")
    parser.add_argument("--summarize", type=Path, nargs="+", default=None, metavar="REPORT",
                        help="print an earlier report's paired comparison with TVM's models "
                             "and stop; several reports of one split whose donors differ in "
                             "their draw (--set train.seed=N): their mean over donors against "
                             "TVM's models, written to --out if given")
    parser.add_argument("--join", action="store_true",
                        help="with --summarize: reports of one donor and settings on different "
                             "held-out pools of the same devices (e.g. --held-out the split's "
                             "second pools), each device's pools joined into one comparison "
                             "over all their workloads, written to --out if given")
    args = parser.parse_args()
    if args.join and not args.summarize:
        parser.error("--join is for --summarize R1 R2 ...: reports to join")
    if args.summarize:
        missing = [str(p) for p in args.summarize if not p.is_file()]
        if missing:
            parser.error(f"--summarize: no report at {', '.join(missing)}")
        reports = [json.loads(p.read_text()) for p in args.summarize]
        if args.join or len(reports) > 1:
            summarize, show = ((joined, print_joined) if args.join
                               else (across_donors, print_across_donors))
            summary = summarize(reports)
            show(summary)
            if args.out:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(
                    {"reports": [str(p) for p in args.summarize], **summary}, indent=1))
        elif not print_paired(reports[0]):
            print(f"{args.summarize[0]}: no split with TVM's models to compare (run with --tvm)")
        return
    args.out = args.out or ROOT / "results" / "offline_eval.json"
    if args.pretrain_also is None:
        shared = args.donor_pool.resolve() == POOLS["cpu-host"] and not args.device_records
        args.pretrain_also = [d for d in POOLS if d != "cpu-host"] if shared else []
    if args.device_records and (args.split != "unseen-shape" or args.held_out):
        parser.error("--device-records is for the unseen-shape split's own held-out pools")
    if args.selection_pool and not (args.split.startswith("dev")
                                    and len(args.devices or []) == 1):
        parser.error("--selection-pool is for a selection split (--split dev or dev-shape) "
                     "with --devices naming the one device it was measured on")
    if args.selection_pool and not args.selection_pool.exists():
        parser.error(f"--selection-pool: no pool at {args.selection_pool}")
    donor_model = args.donor_model.resolve() if args.donor_model else None
    args.donor_pool = args.donor_pool.resolve()
    args.held_out = args.held_out and [p.resolve() for p in args.held_out]
    args.selection_pool = args.selection_pool and args.selection_pool.resolve()
    args.out = args.out.resolve()
    args.baselines_from = args.baselines_from and args.baselines_from.resolve()
    base = load_settings(Path("params.yaml").resolve())
    cwd = Path.cwd()
    work = Path(tempfile.mkdtemp(prefix="calo-offline-eval-"))
    try:
        report = run_splits(args, base, work, donor_model)
    finally:
        os.chdir(cwd)
        clear_work(work, keep_donor=donor_model is None)

    print(f"\nwrote {args.out}")
    for name, table in report["headline"].items():
        cells = "; ".join(f"{m} {v['kendall_tau']:.3f}/{v['top1']:.3f}/{v['top5']:.3f}"
                          for m, v in table["all"].items())
        print(f"{name:<34} tau/top1/top5  {cells}")
    print_paired(report)


if __name__ == "__main__":
    main()
