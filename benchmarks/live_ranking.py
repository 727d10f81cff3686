"""How well the donor model ranks the candidates each live tuning run measured.

A diagnosis for `ttq.py --mode live`: for every run kept in its work directory (printed at the
end of the run), the Kendall tau between the donor's predicted and the measured log latency of
the run's own candidates, and both spreads. A search that drives the model into a region it
cannot tell apart shows a small predicted spread and a tau near zero on its own runs, while the
same model still ranks the other runs' candidates.

It also bounds what weighing a candidate's predicted latency as its measurement cost could save:
each repeat runs the kernel until it has taken harvest.min_repeat_ms, so a candidate faster than
that floor costs the floor whatever its latency. The run's kernel-running seconds and the part of
them above the floor (all a cost-aware choice could avoid) are printed per run. Run from the
repository root:

    python benchmarks/live_ranking.py WORK_DIR [WORK_DIR ...] [--donors-dir DIR] [--workload W ...]

(--donors-dir: where the donors are when the live run kept them there, else WORK_DIR/models.)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from calo.devices import preload_tensor_intrinsics

preload_tensor_intrinsics()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy.stats import kendalltau  # noqa: E402

from calo.artifact import TrainedModel  # noqa: E402
from calo.config import Harvest, load_settings  # noqa: E402
from calo.dataset import collate  # noqa: E402
from calo.graphs import of_record  # noqa: E402
from calo.records import iter_records  # noqa: E402


def running_seconds(repeat_secs: list[float], harvest: Harvest) -> tuple[float, float]:
    """A measurement's kernel-running seconds (each repeat lasts at least min_repeat_ms) and
    the part of them above that floor."""
    floor = harvest.min_repeat_ms / 1e3
    spent = [max(harvest.number * s, floor) for s in repeat_secs]
    return sum(spent), sum(s - floor for s in spent)


def load_donors(models: Path) -> list[TrainedModel]:
    """ttq.py trains one donor per training seed; tuning seed s used donor s % len(donors)."""
    donors = [TrainedModel.load(models / f"evidential-{i}")
              for i in range(len(list(models.glob("evidential-*"))))]
    if not donors:
        raise SystemExit(f"no donor models under {models}: pass the work directory that "
                         "`ttq.py --mode live` printed (and --donors-dir if it had one)")
    return donors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work_dirs", type=Path, nargs="+", metavar="WORK_DIR")
    parser.add_argument("--donors-dir", type=Path)
    parser.add_argument("--workload", action="append")
    args = parser.parse_args()
    harvest = load_settings(Path("params.yaml")).harvest
    print(f"{'run':<34}{'tau':>7}{'pred spread':>13}{'true spread':>13}{'best us':>9}"
          f"{'running s':>11}{'above floor s':>15}")
    total = np.zeros(2)
    kept = load_donors(args.donors_dir) if args.donors_dir else None
    for work_dir in args.work_dirs:
        donors = kept or load_donors(work_dir / "models")
        workloads = args.workload or sorted(
            p.name for p in work_dir.iterdir()
            if p.is_dir() and p.name not in ("data", "models", "pools"))
        for workload in workloads:
            for run in sorted((work_dir / workload).iterdir()):
                recs = [r for r in iter_records(run) if r.latency]
                donor = donors[int(run.name.rsplit("-", 1)[1]) % len(donors)]
                graphs = [of_record(donor.graph_kind, r.record, donor.reads_stores)
                          for r in recs]
                with torch.inference_mode():
                    pred = donor.net.to_log_latency(donor.net(*collate(graphs))).gamma.numpy()
                true = np.log([r.latency for r in recs])
                spent = np.sum([running_seconds([float(s) for s in r.record.run_secs], harvest)
                                for r in recs], axis=0)
                total += spent
                print(f"{workload + '/' + run.name:<34}{kendalltau(pred, true)[0]:7.3f}"
                      f"{pred.std():13.3f}{true.std():13.3f}{np.exp(true.min()) * 1e6:9.1f}"
                      f"{spent[0]:11.2f}{spent[1]:15.3f}")
    print(f"kernel running, all runs: {total[0]:.1f} s, of it above the "
          f"{harvest.min_repeat_ms} ms repeat floor {total[1]:.2f} s ({total[1] / total[0]:.2%}): "
          "the most a cost-aware choice could save")


if __name__ == "__main__":
    main()
