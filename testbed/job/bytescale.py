"""The byte scale of a training job, pure: which scales keep a scaled job in its full-size
regime - messages bandwidth-dominated, several times a switch port's buffer and several times
what a QP sends in one retransmission timeout on a lossy fabric - and the 1-2-5 steps auto
chooses among (docs/time-scale.md, "Byte scale").
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, NamedTuple, Optional

from ..base.errors import ConfigError
from ..base.topology import FabricPlan

# A message's fixed one-way latency across leaves in the modelled fabric: the hop model's
# store-and-forward Ethernet path at 100 Gbit/s (docs/fabric.md; measured 2.29 us)
MESSAGE_LATENCY_US = 2.5
# A byte scale is honest while per-message latency takes at most this share of the fabric's
# transfer times (byte-weighted): scaled messages stay bandwidth-dominated, as at full size
HONEST_LATENCY_SHARE = 0.1
# ... and while the median message a QP sends is at least this many times the smallest buffer
# the run's policies give RoCE at a switch port, where at full size it is: messages that fit
# the buffers queue and drop in another regime (docs/time-scale.md, "Byte scale")
BUFFER_REGIME = 4.0
# ... and, where a policy's RoCE class is lossy and its senders run no congestion control, at
# least this many times what a QP sends at its share of a GPU NIC's line in one retransmission
# timeout: go-back-N sends the rest of a message until a NAK or the timer rewinds it, so
# shorter messages cap what a loss costs (docs/time-scale.md, "Byte scale": at 4, within about
# 15% of full size's resends per loss; DCQCN's senders drop too little for it to matter)
RECOVERY_REGIME = 4.0
# ... but auto lowers the byte scale for that regime at most this many times: further, a job's
# run would take hours (dp-buckets' ideal iteration 116 s emulated at the regime's byte scale);
# the faster run is warned about and results state the regime not kept
RECOVERY_STRETCH = 4.0


@dataclass(frozen=True)
class MessageRegime:
    """How the byte-weighted median of the messages a QP sends stands against a size:
    ``message_bytes`` scaled, ``ratio`` scaled and ``full_size_ratio`` unscaled (None: nothing
    to stand against), ``kept`` while the scaled ratio keeps the full-size regime."""
    kept: bool = True
    message_bytes: Optional[int] = None
    ratio: Optional[float] = None
    full_size_ratio: Optional[float] = None


@dataclass(frozen=True)
class BufferRegime(MessageRegime):
    buffer_bytes: Optional[int] = None  # the smallest RoCE buffer of a switch port


@dataclass(frozen=True)
class RecoveryRegime(MessageRegime):
    recovery_bytes: Optional[int] = None  # what a QP sends in one retransmission timeout


def message_regime(per_qp: List[float], byte_scale: float, against: Optional[float],
                   at_least: float) -> MessageRegime:
    """How the byte-weighted median of the messages a QP sends (``per_qp``, full size)
    stands against ``against`` bytes, scaled and at full size; ``kept`` while the scaled ratio
    reaches ``at_least`` or the full-size one, if that is lower (pure)."""
    if not per_qp or not against:
        return MessageRegime()
    full = weighted_median(per_qp)
    ratio, full_ratio = full / byte_scale / against, full / against
    return MessageRegime(kept=ratio >= min(at_least, full_ratio) * (1 - 1e-9),
                         message_bytes=round(full / byte_scale), ratio=round(ratio, 3),
                         full_size_ratio=round(full_ratio, 3))


def buffer_regime(per_qp: List[float], byte_scale: float,
                  buffer: Optional[int]) -> BufferRegime:
    """A QP's messages against the smallest RoCE buffer of a switch port (pure)."""
    regime = message_regime(per_qp, byte_scale, buffer, BUFFER_REGIME)
    return BufferRegime(**vars(regime), buffer_bytes=buffer)


def recovery_regime(per_qp: List[float], byte_scale: float,
                    recovery: Optional[float]) -> RecoveryRegime:
    """A QP's messages against what it sends in one retransmission timeout (pure)."""
    regime = message_regime(per_qp, byte_scale, recovery, RECOVERY_REGIME)
    return RecoveryRegime(**vars(regime),
                          recovery_bytes=None if recovery is None else round(recovery))


def weighted_median(sizes: List[float]) -> float:
    """The size below which half the bytes are (pure)."""
    ordered = sorted(sizes)
    half, seen = sum(ordered) / 2, 0.0
    for s in ordered:
        seen += s
        if seen >= half:
            return s
    return ordered[-1]


class RocePort(NamedTuple):
    """What a policy gives RoCE's class at a switch port, and its NICs' timeout."""

    buffer_bytes: int
    lossless: bool
    congestion_control: str  # what its senders run: dcqcn or none
    rto_us: Optional[float]  # None until the run's rate is chosen (rate auto)


def roce_ports(scenario) -> List[RocePort]:
    """Per policy of the scenario, its RoCE class at a switch port."""
    from controllers.classes import class_of
    from controllers.policy import make_policy

    plan = FabricPlan.for_topology(scenario.topology)
    try:
        slowest = scenario.slowest_link_gbit
    except ConfigError:  # rate auto: the plan is made again once the runner chose it
        slowest = None
    ports = []
    for label in scenario.policies:
        name, runs_with = scenario.policy_run(label)
        try:
            policy = make_policy(name, plan, runs_with)
        except (ConfigError, KeyError, ValueError):  # said where the policies are checked
            continue
        roce = class_of(policy.dscp()[0], policy.traffic_classes())
        rto = (policy.rto_us(runs_with.transport.rto_us, roce.buffer_bytes, slowest)
               if slowest else None)
        cc = policy.congestion_control(runs_with.transport.congestion_control)
        ports.append(RocePort(roce.buffer_bytes, roce.lossless, cc, rto))
    return ports


def recovery_bytes(scenario, ports: List[RocePort]) -> Optional[float]:
    """What a QP sends at its share of a GPU NIC's line (``qps_per_peer`` of them) in one
    retransmission timeout, the most of any lossy policy without congestion control (None:
    there is none, or the rate is not chosen yet)."""
    lossy = [p.rto_us for p in ports if not p.lossless and p.congestion_control == "none"
             and p.rto_us is not None]
    if not lossy:
        return None
    share_gbit = scenario.topology.modelled_rate_gbit / scenario.transport.qps_per_peer
    return share_gbit * max(lossy) * 1e3 / 8


def latency_share(sizes: List[float], byte_scale: float, rate_gbit: float) -> float:
    """Byte-weighted share of a message's time its fixed latency takes, at ``byte_scale``."""
    if not sizes:
        return 0.0
    lat, total, weighted = MESSAGE_LATENCY_US * 1000, 0.0, 0.0
    for size in sizes:
        scaled = max(1.0, size / byte_scale)
        wire = scaled * 8 / rate_gbit  # ns
        total += scaled
        weighted += scaled * lat / (lat + wire)
    return weighted / total


def auto_byte_scale(emulated_s: float, target_s: float) -> float:
    """The 1-2-5 step at or above ``emulated_s / target_s`` (at least 1)."""
    want = emulated_s / target_s
    if want <= 1:
        return 1.0
    decade = 10 ** math.floor(math.log10(want))
    return float(next(decade * m for m in (1, 2, 5, 10) if decade * m >= want))


def recovery_scale(per_qp: List[float], byte_scale: float, recovery: Optional[float],
                   floor: float = 1.0) -> float:
    """The byte scale, stepped down from ``byte_scale`` but not below ``floor`` (nor 1), at
    which the recovery regime is kept - or the last step that floor allows."""
    while (byte_scale > 1 and not recovery_regime(per_qp, byte_scale, recovery).kept
           and step_down(byte_scale) >= floor):
        byte_scale = step_down(byte_scale)
    return byte_scale


def step_down(scale: float) -> float:
    """The 1-2-5 step below ``scale``."""
    decade = 10 ** math.floor(math.log10(scale) + 1e-9)
    mantissa = scale / decade
    lower = [m for m in (1, 2, 5) if m < mantissa - 1e-9]
    return float(decade * lower[-1] if lower else decade / 2)
