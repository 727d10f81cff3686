"""Offline evaluation on the committed suite pools: unseen operators and an unseen device.

Both splits run `calo evaluate` (tasks.evaluate) on measured records that the model never trained
on, beside TVM's XGBModel and MLPModel:

  unseen-workload  a third of each family's operators (chosen by a stable hash of the name) is
                   held out; the donor model and the `*_donor` baselines train on the other
                   operators' cpu-host records only. Zero-shot (no warm-up) and few-shot (the
                   first --warmup-fraction of each held-out operator's records).
  unseen-device    the donor model trains on all cpu-host records; it is evaluated on the
                   1-core generic x86-64 device's records of the same suite, with warm-up.

The donor model's temperature is fitted on its own validation split, as calibrate does. Run from
the repository root:

    python benchmarks/offline_eval.py [--warmup-fraction 0.25] [--set model.head=deterministic]

Prints both tables and writes benchmarks/results/offline_eval.json (or --out).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tarfile
import tempfile
import time
from pathlib import Path

from calo.devices import preload_tensor_intrinsics

preload_tensor_intrinsics()  # before torch_geometric is imported

import yaml  # noqa: E402

from calo import records, suite  # noqa: E402
from calo.config import Settings, load_settings  # noqa: E402
from calo.tasks.evaluate import evaluate_records, format_table  # noqa: E402
from calo.tasks.extract import extract  # noqa: E402
from calo.tasks.pretrain import donor_splits, train_on_donor  # noqa: E402

ROOT = Path(__file__).resolve().parent
POOLS = {"cpu-host": ROOT / "data" / "suite-cpu-host.tar.gz",
         "cpu-generic-1core": ROOT / "data" / "suite-cpu-generic-1core.tar.gz"}
HELD_OUT_SHARE = 3  # every third operator of a family, in hash order


def held_out_operators(names: list[str]) -> set[str]:
    by_family: dict[str, list[str]] = {}
    for name in names:
        by_family.setdefault(suite.family(name), []).append(name)
    held = set()
    for group in by_family.values():
        ranked = sorted(group, key=lambda n: hashlib.sha1(n.encode()).hexdigest())
        held |= set(ranked[::HELD_OUT_SHARE])
    return held


def with_overrides(settings: Settings, donor: str, overrides: list[str]) -> Settings:
    """The settings with `donor` as the donor device and SECTION.KEY=VALUE overrides."""
    changes = {"donor": donor,
               f"devices.{donor}": {"target": {"kind": "llvm"}, "candidates_per_workload": 0}}
    for item in overrides:
        key, _, value = item.partition("=")
        changes[key] = yaml.safe_load(value)
    return settings.override(changes)


def train_donor(settings: Settings, out: Path) -> dict:
    """Train and calibrate a donor model on settings.donor's extracted store; save it to out."""
    train, val, test = donor_splits(settings)
    start = time.perf_counter()
    trained, metrics = train_on_donor(settings, train, val, test)
    trained.save(out)
    return {"train_graphs": len(train), "train_s": time.perf_counter() - start, **metrics}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup-fraction", type=float, default=0.25)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a params.yaml value, e.g. model.head=deterministic")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "offline_eval.json")
    args = parser.parse_args()
    args.out = args.out.resolve()
    base = load_settings(Path("params.yaml").resolve())
    work = Path(tempfile.mkdtemp(prefix="calo-offline-eval-"))
    os.chdir(work)  # data/ and mlflow.db of this evaluation stay out of the project's
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
    for pool in POOLS.values():
        with tarfile.open(pool) as tar:
            tar.extractall(work / "data" / "records", filter="data")
    host = work / "data" / "records" / "cpu-host"
    names = sorted(set(records.load_names(host).values()))
    held = held_out_operators(names)
    records.subset_store(host, work / "data/records/seen", lambda n: n not in held)
    records.subset_store(host, work / "data/records/unseen", lambda n: n in held)

    report: dict = {"settings": args.set, "warmup_fraction": args.warmup_fraction,
                    "held_out_operators": sorted(held), "splits": {}}
    seen = with_overrides(base, "seen", args.set)
    extract(seen, seen.donor)
    report["seen_donor"] = train_donor(seen, work / "models" / "seen")
    for fraction in (0.0, args.warmup_fraction):
        name = f"unseen-workload@{fraction:g}"
        result = evaluate_records(seen, str(work / "models" / "seen"),
                                     str(work / "data/records/unseen"), fraction)
        report["splits"][name] = result
        print(f"\n== {name}\n{format_table(result)}")

    everything = with_overrides(base, "cpu-host", args.set)
    extract(everything, everything.donor)
    report["host_donor"] = train_donor(everything, work / "models" / "cpu-host")
    name = f"unseen-device@{args.warmup_fraction:g}"
    result = evaluate_records(everything, str(work / "models" / "cpu-host"),
                                 str(work / "data/records/cpu-generic-1core"),
                                 args.warmup_fraction)
    report["splits"][name] = result
    print(f"\n== {name}\n{format_table(result)}")

    for result in report["splits"].values():  # names, not this run's temporary paths
        result["records"] = Path(result["records"]).name
        result["model"] = Path(result["model"]).name
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=float))
    print(f"\nwrote {args.out}")
    for split, result in report["splits"].items():
        cells = ", ".join(f"{m}: tau {v['kendall_tau']:.3f} top1 {v['top1']:.3f}"
                          + (f" ece {v['ece']:.3f} nll {v['nll']:.3f}" if v.get("ece") else "")
                          for m, v in result["overall"].items())
        print(f"{split}: {cells}")


if __name__ == "__main__":
    main()
