"""`calo`: the pipeline's stages (what dvc.yaml runs), the whole pipeline as a Prefect flow, and
the tools around them.

Every command checks its inputs (devices, workloads, targets, the files the stage reads) before
any work starts, and stops with one line naming the problem.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from calo import interrupt, locks, paths
from calo.config import Settings, load_settings
from calo.errors import CaloError

STAGES = """commands (dvc.yaml is the pipeline: `dvc dag` shows its order):
  workloads  list the built-in operator suite (and params.yaml's own workloads)
  harvest    sample Meta-Schedule candidates on a device, build and measure them, append to
             data/records/<device>/ (a TVM JSON database); tops up, never re-measures
  records    count a device's records by operator family, candidate source and status
  import     add the records of an existing TVM JSON database (from any machine) to a device
  extract    one schedule graph (loops, blocks, buffers; typed edges) per measured record
  pretrain   train the evidential GraphSAGE model on the donor's graphs; registry alias 'donor'
  sweep      the paper's grid (lr x weight decay x lambda) on the donor, one MLflow run each
  finetune   adapt the donor model to a device on its warm-up probes
  calibrate  fit the variance temperature on validation probes; ECE/NLL before and after
  tune       tune_tir with CALO-GNN (UEC-UCB) and with TVM's XGBoost model, same budget and seed
  tune-network  a whole PyTorch network through Relax: its tasks tuned with the device's
             registered model and with XGBoost, compiled three ways, outputs checked, timed
  promote    register a device's calibrated model; its alias moves only if it beats the current one
  evaluate   Kendall tau, top-1/top-5, regret, ECE, NLL, RMSE of a model on any TVM database,
             beside TVM's XGBoost and MLP trained on the warm-up (and on donor + warm-up)
  run        the pipeline as a Prefect flow: the stages of dvc.yaml (of one device with --device),
             then promote, then the summary
  summary    calibration, promotion and tuning figures of the target devices
  device     add a device (checked, recorded in params.yaml, deployed to a Prefect server with
             its schedule), deploy an existing one, list devices with their current models
"""


def _check_device(settings: Settings, name: str, target_only: bool = False) -> None:
    from calo.devices import make_target  # imports TVM: only once the cheap checks passed

    device = settings.target_device(name) if target_only else settings.device(name)
    make_target(device)


def _preload_for_tuning() -> None:
    from calo.devices import preload_tensor_intrinsics

    preload_tensor_intrinsics()


def _require(path: Path, message: str) -> None:
    if not path.exists():
        raise CaloError(message)


def _database(path: str, flag: str) -> Path:
    from calo.records import RECORD_FILE, WORKLOAD_FILE

    source = Path(path)
    if not (source / WORKLOAD_FILE).is_file() or not (source / RECORD_FILE).is_file():
        raise CaloError(f"{flag}{source} is not a TVM JSON database "
                        f"(expected {WORKLOAD_FILE} and {RECORD_FILE})")
    return source


def _cmd_workloads(settings: Settings, args) -> Callable[[], dict]:
    from calo import suite

    rows = [(name, suite.family(name), settings.workload(name)) for name in suite.names()]
    if args.paper:
        rows = [(n, suite.family(n), settings.workload(n)) for n in suite.names(suite.PAPER)]
    own = [n for n in settings.workloads if suite.resolve(n) is None]
    rows += [(name, "params.yaml", settings.workload(name)) for name in own]
    width = max(len(r[0]) for r in rows)
    for name, family, wl in rows:
        shape = " ".join(f"{k}={v}" for k, v in wl.args.items())
        print(f"{name:<{width}}  {family:<11}  {wl.op}({shape})")
    families: dict[str, int] = {}
    for _, family, _ in rows:
        families[family] = families.get(family, 0) + 1
    return lambda: {"workloads": len(rows), "families": families}


def _cmd_records(settings: Settings, args) -> Callable[[], dict]:
    """Counts of a device's store by operator family, source and status."""
    from calo import records, suite
    from calo.log import get_logger

    settings.device(args.device)
    store = paths.records_dir(args.device)
    _require(store / records.RECORD_FILE, f"no records for device '{args.device}' in {store}")
    with locks.lock_if_free(args.device, "calo records") as idle:
        if idle:  # a torn tail of a store nobody writes now is a crash's leftover: set it aside
            records.recover_torn_tails(store)
    table: dict[str, dict[str, int]] = {}
    targets: dict[str, int] = {}
    for rec in records.iter_records(store):
        row = table.setdefault(suite.family(rec.workload_name), {})
        for col in (rec.source, rec.status, "records"):
            row[col] = row.get(col, 0) + 1
        if rec.record.target is not None:
            key = records.describe_target(records.target_key(rec.record.target))
            targets[key] = targets.get(key, 0) + 1
    print("measured on " + ", ".join(f"{t} ({n} records)" for t, n in sorted(targets.items())))
    if len(targets) > 1:
        get_logger().warning(f"{store} holds records of {len(targets)} targets: their "
                             "candidates are ranked against each other as one device's")
    cols = sorted({c for row in table.values() for c in row} - {"records"}) + ["records"]
    total = {c: sum(row.get(c, 0) for row in table.values()) for c in cols}
    print(f"{'family':<12}" + "".join(f"{c:>12}" for c in cols))
    for family, row in sorted(table.items()) + [("total", total)]:
        print(f"{family:<12}" + "".join(f"{row.get(c, 0):>12}" for c in cols))
    return lambda: {"device": args.device, "by_family": table, "total": total,
                    "targets": targets}


def _cmd_harvest(settings: Settings, args) -> Callable[[], dict]:
    _check_device(settings, args.device)
    if args.suite:
        from calo import suite

        names = suite.names(args.suite)
    else:
        names = args.workload or list(settings.harvest.workloads)
    settings.workloads_named(names)
    if args.count is not None and args.count < 0:
        raise CaloError(f"--count must be >= 0, got {args.count}")
    from calo.tasks.harvest import harvest

    return lambda: harvest(settings, args.device, names, args.count)


def _cmd_import(settings: Settings, args) -> Callable[[], dict]:
    _check_device(settings, args.device)
    source = _database(args.path, "")
    from calo.tasks.import_records import import_records

    return lambda: import_records(settings, args.device, source.resolve())


def _cmd_extract(settings: Settings, args) -> Callable[[], dict]:
    from calo.records import RECORD_FILE

    settings.device(args.device)
    store = paths.records_dir(args.device)
    _require(store / RECORD_FILE,
             f"no records for device '{args.device}' in {store}: run `calo harvest` first")
    if settings.extracts_stores(args.device):  # TVM's per-store features need a TuneContext
        _preload_for_tuning()
    from calo.tasks.extract import extract

    return lambda: extract(settings, args.device)


def _require_donor_graphs(settings: Settings) -> None:
    _require(paths.graphs_path(settings.donor),
             f"no graphs for donor '{settings.donor}': run `calo harvest` and `calo extract` "
             "first")


def _cmd_pretrain(settings: Settings, args) -> Callable[[], dict]:
    _require_donor_graphs(settings)
    from calo import compute

    if args.nproc > 1:
        from calo.graph_store import GraphStore

        GraphStore(paths.graphs_path(settings.donor))  # a bad store: one line, not N tracebacks
        argv = [*(["--params", args.params] if args.params else []), "pretrain"]
        return lambda: _launched(compute.launch(args.nproc, argv))
    from calo.tasks.pretrain import pretrain

    def run() -> dict:
        joined = compute.join_process_group(settings)
        try:
            return pretrain(settings)
        finally:
            if joined:
                compute.leave_process_group()

    return run


def _launched(code: int) -> dict:
    if code:
        raise CaloError(f"the data-parallel pretrain exited with status {code} (its processes' "
                        "output is above)")
    return {}


def _cmd_sweep(settings: Settings, args) -> Callable[[], dict]:
    _require_donor_graphs(settings)
    from calo.tasks.sweep import sweep

    return lambda: sweep(settings)


def _cmd_finetune(settings: Settings, args) -> Callable[[], dict]:
    settings.target_device(args.device)
    _require(paths.graphs_path(args.device),
             f"no graphs for device '{args.device}': run `calo harvest` and `calo extract` first")
    _require(paths.model_dir(settings.donor),
             f"no donor model in {paths.model_dir(settings.donor)}: run `calo pretrain` first")
    from calo.tasks.finetune import finetune

    return lambda: finetune(settings, args.device)


def _cmd_calibrate(settings: Settings, args) -> Callable[[], dict]:
    settings.target_device(args.device)
    _require(paths.model_dir(args.device),
             f"no fine-tuned model for device '{args.device}': run `calo finetune` first")
    from calo.tasks.calibrate import calibrate

    return lambda: calibrate(settings, args.device)


def _targets(settings: Settings, args) -> list[str]:
    devices = [args.device] if args.device else list(settings.targets)
    for name in devices:
        settings.target_device(name)
    return devices


def _cmd_promote(settings: Settings, args) -> Callable[[], dict]:
    devices = _targets(settings, args)
    for name in devices:
        _require(paths.calibrated_dir(name),
                 f"no calibrated model for device '{name}': run `calo calibrate` first")
    from calo.tasks.promote import promote

    return lambda: {name: promote(settings, name) for name in devices}


def _cmd_tune(settings: Settings, args) -> Callable[[], dict]:
    _check_device(settings, args.device, target_only=True)
    names = args.workload or list(settings.tune.workloads)
    settings.workloads_named(names)
    _require(paths.calibrated_dir(args.device),
             f"no calibrated model for device '{args.device}': run `calo calibrate` first")
    _preload_for_tuning()
    from calo.tasks.tune import tune_device

    return lambda: tune_device(settings, args.device, names)


def _cmd_tune_network(settings: Settings, args) -> Callable[[], dict]:
    settings.device(args.device)
    from calo.networks import check_spec

    for name in args.network or []:
        check_spec(name)  # before TVM's imports, which take seconds
    _preload_for_tuning()
    from calo.tasks.tune_network import tune_networks

    return lambda: tune_networks(settings, args.device, args.network, args.trials, args.batch)


def _cmd_evaluate(settings: Settings, args) -> Callable[[], dict]:
    source = _database(args.records, "--records: ")
    donor_stores = ([_database(d, "--donor-records: ").resolve() for d in args.donor_records]
                    if args.donor_records else None)
    if not 0 <= args.warmup_fraction < 1:
        raise CaloError(f"--warmup-fraction must be in [0, 1), got {args.warmup_fraction}")
    if args.warmup is not None and args.warmup < 0:
        raise CaloError(f"--warmup must be >= 0 records, got {args.warmup}")
    out = Path(args.json) if args.json else None
    if out is not None and not out.parent.is_dir():
        raise CaloError(f"--json: directory {out.parent} does not exist")
    _preload_for_tuning()
    from calo.tasks.evaluate import evaluate_records, format_table

    def work() -> dict:
        report = evaluate_records(settings, args.model, str(source.resolve()),
                                  args.warmup_fraction, args.warmup, args.choose,
                                  donor_stores=donor_stores)
        print(format_table(report), file=sys.stderr)
        if out is not None:
            out.write_text(json.dumps(report, indent=1))
        return report["overall"]

    return work


def _cmd_summary(settings: Settings, args) -> Callable[[], dict]:
    from calo.summary import format_summary

    devices = _targets(settings, args)
    print(format_summary(settings, devices))
    return lambda: {"devices": devices}


def _cmd_device_add(settings: Settings, args) -> Callable[[], dict]:
    from calo import fleet

    entry = fleet.device_entry(args.target, args.runner, args.host, args.port, args.key,
                               args.threads, args.count)
    return lambda: fleet.add_device(settings, args.name, entry, args.cron, args.pool)


def _cmd_device_deploy(settings: Settings, args) -> Callable[[], dict]:
    from calo import fleet

    settings.target_device(args.name)
    return lambda: {"deployment": f"{fleet.DEVICE_FLOW}/{args.name}",
                    "deployment_id": fleet.deploy(settings, args.name, args.cron, args.pool)}


def _cmd_device_list(settings: Settings, args) -> Callable[[], dict]:
    from calo import fleet

    def work() -> dict:
        rows = fleet.list_devices(settings)
        print(fleet.format_devices(rows), file=sys.stderr)
        return {"devices": rows}

    return work


def _cmd_run(settings: Settings, args) -> Callable[[], dict]:
    if args.device:
        _check_device(settings, args.device, target_only=True)
    project = settings.path.resolve().parent
    if settings.path.name != "params.yaml" or not (project / "dvc.yaml").is_file():
        raise CaloError(f"`calo run` runs dvc.yaml, which reads the params.yaml beside it: "
                        f"{settings.path} is not a project's params.yaml")
    from calo.flows.pipeline import device_flow, pipeline_flow

    summary: list[str] = []
    # The summary is the last thing on the screen: registered before the flow starts Prefect's
    # temporary server, this exit handler runs after the server's own (atexit runs LIFO).
    atexit.register(lambda: print("\n" + summary[0], flush=True) if summary else None)

    def work() -> dict:
        if args.device:
            result = device_flow(args.device, project=str(project), tune=not args.no_tune)
        else:
            result = pipeline_flow(project=str(project), tune=not args.no_tune)
        summary.append(result["summary"])
        return result

    return work


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="calo", description="Calibrated graph cost models for TVM Meta-Schedule.",
        epilog=STAGES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default=None,
                        help="parameters file (default: $CALO_PARAMS or params.yaml)")
    parser.add_argument("--no-wait", action="store_true",
                        help="stop at once if another run is writing the device's data "
                             "(default: wait for it)")
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
    group.add_argument("--suite", nargs="?", const="small", metavar="SHAPE",
                       choices=["small", "medium", "large", "all"],
                       help="every operator of the built-in suite at one shape (default small) "
                       "or at all three")
    p.add_argument("--count", type=int, default=None,
                   help="records wanted per workload "
                   "(default: the device's candidates_per_workload)")
    p = add("import", _cmd_import, "import a TVM JSON database (a directory) into a device's "
            "records; bad lines are named and skipped, duplicates skipped")
    p.add_argument("path", help="directory holding database_workload.json and "
                   "database_tuning_record.json")
    add("extract", _cmd_extract, "build the schedule graph of every measured record")
    p = add("pretrain", _cmd_pretrain, "pre-train the evidential GraphSAGE on the donor",
            device=False)
    p.add_argument("--nproc", type=int, default=1, help="train data parallel in this many "
                   "processes on this machine (torchrun; gloo on CPU, NCCL on GPUs)")
    add("sweep", _cmd_sweep, "train on the donor for every setting of the sweep grid "
        "(params.yaml sweep), one MLflow run each; reports the best", device=False)
    add("finetune", _cmd_finetune, "fine-tune the donor model on a device's warm-up probes")
    add("calibrate", _cmd_calibrate, "fit the variance temperature of a device's model")
    p = add("promote", _cmd_promote, "register target devices' calibrated models; each alias "
            "moves only to a model that beats the current one", device=False)
    p.add_argument("--device", help="one target device (default: every target)")
    p = add("tune", _cmd_tune, "tune workloads with CALO-GNN and with XGBoost, same budget")
    p.add_argument("--workload", action="append",
                   help="workload to tune (repeatable; default: tune.workloads)")
    p = add("tune-network", _cmd_tune_network, "tune a whole PyTorch network through Relax "
            "with the device's registered model and with XGBoost, same budget; compile it "
            "untuned and with each database, check outputs, measure end-to-end latency")
    p.add_argument("--network", action="append", help="built-in network (small-cnn, encoder, "
                   "recommender) or package.module:function returning (module, example "
                   "inputs); repeatable (default: networks.tune)")
    p.add_argument("--trials", type=int, help="measured candidates per network and model "
                   "(default: networks.trials)")
    p.add_argument("--batch", type=int, help="batch size of the inputs (default: "
                   "networks.batch)")
    p = add("evaluate", _cmd_evaluate, "score a model on any TVM JSON database, side by side "
            "with TVM's XGBoost and MLP models", device=False)
    p.add_argument("--model", required=True,
                   help="registry alias (donor, a device name) or a saved model directory")
    p.add_argument("--records", required=True, help="TVM JSON database directory")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--warmup-fraction", type=float, default=0.0,
                       help="fine-tune on the first F of each workload's records, score the rest")
    group.add_argument("--warmup", type=int, default=None, metavar="N",
                       help="fine-tune on N records of each workload, score the rest")
    p.add_argument("--choose", choices=["first", "random", "uncertainty"], default="first",
                   help="the warm-up: the first measured (default), the first random samples "
                   "(as a new device's probes), or with --warmup N random samples picked where "
                   "the model is least certain")
    p.add_argument("--donor-records", nargs="+", metavar="DIR",
                   help="TVM JSON databases that TVM's xgb_donor and mlp_donor train on beside "
                   "the warm-up: those the model was trained on (default: the donor device's "
                   "store)")
    p.add_argument("--json", help="write the full report (overall and per workload) here")
    p = add("run", _cmd_run, "the pipeline as a Prefect flow: dvc.yaml's stages, then promote, "
            "then the summary", device=False)
    p.add_argument("--device", help="one target device's stages only (its deployments run this)")
    p.add_argument("--no-tune", action="store_true", help="stop after calibrate: a model "
                   "refresh without tuning")
    p = add("summary", _cmd_summary, "calibration, promotion and tuning figures of the run",
            device=False)
    p.add_argument("--device", help="one target device (default: every target)")

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


# What dvc.yaml runs, and commands whose output is a table: their result is logged, not dumped.
# Commands that talk to the MLflow tracking server / a Prefect server (when one is configured).
_NEEDS_MLFLOW = {"pretrain", "sweep", "finetune", "calibrate", "promote", "tune", "tune-network",
                 "run", "device"}
_NEEDS_PREFECT = {"run", "device"}


def _require_services(settings: Settings, args) -> None:
    from calo import services

    registry_model = args.command == "evaluate" and not Path(args.model).exists()
    if args.command in _NEEDS_MLFLOW or registry_model:
        services.require_mlflow(settings)
    if args.command in _NEEDS_PREFECT:
        from calo.fleet import prefect_server

        services.require_prefect(prefect_server())


_NO_RESULT_JSON = {"harvest", "extract", "pretrain", "finetune", "calibrate", "tune", "promote",
                   "tune-network", "run", "summary", "workloads", "records"}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start = time.monotonic()
    try:
        settings = load_settings(args.params)
        locks.set_waiting(not args.no_wait)
        _require_services(settings, args)  # first: a stage's imports alone take seconds
        work = args.handler(settings, args)
        result = work()
    except CaloError as err:
        print(f"calo: error: {err}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, RuntimeError) as err:
        # TVM turns a Ctrl-C inside its calls into a RuntimeError: the same interrupt.
        if isinstance(err, RuntimeError) and not interrupt.requested():
            raise
        print("calo: interrupted; what was stored so far is kept", file=sys.stderr)
        return 130
    if args.command not in _NO_RESULT_JSON:
        print(json.dumps(result, indent=1, default=str))
    command = f"{args.command} {args.action}" if args.command == "device" else args.command
    if os.environ.get("RANK", "0") != "0" or os.environ.get("CALO_LAUNCHED"):
        return 0  # one of torchrun's processes: the main one, or `calo pretrain --nproc`, reports
    print(f"calo {command}: done in {time.monotonic() - start:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
