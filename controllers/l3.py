"""The routed pipeline shared by the hyperscale and lossless policies (pure builders).

Tables::

    0 ROUTE     a local GPU's /32: set its MAC, reg0 = its port            -> EGRESS
                another leaf's /24: multipath over the uplinks into reg1   -> ECMP
    1 FLOWLET   (lossless) flows learned by adaptive routing: reg0 = uplink
    2 AR        (lossless) AR slot -> reg0 = uplink, learn the flowlet
    3 ECMP      reg1 = slot -> reg0 = uplink                              -> EGRESS
    4 EGRESS    reg0 = port: out (with OpenFlow marking: ECT packets through the port's
                marking group)

ECN marking normally happens below the switch, in the kernel (RED, or the switch-queue
emulator's BPF program: ``testbed.fabric.bpfmark``), and the pipeline never looks at the ECN bits.
Where neither runs (``FabricContext.openflow_marking``), every egress port ``p`` has an
indirect group ``MARK_BASE + p`` whose one bucket is either ``output:p`` or
``set_field:3->ip_ecn, output:p``: the switch-queue emulator turns marking on and off per port by
modifying that group, so ECN-capable packets leaving a congested queue get CE.
"""
from __future__ import annotations

from typing import Dict, List

from testbed.base.topology import FabricPlan, leaf_subnet

from .messages import (ECN_CE, ETH_TYPE_IPV4, PRIO_ECT, PRIO_HOST, PRIO_MISS, PRIO_ROUTE, Bucket,
                       ClearFlows, Group, GroupMod, Message, Multipath, Output, SetField, flow,
                       prefix)

ROUTE, FLOWLET, AR, ECMP, EGRESS = 0, 1, 2, 3, 4
MARK_BASE = 0x100  # marking group of port p: MARK_BASE + p
ECT = (1, 2)  # ip_ecn values of ECN-capable packets: ECT(1), ECT(0)


def mark_group(port: int, marking: bool, modify: bool = True) -> GroupMod:
    actions = ((SetField("ip_ecn", ECN_CE), Output(port)) if marking else (Output(port),))
    return GroupMod(MARK_BASE + port, "indirect", (Bucket(actions),), modify=modify)


def egress(ports: List[int], cookie: int, marking_groups: bool = False) -> List[Message]:
    """EGRESS table: every port's flow; with ``marking_groups``, its marking group (marking
    off) and the flows that send ECT packets through it."""
    msgs: List[Message] = [flow(PRIO_MISS, {}, table=EGRESS, cookie=cookie)]
    for p in ports:
        if marking_groups:
            msgs.append(mark_group(p, False, modify=False))
            msgs += [flow(PRIO_HOST + PRIO_ECT, {"reg0": p, "eth_type": ETH_TYPE_IPV4,
                                                 "ip_ecn": ecn},
                          Group(MARK_BASE + p), table=EGRESS, cookie=cookie) for ecn in ECT]
        msgs.append(flow(PRIO_HOST, {"reg0": p}, Output(p), table=EGRESS, cookie=cookie))
    return msgs


def local_hosts(plan: FabricPlan, leaf: int, cookie: int) -> List[Message]:
    """ROUTE: each GPU under this leaf, by its /32."""
    return [flow(PRIO_HOST, {"eth_type": ETH_TYPE_IPV4, "ipv4_dst": h.ip},
                 SetField("eth_dst", h.mac), SetField("reg0", h.index), goto=EGRESS,
                 cookie=cookie)
            for h in plan.hosts_on_leaf(leaf)]


def ecmp(plan: FabricPlan, leaf: int, cookie: int, priority: int = PRIO_ROUTE,
         extra_match: Dict[str, object] = None) -> List[Message]:
    """ROUTE + ECMP: other leaves' subnets hashed (5-tuple) over every uplink."""
    uplinks = [port for _, port in sorted(plan.uplinks().items())]
    msgs: List[Message] = []
    for other in plan.leaves:
        if other.index != leaf:
            m = {"eth_type": ETH_TYPE_IPV4, "ipv4_dst": prefix(leaf_subnet(other.index))}
            m.update(extra_match or {})
            msgs.append(flow(priority, m, Multipath(len(uplinks)), goto=ECMP, cookie=cookie))
    msgs += [flow(PRIO_ROUTE, {"reg1": i}, SetField("reg0", port), table=ECMP, goto=EGRESS,
                  cookie=cookie) for i, port in enumerate(uplinks)]
    return msgs


def spine_routes(plan: FabricPlan, cookie: int) -> List[Message]:
    """ROUTE at a spine: each leaf's /24 down to that leaf."""
    return [flow(PRIO_ROUTE, {"eth_type": ETH_TYPE_IPV4,
                              "ipv4_dst": prefix(leaf_subnet(leaf.index))},
                 SetField("reg0", plan.spine_port(leaf.index)), goto=EGRESS, cookie=cookie)
            for leaf in plan.leaves]


def program(plan: FabricPlan, dpid: int, cookie: int, marking_groups: bool) -> List[Message]:
    """Everything a routed switch needs when it connects: its flows cleared, the table-miss
    drop, at a leaf its GPUs and ECMP over the uplinks, at a spine the routes down, and the
    EGRESS table (``egress``)."""
    sw = plan.switch_by_dpid(dpid)
    msgs: List[Message] = [ClearFlows(), flow(PRIO_MISS, {}, cookie=cookie)]
    if sw.role == "leaf":
        msgs += local_hosts(plan, sw.index, cookie) + ecmp(plan, sw.index, cookie)
    else:
        msgs += spine_routes(plan, cookie)
    return msgs + egress(switch_ports(plan, dpid), cookie, marking_groups)


def switch_ports(plan: FabricPlan, dpid: int) -> List[int]:
    sw = plan.switch_by_dpid(dpid)
    if sw.role == "leaf":
        return [h.index for h in plan.hosts_on_leaf(sw.index)] + sorted(plan.uplinks().values())
    return [plan.spine_port(leaf.index) for leaf in plan.leaves]
