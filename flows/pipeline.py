"""The pipeline's Prefect flows: one per stage, and the per-device flow a user schedules."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from calo.config import load_params
from tasks.calibrate import calibrate
from tasks.evaluate import evaluate_records
from tasks.extract import extract
from tasks.finetune import finetune
from tasks.harvest import harvest
from tasks.import_records import import_records
from tasks.pretrain import pretrain
from tasks.sweep import sweep
from tasks.tune import tune, write_report

PARAMS = "params.yaml"


@flow(name="harvest", flow_run_name="harvest-{device}")
def harvest_flow(device: str, workloads: list[str] | None = None, count: int | None = None,
                 params_path: str = PARAMS) -> dict:
    return harvest(load_params(params_path), device, workloads, count)


@flow(name="import", flow_run_name="import-{device}")
def import_flow(device: str, source: str, params_path: str = PARAMS) -> dict:
    return import_records(load_params(params_path), device, Path(source))


@flow(name="extract", flow_run_name="extract-{device}")
def extract_flow(device: str, params_path: str = PARAMS) -> dict:
    return extract(load_params(params_path), device)


@flow(name="evaluate")
def evaluate_flow(model: str, records: str, warmup_fraction: float = 0.0,
                  params_path: str = PARAMS) -> dict:
    return evaluate_records(load_params(params_path), model, records, warmup_fraction)


@flow(name="sweep")
def sweep_flow(params_path: str = PARAMS) -> dict:
    return sweep(load_params(params_path))


@flow(name="pretrain")
def pretrain_flow(params_path: str = PARAMS) -> dict:
    return pretrain(load_params(params_path))


@flow(name="finetune", flow_run_name="finetune-{device}")
def finetune_flow(device: str, params_path: str = PARAMS) -> dict:
    return finetune(load_params(params_path), device)


@flow(name="calibrate", flow_run_name="calibrate-{device}")
def calibrate_flow(device: str, params_path: str = PARAMS) -> dict:
    return calibrate(load_params(params_path), device)


@flow(name="tune", flow_run_name="tune-{device}")
def tune_flow(device: str, workloads: list[str] | None = None, params_path: str = PARAMS) -> dict:
    params = load_params(params_path)
    names = workloads or params["tune"]["workloads"]
    reports = {name: tune(params, device, name) for name in names}
    return write_report(params, device, reports)


@flow(name="device-run", flow_run_name="device-run-{device}")
def device_flow(device: str, params_path: str = PARAMS,
                tune_workloads: list[str] | None = None) -> dict:
    """A new device end to end: warm-up probes -> fine-tune -> calibrate -> tune.

    tune_workloads: the workloads to tune (default: tune.workloads; an empty list skips tuning,
    e.g. for a nightly model refresh).
    """
    params = load_params(params_path)
    harvest(params, device)
    extract(params, device)
    model = finetune(params, device)
    calibration = calibrate(params, device)
    names = params["tune"]["workloads"] if tune_workloads is None else tune_workloads
    reports = {name: tune(params, device, name) for name in names}
    return {"finetune": model, "calibration": calibration,
            "tune": write_report(params, device, reports) if reports else None}
