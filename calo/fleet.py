"""Devices as a user runs them: add one to params.yaml, schedule its flow, see its model.

`calo device add` checks everything first (name, target JSON, TVM's own target check, the RPC
tracker, the schedule), then creates the Prefect deployment of the per-device flow, and only
then records the device in params.yaml (comments and order kept): bad input changes nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from calo.config import Device, Settings, parse_target_json
from calo.errors import CaloError, reason

DEVICE_FLOW = "device-run"                     # flows.pipeline.device_flow's name
DEVICE_FLOW_ENTRYPOINT = "calo.flows.pipeline.device_flow"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Tags a device's list row shows from its registry version.
SHOWN_TAGS = ("probe_nll", "probe_kendall_tau", "temperature", "test_ece_after", "promoted")


def device_entry(target_json: str, runner: str, host: str | None, port: int | None,
                 key: str | None, threads: int | None, count: int) -> dict[str, Any]:
    """The params.yaml entry for a device, from command-line values (checked, not yet tried)."""
    entry: dict[str, Any] = {"target": parse_target_json(target_json)}
    if runner == "local":
        entry["runner"] = {"kind": "local", **({"num_threads": threads} if threads else {})}
    elif runner == "rpc":
        missing = [flag for flag, v in (("--host", host), ("--port", port), ("--key", key))
                   if v is None]
        if missing:
            raise CaloError(f"--runner rpc needs {', '.join(missing)}")
        entry["runner"] = {"kind": "rpc", "host": host, "port": port, "key": key}
    else:
        raise CaloError(f"--runner must be local or rpc, got {runner!r}")
    if count < 1:
        raise CaloError(f"--count must be at least 1, got {count}")
    entry["candidates_per_workload"] = count
    return entry


def check_device(settings: Settings, name: str, entry: dict[str, Any], cron: str | None) -> None:
    """Everything that can be checked without changing anything; raises CaloError."""
    from calo.devices import make_target
    from calo.measure import check_tracker, rpc_address

    if not _NAME.match(name):
        raise CaloError(f"device name {name!r}: use letters, digits, '.', '_' and '-'")
    if name in settings.devices:
        raise CaloError(f"device '{name}' already exists in {settings.path}")
    device = Device(name=name, target=entry["target"], runner=entry["runner"],
                    candidates_per_workload=entry["candidates_per_workload"])
    make_target(device)  # TVM's full check of the target
    if device.runner["kind"] == "rpc":
        check_tracker(name, *rpc_address(device))
    if cron is not None:
        from prefect.client.schemas.schedules import CronSchedule

        try:
            CronSchedule(cron=cron)
        except Exception as err:  # pydantic's validation error: its first line names the field
            why = err.errors()[0]["msg"] if hasattr(err, "errors") else reason(err)
            raise CaloError(f"--cron {cron!r} is not a cron schedule: {why}") from None


def prefect_server() -> str | None:
    """The Prefect server's API URL, if one is configured (else flows run in-process only)."""
    from prefect.settings import PREFECT_API_URL

    return os.environ.get("PREFECT_API_URL") or PREFECT_API_URL.value()


def deploy(settings: Settings, name: str, cron: str | None, pool: str) -> str:
    """Create (or update) the per-device flow's deployment on the Prefect server."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    if not prefect_server():
        raise CaloError("no Prefect server configured: set PREFECT_API_URL (see README, "
                        "'Running for a team'), then run `calo device deploy NAME`")
    project = Path(settings.path).resolve().parent
    try:
        with get_client(sync_client=True) as client:
            try:
                client.read_work_pool(pool)
            except Exception:  # not found: a process pool runs flows on the worker's machine
                client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        deployment = flow.from_source(source=str(project), entrypoint=DEVICE_FLOW_ENTRYPOINT)
        # Prefect prints a table of what it applied; stdout is the command's JSON result.
        with contextlib.redirect_stdout(sys.stderr):
            deployment_id = deployment.deploy(
                name=name, work_pool_name=pool, cron=cron, build=False, push=False,
                parameters={"device": name, "project": str(project)},
                description=f"dvc.yaml's stages of device {name} (warm-up harvest, extract, "
                            "fine-tune, calibrate, tune), then its promotion",
                tags=["calo", f"device:{name}"], print_next_steps=False, ignore_warnings=True)
    except CaloError:
        raise
    except Exception as err:
        raise CaloError(f"could not create the deployment on {prefect_server()}: "
                        f"{reason(err)}") from None
    return str(deployment_id)


def record_device(settings: Settings, name: str, entry: dict[str, Any]) -> None:
    """Add the device to params.yaml's devices and targets, keeping comments and layout."""
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096                              # never re-wrap the user's lines
    yaml.indent(mapping=2, sequence=4, offset=2)   # "  - item", as params.yaml is written
    path = Path(settings.path)
    doc = yaml.load(path.read_text())
    doc["devices"][name] = entry
    doc["targets"].append(name)
    tmp = path.with_suffix(".yaml.tmp")
    with open(tmp, "w") as f:
        yaml.dump(doc, f)
    tmp.replace(path)


def add_device(settings: Settings, name: str, entry: dict[str, Any], cron: str | None,
               pool: str) -> dict:
    check_device(settings, name, entry, cron)
    if prefect_server():
        deployment = f"{DEVICE_FLOW}/{name}"
        deployment_id = deploy(settings, name, cron, pool)
    else:
        deployment, deployment_id = None, None
    record_device(settings, name, entry)
    return {"device": name, "params": str(Path(settings.path).resolve()), "deployment": deployment,
            "deployment_id": deployment_id, "schedule": cron, "work_pool": pool,
            **({} if deployment else {"note": "no Prefect server configured (PREFECT_API_URL): "
                                      "device recorded; run `calo device deploy` later"})}


def _deployments() -> dict[str, dict]:
    """The per-device flow's deployments on the Prefect server, by device name."""
    if not prefect_server():
        return {}
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    try:
        with get_client(sync_client=True) as client:
            found = client.read_deployments(
                flow_filter=FlowFilter(name=FlowFilterName(any_=[DEVICE_FLOW])))
    except Exception as err:
        raise CaloError(f"Prefect server {prefect_server()} unreachable: {reason(err)}") from None
    out = {}
    for dep in found:
        crons = [getattr(s.schedule, "cron", None) for s in dep.schedules or []]
        out[dep.name] = {"deployment": f"{DEVICE_FLOW}/{dep.name}",
                         "schedule": ", ".join(c for c in crons if c) or None,
                         "paused": dep.paused, "work_pool": dep.work_pool_name}
    return out


def list_devices(settings: Settings) -> list[dict]:
    from calo import registry

    deployments = _deployments()
    rows = []
    for name, device in settings.devices.items():
        role = ("donor" if name == settings.donor else "target" if name in settings.targets
                else "-")
        version = registry.aliased_version(settings, "donor" if role == "donor" else name)
        model = None
        if version is not None:
            model = {"version": version.version,
                     **{k: version.tags[k] for k in SHOWN_TAGS if k in version.tags}}
        rows.append({"device": name, "role": role, "target": device.target.get("kind"),
                     "runner": device.runner.get("kind", "local"),
                     "deployment": deployments.get(name), "model": model})
    return rows


def format_devices(rows: list[dict]) -> str:
    lines = [f"{'device':<22}{'role':<8}{'target':<8}{'runner':<8}{'deployment (schedule)':<36}"
             "model"]
    for row in rows:
        dep = row["deployment"]
        dep_text = f"{dep['deployment']} ({dep['schedule'] or 'manual'})" if dep else "-"
        model = row["model"]
        model_text = "-" if model is None else f"v{model['version']} " + " ".join(
            f"{k}={float(v):.3f}" if _is_number(v) else f"{k}={v}"
            for k, v in model.items() if k != "version")
        lines.append(f"{row['device']:<22}{row['role']:<8}{row['target']:<8}{row['runner']:<8}"
                     f"{dep_text:<36}{model_text}")
    return "\n".join(lines)


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return not isinstance(value, bool) and value not in ("True", "False")
