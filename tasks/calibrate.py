"""Stage 5: fit the variance temperature on validation probes; report ECE/NLL before and after.

A temperature has to earn its place: fitted on the validation probes of some workloads, it must
not worsen NLL or ECE on the others' (and the other way round), else the model keeps its own.
"""

from __future__ import annotations

import json

import mlflow

from calo import config as cfg
from calo import locks, paths, registry
from calo.artifact import TrainedModel, load_with_graphs
from calo.dataset import GraphSet
from calo.errors import CaloError
from calo.evaluation import checked_temperature, evaluate, predictive
from calo.log import get_logger
from calo.models.calibration import confidence_levels, coverage
from calo.plots import reliability_diagram


def _reliability(device: str, trained: TrainedModel, graphs: GraphSet, tau: float, levels: int):
    """Reliability diagram of held-out probes before and after the temperature: PNG + data."""
    levels = confidence_levels(levels)
    y, mu, scale, df = predictive(trained.net, graphs, correction=trained.correction)
    before, after = coverage(y, mu, scale, df, levels), coverage(y, mu, scale * tau, df, levels)
    base = paths.metrics_path("calibration", device)
    png = reliability_diagram(base.with_name(f"{device}-reliability.png"), levels,
                              {"before": before, f"after (tau={tau:.2f})": after},
                              f"{device}: {len(graphs)} held-out probes")
    curve = base.with_name(f"{device}-reliability.json")
    curve.write_text(json.dumps([{"level": float(p), "ideal": float(p), "before": float(b),
                                  "after": float(a)} for p, b, a in zip(levels, before, after)],
                                indent=1))
    return png, curve


def calibrate(settings: cfg.Settings, device: str) -> dict:
    """Holds the device's lock throughout (calo.locks): one writer of its model at a time."""
    with locks.device_lock(device, "calo calibrate"):
        return _calibrate(settings, device)


def _calibrate(settings: cfg.Settings, device: str) -> dict:
    settings.target_device(device)
    trained, graphs = load_with_graphs(device, paths.model_dir(device), "finetune")
    val, test = graphs.split("val", settings.split), graphs.split("test", settings.split)
    if len(val) < 2:
        raise CaloError(f"device '{device}' has too few validation graphs ({len(val)})")
    levels = settings.calibrate.levels
    before_tau = trained.temperature
    tau = checked_temperature(trained.net, val, before_tau, levels, trained.correction,
                              objective=settings.calibrate.objective)
    report: dict = {"temperature": tau, "kept_previous": float(tau == before_tau)}
    for name, part in (("val", val), ("test", test)):
        before = evaluate(trained.net, part, levels, before_tau, trained.correction)
        after = evaluate(trained.net, part, levels, tau, trained.correction)
        for key in ("ece", "nll"):
            if key in before:
                report[f"{name}_{key}_before"] = before[key]
                report[f"{name}_{key}_after"] = after[key]
        report[f"{name}_count"] = len(part)
    paths.metrics_path("calibration", device).parent.mkdir(parents=True, exist_ok=True)
    png, curve = _reliability(device, trained, test if len(test) else val, tau, levels)
    with registry.start_run(settings, "calibrate", f"calibrate-{device}"):
        mlflow.log_params({"device": device, "levels": levels})
        mlflow.log_metrics(report)
        mlflow.log_artifact(str(png))
        mlflow.log_artifact(str(curve))
    trained.temperature = tau
    trained.info = {**trained.info, **{k: v for k, v in report.items() if k.startswith("test_")}}
    trained.save(paths.calibrated_dir(device))
    paths.report_path("calibration", device).write_text(json.dumps(report, indent=1))
    split = "test" if report.get("test_ece_before") is not None else "val"
    headline = {"temperature": tau, **{key: {when: report[f"{split}_{key}_{when}"]
                                             for when in ("before", "after")}
                                       for key in ("ece", "nll")}}
    paths.metrics_path("calibration", device).write_text(json.dumps(headline, indent=1))
    get_logger().info(
        f"calibrate {device}: temperature {tau:.3f}; test ECE "
        f"{report.get('test_ece_before', float('nan')):.3f} -> "
        f"{report.get('test_ece_after', float('nan')):.3f}, test NLL "
        f"{report.get('test_nll_before', float('nan')):.3f} -> "
        f"{report.get('test_nll_after', float('nan')):.3f}")
    return report
