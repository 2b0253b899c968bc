"""Ctrl-C, SIGTERM and kill -9 of a run in the middle of its traffic."""
import signal
import subprocess
import sys
import time

import pytest

from .leftovers import leftovers, wait_clean
from .runs import results_of, wait_for_line

pytestmark = pytest.mark.integration


def start_run(run_process, out_dir, iterations=200):
    return run_process(out_dir, "--iterations", str(iterations))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_mid_traffic_stops_quickly_and_leaves_nothing(run_process, tmp_path, sig):
    proc = start_run(run_process, tmp_path)
    wait_for_line(proc, "iteration 2/")
    t0 = time.monotonic()
    proc.send_signal(sig)
    _out, err = proc.communicate(timeout=30)
    stopped_in = time.monotonic() - t0
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert stopped_in < 15, f"took {stopped_in:.1f} s to stop"
    res = results_of(tmp_path)
    assert res["status"] == "incomplete" and res["finished"]
    assert leftovers() == []


def test_interrupt_while_the_fabric_is_being_built(run_process, tmp_path):
    proc = start_run(run_process, tmp_path)
    wait_for_line(proc, "building fabric")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert results_of(tmp_path)["status"] == "incomplete"
    assert wait_clean() == []


def test_clean_after_kill_9_removes_the_run_and_only_the_run(run_process, tmp_path):
    # Things the testbed did not make, named like things it does.
    subprocess.run(["ovs-vsctl", "add-br", "lf9"], check=True)
    subprocess.run(["ip", "netns", "add", "tbforeign"], check=True)
    try:
        proc = start_run(run_process, tmp_path)
        wait_for_line(proc, "iteration 2/")
        proc.kill()
        proc.wait(timeout=10)
        time.sleep(0.5)
        assert leftovers() != []  # the killed runner could not tear down
        clean = subprocess.run([sys.executable, "-m", "testbed", "clean"], capture_output=True,
                               text=True, timeout=60)
        assert clean.returncode == 0, clean.stderr
        assert "removed bridge lf1" in clean.stdout
        assert wait_clean() == []
        bridges = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True,
                                 text=True).stdout.split()
        assert "lf9" in bridges
        assert "tbforeign" in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                             text=True).stdout
        again = subprocess.run([sys.executable, "-m", "testbed", "clean"], capture_output=True,
                               text=True, timeout=60)
        assert again.stdout.strip() == "nothing to clean"
    finally:
        subprocess.run(["ovs-vsctl", "--if-exists", "del-br", "lf9"])
        subprocess.run(["ip", "netns", "del", "tbforeign"])
