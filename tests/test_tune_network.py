import json

import numpy as np
import pytest

from calo import paths
from calo.cli import main
from calo.networks import BUILT_IN, load_network
from calo.records import iter_records
from calo.relax_build import import_network
from calo.tasks.tune_network import (
    calo_time_to_xgb_final,
    scored,
    time_to_reach,
    weighted_curve,
)
from tests.conftest import TARGET

TINY = "tests.tiny_net:tiny"


@pytest.mark.slow
def test_tune_network_through_the_cli_tunes_compiles_and_checks_all_three(promoted, capsys):
    assert main(["tune-network", "--device", TARGET, "--network", TINY, "--trials", "8",
                 "--batch", "2"]) == 0
    report = json.loads(paths.report_path("tune-network", TARGET).read_text())[TINY]
    tuned = [t for t in report["tasks"] if t["tuned"]]
    assert len(tuned) == 2  # the two dense layers
    out = paths.network_dir(TARGET, TINY)
    for model in ("calo", "xgb"):
        assert report["trials"][model] == 8
        assert [t[f"{model}_trials"] for t in tuned] == [4, 4]  # a round of 4 each
        assert report["curves"][model]  # once both tasks are measured: the tasks' latency
        assert len(list(iter_records(out / model))) >= 1  # a TVM database a user can apply
    # Each run searched with its model's evolution and logged on its own: XGBoost's two
    # genetic iterations, CALO's one (conftest's tune.search and tune.calo_search).
    logs = {m: " ".join(f.read_text() for f in (out / m / "logs").glob("*.log"))
            for m in ("calo", "xgb")}
    assert "Evolve iter #1 done" in logs["xgb"] and "Evolve iter #0 done" in logs["calo"]
    assert "Evolve iter #1 done" not in logs["calo"]
    for variant in ("untuned", "calo", "xgb"):
        assert (out / variant / "network.so").is_file()
        assert report["end_to_end_us"][variant] > 0
        assert report["max_abs_diff"][variant] <= 1e-4  # allclose to PyTorch, checked per run
    metrics = json.loads(paths.metrics_path("tune-network", TARGET).read_text())
    assert set(metrics[TINY]) == {"untuned_us", "calo_us", "xgb_us", "calo_time_ratio_vs_xgb"}
    assert paths.report_path("tune-network", TARGET).with_name(f"{TARGET}-curves.png").is_file()


@pytest.mark.parametrize("network, message", [
    ("resnet-9000", "unknown network 'resnet-9000'"),
    ("tests.tiny_net:does_not_export", "does not export with torch.export"),
    ("tests.no_such_module:net", "cannot import it"),
])
def test_bad_networks_get_one_line(promoted, capsys, network, message):
    assert main(["tune-network", "--device", TARGET, "--network", network, "--trials", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("calo: error:") and message in err[-1]


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_built_in_networks_import_into_relax(name):
    program = import_network(load_network(name, batch=2))
    assert "main" in [gv.name_hint for gv in program.mod.get_global_vars()]
    assert program.inputs[0].shape[0] == 2
    assert all(np.isfinite(e).all() for e in program.expected)


def test_weighted_curve_starts_once_every_task_is_measured():
    events = [(1.0, 0, [3.0, None]), (2.0, 0, [2.0]), (3.0, 1, [None]), (4.0, 1, [5.0]),
              (5.0, 1, [1.0])]
    curve = weighted_curve(events, [2.0, 1.0])
    assert curve == [(4.0, 2 * 2.0 + 5.0), (5.0, 2 * 2.0 + 1.0)]
    assert time_to_reach(curve, 9.0) == 4.0
    assert time_to_reach(curve, 4.0) is None


def test_a_schedule_both_runs_measured_counts_alike_in_both():
    # Task 0 has one schedule, "a", measured at 1.0 by CALO's run and 3.0 by XGBoost's: alone
    # it would decide the comparison. Task 1's schedules differ between the runs.
    runs = {"calo": {"events": [(1.0, 0, [1.0]), (2.0, 1, [4.0, None])],
                     "schedules": [["a"], ["b", "c"]]},
            "xgb": {"events": [(1.0, 0, [3.0]), (2.0, 1, [2.0])], "schedules": [["a"], ["d"]]}}
    pooled = scored(runs, [1.0, 1.0])
    assert pooled["calo"]["curve"] == [(2.0, 2.0 + 4.0)]
    assert pooled["xgb"]["curve"] == [(2.0, 2.0 + 2.0)]
    assert pooled["calo"]["best_s"] == [2.0, 4.0] and pooled["calo"]["task_trials"] == [1, 2]
    assert calo_time_to_xgb_final(pooled) is None
    own = scored(runs, [1.0, 1.0], pool=False)
    assert own["calo"]["curve"] == [(2.0, 1.0 + 4.0)]
    assert calo_time_to_xgb_final(own) == 2.0


def test_benchmark_median_counts_a_run_that_never_reached_as_the_slowest():
    from tune_network import median_ratio

    assert median_ratio([0.5, None, 0.7]) == 0.7
    assert median_ratio([0.4, 0.6]) == 0.5
    assert median_ratio([0.3, None]) is None
    assert median_ratio([None, 0.2, None]) is None
