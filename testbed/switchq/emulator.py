"""The switch-queue emulator: what real switches do from their egress queue state.

``python -m testbed.switchq.emulator CONFIG.json`` runs beside a fabric. Every sample interval it
reads the backlog of every traffic-class buffer of every switch port (one netlink dump,
``testbed.base.netlink.QdiscSampler``) and acts as the policy's classes ask - decided by the
pure core in ``testbed.switchq.decide``, applied here:

* ECN: a class with an ``EcnRule`` marks while its rule says so (step: above K; RED-like:
  with probability p(q), drawn once per sample). A change is one map update of the marking
  program on the switch ports (``testbed.fabric.bpfmark``), which sets CE on the class's ECT packets
  leaving that port; where the kernel cannot run it, the change goes to the controller,
  which switches the port's OpenFlow marking group.
* PFC: a class with a ``PfcRule`` pauses the queues that feed its switch above XOFF and
  resumes them below XON (``testbed.switchq.pfc``); with a ``CreditRule`` (InfiniBand's credits)
  they wait while it has less room than they can still send, through the same gates. Each
  such class is a lane with state of its own: a held data lane never holds the CNP lane. A
  pause closes the fed queue's gate of that class (a tbf, see ``testbed.fabric.shaping``)
  with a prebuilt netlink message, in the root namespace for switch ports and in the GPU's
  namespace for NICs. After a resume the interface is sent one small frame (EtherType
  0x88B5, local experimental; a filter puts it in the highest-priority class and every
  policy drops it at the next switch): changing a tbf does not reschedule the device, and
  HTB would otherwise look at the reopened class only when its own timer fires - up to a
  second later (measured).
* Load: for adaptive routing, the backlog of the watched ports goes to the controller when it
  changed by a frame or more.

The sample interval is the emulated reaction time; it is recorded with the results, with the
sampling cost and lateness, the largest backlog seen per queue, marking time per port, and
pause events and paused time per paused queue, and when each GPU NIC was paused (the
recording: ``testbed.switchq.record``).
Prints ``ready <interval us> <acting classes, comma-separated, or ->`` when set up; SIGTERM
stops it, resumes anything paused and writes the report.

Why one module over 400 lines: one sample reads the queues and applies what the core decided
for ECN, PFC and adaptive routing's load, with the set-up each needs (the kernel programs, the
prebuilt pause messages); what it tells others and what it records live beside it
(``messages``, ``record``).
"""
from __future__ import annotations

import gc
import json
import os
import random
import signal
import socket
import sys
import time
from typing import Dict, List, Optional, Tuple

from controllers.classes import TrafficClass, class_dscps

from ..base.atomic import write_json_atomic
from ..base.errors import FabricError
from ..base.frames import link_frame_bytes
from ..base.netlink import (QdiscSampler, QueueStats, send_and_check, socket_in_netns, tbf_message,
                      tc_handle)
from ..base.procutil import die_with_parent, react_first
from ..fabric.bpf import Clsact
from ..fabric.bpfforward import ForwardingClock
from ..fabric.bpfmark import Marker
from ..fabric.bpfqueue import QueueCounters
from ..fabric.shaping import KICK_ETHERTYPE, gate_handle, gate_params, gate_parent
from .contract import EmulatorConfig, EmulatorReport
from .decide import QUIET_SPACING, SwitchQueues, low_water, roles
from .messages import Outbox, PfcRelay
from .pfc import PfcState, Queue
from .record import SampleCost, Timeline, peaks, spread


QUEUE_GONE = QueueStats(0, 0, 0, 0)
# The queue timeline's resolution in full frames' times at the GPU NIC rate (10 ms at the
# default 40 Mbit/s); where nothing acts on samples, also the sampling interval.
TIMELINE_FRAMES = 12
FULL_SAMPLE_FRAMES = 24  # every class's backlog, between the acting classes' samples
PAUSE, RESUME = 1, 2  # what happens to a queue: the index of its message in ``pause_msgs``
# Broadcast, from a MAC no GPU has, local experimental EtherType: dropped by every policy.
KICK_FRAME = (b"\xff" * 6 + bytes.fromhex("020000000000") + KICK_ETHERTYPE.to_bytes(2, "big")
              + b"testbed: resume".ljust(46, b"\0"))


class Emulator:
    def __init__(self, cfg: EmulatorConfig):
        self.cfg = cfg
        self.plan = cfg.plan
        self.classes: Tuple[TrafficClass, ...] = cfg.classes
        self.interval_ns = int(cfg.interval_us * 1000)
        self.frame = link_frame_bytes(cfg.mtu)
        # Every switch egress port: interface -> (switch, dpid, OpenFlow port).
        self.ports: Dict[str, Tuple[str, int, int]] = {}
        for link in self.plan.links:
            for node, port, intf in ((link.node1, link.port1, link.intf1),
                                     (link.node2, link.port2, link.intf2)):
                if not self.plan.is_host(node) and (not cfg.nodes
                                                    or node in cfg.nodes):
                    dpid = next(s.dpid for s in self.plan.switches if s.name == node)
                    self.ports[intf] = (node, dpid, port)  # on this server (split fabrics)
        self.watch: Optional[Dict[int, List[int]]] = (
            {d: list(ports) for d, ports in cfg.watch.items()} if cfg.watch else None)
        # The classes a sample acts on (marking, PFC, adaptive routing's load): sampled every
        # interval; every class, for the timeline and the largest backlogs, every window.
        # Where nothing acts, only the window's samples are taken.
        self.roles = roles(self.classes, cfg.ecn_marking, bool(self.watch))
        self.marks, self.lanes, self.acting = self.roles.marks, self.roles.lanes, self.roles.acting
        frame_ns = self.frame * 8e9 / (cfg.host_rate_mbit * 1e6)
        self.window_ns = int(TIMELINE_FRAMES * frame_ns)
        self.tick_ns = self.interval_ns if self.acting else self.window_ns
        # every class (largest backlogs, the counters' check): each window where nothing
        # acts, else every FULL_SAMPLE_FRAMES
        self.full_ns = int(FULL_SAMPLE_FRAMES * frame_ns) if self.acting else self.window_ns
        self.last_full_ns = 0
        self.port_order = sorted(self.ports)
        # the acting classes' queues, class by class, each in port order
        self.subset = [(intf, c.minor << 16) for c in self.acting for intf in self.port_order]
        self.sampler = QdiscSampler([(intf, c.minor << 16) for intf in self.port_order
                                     for c in self.classes], subset=self.subset)
        # who applies it: the kernel program on the ports (testbed.fabric.bpfmark), or the
        # controller
        self.marker: Optional[Marker] = None
        self.clsact: Optional[Clsact] = None
        self.counters_bpf: Optional[QueueCounters] = None  # the acting class, in the kernel
        self.clock: Optional[ForwardingClock] = None  # the switches' forwarding time
        self.clock_note = ""  # why it is not measured, if it is not
        self.counting = "netlink"  # how fast samples read the acting class's backlog
        self.bias: List[int] = [0] * len(self.ports)  # counted - true, after a queue dropped
        self.last_drops: Dict[str, int] = {}
        self.counter_errors: List[int] = []  # counted - true, per port and full sample
        self.via = cfg.marking_via
        # what the switches decide from each sample (pure), with its state over the run
        self.core = SwitchQueues(
            self.plan, self.roles, self.ports, tuple(self.port_order), self.watch, self.frame,
            low_water(self.roles, self.ports, cfg.host_rate_mbit, cfg.fabric_rate_mbit,
                      cfg.switch_rate_headroom, self.interval_ns), random.Random(cfg.seed))
        # (lane's minor, fed queue) -> (socket, [PAUSE] message, [RESUME] message)
        self.pause_msgs: Dict[Tuple[int, Queue], Tuple[socket.socket, bytes, bytes]] = {}
        self.kick_socks: Dict[Queue, socket.socket] = {}
        self.host_socks: Dict[str, tuple] = {}  # GPU -> ((netlink socket, its indexes), kick)
        self.root_sock: Optional[tuple] = None  # (netlink socket, indexes) of this namespace
        self.root_kick: Optional[socket.socket] = None
        self.quiet = False  # the last sample found every acting queue far below its thresholds
        self.max_backlog: Dict[Tuple[str, int], int] = {}  # (interface, qdisc handle)
        self.counters = {"samples": 0, "late": 0, "ecn_events": 0, "load_events": 0,
                         "pauses_sent": 0, "resumes_sent": 0, "events_deferred": 0,
                         "quiet": 0}
        self.cost = SampleCost()
        self.scheduling = "normal"  # how ``main`` got the CPU (``ahead_of_traffic``)
        self.events = None
        self.relay: Optional[PfcRelay] = None  # split fabrics: PFC to other servers' queues
        self.sockets = []
        self.timeline = Timeline(self.port_order, self.window_ns)

    # --- set-up -----------------------------------------------------------------------------
    def open(self) -> None:
        self.nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
        self.nl.bind((0, 0))
        self.sockets.append(self.nl)
        self.clsact = Clsact(self.nl)  # the switch ports', for both programs
        if self.cfg.queue_counting == "bpf" and len(self.acting) == 1:
            self._open_counters()
        clock = ForwardingClock(self.port_order, self.clsact)
        try:
            clock.open()
            self.clock = clock
        except (OSError, LookupError) as e:  # the monitor then judges by the latency floor
            clock.close()
            self.clock_note = f"the forwarding time could not be measured: {e}"
        if self.marks and self.via == "bpf":
            self.marker = Marker(self.port_order, class_dscps(self.marks, self.classes),
                                 clsact=self.clsact)
            try:
                self.marker.open()
            except (OSError, LookupError) as e:
                self.marker.close()
                raise FabricError(f"the ECN marking program could not be attached: {e}")
        openflow_marks = self.marks and self.via == "openflow"
        if self.cfg.events and (openflow_marks or self.watch):
            self.events = Outbox(self.cfg.events)
        if self.lanes and self.cfg.pfc_listen:
            self.relay = PfcRelay(self.cfg)
        for lane in self.lanes:
            self._prepare_pauses(lane)

    def _open_counters(self) -> None:
        """Count the acting class's queue bytes in the kernel (``testbed.fabric.bpfqueue``); where
        the kernel refuses, the samples ask the kernel for the qdiscs instead."""
        peers = {}
        for link in self.plan.links:
            for mine, far_node, far in ((link.intf1, link.node2, link.intf2),
                                        (link.intf2, link.node1, link.intf1)):
                if mine in self.ports:
                    peers[mine] = ((self.cfg.host_pids[far_node]
                                    if self.plan.is_host(far_node) else None), far)
        counters = QueueCounters(self.port_order, class_dscps(self.acting[0], self.classes),
                                 peers, self.clsact)
        try:
            counters.open()
        except (OSError, LookupError, KeyError) as e:
            counters.close()
            self.counting = f"netlink (the kernel counters could not be set up: {e})"
            return
        self.counters_bpf = counters
        self.counting = "bpf"

    def _prepare_pauses(self, lane: TrafficClass) -> None:
        """Prebuild the pause and resume message of every queue ``lane``'s flow control may
        hold (its gate of that class); the sockets are shared by the lanes."""
        if self.root_sock is None:  # the first lane: this namespace's sockets
            root = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
            root.bind((0, 0))
            self.root_sock = (root, {name: idx for idx, name in socket.if_nameindex()})
            self.root_kick = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
            self.sockets += [root, self.root_kick]
        state = self.core.held[lane.minor]
        if self.relay:  # every queue of this server that feeds any switch of the fabric
            every = [Queue(n, i) for link in self.plan.links
                     for n, i in ((link.node1, link.intf1), (link.node2, link.intf2))
                     if not self.plan.is_host(n)]
            fed = {f for q in every for f in state.feeders_of(q) if self.relay.local(f)}
        else:
            fed = {f for intf, (node, _d, _p) in self.ports.items()
                   for f in state.feeders_of(Queue(node, intf))}
        mtu, handle = self.cfg.mtu, gate_handle(lane) << 16
        delayed = set(self.cfg.delayed)
        for q in sorted(fed, key=lambda q: (q.node, q.intf)):
            parent = tc_handle(gate_parent(lane, q.intf in delayed))
            if self.plan.is_host(q.node):
                if q.node not in self.host_socks:
                    pid = self.cfg.host_pids[q.node]
                    self.host_socks[q.node] = (socket_in_netns(pid),
                                               socket_in_netns(pid, socket.AF_PACKET)[0])
                    self.sockets += [self.host_socks[q.node][0][0], self.host_socks[q.node][1]]
                (sock, index), self.kick_socks[q] = self.host_socks[q.node]
                rate = self.cfg.host_rate_mbit
                buffer = lane.nic_buffer_bytes or self.cfg.nic_queue_bytes
            else:
                (sock, index), self.kick_socks[q] = self.root_sock, self.root_kick
                rate, buffer = self._rate(q.intf), lane.buffer_bytes
            msgs = [tbf_message(index[q.intf], handle, parent, g.rate_bytes, g.burst, g.limit)
                    for g in (gate_params(rate, mtu, buffer, paused=True),
                              gate_params(rate, mtu, buffer, paused=False))]
            self.pause_msgs[(lane.minor, q)] = (sock, msgs[0], msgs[1])  # [PAUSE], [RESUME]

    def _rate(self, intf: str) -> float:
        for link in self.plan.links:
            if intf in (link.intf1, link.intf2):
                return (self.cfg.host_rate_mbit if link.kind == "host"
                        else self.cfg.fabric_rate_mbit)
        raise KeyError(intf)

    # --- one sample ---------------------------------------------------------------------------
    def step(self, now: int) -> None:
        """One sample: every class's backlog each window (also for the largest backlogs),
        the acting classes' in between; then marking, PFC, load and the timeline."""
        order = self.port_order
        if now - self.last_full_ns >= self.full_ns or not self.acting:
            self.last_full_ns = now
            stats = self.sampler.sample()
            top = self.max_backlog
            for key, st in stats.items():
                if st.backlog > top.get(key, 0):
                    top[key] = st.backlog
            zero = QUEUE_GONE
            by_class = {c.minor: [stats.get((i, c.minor << 16), zero).backlog for i in order]
                        for c in self.classes}
            if self.counters_bpf:
                self._check_counters(stats, by_class[self.acting[0].minor])
        else:
            if self.counters_bpf:
                values = [max(0, b - e) for b, e in zip(self.counters_bpf.backlogs(),
                                                        self.bias)]
            else:
                values = self.sampler.sample_subset()
            n = len(order)
            by_class = {c.minor: values[k * n:(k + 1) * n] for k, c in enumerate(self.acting)}
            top = self.max_backlog
            for key, b in zip(self.subset, values):
                if b > top.get(key, 0):
                    top[key] = b
        act = self.core.decide(by_class, now)
        self.quiet = act.quiet
        for intf, want in act.marks:
            if self.marker:
                self.marker.set(intf, want)
            elif self.events:
                _node, dpid, port = self.ports[intf]
                self.events.ecn[(dpid, port)] = want
        self.counters["ecn_events"] += len(act.marks)
        for minor, pause, resume in act.holds:
            self._apply(minor, pause, PAUSE)
            self._apply(minor, resume, RESUME)
            self.counters["pauses_sent"] += len(pause)
            self.counters["resumes_sent"] += len(resume)
        if self.relay:  # pauses and resumes other servers decided for queues here
            for minor, q, action in self.relay.receive():
                self._apply(minor, [q], action)
            self.relay.flush()
        if act.load is not None and self.events:
            self.events.load = act.load
            self.counters["load_events"] += 1
        if self.events:
            self.counters["events_deferred"] += not self.events.flush()
        pfc = self.core.pfc
        self.timeline.add(by_class[self.roles.load_class.minor],
                          (q.intf for q in pfc.paused_since) if pfc else (), now)

    def _check_counters(self, stats, true: List[int]) -> None:
        """At a full sample: the kernel counters against the qdiscs' own backlogs. A queue
        that dropped packets since the last one counts them still (they never reached the
        peer): its correction is redone."""
        handle = self.acting[0].minor << 16
        counted = self.counters_bpf.backlogs()
        for k, intf in enumerate(self.port_order):
            drops = stats.get((intf, handle), QUEUE_GONE).drops
            if drops != self.last_drops.get(intf, 0):
                self.last_drops[intf] = drops
                self.bias[k] = counted[k] - true[k]
            error = counted[k] - self.bias[k] - true[k]
            self.counter_errors.append(error)

    def _apply(self, minor: int, queues: List[Queue], which: int) -> None:
        if self.relay:
            for q in [q for q in queues if not self.relay.local(q)]:
                self.relay.send(minor, q, which)
            queues = [q for q in queues if self.relay.local(q)]
        by_socket: Dict[socket.socket, List[bytes]] = {}
        for q in queues:
            entry = self.pause_msgs.get((minor, q))
            if entry:
                by_socket.setdefault(entry[0], []).append(entry[which])
        for sock, messages in by_socket.items():
            send_and_check(sock, messages)
        if which == RESUME:  # make the kernel look at the queue now
            for q in queues:
                if q in self.kick_socks:
                    self.kick_socks[q].sendto(KICK_FRAME, (q.intf, 0))

    # --- the loop -----------------------------------------------------------------------------
    def run(self, stop) -> None:
        interval = self.tick_ns
        next_at = last = time.monotonic_ns()
        cost = 0  # a sample's usual cost (moving average)
        while not stop():
            t0 = time.monotonic_ns()
            if self.counters["samples"]:
                self.cost.gap_ns.append(t0 - last)
            last = t0
            if t0 - next_at > interval:
                self.counters["late"] += 1
                next_at = t0
            self.step(time.time_ns())
            self.counters["samples"] += 1
            took = time.monotonic_ns() - t0
            self.cost.took_ns.append(took)
            # quiet (no queue can reach a threshold before the one after it): skip a sample
            next_at += interval * (QUIET_SPACING if self.quiet else 1)
            if self.quiet:
                self.counters["quiet"] += QUIET_SPACING - 1
            # leave the CPU to the traffic: sleep at least as long as a sample usually takes
            # (the VM test's TCG guest needs up to 3 ms per sample, against 1 ms intervals);
            # one slow sample (the CPU taken away meanwhile) does not delay the next
            cost = took if not cost else (15 * cost + took) // 16
            time.sleep(max(next_at - time.monotonic_ns(), cost) / 1e9)

    def finish(self) -> EmulatorReport:
        now = time.time_ns()
        core = self.core
        for minor, state in core.held.items():
            self._apply(minor, list(state.paused_since), RESUME)  # leave nothing paused
        core.finish(now)
        lead = core.pfc  # the data lane's: the run's PFC or credit figures
        held = lead.report() if lead else {}
        credit = bool(lead) and lead.rule.kind == "credit"
        pfc, waits = ({}, held) if credit else (held, {})
        if self.relay:
            self.relay.flush()  # the resumes above, to the other servers
            self.counters.update(self.relay.counters)
        return EmulatorReport(
            interval_us=self.tick_ns / 1000,
            acting_classes=tuple(c.name for c in self.acting),
            acting_backlog_from=self.counting,
            quiet_below_bytes=core.low_water,
            quiet_samples_skipped=self.counters["quiet"],
            counter_error_bytes=spread(self.counter_errors) if self.counters_bpf else None,
            all_classes_every_us=self.full_ns / 1000,
            scheduling=self.scheduling,
            counters=dict(self.counters),
            sample_ms=self.cost.report(self.tick_ns),
            max_backlog=peaks(self.max_backlog, {c.minor << 16: c.name for c in self.classes}),
            ecn={intf: {"toggles": core.toggles[intf],
                        "marking_ms": round(core.marking_ns.get(intf, 0) / 1e6, 3)}
                 for intf in sorted(core.toggles)},
            pfc=pfc,
            pfc_pause_events=sum(v["events"] for v in pfc.values()),
            pfc_paused_ms=round(sum(v["paused_ms"] for v in pfc.values()), 3),
            credit=waits,
            credit_buffer_bytes=lead.rule.buffer if credit else None,
            credit_waits=sum(v["waits"] for v in waits.values()),
            credit_wait_ms=round(sum(v["waited_ms"] for v in waits.values()), 3),
            lanes={c.name: lane_report(c, core.held[c.minor]) for c in self.lanes},
            # each switch hop's forwarding time: {bucket: packets}, BUCKET_NS wide (emulated)
            forwarding_histogram=({str(i): c for i, c in enumerate(self.clock.histogram())
                                   if c} if self.clock else None),
            forwarding_note=self.clock_note or None,
            # for the fidelity monitor, which leaves a paused NIC's silence out of its pacing
            gpu_pauses_ns=({g: tuple(spans) for g, spans in
                            lead.spans_of({g.name for g in self.plan.gpus}).items()}
                           if lead else {}))

    def close(self) -> None:
        if self.marker:  # nothing marks once the emulator is gone (also after an error)
            self.marker.close()
        if self.counters_bpf:
            self.counters_bpf.close()
        if self.clock:
            self.clock.close()
        if self.clsact:
            self.clsact.close()
        for s in self.sockets + [self.sampler.sock] + ([self.events.sock] if self.events else []):
            s.close()
        if self.relay:
            self.relay.close()


def lane_report(lane: TrafficClass, state: PfcState) -> dict:
    """One lossless class's flow control over the run: what held its feeders, at what
    backlog, how often and how long (summed over the queues held)."""
    return {"flow_control": state.rule.kind, "holds_above_bytes": state.rule.threshold,
            "buffer_bytes": lane.buffer_bytes,
            "holds": sum(state.pause_events.values()),
            "held_ms": round(sum(state.paused_ns.values()) / 1e6, 3)}


def ahead_of_traffic() -> str:
    """Real switches react in hardware: the emulator samples on time, ahead of the traffic.
    Real-time (SCHED_FIFO, the lowest priority): as a fair-class task, even at nice -20, a
    sample due while an agent or ovs-vswitchd runs waits out their scheduler slice, up to
    3-5 ms (docs/emulation-cost.md, "Scheduling and the host's own noise"); a sample is
    short and the loop sleeps at least as long as one usually takes, so it never holds a CPU.
    Without the privilege: nice -10 and a short slice. Returns what it got."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        return "SCHED_FIFO 1"
    except (OSError, AttributeError):
        return react_first(-10) or "normal"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    die_with_parent()
    with open(argv[0], encoding="utf-8") as f:
        cfg = EmulatorConfig.from_dict(json.load(f))
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    emu = Emulator(cfg)
    emu.scheduling = ahead_of_traffic()
    try:
        emu.open()
        print(f"ready {emu.tick_ns // 1000} {','.join(c.name for c in emu.acting) or '-'}",
              flush=True)
        # the loop makes no reference cycles: no collector pauses between samples
        gc.collect()
        gc.freeze()
        gc.disable()
        emu.run(lambda: bool(stopping))
        write_json_atomic(cfg.out, emu.finish().to_dict())
        if cfg.timeline:
            emu.timeline.write(cfg.timeline)
    finally:
        emu.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
