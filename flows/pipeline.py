"""The pipeline as Prefect flows. dvc.yaml owns the stages and their order; these flows only
run them.

A flow asks DVC which stages its targets need, in DVC's order, and runs each one as a Prefect
task with `dvc repro --single-item` (so dvc.lock records every run, scheduled or not, and an
unchanged stage is skipped). Then each target device's model challenges the registry's
(promote), and the run's summary is returned (and kept as a Prefect artifact).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE

from calo import paths
from calo.config import DEFAULT_PARAMS as PARAMS
from calo.config import PARAMS_ENV, load_settings
from calo.errors import CaloError
from calo.summary import format_summary
from calo.tasks.promote import promote

PLAIN_LOGS = "CALO_PLAIN_LOGS"  # stage processes log bare messages: the flow adds time and level
# DVC's advice after each stage (git add dvc.lock, autostage, dvc push) is said once, in the README.
_DVC_ADVICE = ("To track the changes with git", "git add dvc.lock", "To enable auto staging",
               "dvc config core.autostage", "Use `dvc push`")


def planned_stages(project: Path, targets: list[str]) -> list[str]:
    """The stages `dvc repro TARGETS` would visit, dependencies first (DVC's own plan)."""
    from dvc.repo import Repo
    from dvc.repo.reproduce import collect_stages, get_active_graph, plan_repro

    with contextlib.chdir(project), Repo(".") as repo:
        stages = collect_stages(repo, targets)
        return [stage.addressing for stage in plan_repro(get_active_graph(repo.index.graph),
                                                         stages)]


@task(name="dvc-stage", task_run_name="{stage}", cache_policy=NONE)
def run_stage(stage: str, project: Path) -> str:
    """`dvc repro --single-item STAGE`, its output streamed into the run's log."""
    log = get_run_logger()
    # A stage reads the project's params.yaml (as DVC does), whatever CALO_PARAMS says.
    # Unbuffered: DVC's own lines arrive in order with the stage's, as they happen.
    env = {**os.environ, PLAIN_LOGS: "1", PARAMS_ENV: str(project / PARAMS),
           "PYTHONUNBUFFERED": "1"}
    bin_dir = str(Path(sys.executable).parent)  # the stage commands (calo) live beside python
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.Popen([sys.executable, "-m", "dvc", "repro", "--single-item", stage],
                            cwd=project, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    last, skipped = "", False
    for line in proc.stdout:
        line = line.rstrip()
        if line and not line.strip().startswith(_DVC_ADVICE):
            log.info(line)
            last, skipped = line, skipped or "didn't change" in line
    if proc.wait() != 0:
        raise CaloError(f"stage {stage} failed: {last}")
    return "skipped" if skipped else "ran"


@task(name="promote", task_run_name="promote-{device}", cache_policy=NONE)
def promote_task(project: Path, device: str) -> dict:
    return promote(load_settings(project / PARAMS), device)


def _stages(root: Path, targets: list[str]) -> dict[str, str]:
    return {stage: run_stage(stage, root) for stage in planned_stages(root, targets)}


def _run(project: str, devices: list[str] | None, tune: bool) -> dict:
    root = Path(project).resolve()
    if not (root / "dvc.yaml").is_file():
        raise CaloError(f"{root} is not a CALO project (no dvc.yaml)")
    settings = load_settings(root / PARAMS)
    devices = list(settings.targets) if devices is None else devices
    for device in devices:
        settings.target_device(device)
    last = "tune" if tune else "calibrate"
    done = _stages(root, [f"{last}@{d}" for d in devices])
    cwd = Path.cwd()
    os.chdir(root)  # promote and the summary read the project's paths, as the stages do
    try:
        promoted = {d: promote_task(root, d) for d in devices}
        summary = format_summary(settings, devices)
    finally:
        os.chdir(cwd)
    # In the Prefect UI: the flow run's Artifacts tab.
    create_markdown_artifact(key="run-summary", markdown=f"```\n{summary}\n```",
                             description="calibration, promotion and tuning of this run")
    return {"stages": done, "promotion": promoted, "summary": summary}


@flow(name="pipeline")
def pipeline_flow(project: str = ".", tune: bool = True) -> dict:
    """The main job: every target device's stages, then each one's promotion."""
    return _run(project, None, tune)


@flow(name="device-run", flow_run_name="device-run-{device}")
def device_flow(device: str, project: str = ".", tune: bool = True) -> dict:
    """One target device end to end: the stages its model and tuning need (the donor's too,
    where they are stale), then its promotion. tune=False refreshes the model only."""
    return _run(project, [device], tune)


@flow(name="network-tuning", flow_run_name="network-tuning-{device}")
def network_flow(device: str, project: str = ".") -> dict:
    """The networks of params.yaml's networks.tune, tuned on one target device with its
    registered model and with XGBoost (the tune-network stage, and what it needs)."""
    root = Path(project).resolve()
    load_settings(root / PARAMS).target_device(device)
    done = _stages(root, [f"tune-network@{device}"])
    report = (root / paths.metrics_path("tune-network", device)).read_text()
    create_markdown_artifact(key="network-tuning", markdown=f"```\n{report}\n```",
                             description="end-to-end latency: untuned, XGBoost, CALO")
    return {"stages": done, "networks": report}
