"""The CLI: help, and bad input stopping before any work with one line.

`--help` and one bad input run as real processes; the other cases call calo.cli.main in this
process, the same code without a process start (most of a subprocess's seconds).
"""

import contextlib
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from calo.cli import main
from tests.conftest import DONOR, TARGET


def calo(*args: str, cwd: Path, params: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ}
    if params is not None:
        env["CALO_PARAMS"] = str(params)
    return subprocess.run([sys.executable, "-m", "calo.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def cli(capsys, *args: str, cwd: Path, params: Path | None = None) -> tuple[int, str]:
    """calo.cli.main on args in cwd: its exit code and what it wrote to stderr."""
    capsys.readouterr()
    with contextlib.chdir(cwd):
        code = main([*(["--params", str(params)] if params else []), *args])
    return code, capsys.readouterr().err


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def test_help_explains_every_stage(tmp_path):
    out = calo("--help", cwd=tmp_path)
    assert out.returncode == 0
    for stage in ("harvest", "extract", "pretrain", "finetune", "calibrate", "tune", "promote",
                  "run", "summary"):
        assert f"  {stage}" in out.stdout
    sub = calo("tune", "--help", cwd=tmp_path)
    assert "--workload" in sub.stdout and "--device" in sub.stdout


@pytest.mark.parametrize("args, message", [
    (["harvest", "--device", "nope"], "unknown device 'nope'"),
    (["harvest", "--device", DONOR, "--workload", "nope"], "unknown workload 'nope'"),
    (["tune", "--device", TARGET, "--workload", "nope"], "unknown workload 'nope'"),
    (["finetune", "--device", DONOR], f"device '{DONOR}' is not a target device"),
    (["harvest", "--device", DONOR, "--count", "-1"], "--count must be >= 0"),
    (["import", "--device", TARGET, "no-such-dir"], "no-such-dir is not a TVM JSON database"),
])
def test_bad_input_is_one_line_and_changes_nothing(workdir, harvested, capsys, args, message):
    before = tree_digest(workdir / "data")
    code, err = cli(capsys, *args, cwd=workdir)
    assert code == 2
    assert err.strip().count("\n") == 0, err
    assert message in err
    assert tree_digest(workdir / "data") == before


def test_bad_input_ends_a_real_process_with_exit_code_2_and_one_line(workdir, harvested):
    before = tree_digest(workdir / "data")
    out = calo("harvest", "--device", "nope", cwd=workdir)
    assert out.returncode == 2
    assert out.stderr.startswith("calo: error: unknown device 'nope'")
    assert out.stderr.strip().count("\n") == 0 and out.stdout == ""
    assert tree_digest(workdir / "data") == before


def test_malformed_target_is_rejected(tmp_path, params, capsys):
    raw = yaml.safe_load(Path(params.path).read_text())
    raw["devices"][TARGET]["target"] = {"kind": "llvmx"}
    bad = tmp_path / "params.yaml"
    bad.write_text(yaml.safe_dump(raw))
    code, err = cli(capsys, "harvest", "--device", DONOR, cwd=tmp_path, params=bad)
    assert code == 2
    assert f"devices.{TARGET}: unknown target kind 'llvmx'" in err
    assert not (tmp_path / "data").exists()


def test_invalid_target_attribute_is_rejected(tmp_path, params, capsys):
    raw = yaml.safe_load(Path(params.path).read_text())
    raw["devices"][TARGET]["target"] = {"kind": "llvm", "num-cores": "many"}
    bad = tmp_path / "params.yaml"
    bad.write_text(yaml.safe_dump(raw))
    code, err = cli(capsys, "harvest", "--device", TARGET, cwd=tmp_path, params=bad)
    assert code == 2 and "invalid target" in err
    assert err.strip().count("\n") == 0
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("args, message", [
    (["extract", "--device", TARGET], f"no records for device '{TARGET}'"),
    (["pretrain"], f"no graphs for donor '{DONOR}'"),
    (["calibrate", "--device", TARGET], f"no fine-tuned model for device '{TARGET}'"),
    (["tune", "--device", TARGET], f"no calibrated model for device '{TARGET}'"),
])
def test_missing_stage_inputs_are_named(tmp_path, params, capsys, args, message):
    code, err = cli(capsys, *args, cwd=tmp_path, params=Path(params.path))
    assert code == 2
    assert message in err
    assert err.strip().count("\n") == 0


def test_unreadable_params_file(tmp_path, capsys):
    (tmp_path / "params.yaml").write_text("devices: [unclosed")
    code, err = cli(capsys, "pretrain", cwd=tmp_path, params=tmp_path / "params.yaml")
    assert code == 2 and "is not valid YAML" in err


def test_a_missing_params_file_says_where_it_looked_and_how_to_name_one(tmp_path, capsys,
                                                                      monkeypatch):
    monkeypatch.delenv("CALO_PARAMS", raising=False)
    code, err = cli(capsys, "evaluate", "--model", "donor", "--records", str(tmp_path),
                    cwd=tmp_path)
    assert code == 2
    assert str(tmp_path / "params.yaml") in err and "--params" in err and "CALO_PARAMS" in err


def test_unknown_finetune_layers_are_rejected(tmp_path, params, capsys):
    raw = yaml.safe_load(Path(params.path).read_text())
    raw["finetune"]["rule"][0]["layers"] = "encoder"
    bad = tmp_path / "params.yaml"
    bad.write_text(yaml.safe_dump(raw))
    code, err = cli(capsys, "finetune", "--device", TARGET, cwd=tmp_path, params=bad)
    assert code == 2
    assert "params.yaml: finetune.rule[0].layers must be one of head, all, got 'encoder'" in err


def test_finetune_rule_picks_the_first_row_covering_the_warmup_size(params):
    rule = params.override({"finetune.rule": [
        {"up_to": 8, "layers": "head", "epochs": 5, "lr": 1.0e-3},
        {"up_to": 64, "layers": "all", "epochs": 20, "lr": 5.0e-4},
        {"up_to": None, "layers": "all", "epochs": 10, "lr": 1.0e-3}]}).finetune
    assert [rule.step_for(n).epochs for n in (1, 8, 8.5, 64, 2000)] == [5, 5, 20, 20, 10]


def test_a_rule_row_takes_the_sections_keep_and_the_donors_fast_weight_unless_it_says(params):
    rule = params.override({"finetune.keep": "best", "finetune.rule": [
        {"up_to": 16, "layers": "all", "epochs": 10, "lr": 3.0e-4},
        {"up_to": None, "layers": "all", "epochs": 30, "lr": 1.0e-4, "fast_weight": 4.0,
         "keep": "last"}]}).finetune
    small, large = rule.step_for(8, fast_weight=1.0), rule.step_for(96, fast_weight=1.0)
    assert (small.keep, small.fast_weight) == ("best", 1.0)
    assert (large.keep, large.fast_weight) == ("last", 4.0)


def test_fine_tunes_weigh_ranking_pairs_as_the_donor_did_unless_told(params):
    train = params.override({"train.rank_weighting": "throughput"}).train
    for own, expected in ((None, "throughput"), ("lambda", "lambda"), ("uniform", "uniform")):
        finetune = params.override({"finetune.rank_weighting": own}).finetune
        assert finetune.weighting(train) == expected


def test_records_of_a_device_the_model_knows_take_the_same_device_rule(params):
    rules = params.override({
        "finetune.rule": [{"up_to": None, "layers": "all", "epochs": 30, "lr": 3.0e-3}],
        "finetune.same_device_rule": [
            {"up_to": 16, "layers": "all", "epochs": 10, "lr": 3.0e-4, "anchor": 100.0},
            {"up_to": None, "layers": "head", "epochs": 5, "lr": 1.0e-4}]}).finetune
    assert [rules.step_for(n).lr for n in (8, 100)] == [3.0e-3, 3.0e-3]
    assert [rules.step_for(n, same_device=True).epochs for n in (8, 100)] == [10, 5]
    # without a same-device rule every adaptation takes the rule
    plain = params.override({"finetune.same_device_rule": []}).finetune
    assert plain.step_for(8, same_device=True) == plain.step_for(8)


@pytest.mark.parametrize("edit, message", [
    (lambda raw: raw["train"].update(lr="fast"), "train.lr must be a number, got 'fast'"),
    (lambda raw: raw["tune"].update(max_trials=True), "tune.max_trials must be an integer"),
    (lambda raw: raw["harvest"].update(batchsize=8), "unknown key 'harvest.batchsize'"),
    (lambda raw: raw["model"].pop("hidden"), "model.hidden is missing"),
    (lambda raw: raw.pop("tune"), "params.yaml: tune is missing"),
    (lambda raw: raw["finetune"].update(same_device_rule=raw["finetune"]["rule"][::-1]),
     "finetune.same_device_rule must list rows by increasing up_to, the last with up_to: null"),
    (lambda raw: raw["finetune"].update(rule=[]),
     "finetune.rule must list rows by increasing up_to, the last with up_to: null"),
    (lambda raw: raw["finetune"]["rule"][0].update(anchor=-1), "anchor must be >= 0"),
    (lambda raw: raw["finetune"]["rule"][0].update(fast_weight=-1), "fast_weight must be >= 0"),
    (lambda raw: raw["finetune"]["rule"][0].update(keep="first"),
     "finetune.rule[0].keep must be one of best, last, got 'first'"),
    (lambda raw: raw["finetune"].update(anchor=10), "unknown key 'finetune.anchor'"),
    (lambda raw: raw["finetune"].update(rank_weighting="ndcg"),
     "finetune.rank_weighting must be one of uniform, throughput, lambda, got 'ndcg'"),
    (lambda raw: raw["train"].update(keep="first"),
     "train.keep must be one of best, last, got 'first'"),
    (lambda raw: raw["calibrate"].update(objective="mse"),
     "calibrate.objective must be one of ece, nll, got 'mse'"),
    (lambda raw: raw["tune"]["calo_search"].update(eps_greedy=2),
     "tune.calo_search.eps_greedy is a share of each round's picks, in [0, 1], got 2"),
])
def test_bad_settings_stop_at_load_naming_the_key(tmp_path, params, capsys, edit, message):
    raw = yaml.safe_load(Path(params.path).read_text())
    edit(raw)
    bad = tmp_path / "params.yaml"
    bad.write_text(yaml.safe_dump(raw))
    code, err = cli(capsys, "records", "--device", TARGET, cwd=tmp_path, params=bad)
    assert code == 2 and message in err, err
    assert err.strip().count("\n") == 0
