"""What weight of the device's trees would have ordered the held-out candidates best, and
whether the fine-tune's held-back probes could have told: `offline_eval.py` run as it is, with
two of `calo evaluate`'s steps wrapped.

At every warm-up whose rule row blends throughput trees (and fits them on the warm-up alone):

- probes: trees fitted on the fine-tune's share of the warm-up (the records it learns from)
  score the records it held back, at each weight in WEIGHTS (0: the network's mean alone,
  1: the trees alone), by the mean over workloads of tau + top-1 + top-5;
- held out: the shipped trees (fitted on every warm-up record) and trees of TVM's kind alone
  (finetune.correction.members [tvm]) score the held-out candidates at each weight, on all
  of them and on the evolved ones; per workload too (all candidates), with the fine-tuned
  network's mean epistemic variance of its candidates.

Zero-shot (a warm-up of 0 records), where the donor keeps trees fitted on its own records
(calo.correction.donor_trees), those trees score the held-out candidates at each weight; no
probes, no trees of TVM's kind (`-` in the table). So do a warm-up's, where the rule's row
fits its trees on the donor's records and the warm-up together (`donor_records`: every row of
the shipped rule).

Every argument is offline_eval.py's; the scan goes to --scan-out, one entry per warm-up (the
report's name, the device, the pool's first workload and the fine-tune's records per workload
name it):

    python benchmarks/tree_weight_scan.py --scan-out F --split dev-shape \
        --donor-model DIR --warmups 32 96 --choose random --compare --no-tvm --out REPORT

It ends with a table of every entry in F (`--scan-out F --show` prints it without running): the
held-out sum of tau + top-1 + top-5 on all candidates and on the evolved ones at each weight, the
rule's in brackets, the weight the probes choose and TVM's kind alone at the rule's weight, each
with its change from the rule's. `--scan-out F --show --join G` prints the table of F and G
joined: the same runs (reports and devices, each with the same warm-ups) on a second pool's
workloads, each entry of F with G's of the same run and warm-up, as one scan of both pools'
workloads (each held-out figure their mean, weighted by the workloads each scored); a run
only one of them has is named and left out.
"""

from __future__ import annotations

import dataclasses
import json
import re
import runpy
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import offline_eval  # noqa: E402,F401  (loads TVM's tensor intrinsics first)

from calo.correction import fit_correction, store_devices, store_rows  # noqa: E402
from calo.evaluation import mean_ranking, ranking  # noqa: E402
from calo.models.training import predict  # noqa: E402
from calo.records import describe_target, target_key  # noqa: E402
from calo.tasks import evaluate  # noqa: E402

WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)
FIGURES = ("kendall_tau", "top1", "top5")


def held_out_sum(cell: dict) -> float:
    """tau + top-1 + top-5 on all held-out candidates and on the evolved ones."""
    return sum(part[f] for part in cell.values() for f in FIGURES)


def summary_rows(scan: dict) -> list[dict]:
    """Per entry: the held-out sum at each weight, the probes' choice (the rule's weight on a
    tie) and TVM's kind alone at the rule's weight; None for either where a zero-shot entry
    has none (no probes, the donor's trees only)."""
    rows = []
    for name, entry in scan.items():
        rule = float(entry["weight"])
        sums = {w: held_out_sum(entry["held_out"][f"shipped@{w}"]) for w in WEIGHTS}
        choice, tvm = None, entry["held_out"].get(f"tvm@{rule}")
        if entry["probes"]:
            probes = {w: sum(entry["probes"][f"shipped@{w}"][f] for f in FIGURES)
                      for w in WEIGHTS}
            choice = (rule if probes[rule] >= max(probes.values())
                      else max(WEIGHTS, key=probes.get))
        rows.append({"entry": name, "rule": rule, "sums": sums, "probes_choose": choice,
                     "tvm": None if tvm is None else held_out_sum(tvm)})
    return rows


def entry_label(name: str) -> str:
    """'REPORT CPU FIRST-WORKLOAD @N' out of the key the scan writes: the report, the device's
    CPU, the pool's first workload and the fine-tune's records per workload."""
    report, rest = name.split(": ", 1)
    cpu = re.search(r"-mcpu=(\S+)", rest)
    pool, per_workload = rest.rsplit("@", 1)
    first = re.sub(r"^(llvm|cuda)(\s+-\S+)*\s+", "", pool).split(" @ ")[0]
    return f"{report}  {cpu.group(1) if cpu else '-'}  {first}  @{per_workload}"


def entry_run(name: str) -> tuple[str, str]:
    """The report and the device target out of an entry's key: what two pools' runs share."""
    report, rest = name.split(": ", 1)
    pool = rest.split(" @ ")[0]  # a workload of a several-target pool: 'name @ target'
    return report, pool.rsplit(" ", 1)[0] if " " in pool else ""


def runs(scan: dict) -> dict[tuple, list]:
    """A scan's entries by run (report and device), each run's in the order scanned."""
    out: dict[tuple, list] = {}
    for name, entry in scan.items():
        out.setdefault(entry_run(name), []).append((name, entry))
    return out


def paired(first: dict, second: dict) -> list[tuple[str, dict, dict]]:
    """Entries of two scans paired by run (report and device) and, within a run, by order:
    its warm-ups as they were scanned. A run in both must have as many entries in each; a
    run in one only is left out (`unpaired`)."""
    a, b = runs(first), runs(second)
    for run in a.keys() & b.keys():
        if len(a[run]) != len(b[run]):
            report, device = run
            raise SystemExit(f"tree_weight_scan.py: --join: run '{report}' on '{device}' has "
                             f"{len(a[run])} entries in one scan and {len(b[run])} in the "
                             "other; a run must scan the same warm-ups on both pools")
    return [(name, x, y) for run in a if run in b for (name, x), (_, y) in zip(a[run], b[run])]


def unpaired(first: dict, second: dict) -> list[str]:
    """The runs ('report on device') that only one of two scans has."""
    a, b = runs(first), runs(second)
    return sorted(f"{report} on {device or '-'}" for report, device in a.keys() ^ b.keys())


def joined(first: dict, second: dict) -> dict:
    """Two scans of the same runs on two pools' workloads as one: entries paired by run and
    order (`paired`), each held-out figure the mean of the two weighted by the workloads each
    entry scored. The rule's weight is the second's (a later run, the rule as it is now): the
    weight only orders, so a fine-tune is the same under any rule weight, and every weight is
    scanned."""
    out = {}
    for name, a, b in paired(first, second):
        n_a, n_b = len(a["per_workload"]), len(b["per_workload"])
        held_out = {key: {part: {f: (n_a * a["held_out"][key][part][f]
                                     + n_b * b["held_out"][key][part][f]) / (n_a + n_b)
                                 for f in FIGURES}
                          for part in a["held_out"][key]}
                    for key in a["held_out"]}
        probes = {key: {f: (a["probe_records"] * a["probes"][key][f]
                            + b["probe_records"] * b["probes"][key][f])
                        / (a["probe_records"] + b["probe_records"]) for f in FIGURES}
                  for key in a["probes"]}
        out[f"{name} + {n_b} workloads"] = {
            "weight": b["weight"], "probe_records": a["probe_records"] + b["probe_records"],
            "probes": probes, "held_out": held_out,
            "per_workload": {**a["per_workload"], **b["per_workload"]}}
    return out


def print_summary(scan: dict) -> None:
    print("held-out tau + top-1 + top-5 (all and evolved candidates) at each weight of the "
          "trees, the rule's in brackets; @N: the fine-tune's records per workload")
    rows = summary_rows(scan)
    width = max(len(entry_label(r["entry"])) for r in rows)
    print(f"{'entry':<{width}}" + "".join(f"{w:>9g}" for w in WEIGHTS)
          + f"  {'probes choose':<16}  TVM's kind alone")
    for row in rows:
        at_rule = row["sums"][row["rule"]]
        cells = "".join((f"[{s:.3f}]" if w == row["rule"] else f"{s:.3f} ").rjust(9)
                        for w, s in row["sums"].items())
        choice, tvm = row["probes_choose"], row["tvm"]
        chosen = "-" if choice is None else f"{choice:g} ({row['sums'][choice] - at_rule:+.3f})"
        alone = "-" if tvm is None else f"{tvm:.3f} ({tvm - at_rule:+.3f})"
        print(f"{entry_label(row['entry']):<{width}}{cells}  {chosen:<16}  {alone}")


def main() -> None:
    args = sys.argv[1:]
    if "--scan-out" not in args or args.index("--scan-out") + 1 >= len(args):
        raise SystemExit("tree_weight_scan.py: --scan-out F is required (then offline_eval.py's "
                         "arguments)")
    at = args.index("--scan-out")
    out = Path(args[at + 1]).resolve()
    del args[at:at + 2]
    scan = json.loads(out.read_text()) if out.is_file() else {}
    if args[:1] == ["--show"]:
        if not scan:
            raise SystemExit(f"tree_weight_scan.py: no scan in {out}")
        if args[1:2] == ["--join"] and len(args) == 3:
            other = Path(args[2])
            if not other.is_file():
                raise SystemExit(f"tree_weight_scan.py: --join: no scan in {other}")
            first, second = scan, json.loads(other.read_text())
            scan = joined(first, second)
            for run in unpaired(first, second):
                print(f"left out, in one scan only: {run}")
            if not scan:
                raise SystemExit(f"tree_weight_scan.py: --join: no run of {out} is in {other}")
        elif len(args) > 1:
            raise SystemExit("tree_weight_scan.py: --show takes only --join G")
        print_summary(scan)
        return
    # Runs that differ in donor or settings (--set train.seed=N) write different reports.
    report = Path(args[args.index("--out") + 1]).stem if "--out" in args[:-1] else "offline_eval"
    warmup: dict = {}
    adapt, score_held_out = evaluate.adapt, evaluate.score_held_out

    def scanned_adapt(trained, finetune, train, graphs, val, targets, label=None):
        step = finetune.step_for(graphs.per_workload(), trained.trained_on(targets),
                                 train.fast_weight)
        result = adapt(trained, finetune, train, graphs, val, targets, label)
        warmup.clear()
        if not (step.blend and step.correction and val is not graphs):
            return result
        counts = {w: graphs.workload.count(w) + val.workload.count(w) for w in set(graphs.workload)}
        if step.donor_records:
            # Trees of the donor's records and the warm-up: refitting them on the probes'
            # complement costs what the fine-tune does, so the held-out scan alone.
            warmup.update(per_workload=graphs.per_workload(), probes={}, probe_records=len(val),
                          counts=counts, weight=step.blend, tvm=None)
            return result
        mu = predict(trained.net, val.graphs).gamma.double().numpy()
        y, rows = val.labels().double().numpy(), store_rows(val.graphs)
        tvm = dataclasses.replace(finetune.correction, members=("tvm",))
        probes = {}
        for kind, settings in (("shipped", finetune.correction), ("tvm", tvm)):
            trees = fit_correction(trained.net, settings, step.correction, graphs.graphs,
                                   graphs.workload, train.seed, step.blend)
            t = trees.log_latency(rows, val.workload)
            for w in WEIGHTS:
                probes[f"{kind}@{w}"] = mean_ranking(y, (1 - w) * mu + w * t, val.workload)
        warmup.update(per_workload=graphs.per_workload(), probes=probes, probe_records=len(val),
                      counts=counts,
                      weight=step.blend,
                      tvm=fit_correction(trained.net, tvm, step.correction,
                                         [*graphs.graphs, *val.graphs],
                                         [*graphs.workload, *val.workload], train.seed,
                                         step.blend))
        return result

    def scanned_records(settings, model_spec, records_dir, warmup_fraction=0.0,
                        warmup_records=None, *rest, **options):
        # A cell without a warm-up calls no fine-tune: what it scores is the donor's.
        warmup.clear()
        zero_shot[:] = [not warmup_fraction and not warmup_records]
        return evaluate_records(settings, model_spec, records_dir, warmup_fraction,
                                warmup_records, *rest, **options)

    def scanned_score(trained, held, graphs_of, levels, baselines=None):
        result = score_held_out(trained, held, graphs_of, levels, baselines)
        donor_trees = trained.correction
        if zero_shot[0] and donor_trees is not None and donor_trees.blend \
                and donor_trees.general:
            # Zero-shot: the donor's trees, fitted on its records, at each weight.
            warmup.update(per_workload=0, probes={}, probe_records=0, counts={},
                          weight=donor_trees.blend, tvm=None)
        if not warmup:
            return result
        table: dict[str, dict[str, list]] = {}
        per_workload: dict[str, dict] = {}
        for name, group in held.items():
            graphs = graphs_of(name)
            nig = predict(trained.net, graphs.graphs)
            mu = nig.gamma.double().numpy()
            per_workload[name] = {"epistemic_var": float(nig.epistemic_var.mean()),
                                  "warmup_records": warmup["counts"].get(name, 0)}
            latency = np.array([r.latency for r in group])
            evolved = np.flatnonzero(np.array([r.source for r in group]) == "evolved")
            rows, devices = store_rows(graphs.graphs), store_devices(graphs.graphs)
            for kind, trees in (("shipped", trained.correction), ("tvm", warmup["tvm"])):
                if trees is None:
                    continue
                t = trees.log_latency(rows, graphs.workload, devices)
                for w in WEIGHTS:
                    order = (1 - w) * mu + w * t
                    cell = table.setdefault(f"{kind}@{w}", {})
                    cell.setdefault("all", []).append(ranking(latency, order))
                    per_workload[name][f"{kind}@{w}"] = {f: cell["all"][-1][f] for f in FIGURES}
                    if len(evolved) >= 2:
                        cell.setdefault("evolved", []).append(
                            ranking(latency[evolved], order[evolved]))
        held_out = {key: {part: {f: float(np.nanmean([r[f] for r in scores])) for f in FIGURES}
                          for part, scores in parts.items()} for key, parts in table.items()}
        first = next(iter(held.values()))[0]
        device = ("" if first.record.target is None
                  else describe_target(target_key(first.record.target)) + " ")
        name = f"{report}: {device}{first.workload_name}@{warmup['per_workload']:.0f}"
        scan[name] = {"weight": warmup["weight"], "probe_records": warmup["probe_records"],
                      "probes": warmup["probes"], "held_out": held_out,
                      "per_workload": per_workload}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(scan, indent=1))
        return result

    evaluate_records, zero_shot = evaluate.evaluate_records, [False]
    evaluate.adapt, evaluate.score_held_out = scanned_adapt, scanned_score
    evaluate.evaluate_records = scanned_records
    sys.argv = ["offline_eval.py", *args]
    runpy.run_path(str(Path(__file__).parent / "offline_eval.py"), run_name="__main__")
    if scan:
        print_summary(scan)


if __name__ == "__main__":
    main()
