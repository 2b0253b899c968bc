"""Run a scenario: for each policy, a fresh fabric, its controller, the agents, the figures.

The runner owns every resource through one ``ExitStack`` per policy and one ``Ledger`` per run,
so an error, Ctrl-C or SIGTERM at any point tears down exactly what was created; the results
gathered so far stay on disk, marked with the run's status.

Why one module over 400 lines: it is the one place where a run's resources are opened and
closed - each policy's ``ExitStack`` spans the controller, the fabric, the emulator, the agents
and the figures gathered from them; split, that lifetime would be read across files.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import glob
import logging
import os
import secrets
import shutil
import signal
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from traffic.contract import JobFailure

from .. import __version__
from ..base.atomic import write_json_atomic
from ..base.capabilities import Capabilities
from ..base.errors import TestbedError
from ..base.ledger import Ledger
from ..base.topology import FabricPlan
from ..fabric.bpfforward import summary_of as forwarding_summary
from ..fabric.capabilities import detect
from ..fabric.capture import PacketCapture
from ..fabric.network import Fabric
from ..fabric.ovs_buffers import needed_bytes, ovs_socket_buffers, raised_socket_defaults
from ..fabric.queues import drain, egress_stats, queue_drops, queued_frames, spine_load
from ..fabric.rxe import RxeTraffic, require as require_rxe
from ..job.plan import switch_hops
from ..plan.checks import check_machine, check_scenario
from ..plan.placement import by_server
from ..plan.policyrun import PolicyRun, cluster_servers, decide
from ..results import breakdown, htmlreport, trace
from ..results.collect import RESULTS_SCHEMA, Mechanisms, RunContext, collect, timeline
from ..results.latency import expected_latency_us, latency_parts
from ..results.model import (CpuWakeup, Fidelity, JobFailed, PolicyResult, RunResult, Rxe,
                             SwitchQueues, with_modelled)
from ..results.spread import spread
from ..scenario import capacity, timescale
from ..scenario.config import Scenario
from ..switchq.contract import EmulatorReport
from ..switchq.handle import EmulatorProcess, Emulators
from . import calibrate, cost
from .agent_processes import (AgentGroup, budget_text, expected_duration_s, finish_timeout_s,
                               retry_budget)
from .background import Background
from .controller_process import ControllerProcess
from .fidelity import CpuSampler, evaluate
from .wakeup import cpus_kept_awake

LOG = logging.getLogger(__name__)
DRAIN_LIMIT_S = 3.0  # after the collectives: at most this long for queued frames to arrive
CLOCK_WARN_US = 20.0  # servers' clocks further apart make cross-server one-way latency suspect
Say = Callable[[str], None]  # a line of progress for the user (the CLI prints it)


def new_run_id() -> str:
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def choose_time_scale(scenario: Scenario, progress: Say,
                      calibration=None) -> Tuple[Scenario, Optional[timescale.Choice]]:
    """``scenario`` at the GPU NIC rate it runs at, and how that rate was chosen: ``auto``
    from this machine's calibration (measured first if there is none), an explicit rate
    checked against it where one exists (a warning if it exceeds the budget; measured first
    if the run may go again slower, ``emulation.attempts``)."""
    t = scenario.topology
    auto = t.host_rate_mbit == timescale.AUTO
    # a run that may go again slower records its choices against this machine's calibration
    retries = timescale.attempts_allowed(scenario.emulation.attempts,
                                         "auto" if auto else "scenario") > 1
    cal = calibration or (calibrate.calibration(progress) if auto or retries
                          else calibrate.load())
    if cal is None:
        return scenario, None
    cap = (timescale.learned_cap(calibrate.learned(scenario, cal), scenario.policies)
           if auto else None)
    choice = timescale.choose(t.host_rate_mbit, scenario.base_policies, t.gpus, cal, cap,
                              hops=switch_hops(scenario))
    if auto:
        scenario = scenario.with_host_rate(choice.host_rate_mbit)
    progress(timescale.describe(choice, t.modelled_rate_gbit))
    note = timescale.warning(choice)
    if note:
        progress(f"warning: {note}")
    return scenario, choice


def _keep_traceback(run_dir: str, e: Exception) -> str:
    """An unexpected exception's traceback, written to the run directory (a rare failure
    cannot wait for a rerun with --debug); the error as results.json says it."""
    with contextlib.suppress(OSError), open(os.path.join(run_dir, "traceback.txt"), "w") as f:
        f.write(traceback.format_exc())
    return f"unexpected {type(e).__name__}: {e} (traceback.txt)"


@dataclass
class Kept:
    """What the current attempt measured so far, typed: each policy's first run, its later
    runs (``repeat``) and their spread; results.json is written from it, also when the run
    is interrupted or fails part way."""
    policies: Dict[str, PolicyResult] = field(default_factory=dict)
    repeats: Dict[str, List[PolicyResult]] = field(default_factory=dict)
    spread: Dict[str, dict] = field(default_factory=dict)

    def runs(self, name: str) -> List[PolicyResult]:
        """Every run of a policy, the first first."""
        return [self.policies[name]] + self.repeats.get(name, [])

    def clear(self) -> None:
        """A new attempt: the one before was set aside (``keep_attempt``)."""
        self.policies.clear()
        self.repeats.clear()
        self.spread.clear()

    def to_json(self) -> dict:
        out = {"policies": {n: p.to_json() for n, p in self.policies.items()}}
        if self.repeats:
            out["repeats"] = {n: [p.to_json() for p in runs] for n, runs in self.repeats.items()}
        if self.spread:
            out["spread"] = self.spread
        return out


def run(scenario: Scenario, out_root: str = "results", progress: Say = lambda s: None,
        caps: Optional[Capabilities] = None, calibrated: bool = True) -> RunResult:
    """Run every policy of ``scenario``; returns the run as results.json holds it (its
    ``run_dir`` the run directory). ``calibrated``: choose (``auto``) or check the GPU NIC
    rate against this machine's calibration first."""
    plan = check_scenario(scenario, capacity.mem_available_mb())
    caps = caps or detect()
    caps.require_run()
    check_machine(scenario, plan, caps)
    if scenario.rxe.enabled:
        require_rxe(caps)
    asked = scenario  # what this machine learns of a scenario is kept under it as given
    choice = None  # what is wrong with the scenario or the machine is said before calibrating
    if calibrated:
        scenario, choice = choose_time_scale(scenario, progress)
    timescale.require_rate(scenario.topology.host_rate_mbit)
    unscaled = _say_unscaled(scenario, progress)
    run_id = new_run_id()
    run_dir = os.path.abspath(os.path.join(out_root, run_id))
    os.makedirs(run_dir, mode=0o755)
    results = {  # the run-level keys of results.json; the policies' are ``kept``'s
        "schema": RESULTS_SCHEMA, "version": __version__, "run_id": run_id,
        "status": "running", "started": _now(), "finished": None,
        "scenario": scenario.to_dict(), "time_scale": round(scenario.time_scale, 1),
        "capabilities": caps.to_dict(),
    }
    kept = Kept()
    if choice is not None:
        results["time_scale_choice"] = choice.to_dict()
    results["time_scale_not_scaled"] = unscaled
    path = os.path.join(run_dir, "results.json")
    write_json_atomic(path, dict(results, **kept.to_json()))
    ledger = Ledger(run_id)
    try:
        ledger.acquire(run_dir)
    except Exception:  # e.g. another run holds the machine: this run never started
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    try:
        with cpus_kept_awake(scenario.emulation.keep_cpus_awake) as wakeup:
            if wakeup.held and len(cluster_servers(scenario)) > 1:
                wakeup = dataclasses.replace(wakeup, note="; ".join(filter(None, [
                    wakeup.note, "held on this machine only, not on the cluster's other "
                                 "servers"])))
            results["cpu_wakeup"] = wakeup.to_json()
            progress(wakeup_text(wakeup))
            _attempts(asked, scenario, choice, plan, caps, run_dir, ledger, results, kept,
                      progress)
        results["status"] = "complete"
    except KeyboardInterrupt:
        results["status"] = "incomplete"
        results["error"] = "interrupted"
        raise
    except Exception as e:
        results["status"] = "failed"
        results["error"] = str(e) if isinstance(e, TestbedError) else _keep_traceback(run_dir, e)
        raise
    finally:
        with shielded():
            leftovers = ledger.teardown()
            if leftovers:
                results["teardown_leftovers_removed"] = leftovers
            ledger.close()
            results["finished"] = _now()
            write_json_atomic(path, dict(results, **kept.to_json()))
        try:
            _write_report(run_dir, progress)  # also for a failed or interrupted run
        except KeyboardInterrupt:
            with shielded():
                if results["status"] == "complete":
                    results["status"] = "incomplete"
                    results["error"] = ("interrupted while writing report.html; the "
                                        "measurements are complete: python -m testbed report "
                                        f"{run_dir} draws it")
                    write_json_atomic(path, dict(results, **kept.to_json()))
            raise
    return RunResult.of(run_dir, dict(results, spread=kept.spread), kept.policies,
                        {n: tuple(runs) for n, runs in kept.repeats.items()})


def _say_unscaled(scenario: Scenario, progress: Say) -> List[str]:
    notes = scenario.unscaled_constants()
    for note in notes:
        progress(f"not scaled: {note}")
    return notes


def _attempts(asked: Scenario, scenario: Scenario, choice: Optional[timescale.Choice],
              plan: FabricPlan, caps: Capabilities, run_dir: str, ledger: Ledger,
              results: dict, kept: Kept, progress: Say) -> None:
    """Every policy at the chosen rate (``_policies``), into ``kept`` as each one finishes;
    while the fidelity monitor rejects some and ``auto`` may go slower, the attempt is set
    aside and every policy runs again."""
    while True:
        _policies(scenario, plan, caps, run_dir, ledger, results, kept, progress)
        again = run_again(asked, scenario, choice, results, kept, run_dir, progress)
        if again is None:
            return
        scenario, choice = again
        kept.clear()
        results.update({"scenario": scenario.to_dict(),
                        "time_scale": round(scenario.time_scale, 1),
                        "time_scale_choice": choice.to_dict(),
                        "time_scale_not_scaled": _say_unscaled(scenario, progress)})
        write_json_atomic(os.path.join(run_dir, "results.json"),
                          dict(results, **kept.to_json()))


def _policies(scenario: Scenario, plan: FabricPlan, caps: Capabilities, run_dir: str,
              ledger: Ledger, results: dict, kept: Kept, progress: Say) -> None:
    """Each policy of one attempt on a fresh fabric, ``repeat`` times in rounds over the
    policies (the machine's drift is shared alike); results.json and operations.csv are
    written after each, so an interrupted run keeps what finished. The first run of a policy
    is ``policies.<name>``, the others ``repeats.<name>``, and ``spread.<name>`` the headline
    figures over all of them."""
    path = os.path.join(run_dir, "results.json")
    rounds, count = scenario.repeat, len(scenario.policies)

    def keep(run: PolicyRun, result: PolicyResult, notes: dict) -> None:
        results.setdefault("link_emulation", notes["link_emulation"])  # the first fabric's
        if "cluster" in notes:
            results["cluster"] = notes["cluster"]
        if run.repetition == 1:
            kept.policies[run.title] = result
        else:
            kept.repeats.setdefault(run.title, []).append(result)
        if rounds > 1:
            kept.spread[run.title] = spread([r.in_modelled_time(run.time_scale)
                                             for r in kept.runs(run.title)])
        write_json_atomic(path, dict(results, **kept.to_json()))
        breakdown.write(run_dir, {n: p.operations for n, p in kept.policies.items()})

    runs = {name: decide(name, plan, scenario, caps) for name in scenario.policies}
    for k in range(1, rounds + 1):
        for i, name in enumerate(scenario.policies, 1):
            say = _prefixed(progress, f"[{name} {i}/{count}" +
                            (f", run {k}/{rounds}]" if rounds > 1 else "]"))
            run_policy(dataclasses.replace(runs[name], repetition=k), caps, run_dir, ledger,
                       say, keep)


def run_again(asked_scenario: Scenario, scenario: Scenario,
              choice: Optional[timescale.Choice], results: dict, kept: Kept, run_dir: str,
              progress: Say) -> Optional[Tuple[Scenario, timescale.Choice]]:
    """After all policies ran: at a rate chosen by ``auto`` keep what the attempt taught on
    this machine (``calibrate.remember``); if the fidelity monitor rejected some policies
    and attempts (``timescale.attempts_allowed``) and slower rates are left, move this
    attempt's files into ``rejected/`` and return the scenario and choice to run every policy
    again with (None: done)."""
    if choice is None:
        return None
    rate = scenario.topology.host_rate_mbit
    fidelity = {name: rejected_first(kept.runs(name)) for name in kept.policies}
    wants = {name: timescale.retry_rate(
        rate, {name: section.checks.to_json() if section.checks else {}})
             for name, section in fidelity.items()}
    if choice.chosen_by == "auto":
        calibrate.remember(asked_scenario, choice.calibration, wants, first=not choice.attempts,
                           capped=rate == choice.learned_cap_mbit)
    asks = {name: r for name, r in wants.items() if r is not None}
    allowed = timescale.attempts_allowed(scenario.emulation.attempts, choice.chosen_by)
    if not asks or len(choice.attempts) + 1 >= allowed:
        return None
    slower = min(asks.values())
    attempt = timescale.Attempt(
        rate, {name: list(fidelity[name].problems) for name in asks},
        kept_in=os.path.join("rejected", f"{len(choice.attempts) + 1}-at-{rate:g}-mbit"))
    keep_attempt(run_dir, attempt.kept_in, dict(
        results, **kept.to_json(),
        superseded=(f"the fidelity monitor rejected this run; it ran again at "
                    f"{slower:g} Mbit/s (the run directory's results.json)")))
    progress(timescale.retry_text(attempt, slower))
    choice = timescale.retried(choice, slower, attempt, scenario.base_policies,
                               scenario.topology.gpus)
    return scenario.slowed_to(slower), choice


def rejected_first(runs: List[PolicyResult]) -> Fidelity:
    """The fidelity section of a policy's runs (``repeat``) that decides whether it runs
    again: the first the monitor rejected, else the first run's."""
    sections = [r.fidelity or Fidelity() for r in runs]
    return next((f for f in sections if f.verdict not in (None, "ok")), sections[0])


def keep_attempt(run_dir: str, rel: str, results: dict) -> None:
    """Move everything a rejected attempt wrote into ``run_dir/rel``, with its results."""
    dest = os.path.join(run_dir, rel)
    os.makedirs(dest)
    top = rel.split(os.sep)[0]
    for entry in os.listdir(run_dir):
        if entry not in ("results.json", top):
            shutil.move(os.path.join(run_dir, entry), dest)
    write_json_atomic(os.path.join(dest, "results.json"), results)


def wakeup_text(wakeup: CpuWakeup) -> str:
    if wakeup.held:
        note = f"; {wakeup.note}" if wakeup.note else ""
        return (f"idle CPUs kept ready to wake (PM QoS 0 us, cpuidle "
                f"{wakeup.cpuidle_driver}) while the run lasts{note}")
    return f"CPU wake-ups: {wakeup.note}"


def _write_report(run_dir: str, progress: Say) -> None:
    """report.html and the plots; results.json is already safe, so a failure here is only
    reported (``python -m testbed report DIR`` retries it), and Ctrl-C stops it at once."""
    try:
        progress("writing report.html")
        htmlreport.write(run_dir, progress)
    except Exception as e:  # never let the report cost the run its results
        LOG.warning("report.html was not written: %s", e)
        progress(f"report.html was not written ({e}); retry: python -m testbed report "
                 f"{run_dir}")


@dataclass
class Session:
    """A running fabric under its controller (what ``fabric_up`` yields)."""

    controller: ControllerProcess
    fabric: Fabric
    warnings: List[str]


def latency_by_path(packets, plan: FabricPlan, where: dict) -> dict:
    """Latency percentiles of packets between GPUs on one server and across servers."""
    import numpy as np

    from traffic import metrics

    names = sorted(set(where.values()))
    server = np.array([names.index(where[h.name])
                       for h in sorted(plan.gpus, key=lambda h: h.rank)])
    cross = server[packets.src] != server[packets.dst] if packets.src.size else np.zeros(0, bool)
    return {"same_server": metrics.percentiles(packets.latency[~cross]),
            "cross_server": metrics.percentiles(packets.latency[cross])}


@contextlib.contextmanager
def fabric_up(run: PolicyRun, caps: Capabilities, run_dir: str, ledger: Ledger,
              say: Say = lambda s: None):
    """Controller started, fabric built and shaped, switches programmed, connectivity checked.

    Everything is torn down on exit, whatever happened inside.
    """
    t, plan, classes = run.scenario.topology, run.plan, run.classes
    with contextlib.ExitStack() as stack:
        ctl = ControllerProcess(run.policy, run_dir, ledger.private_dir, ledger, run.name)
        stack.callback(_shielded_call, ctl.stop)
        say("starting the controller")
        ctl.start()
        say(f"controller on 127.0.0.1:{ctl.port}")
        fabric = Fabric(run, caps, ctl.port, ledger, events_path=ctl.events_path)
        if run.placement:
            say("placement: " + "; ".join(
                f"{server}: {len(nodes)} nodes" for server, nodes in
                by_server(run.placement, cluster_servers(run.scenario)).items()))
        stack.callback(_shielded_call, fabric.stop)
        extra = f" + {len(plan.neighbours)} neighbour hosts" if plan.neighbours else ""
        say(f"building fabric: {t.spines} spines, {t.leaves} leaves, {len(plan.gpus)} GPUs{extra}, "
            f"{t.host_rate_mbit:g}/{t.fabric_rate_mbit:g} Mbit/s host/fabric links, "
            f"OVS {caps.datapath} datapath, classes {', '.join(c.name for c in classes)}")
        # Userspace OVS sizes its packet sockets when it creates them: during the build and
        # on the first forwarded packets (see testbed.fabric.ovs_buffers).
        need = needed_bytes(switch_buffer_total(plan, classes))
        sized = (raised_socket_defaults(need, record=ledger.add_sysctl)
                 if caps.datapath == "user" else contextlib.nullcontext())
        with sized:
            built = time.monotonic()
            fabric.start()
            say(f"fabric up ({time.monotonic() - built:.1f} s); the controller programs "
                f"{len(plan.switches)} switches")
            took = ctl.wait_programmed([s.dpid for s in plan.switches],
                                       explain=fabric.controller_links)
            say(f"{len(plan.switches)} switches programmed ({took:.1f} s)")
            fabric.check_connectivity(run.policy.may_reach)
        warnings = ovs_buffer_warnings(caps, need)
        for w in warnings:
            say(f"warning: {w}")
        yield Session(ctl, fabric, warnings)


@contextlib.contextmanager
def rxe_attached(run: PolicyRun, session: Session, caps: Capabilities, run_dir: str,
                 ledger: Ledger, say: Say):
    """The rxe endpoints of ``--traffic rxe`` attached to the fabric (None without it);
    detached on exit, whatever happened inside."""
    if not run.scenario.rxe.enabled:
        yield None
        return
    rxe = RxeTraffic(session.fabric, run, ledger, caps, os.path.join(run_dir, "rxe", run.name))
    try:
        say(f"rxe: attaching {rxe.a.name} and {rxe.b.name} in the root namespace "
            f"(rdma_rxe, perftest)")
        rxe.start()
        yield rxe
    finally:
        with shielded():
            failed = rxe.stop()
            if failed:
                session.warnings.append("rxe: could not undo: " + "; ".join(failed))


def rxe_warnings(report: Optional[Rxe]) -> List[str]:
    """A line for each perftest test that failed."""
    if report is None:
        return []
    return [f"rxe: {t.error}" for t in report.tests.values() if t.error]


@dataclass
class QueueReport:
    """The switch-queue emulators' report, once they stopped."""
    report: EmulatorReport = field(default_factory=lambda: EmulatorReport(servers=0))


@contextlib.contextmanager
def queue_emulation(run: PolicyRun, session: Session, run_dir: str, ledger: Ledger):
    """The switch-queue emulator running beside the fabric; yields it and a ``QueueReport``
    that receives its report when it stops."""
    emu = Emulators([EmulatorProcess(run, session, run_dir, ledger.private_dir, ledger, server)
                     for server in session.fabric.servers])
    stopped = QueueReport()
    try:
        emu.start()
        yield emu, stopped
    finally:
        with shielded():
            stopped.report = emu.stop()


@dataclass
class Replay:
    """What the traffic phase leaves for the figures: CPU snapshots around it, the machine's
    CPU samples while it ran, and what the side traffic and tools reported."""

    before: cost.Snapshot
    started: Optional[cost.Snapshot] = None
    finished: Optional[cost.Snapshot] = None
    cpu_samples: List[float] = field(default_factory=list)
    in_flight: int = 0  # frames still queued in the fabric when the agents stopped
    background: dict = field(default_factory=dict)
    pcaps: Optional[dict] = None
    rxe: Optional[Rxe] = None  # what perftest measured (``--traffic rxe``)
    job_failed: Optional[JobFailed] = None  # a GPU's job failed (``job_failure``)


@dataclass
class FabricEnd:
    """The fabric's own counters, read before it is torn down."""

    stats: dict  # per switch port: egress counters (testbed.fabric.queues)
    losses: dict  # per lossy link end: frames it dropped
    hop_delays: dict  # the path delay per port kind as applied


class _Once:
    """A stop that runs once: in the flow where its result is wanted, or at exit (shielded)
    after an error, whichever comes first."""

    def __init__(self, stop):
        self.stop, self.done, self.result = stop, False, None

    def __call__(self):
        if not self.done:
            self.done = True
            with shielded():
                self.result = self.stop()
        return self.result


def run_policy(run: PolicyRun, caps: Capabilities, run_dir: str, ledger: Ledger, say: Say,
               keep: Callable[[PolicyRun, PolicyResult, dict], None]) -> None:
    """One policy's run, in phases: the fabric up (``fabric_up``) and what it says of itself
    (``_fabric_notes``); the traffic replayed beside the queue emulator (``_replay``); the
    fabric's counters read and the fabric torn down; the figures (``_figures``: every one
    declared - ``PolicyResult`` refuses a figure testbed/results/model.py does not know),
    handed to ``keep`` with the run-wide notes of its fabric (link emulation, cluster).

    Once the traffic was replayed, Ctrl-C waits until ``keep`` has the figures (about a
    second for the default job): an interrupted run keeps every policy it measured."""
    t0 = time.monotonic()
    records = os.path.join(run_dir, "records", run.name)
    with contextlib.ExitStack() as measured:
        with fabric_up(run, caps, run_dir, ledger, say) as session:
            notes = _fabric_notes(session, caps, say)
            with rxe_attached(run, session, caps, run_dir, ledger, say) as rxe, \
                    queue_emulation(run, session, run_dir, ledger) as (emu, queues):
                say(emu.describe())
                replay = _replay(run, session, emu, rxe, records, run_dir, ledger, say)
                measured.enter_context(shielded())
            end = FabricEnd(egress_stats(session.fabric), session.fabric.link_losses(),
                            session.fabric.hop_delays())
            say("tearing down the fabric")
        figures = _figures(run, records, run_dir, replay, end, queues.report, session.warnings,
                           time.monotonic() - t0)
        result = with_modelled(PolicyResult.from_json(figures, f"policies.{run.title}",
                                                      strict=True, name=run.title),
                               run.time_scale)
        say(f"done: {result.packets_received:,} of {result.packets_sent:,} packets received, "
            f"{result.drops:,} dropped, {_count(result.ecn_marked_packets)} ECN-marked, "
            + (f"{_count(result.credit_waits)} credit waits"
               if result.credit_waits is not None else
               f"{_count(result.pfc_pause_events)} PFC pauses")
            + f"; fidelity {result.fidelity.verdict}")
        keep(run, result, notes)


def _fabric_notes(session: "Session", caps: Capabilities, say: Say) -> dict:
    """What a fabric says of itself for the whole run (how links are emulated; a split
    fabric's servers and clocks), and warnings into the session's."""
    notes = {"link_emulation": session.fabric.applied()}
    if not caps.nic_in_c:
        session.warnings.append(
            "the GPU agents' C extension (traffic/_nicio.c) is not built: they handle "
            "packets in Python at a few times the CPU per packet (run scripts/install.sh)")
    split = session.fabric.cluster_report()
    if split:
        notes["cluster"] = split
        worst = max(abs(c["offset_us"]) + c["uncertainty_us"]
                    for c in split["clock_offsets"].values())
        say(f"split over {len(split['servers'])} servers, "
            f"{len(split['cross_links'])} cross-server links; clocks within {worst:g} us")
        # measured apart beyond what the exchange can resolve
        if any(abs(c["offset_us"]) - c["uncertainty_us"] > CLOCK_WARN_US
               for c in split["clock_offsets"].values()):
            session.warnings.append(
                f"the servers' clocks differ by up to {worst:g} us: one-way latency of "
                "packets between servers includes that offset (synchronise them with "
                "PTP or chrony); same-server latencies are unaffected")
    return notes


def _replay(run: PolicyRun, session: "Session", emu, rxe, records: str, run_dir: str,
            ledger: Ledger, say: Say) -> Replay:
    """The agents, background traffic and packet capture, each stopped on one ExitStack
    whatever happens; the traffic from go to the last GPU's finish, the frames left in the
    fabric drained, the agents' records collected, then rxe's perftest if asked."""
    scenario, plan, name = run.scenario, run.plan, run.name
    agents = AgentGroup(session.fabric, run, records, run_dir, ledger, name)
    background = Background(session.fabric, run, os.path.join(run_dir, "background", name),
                            ledger)
    capture = (PacketCapture(session.fabric, plan, scenario.measurement,
                             os.path.join(run_dir, "pcap", name), ledger)
               if scenario.measurement.pcap else None)
    expected = expected_duration_s(scenario, run.job)

    def snapshot() -> cost.Snapshot:
        return cost.Snapshot.take({
            "agents": agents.pids(), "open_vswitch": cost.ovs_pids(),
            "switch_queue_emulator": emu.local_pids(),
            "controller": session.controller.pids(), "runner": [os.getpid()]})

    def alive():
        session.controller.check_alive()
        emu.check_alive()

    replay = Replay(before=snapshot())
    with contextlib.ExitStack() as stack:
        stack.callback(_shielded_call, agents.stop)
        agents.start()
        replay.started = snapshot()
        stop_capture = _Once(capture.stop if capture else lambda: None)
        stack.callback(stop_capture)
        stop_background = _Once(background.stop if not background.empty else dict)
        stack.callback(stop_background)
        if not background.empty:
            background.start_receivers()
            background.start_senders(30 + 10 * expected)
            say(f"background traffic: {background.describe()}")
        if capture:
            capture.start()
            say(f"capturing on {len(capture.procs)} GPU NICs into pcap/{name}/")
        budget = retry_budget(run)
        if not budget["reachable"]:
            say(budget_text(budget))
        say(f"replaying {_workload_text(scenario, len(plan.gpus), run.job)} "
            f"(about {expected:.1f} s at line rate)")
        if run.job is not None and run.job.warning:
            say(f"warning: {run.job.warning}")
        start_ns = agents.go()
        if not background.empty:
            background.go(start_ns)
        t_traffic = time.monotonic()
        total = agents.iterations
        with CpuSampler() as cpu:  # while the traffic runs
            failure = agents.wait_finished(timeout=finish_timeout_s(run),
                                           on_iteration=lambda i: say(
                                               f"iteration {i + 1}/{total} "
                                               f"({time.monotonic() - t_traffic:.1f} s)"),
                                           alive=alive)
        replay.cpu_samples = cpu.samples
        replay.finished = snapshot()
        if failure is not None:
            replay.job_failed = job_failure(failure, run.time_scale)
            say(f"the job failed: {replay.job_failed.text}")
        replay.background = stop_background() or {}
        replay.in_flight = queued_frames(drain(session.fabric, DRAIN_LIMIT_S, say))
        agents.collect(abort=failure is not None)
        if rxe and failure is None:
            replay.rxe = Rxe.from_json(rxe.run(say), "rxe", strict=True)
        replay.pcaps = stop_capture()
    return replay


def _figures(run: PolicyRun, records: str, run_dir: str, replay: Replay, end: FabricEnd,
             queues: EmulatorReport, warnings: List[str], duration_s: float) -> dict:
    """Every figure of one policy's run, from the agents' records, what the traffic phase
    and the fabric reported, and the queue emulator's report (``queues``)."""
    policy, scenario, plan, name = run.policy, run.scenario, run.plan, run.name
    where, classes, cc = run.placement, run.classes, run.congestion_control
    ctx = RunContext(ranks=len(plan.gpus), workloads=() if run.job else run.workloads,
                     time_scale=run.time_scale,
                     extrapolate_gpus=scenario.workload.extrapolate_gpus,
                     mechanisms=Mechanisms(ecn=any(c.ecn for c in classes),
                                           pfc=any(c.pfc for c in classes),
                                           credit=any(c.credit for c in classes),
                                           cnp=cc == "dcqcn"),
                     job=run.job, gpus_per_server=plan.gpus_per_server)
    figures, packets = collect(records, ctx)
    warnings = list(warnings)
    try:
        trace.write(os.path.join(run_dir, f"timeline-{name}.json"),
                    timeline(records, ctx, sorted(glob.glob(os.path.join(
                        run_dir, f"switchq-{name}*.timeline.csv")))))
    except Exception as e:  # never let the trace, drawn from the records, cost the figures
        LOG.warning("timeline-%s.json was not written: %s", name, e)
        warnings.append(f"timeline-{name}.json was not written: {e}")
    figures["emulation_cost"] = dict(
        cost.cost_report(replay.before, replay.finished, figures["packets_received"],
                         os.cpu_count() or 1),
        agents_start_cpu_s=round(cost.breakdown(replay.before, replay.started)["agents"], 3))
    if where:  # cross-server latency depends on the servers' clocks: never mixed silently
        figures["latency_us_by_path"] = latency_by_path(packets, plan, where)
    incast = replay.background.get("incast")
    if incast and incast["target"] in figures["per_gpu"]:
        incast["packets_received"] = figures["per_gpu"][incast["target"]]["rx_foreign_qp"]
    stats, losses = end.stats, end.losses
    switch_drops, nic_drops, per_port = queue_drops(plan, stats)
    nic_pauses = queues.gpu_pauses_ns  # for the monitor, not for results.json
    forwarding = forwarding_summary(queues.forwarding_histogram)
    pfc, credit = ctx.mechanisms.pfc, ctx.mechanisms.credit
    figures.update({
        "gpus": len(plan.gpus),
        "policy": policy.name,
        "params": policy.params_dict(),
        "traffic_classes": [c.name for c in classes],
        "congestion_control": cc,
        "rto_us": run.rto_us,
        "switch_queue_drops": switch_drops,
        "nic_queue_drops": nic_drops,
        "drops_by_port": per_port,
        "link_losses": sum(sum(v.values()) for v in losses.values()) if losses else None,
        "link_losses_by_port": losses or None,
        "queued_at_end": replay.in_flight,
        "unexplained_drops": max(0, figures["drops"] - switch_drops - nic_drops
                                 - sum(v["data"] for v in losses.values())
                                 - figures["rx_socket_drops"] - replay.in_flight),
        "spine_load_packets": spine_load(plan, stats),
        "pfc_pause_events": queues.pfc_pause_events if pfc else None,
        "pfc_paused_ms": queues.pfc_paused_ms if pfc else None,
        "credit_waits": queues.credit_waits if credit else None,
        "credit_wait_ms": queues.credit_wait_ms if credit else None,
        "switch_queues": SwitchQueues.of(queues, forwarding),
        "ecn_marking": run.marking,
        "ecn_marking_via": run.marking_via,
        "red_marked_by_port": ({k: v["marked"] for k, v in sorted(stats.items()) if v["marked"]}
                               if run.marking == "red" else None),
        "reaction_time_us": scenario.sample_interval_us,
        "background": replay.background or None,
        "pcap": replay.pcaps,
        "rxe": replay.rxe,
        "job_failed": replay.job_failed,
        "retry_budget": retry_budget(run),
        "warnings": warnings + rxe_warnings(replay.rxe),
        "duration_s": round(duration_s, 2),
    })
    rate = scenario.topology.host_rate_mbit
    expected = expected_latency_us(packets, plan, run.path_delay, rate)
    minima = packets.path_minima_us()
    figures.update(latency_parts(packets, plan, run.path_delay, expected, minima,
                                 scenario.workload.mtu, rate))
    figures["per_hop_latency"] = dict(end.hop_delays,
                                      measured_min_us=figures["latency_floor_us"])
    figures["fidelity"] = evaluate(records, plan, figures, minima,
                                   packets.path_minima_us(expected), replay.cpu_samples,
                                   scenario, nic_pauses, forwarding)
    return figures


def job_failure(failure: JobFailure, time_scale: float) -> JobFailed:
    """A GPU's report that its job failed (``traffic.gpu.Gpu.fail``, emulated ns) as the
    results give it: times in modelled us, and one line as NCCL's warning would read."""
    def us(ns: int) -> float:
        return round(ns / 1000 / time_scale, 3)
    f, qp = failure, failure.qp
    where = f"{f.host} (rank {f.rank})"
    if qp is not None:
        where = f"QP {qp.qpn:#x} of {where} to {qp.peer_host} (rank {qp.peer_rank})"
    what = (f"completed with {f.status}" if f.status
            else "made no progress for as long as this run waits (its retry budget not "
                 "spent: the outcome unknown)")
    why = (f"PSN {qp.psn} unacknowledged for {us(f.no_progress_ns):,.0f} us after "
           f"{qp.retries} retries; it had {qp.seen.acks:,} ACKs, {qp.seen.naks:,} NAKs, "
           f"{qp.seen.timeouts:,} timeouts" if qp is not None else
           f"no packet moved for {us(f.no_progress_ns):,.0f} us ({f.detail})")
    text = (f"{where} {what} in iteration {f.iteration + 1}, {us(f.at_ns) / 1000:,.3f} ms "
            f"into the run (modelled): {why}")
    on_qp = {} if qp is None else dict(
        peer_rank=qp.peer_rank, peer_host=qp.peer_host, qpn=qp.qpn, psn=qp.psn,
        retries=qp.retries, seen=qp.seen, last_progress_us=us(qp.last_progress_ns))
    return JobFailed(reason=f.reason, host=f.host, rank=f.rank, iteration=f.iteration,
                     detail=f.detail, status=f.status, at_us=us(f.at_ns),
                     no_progress_us=us(f.no_progress_ns), text=text, **on_qp)


def _count(value) -> str:
    return "no" if value is None else f"{value:,}"


def _workload_text(scenario: Scenario, gpus: int, job=None) -> str:
    w = scenario.workload
    if job is not None:
        jobs = "; ".join(_job_text(part) for part in job.parts)
        regime, resend = job.regime, job.recovery
        against = (f": a QP's median message {regime.message_bytes / 1e3:,.0f} KB, "
                   f"{regime.ratio:.3g}x the smallest RoCE buffer"
                   if regime.ratio is not None else "")
        if against and resend.ratio is not None:
            against += f" and {resend.ratio:.3g}x what it sends in a timeout"
        return (f"{w.iterations} iterations of {jobs}, on {gpus} GPUs (every message and "
                f"compute span / {job.byte_scale:,g}{against})")
    sizes = (", ".join(f"{s:,}" for s in w.sizes) + " B") if w.sizes else f"{w.size_bytes:,} B"
    extra = []
    if w.compute_us:
        extra.append(f"{w.compute_us:g} us compute")
    if w.stragglers.ranks:
        extra.append(f"stragglers {', '.join(map(str, w.stragglers.ranks))} "
                     f"+{w.stragglers.delay_us:g} us ({w.stragglers.distribution})")
    return (f"{w.iterations} x {w.collective} of {sizes} on {gpus} GPUs"
            + (f" ({'; '.join(extra)})" if extra else ""))


def _job_text(part) -> str:
    p = part.parallelism
    what = f"job {part.name}" if p is None else (
        f"a {part.name} job (dp {p.dp}, tp {p.tp}, pp {p.pp}, ep {p.ep}, "
        f"{p.micro_batches} micro-batches)")
    return f"{what} on GPUs {_ranks(part.ranks)}"


def _ranks(ranks) -> str:
    if list(ranks) == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def switch_buffer_total(plan: FabricPlan, classes) -> int:
    """Bytes all switch egress buffers hold when full."""
    return len(plan.switch_interfaces()) * sum(c.buffer_bytes for c in classes)


def ovs_buffer_warnings(caps: Capabilities, need: int) -> list:
    """Say so when userspace OVS could drop packets outside the emulated buffers."""
    if caps.datapath != "user":
        return []
    buffers = ovs_socket_buffers()
    if not buffers or not buffers.get("tx_sndbuf"):
        return ["could not read the send buffer of Open vSwitch's packet socket"]
    if buffers["tx_sndbuf"] < need:
        return [f"Open vSwitch's packet socket was created before this run with a "
                f"{buffers['tx_sndbuf']:,} B send buffer (this scenario needs {need:,} B): "
                "packets may be dropped inside OVS, outside the emulated buffers. Restart "
                "Open vSwitch so that the next run can size it."]
    return []


def _prefixed(progress: Say, prefix: str) -> Say:
    return lambda msg: progress(f"{prefix} {msg}")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


_held: List[int] = []  # SIGINT/SIGTERM that came while shielded, delivered when it ends
_depth = [0]  # shielded() regions open, nested


@contextlib.contextmanager
def shielded():
    """Hold off SIGINT/SIGTERM while tearing down, then deliver a pending one as
    KeyboardInterrupt when the outermost shielded region ends (nested ones hold it on)."""
    old = {}
    if not _depth[0]:
        old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in old:
            signal.signal(s, lambda sig, _f: _held.append(sig))
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1
        if not _depth[0]:
            for s, handler in old.items():
                signal.signal(s, handler)
            if _held:
                _held.clear()
                raise KeyboardInterrupt


def _shielded_call(fn) -> None:
    with shielded():
        fn()
