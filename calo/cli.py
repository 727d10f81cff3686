"""`calo`: run the pipeline's stages, each as a Prefect flow.

Every command checks its inputs (devices, workloads, targets, the files the stage reads) before
any work starts, and stops with one line naming the problem.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from calo.config import CaloError, Params, load_params

STAGES = """stages, in pipeline order:
  workloads  list the built-in operator suite (and params.yaml's own workloads)
  harvest    sample Meta-Schedule candidates on a device, build and measure them, append to
             data/records/<device>/ (a TVM JSON database); tops up, never re-measures
  records    count a device's records by operator family, candidate source and status
  import     add the records of an existing TVM JSON database (from any machine) to a device
  extract    one schedule graph (loops, blocks, buffers; typed edges) per measured record
  pretrain   train the evidential GraphSAGE model on the donor's graphs; registry alias 'donor'
  sweep      the paper's grid (lr x weight decay x lambda) on the donor, one MLflow run each
  finetune   adapt the donor model to a device on its warm-up probes; alias = device name
  calibrate  fit the variance temperature on validation probes; ECE/NLL before and after
  tune       tune_tir with CALO-GNN (UEC-UCB) and with TVM's XGBoost model, same budget and seed
  evaluate   Kendall tau, top-1/top-5, regret, ECE, NLL, RMSE of a model on any TVM database,
             beside TVM's XGBoost trained on the warm-up records (and on donor + warm-up)
  run        the per-device flow: warm-up harvest -> extract -> finetune -> calibrate -> tune
  device     add a device (checked, recorded in params.yaml, deployed to a Prefect server with
             its schedule), deploy an existing one, list devices with their current models
"""


def _check_device(params: Params, name: str, target_only: bool = False) -> None:
    from calo.devices import make_target  # imports TVM: only once the cheap checks passed

    device = params.target_device(name) if target_only else params.device(name)
    make_target(device)


def _preload_for_tuning() -> None:
    from calo.devices import preload_tensor_intrinsics

    preload_tensor_intrinsics()


def _require(path, message: str) -> None:
    if not path.exists():
        raise CaloError(message)


def _cmd_workloads(params: Params, args) -> Callable[[], dict]:
    from calo import suite

    rows = [(name, suite.family(name), params.workload(name)) for name in suite.names()]
    if args.paper:
        rows = [(n, suite.family(n), params.workload(n)) for n in suite.names(suite.PAPER)]
    own = [n for n in params["workloads"] if suite.resolve(n) is None]
    rows += [(name, "params.yaml", params.workload(name)) for name in own]
    width = max(len(r[0]) for r in rows)
    for name, family, wl in rows:
        shape = " ".join(f"{k}={v}" for k, v in wl.args.items())
        print(f"{name:<{width}}  {family:<11}  {wl.op}({shape})")
    families: dict[str, int] = {}
    for _, family, _ in rows:
        families[family] = families.get(family, 0) + 1
    return lambda: {"workloads": len(rows), "families": families}


def _cmd_records(params: Params, args) -> Callable[[], dict]:
    """Counts of a device's store by operator family, source and status."""
    from calo import records, suite

    params.device(args.device)
    store = params.records_dir(args.device)
    _require(store / records.RECORD_FILE, f"no records for device '{args.device}' in {store}")
    table: dict[str, dict[str, int]] = {}
    for rec in records.iter_records(store):
        row = table.setdefault(suite.family(rec.workload_name), {})
        for col in (rec.source, rec.status, "records"):
            row[col] = row.get(col, 0) + 1
    cols = sorted({c for row in table.values() for c in row} - {"records"}) + ["records"]
    total = {c: sum(row.get(c, 0) for row in table.values()) for c in cols}
    print(f"{'family':<12}" + "".join(f"{c:>12}" for c in cols))
    for family, row in sorted(table.items()) + [("total", total)]:
        print(f"{family:<12}" + "".join(f"{row.get(c, 0):>12}" for c in cols))
    return lambda: {"device": args.device, "by_family": table, "total": total}


def _harvest_names(params: Params, args) -> list[str]:
    if args.suite:
        from calo import suite

        return suite.names()
    return args.workload or params["harvest"]["workloads"]


def _cmd_harvest(params: Params, args) -> Callable[[], dict]:
    _check_device(params, args.device)
    names = _harvest_names(params, args)
    params.workloads(names)
    if args.count is not None and args.count < 0:
        raise CaloError(f"--count must be >= 0, got {args.count}")
    _preload_for_tuning()
    from flows.pipeline import harvest_flow

    return lambda: harvest_flow(args.device, names, args.count, params_path=str(params.path))


def _cmd_import(params: Params, args) -> Callable[[], dict]:
    _check_device(params, args.device)
    from calo.records import RECORD_FILE, WORKLOAD_FILE

    source = Path(args.path)
    if not (source / WORKLOAD_FILE).is_file() or not (source / RECORD_FILE).is_file():
        raise CaloError(f"{source} is not a TVM JSON database "
                        f"(expected {WORKLOAD_FILE} and {RECORD_FILE})")
    from flows.pipeline import import_flow

    return lambda: import_flow(args.device, str(source.resolve()), params_path=str(params.path))


def _cmd_extract(params: Params, args) -> Callable[[], dict]:
    params.device(args.device)
    from calo.records import RECORD_FILE

    _require(params.records_dir(args.device) / RECORD_FILE,
             f"no records for device '{args.device}' in {params.records_dir(args.device)}: "
             "run `calo harvest` first")
    from flows.pipeline import extract_flow

    return lambda: extract_flow(args.device, params_path=str(params.path))


def _cmd_pretrain(params: Params, args) -> Callable[[], dict]:
    _require(params.graphs_path(params.donor),
             f"no graphs for donor '{params.donor}': run `calo harvest` and `calo extract` first")
    from flows.pipeline import pretrain_flow

    return lambda: pretrain_flow(params_path=str(params.path))


def _cmd_sweep(params: Params, args) -> Callable[[], dict]:
    _require(params.graphs_path(params.donor),
             f"no graphs for donor '{params.donor}': run `calo harvest` and `calo extract` first")
    from flows.pipeline import sweep_flow

    return lambda: sweep_flow(params_path=str(params.path))


def _donor_available(params: Params) -> None:
    from calo import registry

    if (params.model_dir(params.donor) / registry.WEIGHTS).is_file():
        return
    client = registry.connect(params)
    try:
        client.get_model_version_by_alias(params["mlflow"]["model_name"], "donor")
    except Exception:
        raise CaloError("no donor model (no pipeline output and no registry alias 'donor'): "
                        "run `calo pretrain` first") from None


def _cmd_finetune(params: Params, args) -> Callable[[], dict]:
    params.target_device(args.device)
    _require(params.graphs_path(args.device),
             f"no graphs for device '{args.device}': run `calo harvest` and `calo extract` first")
    _donor_available(params)
    from flows.pipeline import finetune_flow

    return lambda: finetune_flow(args.device, params_path=str(params.path))


def _cmd_calibrate(params: Params, args) -> Callable[[], dict]:
    params.target_device(args.device)
    _require(params.model_dir(args.device),
             f"no fine-tuned model for device '{args.device}': run `calo finetune` first")
    from flows.pipeline import calibrate_flow

    return lambda: calibrate_flow(args.device, params_path=str(params.path))


def _cmd_tune(params: Params, args) -> Callable[[], dict]:
    _check_device(params, args.device, target_only=True)
    names = args.workload or params["tune"]["workloads"]
    params.workloads(names)
    _require(params.calibration_path(args.device),
             f"no calibrated model for device '{args.device}': run `calo calibrate` first")
    _preload_for_tuning()
    from flows.pipeline import tune_flow

    return lambda: tune_flow(args.device, names, params_path=str(params.path))


def _cmd_evaluate(params: Params, args) -> Callable[[], dict]:
    from calo.records import RECORD_FILE, WORKLOAD_FILE

    source = Path(args.records)
    if not (source / WORKLOAD_FILE).is_file() or not (source / RECORD_FILE).is_file():
        raise CaloError(f"{source} is not a TVM JSON database "
                        f"(expected {WORKLOAD_FILE} and {RECORD_FILE})")
    if not 0 <= args.warmup_fraction < 1:
        raise CaloError(f"--warmup-fraction must be in [0, 1), got {args.warmup_fraction}")
    out = Path(args.json) if args.json else None
    if out is not None and not out.parent.is_dir():
        raise CaloError(f"--json: directory {out.parent} does not exist")
    from flows.pipeline import evaluate_flow
    from tasks.evaluate import format_table

    def work() -> dict:
        report = evaluate_flow(args.model, str(source.resolve()), args.warmup_fraction,
                               params_path=str(params.path))
        print(format_table(report), file=sys.stderr)
        if out is not None:
            out.write_text(json.dumps(report, indent=1))
        return report["overall"]

    return work


def _cmd_device_add(params: Params, args) -> Callable[[], dict]:
    from calo import fleet

    entry = fleet.device_entry(args.target, args.runner, args.host, args.port, args.key,
                               args.threads, args.count)
    return lambda: fleet.add_device(params, args.name, entry, args.cron, args.pool)


def _cmd_device_deploy(params: Params, args) -> Callable[[], dict]:
    from calo import fleet

    params.target_device(args.name)
    return lambda: {"deployment": f"{fleet.DEVICE_FLOW}/{args.name}",
                    "deployment_id": fleet.deploy(params, args.name, args.cron, args.pool)}


def _cmd_device_list(params: Params, args) -> Callable[[], dict]:
    from calo import fleet

    def work() -> dict:
        rows = fleet.list_devices(params)
        print(fleet.format_devices(rows), file=sys.stderr)
        return {"devices": rows}

    return work


def _cmd_run(params: Params, args) -> Callable[[], dict]:
    _check_device(params, args.device, target_only=True)
    _donor_available(params)
    _preload_for_tuning()
    from flows.pipeline import device_flow

    return lambda: device_flow(args.device, params_path=str(params.path))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="calo", description="Calibrated graph cost models for TVM Meta-Schedule.",
        epilog=STAGES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default=None,
                        help="parameters file (default: $CALO_PARAMS or params.yaml)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, handler, help_text: str, device: bool = True):
        p = sub.add_parser(name, help=help_text, description=help_text)
        if device:
            p.add_argument("--device", required=True, help="device name from params.yaml")
        p.set_defaults(handler=handler)
        return p

    p = add("workloads", _cmd_workloads, "list the workload suite: name, family, operator, shape",
            device=False)
    p.add_argument("--paper", action="store_true", help="the paper's shapes (<name>@paper)")
    add("records", _cmd_records, "count a device's records by operator family, source, status")
    p = add("harvest", _cmd_harvest, "measure Meta-Schedule candidates on a device")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--workload", action="append", help="workload to harvest (repeatable; "
                       "default: harvest.workloads)")
    group.add_argument("--suite", action="store_true",
                       help="every operator of the built-in suite, at its small shape")
    p.add_argument("--count", type=int, default=None,
                   help="records wanted per workload "
                   "(default: the device's candidates_per_workload)")
    p = add("import", _cmd_import, "import a TVM JSON database (a directory) into a device's "
            "records; bad lines are named and skipped, duplicates skipped")
    p.add_argument("path", help="directory holding database_workload.json and "
                   "database_tuning_record.json")
    add("extract", _cmd_extract, "build the schedule graph of every measured record")
    add("pretrain", _cmd_pretrain, "pre-train the evidential GraphSAGE on the donor", device=False)
    add("sweep", _cmd_sweep, "train on the donor for every setting of the sweep grid "
        "(params.yaml sweep), one MLflow run each; reports the best", device=False)
    add("finetune", _cmd_finetune, "fine-tune the donor model on a device's warm-up probes")
    add("calibrate", _cmd_calibrate, "fit the variance temperature of a device's model")
    p = add("tune", _cmd_tune, "tune workloads with CALO-GNN and with XGBoost, same budget")
    p.add_argument("--workload", action="append",
                   help="workload to tune (repeatable; default: tune.workloads)")
    p = add("evaluate", _cmd_evaluate, "score a model on any TVM JSON database, side by side "
            "with TVM's XGBoost model", device=False)
    p.add_argument("--model", required=True,
                   help="registry alias (donor, a device name) or a saved model directory")
    p.add_argument("--records", required=True, help="TVM JSON database directory")
    p.add_argument("--warmup-fraction", type=float, default=0.0,
                   help="fine-tune on the first F of each workload's records, score the rest")
    p.add_argument("--json", help="write the full report (overall and per workload) here")
    add("run", _cmd_run, "per-device flow: warm-up harvest, fine-tune, calibrate, tune")

    device = sub.add_parser("device", help="add, deploy and list devices",
                            description="add, deploy and list devices")
    dsub = device.add_subparsers(dest="action", required=True, metavar="ACTION")
    schedule_args = argparse.ArgumentParser(add_help=False)
    schedule_args.add_argument("--cron", help="schedule of the device's flow, e.g. '0 3 * * *'")
    schedule_args.add_argument("--pool", default="calo", help="Prefect work pool (a process "
                               "pool; created if missing)")
    p = dsub.add_parser("add", parents=[schedule_args],
                        help="check a new device, record it in params.yaml and create its "
                        "scheduled Prefect deployment")
    p.add_argument("name")
    p.add_argument("--target", required=True, help="TVM target as JSON, e.g. "
                   "'{\"kind\": \"llvm\", \"num-cores\": 4}'")
    p.add_argument("--runner", default="local", help="local (this machine) or rpc (a tracker)")
    p.add_argument("--host", help="RPC tracker host")
    p.add_argument("--port", type=int, help="RPC tracker port")
    p.add_argument("--key", help="RPC device key registered with the tracker")
    p.add_argument("--threads", type=int, help="runtime threads of a local runner")
    p.add_argument("--count", type=int, default=32, help="warm-up probes per workload")
    p.set_defaults(handler=_cmd_device_add)
    p = dsub.add_parser("deploy", help="create or update a device's Prefect deployment",
                        parents=[schedule_args])
    p.add_argument("name")
    p.set_defaults(handler=_cmd_device_deploy)
    p = dsub.add_parser("list", help="devices, their deployments and current models")
    p.set_defaults(handler=_cmd_device_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start = time.monotonic()
    try:
        params = load_params(args.params)
        work = args.handler(params, args)
        result = work()
    except CaloError as err:
        print(f"calo: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1, default=str))
    command = f"{args.command} {args.action}" if args.command == "device" else args.command
    print(f"calo {command}: done in {time.monotonic() - start:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
