"""Stage 5: fit the variance temperature on validation probes; report ECE/NLL before and after."""

from __future__ import annotations

import json

import mlflow
from prefect import task
from prefect.cache_policies import NONE

from calo import registry
from calo.config import CaloError, Params
from calo.dataset import load_graphs
from calo.evaluation import evaluate, predictive
from calo.log import get_logger
from calo.plots import reliability_diagram
from models.calibration import confidence_levels, coverage, fit_temperature


def _reliability(params: Params, device_name: str, model, graphs, tau: float):
    """Reliability diagram of held-out probes before and after the temperature: PNG + data."""
    levels = confidence_levels(params["calibrate"]["levels"])
    y, mu, scale, df = predictive(model, graphs)
    before, after = coverage(y, mu, scale, df, levels), coverage(y, mu, scale * tau, df, levels)
    base = params.metrics_path("calibration", device_name)
    png = reliability_diagram(base.with_name(f"{device_name}-reliability.png"), levels,
                              {"before": before, f"after (tau={tau:.2f})": after},
                              f"{device_name}: {len(graphs)} held-out probes")
    curve = base.with_name(f"{device_name}-reliability.json")
    curve.write_text(json.dumps([{"level": float(p), "ideal": float(p), "before": float(b),
                                  "after": float(a)} for p, b, a in zip(levels, before, after)],
                                indent=1))
    return png, curve


@task(name="calibrate", cache_policy=NONE)
def calibrate(params: Params, device_name: str) -> dict:
    params.target_device(device_name)
    model_dir = params.model_dir(device_name)
    if not (model_dir / registry.WEIGHTS).is_file():
        raise CaloError(f"no fine-tuned model for '{device_name}': run `calo finetune` first")
    model, config = registry.load_model(model_dir)
    graphs = load_graphs(params.graphs_path(device_name), registry.graph_kind(config))
    val, test = graphs.split("val", params["split"]), graphs.split("test", params["split"])
    if len(val) < 2:
        raise CaloError(f"device '{device_name}' has too few validation graphs ({len(val)})")
    levels = params["calibrate"]["levels"]
    tau = fit_temperature(*predictive(model, val), confidence_levels(levels))
    report: dict = {"temperature": tau}
    for name, part in (("val", val), ("test", test)):
        before, after = evaluate(model, part, levels), evaluate(model, part, levels, tau)
        for key in ("ece", "nll"):
            if key in before:
                report[f"{name}_{key}_before"] = before[key]
                report[f"{name}_{key}_after"] = after[key]
        report[f"{name}_count"] = len(part)
    params.metrics_path("calibration", device_name).parent.mkdir(parents=True, exist_ok=True)
    png, curve = _reliability(params, device_name, model, test if len(test) else val, tau)
    with registry.start_run(params, "calibrate", f"calibrate-{device_name}"):
        mlflow.log_params({"device": device_name, "levels": levels})
        mlflow.log_metrics(report)
        mlflow.log_artifact(str(png))
        mlflow.log_artifact(str(curve))
    registry.set_version_tags(params, model_dir, {"temperature": tau, **{
        k: v for k, v in report.items() if k.startswith("test_")}})
    out = params.calibration_path(device_name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"temperature": tau}))
    metrics = params.metrics_path("calibration", device_name)
    metrics.parent.mkdir(parents=True, exist_ok=True)
    metrics.write_text(json.dumps(report, indent=1))
    get_logger().info(f"calibrate {device_name}: {report}")
    return report
