"""Start the GPU traffic agents and follow them to the end.

``agent_configs`` (pure) says what each GPU does; ``process_groups`` (pure) puts the GPUs of
each server into a few agent processes (one per CPU unless the scenario says otherwise);
``AgentGroup`` starts ``python -m traffic.agent`` for each group (it opens every GPU's sockets
in that host's namespace), waits until all are ready, gives them one common start time,
reports progress from their ``iter`` lines and fails naming the hosts of a process that dies
or stalls, with the last line of its log.
"""
from __future__ import annotations

import dataclasses
import json
import os
import select
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

from traffic.contract import (AgentConfig, Compute, GpuConfig, Job, JobFailure, Peer, ScaleUp,
                              Straggler, Transport)

from ..base.errors import AgentError
from ..base.ledger import Ledger
from ..base.procutil import cpu_ticks, log_tail, stop_processes
from ..base.topology import FabricPlan
from ..fabric.capabilities import detect
from ..job.plan import JobPlan, iteration_ns, plan_job
from ..plan.placement import LOCAL
from ..plan.policyrun import PolicyRun, decide
from ..scenario.config import DEFAULT, Scenario

START_MARGIN_S = 0.2  # agents start together this long after the go
STUCK_CAP = 10  # an agent still working towards "ready" or "done" gets at most 10x the wait


def ack_timeout_us(ib_timeout: int) -> float:
    """An RC QP's local ACK timeout (IBTA: 4.096 us x 2^timeout), modelled us."""
    return 4.096 * 2 ** ib_timeout


def retry_budget(run: PolicyRun) -> dict:
    """How long a QP may go without progress before it errors (``retry_limit`` local ACK
    timeouts, modelled), and whether a run can wait that long: beyond ``patience_s`` it
    reports the job stalled instead (the results' ``retry_budget``)."""
    tr, scale = run.scenario.transport, run.time_scale
    budget = tr.retry_limit * ack_timeout_us(tr.ib_timeout)
    patience = patience_s(run) * 1e6 / scale
    return {"ack_timeout_us": round(ack_timeout_us(tr.ib_timeout), 3),
            "retry_limit": tr.retry_limit, "budget_us": round(budget, 3),
            "budget_emulated_s": round(budget * scale / 1e6, 3),
            "stall_limit_us": round(min(budget, patience), 3),
            "reachable": budget <= patience}


def budget_text(budget: dict) -> str:
    """A line for the user: the retry budget, and what happens when a run cannot reach it."""
    text = (f"retry budget: a QP errors after {_seconds(budget['budget_us'] / 1e6)} without "
            f"progress ({budget['retry_limit']} x the {_seconds(budget['ack_timeout_us'] / 1e6)} "
            "local ACK timeout, modelled)")
    if budget["reachable"]:
        return text
    return (text + f" - {_seconds(budget['budget_emulated_s'])} here, more than this run can "
            f"wait: a QP without progress for {_seconds(budget['stall_limit_us'] / 1e6)} "
            "(modelled) is reported as stalled, its outcome unknown")


def _seconds(s: float) -> str:
    for unit, size in (("h", 3600.0), ("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= size:
            return f"{s / size:,.3g} {unit}"
    return f"{s * 1e9:,.3g} ns"


def transport_config(run: PolicyRun) -> Transport:
    """The NIC settings every agent of a run gets (RC, congestion control, entropy)."""
    scenario = run.scenario
    tr = scenario.transport
    rto_ns = scenario.emulated_ns(run.rto_us)
    roce_dscp, cnp_dscp = run.policy.dscp()
    gap = run.policy.flowlet_gap_us()
    return Transport(
        congestion_control=run.congestion_control,
        qps_per_peer=tr.qps_per_peer, entropy=tr.entropy, ack_every=tr.ack_every,
        rto_ns=rto_ns, ack_timeout_ns=scenario.emulated_ns(ack_timeout_us(tr.ib_timeout)),
        retry_limit=tr.retry_limit, stall_ns=int(patience_s(run) * 1e9),
        reorder_ns=rto_ns // 2 if run.policy.reorders_qps() else 0,
        go_back_0=tr.retransmission == "go-back-0",
        dcqcn_timer_ns=scenario.emulated_ns(tr.dcqcn_timer_us),
        dcqcn_byte_counter=tr.dcqcn_byte_counter, dcqcn_clamp_target=tr.dcqcn_clamp_target,
        cnp_interval_ns=scenario.emulated_ns(tr.cnp_interval_us),
        roce_tos=(roce_dscp << 2) | 0b10, ack_tos=roce_dscp << 2, cnp_tos=cnp_dscp << 2,
        qp_limiter=run.qp_limiter, flowlet_gap_ns=scenario.emulated_ns(gap) if gap else 0)


def reference_transport(policy_name: str = "hyperscale") -> Transport:
    """What the ring scenario's agents get under ``policy_name`` at the reference rate
    (for benchmarks that drive an agent without a run)."""
    s = DEFAULT.for_checks()
    return transport_config(decide(policy_name, FabricPlan.for_topology(s.topology), s,
                                   detect()))


def agent_configs(run: PolicyRun, out_dir: str) -> List[GpuConfig]:
    scenario, plan = run.scenario, run.plan
    w = scenario.workload
    transport = transport_config(run)
    path = run.path_delay
    st = w.stragglers
    straggler = Straggler(scenario.emulated_ns(st.delay_us), st.distribution, st.probability)
    compute = Compute(scenario.emulated_ns(w.compute_us), scenario.emulated_ns(w.compute_jitter_us))
    t = scenario.topology
    # the scale-up link is modelled, not emulated: a job's byte scale shrinks its latency with
    # its messages, so a scaled iteration's scale-up part is the full one divided exactly
    shrink = run.job.byte_scale if run.job is not None else 1.0
    scale_up = ScaleUp(ns_per_byte=scenario.time_scale / t.scale_up_gbyte_s,
                       latency_ns=scenario.emulated_ns(t.scale_up_latency_ns / 1000 / shrink))
    per_server = plan.gpus_per_server > 1
    return [GpuConfig(rank=h.rank, host=h.name, intf=h.intf, ip=h.ip, mac=h.mac,
                      ranks=len(plan.gpus), workloads=run.workloads, mtu=w.mtu, compute=compute,
                      straggler=straggler if h.rank in st.ranks else None, seed=w.seed,
                      transport=transport,
                      link_rate_bps=scenario.topology.host_rate_mbit * 1e6, out_dir=out_dir,
                      peers=tuple(Peer(p.rank, p.name, p.ip, p.mac,
                                       delay_ns=round(path.rnic_us(p.leaf == h.leaf) * 1000))
                                  for p in plan.gpus if p.rank != h.rank),
                      delay_line=path.transmission,
                      server=plan.server_ranks(h.rank) if per_server else (),
                      scale_up=scale_up if per_server else None)
            for h in plan.gpus]


def job_config(run: PolicyRun) -> Optional[Job]:
    """The job every agent replays, in emulated time (None: the collective workloads)."""
    if run.job is None:
        return None
    return Job(run.job.graph.scaled(run.time_scale), run.scenario.workload.iterations)


def expected_duration_s(scenario: Scenario, job: Optional[JobPlan] = None) -> float:
    """Rough time of the whole replay at line rate, compute phases and stragglers included
    (for timeouts and progress)."""
    w, t = scenario.workload, scenario.topology
    if w.all_jobs:  # the run's job plan, else planned here
        graph = (job or plan_job(scenario)).graph
        return iteration_ns(graph, scenario) * scenario.time_scale * w.iterations / 1e9
    n = t.gpus
    per_byte = (n - 1) / n if w.collective == "all_to_all" else 2 * (n - 1) / n
    bits = sum(per_byte * size * 8 * 1.1 for size in w.run_sizes) * w.iterations
    wire = bits / (min(t.host_rate_mbit, t.fabric_rate_mbit) * 1e6)
    st = w.stragglers
    late = st.delay_us * (3 if st.distribution == "exponential" else 2) if st.ranks else 0.0
    compute = scenario.emulated_ns(w.compute_us + w.compute_jitter_us + late) / 1e9
    return wire + compute * w.iterations * len(w.run_sizes)


def patience_s(run: PolicyRun) -> float:
    """How long a QP, or a GPU waiting for the network, may go without progress before the
    agents report the job stalled (emulated s): as long as a slow emulation of the whole
    replay may take (10x the line-rate estimate, plus 30 s)."""
    return 30 + 10 * expected_duration_s(run.scenario, run.job)


def finish_timeout_s(run: PolicyRun) -> float:
    """How long a run waits for its agents: the replay slowly emulated, and then one stall
    reported (``patience_s`` each)."""
    return 2 * patience_s(run) + 30


def process_groups(hosts: List[str], servers: Dict[str, str], loops: int,
                   domain: Optional[Dict[str, int]] = None) -> List[Tuple[str, List[str]]]:
    """(machine, hosts) of each agent process: a machine's GPUs in rank order, cut into
    ``loops`` contiguous groups of near-equal size, never inside a scale-up ``domain`` (a
    GPU server, whose transfers are one loop's timers) (pure)."""
    by_server: Dict[str, List[List[str]]] = {}
    for h in hosts:
        units = by_server.setdefault(servers.get(h, LOCAL), [])
        d = (domain or {}).get(h)
        if units and d is not None and (domain or {}).get(units[-1][-1]) == d:
            units[-1].append(h)
        else:
            units.append([h])
    out = []
    for server, units in by_server.items():
        total = sum(len(u) for u in units)
        k = max(1, min(loops, len(units)))
        groups: List[List[str]] = [[] for _ in range(k)]
        at = 0
        for u in units:  # a unit goes where its first host falls in k equal shares
            groups[at * k // total] += u
            at += len(u)
        out += [(server, g) for g in groups if g]
    return out


# GPU NIC line rate one agent process serves (its event loop handles ~20,000 frames a second
# at the default's 4 KB frames on the 2-core VM in well under one core); fewer processes wake
# less, and every wake costs the machine
NIC_MBIT_PER_PROCESS = 400.0


def loops_wanted(scenario: Scenario) -> int:
    """Agent processes per server: the scenario's, or as few as the GPUs' line rate needs
    (one per ``NIC_MBIT_PER_PROCESS``), at most one per CPU."""
    if scenario.emulation.agent_processes:
        return scenario.emulation.agent_processes
    t = scenario.topology
    need = -(-t.gpus * t.host_rate_mbit // NIC_MBIT_PER_PROCESS)
    return int(max(1, min(need, os.cpu_count() or 1)))


class AgentGroup:
    """The agent processes of one policy's run: each serves several GPU hosts."""

    def __init__(self, fabric, run: PolicyRun, records_dir: str, log_dir: str, ledger: Ledger,
                 tag: str):
        self.fabric, self.run = fabric, run
        self.plan, self.scenario = run.plan, run.scenario
        self.records_dir, self.log_dir, self.ledger, self.tag = records_dir, log_dir, ledger, tag
        self.procs: Dict[str, subprocess.Popen] = {}  # process name -> its process
        self.hosts_of: Dict[str, List[str]] = {}
        self.lines: Dict[str, str] = {}
        self.where: Dict[str, tuple] = {}  # process name -> (its server, records dir there)

    def start(self) -> None:
        os.makedirs(self.records_dir, exist_ok=True)
        configs = {c.host: c for c in agent_configs(self.run, self.records_dir)}
        groups = process_groups(list(configs), self.fabric.where or {},
                                loops_wanted(self.scenario),
                                {h.name: h.server for h in self.plan.gpus})
        job = job_config(self.run)
        for k, (server_name, hosts) in enumerate(groups, 1):
            name = f"agent-{self.tag}-{k}"
            server = self.fabric.server(server_name)  # elsewhere: its files live there
            out_dir = server.place(self.records_dir, directory=True)
            config = AgentConfig(tuple(dataclasses.replace(configs[h],
                                                           netns_pid=self.fabric.netns_pid(h))
                                       for h in hosts), out_dir, job)
            path = os.path.join(self.ledger.private_dir, f"{name}.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(config.to_dict(), f)
            argv = [sys.executable, "-m", "traffic.agent", server.send(path)]
            log = open(os.path.join(self.log_dir, f"{name}.log"), "ab")
            try:  # its own session: Ctrl-C reaches the runner only
                proc = server.spawn(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=log, cwd=os.getcwd())
            finally:
                log.close()
            self.where[name] = (server, out_dir)
            self.procs[name] = proc
            self.hosts_of[name] = hosts
            self.ledger.add_pid(proc.pid)
        self._expect_all("ready", 30.0 + 0.5 * max(len(h) for h in self.hosts_of.values()))

    def pids(self) -> List[int]:
        """The agent processes on this machine (for the cost meter)."""
        return [p.pid for name, p in self.procs.items() if self.where[name][0].local]

    @property
    def iterations(self) -> int:
        """Iterations each agent replays (over all sizes of a sweep)."""
        return self.scenario.workload.iterations * len(self.scenario.workload.run_sizes)

    def go(self) -> int:
        """Tell every agent when to start; returns that time (ns since the epoch)."""
        start_ns = time.time_ns() + int(START_MARGIN_S * 1e9)
        for name, proc in self.procs.items():
            try:
                proc.stdin.write(f"go {start_ns}\n".encode())
                proc.stdin.flush()
            except BrokenPipeError:
                self._died(name)
        return start_ns

    def wait(self, timeout: float, on_iteration: Callable[[int], None] = lambda i: None,
             alive: Callable[[], None] = lambda: None) -> Optional[JobFailure]:
        """Follow the agents until all have ``finished`` or one GPU's job failed, then
        ``collect`` their records; the failure, if one came."""
        failure = self.wait_finished(timeout, on_iteration, alive)
        self.collect(abort=failure is not None)
        return failure

    def wait_finished(self, timeout: float, on_iteration: Callable[[int], None] = lambda i: None,
                      alive: Callable[[], None] = lambda: None) -> Optional[JobFailure]:
        """Follow the agents until every GPU has ``finished`` its collectives (they keep
        answering their peers until told to stop), or until one says its job ``failed``:
        then that failure (``traffic.gpu.Gpu.fail``: emulated ns). ``alive`` checks the
        controller and the queue emulator."""
        deadline = time.monotonic() + timeout
        pending = {h for hosts in self.hosts_of.values() for h in hosts}
        reported = -1
        iters: Dict[str, int] = dict.fromkeys(pending, -1)
        while pending:
            alive()
            if time.monotonic() > deadline:
                slow = ", ".join(sorted(pending))
                raise AgentError(f"agents did not finish within {timeout:.0f} s: {slow}")
            for _name, line in self._read_lines(self.procs, 0.2):
                word, _, rest = line.partition(" ")
                if word == "failed":
                    return JobFailure.from_dict(json.loads(rest.partition(" ")[2]))
                if word == "finished":
                    pending.discard(rest)
                elif word == "iter":
                    host, _, it = rest.partition(" ")
                    iters[host] = int(it)
                    slowest = min(iters.values())
                    if slowest > reported:
                        reported = slowest
                        on_iteration(slowest)

    def collect(self, abort: bool = False) -> None:
        """Tell the agents to ``stop`` (a failed job: to ``abort`` at once); wait until they
        wrote their records (``done``)."""
        for name, proc in self.procs.items():
            try:
                proc.stdin.write(b"abort\n" if abort else b"stop\n")
                proc.stdin.flush()
            except BrokenPipeError:
                self._died(name)
        self._expect_all("done", 60.0)
        for name, proc in self.procs.items():
            if proc.wait(timeout=10) != 0:
                self._died(name)
        for name, (server, out_dir) in self.where.items():  # records back to this machine
            for host in self.hosts_of[name]:
                server.fetch(f"{out_dir}/{host}.*", self.records_dir)

    def _expect_all(self, word: str, timeout: float) -> None:
        """Until every agent process said ``word``. ``timeout``: how long one may go without
        using CPU time before it counts as stuck (a slow machine, such as the VM test's
        emulated guest, may take longer to start it); never more than STUCK_CAP x that."""
        start = time.monotonic()
        pending = set(self.procs)
        busy = {name: (start, cpu_ticks(self.procs[name].pid)) for name in pending}
        while pending:
            now = time.monotonic()
            for name in pending:
                ticks = cpu_ticks(self.procs[name].pid)
                if ticks != busy[name][1]:
                    busy[name] = (now, ticks)
            stuck = sorted(n for n in pending if now - busy[n][0] > timeout)
            if stuck or now - start > STUCK_CAP * timeout:
                why = (f"no CPU time used for {timeout:.0f} s" if stuck
                       else f"still busy after {now - start:.0f} s")
                hosts = [h for name in (stuck or sorted(pending)) for h in self.hosts_of[name]]
                raise AgentError(f"agents not {word} after {now - start:.0f} s ({why}): "
                                 f"{', '.join(hosts)}")
            for name, line in self._read_lines(pending, 0.2):
                if line == word:
                    pending.discard(name)

    def _read_lines(self, names, timeout: float):
        """Yield (process name, line) for complete stdout lines; raise if one exited."""
        fds = {self.procs[n].stdout.fileno(): n for n in names}
        ready, _, _ = select.select(list(fds), [], [], timeout)
        for fd in ready:
            name = fds[fd]
            chunk = os.read(fd, 65536)
            if not chunk:
                self._died(name)
            buf = self.lines.get(name, "") + chunk.decode(errors="replace")
            *complete, rest = buf.split("\n")
            self.lines[name] = rest
            for line in complete:
                yield name, line.strip()

    def _died(self, name: str) -> None:
        proc = self.procs[name]
        try:
            code = proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            code = None
        last = log_tail(os.path.join(self.log_dir, f"{name}.log"))
        raise AgentError(f"traffic agent of {', '.join(self.hosts_of[name])} died "
                         f"(exit code {code}): {last}")

    def stop(self) -> None:
        stop_processes(list(self.procs.values()))
