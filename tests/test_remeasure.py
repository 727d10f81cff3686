import json

import numpy as np
import pytest
from remeasure import (
    chosen,
    correlations,
    figures,
    load_runs,
    measure_sessions,
    perfect_model,
    report,
    session_order,
    write_stores,
)

from calo import records
from calo.errors import CaloError
from calo.paths import records_dir
from tests.conftest import TARGET


def test_order_that_does_not_survive_another_session_is_told_apart_from_repeat_noise():
    true = np.linspace(1.0, 2.0, 10)
    repeats = np.array([1.0, 1.001, 0.999])
    steady = np.stack([np.outer(true, repeats)] * 2, axis=1)  # (candidates, sessions, repeats)
    assert all(f["kendall_tau"] == pytest.approx(1.0) for f in figures(steady, true).values())
    estimate = perfect_model(correlations(steady, true))
    assert estimate == pytest.approx({"session_label": 1.0, "pool_label": 1.0})

    # Each session slows a different half of the candidates: every session orders its own
    # runs alike, and another session's differently.
    moved = steady.copy()
    moved[::2, 0] += 0.6
    moved[1::2, 1] += 0.6
    got = {name: f["kendall_tau"] for name, f in figures(moved, true).items()}
    assert got["within"] == pytest.approx(1.0)
    assert got["between"] < 0.5 < got["pool"] < 1.0
    # Two sessions that agree little say each label holds little of the latency's order; the
    # pool's label, nearer to each session than they are to each other, holds more.
    estimate = perfect_model(correlations(moved, true))
    assert got["between"] < estimate["session_label"] < estimate["pool_label"] <= 1.0


def test_a_session_measures_each_group_together_in_an_order_of_its_own(params, harvested):
    recs = chosen(records_dir(TARGET), None, None)
    first, second = session_order(recs, 0), session_order(recs, 1)
    assert sorted(r.index for r in first) == sorted(r.index for r in recs)
    assert [r.index for r in first] != [r.index for r in second]
    groups = [(r.workload_name, r.source) for r in first]
    runs = [g for i, g in enumerate(groups) if i == 0 or g != groups[i - 1]]
    assert len(runs) == len(set(groups))  # each group in one stretch

    with pytest.raises(CaloError, match="no successful evolved records of no-such-workload"):
        chosen(records_dir(TARGET), "evolved", ["no-such-workload"])


def test_measured_again_in_sessions_and_resumed_after_a_torn_line(params, harvested, tmp_path):
    recs = chosen(records_dir(TARGET), "random", None)
    runs = tmp_path / "runs.jsonl"
    measure_sessions(params, recs, TARGET, 2, runs, seed=0)
    lines = runs.read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    expected = {(s, r.index) for s in (0, 1) for r in recs}
    assert {(row["session"], row["record"]) for row in rows} == expected
    assert len(rows) == len(expected)
    assert all(len(row["run_secs"]) == params.harvest.repeat and row["error"] is None
               for row in rows)

    # Interrupted: the last two measurements lost, a third half written.
    runs.write_text("\n".join(lines[:-3]) + "\n" + lines[-3][:20])
    measure_sessions(params, recs, TARGET, 2, runs, seed=0)
    again = runs.read_text().splitlines()
    assert again[:-3] == lines[:-3]  # nothing measured twice
    assert {(json.loads(x)["session"], json.loads(x)["record"]) for x in again} == expected
    assert len(again) == len(expected)
    assert (tmp_path / "runs.jsonl.torn").read_text() == lines[-3][:20] + "\n"

    rep = report(recs, load_runs(runs), 2, min_candidates=3)
    assert list(rep["by_source"]) == ["random"]
    assert rep["by_source"]["random"]["workloads"] == len({r.workload_name for r in recs})
    for figure in ("within", "between", "pool"):
        scores = rep["by_source"]["random"][figure]
        assert -1.0 <= scores["kendall_tau"] <= 1.0
        assert 0.0 < scores["top1"] <= scores["top5"] <= 1.0

    # Each session's runs as the labels of a copy of the pool; the other records keep theirs.
    store = records_dir(TARGET)
    copies = write_stores(store, load_runs(runs), 2, tmp_path / "stores")
    runs_of = {(row["session"], row["record"]): row["run_secs"]
               for row in map(json.loads, runs.read_text().splitlines())}
    before = {r.index: r.latency for r in records.iter_records(store)}
    for session, copy in enumerate(copies):
        after = {r.index: r.latency for r in records.iter_records(copy)}
        assert after.keys() == before.keys()
        for index, latency in after.items():
            secs = runs_of.get((session, index))
            assert latency == pytest.approx(np.mean(secs) if secs else before[index])
