import json

import pytest

from testbed.errors import RunBusyError
from testbed.ledger import Ledger, clean, read_record


def test_second_run_is_refused_while_the_first_holds_the_lock(tmp_path):
    first = Ledger("run-a", state_dir=str(tmp_path))
    first.acquire("/results/a")
    try:
        with pytest.raises(RunBusyError, match="another testbed run is active"):
            Ledger("run-b", state_dir=str(tmp_path)).acquire()
        with pytest.raises(RunBusyError, match="clean only removes"):
            clean(str(tmp_path))
    finally:
        first.close()
    second = Ledger("run-b", state_dir=str(tmp_path))
    second.acquire()
    second.close()


def test_the_record_names_everything_before_it_is_created(tmp_path):
    ledger = Ledger("run-x", state_dir=str(tmp_path))
    ledger.acquire("/r")
    ledger.add(bridges=["lf1"], interfaces=["lf1-eth1", "lf1-eth2"])
    ledger.add(interfaces=["lf1-eth1"])
    record = read_record(str(tmp_path))
    assert record["run_id"] == "run-x" and record["bridges"] == ["lf1"]
    assert record["interfaces"] == ["lf1-eth1", "lf1-eth2"]
    ledger.close()
    assert read_record(str(tmp_path)) is None
    assert json.loads((tmp_path / "lock").read_text() or "{}") == {}
