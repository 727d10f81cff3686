"""Does the donor's epistemic sigma say where its mean is wrong? Per workload of a measured pool.

For each workload, zero-shot (no warm-up): the median epistemic sigma of the log latency
(sqrt(beta / (nu (alpha - 1))), what the UCB bound subtracts), the median of alpha, the
median absolute error of the mean after removing the workload's offset (the overall speed a
new device shifts), and Spearman's rho of sigma against that error and against the measured
latency. Then, as a static pick: the best measured latency among each donor's 16 best-ranked
candidates, over the workload's best, when ranked by the mean and by the bound at a few kappas.
Run from the repository root:

    python benchmarks/uncertainty_check.py --pool benchmarks/data/heldout-cpu-generic-1core.tar.gz
                                           [--donors 3] [--donors-dir DIR]

Writes benchmarks/results/uncertainty_check_<pool>.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harvest_pools import unpack  # noqa: E402
from live_ranking import load_donors  # noqa: E402

from calo.dataset import collate  # noqa: E402
from calo.graphs import of_record  # noqa: E402
from calo.records import iter_records  # noqa: E402

ROOT = Path(__file__).resolve().parent
KAPPAS = (0.0, 0.2, 1.0)  # 0.2: the design's kappa_t over a 200-trial search
PICKS = 16                # one tuning round's measurements


def check(pool: Path, donors: list) -> dict:
    by: dict[str, list] = {}
    for rec in iter_records(pool):
        if rec.latency:
            by.setdefault(rec.workload_name, []).append(rec)
    per_workload, picks = {}, {k: [] for k in KAPPAS}
    for workload, recs in sorted(by.items()):
        graphs = [of_record(donors[0].graph_kind, r.record, donors[0].reads_stores)
                  for r in recs]
        true = np.log([r.latency for r in recs])
        rows = []
        for donor in donors:
            with torch.inference_mode():
                d = donor.net.to_log_latency(donor.net(*collate(graphs)))
            d = d.scaled(donor.temperature)
            mu, sigma = d.gamma.double().numpy(), d.epistemic_var.sqrt().double().numpy()
            error = np.abs((mu - mu.mean()) - (true - true.mean()))
            rows.append([np.median(sigma), np.median(d.alpha.double().numpy()),
                         np.median(error), spearmanr(sigma, error)[0],
                         spearmanr(sigma, true)[0]])
            for kappa in KAPPAS:
                top = np.argsort(mu - kappa * sigma, kind="stable")[:PICKS]
                picks[kappa].append(float(np.exp(true[top].min() - true.min())))
        keys = ("sigma", "alpha", "abs_error", "rho_sigma_error", "rho_sigma_latency")
        per_workload[workload] = dict(zip(keys, np.mean(rows, axis=0).tolist()))
    return {"per_workload": per_workload,
            "best_of_top16_over_best": {f"kappa={k}": float(np.exp(np.mean(np.log(v))))
                                        for k, v in picks.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", type=Path, required=True, help="TVM database dir or .tar.gz")
    parser.add_argument("--donors", type=int, default=3)
    parser.add_argument("--donors-dir", type=Path, default=ROOT / ".donors",
                        help="donors that ttq.py trained and kept there")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "results")
    args = parser.parse_args()
    donors = load_donors(args.donors_dir)[:args.donors]
    if args.pool.is_dir():
        report = check(args.pool, donors)
    else:
        with tempfile.TemporaryDirectory(prefix="calo-uncertainty-") as tmp:
            report = check(unpack(args.pool, Path(tmp)), donors)
    print(f"{'workload':<34}{'sigma':>7}{'alpha':>7}{'|error|':>9}{'rho(sigma, error)':>19}"
          f"{'rho(sigma, latency)':>21}")
    for workload, row in report["per_workload"].items():
        print(f"{workload:<34}{row['sigma']:7.2f}{row['alpha']:7.2f}{row['abs_error']:9.2f}"
              f"{row['rho_sigma_error']:19.2f}{row['rho_sigma_latency']:21.2f}")
    for name, ratio in report["best_of_top16_over_best"].items():
        print(f"ranked by mean - {name}: best of the top {PICKS} / best, geo-mean {ratio:.3f}")
    name = args.pool.name.removesuffix(".tar.gz")
    out = args.out_dir / f"uncertainty_check_{name}.json"
    out.write_text(json.dumps({"pool": name, "donors": args.donors, **report}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
