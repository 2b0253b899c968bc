"""Start the GPU traffic agents in their hosts' namespaces and follow them to the end.

``agent_configs`` (pure) says what each agent does; ``AgentGroup`` starts ``python -m
traffic.agent`` inside each Mininet host, waits until all are ready, gives them one common start
time, reports progress from their ``iter`` lines and fails with the agent's name and last log
line if one dies or stalls.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from typing import Callable, Dict, List

from .config import Scenario
from .errors import AgentError
from .ledger import Ledger
from .topology import FabricPlan

START_MARGIN_S = 0.2  # agents start together this long after the go


def step_timeout_s(scenario: Scenario) -> float:
    """How long a rank waits for a step's data before giving up on it.

    Explicit in the scenario, or 20 times the time a chunk takes at the host link rate
    (at least 0.5 s): long enough never to fire on a healthy fabric.
    """
    w, t = scenario.workload, scenario.topology
    if w.step_timeout_ms > 0:
        return w.step_timeout_ms / 1000.0
    chunk_bits = w.size_bytes / t.gpus * 8 * 1.1  # ~10% header overhead
    return max(0.5, 20 * chunk_bits / (t.host_rate_mbit * 1e6))


def agent_configs(plan: FabricPlan, scenario: Scenario, out_dir: str) -> List[dict]:
    w = scenario.workload
    timeout = step_timeout_s(scenario)
    peers = [{"rank": h.rank, "host": h.name, "ip": h.ip, "mac": h.mac} for h in plan.hosts]
    return [{"rank": h.rank, "host": h.name, "intf": h.intf, "ip": h.ip, "mac": h.mac,
             "ranks": len(plan.hosts), "collective": w.collective, "size": w.size_bytes,
             "iterations": w.iterations, "mtu": w.mtu, "step_timeout_s": timeout,
             "out_dir": out_dir,
             "peers": [p for p in peers if p["rank"] != h.rank]}
            for h in plan.hosts]


def expected_duration_s(scenario: Scenario) -> float:
    """Rough time of the whole replay at line rate (for timeouts and progress)."""
    w, t = scenario.workload, scenario.topology
    n = t.gpus
    bits = 2 * (n - 1) / n * w.size_bytes * 8 * 1.1 * w.iterations
    return bits / (min(t.host_rate_mbit, t.fabric_rate_mbit) * 1e6)


class AgentGroup:
    def __init__(self, fabric, plan: FabricPlan, scenario: Scenario, records_dir: str,
                 log_dir: str, ledger: Ledger, tag: str):
        self.fabric, self.plan, self.scenario = fabric, plan, scenario
        self.records_dir, self.log_dir, self.ledger, self.tag = records_dir, log_dir, ledger, tag
        self.procs: Dict[str, subprocess.Popen] = {}
        self.lines: Dict[str, str] = {}

    def start(self, ready_timeout: float = 30.0) -> None:
        os.makedirs(self.records_dir, exist_ok=True)
        for cfg in agent_configs(self.plan, self.scenario, self.records_dir):
            path = os.path.join(self.records_dir, f"{cfg['host']}.agent.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(cfg, f)
            log = open(os.path.join(self.log_dir, f"agent-{self.tag}-{cfg['host']}.log"), "ab")
            try:
                proc = self.fabric.host(cfg["host"]).popen(
                    [sys.executable, "-m", "traffic.agent", path], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=log, cwd=os.getcwd())
            finally:
                log.close()
            self.procs[cfg["host"]] = proc
            self.ledger.add_pid(proc.pid)
        self._expect_all("ready", ready_timeout)

    def go(self) -> None:
        start_ns = time.time_ns() + int(START_MARGIN_S * 1e9)
        for host, proc in self.procs.items():
            try:
                proc.stdin.write(f"go {start_ns}\n".encode())
                proc.stdin.flush()
            except BrokenPipeError:
                self._died(host)

    def wait(self, timeout: float, on_iteration: Callable[[int], None] = lambda i: None,
             alive: Callable[[], None] = lambda: None) -> None:
        """Follow the agents until all print ``done``; ``alive`` checks the controller."""
        deadline = time.monotonic() + timeout
        pending = set(self.procs)
        reported = -1
        iters: Dict[str, int] = {h: -1 for h in self.procs}
        while pending:
            alive()
            if time.monotonic() > deadline:
                slow = ", ".join(sorted(pending))
                raise AgentError(f"agents did not finish within {timeout:.0f} s: {slow}")
            for host, line in self._read_lines(pending, 0.2):
                if line == "done":
                    pending.discard(host)
                elif line.startswith("iter "):
                    iters[host] = int(line.split()[1])
                    slowest = min(iters.values())
                    if slowest > reported:
                        reported = slowest
                        on_iteration(slowest)
        for host, proc in self.procs.items():
            if proc.wait(timeout=10) != 0:
                self._died(host)

    def _expect_all(self, word: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = set(self.procs)
        while pending:
            if time.monotonic() > deadline:
                raise AgentError(f"agents not {word} after {timeout:.0f} s: "
                                 f"{', '.join(sorted(pending))}")
            for host, line in self._read_lines(pending, 0.2):
                if line == word:
                    pending.discard(host)

    def _read_lines(self, hosts, timeout: float):
        """Yield (host, line) for complete stdout lines; raise if an agent exited early."""
        fds = {self.procs[h].stdout.fileno(): h for h in hosts}
        ready, _, _ = select.select(list(fds), [], [], timeout)
        for fd in ready:
            host = fds[fd]
            chunk = os.read(fd, 4096)
            if not chunk:
                self._died(host)
            buf = self.lines.get(host, "") + chunk.decode(errors="replace")
            *complete, rest = buf.split("\n")
            self.lines[host] = rest
            for line in complete:
                yield host, line.strip()

    def _died(self, host: str) -> None:
        proc = self.procs[host]
        try:
            code = proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            code = None
        log = os.path.join(self.log_dir, f"agent-{self.tag}-{host}.log")
        try:
            with open(log, encoding="utf-8", errors="replace") as f:
                last = (f.read().strip().splitlines() or ["(empty log)"])[-1]
        except OSError:
            last = "(no log)"
        raise AgentError(f"traffic agent on {host} died (exit code {code}): {last}")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 5
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
            for stream in (proc.stdin, proc.stdout):
                if stream:
                    stream.close()
