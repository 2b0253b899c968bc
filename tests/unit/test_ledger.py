import json
import os

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


def test_a_dead_runs_record_is_never_overwritten_and_clean_uses_it(tmp_path):
    """A run killed with -9 leaves its record; the next run (or a test's fixture) takes the
    lock but refuses, naming clean, and leaves the record for clean to use."""
    dead = Ledger("run-dead", state_dir=str(tmp_path))
    dead.acquire("/r")
    dead.add(interfaces=["tbnot-there"])
    os.close(dead._lock_fd)  # the process died: the kernel released its lock
    dead._lock_fd = None
    with pytest.raises(RunBusyError, match=r"run run-dead, pid \d+\) ended without tearing "
                                           r"down .*'python -m testbed clean'"):
        Ledger("run-next", state_dir=str(tmp_path)).acquire("/r2")
    assert read_record(str(tmp_path))["run_id"] == "run-dead"
    clean(str(tmp_path))
    assert read_record(str(tmp_path)) is None
    nxt = Ledger("run-next", state_dir=str(tmp_path))
    nxt.acquire("/r2")
    nxt.close()


def test_an_interface_is_tagged_by_one_ip_batch_that_skips_absent_names():
    from testbed.base.ledger import interface_tag, tag_command

    cmd = tag_command(["lf1-eth3", "sp1-eth1"], "20261206-1200-ab12")
    assert interface_tag("20261206-1200-ab12") == "ai-fabric-testbed=20261206-1200-ab12"
    assert cmd == ("printf 'link set dev lf1-eth3 alias ai-fabric-testbed=20261206-1200-ab12\\n"
                   "link set dev sp1-eth1 alias ai-fabric-testbed=20261206-1200-ab12\\n' | "
                   "ip -force -batch - >/dev/null 2>&1; true")
