import json

from tvm.s_tir import meta_schedule as ms

from calo import paths
from calo.records import EVOLVED, RANDOM, RECORD_FILE, candidate_id, count_by_workload, iter_records
from tests.conftest import DONOR, TARGET


def test_harvest_measures_each_workload_up_to_its_count(params, harvested):
    for device in (DONOR, TARGET):
        store = paths.records_dir(device)
        counts = count_by_workload(store)
        assert sorted(counts.values()) == [14, 14]
        assert harvested[device]["measured"] == 28
        recs = list(iter_records(store))
        ok = [r.latency for r in recs if r.latency is not None]
        assert len(ok) >= 20 and all(0 < lat < 1.0 for lat in ok)
        assert {r.workload_name for r in recs} == {"mm-64", "mm-relu-32x64"}


def test_each_record_knows_its_source_random_first_then_evolved(params, harvested):
    for device in (DONOR, TARGET):
        recs = list(iter_records(paths.records_dir(device)))
        for name in ("mm-64", "mm-relu-32x64"):
            sources = [r.source for r in recs if r.workload_name == name][:14]
            # evolved_fraction 0.5 of 14: seven random samples, then seven evolved candidates
            assert sources == [RANDOM] * 7 + [EVOLVED] * 7
        assert harvested[device][RANDOM] == harvested[device][EVOLVED] == 14
        # no schedule is measured twice
        assert len({candidate_id(r.workload_key, r.record.trace) for r in recs}) == len(recs)


def test_store_is_a_plain_tvm_json_database(params, harvested):
    db = ms.database.JSONDatabase(work_dir=str(paths.records_dir(DONOR)))
    assert len(db.get_all_tuning_records()) == 28


def test_second_harvest_measures_nothing_and_a_larger_count_tops_up(params, harvested):
    from calo.tasks.harvest import harvest

    store = paths.records_dir(TARGET)
    before = (store / RECORD_FILE).read_text()
    again = harvest(params, TARGET)
    assert again["measured"] == 0 and again["existing"] == 28
    assert (store / RECORD_FILE).read_text() == before

    more = harvest(params, TARGET, ["mm-64"], 16)
    assert more["measured"] == 2
    after = (store / RECORD_FILE).read_text()
    assert after.startswith(before)  # appended, nothing rewritten
    assert sorted(count_by_workload(store).values()) == [14, 16]
    names = json.loads((store / "workloads.json").read_text())
    assert set(names.values()) == {"mm-64", "mm-relu-32x64"}


def test_kill_9_mid_harvest_loses_nothing_and_resumes(params, workdir):
    """SIGKILL a harvesting process, run the same harvest again: every stored record survives,
    the store ends with exactly the requested count, so nothing was measured twice."""
    import signal
    import subprocess
    import sys
    import time

    from calo.tasks.harvest import harvest
    from tests.conftest import KILLED

    store = paths.records_dir(KILLED) / RECORD_FILE
    script = ("from calo.config import load_settings; from calo.tasks.harvest import harvest; "
              f"harvest(load_settings({str(params.path)!r}), {KILLED!r}, ['mm-64'])")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=workdir,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if store.is_file() and len(store.read_text().splitlines()) >= 5:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the harvest ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    survived = store.read_text().splitlines()
    assert 5 <= len(survived) < 20

    resumed = harvest(params, KILLED, ["mm-64"])
    assert resumed["existing"] == len(survived)
    assert resumed["measured"] == 20 - len(survived)
    lines = store.read_text().splitlines()
    assert lines[: len(survived)] == survived and len(lines) == 20
    # the killed process left no torn line: the whole store still parses
    recs = list(iter_records(paths.records_dir(KILLED)))
    assert len(recs) == 20
    assert len({candidate_id(r.workload_key, r.record.trace) for r in recs}) == 20
