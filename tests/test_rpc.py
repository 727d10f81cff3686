"""Harvesting through a real TVM RPC tracker and server on loopback."""

import time

import pytest
from tvm import rpc
from tvm.rpc.tracker import Tracker

from calo import paths, records
from calo.errors import CaloError
from calo.measure import make_runner
from tests.conftest import with_devices


@pytest.fixture(scope="module")
def tracker():
    tracker = Tracker(host="127.0.0.1", port=19190, port_end=19290, silent=True)
    server = rpc.Server(host="127.0.0.1", port=19300, port_end=19400, key="calo-loop",
                        tracker_addr=("127.0.0.1", tracker.port), silent=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the server registers with the tracker asynchronously
        if rpc.connect_tracker("127.0.0.1", tracker.port).summary()["server_info"]:
            break
        time.sleep(0.2)
    yield tracker
    server.terminate()
    tracker.terminate()


def _rpc_device(port: int, key: str = "calo-loop") -> dict:
    return {"target": {"kind": "llvm", "num-cores": 1},
            "runner": {"kind": "rpc", "host": "127.0.0.1", "port": port, "key": key},
            "candidates_per_workload": 4}


@pytest.mark.slow
def test_harvest_measures_through_the_tracker(params, tracker):
    from calo.tasks.harvest import harvest

    p = with_devices(params, **{"rpc-loop": _rpc_device(tracker.port)})
    summary = harvest(p, "rpc-loop", ["mm-64"])
    assert summary["measured"] == 4 and summary["failed"] == 0
    recs = list(records.iter_records(paths.records_dir("rpc-loop")))
    assert len(recs) == 4 and all(0 < r.latency < 1 for r in recs)


def test_a_missing_key_or_an_unreachable_tracker_stops_before_any_work(params, tracker):
    p = with_devices(params, **{"rpc-nokey": _rpc_device(tracker.port, "other"),
                                "rpc-down": _rpc_device(1)})
    with pytest.raises(CaloError, match="has no server with key 'other'"):
        make_runner(p.device("rpc-nokey"), p.harvest)
    with pytest.raises(CaloError, match="127.0.0.1:1 unreachable"):
        make_runner(p.device("rpc-down"), p.harvest)
    assert not paths.records_dir("rpc-nokey").exists()
    assert not paths.records_dir("rpc-down").exists()
