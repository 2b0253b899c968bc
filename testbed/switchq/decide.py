"""What the switches do from their egress queue state, decided (pure): backlogs in, actions out.

One sample's backlogs per acting class (port order) go in; out come the ports whose ECN marking
turns on or off (the marking class's rule, RED-like rules drawn once per sample), the queues
each lossless lane pauses and resumes (``testbed.switchq.pfc``), and the backlog of the ports
adaptive routing watches when it changed by a frame or more. ``testbed.switchq.emulator``
samples the kernel and applies the actions; this core keeps the state between samples and the
bookkeeping its report needs (marking time and toggles per port, the lanes' pauses).

A sample is quiet when no acting queue can reach a threshold before the sample after next:
each is below its lowest threshold by more than it can grow in that time (every other port of
its switch sending into it at line rate), and nothing marks or is held.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from controllers.classes import TrafficClass

from ..base.topology import FabricPlan
from .pfc import PfcState, Queue

LOAD_EVERY_NS = 5_000_000  # adaptive routing needs the trend, not every sample
QUIET_SPACING = 2  # intervals between samples while every queue is far from a threshold
Port = Tuple[str, int, int]  # a switch egress port: (switch, dpid, OpenFlow port)
Load = Dict[int, Dict[int, int]]  # dpid -> OpenFlow port -> backlog (bytes)


class Actions(NamedTuple):
    """What one sample decided (a tuple: made once per sample, every millisecond)."""

    quiet: bool
    marks: Tuple[Tuple[str, bool], ...] = ()  # (port interface, marking from now on)
    holds: Tuple[Tuple[int, Tuple[Queue, ...], Tuple[Queue, ...]], ...] = ()  # lane: pause, resume
    load: Optional[Load] = None  # the watched ports' backlog, to tell the controller


@dataclass(frozen=True)
class Roles:
    """Which of a port's classes act on samples: the one that marks ECN here (None where the
    kernel's RED marks, or no class has a rule), the lossless lanes, the class whose backlog is
    the ports' load; and every class sampled between full samples (``acting``)."""

    marks: Optional[TrafficClass]
    lanes: Tuple[TrafficClass, ...]
    data_lane: Optional[TrafficClass]  # the lane that also marks (RoCE's): the PFC figures
    load_class: TrafficClass
    acting: Tuple[TrafficClass, ...]


def roles(classes: Sequence[TrafficClass], ecn_marking: Optional[str], watching: bool) -> Roles:
    """The roles of ``classes`` when the switches mark by ``ecn_marking`` ("sampled": this
    emulator) and adaptive routing ``watching`` the ports' load."""
    ecn_class = next((c for c in classes if c.ecn), None)
    lanes = tuple(c for c in classes if c.flow_control)
    data_lane = next((c for c in lanes if c.ecn), lanes[0] if lanes else None)
    load_class = data_lane or ecn_class or classes[0]
    marks = ecn_class if ecn_marking == "sampled" else None
    acting = {c.minor: c for c in (marks,) + lanes if c}
    if watching:
        acting[load_class.minor] = load_class
    return Roles(marks, lanes, data_lane, load_class, tuple(acting.values()))


def low_water(r: Roles, ports: Mapping[str, Port], host_rate_mbit: float,
              fabric_rate_mbit: float, headroom: float, interval_ns: int) -> int:
    """The backlog below which an acting queue cannot cross its lowest threshold within
    ``QUIET_SPACING`` + 1 intervals: at most every other port of the switch at line rate (plus
    the switch headroom) fills it while it drains at its own rate (-1: nothing to cross)."""
    thresholds = [t for c in r.acting for t in
                  ([c.ecn.kmin] if c.ecn and c is r.marks else [])
                  + ([c.flow_control.threshold] if c in r.lanes else [])]
    if not thresholds:
        return -1
    per_switch: Dict[str, int] = {}
    for node, _d, _p in ports.values():
        per_switch[node] = per_switch.get(node, 0) + 1
    fast = max(host_rate_mbit, fabric_rate_mbit) * (1 + headroom)
    slow = min(host_rate_mbit, fabric_rate_mbit)
    fill_bps = max(0.0, (max(per_switch.values()) - 1) * fast - slow) * 1e6
    grow = fill_bps / 8 * interval_ns * (QUIET_SPACING + 1) / 1e9
    return int(min(thresholds) - grow)


@dataclass
class SwitchQueues:
    """The switches' decisions over a run. ``ports``: this server's switch egress ports,
    ``order`` the order backlogs come in; ``watch``: dpid -> OpenFlow ports whose load
    adaptive routing reads (None: no adaptive routing); ``frame``: a full frame's bytes."""

    plan: FabricPlan
    roles: Roles
    ports: Dict[str, Port]
    order: Tuple[str, ...]
    watch: Optional[Dict[int, List[int]]]
    frame: int
    low_water: int
    rng: random.Random
    marking: Dict[str, bool] = field(default_factory=dict)
    marking_since: Dict[str, int] = field(default_factory=dict)
    marking_ns: Dict[str, int] = field(default_factory=dict)
    toggles: Dict[str, int] = field(default_factory=dict)
    held: Dict[int, PfcState] = field(default_factory=dict)  # lane's minor -> its state
    last_load: Load = field(default_factory=dict)
    last_load_ns: int = 0

    def __post_init__(self):
        if not self.held:
            self.held = {c.minor: PfcState(self.plan, c.flow_control) for c in self.roles.lanes}
        self.queues = [Queue(self.ports[intf][0], intf) for intf in self.order]

    @property
    def pfc(self) -> Optional[PfcState]:
        """The data lane's flow control (the run's PFC or credit figures)."""
        lane = self.roles.data_lane
        return self.held[lane.minor] if lane else None

    def decide(self, by_class: Mapping[int, List[int]], now: int) -> Actions:
        """One sample: ``by_class`` maps each acting class's minor to its backlogs in
        ``order``."""
        r = self.roles
        quiet = self._quiet(by_class)
        marks: Tuple[Tuple[str, bool], ...] = ()
        holds = []
        if not quiet:
            if r.marks:
                marks = tuple(self._ecn(by_class[r.marks.minor], now))
            for lane in r.lanes:
                pause, resume = self.held[lane.minor].update(
                    dict(zip(self.queues, by_class[lane.minor])), now)
                if pause or resume:
                    holds.append((lane.minor, tuple(pause), tuple(resume)))
        load = self._load(by_class[r.load_class.minor], now) if self.watch else None
        return Actions(quiet, marks, tuple(holds), load)

    def finish(self, now: int) -> None:
        """Close what is open at the end of a run: pauses and marking."""
        for state in self.held.values():
            state.finish(now)
        for intf in list(self.marking_since):
            self.marking_ns[intf] = self.marking_ns.get(intf, 0) + now - self.marking_since[intf]
        self.marking_since.clear()

    def _quiet(self, by_class: Mapping[int, List[int]]) -> bool:
        if not self.roles.acting or self.marking_since or any(
                state.paused_since or state.congested for state in self.held.values()):
            return False
        low = self.low_water
        return all(b <= low for c in self.roles.acting for b in by_class[c.minor])

    def _ecn(self, backlog: List[int], now: int):
        rule, marking = self.roles.marks.ecn, self.marking
        for intf, b in zip(self.order, backlog):
            if b < rule.kmin and not marking.get(intf):
                continue  # below the lowest threshold and not marking: nothing to decide
            p = rule.probability(b)
            want = p >= 1.0 or (p > 0.0 and self.rng.random() < p)
            if want == marking.get(intf, False):
                continue
            marking[intf] = want
            self.toggles[intf] = self.toggles.get(intf, 0) + 1
            if want:
                self.marking_since[intf] = now
            else:
                self.marking_ns[intf] = (self.marking_ns.get(intf, 0) + now
                                         - self.marking_since.pop(intf, now))
            yield intf, want

    def _load(self, values: List[int], now: int) -> Optional[Load]:
        if now - self.last_load_ns < LOAD_EVERY_NS:
            return None
        self.last_load_ns = now
        backlog = dict(zip(self.order, values))
        load = {dpid: {port: backlog[intf] for intf, (_n, d, port) in self.ports.items()
                       if d == dpid and port in ports}
                for dpid, ports in self.watch.items()}
        if not any(abs(b - self.last_load.get(d, {}).get(p, -10 * self.frame)) >= self.frame
                   for d, ports in load.items() for p, b in ports.items()):
            return None
        self.last_load = load
        return load
