"""After the pipeline: register a device's calibrated model and let it challenge the champion.

Not a DVC stage: it reads the registry, which DVC cannot track, so it runs after every
`dvc repro` (`calo run`, `make run`, scheduled device runs). The model is registered as a new
version unless that exact artifact already is; the device's alias moves to it only if it beats
the version the alias points at on the device's held-out probes (lower NLL, Kendall tau no
lower, thresholds in `promotion:`), and only if the alias has not moved meanwhile.
"""

from __future__ import annotations

import json

import mlflow

from calo import config as cfg
from calo import locks, paths, registry
from calo.artifact import TrainedModel, load_with_graphs
from calo.dataset import GraphSet
from calo.evaluation import evaluate
from calo.log import get_logger


def held_out_score(trained: TrainedModel, probes: GraphSet, levels: int) -> dict:
    scores = evaluate(trained.net, probes, levels, trained.temperature, trained.correction)
    return {"nll": scores["nll"], "kendall_tau": scores["kendall_tau"]}


def decide(rule: cfg.Promotion, challenger: dict, champion: dict | None,
           champion_version: str | None) -> tuple[bool, str]:
    if champion is None:
        return True, "first model for this device"
    verdict = (f"NLL {challenger['nll']:.4f} vs v{champion_version} {champion['nll']:.4f}, "
               f"Kendall tau {challenger['kendall_tau']:.4f} vs {champion['kendall_tau']:.4f}")
    nll_gain = champion["nll"] - challenger["nll"]
    tau_drop = champion["kendall_tau"] - challenger["kendall_tau"]
    if nll_gain > rule.min_nll_gain and not tau_drop > rule.max_tau_drop:
        return True, f"beats the champion: {verdict}"
    return False, f"not better than the champion: {verdict}"


def promote(settings: cfg.Settings, device: str) -> dict:
    """Holds the device's lock throughout (calo.locks): one writer of its model at a time."""
    with locks.device_lock(device, "calo promote"):
        return _promote(settings, device)


def _promote(settings: cfg.Settings, device: str) -> dict:
    settings.target_device(device)
    model_dir = paths.calibrated_dir(device)
    challenger, graphs = load_with_graphs(device, model_dir, "calibrate")
    probes = graphs.split("test", settings.split)
    if len(probes) < 2:  # too few test probes: judge on validation
        probes = graphs.split("val", settings.split)
    levels = settings.calibrate.levels
    mine = held_out_score(challenger, probes, levels)
    current = registry.aliased_version(settings, device)
    digest = registry.artifact_digest(model_dir)
    if current is not None and current.tags.get("artifact_sha256") == digest:
        result = {"device": device, "version": current.version, "promoted": True,
                  "promotion": "already the device's model", **mine}
        _write(device, result)
        return result
    champion = None
    if current is not None:
        champion = held_out_score(registry.load_registered(settings, device)[0], probes, levels)
    promoted, why = decide(settings.promotion, mine, champion,
                           current.version if current else None)
    with registry.start_run(settings, "promote", f"promote-{device}"):
        mlflow.log_metrics({f"probe_{k}": v for k, v in mine.items()})
        mlflow.set_tags({"device": device, "promoted": promoted, "promotion": why})
        donor = registry.find_version(settings, challenger.info.get("donor_sha256", ""))
        version = registry.register(
            settings, model_dir,
            tags={**challenger.info, "temperature": challenger.temperature,
                  "promoted": promoted, "promotion": why,
                  **{f"probe_{k}": v for k, v in mine.items()}},
            description=(
                f"Device '{device}': donor version {donor.version if donor else '?'} "
                f"fine-tuned on {challenger.info.get('warmup_graphs', '?')} warm-up probes "
                f"(records {challenger.info.get('data_sha256', '?')}), temperature "
                f"{challenger.temperature:.3f}. On {len(probes)} held-out probes: NLL "
                f"{mine['nll']:.3f}, Kendall tau {mine['kendall_tau']:.3f}. "
                f"{'Promoted' if promoted else 'Not promoted'}: {why}."))
    if promoted:
        registry.move_alias(settings, device, version, current.version if current else None)
    result = {"device": device, "version": version, "promoted": promoted, "promotion": why,
              **mine}
    _write(device, result)
    get_logger().info(f"promote {device}: version {version} "
                      f"{'is now' if promoted else 'registered, not'} '{device}': {why}")
    return result


def _write(device: str, result: dict) -> None:
    path = paths.promotion_path(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
