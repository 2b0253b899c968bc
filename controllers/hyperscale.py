"""Hyperscale (Tomahawk-class) policy: L3 ECMP over every spine, shallow buffers, tail drop,
ECN step marking with DCQCN senders (the bare variant, ``ecn: off``, marks nothing and its
senders run no congestion control), no PFC.

Leaves route on the destination IP: a local GPU's /32 goes out of its port; every other leaf's
/24 is hashed over all uplinks by the 5-tuple (OVS ``multipath`` on addresses, protocol and
UDP ports), so the RoCE source port (entropy) picks the spine. Spines route each leaf's /24
down. Everything is installed when a switch connects; the table-miss flows drop, so nothing
depends on flooding or packet-ins. See ``controllers.l3`` for the tables.
"""
from __future__ import annotations

from typing import List, Tuple

from . import l3
from .classes import EcnRule, TrafficClass
from .messages import Message
from .params import HyperscaleParams
from .policy import Policy, register


@register
class HyperscalePolicy(Policy):
    name = "hyperscale"
    parameters = HyperscaleParams
    colour = "#ff7f0e"
    cookie = 0x4853  # "HS"

    @property
    def default_congestion_control(self) -> str:
        # operators pair the marking with DCQCN senders; unmarked, DCQCN would never act
        return "dcqcn" if self.params.ecn == "step" else "none"

    def traffic_classes(self) -> Tuple[TrafficClass, ...]:
        p = self.params
        ecn = EcnRule("step", p.ecn_k_bytes) if p.ecn == "step" else None
        return (TrafficClass("all", 0, 0, (), p.buffer_bytes, ecn=ecn),)

    def switch_connected(self, dpid: int) -> List[Message]:
        return l3.program(self.plan, dpid, self.cookie, self.context.openflow_marking)

    def ecn_changed(self, dpid: int, port: int, marking: bool) -> List[Message]:
        return [l3.mark_group(port, marking)]
