"""Ultra Ethernet (UEC 1.0-class) policy: the switch side of UE Spec 1.0's transport.

* Classes (every egress queue): the header class highest - trimmed packets, ACKs and NACKs
  (``header_dscp``), strict priority; UET data (``data_dscp``) in a shallow lossy buffer of
  about one bandwidth-delay product, ECN marked RED-like between 0.2 and 0.8 of it for NSCC,
  and trimmed rather than dropped when full (``TrimRule``: ``testbed.fabric.bpftrim`` cuts the
  packet to its headers and re-marks it to the header class); everything else best effort.
* Routing as hyperscale's (``controllers.l3``): a leaf hashes the 5-tuple over its uplinks,
  so the UDP source port - UET's entropy value, which the sender varies per packet - picks
  the spine of every packet; nothing is learned or adapted in the switches: the senders
  spray and steer away from marked and trimmed paths themselves.
"""
from __future__ import annotations

from typing import List, Tuple

from . import l3
from .classes import EcnRule, TrafficClass, TrimRule
from .messages import Message
from .params import UltraEthernetParams
from .policy import Policy


class UltraEthernetPolicy(Policy):
    name = "ultra-ethernet"
    parameters = UltraEthernetParams
    colour = "#9467bd"
    cookie = 0x5545  # "UE"

    def dscp(self) -> Tuple[int, int]:
        """(DSCP of UET data, DSCP of ACKs and NACKs)."""
        return self.params.data_dscp, self.params.header_dscp

    def reorders_qps(self) -> bool:
        return True  # every packet may take another spine: UET's receivers place them so

    def traffic_classes(self) -> Tuple[TrafficClass, ...]:
        p = self.params
        ecn = EcnRule("red", p.ecn_kmin_bytes, p.ecn_kmax_bytes, 1.0)
        trim = TrimRule(p.buffer_bytes, p.header_dscp) if p.trimming else None
        return (TrafficClass("header", 0, 0, (p.header_dscp,), p.header_buffer_bytes),
                TrafficClass("uet", 1, 1, (p.data_dscp,), p.buffer_bytes, ecn=ecn, trim=trim),
                TrafficClass("other", 2, 2, (), p.other_buffer_bytes))

    def switch_connected(self, dpid: int) -> List[Message]:
        return l3.program(self.plan, dpid, self.cookie, self.context.openflow_marking)

    def ecn_changed(self, dpid: int, port: int, marking: bool) -> List[Message]:
        return [l3.mark_group(port, marking)]
