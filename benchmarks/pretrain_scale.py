"""Pre-training at scale: extraction and training throughput over processes, and peak memory
as the graph store grows from 20k to 200k graphs.

    python benchmarks/pretrain_scale.py                  # every part, in a scratch project
    python benchmarks/pretrain_scale.py --part throughput
    python benchmarks/pretrain_scale.py --part memory

Every figure is a real run of the CLI (`calo extract`, `calo pretrain [--nproc 2]`) in a
scratch project (--work) on records of the committed donor pool, measured from outside:
wall time, and the peak of the summed resident memory of the command's process tree (sampled;
shared pages count in each process). Throughput: extraction with extract.workers 1 and 2 on
the first --records record lines, pretraining --epochs epochs with 1 and 2 processes (gloo) on
those graphs, graphs/s as the run logged it to MLflow (training steps only). Memory: the peak
of `calo extract` and of one pretrain epoch at 20k and 200k graphs. The pool holds about 19k
measured records: the 20k and 200k stores repeat records (20k: a few, 200k: each about ten
times), which says nothing of accuracy and is only for memory and throughput; the JSON says
so. Each finished measurement is saved at once, so a re-run resumes after the last one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from harvest_pools import unpack  # noqa: E402

POOL = HERE / "data" / "suite-cpu-host.tar.gz"
DEVICE = "scale"
SAMPLE_S = 0.1


def measured(cmd: list[str], cwd: Path) -> dict:
    """Run cmd; its wall time and the peak summed RSS of its process tree."""
    env = {**os.environ, "CALO_PARAMS": str(cwd / "params.yaml"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{cwd / 'mlflow.db'}"}
    log = cwd / "commands.log"
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        start = time.perf_counter()
        proc = psutil.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        peak = 0
        while proc.poll() is None:
            try:
                tree = [proc, *proc.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.NoSuchProcess:
                pass
            time.sleep(SAMPLE_S)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): see {log}")
    return {"wall_s": round(time.perf_counter() - start, 2), "peak_rss_mb": round(peak / 2**20)}


def project(work: Path, name: str, changes: dict) -> Path:
    """A scratch project: params.yaml with the device `scale` as donor, measured like cpu-host
    (nothing is measured here: its records come from the pool)."""
    root = work / name
    root.mkdir(parents=True, exist_ok=True)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["devices"][DEVICE] = params["devices"][params["donor"]]
    params["donor"] = DEVICE
    params["split"]["donor_calibration"] = "record"  # a temperature like any other run's
    for dotted, value in changes.items():
        section, key = dotted.split(".")
        params[section][key] = value
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return root


def record_store(root: Path, pool_store: Path, lines: int) -> int:
    """data/records/scale: the pool's workloads and its first `lines` record lines, repeated
    from the start when the pool has fewer. Returns how many lines are repeats."""
    store = root / "data" / "records" / DEVICE
    if (store / "database_tuning_record.json").exists():
        return max(0, lines - _lines(pool_store))
    store.mkdir(parents=True)
    for name in ("database_workload.json", "workloads.json", "record_meta.jsonl"):
        if (pool_store / name).exists():
            shutil.copy(pool_store / name, store / name)
    source = (pool_store / "database_tuning_record.json").read_text().splitlines(keepends=True)
    with open(store / "database_tuning_record.json", "w") as out:
        for i in range(lines):
            out.write(source[i % len(source)])
    return max(0, lines - len(source))


def _lines(store: Path) -> int:
    with open(store / "database_tuning_record.json") as f:
        return sum(1 for _ in f)


def graphs_per_s(root: Path) -> float:
    with sqlite3.connect(root / "mlflow.db") as db:
        (value,) = db.execute(
            "SELECT m.value FROM metrics m JOIN runs r ON m.run_uuid = r.run_uuid WHERE "
            "m.key = 'train_graphs_per_s' ORDER BY r.start_time DESC LIMIT 1").fetchone()
    return round(value, 1)


def calo(*args: str) -> list[str]:
    return [sys.executable, "-m", "calo.cli", *args]


def throughput(work: Path, pool_store: Path, records: int, epochs: int, report: dict,
               save) -> None:
    extraction = report.setdefault("extraction", {})
    for workers in (1, 2):
        if str(workers) in extraction:
            continue
        root = project(work, f"extract-{workers}", {"extract.workers": workers})
        record_store(root, pool_store, records)
        shutil.rmtree(root / "data" / "graphs", ignore_errors=True)
        run = measured(calo("extract", "--device", DEVICE), root)
        graphs = json.loads((root / "data" / "graphs" / DEVICE / "manifest.json").read_text())
        extraction[str(workers)] = {**run, "records": records, "graphs": graphs["graphs"],
                                    "graphs_per_s": round(graphs["graphs"] / run["wall_s"], 1)}
        print(f"extract, {workers} worker(s): {extraction[str(workers)]}")
        save()
    extraction["speedup"] = round(extraction["2"]["graphs_per_s"]
                                  / extraction["1"]["graphs_per_s"], 2)
    training = report.setdefault("training", {})
    # "1" and "2" processes at torch's own thread count (train.threads null: the cores, shared
    # out among the processes); "1-thread": one process at one thread (train.threads as
    # shipped), what each of two processes gets on 2 cores.
    for name, nproc, threads in (("1", 1, None), ("2", 2, None), ("1-thread", 1, 1)):
        if name in training:
            continue
        root = project(work, f"train-{name}", {"train.max_epochs": epochs,
                                                "train.patience": None, "train.threads": threads})
        graphs = root / "data" / "graphs" / DEVICE
        if not graphs.exists():
            shutil.copytree(work / "extract-2" / "data" / "graphs" / DEVICE, graphs)
        run = measured(calo("pretrain", "--nproc", str(nproc)), root)
        training[name] = {**run, "epochs": epochs, "graphs_per_s": graphs_per_s(root)}
        print(f"pretrain, {name} process(es): {training[name]}")
        save()
    training["speedup"] = round(training["2"]["graphs_per_s"] / training["1"]["graphs_per_s"], 2)
    training["threads_speedup"] = round(training["1"]["graphs_per_s"]
                                        / training["1-thread"]["graphs_per_s"], 2)
    save()


def memory(work: Path, pool_store: Path, sizes: list[int], report: dict, save) -> None:
    mem = report.setdefault("memory", {})
    for size in sorted(sizes):
        entry = mem.setdefault(str(size), {})
        root = project(work, f"memory-{size}", {"train.max_epochs": 1, "train.patience": None})
        if "extract" not in entry:
            entry["repeated_records"] = record_store(root, pool_store, size)
            entry["extract"] = measured(calo("extract", "--device", DEVICE), root)
            print(f"extract {size} records: {entry['extract']}")
            save()
        if "pretrain_epoch" not in entry:
            entry["pretrain_epoch"] = measured(calo("pretrain"), root)
            entry["graphs"] = json.loads((root / "data" / "graphs" / DEVICE /
                                          "manifest.json").read_text())["graphs"]
            print(f"one pretrain epoch on {entry['graphs']} graphs: {entry['pretrain_epoch']}")
            save()
    if len(sizes) > 1:
        small, big = (mem[str(s)] for s in (min(sizes), max(sizes)))
        report["memory_ratio"] = {
            part: round(big[part]["peak_rss_mb"] / small[part]["peak_rss_mb"], 2)
            for part in ("extract", "pretrain_epoch")}
    report["memory_note"] = ("stores beyond the pool's measured records repeat its records: "
                             "for memory and throughput only")
    save()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["throughput", "memory", "all"], default="all")
    parser.add_argument("--records", type=int, default=16384,
                        help="record lines extracted and trained on for throughput")
    parser.add_argument("--epochs", type=int, default=3, help="pretrain epochs for throughput")
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 200_000],
                        help="record counts extracted, then trained one epoch, for peak memory")
    parser.add_argument("--work", type=Path, default=REPO / "benchmarks" / ".scale")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "pretrain_scale.json")
    args = parser.parse_args()
    report = json.loads(args.out.read_text()) if args.out.exists() else {}
    report.update({"pool": POOL.name, "cpus": os.cpu_count(),
                   "gpu": "none lent" if not _cuda() else "present (not measured here)"})

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))

    pool_store = args.work / "pool"
    if not pool_store.exists():
        unpacked = unpack(POOL, args.work / "unpacked")
        unpacked.rename(pool_store)
    if args.part in ("throughput", "all"):
        throughput(args.work, pool_store, args.records, args.epochs, report, save)
    if args.part in ("memory", "all"):
        memory(args.work, pool_store, args.sizes, report, save)
    print(json.dumps(report, indent=1))


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    main()
