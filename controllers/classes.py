"""Egress traffic classes: what each policy asks of every switch port and GPU NIC queue.

A policy describes its classes (priority, DSCPs, buffer, lossless or not, ECN rule); the fabric
turns them into HTB classes with a byte FIFO each and u32 DSCP filters (``testbed.fabric.shaping``),
and the switch-queue emulator watches their backlog (``testbed.switchq.emulator``). Priority 0 is
the highest; HTB serves higher-priority classes first (strict priority).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

FIRST_MINOR = 0x10  # class i is HTB class 1:(0x10 + i); its FIFO has handle (0x10 + i):


@dataclass(frozen=True)
class EcnRule:
    """When to set CE on ECT packets leaving a queue (docs/REFERENCE.md, ECN marking).

    ``step``: mark while the backlog exceeds ``kmin`` (DCTCP's K). ``red``: mark with
    probability ``pmax * (q - kmin) / (kmax - kmin)`` between the thresholds, always above
    ``kmax``.
    """

    kind: str  # "step" | "red"
    kmin: int
    kmax: int = 0
    pmax: float = 1.0

    def probability(self, backlog: int) -> float:
        if self.kind == "step":
            return 1.0 if backlog > self.kmin else 0.0
        if backlog > self.kmax:
            return 1.0
        if backlog <= self.kmin or self.kmax <= self.kmin:
            return 0.0
        return self.pmax * (backlog - self.kmin) / (self.kmax - self.kmin)


@dataclass(frozen=True)
class PfcRule:
    """Pause the queues feeding a switch while this class's backlog is above ``xoff``;
    resume when it falls below ``xon`` (docs/REFERENCE.md, PFC)."""

    xoff: int
    xon: int
    kind = "pfc"

    @property
    def threshold(self) -> int:
        """The backlog above which the feeders stop."""
        return self.xoff

    def holds(self, backlog: int, held: bool) -> bool:
        """Whether the feeders stay stopped (``held``: they are now): XOFF/XON hysteresis."""
        return backlog >= self.xon if held else backlog > self.xoff


@dataclass(frozen=True)
class CreditRule:
    """InfiniBand's credit-based flow control as the switch-queue emulator applies it: the
    queues feeding a switch may send into this class's buffer while it has room for what
    they can still send before a stop lands - they stop while its backlog is above ``limit``
    (the lane's buffer less that margin) and go on as soon as it is back at or below: no
    hysteresis, no pause frames, no headroom beyond the buffer (docs/fabric.md, "Credits")."""

    limit: int
    buffer: int  # the lane's buffer: what the class's queue holds at most
    kind = "credit"

    @property
    def threshold(self) -> int:
        return self.limit

    def holds(self, backlog: int, held: bool) -> bool:
        return backlog > self.limit


@dataclass(frozen=True)
class TrimRule:
    """Packet trimming (NDP; UE Spec 1.0): a UET packet of this class that would take its
    queue's backlog beyond ``limit`` bytes is cut to its headers and leaves in the class of
    DSCP ``dscp`` (strict priority) instead of being dropped (``testbed.fabric.bpftrim``)."""

    limit: int
    dscp: int


@dataclass(frozen=True)
class TrafficClass:
    name: str
    index: int  # position: HTB class 1:(0x10 + index)
    priority: int  # 0 = highest
    dscp: Tuple[int, ...]  # DSCPs classified here; () = the default class
    buffer_bytes: int
    nic_buffer_bytes: Optional[int] = None  # on GPU NICs; None = the scenario's NIC queue
    ecn: Optional[EcnRule] = None
    pfc: Optional[PfcRule] = None
    credit: Optional[CreditRule] = None  # in place of PFC (policy_params.lossless.flow_control)
    trim: Optional[TrimRule] = None  # lossy classes of UET traffic: trim, not drop

    @property
    def minor(self) -> int:
        return FIRST_MINOR + self.index

    @property
    def lossless(self) -> bool:
        return self.flow_control is not None

    @property
    def flow_control(self):
        """The rule that keeps the class lossless: PFC's or credits' (None: lossy)."""
        return self.pfc or self.credit


def default_class(classes) -> TrafficClass:
    """The class that takes packets no DSCP filter claims."""
    defaults = [c for c in classes if not c.dscp]
    if len(defaults) != 1:
        raise ValueError("exactly one class must have no DSCPs (the default class)")
    return defaults[0]


def class_of(dscp: int, classes) -> TrafficClass:
    """The class packets of ``dscp`` travel in (the default class if none names it)."""
    return next((c for c in classes if dscp in c.dscp), default_class(classes))


def class_dscps(cls: TrafficClass, classes) -> Tuple[int, ...]:
    """The DSCPs whose packets ``cls`` takes: its own, or for the default class every DSCP
    that no other class claims."""
    if cls.dscp:
        return tuple(sorted(cls.dscp))
    claimed = {d for c in classes for d in c.dscp}
    return tuple(d for d in range(64) if d not in claimed)
