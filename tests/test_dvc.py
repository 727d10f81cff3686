"""dvc.yaml: one stage per device, every stage depending on exactly the code it runs, and stores
that travel through a DVC remote."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from calo import paths
from tests.code_deps import script_code, stage_code
from tests.conftest import copy_project

REPO = Path(__file__).resolve().parent.parent
DVC = [sys.executable, "-m", "dvc"]
STAGES = ("harvest", "extract", "pretrain", "finetune", "calibrate", "tune", "tune-network")


def run(cwd: Path, *cmd: str) -> str:
    out = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{cmd}: {out.stdout}\n{out.stderr}"
    return out.stdout


def test_dvc_stages_follow_the_devices_in_params():
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    out = run(REPO, *DVC, "stage", "list")
    stages = {line.split()[0] for line in out.splitlines() if line.strip()}
    for device in params["devices"]:
        assert {f"harvest@{device}", f"extract@{device}"} <= stages
    for device in params["targets"]:
        assert {f"finetune@{device}", f"calibrate@{device}", f"tune@{device}",
                f"tune-network@{device}"} <= stages
    assert "pretrain" in stages


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_depends_on_exactly_the_code_it_imports(stage):
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"][stage]
    deps = (spec.get("do") or spec)["deps"]
    code = {d for d in deps if d.endswith(".py")}
    assert code == stage_code(stage.replace("-", "_")), \
        "dvc.yaml's code deps differ from the stage's imports"


def test_stage_outputs_are_where_the_code_writes_them():
    text = (REPO / "dvc.yaml").read_text()
    for path in (paths.records_dir("X"), paths.graphs_path("X"), paths.model_dir("X"),
                 paths.calibrated_dir("X"), paths.tune_dir("X"), paths.network_dir("X", "n").parent,
                 paths.metrics_path("calibration", "X"), paths.metrics_path("tune", "X"),
                 paths.metrics_path("tune-network", "X")):
        assert path.as_posix().replace("X", "${key}") in text or \
            path.as_posix().replace("X", "${item}") in text or \
            path.as_posix().replace("X", "${donor}") in text, path


def test_a_device_run_follows_dvcs_plan(tmp_path):
    """What calo run / a deployment runs for a device: DVC's own order of the stages its
    tuning needs, the donor's included."""
    from calo.flows.pipeline import planned_stages

    project = copy_project(tmp_path / "project")
    params = yaml.safe_load((project / "params.yaml").read_text())
    donor, target = params["donor"], params["targets"][0]
    order = planned_stages(project, [f"tune@{target}"])
    assert set(order) == {f"harvest@{donor}", f"extract@{donor}", "pretrain", f"harvest@{target}",
                          f"extract@{target}", f"finetune@{target}", f"calibrate@{target}",
                          f"tune@{target}"}
    assert order.index(f"extract@{donor}") < order.index("pretrain") < order.index(
        f"finetune@{target}") < order.index(f"calibrate@{target}") < order.index(f"tune@{target}")
    assert order.index(f"extract@{target}") < order.index(f"finetune@{target}")
    assert f"tune@{target}" not in planned_stages(project, [f"calibrate@{target}"])


def _locked_project(root: Path) -> Path:
    """A copy of the repository whose every stage is recorded in dvc.lock as up to date.

    The stages' outputs are stand-in files here: what this checks is which code changes make
    which stages stale, and DVC decides that from dependencies alone.
    """
    project = copy_project(root)
    stages = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]
    params = yaml.safe_load((project / "params.yaml").read_text())
    expanded = run(project, *DVC, "stage", "list", "--names-only").split()
    for name in expanded:
        base, _, item = name.partition("@")
        spec = stages[base].get("do") or stages[base]
        for entry in spec.get("outs", []) + spec.get("metrics", []) + spec.get("plots", []):
            out = next(iter(entry)) if isinstance(entry, dict) else entry
            out = out.replace("${key}", item).replace("${item}", item).replace(
                "${donor}", params["donor"])
            target = project / out
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.suffix in (".json", ".png", ".pt"):
                target.write_text("{}" if target.suffix == ".json" else "stand-in")
            else:
                target.mkdir(exist_ok=True)
                (target / "stand-in").write_text(name)
    run(project, *DVC, "commit", "--force", "dvc.yaml")  # the benchmarks keep their own lock
    return project


def _stale(project: Path) -> set[str]:
    return set(json.loads(run(project, *DVC, "status", "--json", "dvc.yaml")))


@pytest.mark.slow
def test_editing_code_makes_exactly_its_importers_stale(tmp_path):
    project = _locked_project(tmp_path / "project")
    assert _stale(project) == set()
    params = yaml.safe_load((project / "params.yaml").read_text())
    targets = params["targets"]
    every = {f"{s}@{d}" for s in ("harvest", "extract") for d in params["devices"]}
    every |= {"pretrain"} | {f"{s}@{d}" for s in ("finetune", "calibrate", "tune",
                                                   "tune-network") for d in targets}

    def code(name: str) -> set[str]:
        return stage_code(name.partition("@")[0].replace("-", "_"))

    for edited in ("models/training.py", "calo/graphs.py", "tasks/finetune.py"):
        original = (project / edited).read_text()
        (project / edited).write_text(original + "\n# edited\n")
        importers = {name for name in every if edited in code(name)}
        assert _stale(project) == importers, edited
        (project / edited).write_text(original)
        assert _stale(project) == set()
    # the acceptance case spelled out: the training loop re-runs training and what uses it
    assert {n.partition("@")[0] for n in every if "models/training.py" in code(n)} == {
        "pretrain", "finetune", "calibrate", "tune", "tune-network"}
    assert "extract" in {n.partition("@")[0] for n in every if "calo/graphs.py" in code(n)}


def test_record_stores_push_to_and_pull_from_a_dvc_remote(params, harvested, tmp_path):
    """The harvest output goes to a (local-directory) remote and comes back byte for byte."""
    import hashlib

    from tests.conftest import DONOR

    project, remote = copy_project(tmp_path / "project"), tmp_path / "remote"
    shutil.copy2(params.path, project / "params.yaml")
    store = project / "data" / "records" / DONOR
    shutil.copytree(paths.records_dir(DONOR).resolve(), store)

    def digest() -> dict:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in store.iterdir()}

    before = digest()
    run(project, *DVC, "remote", "add", "-d", "team", str(remote))
    run(project, *DVC, "commit", "-f", f"harvest@{DONOR}")  # record the store as the output
    run(project, *DVC, "push", f"harvest@{DONOR}")
    assert any(p.is_file() for p in remote.rglob("*"))

    shutil.rmtree(store)
    shutil.rmtree(project / ".dvc" / "cache")
    run(project, *DVC, "pull", f"harvest@{DONOR}")
    assert digest() == before
    assert "in sync" in run(project, *DVC, "status", "-c", f"harvest@{DONOR}")



def test_the_benchmark_stages_depend_on_exactly_the_code_they_import():
    stages = yaml.safe_load((REPO / "benchmarks" / "dvc.yaml").read_text())["stages"]
    for name, spec in stages.items():
        spec = spec.get("do") or spec
        code = {d for d in spec["deps"] if d.endswith(".py")}
        assert code == script_code(REPO / spec["cmd"].split()[1]), \
            f"benchmarks/dvc.yaml's {name} code deps differ from the script's imports"
