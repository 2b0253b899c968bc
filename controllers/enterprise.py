"""Enterprise (Trident-class) policy: L2 learning over one spanning tree, tenants isolated,
strict priority for interactive traffic above best-effort RoCE; tail drop, no ECN, no PFC.

* Spanning tree: every leaf and the root spine (``spanning_tree_root``). The other spines are
  blocked: leaves never send to them and drop what comes from them, and they drop everything.
  So one spine carries all inter-leaf traffic, as with a classic STP fabric.
* Tenants (an ACL on the source MAC): table ACL admits only the known GPUs' MACs - on a leaf,
  only from their own port or from the tree uplink - and writes the tenant into the metadata.
  Learning, look-ups and flooding are all per tenant, so a frame of one tenant never reaches a
  port of another.
* Learning: table SRC sends an unknown (tenant, MAC, port) to the controller and continues;
  the controller installs it in SRC and the matching destination entry in DST. Table DST
  forwards known destinations and floods the rest over the tenant's tree ports.
* Classes: interactive (DSCP 46, EF) is served strictly before best effort (RoCE).
"""
from __future__ import annotations

from typing import Dict, List, Set, Tuple

from testbed.base.errors import ConfigError

from .classes import TrafficClass
from .messages import (CONTROLLER, PRIO_HOST, PRIO_MISS, PRIO_ROUTE, Bucket, ClearFlows, Group,
                    GroupMod, Message, Output, flow)
from .params import EnterpriseParams
from .policy import Policy, register

ACL, SRC, DST = 0, 1, 2
FLOOD_BASE = 0x200  # flood group of tenant t: FLOOD_BASE + t
MAC_AGING_S = 300
PRIO_BLOCKED = 300


@register
class EnterprisePolicy(Policy):
    name = "enterprise"
    parameters = EnterpriseParams
    colour = "#1f77b4"
    cookie = 0x454E  # "EN"
    wants_packet_in = True

    def __init__(self, plan, params=None, context=None):
        super().__init__(plan, params, context)
        self.tenant_of = tenants(plan, self.params.tenants)
        if not 1 <= self.params.spanning_tree_root <= plan.n_spines:
            raise ConfigError(f"policy_params.enterprise.spanning_tree_root: must be a spine "
                              f"index in 1..{plan.n_spines}, got "
                              f"{self.params.spanning_tree_root}")
        self.learned: Set[Tuple[int, int, str, int]] = set()

    def may_reach(self, src: str, dst: str) -> bool:
        return self.tenant_of[src] == self.tenant_of[dst]

    def traffic_classes(self) -> Tuple[TrafficClass, ...]:
        p = self.params
        return (TrafficClass("interactive", 0, 0, (p.interactive_dscp,),
                             p.interactive_buffer_bytes),
                TrafficClass("best-effort", 1, 1, (), p.buffer_bytes))

    # --- the tree ---------------------------------------------------------------------------
    @property
    def root(self) -> int:
        return self.params.spanning_tree_root

    def tree_uplink(self) -> int:
        return self.plan.uplink_port(self.root)

    def blocked_uplinks(self) -> List[int]:
        return [port for s, port in sorted(self.plan.uplinks().items()) if s != self.root]

    # --- programming ------------------------------------------------------------------------
    def switch_connected(self, dpid: int) -> List[Message]:
        plan, cookie = self.plan, self.cookie
        sw = plan.switch_by_dpid(dpid)
        msgs: List[Message] = [ClearFlows(), flow(PRIO_MISS, {}, cookie=cookie)]
        if sw.role == "spine" and sw.index != self.root:
            return msgs  # blocked by the spanning tree: drops everything
        for h in plan.hosts:
            t = self.tenant_of[h.name]
            if sw.role == "leaf" and h.leaf == sw.index:
                ports = [h.index]
            elif sw.role == "leaf":
                ports = [self.tree_uplink()]
            else:
                ports = [plan.spine_port(h.leaf)]
            msgs += [flow(PRIO_ROUTE, {"in_port": p, "eth_src": h.mac}, metadata=t, goto=SRC,
                          cookie=cookie) for p in ports]
        if sw.role == "leaf":
            msgs += [flow(PRIO_BLOCKED, {"in_port": p}, cookie=cookie)
                     for p in self.blocked_uplinks()]
        msgs.append(flow(PRIO_MISS, {}, Output(CONTROLLER), table=SRC, goto=DST, cookie=cookie))
        for t in sorted(set(self.tenant_of.values())):
            msgs.append(GroupMod(FLOOD_BASE + t, "all", tuple(
                Bucket((Output(p),)) for p in self.flood_ports(sw, t))))
            msgs.append(flow(PRIO_MISS, {"metadata": t}, Group(FLOOD_BASE + t), table=DST,
                             cookie=cookie))
        return msgs

    def flood_ports(self, sw, tenant: int) -> List[int]:
        """Tree ports that lead to GPUs of ``tenant`` (OVS never floods out of the in-port)."""
        plan = self.plan
        members = [h for h in plan.hosts if self.tenant_of[h.name] == tenant]
        if sw.role == "leaf":
            local = [h.index for h in members if h.leaf == sw.index]
            remote = any(h.leaf != sw.index for h in members)
            return local + ([self.tree_uplink()] if remote else [])
        return sorted({plan.spine_port(h.leaf) for h in members})

    def packet_in(self, dpid: int, in_port: int, metadata: int, eth_src: str) -> List[Message]:
        """Learn (tenant, MAC) at ``in_port``: in SRC so it stops coming, in DST to reach it."""
        key = (dpid, metadata, eth_src, in_port)
        if key in self.learned or metadata == 0:
            return []
        self.learned.add(key)
        cookie = self.cookie
        return [flow(PRIO_HOST, {"metadata": metadata, "eth_src": eth_src, "in_port": in_port},
                     table=SRC, goto=DST, idle_timeout=MAC_AGING_S, cookie=cookie),
                flow(PRIO_HOST, {"metadata": metadata, "eth_dst": eth_src}, Output(in_port),
                     table=DST, idle_timeout=MAC_AGING_S, cookie=cookie)]


def tenants(plan, groups) -> Dict[str, int]:
    """Host name -> tenant number (1..); GPUs in no group form one more tenant, and
    neighbour hosts in no group one more after that."""
    names = {h.name for h in plan.hosts}
    tenant_of: Dict[str, int] = {}
    for t, group in enumerate(groups, 1):
        for name in group:
            if name not in names:
                raise ConfigError(f"policy_params.enterprise.tenants[{t - 1}]: no GPU named "
                                  f"{name!r} in this fabric")
            if name in tenant_of:
                raise ConfigError(f"policy_params.enterprise.tenants: {name} is in two tenants")
            tenant_of[name] = t
    rest = len(groups) + 1
    for h in plan.hosts:  # neighbour hosts are a tenant of their own unless placed
        tenant_of.setdefault(h.name, rest if h.is_gpu else rest + 1)
    return tenant_of
