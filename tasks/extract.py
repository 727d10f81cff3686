"""Stage 2: a schedule graph for every successfully measured record of a device."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NONE

from calo.config import CaloError, Params
from calo.dataset import save_graphs
from calo.graphs import graph_set
from calo.log import Progress, get_logger
from calo.records import iter_records


@task(name="extract", cache_policy=NONE)
def extract(params: Params, device_name: str) -> dict:
    params.device(device_name)
    store = params.records_dir(device_name)
    recs = list(iter_records(store))
    measured = [r for r in recs if r.latency is not None]
    if not measured:
        raise CaloError(f"no successful measurements in {store}: run `calo harvest` first")
    progress = Progress(f"extract {device_name}", len(measured), "graphs")
    graphs = graph_set(params.graph_kind, measured, progress.advance)
    save_graphs(params.graphs_path(device_name), graphs)
    summary = {"device": device_name, "graphs": len(measured), "kind": params.graph_kind,
               "failed_records_skipped": len(recs) - len(measured)}
    get_logger().info(f"extract {device_name}: {summary}")
    return summary
