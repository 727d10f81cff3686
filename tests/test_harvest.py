import json

import pytest
from tvm.s_tir import meta_schedule as ms

from calo import paths
from calo.records import (
    EVOLVED,
    META_FILE,
    RANDOM,
    RECORD_FILE,
    candidate_id,
    count_by_workload,
    iter_records,
)
from tests.conftest import DONOR, TARGET, with_devices


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
    import shutil

    from calo.tasks.harvest import harvest

    # A copy of the target's store under a device of its own: the session's stay as harvested.
    device = "cpu-again"
    settings = with_devices(params, **{device: params.raw["devices"][TARGET]})
    store = paths.records_dir(device)
    shutil.copytree(paths.records_dir(TARGET), store)
    before = (store / RECORD_FILE).read_text()
    again = harvest(settings, device)
    assert again["measured"] == 0 and again["existing"] == 28
    assert (store / RECORD_FILE).read_text() == before

    more = harvest(settings, device, ["mm-64"], 16)
    assert more["measured"] == 2
    after = (store / RECORD_FILE).read_text()
    assert after.startswith(before)  # appended, nothing rewritten
    assert sorted(count_by_workload(store).values()) == [14, 16]
    names = json.loads((store / "workloads.json").read_text())
    assert set(names.values()) == {"mm-64", "mm-relu-32x64"}


def test_harvest_refuses_a_store_of_another_target_and_leaves_it_as_it_was(params, harvested):
    import shutil

    from calo.errors import CaloError
    from calo.tasks.harvest import harvest

    # TARGET's records (-mcpu=x86-64) in the store of a device measuring on another CPU: what a
    # harvest resumed on another machine with `mcpu: host` would append to
    moved = "cpu-moved"
    settings = params.override({f"devices.{moved}": {
        "target": {"kind": "llvm", "num-cores": 1, "mcpu": "skylake"},
        "runner": {"kind": "local", "num_threads": 1}, "candidates_per_workload": 16}})
    store = paths.records_dir(moved)
    shutil.copytree(paths.records_dir(TARGET), store)
    before = (store / RECORD_FILE).read_text()
    with pytest.raises(CaloError, match=r"-mcpu=x86-64.*-mcpu=skylake"):
        harvest(settings, moved, ["mm-64"])
    assert (store / RECORD_FILE).read_text() == before


@pytest.mark.slow
def test_kill_9_mid_harvest_loses_nothing_and_resumes(params, workdir):
    """SIGKILL a harvesting process, run the same harvest again: every stored record survives,
    the store ends with exactly the requested count, so nothing was measured twice."""
    import signal
    import subprocess
    import sys

    from calo.tasks.harvest import harvest
    from tests.conftest import KILLED

    want = params.device(KILLED).candidates_per_workload
    store = paths.records_dir(KILLED) / RECORD_FILE
    script = ("from calo.config import load_settings; from calo.tasks.harvest import harvest; "
              f"harvest(load_settings({str(params.path)!r}), {KILLED!r}, ['mm-64'])")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=workdir,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for_lines(proc, store, 5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    survived = store.read_text().splitlines()
    assert 5 <= len(survived) < want

    resumed = harvest(params, KILLED, ["mm-64"])
    assert resumed["existing"] == len(survived)
    assert resumed["measured"] == want - len(survived)
    lines = store.read_text().splitlines()
    assert lines[: len(survived)] == survived and len(lines) == want
    # the killed process left no torn line: the whole store still parses
    recs = list(iter_records(paths.records_dir(KILLED)))
    assert len(recs) == want
    assert len({candidate_id(r.workload_key, r.record.trace) for r in recs}) == want


@pytest.mark.slow
def test_ctrl_c_stops_a_harvest_after_its_batch_and_stores_no_false_failures(params, workdir,
                                                                               tmp_path):
    """A terminal's Ctrl-C reaches the harvest and its build and run workers alike: the harvest
    ends after the batch in flight with one line and exit code 0, stores no failure the interrupt
    caused, and the same harvest run again continues where it stopped."""
    import os
    import signal
    import subprocess
    import sys

    import yaml

    from calo.config import load_settings
    from calo.tasks.harvest import harvest
    from tests.conftest import KILLED

    device, want = "cpu-interrupted", params.device(KILLED).candidates_per_workload
    raw = yaml.safe_load(params.path.read_text())
    raw["devices"][device] = raw["devices"][KILLED]
    own = tmp_path / "params.yaml"
    own.write_text(yaml.safe_dump(raw, sort_keys=False))
    store = paths.records_dir(device)
    log = tmp_path / "stderr.log"  # a file, not a pipe nobody drains while it runs
    with open(log, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "calo.cli", "--params", str(own), "harvest", "--device",
             device, "--workload", "mm-64"],
            cwd=workdir, stdout=subprocess.DEVNULL, stderr=stderr,
            start_new_session=True)  # its own process group, as a terminal's foreground job
    _wait_for_lines(proc, store / RECORD_FILE, 3)
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=240)
    err = log.read_text()
    assert proc.returncode == 0, err[-3000:]
    assert "stopping after this batch" in err and "interrupted; run it again" in err
    assert "Traceback" not in err

    kept = (store / RECORD_FILE).read_text().splitlines()
    assert 3 <= len(kept) < want
    statuses = [json.loads(line)["status"] for line in
                (store / META_FILE).read_text().splitlines()]
    assert statuses == ["ok"] * len(kept)

    resumed = harvest(load_settings(own), device, ["mm-64"])
    assert resumed["existing"] == len(kept) and resumed["measured"] == want - len(kept)
    assert "interrupted" not in resumed


def _wait_for_lines(proc, path, lines: int, timeout_s: float = 240) -> None:
    """Until the running process has written `lines` lines to path; fails if it ended first."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if path.is_file() and len(path.read_text().splitlines()) >= lines:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the harvest ended before it could be stopped"
