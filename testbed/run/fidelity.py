"""Fidelity monitor: does a run keep the timing invariants its numbers rely on?

Mininet-HiFi (Handigol et al., CoNEXT 2012): trust an emulation only where the network's
invariants hold, and report the deviations. Every run checks itself:

* **inter-dequeue**: while a GPU NIC's link is busy, consecutive frames must leave it one
  serialization time apart at the configured rate (frame bytes x 8 / rate). Measured from the
  agents' kernel transmit timestamps (taken when the veth driver takes the frame, after the
  HTB-shaped queue); a gap is *busy* when the next frame reached the NIC before the previous
  one would have left the wire. A token bucket runs ahead of an ideal link by up to its burst
  after an idle spell (reported as a bound). Errors are counted in MTU-frame times, so
  microseconds on a small ACK weigh little. A gap during which PFC paused the NIC is left
  out: its silence is the modelled fabric's, not a pacing error (counted beside);
* **idle-path latency**: what the emulator adds to a path apart from the queues it models -
  its switches' forwarding time, measured on every RoCE packet at every switch hop in the
  kernel (``testbed.fabric.bpfforward``): its floor - the hop time a tenth of hops beat, the
  latency floor without the modelled queues in it - times the hops of a path across leaves
  must be small against one MTU frame's serialization time at the host rate, the finest time
  step the emulated fabric resolves (the median and tail are reported beside it). Where the
  kernel cannot measure it, the lowest one-way latency into each destination GPU less the
  modelled fixed path delay stands for it (it counts queueing too where no path is ever
  idle: a contended job's). Either way, the lowest latency on a GPU pair may not fall below
  the model's fixed path delay (testbed.base.hops: switch ports, cables and the frame's own
  transmission) by as much: a delay the model asks for was not applied;
* **CPU headroom**: the machine's CPUs, sampled during the traffic (``/proc/stat``); a saturated
  CPU delays packets outside any emulated queue;
* **agent loop lag**: how late the agents acted on their timers (ends of compute phases,
  pacing, retransmission timeouts), from a log histogram each agent keeps; the lag of the
  very first start is reported beside it (all ranks start at once and compete for the CPUs;
  it skews iteration 0 only);
* **emulator drops**: packets lost outside every emulated buffer (docs/DESIGN.md).

``evaluate`` returns the checks, their measured values and tolerances, and a verdict; the CLI
prints a warning for a run outside tolerance and suggests lower rates.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
import os
import threading
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from traffic.records import record_path

from ..base.frames import full_frame_bytes
from ..fabric.shaping import burst_bytes
from ..results.model import (AgentLoopLag, Check, CpuCheck, DropsCheck, Fidelity,
                             FidelityChecks, IdlePathCheck, InterDequeueCheck, LagCheck)
from .cost import machine_cpu_s

VERDICT_OK = "ok"
VERDICT_BAD = "outside tolerance"
ADVICE = ("Numbers from this run may reflect the emulator rather than the fabric: rerun with "
          "lower link rates (topology.host_rate_mbit: auto chooses one this machine holds, "
          "or e.g. {rate:g}), fewer GPUs, or on a machine with more cores.")


def serialization_us(frame_bytes, rate_bps: float):
    return np.asarray(frame_bytes, dtype=float) * 8e6 / rate_bps


def busy_gap_deviation(sent_ns: Sequence[int], tx_ns: Sequence[int], frame_bytes: Sequence[int],
                       rate_bps: float, unit_us: float,
                       paused_ns: Sequence[Tuple[int, int]] = ()) -> Tuple[np.ndarray, int]:
    """(gap - serialization) / ``unit_us`` for every gap during which the NIC stayed busy and
    was not paused; and how many busy gaps a pause overlapped (left out).

    Frames in transmit order. Frame k occupies the wire for its serialization time after it
    leaves the shaped queue at ``tx_ns[k]``; if frame k+1 reached the NIC (``sent_ns``) before
    the wire was free again, the link was busy and an ideal link sends frame k+1 exactly one
    serialization time after frame k - unless PFC paused the NIC meanwhile (``paused_ns``:
    disjoint (paused, resumed) spans in time order). Deviations are in units of ``unit_us``
    (one MTU frame's serialization time), so a 10 us error on a 12 us ACK weighs what it
    costs."""
    sent = np.asarray(sent_ns, dtype=np.int64)
    tx = np.asarray(tx_ns, dtype=np.int64)
    size = np.asarray(frame_bytes, dtype=np.int64)
    if tx.size < 2:
        return np.zeros(0), 0
    order = np.argsort(tx, kind="stable")
    sent, tx, size = sent[order], tx[order], size[order]
    ser_us = serialization_us(size[:-1], rate_bps)
    busy = sent[1:] < tx[:-1] + (ser_us * 1000).astype(np.int64)
    paused = overlaps_a_span(tx[:-1], tx[1:], paused_ns) & busy
    busy &= ~paused
    gaps_us = (tx[1:] - tx[:-1])[busy] / 1000.0
    return (gaps_us - ser_us[busy]) / unit_us, int(paused.sum())


def overlaps_a_span(start: np.ndarray, end: np.ndarray,
                    spans: Sequence[Tuple[int, int]]) -> np.ndarray:
    """Whether each interval (start, end) overlaps one of ``spans`` (disjoint, in time order)."""
    if not len(spans):
        return np.zeros(start.size, dtype=bool)
    s = np.asarray(spans, dtype=np.int64)
    last = np.searchsorted(s[:, 0], end, side="left") - 1  # the last span begun before end
    return (last >= 0) & (s[np.maximum(last, 0), 1] > start)


def inter_dequeue_check(deviations: Sequence[float], tolerance: float,
                        within: float) -> InterDequeueCheck:
    d = np.asarray(deviations, dtype=float)
    if d.size == 0:
        return InterDequeueCheck(ok=None, busy_gaps=0, note="no busy gaps measured")
    share = float(np.mean(np.abs(d) <= tolerance))
    p10, p50, p90 = np.percentile(d, [10, 50, 90])
    return InterDequeueCheck(
        ok=share >= within, busy_gaps=int(d.size), share_within_tolerance=round(share, 4),
        tolerance=tolerance, required_share=within, deviation_p10=round(float(p10), 4),
        deviation_p50=round(float(p50), 4), deviation_p90=round(float(p90), 4))


# The statistic of a switch hop's forwarding time that stands for the emulator's floor: the
# fastest hops, as the lowest latency was, without the jitter of one lucky packet.
FORWARDING_FLOOR = "p10_us"


def idle_path_check(minima_us: Dict[tuple, float], excess_us: Dict[tuple, float],
                    allowed_us: float, forwarding: Optional[dict] = None,
                    hops: int = 3) -> IdlePathCheck:
    """The emulator's own cost on a path (``overhead_us``): ``forwarding``'s floor, its hop
    p10 (``testbed.fabric.bpfforward.summary``), times ``hops``, the switches of the longest
    path;
    without it, the median over destination GPUs of the lowest latency excess into each
    (``excess_us``: per GPU pair, the lowest latency less its modelled path delay; an
    incast's pairs share their destination's last hop: one observation, however many
    senders). It must be small; the lowest excess must not be negative by as much (a delay
    not applied)."""
    if not minima_us:
        return IdlePathCheck(ok=None, paths=0, note="no packets")
    over = np.asarray([excess_us[k] for k in minima_us], dtype=float)
    minima = np.asarray(list(minima_us.values()), dtype=float)
    into: Dict[int, float] = defaultdict(lambda: float("inf"))
    for (_src, dst), excess in zip(minima_us, over.tolist()):
        into[dst] = min(excess, into[dst])
    floor, lowest = float(np.median(list(into.values()))), float(over.min())
    overhead = forwarding[FORWARDING_FLOOR] * hops if forwarding else floor
    return IdlePathCheck(
        ok=overhead <= allowed_us and lowest >= -allowed_us, paths=int(over.size),
        destinations=len(into), overhead_from="forwarding" if forwarding else "latency floor",
        overhead_us=round(overhead, 3), allowed_overhead_us=round(allowed_us, 3),
        forwarding_us=forwarding, hops=hops,
        min_latency_us_median=round(float(np.median(minima)), 3),
        min_latency_us_worst=round(float(minima.max()), 3), floor_overhead_us=round(floor, 3),
        overhead_us_worst=round(float(over.max()), 3), overhead_us_lowest=round(lowest, 3))


def cpu_check(samples: Sequence[float], busy_max: float) -> CpuCheck:
    a = np.asarray(samples, dtype=float)
    if a.size == 0:
        return CpuCheck(ok=None, samples=0, note="not sampled")
    p90 = float(np.percentile(a, 90))
    return CpuCheck(ok=p90 <= busy_max, samples=int(a.size), busy_mean=round(float(a.mean()), 3),
                    busy_p90=round(p90, 3), busy_max=round(float(a.max()), 3),
                    allowed_busy_p90=busy_max, headroom_p90=round(1 - p90, 3),
                    cpus=os.cpu_count())


def lag_check(lag: Optional[AgentLoopLag], allowed_us: float) -> LagCheck:
    """95% of the agents' timed actions (compute-phase ends, pacing, retransmission timers)
    must happen within ``allowed_us`` of their time."""
    if lag is None or not lag.count:
        return LagCheck(ok=None, note="no timer wake-ups measured")
    return LagCheck(ok=lag.p95_us <= allowed_us, p50_us=lag.p50_us, p95_us=lag.p95_us,
                    p99_us=lag.p99_us, max_us=lag.max_us, samples=lag.count,
                    allowed_p95_us=round(allowed_us, 3),
                    first_start_lag_us_max=lag.first_start_lag_us_max,
                    scheduling=lag.scheduling, by_timer=lag.by_timer)


def drops_check(unexplained: int) -> DropsCheck:
    return DropsCheck(ok=unexplained == 0, unexplained_drops=unexplained)


LABELS = {"inter_dequeue": "busy NICs did not pace frames at the configured rate",
          "idle_path_latency": "the emulated paths add more than the model's delay",
          "cpu": "the CPUs were saturated",
          "agent_loop_lag": "the traffic agents woke late for their timers",
          "emulator_drops": "packets were lost outside the emulated buffers"}


def verdict(checks: FidelityChecks, host_rate_mbit: float) -> Fidelity:
    problems = tuple(f"{LABELS[name]} ({_detail(c)})" for name, c in checks.items()
                     if c.ok is False)
    return Fidelity(verdict=VERDICT_BAD if problems else VERDICT_OK, problems=problems,
                    advice=(ADVICE.format(rate=max(1.0, round(host_rate_mbit / 2, 1)))
                            if problems else None),
                    checks=checks)


def _detail(c: Check) -> str:
    if isinstance(c, InterDequeueCheck):
        return (f"{c.share_within_tolerance:.0%} of {c.busy_gaps:,} gaps within "
                f"{c.tolerance:.0%} of a frame time, need {c.required_share:.0%}")
    if isinstance(c, IdlePathCheck):
        if c.overhead_us_lowest < -c.allowed_overhead_us:
            return (f"a floor {-c.overhead_us_lowest:,.0f} us below the modelled path delay: "
                    "a delay the model asks for was not applied")
        if c.overhead_from == "forwarding":
            return (f"the switches' forwarding adds {c.overhead_us:,.0f} us to a path of "
                    f"{c.hops} hops (a tenth of hops took under "
                    f"{c.forwarding_us[FORWARDING_FLOOR]:,.0f} us), "
                    f"allowed {c.allowed_overhead_us:,.0f} us")
        return f"{c.overhead_us:,.0f} us over idle, allowed {c.allowed_overhead_us:,.0f} us"
    if isinstance(c, CpuCheck):
        return f"p90 busy {c.busy_p90:.0%}, allowed {c.allowed_busy_p90:.0%}"
    if isinstance(c, LagCheck):
        text = f"p95 {c.p95_us:,.0f} us, allowed {c.allowed_p95_us:,.0f} us"
        late = {k: v for k, v in (c.by_timer or {}).items() if v.p95_us is not None}
        if late:  # the kind of timer with the latest tail, and how many of them there were
            kind, worst = max(late.items(), key=lambda kv: kv[1].p95_us)
            text += f"; latest: {kind} timers (p95 {worst.p95_us:,.0f} us of {worst.count:,})"
        return text
    if isinstance(c, DropsCheck):
        return f"{c.unexplained_drops:,} packets"
    return ""


def read_tx_log(path: str):
    """(reached the NIC ns, tx_ns, bytes) of every frame in an agent's tx file. A frame a
    DCQCN rate limiter held reached the NIC's shaper when the limiter let it go
    (``ready_ns``), not when the agent handed it over (``sent_ns``)."""
    sent, tx, size = [], [], []
    if not os.path.exists(path):
        return sent, tx, size
    with open(path, encoding="utf-8") as f:
        header = f.readline().strip().split(",")
        if "bytes" not in header:
            return sent, tx, size
        i_s, i_t, i_b = header.index("sent_ns"), header.index("tx_ns"), header.index("bytes")
        i_r = header.index("ready_ns") if "ready_ns" in header else None
        for line in f:
            parts = line.rstrip("\n").split(",")
            sent.append(int(parts[i_r] if i_r is not None and parts[i_r] else parts[i_s]))
            tx.append(int(parts[i_t]))
            size.append(int(parts[i_b]))
    return sent, tx, size


def evaluate(records_dir: str, plan, figures: dict, path_minima_us: Dict[tuple, float],
             path_excess_us: Dict[tuple, float], cpu_samples: Sequence[float], scenario,
             gpu_pauses_ns: Dict[str, list], forwarding: Optional[dict] = None) -> Fidelity:
    """The fidelity section of one policy's results (``path_minima_us``: per GPU pair the
    lowest latency, ``path_excess_us`` the lowest excess over ``expected_latency_us``;
    ``gpu_pauses_ns``: when PFC paused each GPU's NIC, from the queue emulator;
    ``forwarding``: its switches' forwarding time per hop, if measured)."""
    t, f = scenario.topology, scenario.fidelity
    rate = t.host_rate_mbit * 1e6
    frame = full_frame_bytes(scenario.workload.mtu)
    unit = float(serialization_us(frame, rate))
    measured = [busy_gap_deviation(*read_tx_log(record_path(records_dir, h.name, "tx")),
                                   rate_bps=rate, unit_us=unit,
                                   paused_ns=gpu_pauses_ns.get(h.name, ())) for h in plan.gpus]
    d = np.concatenate([m[0] for m in measured]) if measured else np.zeros(0)
    allowed = f.overhead_share * unit
    burst = burst_bytes(t.host_rate_mbit, scenario.workload.mtu, nic=True)
    inter = replace(inter_dequeue_check(d, f.inter_dequeue_tolerance, f.inter_dequeue_within),
                    paused_gaps_left_out=sum(m[1] for m in measured), shaper_burst_bytes=burst,
                    shaper_run_ahead_us_max=round(float(serialization_us(burst, rate)), 3))
    checks = FidelityChecks(
        inter_dequeue=inter,
        idle_path_latency=idle_path_check(path_minima_us, path_excess_us, allowed, forwarding,
                                          3 if plan.n_leaves > 1 else 1),
        cpu=cpu_check(cpu_samples, f.cpu_busy_max),
        agent_loop_lag=lag_check(figures["agent_loop_lag_us"], allowed),
        emulator_drops=drops_check(figures["unexplained_drops"]))
    return verdict(checks, t.host_rate_mbit)


def cpu_counters() -> Tuple[float, float]:
    """The machine's CPU time so far (s): (all, idle + iowait)."""
    cpu = machine_cpu_s()
    return sum(cpu.values()), cpu["idle"] + cpu["iowait"]


def busy_between(last: Tuple[float, float], now: Tuple[float, float]) -> Optional[float]:
    """The CPUs' busy share between two ``cpu_counters`` readings (None: no time passed)."""
    total, idle = now[0] - last[0], now[1] - last[1]
    return 1.0 - idle / total if total > 0 else None


class CpuSampler:
    """Samples the machine's CPU busy share from /proc/stat in a thread."""

    def __init__(self, interval_s: float = 0.1):
        self.interval_s = interval_s
        self.samples: List[float] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _run(self):
        last = cpu_counters()
        while not self._stop.wait(self.interval_s):
            now = cpu_counters()
            share = busy_between(last, now)
            if share is not None:
                self.samples.append(share)
            last = now

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
        return False
