"""Faults a run must survive: interrupts in every phase, a dead controller or agent, a second
run at once. Each ends with a clear message, the results kept, and nothing left behind."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from traffic.contract import AgentConfig

from .leftovers import processes, wait_clean
from .runs import results_of, wait_for_line

pytestmark = pytest.mark.integration


def pid_of(*markers):
    """The one process whose command line holds every marker."""
    found = [pid for pid, cmd in processes() if all(m in cmd for m in markers)]
    assert len(found) == 1, f"{markers}: {found}"
    return found[0]


def finish(proc, timeout=60):
    t0 = time.monotonic()
    out, err = proc.communicate(timeout=timeout)
    return out, err, time.monotonic() - t0


def test_interrupt_while_the_controller_starts(run_process, tmp_path):
    proc = run_process(tmp_path, "--iterations", "200")
    wait_for_line(proc, "starting the controller")
    proc.send_signal(signal.SIGINT)
    _out, err, took = finish(proc)
    assert proc.returncode == 130, err
    assert took < 10 and "Traceback" not in err
    assert results_of(tmp_path)["status"] == "incomplete"
    assert wait_clean() == []


def test_interrupt_while_the_report_is_drawn(run_process, tmp_path):
    proc = run_process(tmp_path, "--iterations", "1", "--policy", "hyperscale,lossless")
    wait_for_line(proc, "drawing plots", timeout=180)
    proc.send_signal(signal.SIGINT)
    _out, err, took = finish(proc)
    assert proc.returncode == 130, err
    assert took < 10 and "Traceback" not in err
    res = results_of(tmp_path)
    assert res["status"] == "incomplete" and "report.html" in res["error"]
    assert set(res["policies"]) == {"hyperscale", "lossless"}  # every measurement kept
    (run_id,) = os.listdir(tmp_path)
    report = tmp_path / run_id / "report.html"
    assert not report.exists() or report.read_text().endswith("</html>\n")  # never half
    assert wait_clean() == []
    redraw = subprocess.run([sys.executable, "-m", "testbed", "report", str(tmp_path / run_id)],
                            capture_output=True, text=True, timeout=120)
    assert redraw.returncode == 0 and report.read_text().endswith("</html>\n")


def served_by(pid):
    """The GPU hosts an agent process serves, from the config file on its command line (how
    many processes serve a fabric depends on the rate this machine runs it at)."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        path = f.read().split(b"\0")[-2].decode()
    with open(path, encoding="utf-8") as f:
        return [gpu.host for gpu in AgentConfig.from_dict(json.load(f)).gpus]


@pytest.mark.parametrize("victim, markers", [
    ("controller", ("controllers.launcher",)),
    ("agent", ("traffic.agent", "agent-hyperscale-1.json")),
])
def test_a_process_dying_mid_traffic_fails_the_run_naming_it(run_process, tmp_path, victim,
                                                             markers):
    proc = run_process(tmp_path, "--iterations", "200", "--policy", "hyperscale")
    wait_for_line(proc, "iteration 2/")
    pid = pid_of(*markers)
    message = (f"traffic agent of {', '.join(served_by(pid))} died" if victim == "agent"
               else "the hyperscale controller died")
    assert victim == "controller" or "gpu1" in message
    os.kill(pid, signal.SIGKILL)
    _out, err, took = finish(proc)
    assert proc.returncode == 1, err
    assert message in err and "Traceback" not in err, err
    assert took < 30, f"{victim}: took {took:.1f} s to fail"
    res = results_of(tmp_path)
    assert res["status"] == "failed" and message in res["error"]
    assert wait_clean() == []


def test_a_second_run_is_refused_and_the_first_is_untouched(run_process, tmp_path):
    first = run_process(tmp_path / "a", "--iterations", "4", "--policy", "hyperscale")
    wait_for_line(first, "iteration 1/")
    second = subprocess.run([sys.executable, "-m", "testbed", "run", "--out",
                             str(tmp_path / "b")], capture_output=True, text=True, timeout=60)
    assert second.returncode == 1
    assert f"another testbed run is active (pid {first.pid}" in second.stderr
    assert not (tmp_path / "b").exists() or not os.listdir(tmp_path / "b")
    _out, err, _took = finish(first, timeout=300)
    assert first.returncode == 0, err
    res = results_of(tmp_path / "a")
    assert res["status"] == "complete"
    hs = res["policies"]["hyperscale"]
    assert hs["drops"] == 0 and hs["packets_received"] == hs["packets_sent"]
    assert wait_clean() == []
