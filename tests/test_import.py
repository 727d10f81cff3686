import json
import shutil

from calo import paths
from calo.records import RECORD_FILE, count_by_workload
from calo.tasks.import_records import import_records
from tests.conftest import DONOR, SPARE


def test_import_keeps_good_lines_names_bad_ones_and_skips_duplicates(params, harvested,
                                                                      tmp_path):
    source = tmp_path / "db"
    shutil.copytree(paths.records_dir(DONOR), source)
    good = (source / RECORD_FILE).read_text().splitlines()
    one = json.loads(good[0])
    bad = ["not json at all",
           json.dumps([99, one[1]]),                  # unknown workload index
           json.dumps([one[0], ["not", "a", "record"]])]
    (source / RECORD_FILE).write_text("\n".join(good + bad) + "\n")

    first = import_records(params, SPARE, source)
    assert first["imported"] == len(good) == 28
    assert first["duplicates"] == 0
    assert len(first["bad_lines"]) == 3
    for lineno in (29, 30, 31):
        assert any(f"line {lineno}:" in m for m in first["bad_lines"]), first["bad_lines"]
    assert "workload 99" in first["bad_lines"][1]
    store = paths.records_dir(SPARE)
    assert sorted(count_by_workload(store).values()) == [14, 14]

    second = import_records(params, SPARE, source)
    assert second["imported"] == 0 and second["duplicates"] == 28
    assert sum(count_by_workload(store).values()) == 28


def test_import_keeps_one_target_per_store_and_names_the_other_targets_lines(params, harvested,
                                                                            tmp_path):
    source = tmp_path / "db"
    shutil.copytree(paths.records_dir(DONOR), source)
    lines = [json.loads(line) for line in (source / RECORD_FILE).read_text().splitlines()]
    lines[5][1][2]["mcpu"] = "skylake"  # measured on another CPU than the rest
    (source / RECORD_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))

    settings = params.override(
        {"devices.cpu-one-target": {"target": {"kind": "llvm"}, "candidates_per_workload": 0}})
    summary = import_records(settings, "cpu-one-target", source)
    assert summary["imported"] == 27
    assert len(summary["bad_lines"]) == 1
    assert "line 6: measured on llvm -mcpu=skylake" in summary["bad_lines"][0]
