"""The runner's side of the switch-queue emulator (``testbed.switchq.emulator``, its own process):
its configuration, start and stop, here or on a server of a split fabric, and the merged
report of a split fabric's emulators."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from typing import Dict, List, Optional

from ..base.errors import FabricError
from ..base.ledger import Ledger
from ..base.procutil import log_tail, read_line, stop_process
from ..fabric.servers import Server
from ..plan.policyrun import PolicyRun
from .contract import EmulatorConfig, EmulatorReport


def merge_reports(reports: List[Optional[EmulatorReport]]) -> EmulatorReport:
    """One report from the emulators of a split fabric (one per server, each with its own
    ports; None: one wrote none): counters and pause figures add up, per-port figures join,
    sampling cost is the worst server's (pure)."""
    reports = [r for r in reports if r is not None]
    if len(reports) <= 1:
        return reports[0] if reports else EmulatorReport(servers=0)
    first = reports[0]
    counters: Dict[str, int] = {}
    lanes: Dict[str, dict] = {}
    histogram: Dict[str, int] = {}
    for r in reports:
        for k, v in r.counters.items():
            counters[k] = counters.get(k, 0) + v
        for name, lane in r.lanes.items():
            into = lanes.setdefault(name, dict(lane, holds=0, held_ms=0.0))
            into["holds"] += lane["holds"]
            into["held_ms"] = round(into["held_ms"] + lane["held_ms"], 3)
        for bucket, count in (r.forwarding_histogram or {}).items():
            histogram[bucket] = histogram.get(bucket, 0) + count

    def joined(key: str) -> dict:
        out: dict = {}
        for r in reports:
            out.update(getattr(r, key))
        return out

    def total(key: str, digits: Optional[int] = None):
        value = sum(getattr(r, key) for r in reports)
        return value if digits is None else round(value, digits)

    return dataclasses.replace(
        first, counters=counters, max_backlog=joined("max_backlog"), ecn=joined("ecn"),
        pfc=joined("pfc"), credit=joined("credit"), gpu_pauses_ns=joined("gpu_pauses_ns"),
        pfc_pause_events=total("pfc_pause_events"), pfc_paused_ms=total("pfc_paused_ms", 3),
        credit_waits=total("credit_waits"), credit_wait_ms=total("credit_wait_ms", 3),
        sample_ms={k: max(r.sample_ms.get(k, 0.0) for r in reports)
                   for k in ("mean", "p99", "max", "max_gap")},
        scheduling=", ".join(sorted({r.scheduling for r in reports})),
        lanes=lanes, forwarding_histogram=histogram if any(
            r.forwarding_histogram is not None for r in reports) else None,
        forwarding_note=next((r.forwarding_note for r in reversed(reports)
                              if r.forwarding_note), None),
        servers=len(reports))


class EmulatorProcess:
    """The runner's handle on one ``python -m testbed.switchq.emulator`` process: here, or on
    a remote server of a split fabric (started over ssh, its files in that server's
    workspace)."""

    def __init__(self, run: PolicyRun, session, run_dir: str, private_dir: str, ledger: Ledger,
                 server: Server):
        scenario, policy, plan = run.scenario, run.policy, run.plan
        t = scenario.topology
        fabric = session.fabric
        self.server, self.fabric = server, fabric
        at = server.tag
        self.report_path = os.path.join(run_dir, f"switchq-{run.name}{at}.json")
        self.timeline_path = os.path.join(run_dir, f"switchq-{run.name}{at}.timeline.csv")
        self.log_path = os.path.join(run_dir, f"switchq-{run.name}{at}.log")
        watch = policy.watched_ports() if policy.wants_queue_load else None
        self.cfg = EmulatorConfig(
            plan=plan, classes=run.classes,
            host_pids={h.name: fabric.netns_pid(h.name) for h in plan.hosts},
            # on another server its files live in its workspace, and the controller's events
            # reach it through a tunnel
            interval_us=scenario.sample_interval_us, events=fabric.events_socket(server),
            out=server.place(self.report_path), timeline=server.place(self.timeline_path),
            host_rate_mbit=t.host_rate_mbit, fabric_rate_mbit=t.fabric_rate_mbit,
            nic_queue_bytes=t.nic_queue_bytes,
            switch_rate_headroom=scenario.emulation.switch_rate_headroom,
            delayed=tuple(fabric.delayed_interfaces()), ecn_marking=run.marking,
            # the acting class's backlog from kernel counters, where the kernel runs them,
            # every queue's far end is on this server and no delay line holds frames
            # between the counted ends
            queue_counting=("bpf" if fabric.caps.bpf_marking and not run.placement
                            and not fabric.delayed_interfaces() else "netlink"),
            marking_via=run.marking_via or "openflow", mtu=run.link_mtu,
            watch={d: tuple(p) for d, p in watch.items()} if watch else None)
        if run.placement:  # a split fabric: this server's switches and hosts only
            mine = tuple(n for n, s in run.placement.items() if s == server.name)
            listen, peers = fabric.pfc_sockets(server)
            self.cfg = dataclasses.replace(
                self.cfg, nodes=mine,
                host_pids={h: p for h, p in self.cfg.host_pids.items() if h in mine},
                server=server.name, owner=dict(run.placement), pfc_listen=listen, pfc_peers=peers)
        self.cfg_path = os.path.join(private_dir, f"switchq-{run.name}{at}.json")
        self.ledger = ledger
        self.proc = None
        self.interval_us = 0  # what it samples, once started: how often, for which classes
        self.acting: List[str] = []

    def start(self, timeout: float = 20.0) -> None:
        server = self.server
        with open(self.cfg_path, "w", encoding="utf-8") as f:
            json.dump(self.cfg.to_dict(), f)
        argv = [sys.executable, "-m", "testbed.switchq.emulator", server.send(self.cfg_path)]
        log = open(self.log_path, "ab")
        try:
            self.proc = server.spawn(argv, timeout, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=log)
        except FabricError as e:
            raise FabricError(f"the switch-queue emulator did not start: {e}; "
                              f"{self.tail()}") from None
        finally:
            log.close()
        self.ledger.add_pid(self.proc.pid)
        line = read_line(self.proc.stdout, timeout).split()
        if len(line) != 3 or line[0] != "ready":
            self.stop()
            raise FabricError(f"the switch-queue emulator did not start: {self.tail()}")
        self.interval_us = int(line[1])
        self.acting = [] if line[2] == "-" else line[2].split(",")

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise FabricError(f"the switch-queue emulator died (exit code "
                                  f"{self.proc.returncode}): {self.tail()}")

    def tail(self) -> str:
        return log_tail(self.log_path)

    def stop(self) -> Optional[EmulatorReport]:
        """Stop it; returns its report (None if it wrote none)."""
        if self.proc is None:
            return None
        self.server.terminate(self.proc)  # on another server: SIGTERM there, files written
        stop_process(self.proc, timeout=10)
        if self.proc.stdout:
            self.proc.stdout.close()
        try:
            self.server.fetch(self.cfg.out, self.report_path)
            self.server.fetch(self.cfg.timeline, self.timeline_path)
        except FabricError:
            return None
        try:
            with open(self.report_path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return None
        return EmulatorReport.from_dict(data)


class Emulators:
    """The queue emulators of a fabric: one, or one per server of a split fabric."""

    def __init__(self, procs: List[EmulatorProcess]):
        self.procs = procs

    def start(self) -> None:
        for p in self.procs:
            p.start()

    def check_alive(self) -> None:
        for p in self.procs:
            p.check_alive()

    def describe(self) -> str:
        p = self.procs[0]
        if p.acting:
            return (f"switch-queue emulator sampling every {p.interval_us:,} us "
                    f"(class {', '.join(p.acting)} acts on samples)")
        return (f"switch-queue emulator sampling every {p.interval_us:,} us (nothing acts on "
                "samples: the queue timeline only)")

    def local_pids(self) -> List[int]:
        """The emulators running on this machine (for the cost meter)."""
        return [p.proc.pid for p in self.procs if p.proc is not None and p.server.local]

    def stop(self) -> EmulatorReport:
        return merge_reports([p.stop() for p in self.procs])
