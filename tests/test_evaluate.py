"""`calo evaluate`: our model beside TVM's cost models on held-out records of any TVM database."""

import json
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

from calo import paths
from calo.artifact import TrainedModel
from calo.baselines import (
    context_of,
    mlp_on_groups,
    mlp_updated,
    train_on,
    train_on_groups,
    xgb_model,
)
from calo.cli import main
from calo.graphs import graph_set
from calo.records import RECORD_FILE, target_key
from calo.tasks.evaluate import donor_groups
from tests.conftest import DONOR, REPO, TARGET

MODELS = {"calo", "xgb", "xgb_donor"}
KEYS = {"kendall_tau", "top1", "top5", "regret", "ece", "nll"}


def test_evaluate_with_warmup_scores_every_model_on_the_same_held_out_records(
        params, pretrained, tmp_path, capsys):
    out = tmp_path / "report.json"
    code = main(["evaluate", "--model", "donor", "--records", str(paths.records_dir(TARGET)),
                 "--warmup-fraction", "0.5", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert set(report["overall"]) == MODELS
    assert report["warmup_records"] + report["held_out_records"] == 28  # every measured record
    for metrics in report["overall"].values():
        assert KEYS <= set(metrics)
        assert 0 < metrics["top1"] <= metrics["top5"] <= 1.0 and metrics["regret"] >= 0
        assert -1 <= metrics["kendall_tau"] <= 1
    assert report["overall"]["calo"]["ece"] >= 0 and report["overall"]["xgb"]["ece"] is None
    assert set(report["per_workload"]) == {"mm-64", "mm-relu-32x64"}
    top1 = [report["per_workload"][w]["calo"]["top1"] for w in ("mm-64", "mm-relu-32x64")]
    assert report["overall"]["calo"]["top1_se"] == pytest.approx(abs(top1[0] - top1[1]) / 2)
    # TVM's MLPModel holds out a fifth of the workloads to train: two are too few, and it says so
    assert "5 or more workloads" in report["not_run"]["mlp_donor"]
    # the same predictions at temperature 1 beside them: whether the temperature helped
    plain, ours = report["at_temperature_1"], report["overall"]["calo"]
    assert (plain["nll"] == pytest.approx(ours["nll"])) == (report["temperature"] == 1.0)
    table = capsys.readouterr().err
    assert "xgb_donor" in table and "overall" in table
    assert f"at temperature 1: {plain['ece']:.3f} / {plain['nll']:.3f}" in table
    # where the figures came from: a re-run elsewhere can be told apart
    assert report["environment"]["packages"]["torch"] == torch.__version__


@pytest.mark.slow
def test_the_fine_tune_sweep_scores_a_variant_as_calo_evaluate_does(params, pretrained, tmp_path):
    """benchmarks/finetune_sweep.py reuses one extraction for many fine-tunes: a variant with no
    overrides must score what `calo evaluate --choose random` scores (the sweep's warm-up is
    each workload's first random samples), and null must be the donor untouched."""
    variants = tmp_path / "variants.yaml"
    variants.write_text("zero-shot: null\nas shipped: []\n")
    donor, records = str(paths.model_dir(DONOR)), str(paths.records_dir(TARGET))
    sweep_out, report_out = tmp_path / "sweep.json", tmp_path / "report.json"
    run = subprocess.run([sys.executable, "benchmarks/finetune_sweep.py", "--records", records,
                          "--donor-model", donor, "--warmup", "3", "--variants", str(variants),
                          "--out", str(sweep_out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    sweep = json.loads(sweep_out.read_text())["variants"]
    assert main(["evaluate", "--model", donor, "--records", records, "--warmup", "3",
                 "--choose", "random", "--json", str(report_out)]) == 0
    report = json.loads(report_out.read_text())
    calo = report["overall"]["calo"]
    for key in ("kendall_tau", "top1", "top5", "ece", "nll"):
        assert sweep["as shipped"]["all"][key] == pytest.approx(calo[key], abs=0.02), key
    assert sweep["as shipped"]["temperature"] == pytest.approx(report["temperature"])
    assert "finetune_epoch" in sweep["as shipped"] and "finetune_epoch" not in sweep["zero-shot"]
    assert sweep["zero-shot"]["temperature"] == TrainedModel.load(
        paths.model_dir(DONOR)).temperature


@pytest.mark.parametrize("choose", ["first", "uncertainty"])
def test_evaluate_takes_a_warmup_of_n_records_per_workload(params, pretrained, tmp_path, choose):
    out = tmp_path / "report.json"
    assert main(["evaluate", "--model", "donor", "--records", str(paths.records_dir(TARGET)),
                 "--warmup", "3", "--choose", choose, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["warmup_records"] == 3 * 2 and report["held_out_records"] == 28 - 6
    assert report["warmup_per_workload"] == 3 and report["warmup_choice"] == choose
    # ranking per candidate source: the harvest's random samples and its evolved candidates
    assert set(report["by_source"]) == {"random", "evolved"}
    assert set(report["by_source"]["evolved"]) == MODELS
    # ours calibrated on each source's records pooled: the two pools make up the whole, so
    # the whole's mean NLL and RMSE lie between theirs
    ours = [report["by_source"][s]["calo"] for s in ("random", "evolved")]
    for key in ("nll", "rmse"):
        low, high = sorted(o[key] for o in ours)
        assert low - 1e-9 <= report["overall"]["calo"][key] <= high + 1e-9, key
    assert all(0.0 <= o["ece"] <= 1.0 for o in ours)
    assert all(report["by_source"][s][m]["ece"] is None for s in report["by_source"]
               for m in MODELS - {"calo"})


@pytest.mark.parametrize("after", ["temperature", "width", "no-wider"])
def test_a_warm_up_too_small_to_refit_keeps_the_donors_temperature_or_its_width(
        params, pretrained, after):
    """Six warm-up records hold back too few probes for a refit: the fine-tuned model keeps
    the donor's temperature, or the donor's calibrated width carried over its fine-tune, or
    (no-wider) whichever of the two gives the narrower intervals."""
    from calo.models.calibration import carried_temperature
    from calo.models.training import predict
    from calo.records import iter_records
    from calo.tasks.evaluate import fine_tuned

    donor = TrainedModel.load(paths.model_dir(DONOR))
    warm = [r for r in iter_records(paths.records_dir(TARGET)) if r.latency is not None][:6]
    settings = params.override({"calibrate.after_finetune": after})
    graphs = graph_set(donor.graph_kind, warm, stores=settings.finetune.corrects)
    tuned, _ = fine_tuned(donor, settings, graphs, warm)
    scales = [predict(m.net, graphs.graphs).t_scale.numpy() for m in (donor, tuned)]
    assert (scales[0] != scales[1]).any()  # the fine-tune moved them
    carried = carried_temperature(donor.temperature, *scales)
    expected = {"temperature": donor.temperature, "width": carried,
                "no-wider": min(carried, donor.temperature)}[after]
    assert tuned.temperature == pytest.approx(expected)


def test_a_blended_refit_is_the_geometric_mean_of_the_refit_and_the_width_before(
        params, pretrained, monkeypatch):
    """With the refit's floor lowered so the test device's few held-back probes refit: "replace"
    takes the refit, "blend" the geometric mean of the refit and what "off" keeps (the carried
    width). The donor is made far too confident first: whether a refit lowers both NLL and ECE
    of a fair width depends on what this machine measured, of one a thousand times too narrow
    it does not."""
    from calo.models import calibration
    from calo.records import iter_records
    from calo.tasks.evaluate import fine_tuned

    monkeypatch.setattr(calibration, "MIN_GROUP_POINTS", 2)
    donor = TrainedModel.load(paths.model_dir(DONOR))
    donor.temperature *= 1e-3
    warm = [r for r in iter_records(paths.records_dir(TARGET)) if r.latency is not None]
    graphs = graph_set(donor.graph_kind, warm, stores=params.finetune.corrects)
    temperature = {rule: fine_tuned(donor, params.override({"calibrate.warmup_refit": rule,
                                                            "calibrate.warmup_donor_fit": False}),
                                    graphs, warm)[0].temperature
                   for rule in ("off", "replace", "blend")}
    assert temperature["replace"] != pytest.approx(temperature["off"])  # the refit was taken
    assert temperature["blend"] == pytest.approx(
        (temperature["off"] * temperature["replace"]) ** 0.5)


def test_the_donors_refit_on_every_probe_starts_the_fine_tune_where_asked(
        params, pretrained, monkeypatch):
    """calibrate.warmup_donor_fit: the donor's temperature refitted on all warm-up probes (a
    donor made far too confident, so the refit is taken whatever this machine measured), alone
    ("replace") or pooled with the donor's ("blend"); off, or with the refit off, the donor's."""
    from calo.evaluation import checked_temperature, predictive
    from calo.models import calibration
    from calo.records import iter_records
    from calo.tasks.evaluate import donor_on_probes

    monkeypatch.setattr(calibration, "MIN_GROUP_POINTS", 2)
    donor = TrainedModel.load(paths.model_dir(DONOR))
    donor.temperature *= 1e-3
    warm = [r for r in iter_records(paths.records_dir(TARGET)) if r.latency is not None]
    graphs = graph_set(donor.graph_kind, warm)

    def start(fit: bool, refit: str) -> float:
        return donor_on_probes(donor, params.override({"calibrate.warmup_donor_fit": fit,
                                                       "calibrate.warmup_refit": refit}),
                               predictive(donor.net, graphs))

    fitted = checked_temperature(donor.net, graphs, donor.temperature, params.calibrate.levels,
                                 cross=False, objective=params.calibrate.objective)
    assert fitted > 10 * donor.temperature
    assert start(True, "replace") == pytest.approx(fitted)
    assert start(True, "blend") == pytest.approx((fitted * donor.temperature) ** 0.5)
    assert start(False, "blend") == start(True, "off") == donor.temperature


def test_uncertainty_picks_random_samples_in_bands_of_predicted_latency(params, pretrained):
    from calo.artifact import TrainedModel
    from calo.models.training import predict
    from calo.records import iter_records
    from calo.tasks.evaluate import by_workload, choose_by_uncertainty

    trained = TrainedModel.load(paths.model_dir(DONOR))
    recs = [r for r in iter_records(paths.records_dir(TARGET)) if r.latency is not None]
    chosen = choose_by_uncertainty(trained, recs, 2)
    for name, (warm, held) in chosen.items():
        group = by_workload(recs)[name]
        assert len(warm) == 2 and len(warm) + len(held) == len(group)
        assert all(r.source == "random" for r in warm)
        # one from the predicted-fast half of the random samples, one from the slow half
        pool = [r for r in group if r.source == "random"]
        mu = predict(trained.net, graph_set(trained.graph_kind, pool).graphs).gamma.numpy()
        rank = {r.index: int(k) for r, k in zip(pool, mu.argsort().argsort())}
        assert sorted(rank[r.index] < (len(pool) + 1) // 2 for r in warm) == [False, True]


def test_evaluate_reads_a_database_written_by_plain_tune_tir(params, tuned, tmp_path):
    # data/tune/<device>/<workload>/xgb is exactly what ms.tune_tir wrote
    source = paths.tune_dir(TARGET) / "mm-64" / "xgb"
    out = tmp_path / "report.json"
    assert main(["evaluate", "--model", "donor", "--records", str(source),
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["warmup_records"] == 0
    # without warm-up records XGBoost only has the donor's data; the warm-up-only variant is
    # reported as not run, with the reason
    assert set(report["overall"]) == {"calo", "xgb_donor"} and "xgb" in report["not_run"]


def test_the_committed_donor_scores_a_database_tvms_own_tuner_wrote(params, tmp_path):
    # benchmarks/data/foreign-cpu-host: ms.tune_tir's two files for programs no pool holds,
    # so each record's device is read from its target alone (the donor's device-schedule graphs)
    from harvest_pools import unpack

    store = unpack(REPO / "benchmarks" / "data" / "foreign-cpu-host.tar.gz", tmp_path)
    donor = REPO / "benchmarks" / "data" / "donor-unseen-shape"
    out = tmp_path / "report.json"
    assert main(["evaluate", "--model", str(donor), "--records", str(store), "--warmup", "8",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["warmup_per_workload"] == 8 and report["warmup_records"] == 24
    assert report["held_out_records"] == 171 - 24 and report["by_source"] == {}
    assert len(report["per_workload"]) == 3 and {"calo", "xgb"} <= set(report["overall"])
    assert "5 or more workloads" in report["not_run"]["mlp"]
    # 24 probes in parts of 8 are too few to refit: the donor's own temperature is served
    assert report["temperature"] == TrainedModel.load(donor).temperature
    # each workload ranked: a NaN (no order in its predictions) fails this
    assert all(-1 <= w["calo"]["kendall_tau"] <= 1 for w in report["per_workload"].values())


def test_a_plain_tvm_database_claims_no_sources_and_donor_models_need_donor_records(
        params, pretrained, tmp_path):
    from calo.records import WORKLOAD_FILE, iter_records
    from calo.tasks.evaluate import choose_by_uncertainty, split_warmup

    plain, empty = tmp_path / "plain", tmp_path / "empty"
    for folder in (plain, empty):
        folder.mkdir()
    for name in (WORKLOAD_FILE, RECORD_FILE):  # TVM's two files, none of our side files
        shutil.copy(paths.records_dir(TARGET) / name, plain / name)
        (empty / name).write_text("")
    recs = [r for r in iter_records(plain) if r.latency is not None]
    assert {r.source for r in recs} == {"unknown"}
    # nothing says which were random samples: a random-first warm-up is the first measured
    for warm, held in split_warmup(recs, count=3, random_first=True).values():
        assert [r.index for r in warm] == sorted(r.index for r in warm + held)[:3]
    # and the model chooses among all of them
    trained = TrainedModel.load(paths.model_dir(DONOR))
    for warm, held in choose_by_uncertainty(trained, recs, 2).values():
        assert len(warm) == 2 and len(held) >= 2

    def report(*donor: str) -> dict:
        out = tmp_path / "report.json"
        assert main(["evaluate", "--model", "donor", "--records", str(plain), "--warmup", "3",
                     "--choose", "random", "--donor-records", *donor, "--json", str(out)]) == 0
        return json.loads(out.read_text())

    without = report(str(empty))
    assert without["by_source"] == {} and without["donor_records"] == 0
    # trained on the warm-up alone they would be xgb and mlp again, under the donor's name
    assert "xgb_donor" not in without["overall"]
    assert f"no donor records in {empty}" in without["not_run"]["xgb_donor"]
    assert "no donor records" in without["not_run"]["mlp_donor"]
    donor = report(str(paths.records_dir(DONOR)))
    assert donor["donor_records"] > 0 and "xgb_donor" in donor["overall"]


def test_a_database_of_two_devices_ranks_each_devices_records_apart(params, pretrained,
                                                                     tmp_path):
    from tvm.s_tir import meta_schedule as ms

    from calo.records import describe_target, iter_records
    from calo.tasks.evaluate import evaluate_records

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    db = ms.database.JSONDatabase(work_dir=str(mixed))  # as TVM writes one tuned on two CPUs
    groups: dict[tuple[str, str], int] = {}
    for device in (DONOR, TARGET):
        for rec in iter_records(paths.records_dir(device)):
            r = rec.record
            db.commit_tuning_record(ms.database.TuningRecord(
                r.trace, db.commit_workload(r.workload.mod), r.run_secs, r.target, r.args_info))
            if rec.latency is not None:
                key = (describe_target(target_key(r.target)), rec.workload_key)
                groups[key] = groups.get(key, 0) + 1
    report = evaluate_records(params, str(paths.model_dir(DONOR)), str(mixed),
                              warmup_records=2, baselines=False)
    # each device's records of a workload are a workload of their own, named for the device
    assert len(report["per_workload"]) == len(groups) == 4
    assert {name.split(" @ ")[1] for name in report["per_workload"]} == {t for t, _ in groups}
    assert report["warmup_records"] == 2 * len(groups)
    assert report["warmup_records"] + report["held_out_records"] == sum(groups.values())


@pytest.mark.parametrize("args, message", [
    (["--records", "nowhere"], "nowhere is not a TVM JSON database"),
    (["--warmup-fraction", "1.5"], "--warmup-fraction must be in [0, 1)"),
    (["--model", "no-such-alias"], "no 'calo-gnn' model with alias 'no-such-alias'"),
])
def test_evaluate_bad_input_is_one_line(params, pretrained, capsys, args, message):
    given = {"--model": "donor", "--records": str(paths.records_dir(TARGET)),
             **dict(zip(args[::2], args[1::2]))}
    assert main(["evaluate"] + [x for kv in given.items() for x in kv]) == 2
    assert message in capsys.readouterr().err


def test_a_fine_tune_tells_a_new_device_from_the_donors_own(params, pretrained):
    """The donor remembers the targets it was trained on; a warm-up of another target takes
    the new-device rule, one of its own the same-device rule, and the result knows both."""
    from calo.records import store_targets
    from calo.tasks.evaluate import evaluate_records

    donor = TrainedModel.load(paths.model_dir(DONOR))
    own = store_targets(paths.records_dir(DONOR))
    assert own and set(donor.info["targets"]) == own
    assert not donor.trained_on(store_targets(paths.records_dir(TARGET)))
    model = str(paths.model_dir(DONOR))
    for device, same in ((TARGET, False), (DONOR, True)):
        report = evaluate_records(params, model, str(paths.records_dir(device)),
                                  warmup_records=3, baselines=False)
        assert report["same_device"] is same, device


def test_tvms_donor_models_keep_a_workloads_records_of_two_devices_apart(params, harvested):
    # XGBModel normalizes throughput within a group: one device's records must not rank
    # against another's, even of the same workload.
    stores = [paths.records_dir(DONOR), paths.records_dir(TARGET)]
    alone = [donor_groups([store]) for store in stores]
    shared = ({g[0].workload_key for g in alone[0]} & {g[0].workload_key for g in alone[1]})
    assert shared  # the same workload measured on both devices
    groups = donor_groups(stores)
    assert len(groups) == len(alone[0]) + len(alone[1])
    for group in groups:
        assert len({target_key(r.record.target) for r in group}) == 1
        assert len({r.workload_key for r in group}) == 1
    assert sum(map(len, groups)) == sum(len(g) for a in alone for g in a)


def test_tvms_xgboost_trains_on_every_group_it_is_given(params, harvested):
    # Fed one update per workload, XGBModel skips retraining while its data grew by less than
    # a fifth: a few warm-up records fed after a donor's would never reach the booster.
    groups = donor_groups([paths.records_dir(DONOR), paths.records_dir(TARGET)])
    groups = groups[:-1] + [groups[-1][:1]]  # the last: one warm-up record
    total = sum(map(len, groups))
    fed = xgb_model(1)
    for group in groups:
        train_on(fed, context_of(group[0]), group)
    assert fed.data_size == total and fed.last_train_size < total  # the trap
    trained = train_on_groups(xgb_model(1), groups)
    assert trained.data_size == trained.last_train_size == total
    # a workload's records on two devices stay two groups, each normalized by its own best
    assert len(trained.data) == len(groups)


def test_tvms_mlp_pre_trained_on_a_donor_is_updated_on_a_copy(params, harvested, tmp_path,
                                                               monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    groups = donor_groups([paths.records_dir(DONOR), paths.records_dir(TARGET)])
    # MLPModel holds out a fifth of its groups: cut the fixture's few workloads into more
    groups = [g[i:i + 4] for g in groups for i in range(0, len(g), 4)]
    donor, warm = groups[:-1], groups[-1:]
    assert len(donor) >= 5
    pretrained = mlp_on_groups(donor, seed=0)
    before = {k: v.clone() for k, v in pretrained.trainer.state.model.state_dict().items()}
    updated = mlp_updated(pretrained, warm, seed=0)
    assert updated.trainer.state.data_size == sum(map(len, groups))
    assert pretrained.trainer.state.data_size == sum(map(len, donor))
    after = pretrained.trainer.state.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert any(not torch.equal(before[k], v)
               for k, v in updated.trainer.state.model.state_dict().items())
    # MLPModel's copy of its best weights went with the directory it was put in
    assert list(scratch.iterdir()) == [] and tempfile.tempdir == str(scratch)


def test_a_donor_store_is_parsed_once_until_it_changes(params, harvested, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(paths.records_dir(TARGET), store)
    first = donor_groups([store])
    again = donor_groups([store])
    one = first[0][0]
    assert again[0][0] is one   # not parsed again
    records = store / RECORD_FILE
    with records.open("a") as f:
        f.write(records.read_text().splitlines(keepends=True)[one.index])
    grown = donor_groups([store])
    assert sum(map(len, grown)) == sum(map(len, first)) + 1


def test_a_records_graph_is_extracted_once_per_state_of_its_store(params, harvested, tmp_path):
    from calo.tasks.evaluate import _measured, store_graphs

    store = tmp_path / "store"
    shutil.copytree(paths.records_dir(TARGET), store)
    recs = _measured(store)
    first = store_graphs(store, "schedule", False)(recs[:4])
    ticks = []
    again = store_graphs(store, "schedule", False)(recs[2:6], lambda: ticks.append(1))
    assert again.graphs[0] is first.graphs[2] and again.graphs[1] is first.graphs[3]
    assert again.record == [r.index for r in recs[2:6]] and len(ticks) == 4
    assert store_graphs(store, "ast", False)(recs[:1]).graphs[0] is not first.graphs[0]
    records = store / RECORD_FILE
    with records.open("a") as f:  # a new record: the store's graphs are extracted afresh
        f.write(records.read_text().splitlines(keepends=True)[recs[0].index])
    grown = store_graphs(store, "schedule", False)(_measured(store)[:1])
    assert grown.graphs[0] is not first.graphs[0]
    assert torch.equal(grown.graphs[0].x, first.graphs[0].x)


def test_the_table_keeps_its_columns_when_a_workload_name_is_long():
    from calo.tasks.evaluate import format_table

    cells = {"kendall_tau": 0.5, "top1": 1.0}
    report = {"model": "donor", "records": "pool", "held_out_records": 3, "warmup_records": 0,
              "warmup_per_workload": 0, "warmup_choice": "first", "not_run": {},
              "per_workload": {"batch-matmul@6x96x160x96": {"calo": cells, "xgb_donor": cells},
                               "mm": {"calo": cells}},
              "overall": {"calo": cells}, "by_source": {}}
    head, *rows = format_table(report).splitlines()[1:]
    assert [row.split()[:2] for row in rows] == [
        ["batch-matmul@6x96x160x96", "calo"], ["batch-matmul@6x96x160x96", "xgb_donor"],
        ["mm", "calo"], ["overall", "calo"]]
    for row in rows:  # each model name and each figure sits under its heading
        assert row.index(row.split()[1]) == head.index("model")
        assert row.index("0.500") + len("0.500") == head.index("kendall_tau") + len("kendall_tau")


def test_a_random_first_warmup_takes_each_workloads_first_random_samples():
    from types import SimpleNamespace

    from calo.tasks.evaluate import split_warmup

    # measurement order as a pool that interleaves its two sources
    recs = [SimpleNamespace(workload_name=w, source=s, index=i)
            for i, (w, s) in enumerate([("a", "evolved"), ("a", "random"), ("b", "random"),
                                        ("a", "evolved"), ("a", "random"), ("b", "evolved"),
                                        ("a", "random"), ("b", "random")])]
    first = split_warmup(recs, count=2)
    assert [r.index for r in first["a"][0]] == [0, 1]
    split = split_warmup(recs, count=2, random_first=True)
    assert [r.index for r in split["a"][0]] == [1, 4]
    assert sorted(r.index for r in split["a"][1]) == [0, 3, 6]
    assert [r.index for r in split["b"][0]] == [2, 7] and [r.index for r in split["b"][1]] == [5]


def test_the_tables_first_line_says_how_the_warmup_was_chosen():
    from calo.tasks.evaluate import format_table

    report = {"model": "donor", "records": "pool", "held_out_records": 3, "warmup_records": 2,
              "warmup_per_workload": None, "warmup_fraction": 0.3, "warmup_choice": "random",
              "not_run": {}, "per_workload": {}, "overall": {}, "by_source": {}}
    assert format_table(report).splitlines()[0].endswith("(fraction 0.3, random)")
    assert format_table({**report, "warmup_choice": "first"}).splitlines()[0].endswith(
        "(fraction 0.3)")


def test_zero_shot_reports_the_weight_of_the_donors_own_trees(params, pretrained, tmp_path):
    out = tmp_path / "report.json"
    assert main(["evaluate", "--model", "donor", "--records", str(paths.records_dir(TARGET)),
                 "--warmup", "0", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["warmup_records"] == 0 and report["finetune_s"] == 0.0
    # the shipped rule's first row has the donor's trees order zero-shot candidates
    assert params.finetune.step_for(0).donor_records
    assert report["correction_blend"] == params.finetune.step_for(0).blend > 0
