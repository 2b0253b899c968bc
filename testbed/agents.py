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
from .procutil import stop_processes
from .topology import FabricPlan

START_MARGIN_S = 0.2  # agents start together this long after the go
MAX_RTO_FACTOR = 8  # the retransmission timeout backs off up to this multiple


def congestion_control(scenario: Scenario, policy) -> str:
    """``dcqcn`` or ``none``: the scenario's choice, or the policy's default for ``auto``."""
    cc = scenario.transport.congestion_control
    return policy.default_congestion_control if cc == "auto" else cc


def transport_config(scenario: Scenario, policy) -> dict:
    """The NIC settings every agent of a run gets (RC, congestion control, entropy)."""
    tr = scenario.transport
    cc = congestion_control(scenario, policy)
    rto_ns = int(tr.rto_ms * 1e6)
    roce_dscp, cnp_dscp = policy.dscp()
    return {"congestion_control": cc, "qps_per_peer": tr.qps_per_peer, "entropy": tr.entropy,
            "ack_every": tr.ack_every, "rto_ns": rto_ns, "max_rto_ns": MAX_RTO_FACTOR * rto_ns,
            "retry_limit": tr.retry_limit,
            "reorder_ns": rto_ns // 2 if tr.entropy == "per-packet" else 0,
            "dcqcn_timer_ns": int(tr.dcqcn_timer_ms * 1e6),
            "dcqcn_byte_counter": tr.dcqcn_byte_counter,
            "cnp_interval_ns": int(tr.cnp_interval_ms * 1e6),
            "roce_tos": (roce_dscp << 2) | 0b10, "ack_tos": roce_dscp << 2,
            "cnp_tos": cnp_dscp << 2}


def workload_specs(scenario: Scenario, plan) -> List[dict]:
    """The collectives each agent replays: one entry per size (a sweep has several)."""
    w = scenario.workload
    return [{"collective": w.collective, "size": size, "iterations": w.iterations,
             "chunks": w.chunks, "group": plan.gpus_per_leaf} for size in w.run_sizes]


def agent_configs(plan: FabricPlan, scenario: Scenario, out_dir: str, policy) -> List[dict]:
    w = scenario.workload
    transport = transport_config(scenario, policy)
    workloads = workload_specs(scenario, plan)
    peers = [{"rank": h.rank, "host": h.name, "ip": h.ip, "mac": h.mac} for h in plan.gpus]
    st = w.stragglers
    straggler = {"delay_ns": int(st.delay_ms * 1e6), "distribution": st.distribution,
                 "probability": st.probability}
    return [{"rank": h.rank, "host": h.name, "intf": h.intf, "ip": h.ip, "mac": h.mac,
             "ranks": len(plan.gpus), "workloads": workloads, "mtu": w.mtu,
             "compute": {"ns": int(w.compute_ms * 1e6),
                         "jitter_ns": int(w.compute_jitter_ms * 1e6)},
             "straggler": straggler if h.rank in st.ranks else None, "seed": w.seed,
             "transport": transport,
             "link_rate_bps": scenario.topology.host_rate_mbit * 1e6, "out_dir": out_dir,
             "peers": [p for p in peers if p["rank"] != h.rank]}
            for h in plan.gpus]


def expected_duration_s(scenario: Scenario) -> float:
    """Rough time of the whole replay at line rate, compute phases and stragglers included
    (for timeouts and progress)."""
    w, t = scenario.workload, scenario.topology
    n = t.gpus
    per_byte = (n - 1) / n if w.collective == "all_to_all" else 2 * (n - 1) / n
    bits = sum(per_byte * size * 8 * 1.1 for size in w.run_sizes) * w.iterations
    wire = bits / (min(t.host_rate_mbit, t.fabric_rate_mbit) * 1e6)
    st = w.stragglers
    late = st.delay_ms * (3 if st.distribution == "exponential" else 2) if st.ranks else 0.0
    compute = (w.compute_ms + w.compute_jitter_ms + late) / 1000.0
    return wire + compute * w.iterations * len(w.run_sizes)


def finish_timeout_s(scenario: Scenario) -> float:
    """How long a run waits for its agents: generous for slow emulation (10x the line-rate
    estimate) plus one QP's worst recovery (every retry at the longest timeout)."""
    tr = scenario.transport
    worst_recovery = tr.retry_limit * MAX_RTO_FACTOR * tr.rto_ms / 1000.0
    return 30 + 10 * expected_duration_s(scenario) + worst_recovery


class AgentGroup:
    def __init__(self, fabric, policy, scenario: Scenario, records_dir: str,
                 log_dir: str, ledger: Ledger, tag: str):
        self.fabric, self.policy, self.plan, self.scenario = fabric, policy, policy.plan, scenario
        self.records_dir, self.log_dir, self.ledger, self.tag = records_dir, log_dir, ledger, tag
        self.procs: Dict[str, subprocess.Popen] = {}
        self.lines: Dict[str, str] = {}
        self.remote: Dict[str, tuple] = {}  # host -> (server, records dir there)

    def start(self, ready_timeout: float = 30.0) -> None:
        os.makedirs(self.records_dir, exist_ok=True)
        for cfg in agent_configs(self.plan, self.scenario, self.records_dir, self.policy):
            path = os.path.join(self.records_dir, f"{cfg['host']}.agent.json")
            server = self.fabric.server_of(cfg["host"])
            if server != "localhost":  # the agent runs there: its files live there
                cfg["out_dir"] = self.fabric.workspace.dir(server) + "/records"
                self.remote[cfg["host"]] = (server, cfg["out_dir"])
            with open(path, "w", encoding="utf-8") as f:
                json.dump(cfg, f)
            if server != "localhost":
                path = self.fabric.workspace.put(server, path)
            log = open(os.path.join(self.log_dir, f"agent-{self.tag}-{cfg['host']}.log"), "ab")
            try:
                proc = self.fabric.popen(
                    cfg["host"], [sys.executable, "-m", "traffic.agent", path],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=log, cwd=os.getcwd())
            finally:
                log.close()
            self.procs[cfg["host"]] = proc
            self.ledger.add_pid(proc.pid)
        self._expect_all("ready", ready_timeout)

    @property
    def iterations(self) -> int:
        """Iterations each agent replays (over all sizes of a sweep)."""
        return self.scenario.workload.iterations * len(self.scenario.workload.run_sizes)

    def go(self) -> int:
        """Tell every agent when to start; returns that time (ns since the epoch)."""
        start_ns = time.time_ns() + int(START_MARGIN_S * 1e9)
        for host, proc in self.procs.items():
            try:
                proc.stdin.write(f"go {start_ns}\n".encode())
                proc.stdin.flush()
            except BrokenPipeError:
                self._died(host)
        return start_ns

    def wait(self, timeout: float, on_iteration: Callable[[int], None] = lambda i: None,
             alive: Callable[[], None] = lambda: None) -> None:
        """Follow the agents until all have ``finished``, then ``collect`` their records."""
        self.wait_finished(timeout, on_iteration, alive)
        self.collect()

    def wait_finished(self, timeout: float, on_iteration: Callable[[int], None] = lambda i: None,
                      alive: Callable[[], None] = lambda: None) -> None:
        """Follow the agents until every one has ``finished`` its collectives (they keep
        answering their peers until told to stop). ``alive`` checks the controller and the
        queue emulator."""
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
                if line == "finished":
                    pending.discard(host)
                elif line.startswith("iter "):
                    iters[host] = int(line.split()[1])
                    slowest = min(iters.values())
                    if slowest > reported:
                        reported = slowest
                        on_iteration(slowest)

    def collect(self) -> None:
        """Tell the agents to ``stop``; wait until they wrote their records (``done``)."""
        for host, proc in self.procs.items():
            try:
                proc.stdin.write(b"stop\n")
                proc.stdin.flush()
            except BrokenPipeError:
                self._died(host)
        self._expect_all("done", 60.0)
        for host, proc in self.procs.items():
            if proc.wait(timeout=10) != 0:
                self._died(host)
        for host, (server, out_dir) in self.remote.items():  # records back to this machine
            self.fabric.workspace.get(server, f"{out_dir}/{host}.*", self.records_dir)

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
        stop_processes(list(self.procs.values()))
