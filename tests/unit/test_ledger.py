import json

import pytest

from testbed.base.errors import RunBusyError
from testbed.base.ledger import Ledger, clean, read_record


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
    from testbed.base.ledger import remove_resources
    w = tmp_path / "wmem_default"
    w.write_text("5242880")  # the runner was killed while the value was raised
    record = {"run_id": None, "pids": {}, "interfaces": [], "bridges": [],
              "sysctls": {str(w): [212992, 5242880]}}
    removed = remove_resources(record)
    assert w.read_text() == "212992"
    assert removed == [f"setting {w} = 5242880 (restored 212992)"]
    assert remove_resources(record) == []  # already restored: nothing to undo


def test_undo_commands_run_newest_first_per_tag_and_after_a_kill(tmp_path):
    from testbed.base.ledger import remove_resources
    log = tmp_path / "log"
    ledger = Ledger("run-u", state_dir=str(tmp_path))
    ledger.acquire("/r")
    try:
        ledger.add_undo("rxe-a", f"echo first >> {log}")
        ledger.add_undo("rxe-a", f"echo second >> {log}")
        ledger.add_undo("rxe-b", f"echo other >> {log}")
        ledger.add_undo("rxe-a", "false")
        assert ledger.undo("rxe-a") == ["false"]  # the failures, for a warning
        assert log.read_text().split() == ["second", "first"]
        # what is left is in the record: a killed run's clean undoes it
        record = read_record(str(tmp_path))
        assert record["undo"] == [["rxe-b", f"echo other >> {log}"]]
        assert remove_resources(record) == [f"undone: echo other >> {log}"]
        assert log.read_text().split() == ["second", "first", "other"]
    finally:
        ledger.close()


def test_a_setting_restored_early_is_forgotten(tmp_path):
    s = tmp_path / "rp_filter"
    s.write_text("0")  # the run set it from 2
    ledger = Ledger("run-s", state_dir=str(tmp_path))
    ledger.acquire("/r")
    try:
        ledger.add_sysctl(str(s), 2, 0)
        ledger.restore_sysctl(str(s))
        assert s.read_text() == "2" and read_record(str(tmp_path))["sysctls"] == {}
        ledger.restore_sysctl(str(s))  # twice: nothing more
        assert s.read_text() == "2"
    finally:
        ledger.close()
