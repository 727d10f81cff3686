"""How well the donor model ranks the candidates each live tuning run measured.

A diagnosis for `ttq.py --mode live`: for every run kept in its work directory (printed at the
end of the run), the Kendall tau between the donor's predicted and the measured log latency of
the run's own candidates, and both spreads. A search that drives the model into a region it
cannot tell apart shows a small predicted spread and a tau near zero on its own runs, while the
same model still ranks the other runs' candidates. Run from the repository root:

    python benchmarks/live_ranking.py WORK_DIR [--workload matmul ...]
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
from calo.dataset import collate  # noqa: E402
from calo.graphs import of_record  # noqa: E402
from calo.records import iter_records  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("--workload", action="append")
    args = parser.parse_args()
    # ttq.py trains one donor per training seed; tuning seed s used donor s % len(donors).
    donors = [TrainedModel.load(args.work_dir / "models" / f"evidential-{i}")
              for i in range(len(list((args.work_dir / "models").glob("evidential-*"))))]
    if not donors:
        raise SystemExit(f"no donor models under {args.work_dir / 'models'}: pass the work "
                         "directory that `ttq.py --mode live` printed")
    workloads = args.workload or sorted(p.name for p in args.work_dir.iterdir()
                                        if p.is_dir() and p.name not in ("data", "models"))
    print(f"{'run':<34}{'tau':>7}{'pred spread':>13}{'true spread':>13}{'best us':>9}")
    for workload in workloads:
        for run in sorted((args.work_dir / workload).iterdir()):
            recs = [r for r in iter_records(run) if r.latency]
            donor = donors[int(run.name.rsplit("-", 1)[1]) % len(donors)]
            graphs = [of_record(donor.graph_kind, r.record, donor.reads_stores) for r in recs]
            with torch.inference_mode():
                pred = donor.net.to_log_latency(donor.net(*collate(graphs))).gamma.numpy()
            true = np.log([r.latency for r in recs])
            print(f"{workload + '/' + run.name:<34}{kendalltau(pred, true)[0]:7.3f}"
                  f"{pred.std():13.3f}{true.std():13.3f}{np.exp(true.min()) * 1e6:9.1f}")


if __name__ == "__main__":
    main()
