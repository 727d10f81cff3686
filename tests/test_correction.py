import copy
import json

import numpy as np
import pytest
import torch

from calo import paths
from calo.artifact import CONFIG, CORRECTION, DONOR_ROWS, TrainedModel
from calo.correction import (
    Corrector,
    donor_trees,
    member_keys,
    relative_columns,
    store_devices,
    store_rows,
    summarize,
    summary_width,
    tree_rows,
)
from calo.costmodel import ONLINE_STATE, CaloCostModel
from calo.dataset import collate, load_graphs
from calo.errors import CaloError
from calo.evaluation import mean_ranking, predictive, ranking_scores
from calo.tasks.extract import extract
from calo.tasks.finetune import adapt
from tests.conftest import DONOR, TARGET, search_batch

RULE = [{"up_to": None, "layers": "head", "epochs": 1, "lr": 1.0e-3, "correction": 30}]


def adapted_with(params, tmp_path, monkeypatch, rule: list[dict]):
    """The donor adapted to the target's records with `rule`'s correction, in tmp_path."""
    donor = TrainedModel.load(paths.model_dir(DONOR).resolve())
    settings = params.override({"finetune.rule": rule})
    assert settings.extracts_stores(TARGET) and not params.graph.stores
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "records").symlink_to(paths.records_dir(TARGET).resolve().parent)
    monkeypatch.chdir(tmp_path)
    extract(settings, TARGET)
    graphs = load_graphs(paths.graphs_path(TARGET), "schedule")
    adapted = copy.deepcopy(donor)
    adapt(adapted, settings.finetune, settings.train, graphs, graphs, set())
    return settings, adapted, graphs


def donor_with_tree_rows(params, tmp_path, monkeypatch, blend: float):
    """The donor, a rule row whose trees learn from the donor's records at `blend`, the
    target's graphs (adapted with that row's trees of the warm-up alone) and their tree rows."""
    donor = TrainedModel.load(paths.model_dir(DONOR).resolve())
    row = {**RULE[0], "correction": 30, "blend": blend, "donor_records": True}
    _, _, graphs = adapted_with(params, tmp_path, monkeypatch, [{**row, "donor_records": False}])
    return donor, row, graphs, tree_rows(graphs.graphs, graphs.workload)


@pytest.fixture
def corrected(params, pretrained, tmp_path, monkeypatch):
    return adapted_with(params, tmp_path, monkeypatch, RULE)


def test_the_correction_fits_the_residuals_and_round_trips(corrected, tmp_path):
    settings, adapted, graphs = corrected
    assert adapted.correction is not None and adapted.needs_stores
    y, plain, _, _ = predictive(adapted.net, graphs)
    _, shifted, _, _ = predictive(adapted.net, graphs, correction=adapted.correction)
    # Fitted to these residuals, it must explain part of them.
    assert np.mean((y - shifted) ** 2) < 0.9 * np.mean((y - plain) ** 2)
    loaded = TrainedModel.load(adapted.save(tmp_path / "model"))
    blob = json.loads((tmp_path / "model" / CONFIG).read_text())
    assert blob["correction"] == {
        "blend": 0.0, "best": {}, "general": False, "device_columns": False, "relative": "none",
        "row_weight": "none",
        "members": member_keys(settings.finetune.correction, ["summary"])}
    assert np.allclose(predictive(loaded.net, graphs, correction=loaded.correction)[1], shifted)
    # Models saved before the throughput blend held one fit and said only that they had a
    # correction.
    one = copy.deepcopy(adapted)
    one.correction.members = {"summary": adapted.correction.members["summary"]}
    one.save(tmp_path / "older")
    (tmp_path / "older" / CONFIG).write_text(json.dumps({**blob, "correction": True}))
    older = TrainedModel.load(tmp_path / "older")
    assert np.allclose(predictive(older.net, graphs, correction=older.correction)[1],
                       predictive(one.net, graphs, correction=one.correction)[1])
    adapted.correction = None  # a model without one leaves no stale file behind
    assert TrainedModel.load(adapted.save(tmp_path / "model")).correction is None
    assert not (tmp_path / "model" / CORRECTION).exists()


def test_a_damaged_correction_is_refused_in_one_line(corrected, tmp_path):
    _, adapted, _ = corrected
    adapted.save(tmp_path / "model")
    (tmp_path / "model" / CORRECTION).write_text("{not json")
    with pytest.raises(CaloError, match=f"{CORRECTION} does not hold this model's correction"):
        TrainedModel.load(tmp_path / "model")


def test_the_search_scores_with_the_correction_and_refits_it_on_its_measurements(corrected):
    settings, adapted, _ = corrected
    context, cands, results, _ = search_batch(TARGET, 8)
    model = CaloCostModel.from_settings(adapted, settings, constant_kappa=0.0,  # mean only
                                        trees=True)
    graphs = model.featurize(context, cands, stores=True)
    with torch.no_grad():
        plain = model.model.to_log_latency(model.model(*collate(graphs))).gamma.numpy()
    plain_search = CaloCostModel.from_settings(copy.deepcopy(adapted), settings,
                                               constant_kappa=0.0)  # own weights: not updated
    mu = adapted.correction.adjust(plain, [g.stores for g in graphs],
                                   [str(context.task_name)] * len(graphs))
    assert np.allclose(np.argsort(-model.predict(context, cands)), np.argsort(mu))
    # With 3 drafts, the correction re-orders the network's 3 best, which stay ahead of the
    # rest; the rest keep the network's order.
    drafts = CaloCostModel.from_settings(adapted, settings, constant_kappa=0.0, correct_top=3,
                                         trees=True)
    order = np.argsort(-drafts.predict(context, cands), kind="stable")
    top = np.argsort(plain, kind="stable")[:3]
    assert set(order[:3]) == set(top)
    assert list(order[:3]) == list(top[np.argsort(mu[top], kind="stable")])
    assert list(order[3:]) == [i for i in np.argsort(plain, kind="stable") if i not in top]
    # The drafts' rows are kept per program: asked again (twice over), nothing is re-extracted.
    assert len(drafts.store_rows_of) == 3
    again = drafts.store_rows(context, cands + cands)
    assert len(drafts.store_rows_of) == len(cands)
    n = len(cands)
    assert all(a is b for a, b in zip(again[:n], again[n:]))
    assert all(np.array_equal(a, g.stores) for a, g in zip(again, graphs))
    fitted = adapted.correction
    model.update(context, cands, results)
    assert model.trained.correction is not fitted  # the rule's row asks for one: refitted
    assert all(g.store_rows is not None for g in model.measured)
    assert np.isfinite(model.predict(context, cands)).all()
    # As params.yaml ships it (tune.trees off) a search scores with the network alone and
    # neither extracts store rows nor refits the trees.
    assert not settings.tune.trees
    assert np.array_equal(np.argsort(-plain_search.predict(context, cands), kind="stable"),
                          np.argsort(plain, kind="stable"))
    kept = plain_search.trained.correction
    plain_search.update(context, cands, results)
    assert plain_search.trained.correction is kept
    assert not plain_search.store_rows_of


def test_negative_correction_rounds_are_refused(params):
    with pytest.raises(CaloError, match="correction is a number of boosting rounds"):
        params.override({"finetune.rule": [{**RULE[0], "correction": -1}]})


def test_evaluate_fits_the_correction_its_rule_names_and_scores_with_it(params, pretrained):
    from calo.tasks.evaluate import evaluate_records

    donor = str(paths.model_dir(DONOR).resolve())
    report = evaluate_records(params.override({"finetune.rule": RULE}), donor,
                              str(paths.records_dir(TARGET)), warmup_records=5,
                              baselines=False)
    plain = evaluate_records(params.override({"finetune.rule": [{**RULE[0], "correction": 0}]}),
                             donor, str(paths.records_dir(TARGET)), warmup_records=5,
                             baselines=False)
    assert report["correction_rounds"] == 30 and plain["correction_rounds"] == 0
    assert report["held_out_records"] == plain["held_out_records"]
    # Same network (one epoch, same seed): only the correction moves the predicted means.
    assert report["overall"]["calo"]["rmse"] != plain["overall"]["calo"]["rmse"]


def test_the_throughput_blend_orders_its_workloads_and_leaves_others_to_the_network(
        params, pretrained, tmp_path, monkeypatch):
    blend = 0.5
    _, adapted, graphs = adapted_with(params, tmp_path, monkeypatch,
                                      [{**RULE[0], "correction": 100, "blend": blend}])
    fitted = adapted.correction
    assert fitted.blend == blend and set(fitted.best) == set(graphs.workload)
    y, plain, _, _ = predictive(adapted.net, graphs)
    # The mean and its calibration stay the head's; the blend orders the candidates.
    assert np.array_equal(predictive(adapted.net, graphs, correction=fitted)[1], plain)
    mixed = ranking_scores(plain, graphs, fitted)
    # Trees fitted to these records' throughput order them better than the network alone.
    assert (mean_ranking(y, mixed, graphs.workload)["kendall_tau"]
            > mean_ranking(y, plain, graphs.workload)["kendall_tau"])
    # Each workload's best measured latency anchors the trees' log latency: a blended mean
    # lies between the network's and the trees', whose best is the workload's best or slower.
    best = np.array([fitted.best[w] for w in graphs.workload])
    trees = (mixed - (1 - blend) * plain) / blend
    assert np.allclose(best, [y[[i for i, v in enumerate(graphs.workload) if v == w]].min()
                              for w in graphs.workload])
    assert (trees >= best - 0.05).all()
    rows = [g.store_rows for g in graphs.graphs]
    assert np.array_equal(fitted.adjust(plain, rows, ["unmeasured"] * len(rows)), plain)
    loaded = TrainedModel.load(adapted.save(tmp_path / "model"))
    assert json.loads((tmp_path / "model" / CONFIG).read_text())["correction"]["blend"] == blend
    assert np.allclose(ranking_scores(plain, graphs, loaded.correction), mixed)


def test_an_ensemble_of_tree_kinds_averages_them_and_round_trips(
        params, pretrained, tmp_path, monkeypatch):
    kinds = ["summary", "packed", "tvm"]
    settings, adapted, graphs = adapted_with(
        params.override({"finetune.correction.members": kinds, "finetune.correction.seeds": 1}),
        tmp_path, monkeypatch,
        [{**RULE[0], "correction": 30, "blend": 1.0}])
    fitted = adapted.correction
    assert list(fitted.members) == kinds
    y, plain, _, _ = predictive(adapted.net, graphs)
    rows = [g.store_rows for g in graphs.graphs]
    # Each member orders these records' throughput on its own; the ensemble is their mean.
    alone = {kind: Corrector({kind: booster}, 1.0, fitted.best)
             for kind, booster in fitted.members.items()}
    for member in alone.values():
        tau = mean_ranking(y, ranking_scores(plain, graphs, member), graphs.workload)
        assert tau["kendall_tau"] > 0.2
    assert np.allclose(fitted.predict(rows), np.mean([m.predict(rows) for m in alone.values()], 0))
    # The packed kinds score a program by its rows' sum: one row more changes its score.
    assert not np.allclose(alone["packed"].predict([rows[0]]),
                           alone["packed"].predict([np.concatenate([rows[0], rows[0][:1]])]))
    loaded = TrainedModel.load(adapted.save(tmp_path / "model"))
    assert json.loads((tmp_path / "model" / CONFIG).read_text())["correction"]["members"] == kinds
    assert np.allclose(loaded.correction.predict(rows), fitted.predict(rows))
    with pytest.raises(CaloError, match="one or more members"):
        settings.override({"finetune.correction.members": []})
    with pytest.raises(CaloError, match="must be one of"):
        settings.override({"finetune.correction.members": ["forest"]})


def test_sampling_kinds_are_fitted_once_per_seed_and_averaged(
        params, pretrained, tmp_path, monkeypatch):
    settings, adapted, graphs = adapted_with(
        params.override({"finetune.correction.members": ["summary", "tvm"],
                         "finetune.correction.seeds": 3}), tmp_path, monkeypatch,
        [{**RULE[0], "correction": 30, "blend": 1.0}])
    fitted = adapted.correction
    # TVM's kind samples nothing, so its other seeds would be the same trees.
    assert list(fitted.members) == ["summary", "summary#1", "summary#2", "tvm"]
    rows = [g.store_rows for g in graphs.graphs]
    alone = [Corrector({key: b}, 1.0, fitted.best).predict(rows)
             for key, b in fitted.members.items()]
    assert not np.allclose(alone[0], alone[1])  # other seeds sample other records
    assert np.allclose(fitted.predict(rows), np.mean(alone, 0))
    # The first seed's fit is the one a single seed makes.
    single = Corrector.fit(settings.finetune.correction, 30, rows, np.ones(len(rows)),
                           members=["summary"])
    once = params.override({"finetune.correction.seeds": 1}).finetune.correction
    again = Corrector.fit(once, 30, rows, np.ones(len(rows)), members=["summary"])
    assert list(again.members) == ["summary"]
    assert np.allclose(single.members["summary"].predict(_summary_matrix(rows)),
                       again.members["summary"].predict(_summary_matrix(rows)))
    loaded = TrainedModel.load(adapted.save(tmp_path / "model"))
    assert np.allclose(loaded.correction.predict(rows), fitted.predict(rows))
    with pytest.raises(CaloError, match="seeds >= 1"):
        settings.override({"finetune.correction.seeds": 0})


def _summary_matrix(rows):
    import xgboost

    return xgboost.DMatrix(summarize(rows))


def test_a_blend_outside_0_1_or_without_rounds_is_refused(params):
    for row in ({**RULE[0], "blend": 1.5}, {**RULE[0], "correction": 0, "blend": 0.5}):
        with pytest.raises(CaloError, match="blend is the throughput trees' weight"):
            params.override({"finetune.rule": [row]})


def test_the_throughput_trees_also_learn_from_the_held_back_records(
        params, pretrained, tmp_path, monkeypatch):
    rule = [{**RULE[0], "correction": 20, "blend": 0.25}]
    donor = TrainedModel.load(paths.model_dir(DONOR).resolve())
    settings, _, graphs = adapted_with(params, tmp_path, monkeypatch, rule)
    y = graphs.labels().double().numpy()
    # Hold back each workload's fastest record: only the trees can know it.
    fastest = {w: min(np.flatnonzero(np.asarray(graphs.workload) == w), key=lambda i: y[i])
               for w in set(graphs.workload)}
    held = [i in fastest.values() for i in range(len(graphs))]
    fit_set, val = graphs.select([not h for h in held]), graphs.select(held)
    tuned = copy.deepcopy(donor)
    adapt(tuned, settings.finetune, settings.train, fit_set, val, set())
    assert tuned.correction.best == pytest.approx({w: y[i] for w, i in fastest.items()})


def test_trees_that_learn_from_the_donors_records_too(params, pretrained, tmp_path, monkeypatch):
    row = {**RULE[0], "correction": 30, "blend": 1.0, "donor_records": True}
    settings = params.override({"finetune.rule": [row]})
    assert settings.finetune.keeps_donor_rows and settings.extracts_stores(settings.donor)
    donor = TrainedModel.load(paths.model_dir(DONOR).resolve())
    # pretrain keeps the donor's rows, and its own trees of them, exactly when the shipped
    # rule's trees learn from them
    assert (donor.donor_rows is not None) == params.finetune.keeps_donor_rows
    assert (donor.correction is not None) == params.finetune.keeps_donor_rows
    donor.donor_rows = None  # as pretrained under a rule without them
    _, own, graphs = adapted_with(params, tmp_path, monkeypatch, [{**row, "donor_records": False}])
    with pytest.raises(CaloError, match="re-run `calo pretrain`"):
        adapt(copy.deepcopy(donor), settings.finetune, settings.train, graphs, graphs, set())
    rows, throughput, workload = tree_rows(graphs.graphs, graphs.workload)
    assert rows.dtype == np.float32 and len(rows) == len(graphs) and throughput.max() == 1.0
    # each record's workload, an index in the order they first appear
    names = list(dict.fromkeys(graphs.workload))
    assert [names[i] for i in workload] == list(graphs.workload)
    # A donor whose records order these programs the other way, twenty of them to each of
    # the device's: trees that learn from both order as the donor does.
    donor.donor_rows = (np.repeat(rows, 20, 0), np.repeat(1 - throughput, 20),
                        np.repeat(workload, 20))
    tuned = copy.deepcopy(donor)
    adapt(tuned, settings.finetune, settings.train, graphs, graphs, set())
    # beside a warm-up the trees read the donor's rows without their devices
    assert tuned.correction.general and not tuned.correction.device_columns
    y, plain, _, _ = predictive(donor.net, graphs)
    tau = {name: mean_ranking(y, ranking_scores(plain, graphs, model.correction),
                              graphs.workload)["kendall_tau"]
           for name, model in (("own", own), ("with donor", tuned))}
    assert tau["own"] > 0 > tau["with donor"]
    # Zero-shot, the donor's own trees of its records order workloads it never measured
    # (trees of a warm-up alone leave those to the network: the throughput blend's test).
    donor.correction = donor_trees(settings.finetune, donor.donor_rows)
    assert donor.correction.general and not donor.correction.best
    zero_shot = ranking_scores(plain, graphs, donor.correction)
    assert mean_ranking(y, zero_shot, graphs.workload)["kendall_tau"] < 0
    # A search with the trees on orders a task it has not measured with them too, as above.
    context, cands, _, _ = search_batch(TARGET, 8)
    search = CaloCostModel.from_settings(donor, settings, constant_kappa=0.0, trees=True,
                                         correct_top=0)
    scores = search.predict(context, cands)
    drafts = search.featurize(context, cands, stores=True)
    with torch.no_grad():
        mean = search.model.to_log_latency(search.model(*collate(drafts))).gamma.double().numpy()
    # the search's graphs carry its target's device, as the trees read it
    devices = np.array([[g.device.cores, g.device.vector_bytes] for g in drafts])
    assert np.array_equal(devices, np.repeat(store_devices(graphs.graphs)[:1], len(cands), 0))
    expected = donor.correction.adjust(mean, [g.stores for g in drafts], ["task"] * len(cands),
                                       devices)
    assert np.allclose(np.log(scores), expected.min() - expected)
    assert not np.allclose(expected, mean)
    assert donor_trees(params.override({"finetune.rule": [{**row, "donor_records": False}]}
                                       ).finetune, donor.donor_rows) is None
    loaded = TrainedModel.load(donor.save(tmp_path / "donor"))
    assert loaded.correction.general
    assert np.allclose(ranking_scores(plain, graphs, loaded.correction), zero_shot)
    assert json.loads((tmp_path / "donor" / CONFIG).read_text())["donor_rows"] == 20 * len(rows)
    assert all(np.array_equal(a, b) for a, b in zip(loaded.donor_rows, donor.donor_rows))
    (tmp_path / "donor" / DONOR_ROWS).write_bytes(b"not an archive")
    with pytest.raises(CaloError, match="does not hold this model's donor records"):
        TrainedModel.load(tmp_path / "donor")
    donor.donor_rows = None  # a model without them leaves no stale file behind
    assert TrainedModel.load(donor.save(tmp_path / "donor")).donor_rows is None
    assert not (tmp_path / "donor" / DONOR_ROWS).exists()
    with pytest.raises(CaloError, match="donor_records is for the throughput trees"):
        params.override({"finetune.rule": [{**row, "blend": 0.0}]})


def test_the_donors_trees_keep_each_devices_order_apart(params, pretrained, tmp_path, monkeypatch):
    # Trees that learn from the donor's records learn from several devices at once: each
    # program's device sits beside its rows, so one device's order does not drown another's.
    row = {**RULE[0], "correction": 30, "blend": 1.0, "donor_records": True}
    settings = params.override({"finetune.rule": [row]})
    _, adapted, graphs = adapted_with(params, tmp_path, monkeypatch,
                                      [{**row, "donor_records": False}])
    rows, throughput, workload = tree_rows(graphs.graphs, graphs.workload)
    here = store_devices(graphs.graphs)
    assert here.shape == (len(graphs), 2) and (here[:, 0] >= 1).all()
    assert np.array_equal(rows[:, -2:], here)
    # Another device (twice the cores, wider vectors) that orders the same programs the other
    # way, twenty of its records to each of this one's.
    there = here * 2 + 16
    other = np.concatenate([rows[:, :-2], there], 1)
    trees = donor_trees(settings.finetune, (np.concatenate([rows, np.repeat(other, 20, 0)]),
                                            np.concatenate([throughput,
                                                            np.repeat(1 - throughput, 20)]),
                                            np.concatenate([workload, np.repeat(
                                                workload + workload.max() + 1, 20)])))
    assert trees.device_columns
    y = graphs.labels().double().numpy()
    plain = predictive(adapted.net, graphs)[1]
    tau_here = mean_ranking(y, ranking_scores(plain, graphs, trees), graphs.workload)
    tau_there = mean_ranking(y, trees.log_latency(store_rows(graphs.graphs), graphs.workload,
                                                  there), graphs.workload)
    assert tau_here["kendall_tau"] > 0 > tau_there["kendall_tau"]
    with pytest.raises(ValueError, match="device beside its store rows"):
        trees.predict(store_rows(graphs.graphs))
    # A donor's records kept before they carried their devices are named, not misread.
    with pytest.raises(CaloError, match="re-run `calo pretrain`"):
        donor_trees(settings.finetune, (rows[:, :-2], throughput, workload))
    loaded = Corrector.load(_saved(trees, tmp_path), trees.describe())
    assert loaded.device_columns
    assert np.allclose(loaded.log_latency(store_rows(graphs.graphs), graphs.workload, there),
                       trees.log_latency(store_rows(graphs.graphs), graphs.workload, there))


def _saved(trees: Corrector, tmp_path) -> object:
    path = tmp_path / "trees.json"
    trees.save(path)
    return path


def test_a_search_state_saved_before_graphs_kept_their_device_goes_on(corrected, tmp_path):
    settings, adapted, _ = corrected
    context, cands, results, _ = search_batch(TARGET, 8)
    model = CaloCostModel.from_settings(adapted, settings, constant_kappa=0.0, trees=True)
    model.update(context, cands[:4], results[:4])
    model.save(str(tmp_path / "saved"))
    state = torch.load(tmp_path / "saved" / ONLINE_STATE, weights_only=True)
    assert all("store_device" in g for g in state["measured"])
    for g in state["measured"]:
        del g["store_device"]
    torch.save(state, tmp_path / "saved" / ONLINE_STATE)
    older = CaloCostModel.from_settings(copy.deepcopy(adapted), settings, constant_kappa=0.0,
                                        trees=True)
    older.load(str(tmp_path / "saved"))
    older.update(context, cands[4:], results[4:])   # batches the older records with new ones
    assert len(older.measured) == len(cands) and older.round == 2
    # the older records were this search's: its target's device
    assert np.array_equal(store_devices(older.measured),
                          np.repeat(store_devices(model.measured)[:1], len(cands), 0))
    assert np.isfinite(older.predict(context, cands)).all()


def test_relative_columns_read_each_row_against_its_workloads_candidates():
    from scipy.stats import rankdata

    width = summary_width(devices=False)
    rows = np.random.default_rng(0).integers(0, 4, (9, width + 2)).astype(np.float32)  # ties
    workloads = ["a"] * 5 + ["b"] * 4
    median = relative_columns(rows, workloads, "median")
    ranked = relative_columns(rows, workloads, "rank")
    for part in (slice(0, 5), slice(5, 9)):
        own = rows[part, :width]
        assert np.allclose(median[part, :width], own - np.median(own, 0))
        assert np.allclose(ranked[part, :width], (rankdata(own, axis=0) - 0.5) / len(own))
    for out in (median, ranked):   # the device's columns as they were
        assert np.array_equal(out[:, width:], rows[:, width:])
    # against given candidates: another set of the workload's
    against = relative_columns(rows[:5], workloads[:5], "rank", {"a": rows[5:]})
    below = (rows[5:, None, :width] < rows[None, :5, :width]).sum(0)
    equal = (rows[5:, None, :width] == rows[None, :5, :width]).sum(0)
    assert np.allclose(against[:, :width], (below + equal / 2) / 4)


def test_the_donors_trees_can_read_rows_against_their_workloads(params, pretrained, tmp_path,
                                                                  monkeypatch):
    import xgboost

    donor, row, graphs, (rows, throughput, workload) = donor_with_tree_rows(
        params, tmp_path, monkeypatch, blend=1.0)
    fitted = {}
    for how in ("none", "median", "rank"):
        settings = params.override({"finetune.rule": [row], "finetune.correction.relative": how})
        fitted[how] = donor_trees(settings.finetune, (rows, throughput, workload))
        assert fitted[how].relative == how
    with pytest.raises(CaloError, match="kept without their workloads: re-run `calo pretrain`"):
        donor_trees(settings.finetune, (rows, throughput, None))
    stores, devices = store_rows(graphs.graphs), store_devices(graphs.graphs)
    with pytest.raises(ValueError, match="against their workload's candidates"):
        fitted["median"].predict(stores, devices)
    # the trees read each summarized row less its workload's median
    centred = xgboost.DMatrix(relative_columns(summarize(stores, devices), graphs.workload,
                                               "median"))
    assert np.allclose(fitted["median"].predict(stores, devices, graphs.workload),
                       np.mean([b.predict(centred) for b in fitted["median"].members.values()], 0))
    # A shape the donor never measured scales every store column of a workload's programs:
    # read as percentiles among the workload's candidates, its order is what it was.
    larger = [3 * np.asarray(r) for r in stores]
    same = {how: np.allclose(trees.log_latency(larger, graphs.workload, devices),
                             trees.log_latency(stores, graphs.workload, devices))
            for how, trees in fitted.items() if how != "median"}
    assert same == {"none": False, "rank": True}
    loaded = Corrector.load(_saved(fitted["median"], tmp_path), fitted["median"].describe())
    assert loaded.relative == "median"
    assert np.allclose(loaded.log_latency(stores, graphs.workload, devices),
                       fitted["median"].log_latency(stores, graphs.workload, devices))
    # A search reads a task's candidates against those it first scored: later generations
    # score as the first did, and so does the search loaded from its saved state.
    donor.correction = fitted["median"]
    context, cands, _, _ = search_batch(TARGET, 8)
    search = CaloCostModel.from_settings(donor, settings, constant_kappa=0.0, trees=True,
                                         correct_top=0)
    first = search.predict(context, cands)
    assert len(search.tree_reference[str(context.task_name)]) == len(cands)
    assert np.allclose(search.predict(context, cands[:3]), first[:3])
    search.save(str(tmp_path / "search"))
    again = CaloCostModel.from_settings(copy.deepcopy(donor), settings, constant_kappa=0.0,
                                        trees=True, correct_top=0)
    again.load(str(tmp_path / "search"))
    again.reference = dict(search.reference)   # the round's scale, as the saved search had it
    assert np.allclose(again.predict(context, cands[:3]), first[:3])


def test_beside_a_warmup_the_trees_read_its_rows_against_their_workloads(
        params, pretrained, tmp_path, monkeypatch):
    import xgboost

    donor, row, graphs, (rows, throughput, workload) = donor_with_tree_rows(
        params, tmp_path, monkeypatch, blend=0.5)
    donor.donor_rows = (rows, 1 - throughput, workload)
    stores = store_rows(graphs.graphs)
    tuned = {}
    for how in ("none", "median"):
        settings = params.override({"finetune.rule": [row], "finetune.correction.relative": how})
        tuned[how] = copy.deepcopy(donor)
        adapt(tuned[how], settings.finetune, settings.train, graphs, graphs, set())
        assert tuned[how].correction.relative == how and tuned[how].correction.general
    # The donor's rows less the median of their workload's records, the warm-up's less the
    # median of their workload's warm-up records, and a scored set's less its own.
    # (The warm-up is the scored set here: one centring serves both.)
    warm = relative_columns(summarize(stores), graphs.workload, "median")
    donor_centred = relative_columns(rows[:, :summary_width(devices=False)], workload, "median")
    target = np.concatenate([1 - throughput, throughput])
    step = settings.finetune.step_for(graphs.per_workload())
    expected = Corrector.fit(settings.finetune.correction, step.correction, [], target,
                             settings.train.seed, step.blend,
                             summary_rows=np.concatenate([donor_centred, warm]), general=True,
                             row_weight=settings.finetune.correction.row_weight)
    median = tuned["median"].correction.predict(stores, workloads=graphs.workload)
    assert np.allclose(median, np.mean([b.predict(xgboost.DMatrix(warm))
                                        for b in expected.members.values()], 0))
    assert not np.allclose(median, tuned["none"].correction.predict(stores))
    stale = copy.deepcopy(donor)
    stale.donor_rows = (rows, 1 - throughput, None)  # kept before the rows kept workloads
    with pytest.raises(CaloError, match="kept without their workloads: re-run `calo pretrain`"):
        adapt(stale, settings.finetune, settings.train, graphs, graphs, set())


def test_the_donors_trees_can_weigh_each_record_by_its_throughput(params, pretrained, tmp_path,
                                                                   monkeypatch):
    donor, row, graphs, (rows, throughput, workload) = donor_with_tree_rows(
        params, tmp_path, monkeypatch, blend=1.0)
    # The same programs again as other workloads' records a million times slower than their
    # best: weighed by throughput they count for nothing (every record sampled, so the two
    # fits draw alike); weighed alike they drag the trees' predictions down.
    slower = np.full_like(throughput, 1e-6)
    slow = (np.concatenate([rows, rows]), np.concatenate([throughput, slower]),
            np.concatenate([workload, workload + workload.max() + 1]))
    stores, devices = store_rows(graphs.graphs), store_devices(graphs.graphs)
    moved = {}
    for weight in ("none", "throughput"):
        settings = params.override({"finetune.rule": [row], "finetune.correction.subsample": 1.0,
                                    "finetune.correction.zero_shot_row_weight": weight})
        alone, both = (donor_trees(settings.finetune, records) for records in
                       ((rows, throughput, workload), slow))
        assert alone.row_weight == both.row_weight == weight
        moved[weight] = np.abs(both.predict(stores, devices, graphs.workload)
                               - alone.predict(stores, devices, graphs.workload)).max()
    assert moved["throughput"] < 1e-3 < moved["none"]
    loaded = Corrector.load(_saved(both, tmp_path), both.describe())
    assert loaded.row_weight == "throughput"
    # Beside a warm-up the trees weigh the donor's records and the warm-up's as row_weight
    # says, whatever the donor's own trees do.
    donor.donor_rows = (rows, throughput, workload)
    ordered = {}
    for weight in ("none", "throughput"):
        tuned = copy.deepcopy(donor)
        beside = settings.override({"finetune.correction.row_weight": weight,
                                    "finetune.correction.zero_shot_row_weight": "none"})
        adapt(tuned, beside.finetune, beside.train, graphs, graphs, set())
        assert tuned.correction.general and tuned.correction.row_weight == weight
        ordered[weight] = tuned.correction.predict(stores, workloads=graphs.workload)
    assert not np.allclose(ordered["none"], ordered["throughput"])
    with pytest.raises(ValueError, match="only throughput trees"):
        Corrector.fit(settings.finetune.correction, 5, [], throughput, row_weight="throughput",
                      summary_rows=rows)
