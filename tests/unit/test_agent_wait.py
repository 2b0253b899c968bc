"""How long the runner waits for its agent processes to say "ready" (or "done"): as long as
they use CPU time (a slow machine still starting them), not once they stand still."""
import subprocess
import sys
import time

import pytest

from testbed.run.agent_processes import AgentGroup
from testbed.base.errors import AgentError


def group(tmp_path, **scripts):
    run = type("Run", (), {"plan": None, "scenario": None})()
    g = AgentGroup(None, run, str(tmp_path), str(tmp_path), None, "t")
    for name, code in scripts.items():
        g.procs[name] = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        g.hosts_of[name] = [f"{name}-host"]
    return g


BUSY_THEN_READY = ("import time\nend = time.monotonic() + 3\n"
                   "while time.monotonic() < end: pass\nprint('ready', flush=True)\n"
                   "time.sleep(30)")
IDLE = "import time\ntime.sleep(30)"


def stop(g):
    for p in g.procs.values():
        p.kill()
        p.wait()


def test_an_agent_busy_for_longer_than_the_wait_is_still_waited_for(tmp_path):
    g = group(tmp_path, a=BUSY_THEN_READY)
    try:
        t0 = time.monotonic()
        g._expect_all("ready", 1.5)  # 3 s of CPU before "ready": busy, so not stuck
        assert time.monotonic() - t0 >= 2.5
    finally:
        stop(g)


def test_an_agent_that_stands_still_is_named_after_the_wait(tmp_path):
    g = group(tmp_path, a=BUSY_THEN_READY, b=IDLE)
    try:
        t0 = time.monotonic()
        with pytest.raises(AgentError, match=r"not ready after \d+ s \(no CPU time used for 1 s\)"
                                             r": b-host$"):
            g._expect_all("ready", 1.0)
        assert time.monotonic() - t0 < 10
    finally:
        stop(g)


def test_an_agent_busy_for_ever_is_given_up_on(tmp_path):
    g = group(tmp_path, a="while True: pass")
    try:
        with pytest.raises(AgentError, match=r"still busy after \d+ s\): a-host"):
            g._expect_all("ready", 0.5)  # 10 x 0.5 s
    finally:
        stop(g)
