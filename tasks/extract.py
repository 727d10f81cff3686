"""Stage 2: a schedule graph for every successfully measured record of a device."""

from __future__ import annotations

from calo import config as cfg
from calo import paths
from calo.dataset import save_graphs
from calo.errors import CaloError
from calo.graphs import graph_set
from calo.log import Progress, get_logger
from calo.records import iter_records


def extract(settings: cfg.Settings, device: str) -> dict:
    settings.device(device)
    store = paths.records_dir(device)
    recs = list(iter_records(store))
    measured = [r for r in recs if r.latency is not None]
    if not measured:
        raise CaloError(f"no successful measurements in {store}: run `calo harvest` first")
    progress = Progress(f"extract {device}", len(measured), "graphs")
    graphs = graph_set(settings.graph.kind, measured, progress.advance,
                       settings.extracts_stores(device))
    save_graphs(paths.graphs_path(device), graphs)
    summary = {"device": device, "graphs": len(measured), "kind": settings.graph.kind,
               "failed_records_skipped": len(recs) - len(measured)}
    get_logger().info(f"extract {device}: {len(measured)} {settings.graph.kind} graphs, "
                      f"{summary['failed_records_skipped']} failed records skipped")
    return summary
