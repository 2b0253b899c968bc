"""Hyperscale (Tomahawk-class) policy: L3 ECMP over every spine, shallow buffers, tail drop.

Leaves route on the destination IP: a local GPU's /32 goes out of its port; every other leaf's
/24 goes to one OpenFlow select group whose buckets are the uplinks to all spines. Open vSwitch
picks a bucket per flow from a symmetric hash of the L3/L4 header (addresses, protocol, UDP
ports - the 5-tuple; OVS >= 2.10 ``dp_hash`` default), so the RoCE source port (entropy) decides
the spine. Spines route each leaf's /24 down to that leaf. Everything is installed when a switch
connects; the table-miss flow drops, so nothing depends on flooding or packet-ins.
"""
from __future__ import annotations

from typing import List

from testbed.topology import leaf_subnet

from .flows import (ETH_TYPE_IPV4, PRIO_HOST, PRIO_MISS, PRIO_ROUTE, Bucket, ClearFlows, Group,
                    GroupMod, Message, Output, SetField, flow, prefix)
from .policy import Policy, register

ECMP_GROUP = 1


@register
class HyperscalePolicy(Policy):
    name = "hyperscale"
    cookie = 0x4853  # "HS"

    def switch_connected(self, dpid: int) -> List[Message]:
        sw = self.plan.switch_by_dpid(dpid)
        msgs: List[Message] = [ClearFlows(), flow(PRIO_MISS, {}, cookie=self.cookie)]
        if sw.role == "leaf":
            msgs += self._leaf(sw.index)
        else:
            msgs += self._spine()
        return msgs

    def _leaf(self, leaf: int) -> List[Message]:
        plan = self.plan
        uplinks = plan.uplinks()
        msgs: List[Message] = [GroupMod(
            ECMP_GROUP, "select",
            tuple(Bucket((Output(port),)) for _, port in sorted(uplinks.items())))]
        for host in plan.hosts_on_leaf(leaf):
            msgs.append(flow(PRIO_HOST, {"eth_type": ETH_TYPE_IPV4, "ipv4_dst": host.ip},
                             SetField("eth_dst", host.mac), Output(host.index),
                             cookie=self.cookie))
        for other in plan.leaves:
            if other.index != leaf:
                msgs.append(flow(PRIO_ROUTE, {"eth_type": ETH_TYPE_IPV4,
                                              "ipv4_dst": prefix(leaf_subnet(other.index))},
                                 Group(ECMP_GROUP), cookie=self.cookie))
        return msgs

    def _spine(self) -> List[Message]:
        plan = self.plan
        return [flow(PRIO_ROUTE, {"eth_type": ETH_TYPE_IPV4,
                                  "ipv4_dst": prefix(leaf_subnet(leaf.index))},
                     Output(plan.spine_port(leaf.index)), cookie=self.cookie)
                for leaf in plan.leaves]
