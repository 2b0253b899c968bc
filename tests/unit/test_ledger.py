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


def test_teardown_restores_a_setting_the_run_left_raised(tmp_path):
    from testbed.ledger import remove_resources
    w = tmp_path / "wmem_default"
    w.write_text("5242880")  # the runner was killed while the value was raised
    record = {"run_id": None, "pids": {}, "interfaces": [], "bridges": [],
              "sysctls": {str(w): [212992, 5242880]}}
    removed = remove_resources(record)
    assert w.read_text() == "212992"
    assert removed == [f"setting {w} = 5242880 (restored 212992)"]
    assert remove_resources(record) == []  # already restored: nothing to undo
