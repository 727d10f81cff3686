"""The run's figures in one screen: calibration, promotion and tuning per target device."""

from __future__ import annotations

import json
import math
from pathlib import Path

from calo import config as cfg
from calo import paths


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _num(value, fmt: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, fmt)


def format_summary(settings: cfg.Settings, devices: list[str] | None = None) -> str:
    lines = []
    for device in devices or settings.targets:
        lines.append(f"== {device} (donor {settings.donor})")
        cal = _read(paths.report_path("calibration", device))
        if cal:
            lines.append(f"calibration: temperature {_num(cal['temperature'])}")
            lines.append(f"  {'split':<6}{'probes':>8}{'ECE before':>12}{'ECE after':>11}"
                         f"{'NLL before':>12}{'NLL after':>11}")
            for split in ("val", "test"):
                lines.append(f"  {split:<6}{cal.get(f'{split}_count', 0):>8}"
                             f"{_num(cal.get(f'{split}_ece_before')):>12}"
                             f"{_num(cal.get(f'{split}_ece_after')):>11}"
                             f"{_num(cal.get(f'{split}_nll_before')):>12}"
                             f"{_num(cal.get(f'{split}_nll_after')):>11}")
        promo = _read(paths.promotion_path(device))
        if promo:
            lines.append(f"registry: version {promo['version']}: {promo['promotion']}"[:118])
        report = _read(paths.report_path("tune", device))
        if report:
            lines.append(f"tuning ({settings.tune.max_trials} trials; trials and seconds to "
                         f"within {settings.tune.quality_eps:.0%} of the best either model "
                         f"found, '>N' = not reached):")
            lines.append(f"  {'workload':<28}{'CALO best us':>13}{'trials':>8}{'s':>6}"
                         f"{'XGB best us':>13}{'trials':>8}{'s':>6}{'ratio':>8}")
            for workload, row in report["workloads"].items():
                cells = []
                for model in ("calo", "xgb"):
                    run = row[model]
                    reach = run["trials_to_quality"] or f">{run['trials']}"
                    secs = run.get("seconds_to_quality")  # reports before it lack the field
                    secs = (f"{secs:.0f}" if secs is not None
                            else f">{run['wall_s']:.0f}" if "seconds_to_quality" in run else "-")
                    cells.append(f"{_num(run['best_latency_us'], '.1f'):>13}{reach!s:>8}"
                                 f"{secs:>6}")
                lines.append(f"  {workload[:27]:<28}{''.join(cells)}"
                             f"{_num(row['trials_ratio_calo_vs_xgb'], '.2f'):>8}")
            s = report["summary"]
            lines.append(f"  geo-mean trials ratio CALO / XGBoost: "
                         f"{_num(s['geomean_trials_ratio_calo_vs_xgb'], '.2f')} "
                         f"(reached: CALO {s['calo_reached_quality']}, XGBoost "
                         f"{s['xgb_reached_quality']} of {s['workloads']})")
            # A reader takes one search's ratio for the model's speed-up; it is one draw, and
            # XGBModel picks at random until it has its warm-up of measurements.
            lines.append("  each row is one search, one draw (XGBoost picks at random until its "
                         "warm-up): benchmarks/ttq.py compares over seeds")
    return "\n".join(lines)
