"""Fine-tune settings side by side on one extraction: for choosing the fine-tune rule.

Each variant (a list of SECTION.KEY=VALUE overrides of params.yaml, or null: the donor as it
is, zero-shot on the same held-out records) fine-tunes the donor on `--warmup` records of
every workload, its first random samples (as a new device's probes; `--choose first`: its
first measured), and is scored on the rest exactly as `calo evaluate --choose random` scores
it (tasks.evaluate.fine_tuned and score_held_out). The graphs are extracted once for all
variants, most of an evaluation's time. Use a selection split's held-out store (offline_eval.py
`--split dev-shape` logs where it put it), not the unseen-shape pools, which only report:

    python benchmarks/finetune_sweep.py --records STORE --donor-model DIR --warmup 32 \\
        --variants benchmarks/finetune_variants.yaml --out results/sweep32.json

Prints a line per variant (tau / top-1 / top-5 on all and on evolved candidates, ECE) and
writes --out after each, so a second run goes on after the variants already there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from calo.devices import preload_tensor_intrinsics

preload_tensor_intrinsics()  # before torch_geometric is imported

import yaml  # noqa: E402
from offline_eval import SUMMARY, with_overrides  # noqa: E402

from calo.artifact import TrainedModel  # noqa: E402
from calo.config import load_settings  # noqa: E402
from calo.errors import CaloError  # noqa: E402
from calo.graphs import graph_set  # noqa: E402
from calo.log import Progress, get_logger  # noqa: E402
from calo.tasks.evaluate import (  # noqa: E402
    fine_tuned,
    score_held_out,
    scored_records,
    split_warmup,
    summarize,
)


def figures(metrics: dict) -> str:
    return " / ".join("-" if metrics[k] is None else f"{metrics[k]:.3f}" for k in SUMMARY)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path, required=True, help="a store or TVM database")
    parser.add_argument("--donor-model", type=Path, required=True)
    parser.add_argument("--warmup", type=int, required=True, help="records per workload")
    parser.add_argument("--choose", choices=["first", "random"], default="random",
                        help="the warm-up: each workload's first random samples (default), as a "
                             "new device's probes, or its first measured records")
    parser.add_argument("--variants", type=Path, required=True,
                        help="YAML: name -> list of SECTION.KEY=VALUE, or null (no fine-tune)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    log = get_logger()
    variants = yaml.safe_load(args.variants.read_text())
    if not isinstance(variants, dict) or not all(v is None or isinstance(v, list)
                                                 for v in variants.values()):
        raise SystemExit(f"{args.variants}: expected name -> list of overrides (or null)")
    base = load_settings(Path("params.yaml").resolve())
    donor = TrainedModel.load(args.donor_model)
    recs = scored_records(args.records)
    if not recs:
        raise SystemExit(f"no successful measurements in {args.records}")
    splits = split_warmup(recs, count=args.warmup, random_first=args.choose == "random")
    held = {name: h for name, (_, h) in splits.items() if len(h) >= 2}
    warm = [r for w, _ in splits.values() for r in w]
    if not held or not warm:
        raise SystemExit(f"{args.records}: no workload keeps records past {args.warmup}")
    kind = donor.graph_kind
    settings_of = {name: with_overrides(base, "donor", overrides or [])
                   for name, overrides in variants.items()}
    # Per-store rows where the network or some variant's trees (finetune.rule) read them.
    stores = donor.reads_stores or any(s.finetune.corrects for s in settings_of.values())
    warm_graphs = graph_set(kind, warm, Progress("sweep: warm-up graphs", len(warm),
                                                 "records").advance, stores)
    progress = Progress("sweep: held-out graphs", sum(map(len, held.values())), "records")
    held_graphs = {name: graph_set(kind, group, progress.advance, stores)
                   for name, group in held.items()}
    key = {"records": str(args.records.resolve()), "donor": str(args.donor_model.resolve()),
           "warmup": args.warmup, "choose": args.choose}
    report = json.loads(args.out.read_text()) if args.out.is_file() else {}
    if report.get("key", key) != key:
        raise SystemExit(f"{args.out} holds another sweep ({report['key']}): choose another --out")
    report["key"], results = key, report.setdefault("variants", {})
    for name, overrides in variants.items():
        if name in results:
            continue
        settings = settings_of[name]
        trained, how = donor, {}
        if overrides is not None:
            try:
                trained, how = fine_tuned(donor, settings, warm_graphs, warm)
            except CaloError as err:
                raise SystemExit(f"variant {name}: {err}") from None
        per_source, pooled = score_held_out(trained, held, held_graphs.__getitem__,
                                            settings.calibrate.levels)
        results[name] = {"overrides": overrides, "temperature": trained.temperature, **how,
                         **{source: summarize(table["calo"], pooled if source == "all"
                                              else pooled["by_source"].get(source))
                            for source, table in per_source.items()}}
        a, e = results[name]["all"], results[name]["evolved"]
        print(f"{name:<28} all {figures(a)} | evolved {figures(e)} | ECE {a['ece']:.3f}",
              flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=float))
    log.info(f"sweep: {len(results)} variants in {args.out}")


if __name__ == "__main__":
    main()
