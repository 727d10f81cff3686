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


def test_record_stores_push_to_and_pull_from_a_dvc_remote(params, harvested, tmp_path):
    """The harvest output goes to a (local-directory) remote and comes back byte for byte."""
    import hashlib
    import shutil

    from tests.conftest import DONOR

    project, remote = tmp_path / "project", tmp_path / "remote"
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (project / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, project / name)
    shutil.copy2(params.path, project / "params.yaml")
    store = project / "data" / "records" / DONOR
    shutil.copytree(params.records_dir(DONOR).resolve(), store)

    def digest() -> dict:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in store.iterdir()}

    before = digest()

    def run(*cmd: str) -> str:
        out = subprocess.run(list(cmd), cwd=project, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"{cmd}: {out.stdout}\n{out.stderr}"
        return out.stdout

    dvc = [sys.executable, "-m", "dvc"]
    run("git", "init", "-q")
    run(*dvc, "remote", "add", "-d", "team", str(remote))
    run(*dvc, "commit", "-f", f"harvest@{DONOR}")  # record the store as the stage's output
    run(*dvc, "push", f"harvest@{DONOR}")
    assert any(p.is_file() for p in remote.rglob("*"))

    shutil.rmtree(store)
    shutil.rmtree(project / ".dvc" / "cache")
    run(*dvc, "pull", f"harvest@{DONOR}")
    assert digest() == before
    assert "in sync" in run(*dvc, "status", "-c", f"harvest@{DONOR}")
