import copy

import numpy as np
import pytest
import torch
from scipy import stats
from torch_geometric.data import Data

from calo import paths
from calo.dataset import load_graphs
from calo.models.calibration import (
    blended_temperature,
    carried_temperature,
    checked_temperature,
    confidence_levels,
    fit_temperature,
    median_temperature,
    refit_temperature,
    regression_ece,
    student_t_nll,
)
from calo.models.evidential import (
    NIG,
    EvidentialSAGE,
    evidential_loss,
    nig_nll,
)
from calo.models.ranking import pairwise_rank_loss
from calo.models.training import (
    WorkloadBatches,
    fit,
    mean_nll,
    predict,
    workload_batches,
)
from tests.conftest import DONOR

LEVELS = confidence_levels(19)


def seeded_model(graphs, hidden: int, layers: int, **variant) -> EvidentialSAGE:
    """A model built at torch seed 0, normalized on `graphs`' features and labels."""
    torch.manual_seed(0)
    model = EvidentialSAGE(graphs[0].x.shape[1], 4, hidden=hidden, layers=layers, **variant)
    model.set_normalization(torch.cat([g.x for g in graphs]), torch.cat([g.y for g in graphs]))
    return model


def test_nig_nll_is_the_student_t_marginal():
    d = NIG(torch.tensor([0.3, -1.0]), torch.tensor([0.5, 4.0]), torch.tensor([1.5, 6.0]),
            torch.tensor([0.7, 2.0]))
    y = torch.tensor([1.0, -0.2])
    expected = -stats.t.logpdf(y.numpy(), df=d.df.numpy(), loc=d.gamma.numpy(),
                               scale=d.t_scale.numpy())
    assert np.allclose(nig_nll(y, d).numpy(), expected, atol=1e-5)
    assert np.isclose(student_t_nll(y.numpy(), d.gamma.numpy(), d.t_scale.numpy(),
                                    d.df.numpy()), expected.mean(), atol=1e-5)


def test_temperature_scales_every_variance_by_tau_squared():
    d = NIG(torch.zeros(3), torch.ones(3), torch.full((3,), 2.0), torch.ones(3))
    s = d.scaled(3.0)
    for name in ("epistemic_var", "aleatoric_var"):
        assert torch.allclose(getattr(s, name), 9 * getattr(d, name))
    assert torch.allclose(s.t_scale, 3 * d.t_scale)


def test_evidence_regularizer_penalizes_confident_errors():
    y = torch.tensor([2.0])
    weak = NIG(torch.zeros(1), torch.tensor([0.1]), torch.tensor([1.1]), torch.ones(1))
    strong = NIG(torch.zeros(1), torch.tensor([50.0]), torch.tensor([50.0]), torch.ones(1))
    gap = evidential_loss(y, strong, 1.0) - nig_nll(y, strong).mean()
    assert gap > evidential_loss(y, weak, 1.0) - nig_nll(y, weak).mean()


def test_ece_separates_calibrated_from_overconfident():
    rng = np.random.default_rng(0)
    y = rng.standard_normal(4000)
    mu, df = np.zeros_like(y), np.full_like(y, 1e6)
    assert regression_ece(y, mu, np.ones_like(y), df, LEVELS) < 0.02
    assert regression_ece(y, mu, np.full_like(y, 0.3), df, LEVELS) > 0.2


def test_fit_temperature_recovers_the_missing_scale():
    rng = np.random.default_rng(1)
    y = 2.5 * rng.standard_normal(3000)
    args = (y, np.zeros_like(y), np.ones_like(y), np.full_like(y, 1e6))
    tau = fit_temperature(*args, LEVELS)
    assert abs(tau - 2.5) < 0.25
    assert regression_ece(y, args[1], tau * args[2], args[3], LEVELS) < 0.02


def test_an_nll_temperature_is_the_likelihoods_own_optimum():
    rng = np.random.default_rng(2)
    df = np.full(2000, 5.0)
    y = 2.0 * rng.standard_t(5.0, 2000)
    mu, scale = np.zeros_like(y), np.ones_like(y)
    tau = fit_temperature(y, mu, scale, df, LEVELS, objective="nll")
    grid = np.linspace(1.0, 3.0, 2001)
    best = grid[np.argmin([student_t_nll(y, mu, scale * t, df) for t in grid])]
    assert abs(tau - best) < 2e-3 and abs(tau - 2.0) < 0.15


def test_checked_temperature_fits_by_the_objective_it_is_given():
    # Tails heavier than the Gaussian predictive's: the likelihood wants wider intervals than
    # the coverage count does.
    rng = np.random.default_rng(3)
    y = rng.standard_t(3.0, 4000)
    folds = tuple((y[k::2], np.zeros(2000), np.ones(2000), np.full(2000, 1e6)) for k in (0, 1))
    pooled = tuple(np.concatenate(x) for x in zip(*folds))
    by_ece = checked_temperature(folds, 0.5, LEVELS)
    by_nll = checked_temperature(folds, 0.5, LEVELS, objective="nll")
    assert by_nll == pytest.approx(fit_temperature(*pooled, LEVELS, objective="nll"))
    assert by_ece == pytest.approx(fit_temperature(*pooled, LEVELS))
    assert by_nll > by_ece + 0.1


def test_training_on_measured_graphs_fits_them_and_keeps_the_best_epoch(params, extracted):
    graphs = load_graphs(paths.graphs_path(DONOR), params.graph.kind)
    train, val = graphs.graphs[::2], graphs.graphs[1::2]
    model = seeded_model(train, hidden=32, layers=2)
    result = fit(model, train, val, lr=3e-3, weight_decay=0.0, lam=1e-2, batch_size=8,
                 max_epochs=40, patience=None)
    losses = [h["train_loss"] for h in result["history"]]
    assert len(losses) == 40
    assert min(losses[-5:]) < losses[0] - 0.1  # it optimizes its objective
    best = min(h["val_nll"] for h in result["history"])
    assert result["best_val_nll"] == best
    assert np.isclose(mean_nll(model, val), best, atol=1e-5)  # best weights are restored


def test_an_anchored_fine_tune_stays_nearer_the_weights_it_started_from(params, extracted):
    graphs = load_graphs(paths.graphs_path(DONOR), params.graph.kind).graphs
    start = seeded_model(graphs, hidden=32, layers=2)
    distance = {}
    for anchor in (0.0, 200.0):
        model = copy.deepcopy(start)
        fit(model, graphs[:12], [], lr=3e-3, weight_decay=0.0, lam=1e-2, batch_size=4,
            max_epochs=10, warmup_epochs=0, anchor=anchor)
        distance[anchor] = sum(float((p - q).detach().pow(2).sum()) for p, q in
                               zip(model.parameters(), start.parameters())) ** 0.5
    assert 0 < distance[200.0] < 0.5 * distance[0.0]


def test_the_donor_keeps_the_epoch_train_keep_names(params):
    """train.keep reaches the donor's training loop (fine-tunes take their rule's instead)."""
    from calo.compute import fit_options

    assert fit_options(params.train)["keep"] == "best"
    assert fit_options(params.override({"train.keep": "last"}).train)["keep"] == "last"


def test_a_fine_tune_keeps_the_best_validation_epoch_or_the_last(params, extracted):
    graphs = load_graphs(paths.graphs_path(DONOR), params.graph.kind).graphs
    start = seeded_model(graphs, hidden=32, layers=2)
    # Validation labels 20x slower than the training ones: the better the fit, the worse its
    # NLL there, so the best epoch is an early one.
    val = [copy.copy(g) for g in graphs[:12]]
    for g in val:
        g.y = g.y + 3.0
    for keep in ("best", "last"):
        model, states = copy.deepcopy(start), []
        result = fit(model, graphs[:12], val, lr=3e-3, weight_decay=0.0, lam=1e-2,
                     batch_size=4, max_epochs=8, warmup_epochs=0, keep=keep,
                     on_epoch=lambda *_, m=model, s=states: s.append(
                         copy.deepcopy(m.state_dict())))
        epoch = result["best_epoch"] if keep == "best" else len(states) - 1
        assert result["kept_epoch"] == epoch
        assert all(torch.equal(v, states[epoch][k]) for k, v in model.state_dict().items())
        if keep == "best":
            assert epoch < len(states) - 1


def test_pairwise_rank_loss_rewards_the_measured_order():
    from calo.models.ranking import pairwise_rank_loss

    y = torch.tensor([0.0, 1.0, 2.0])
    assert pairwise_rank_loss(y, y) < pairwise_rank_loss(y, -y)
    assert pairwise_rank_loss(torch.zeros(3), y) == 0  # no ordered pair, no loss


def test_rank_loss_within_workloads_ignores_pairs_across_them():
    y = torch.tensor([0.0, 1.0, 5.0, 6.0])
    group = torch.tensor([0, 0, 1, 1])
    right = torch.tensor([0.0, 1.0, 5.0, 6.0])
    across_wrong = torch.tensor([5.0, 6.0, 0.0, 1.0])  # each workload still in order
    assert torch.isclose(pairwise_rank_loss(y, across_wrong, group),
                         pairwise_rank_loss(y, right, group))
    assert pairwise_rank_loss(y, across_wrong) > pairwise_rank_loss(y, right)


def test_throughput_weighting_makes_the_fast_end_cost_the_most():
    y = torch.log(torch.tensor([1.0, 2.0, 100.0, 200.0]))   # seconds 1, 2, 100, 200
    throughput = torch.exp(y.min() - y)
    fast_swapped = torch.tensor([1.0, 0.0, 2.0, 3.0])   # predicted ranks, one pair swapped
    slow_swapped = torch.tensor([0.0, 1.0, 3.0, 2.0])
    weighted = [pairwise_rank_loss(y, p, throughput=throughput)
                for p in (fast_swapped, slow_swapped)]
    uniform = [pairwise_rank_loss(y, p) for p in (fast_swapped, slow_swapped)]
    assert torch.isclose(uniform[0], uniform[1])
    assert weighted[0] > 2 * weighted[1]


def test_lambda_discount_weighs_order_at_the_predicted_top_more():
    # Two pairs one throughput step of 0.2 apart: the fastest two and the slowest two.
    y = -torch.log(torch.tensor([1.0, 0.8, 0.3, 0.1]))
    throughput = torch.exp(y.min() - y)
    top_swapped = torch.tensor([1.0, 0.0, 2.0, 3.0])
    bottom_swapped = torch.tensor([0.0, 1.0, 3.0, 2.0])
    plain, lam = ([pairwise_rank_loss(y, p, throughput=throughput, discount=d)
                   for p in (top_swapped, bottom_swapped)] for d in (False, True))
    assert torch.isclose(plain[0], plain[1])    # throughput alone weighs the two swaps alike
    assert lam[0] > 1.3 * lam[1]
    # Ranks count within a group: another workload's candidate predicted faster than all of
    # these (alone in its group, so in no pair) moves none of them down the list.
    group = torch.tensor([0, 0, 0, 0, 1])
    alone = pairwise_rank_loss(y, top_swapped, throughput=throughput, discount=True)
    faster = torch.cat([top_swapped, torch.tensor([-9.0])])
    joined = pairwise_rank_loss(torch.cat([y, y[:1]]), faster, group,
                                torch.cat([throughput, throughput[:1]]), discount=True)
    assert torch.isclose(alone, joined)


def test_workload_batches_hold_one_workload_and_cover_every_graph_once():
    groups = [0] * 7 + [1] * 3 + [2] * 12
    sampler = WorkloadBatches(groups, 4, torch.Generator().manual_seed(0))
    batches = list(sampler)
    assert len(batches) == len(sampler) == 2 + 1 + 3
    assert all(len({groups[i] for i in b}) == 1 and len(b) <= 4 for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(len(groups)))
    assert batches != list(sampler)  # a new order every epoch


def test_an_online_updates_batches_rank_each_task_against_its_own_best():
    """A network's search measures many tasks: a batch holds one, its throughput relative to
    that task's best record, wherever in the epoch the best falls."""
    y = [1.0, 2.0, 3.0, -5.0, -4.0]  # log latency: task b is far faster than task a
    graphs = [Data(x=torch.zeros(1, 1), edge_index=torch.zeros(2, 0, dtype=torch.long),
                   edge_type=torch.zeros(0, dtype=torch.long), y=torch.tensor([v])) for v in y]
    tasks = ["a", "a", "a", "b", "b"]
    batches = workload_batches(graphs, tasks, 2, "workload", torch.Generator().manual_seed(0))
    seen = {}
    for batch in batches:
        assert len(set(batch.group.tolist())) == 1
        seen.update(zip(batch.y.tolist(), batch.throughput.tolist()))
    assert len(seen) == len(y)
    for v, best in zip(y, [1.0, 1.0, 1.0, -5.0, -5.0]):
        assert np.isclose(seen[v], np.exp(best - v))
    assert not any("group" in g for g in graphs)  # the caller's graphs stay untagged


def test_checked_temperature_keeps_the_current_one_unless_cross_fitting_improves():
    rng = np.random.default_rng(0)
    y = rng.normal(size=(2, 400)) * 3.0
    ones = np.ones(400)
    folds = [(y[i], np.zeros(400), ones, ones * 30) for i in range(2)]
    tau = checked_temperature(folds, 1.0, LEVELS)
    assert 2.5 < tau < 3.5   # a real gain in both directions: the refitted scale
    # folds that disagree (one overconfident, one underconfident): each fold's temperature
    # makes the other worse, so 1.0 stays
    mixed = [(y[0], np.zeros(400), ones, ones * 30), (y[1] / 9, np.zeros(400), ones, ones * 30)]
    assert checked_temperature(mixed, 1.0, LEVELS) == 1.0
    assert abs(checked_temperature(folds, 3.0, LEVELS) - 3.0) < 0.1  # already about right


def test_checked_temperature_keeps_the_current_one_on_folds_too_small_to_tell():
    # Twice the predicted spread: 400 probes a fold refit it, 12 a fold keep the current one.
    y = np.random.default_rng(1).normal(size=(2, 400)) * 2.0
    folds = [(y[i], np.zeros(400), np.ones(400), np.full(400, 30.0))
             for i in range(2)]
    assert checked_temperature(folds, 1.0, LEVELS) > 1.5
    small = [(y[i, :12], np.zeros(12), np.ones(12), np.full(12, 30.0)) for i in range(2)]
    assert checked_temperature(small, 1.0, LEVELS) == 1.0


def test_one_workload_left_out_at_a_time_finds_the_width_two_lopsided_folds_refuse():
    """Nine workloads, six of them erring 1.6 times the predicted scale, two narrower and
    one far wider: cut into two folds whose small one holds the three odd workloads, each
    fold's median misfits the other and the current temperature stays; left out one at a
    time, every workload is scored at the others' median, and the width most share is found."""
    rng = np.random.default_rng(5)
    n = 120
    spread = np.array([0.6, 0.7, 4.0] + [1.6] * 6)
    parts = [(rng.normal(size=n) * s, np.zeros(n), np.ones(n), np.full(n, 30.0)) for s in spread]
    labels = [np.full(n, i) for i in range(len(parts))]

    def joined(idx):
        return tuple(np.concatenate([parts[i][k] for i in idx]) for k in range(4))

    odd, rest = [0, 1, 2], list(range(3, 9))
    folds = [joined(odd), joined(rest)]
    assert checked_temperature(folds, 1.0, LEVELS, [np.concatenate([labels[i] for i in idx])
                                                    for idx in (odd, rest)]) == 1.0
    assert 1.4 < checked_temperature(parts, 1.0, LEVELS, labels) < 1.8


def test_checked_temperature_refuses_a_refit_that_trades_nll_for_ece():
    # Heavy-tailed errors on a few dozen probes: the folds' cross-fitted temperatures lower
    # both NLL and ECE, but the temperature refitted on both lowers ECE and raises NLL.
    y = np.random.default_rng(47).standard_t(2, size=(2, 24)) * 0.84
    ones = np.ones(24)
    folds = [(y[i], np.zeros(24), ones, ones * 5) for i in range(2)]
    pooled = np.concatenate(y), np.zeros(48), np.ones(48), np.full(48, 5.0)

    def nll_ece(tau):  # tau: one temperature, or one per probe
        y_, mu, scale, df = pooled
        return (student_t_nll(y_, mu, scale * tau, df),
                regression_ece(y_, mu, scale * tau, df, LEVELS))

    refit = fit_temperature(*pooled, LEVELS)
    assert nll_ece(refit)[1] < nll_ece(1.0)[1] and nll_ece(refit)[0] > nll_ece(1.0)[0]
    crossed = np.repeat([fit_temperature(*folds[1], LEVELS),
                         fit_temperature(*folds[0], LEVELS)], 24)
    assert all(np.less(nll_ece(crossed), nll_ece(1.0)))   # the first check passes
    assert checked_temperature(folds, 1.0, LEVELS) == 1.0


def test_a_blended_temperature_lands_between_two_estimates_that_miss_on_either_side():
    """Probes of one width (random samples) refit a temperature too narrow for candidates of a
    wider one (evolved), a prior wider still misses them the other way: their geometric mean
    calibrates those candidates better than either, and blending is symmetric and keeps a
    temperature both estimates agree on."""
    rng = np.random.default_rng(1)
    scale, df = rng.uniform(0.3, 1.0, 4000), np.full(4000, 10.0)
    mu = np.zeros(4000)
    probes = 1.1 * scale * rng.standard_t(10, size=4000)
    asked = 1.3 * scale * rng.standard_t(10, size=4000)
    refit = fit_temperature(probes, mu, scale, df, LEVELS)
    prior = 1.6
    blend = blended_temperature(prior, refit)
    assert refit < blend < prior
    ece = {t: regression_ece(asked, mu, scale * t, df, LEVELS) for t in (refit, blend, prior)}
    assert ece[blend] < min(ece[refit], ece[prior])
    assert blend == pytest.approx(blended_temperature(refit, prior))
    assert blended_temperature(1.3, 1.3) == pytest.approx(1.3)


def test_a_carried_temperature_keeps_the_calibrated_width_a_fine_tune_moved():
    """A model calibrated by temperature 1.6 whose fine-tune widens every predicted scale by
    a factor between 1.2 and 1.4 (its errors unchanged): the carried temperature gives the
    intervals the width they had, so they calibrate again, where the old temperature is
    underconfident."""
    rng = np.random.default_rng(0)
    before = rng.uniform(0.3, 1.0, 4000)
    after = before * rng.uniform(1.2, 1.4, 4000)
    y = 1.6 * before * rng.standard_t(10, size=4000)
    mu, df = np.zeros_like(y), np.full_like(y, 10.0)
    assert regression_ece(y, mu, 1.6 * before, df, LEVELS) < 0.02
    carried = carried_temperature(1.6, before, after)
    assert 1.6 / 1.4 < carried < 1.6 / 1.2
    assert regression_ece(y, mu, carried * after, df, LEVELS) < 0.02
    assert regression_ece(y, mu, 1.6 * after, df, LEVELS) > 0.05
    assert carried_temperature(1.6, before, before) == pytest.approx(1.6)


@pytest.mark.parametrize("seed", range(3))
def test_a_warm_up_refit_is_checked_on_its_own_probes_not_across_workloads(seed):
    """Probes of two workloads whose errors are 0.9 and 1.8 times the predicted scale, all
    narrower than the current temperature says: a refit serves fresh candidates of the same
    workloads better, but each workload's own fit misfits the other, so the check across
    workloads keeps the current temperature; checked on the probes themselves, it is taken."""
    rng = np.random.default_rng(seed)
    n, current = 100, 2.2
    spread = np.repeat([0.9, 1.8], n)
    mu, scale, df = np.zeros(2 * n), np.ones(2 * n), np.full(2 * n, 8.0)
    y, fresh = (rng.standard_t(8, size=2 * n) * spread for _ in range(2))
    folds = [(y[:n], mu[:n], scale[:n], df[:n]), (y[n:], mu[n:], scale[n:], df[n:])]

    assert checked_temperature(folds, current, LEVELS) == current
    refit = refit_temperature((y, mu, scale, df), current, LEVELS)
    assert refit < current
    assert student_t_nll(fresh, mu, scale * refit, df) < student_t_nll(fresh, mu,
                                                                      scale * current, df)
    assert regression_ece(fresh, mu, scale * refit, df, LEVELS) < regression_ece(
        fresh, mu, scale * current, df, LEVELS)
    assert refit_temperature((y[:30], mu[:30], scale[:30], df[:30]), current, LEVELS) == current


def test_a_few_workloads_the_model_misses_widen_a_pooled_temperature_not_the_median():
    """Six workloads whose errors spread twice the predicted scale, two of them also shifted
    (the model misses their level): the pooled fit widens every interval for the two, the
    median of the workloads' own fits scales the typical spread; each fold of a checked
    temperature fits the same way."""
    rng = np.random.default_rng(3)
    n = 200
    shift = np.repeat([0.0, 0.0, 0.0, 0.0, 6.0, -6.0], n)
    y = rng.normal(size=6 * n) * 2.0 + shift
    mu, scale, df = np.zeros(6 * n), np.ones(6 * n), np.full(6 * n, 30.0)
    groups = np.repeat(list("abcdef"), n)
    assert fit_temperature(y, mu, scale, df, LEVELS) > 3.0
    assert 1.7 < median_temperature(y, mu, scale, df, groups, LEVELS) < 2.3
    # groups too small to fit alone: the pooled fit
    assert median_temperature(y, mu, scale, df, groups, LEVELS, least=n + 1) == \
        fit_temperature(y, mu, scale, df, LEVELS)
    halves = [np.isin(groups, list(part)) for part in ("ace", "bdf")]
    folds = [(y[m], mu[m], scale[m], df[m]) for m in halves]
    checked = checked_temperature(folds, 1.0, LEVELS, (groups[halves[0]], groups[halves[1]]))
    assert 1.7 < checked < 2.3


@pytest.mark.parametrize("variant", [
    {"encoder": "gcn"}, {"pooling": "topk"}, {"attention": True}, {"head": "deterministic"},
])
def test_every_model_variant_trains_on_measured_graphs(params, extracted, variant):
    graphs = load_graphs(paths.graphs_path(DONOR), params.graph.kind)
    train = graphs.graphs[::2]
    model = seeded_model(train, hidden=16, layers=2, **variant)
    result = fit(model, train, [], lr=3e-3, weight_decay=0.0, lam=1e-2, batch_size=8,
                 max_epochs=15, rank_weight=0.5)
    losses = [h["train_loss"] for h in result["history"]]
    assert min(losses[-3:]) < losses[0]
    d = predict(model, train)
    assert d.gamma.shape == (len(train),) and torch.isfinite(d.t_scale).all()
    if variant.get("head") == "deterministic":  # one global scale: the temperature's to fit
        assert torch.allclose(d.t_scale, d.t_scale[0].expand_as(d.t_scale))


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="unknown variant"):
        EvidentialSAGE(4, 2, encoder="gat")


@pytest.mark.parametrize("stores", [0, 5])
def test_fast_collation_matches_pyg_batching(stores):
    from calo.dataset import collate, to_data
    from calo.models.training import loader
    from calo.schedule_graph import Device, ScheduleGraph

    rng = np.random.default_rng(0)
    graphs = []
    for nodes, edges, rows in ((3, 2, 1), (5, 7, 3), (1, 0, 0), (4, 4, 2)):
        graphs.append(ScheduleGraph(
            x=rng.standard_normal((nodes, 6)).astype(np.float32),
            edge_index=rng.integers(0, nodes, (2, edges)).astype(np.int64),
            edge_type=rng.integers(0, 4, edges).astype(np.int64),
            stores=rng.standard_normal((rows, stores)).astype(np.float32) if stores else None,
            device=Device(2, 32) if stores else None))
    fast_batch = collate(graphs)
    x, edge_index, edge_type, batch, num_graphs, store_rows, store_batch = fast_batch
    ref = next(iter(loader([to_data(g) for g in graphs], batch_size=len(graphs))))
    assert torch.equal(x, ref.x) and torch.equal(edge_index, ref.edge_index)
    assert torch.equal(edge_type, ref.edge_type) and torch.equal(batch, ref.batch)
    assert num_graphs == ref.num_graphs
    if stores:
        assert torch.equal(store_rows, ref.store_rows)
        assert torch.equal(store_batch, ref.store_rows_batch)
        assert store_batch.tolist() == [0, 1, 1, 1, 3, 3]
    else:
        assert store_rows is None and "store_rows" not in ref
    torch.manual_seed(0)
    model = EvidentialSAGE(6, 4, hidden=8, layers=2, store_features=stores).eval()
    if stores:
        model.set_normalization(x, torch.zeros(2), store_rows)
    fast = model(*fast_batch)
    slow = model(ref.x, ref.edge_index, ref.edge_type, ref.batch, ref.num_graphs,
                 *((ref.store_rows, ref.store_rows_batch) if stores else ()))
    assert torch.allclose(fast.gamma, slow.gamma) and torch.allclose(fast.beta, slow.beta)
    if stores:  # the rows enter the prediction: a graph's own rows move only its output
        store_rows[0] += 10.0
        moved = model(*fast_batch).gamma
        assert moved[0] != fast.gamma[0] and torch.equal(moved[1:], fast.gamma[1:])


def test_fused_relation_aggregation_equals_one_sageconv_per_relation():
    from calo.models.relations import RelationSegments

    torch.manual_seed(0)
    nodes, relations, hidden = 9, 4, 5
    # Duplicate edges, a node with no in-edges and a relation with no edges at all.
    edge_index = torch.tensor([[0, 1, 2, 2, 3, 4, 4, 5, 8, 8],
                               [1, 1, 3, 3, 0, 6, 7, 7, 7, 2]])
    edge_type = torch.tensor([0, 0, 1, 1, 3, 0, 1, 1, 3, 0])
    model = EvidentialSAGE(3, relations // 2, hidden=hidden, layers=1)
    convs, h, root = model.convs[0], torch.randn(nodes, hidden), torch.randn(nodes, hidden)
    expected = root.clone()
    for r, conv in enumerate(convs):
        expected = expected + conv(h, edge_index[:, edge_type == r])
    segments = RelationSegments(edge_index, edge_type, nodes, relations)
    fused = segments.aggregate(h, [conv.lin_l.weight for conv in convs], root.clone())
    assert torch.allclose(fused, expected, atol=1e-6)
    assert not torch.allclose(fused, root)  # the check is not vacuous
    # The slots are the sorted distinct (relation, target) pairs, as torch.unique gives them,
    # so each slot sums its edges in the same order as a sort-based construction would.
    keys, slot, counts = torch.unique(edge_type * nodes + edge_index[1], return_inverse=True,
                                      return_counts=True)
    assert torch.equal(segments.slot, slot) and torch.equal(segments.target, keys % nodes)
    assert torch.equal(segments.inv_count.squeeze(1), 1.0 / counts)
    assert segments.bounds == [0, 3, 5, 5, 7]


def test_scoring_aggregates_exactly_as_training_does():
    """Without gradients the relations' messages are added in one call: the same sums in the
    same order, so a scored candidate gets the number a trained model's evaluation gave it."""
    from calo.models.relations import RelationSegments

    torch.manual_seed(1)
    nodes, relations, hidden, edges = 3000, 8, 64, 4000
    edge_index = torch.randint(0, nodes, (2, edges))
    edge_type = torch.randint(0, relations, (edges,))
    weights = [torch.randn(hidden, hidden) for _ in range(relations)]
    h, root = torch.randn(nodes, hidden), torch.randn(nodes, hidden)
    segments = RelationSegments(edge_index, edge_type, nodes, relations)
    with torch.enable_grad():
        trained = segments.aggregate(h.requires_grad_(), weights, root.clone())
    with torch.inference_mode():
        scored = segments.aggregate(h.detach(), weights, root.clone())
    assert trained.requires_grad and not scored.requires_grad  # both paths ran
    assert torch.equal(trained.detach(), scored)


@pytest.mark.parametrize("deterministic", [False, True])
def test_fast_weights_make_the_regression_loss_a_weighted_mean(deterministic):
    from calo.models.evidential import cost_loss

    torch.manual_seed(0)
    y = torch.randn(5)
    d = NIG(torch.randn(5), torch.rand(5) + 0.1, torch.rand(5) + 1.1, torch.rand(5) + 0.1)
    plain = cost_loss(y, d, 0.01, deterministic)
    assert torch.isclose(cost_loss(y, d, 0.01, deterministic, weight=torch.full((5,), 3.0)),
                         plain)
    only_first = cost_loss(y, d, 0.01, deterministic, weight=torch.tensor([1.0, 0, 0, 0, 0]))
    first = cost_loss(y[:1], NIG(*(t[:1] for t in d)), 0.01, deterministic)
    assert torch.isclose(only_first, first) and not torch.isclose(only_first, plain)


def test_a_per_iteration_model_adds_each_programs_work_back_to_its_prediction():
    from calo.artifact import ModelConfig
    from calo.errors import CaloError
    from calo.graphs import schema
    from calo.schedule_graph import FEATURES

    features, edge_types = schema("schedule")
    block, extent = FEATURES.index("is_block"), FEATURES.index("log_extent")
    model = ModelConfig("schedule", tuple(features), tuple(edge_types), 16, 1,
                        per_iteration=True).build()
    torch.nn.init.zeros_(model.head[-1].weight)
    torch.nn.init.zeros_(model.head[-1].bias)  # the head predicts the mean per iteration
    model.y_mean.fill_(-20.0)
    model.y_std.fill_(2.0)
    # Two programs: a block of 2^10 iterations beside a loop of 2^30 (a loop is no block's
    # work), and one whose largest block has 2^16.
    x = torch.zeros(4, len(FEATURES))
    x[0, block], x[0, extent] = 1, 10.0
    x[1, extent] = 30.0
    x[2, block], x[2, extent] = 1, 16.0
    x[3, block], x[3, extent] = 1, 4.0
    out = model.to_log_latency(model(x, torch.zeros(2, 0, dtype=torch.long),
                                     torch.zeros(0, dtype=torch.long),
                                     torch.tensor([0, 0, 1, 1]), 2))
    expected = torch.tensor([-20 + 10 * np.log(2), -20 + 16 * np.log(2)], dtype=torch.float32)
    assert torch.allclose(out.gamma, expected)
    plain = ModelConfig("schedule", tuple(features), tuple(edge_types), 16, 1).build()
    assert torch.equal(plain.work(x, torch.tensor([0, 0, 1, 1]), 2), torch.zeros(2))
    ast_features, ast_edges = schema("ast")
    with pytest.raises(CaloError, match="per_iteration"):
        ModelConfig("ast", tuple(ast_features), tuple(ast_edges), 16, 1,
                    per_iteration=True).build()
