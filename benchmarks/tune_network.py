"""Whole networks tuned on the 1-core generic x86-64 device: CALO vs TVM's XGBoost, same budget.

The device's model is made by the pipeline's own stages from the committed pools: the donor
pre-trained on `suite-cpu-host`, fine-tuned and calibrated on `suite-cpu-generic-1core` (the
device's measured records), registered and promoted. Then `calo tune-network`'s stage tunes
each network with it and with XGBoost under the same trial budget and task scheduler, compiles
it untuned / with each database, checks outputs against PyTorch and times it end to end.

One run per network is one draw: which candidates the first rounds sample moves the final
latency by several percent. `--seeds K` tunes every network K times (tune.seed 0..K-1; the two
models' order alternates with the seed, so neither always meets the colder machine) and reports
each run and, per network, the median over seeds of the time CALO took to reach XGBoost's final
latency (a run where it never did counts as slower than any that did).

The work directory keeps the model and every finished run, so an interrupted benchmark resumes
where it stopped (`--fresh` starts over). Run from the repository root:

    python benchmarks/tune_network.py [--trials 256] [--seeds 3] [--networks small-cnn encoder]

`--model DIR` tunes with a saved model instead (`calo.artifact`, e.g. the donor that
`offline_eval.py --donor-model DIR` trains on both CPU pools), registered and promoted as the
device's model in the work directory; give each model its own `--work`.

Prints the table and writes benchmarks/results/tune_network.json (and the curves' PNG, of seed
0's runs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
from pathlib import Path

from calo.devices import preload_tensor_intrinsics

preload_tensor_intrinsics()  # before torch_geometric is imported

from harvest_pools import overrides, pool_settings, unpack  # noqa: E402

from calo import paths, records, registry  # noqa: E402
from calo.config import load_settings  # noqa: E402
from calo.log import get_logger  # noqa: E402

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data"
DEVICE = "cpu-generic-1core"
DONOR_POOL, DEVICE_POOL = DATA / "suite-cpu-host.tar.gz", DATA / "suite-cpu-generic-1core.tar.gz"
# Batch per network: the recommender at batch 1 is a few thousand FLOPs, all runtime overhead.
NETWORKS = {"small-cnn": 1, "encoder": 1, "recommender": 64}


def device_model(settings, work: Path) -> str:
    """The pipeline's stages from the committed pools up to the device's promoted model."""
    from calo.tasks.calibrate import calibrate
    from calo.tasks.extract import extract
    from calo.tasks.finetune import finetune
    from calo.tasks.pretrain import pretrain
    from calo.tasks.promote import promote

    if registry.aliased_version(settings, DEVICE) is not None:
        return "reused"
    log = get_logger()
    start = time.perf_counter()

    def add_pool(pool: Path, device: str) -> None:
        store = unpack(pool, work / "pools")
        records.subset_store(store, paths.records_dir(device), lambda name: True)
        extract(settings, device)

    add_pool(DONOR_POOL, settings.donor)
    pretrain(settings)
    add_pool(DEVICE_POOL, DEVICE)
    finetune(settings, DEVICE)
    calibrate(settings, DEVICE)
    promote(settings, DEVICE)
    log.info(f"tune-network benchmark: device model ready in {time.perf_counter() - start:.0f} s")
    return "trained"


def saved_model(settings, model_dir: Path) -> str:
    """A saved model registered and promoted as the device's model, as the pipeline's stages
    would leave theirs."""
    from calo.artifact import TrainedModel

    trained = TrainedModel.load(model_dir)  # refuses a directory that holds no model
    current = registry.aliased_version(settings, DEVICE)
    if current is not None and (current.tags.get("artifact_sha256")
                                != registry.artifact_digest(model_dir)):
        raise SystemExit(f"{DEVICE} already has another model (version {current.version}) in "
                         f"this work directory: give --model its own --work")
    with registry.start_run(settings, "tune-network-benchmark", f"model-{DEVICE}"):
        version = registry.register(settings, model_dir, tags={**trained.info, "device": DEVICE},
                                    description=f"Saved model {model_dir}, tuning {DEVICE}.")
    registry.set_alias(settings, DEVICE, version)
    return str(model_dir)


def median_ratio(ratios: list[float | None]) -> float | None:
    """Median over seeds of CALO's time to XGBoost's final latency over XGBoost's tuning time;
    a run that never reached it counts as slower than every run that did (None if the median
    is such a run)."""
    ordered = sorted(math.inf if r is None else r for r in ratios)
    n = len(ordered)
    mid = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    return None if math.isinf(mid) else mid


def summary(runs: dict[str, dict]) -> dict:
    """Per network over its seeds: the median time ratio, how often CALO reached XGBoost's
    final latency, and how often its compiled network was the faster one."""
    ratios = [r["calo_time_ratio_vs_xgb"] for r in runs.values()]
    return {"seeds": len(runs), "median_time_ratio": median_ratio(ratios),
            "reached": sum(r is not None for r in ratios),
            "calo_faster_end_to_end": sum(r["end_to_end_us"]["calo"] < r["end_to_end_us"]["xgb"]
                                          for r in runs.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=256,
                        help="measured candidates per network and model")
    parser.add_argument("--seeds", type=int, default=1, help="runs per network (tune.seed)")
    parser.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
    parser.add_argument("--work", type=Path, default=Path("/tmp/calo-tune-network-bench"))
    parser.add_argument("--fresh", action="store_true", help="start over (drop the work dir)")
    parser.add_argument("--model", type=Path, default=None,
                        help="tune with this saved model directory instead of the pipeline's")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a params.yaml value, e.g. tune.calo_search.eps_greedy=0.25")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "tune_network.json")
    args = parser.parse_args()
    out, work = args.out.resolve(), args.work.resolve()
    saved = args.model and args.model.resolve()
    base = load_settings(Path("params.yaml").resolve())
    if args.fresh:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)  # data/, metrics/ and mlflow.db of the benchmark stay out of the project's
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
    settings = pool_settings(base, "donor", "cpu-host").override(
        {"donor": "suite-cpu-host", "targets": [DEVICE], **overrides(args.set)})

    from calo.tasks.tune_network import tune_network, write_report

    model = saved_model(settings, saved) if saved else device_model(settings, work)
    done_file = work / "runs.json"
    done = json.loads(done_file.read_text()) if done_file.is_file() else {}
    runs: dict[str, dict[str, dict]] = {name: {} for name in args.networks}
    for seed in range(args.seeds):  # every network once, then again: any prefix is balanced
        for name in args.networks:
            key = f"{name}/{seed}"
            finished = done.get(key, {})
            if (finished.get("trials_budget"), finished.get("set", [])) != (args.trials, args.set):
                seeded = settings.override({"tune.seed": seed})
                done[key] = tune_network(seeded, DEVICE, name, args.trials, NETWORKS[name])
                done[key]["set"] = args.set
                done_file.write_text(json.dumps(done, indent=1))  # resumes after this run
            runs[name][str(seed)] = done[key]
    write_report(settings, DEVICE, {name: by_seed["0"] for name, by_seed in runs.items()})
    png = paths.report_path("tune-network", DEVICE).with_name(f"{DEVICE}-curves.png")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(png, out.with_suffix(".png"))
    result = {"device": DEVICE, "trials": args.trials, "seeds": args.seeds, "model": model,
              "set": args.set,
              "summary": {name: summary(by_seed) for name, by_seed in runs.items()},
              "runs": runs}
    out.write_text(json.dumps(result, indent=1))

    print(f"\n{'network':<13}{'seed':>5}{'batch':>6}{'untuned us':>12}{'xgb us':>10}"
          f"{'calo us':>10}{'xgb tune s':>12}{'calo tune s':>12}{'calo time to xgb final':>24}")
    for name, by_seed in runs.items():
        for seed, r in by_seed.items():
            e2e, wall = r["end_to_end_us"], r["tuning_wall_s"]
            ratio = r["calo_time_ratio_vs_xgb"]
            print(f"{name:<13}{seed:>5}{r['batch']:>6}{e2e['untuned']:>12.1f}{e2e['xgb']:>10.1f}"
                  f"{e2e['calo']:>10.1f}{wall['xgb']:>12.0f}{wall['calo']:>12.0f}"
                  f"{'not reached' if ratio is None else f'{ratio:.2f}x':>24}")
        s = result["summary"][name]
        median = s["median_time_ratio"]
        print(f"{name:<13}{'median over ' + str(s['seeds']) + ' seeds':>81}"
              f"{'not reached' if median is None else f'{median:.2f}x':>24}  (reached in "
              f"{s['reached']}/{s['seeds']}, CALO's network faster in "
              f"{s['calo_faster_end_to_end']}/{s['seeds']})")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
