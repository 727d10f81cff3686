import json

from tvm.s_tir import meta_schedule as ms

from calo.records import RECORD_FILE, count_by_workload, iter_records
from tests.conftest import DONOR, TARGET


def test_harvest_measures_each_workload_up_to_its_count(params, harvested):
    for device in (DONOR, TARGET):
        store = params.records_dir(device)
        counts = count_by_workload(store)
        assert sorted(counts.values()) == [14, 14]
        assert harvested[device]["measured"] == 28
        recs = list(iter_records(store))
        ok = [r.latency for r in recs if r.latency is not None]
        assert len(ok) >= 20 and all(0 < lat < 1.0 for lat in ok)
        assert {r.workload_name for r in recs} == {"mm-64", "mm-relu-32x64"}


def test_store_is_a_plain_tvm_json_database(params, harvested):
    db = ms.database.JSONDatabase(work_dir=str(params.records_dir(DONOR)))
    assert len(db.get_all_tuning_records()) == 28


def test_second_harvest_measures_nothing_and_a_larger_count_tops_up(params, harvested):
    from tasks.harvest import harvest

    store = params.records_dir(TARGET)
    before = (store / RECORD_FILE).read_text()
    again = harvest.fn(params, TARGET)
    assert again["measured"] == 0 and again["existing"] == 28
    assert (store / RECORD_FILE).read_text() == before

    more = harvest.fn(params, TARGET, ["mm-64"], 16)
    assert more["measured"] == 2
    after = (store / RECORD_FILE).read_text()
    assert after.startswith(before)  # appended, nothing rewritten
    assert sorted(count_by_workload(store).values()) == [14, 16]
    names = json.loads((store / "workloads.json").read_text())
    assert set(names.values()) == {"mm-64", "mm-relu-32x64"}
