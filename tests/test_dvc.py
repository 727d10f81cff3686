"""dvc.yaml expands into one stage per device, from params.yaml."""

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def test_dvc_stages_follow_the_devices_in_params():
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    out = subprocess.run([sys.executable, "-m", "dvc", "stage", "list"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    stages = {line.split()[0] for line in out.stdout.splitlines() if line.strip()}
    for device in params["devices"]:
        assert {f"harvest@{device}", f"extract@{device}"} <= stages
    for device in params["targets"]:
        assert {f"finetune@{device}", f"calibrate@{device}", f"tune@{device}"} <= stages
    assert "pretrain" in stages
