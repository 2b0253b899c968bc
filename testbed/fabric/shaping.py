"""Link shaping with tc: the link rate, and one byte FIFO per traffic class as its buffer.

Every switch egress port and every GPU NIC gets::

    htb root 1:  ->  class 1:1 (rate = ceil = link rate)
                       -> class 1:(10+i) per traffic class (prio = class priority)
                            -> [netem (30+i): delay] -> [tbf (50+i): PFC gate]
                            -> FIFO (10+i): the class's buffer (or RED, below)
    u32 filters on the IP DSCP pick the class; unmatched packets go to the default class.

Under DCQCN the RoCE class of a GPU NIC has, in place of its FIFO, an HTB qdisc (handle = the
class minor) whose open default class (minor 1) holds the FIFO; the agent adds a
rate-limited class per QP (``limiter_commands``, ``traffic.ratelimit``), as an RNIC paces
each QP in hardware. Below the PFC gate, so a pause stops every QP of the class.

The FIFO of a lossless class, and every FIFO of a GPU NIC, is a ``bfifo`` (bytes). A lossy
class of a switch port has a ``pfifo_head_drop`` of ``buffer / frame`` packets: when full it
drops its oldest packet instead of the newest. That is forced by the userspace datapath: OVS sends a
batch of packets to a port with one sendmmsg(), and a tail drop makes the send fail with
ENOBUFS, after which OVS abandons the rest of the batch - packets of other classes included
(measured: 1-3 of 100 strict-priority probes lost behind RoCE tail drops). A head drop is
reported to the sender as congestion, not as an error, so nothing else is lost.

The tbf exists only in lossless classes and normally runs far above the link rate: PFC pauses
the class by lowering its rate to 1 B/s and resumes it by raising it again. tbf refills its
tokens when changed, so a resumed class sends at once (an HTB rate change would instead
charge a packet sent while paused at the paused rate: up to a minute of silence).

Every class borrows the whole link from 1:1, whose tokens are the link, and HTB serves
borrowers by priority: strict priority. No class has a rate of its own (1 B/s, the least HTB
takes): HTB sends a class within its own rate without asking its parent, so such a class would
send while the wire still carries another class's frame (docs/fabric.md, "Classes"). Only a
class's very first frame goes on the tokens HTB gives a new class. The bfifos are the ports'
buffers: tail-drop byte FIFOs whose drops and backlog the kernel counts. netem is added only when
the kernel has it and the run's path delay is netem's (``testbed.base.hops.PathDelay``; Mininet's
``max_queue_size`` needs netem, so the queue limit is set here instead): it holds every frame for
the port's per-hop latency before the frame joins the class buffer. Where the kernel has RED, a
class that marks ECN gets a RED qdisc as its buffer, which sets CE per packet (``red_qdisc``);
elsewhere the switch-queue emulator marks from sampled backlogs (``testbed.plan.marking``). Open
vSwitch resets a port's qdisc when the port is added to a bridge, so shaping is applied after
the switches started.

These commands run once per interface at set-up, so they use the ``tc`` tool; the per-sample
paths (``testbed.base.netlink``) speak netlink directly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from controllers.classes import EcnRule, TrafficClass, default_class
from traffic.ratelimit import DEFAULT_MINOR, HTB_QUANTUM, limiter_qdisc, nic_burst_bytes

from ..base.frames import link_frame_bytes

NETEM_LIMIT = 100_000  # packets in flight on a delayed link; the bfifo below is the buffer
GUARANTEE_BYTES = 1  # bytes/s of every class's own rate: all of them borrow the link


@dataclass(frozen=True)
class Shape:
    """Egress shaping of one interface."""

    rate_mbit: float
    classes: Tuple[TrafficClass, ...]
    delay_us: float = 0.0
    nic_queue_bytes: Optional[int] = None  # set on GPU NICs: their buffers
    red: bool = False  # ECN classes mark with the kernel's RED instead of the emulator
    qp_limiters: Optional[int] = None  # GPU NICs under DCQCN: the RoCE class's minor

    @property
    def nic(self) -> bool:
        """A GPU NIC (its own buffers, its own burst), not a switch port."""
        return self.nic_queue_bytes is not None

    def buffer(self, cls: TrafficClass) -> int:
        if not self.nic:
            return cls.buffer_bytes
        return cls.nic_buffer_bytes or self.nic_queue_bytes


@dataclass(frozen=True)
class HtbParams:
    rate_bytes: int  # bytes/s
    ceil_bytes: int
    burst: int  # bytes, at the rate
    cburst: int  # bytes, at the ceil
    quantum: int
    prio: int


# The switch-queue emulator's resume "kick" (testbed.switchq.emulator): a small frame of a
# local experimental EtherType, dropped by every policy at the next switch
KICK_ETHERTYPE = 0x88B5


def burst_bytes(rate_mbit: float, mtu: int, nic: bool = False) -> int:
    """HTB burst: how far a token bucket may run ahead of an ideal link after an idle spell
    (HTB sends while its tokens are >= 0, so after a refill the next frame leaves up to one
    burst early - the fidelity monitor reports the bound).

    A switch port: one full frame, or 250 us at the link rate when that is more; smaller loses
    rate whenever the kernel's timer fires late (measured on the 2-core VM at 100% CPU, a tenth
    of a frame raised the lossless ring's CCT from 523 to 649 ms). A GPU NIC: ``NIC_RUN_AHEAD``
    of a frame, so that a sender that hands its NIC one frame at a time (window- or
    rate-limited) still sees every frame leave one serialization time after the last, as on a
    real link; a timer late by less than that is still caught up (docs/emulation-cost.md)."""
    if nic:
        return nic_burst_bytes(mtu)
    return max(link_frame_bytes(mtu), int(rate_mbit * 1e6 / 8 * 250e-6))


def htb_params(rate_mbit: float, cls: TrafficClass, mtu: int,
               nic: bool = False) -> HtbParams:
    """HTB settings of one traffic class on a link of ``rate_mbit``: it borrows the link from
    1:1 (the least own rate and burst HTB takes) and sends at most at the link rate."""
    link = int(rate_mbit * 1e6 / 8)
    return HtbParams(GUARANTEE_BYTES, link, 1, burst_bytes(rate_mbit, mtu, nic),
                     max(HTB_QUANTUM, link_frame_bytes(mtu)), cls.priority)


NETEM_BASE, GATE_BASE, LIMITED_BUFFER_BASE = 0x20, 0x40, 0x60  # offsets from the class minor


def netem_handle(cls: TrafficClass) -> int:
    return cls.minor + NETEM_BASE


def gate_handle(cls: TrafficClass) -> int:
    """Major number of the PFC gate (tbf) of a lossless class."""
    return cls.minor + GATE_BASE


def has_delay_line(shape: Shape, netem: bool) -> bool:
    """Whether the classes of an interface shaped so get a netem delay line."""
    return shape.delay_us > 0 and netem


def gate_parent(cls: TrafficClass, delayed: bool) -> str:
    return f"{netem_handle(cls):x}:1" if delayed else f"1:{cls.minor:x}"


@dataclass(frozen=True)
class GateParams:
    rate_bytes: int
    burst: int
    limit: int


def gate_params(rate_mbit: float, mtu: int, buffer_bytes: int, paused: bool) -> GateParams:
    """The PFC gate: open at 10x the link rate (HTB shapes), paused at 1 B/s. A pause lets
    at most one frame through, like the frame in flight when a real PAUSE arrives."""
    if paused:
        return GateParams(1, link_frame_bytes(mtu), buffer_bytes)
    return GateParams(min(0xFFFFFFFF, int(rate_mbit * 1e6 / 8 * 10)), 2 * link_frame_bytes(mtu),
                      buffer_bytes)


def tc_commands(intf: str, shape: Shape, netem: bool, mtu: int = 1500) -> List[str]:
    """The tc commands that shape ``intf`` (pure; the caller runs them in the right netns)."""
    classes = shape.classes
    link_kbit = max(1, int(round(shape.rate_mbit * 1000)))
    burst = burst_bytes(shape.rate_mbit, mtu, shape.nic)
    quantum = max(HTB_QUANTUM, link_frame_bytes(mtu))
    default = default_class(classes)
    cmds = [f"tc qdisc replace dev {intf} root handle 1: htb default {default.minor:x}",
            f"tc class replace dev {intf} parent 1: classid 1:1 htb rate {link_kbit}kbit "
            f"ceil {link_kbit}kbit burst {burst} cburst {burst} quantum {quantum}"]
    delayed = has_delay_line(shape, netem)
    for c in classes:
        p = htb_params(shape.rate_mbit, c, mtu, shape.nic)
        cmds.append(f"tc class replace dev {intf} parent 1:1 classid 1:{c.minor:x} htb "
                    f"rate {p.rate_bytes * 8}bit ceil {p.ceil_bytes * 8}bit burst {p.burst} "
                    f"cburst {p.cburst} quantum {p.quantum} prio {p.prio}")
        parent = f"1:{c.minor:x}"
        if delayed:
            cmds.append(f"tc qdisc replace dev {intf} parent {parent} "
                        f"handle {netem_handle(c):x}: netem delay {round(shape.delay_us, 3):g}us "
                        f"limit {NETEM_LIMIT}")
            parent = f"{netem_handle(c):x}:1"
        if c.lossless:
            g = gate_params(shape.rate_mbit, mtu, shape.buffer(c), paused=False)
            cmds.append(f"tc qdisc replace dev {intf} parent {parent} handle {gate_handle(c):x}: "
                        f"tbf rate {g.rate_bytes * 8}bit burst {g.burst} limit {g.limit}")
            parent = f"{gate_handle(c):x}:1"
        if c.ecn and shape.red:
            buffer = red_qdisc(c.ecn, shape.buffer(c), shape.rate_mbit, mtu)
        else:
            buffer = fifo(shape.buffer(c), c.lossless or shape.nic, mtu)
        if shape.nic and c.minor == shape.qp_limiters:
            cmds += limiter_commands(intf, parent, c, shape, mtu, buffer)
        else:
            cmds.append(f"tc qdisc replace dev {intf} parent {parent} handle {c.minor:x}: "
                        + buffer)
        for dscp in c.dscp:
            cmds.append(f"tc filter add dev {intf} parent 1: protocol ip prio 1 u32 "
                        f"match ip dsfield {dscp << 2:#04x} 0xfc flowid 1:{c.minor:x}")
    if len(classes) > 1:  # a kick leaves at once: never queued (or dropped) behind traffic
        top = min(classes, key=lambda c: c.priority)
        cmds.append(f"tc filter add dev {intf} parent 1: protocol {KICK_ETHERTYPE:#06x} prio 2 "
                    f"u32 match u32 0 0 flowid 1:{top.minor:x}")
    return cmds


def limiter_commands(intf: str, parent: str, cls: TrafficClass, shape: Shape, mtu: int,
                     buffer: str) -> List[str]:
    """The RoCE class of a GPU NIC under DCQCN: an HTB qdisc whose open default class holds
    the class's buffer; the agent adds one rate-limited class per QP (``traffic.ratelimit``)."""
    q = limiter_qdisc(shape.rate_mbit, mtu)
    major = f"{cls.minor:x}"
    return [f"tc qdisc replace dev {intf} parent {parent} handle {major}: htb "
            f"default {DEFAULT_MINOR:x}",
            f"tc class replace dev {intf} parent {major}: classid {major}:{DEFAULT_MINOR:x} "
            f"htb rate {q['open_bytes'] * 8}bit ceil {q['open_bytes'] * 8}bit "
            f"burst {q['burst']} cburst {q['burst']} quantum {q['quantum']}",
            f"tc qdisc replace dev {intf} parent {major}:{DEFAULT_MINOR:x} "
            f"handle {cls.minor + LIMITED_BUFFER_BASE:x}: {buffer}"]


def fifo(buffer_bytes: int, in_bytes: bool, mtu: int) -> str:
    """The class buffer: a byte FIFO, or (lossy switch classes) full frames, oldest dropped."""
    if in_bytes:
        return f"bfifo limit {buffer_bytes}"
    return f"pfifo_head_drop limit {max(2, buffer_bytes // link_frame_bytes(mtu))}"


def red_qdisc(rule: EcnRule, buffer_bytes: int, rate_mbit: float, mtu: int) -> str:
    """The class buffer as a RED qdisc that sets CE itself (``ecn``), per packet, by the
    policy's rule: RED-like rules as they are; a step at K as a ramp from K to one frame above
    it with probability 1. ``nodrop``: a packet RED would mark but cannot (not ECT) is queued,
    never dropped early - the only drop is the byte limit, as with the bfifo it replaces.
    The average follows the queue as fast as RED allows (the smallest burst tc accepts), so
    marking tracks the instantaneous backlog as the sampled marking does."""
    frame = link_frame_bytes(mtu)
    if rule.kind == "step":
        lo, hi, p = rule.kmin, rule.kmin + frame, 1.0
    else:
        lo, hi, p = rule.kmin, max(rule.kmax, rule.kmin + frame), rule.pmax
    burst = lo // frame + 1
    kbit = max(1, int(round(rate_mbit * 1000)))
    return (f"red limit {max(buffer_bytes, hi + frame)} min {lo} max {hi} avpkt {frame} "
            f"burst {burst} probability {p:g} bandwidth {kbit}kbit ecn nodrop")


FIFO_KINDS = ("bfifo", "pfifo_head_drop", "red")
