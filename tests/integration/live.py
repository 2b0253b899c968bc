"""A live fabric under one policy, with its switch-queue emulator, for mechanism tests.

The same code paths as a run (``runner.fabric_up``, ``runner.queue_emulation``); traffic comes
from ``traffic.flows`` processes inside the GPU hosts.
"""
import contextlib
import json
import os
import select
import subprocess
import sys
import time

from testbed.plan.checks import check_scenario
from testbed.run import runner
from testbed.fabric.capabilities import detect
from testbed.scenario import config
from testbed.base.ledger import Ledger
from testbed.fabric.queues import egress_stats
from testbed.plan.policyrun import decide
from testbed.base.topology import FabricPlan
from traffic.contract import FlowConfig

# Integration tests run at the reference rate their figures were set for, not at the rate this
# machine's calibration would choose (test_timescale.py covers auto). A run the fidelity
# monitor rejects goes again slower, as at auto: CI's two CPUs are shared, and a passing load
# can saturate them at any rate (results then in modelled time, or at the run's own scale).
DEFAULT = config.DEFAULT.for_checks().override({"emulation": {"attempts": 3}})

GO_LEAD_NS = 100_000_000  # time for the go lines to reach every held sender


class Live:
    def __init__(self, run, session, emu, queues, ledger, tmp):
        self.policy, self.plan, self.scenario = run.policy, run.plan, run.scenario
        self.session, self.emu, self.queues, self.ledger, self.tmp = (
            session, emu, queues, ledger, tmp)
        self.count = 0

    def host(self, name):
        return self.plan.host(name)

    def _start(self, host, mode, fields, held=False):
        self.count += 1
        path = os.path.join(self.tmp, f"{mode}-{host}-{self.count}.json")
        cfg = FlowConfig(out=path + ".out", start="stdin" if held else "", **fields)
        with open(path, "w") as f:
            json.dump(cfg.to_dict(), f)
        proc = self.session.fabric.host(host).popen(
            [sys.executable, "-m", "traffic.flows", mode, path], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, stdin=subprocess.PIPE if held else None)
        self.ledger.add_pid(proc.pid)
        flow = Flow(proc, cfg.out)
        if held or mode == "recv":
            flow.ready()
        return flow

    def recv(self, host, duration_s=120):
        return self._start(host, "recv", {"ip": self.host(host).ip, "duration_s": duration_s})

    def send(self, src, dst, held=False, **flow):
        """Start a sender. ``held``: loaded, then waiting for ``go`` - senders that must
        overlap start together that way (a Python start takes long on a loaded machine)."""
        s, d = self.host(src), self.host(dst)
        cfg = {"intf": s.intf, "src_mac": s.mac, "src_ip": s.ip, "dst_mac": d.mac,
               "dst_ip": d.ip}
        cfg.update(flow)
        return self._start(src, "send", cfg, held)

    @staticmethod
    def go(*flows, at_ns=None):
        """Start held senders at one time: ``at_ns`` or just after now; returns that time."""
        start = at_ns or time.time_ns() + GO_LEAD_NS
        for flow in flows:
            flow.go(start)
        return start

    def port_packets(self):
        """Packets that left each switch port so far (all classes)."""
        return {intf: v["packets"] for intf, v in egress_stats(self.session.fabric).items()}

    def stop_queues(self):
        """Stop the switch-queue emulator; returns its report (``EmulatorReport``)."""
        self.queues.report = self.emu.stop()
        return self.queues.report


class Flow:
    def __init__(self, proc, out):
        self.proc, self.out = proc, out

    def ready(self):
        ready, _, _ = select.select([self.proc.stdout], [], [], 20)
        assert ready and self.proc.stdout.readline().strip() == b"ready", self.proc.stderr.read()

    def go(self, start_ns):
        self.proc.stdin.write(f"go {start_ns}\n".encode())
        self.proc.stdin.flush()

    def wait(self, timeout=120):
        _o, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err.decode()
        with open(self.out) as f:
            return json.load(f)

    def stop(self, timeout=30):
        self.proc.terminate()
        return self.wait(timeout)


@contextlib.contextmanager
def held_ledger(tmp_path):
    """A run's ledger, for a test that drives the runner's pieces itself; everything it
    recorded is torn down at the end, whatever happened."""
    ledger = Ledger(runner.new_run_id())
    ledger.acquire(str(tmp_path))
    try:
        yield ledger
    finally:
        ledger.teardown()
        ledger.close()


@contextlib.contextmanager
def fabric_session(scenario, policy_name, tmp_path, progress=lambda message: None):
    """``runner.fabric_up`` for one policy of ``scenario``: yields (its run as decided,
    session, ledger)."""
    caps = detect()
    run = decide(policy_name, check_scenario(scenario), scenario, caps)
    with held_ledger(tmp_path) as ledger, \
            runner.fabric_up(run, caps, str(tmp_path), ledger, progress) as session:
        yield run, session, ledger


@contextlib.contextmanager
def live(policy_name, tmp_path, **changes):
    scenario = DEFAULT.override(changes)
    t = scenario.topology
    plan = FabricPlan.for_topology(t)  # no collective: any tenants
    caps = detect()
    run = decide(policy_name, plan, scenario, caps)
    with held_ledger(tmp_path) as ledger, \
            runner.fabric_up(run, caps, str(tmp_path), ledger) as session, \
            runner.queue_emulation(run, session, str(tmp_path), ledger) as (emu, queues):
        yield Live(run, session, emu, queues, ledger, str(tmp_path))


def summary(result, kind="roce"):
    """packets, CE marks and latencies summed over the flows of one kind."""
    flows = [f for name, f in result["flows"].items() if name.startswith(kind)]
    latency = sorted(v for f in flows for v in f["latency_us"])
    return {"packets": sum(f["packets"] for f in flows), "ce": sum(f["ce"] for f in flows),
            "latency_us": latency}


def percentile(values, q):
    return values[min(len(values) - 1, int(len(values) * q))]
