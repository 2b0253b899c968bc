"""A fake OpenFlow 1.3 switch and fabric for policy unit tests (Faucet's fakeoftable idea).

Policies return ``controllers.flows`` messages; ``FakeSwitch`` applies them to a flow table and
group table and answers "where does this packet go?"; ``FakeFabric`` follows a packet across the
leaf-spine plan hop by hop until it reaches a GPU or is dropped.
"""
from __future__ import annotations

import ipaddress
import zlib
from typing import Dict, List, Optional, Tuple

from controllers.flows import ClearFlows, FlowMod, Group, GroupMod, Output, SetField
from testbed.topology import FabricPlan


def _field_matches(value, want) -> bool:
    if isinstance(want, tuple):  # (value, mask)
        addr, mask = want
        if value is None:
            return False
        v = int(ipaddress.ip_address(value))
        return v & int(ipaddress.ip_address(mask)) == int(ipaddress.ip_address(addr)) & int(
            ipaddress.ip_address(mask))
    return value == want


def ecmp_hash(pkt: dict) -> int:
    """A deterministic 5-tuple hash standing in for the switch's bucket selection."""
    key = "|".join(str(pkt.get(k)) for k in ("ipv4_src", "ipv4_dst", "ip_proto", "udp_src",
                                              "udp_dst"))
    return zlib.crc32(key.encode())


class FakeSwitch:
    def __init__(self, dpid: int):
        self.dpid = dpid
        self.flows: List[FlowMod] = []
        self.groups: Dict[int, GroupMod] = {}

    def apply(self, messages) -> None:
        for m in messages:
            if isinstance(m, ClearFlows):
                self.flows, self.groups = [], {}
            elif isinstance(m, FlowMod):
                self.flows = [f for f in self.flows
                              if not (f.priority == m.priority and f.match == m.match
                                      and f.table_id == m.table_id)]
                self.flows.append(m)
            elif isinstance(m, GroupMod):
                if m.group_id in self.groups:
                    raise AssertionError(f"group {m.group_id} added twice on {self.dpid:#x}")
                self.groups[m.group_id] = m
            else:
                raise AssertionError(f"unexpected message {m!r}")

    def lookup(self, pkt: dict) -> Optional[FlowMod]:
        best = None
        for f in self.flows:
            if f.table_id != 0:
                continue
            if all(_field_matches(pkt.get(k), v) for k, v in f.match):
                if best is None or f.priority > best.priority:
                    best = f
        return best

    def forward(self, pkt: dict) -> List[Tuple[int, dict]]:
        """(output port, packet as it leaves) for each copy the switch sends."""
        flow = self.lookup(pkt)
        if flow is None:
            raise AssertionError(f"switch {self.dpid:#x} has no flow for {pkt}")
        return self._actions(flow.actions, dict(pkt))

    def _actions(self, actions, pkt) -> List[Tuple[int, dict]]:
        out = []
        for a in actions:
            if isinstance(a, SetField):
                pkt[a.field] = a.value
            elif isinstance(a, Output):
                out.append((a.port, dict(pkt)))
            elif isinstance(a, Group):
                group = self.groups[a.group_id]
                if group.group_type == "select":
                    bucket = group.buckets[ecmp_hash(pkt) % len(group.buckets)]
                    out += self._actions(bucket.actions, dict(pkt))
                else:
                    for bucket in group.buckets:
                        out += self._actions(bucket.actions, dict(pkt))
            else:
                raise AssertionError(f"unknown action {a!r}")
        return out


class FakeFabric:
    """Every switch of a plan, programmed by a policy, with the cabling of the plan."""

    def __init__(self, plan: FabricPlan, policy):
        self.plan = plan
        self.switches = {}
        for sw in plan.switches:
            fake = FakeSwitch(sw.dpid)
            fake.apply(policy.switch_connected(sw.dpid))
            self.switches[sw.name] = fake
        self.wires = {}
        for link in plan.links:
            self.wires[(link.node1, link.port1)] = (link.node2, link.port2)
            self.wires[(link.node2, link.port2)] = (link.node1, link.port1)

    def send(self, src_host: str, pkt: dict, max_hops: int = 8):
        """Inject ``pkt`` from a GPU; returns (receiving host or None, switches traversed)."""
        node, port = self.wires[(src_host, 0)]
        path = []
        for _ in range(max_hops):
            path.append(node)
            outs = self.switches[node].forward(dict(pkt, in_port=port))
            if not outs:
                return None, path
            assert len(outs) == 1, f"{node} sent {len(outs)} copies of a unicast packet"
            out_port, pkt = outs[0]
            peer, peer_port = self.wires[(node, out_port)]
            if peer.startswith("gpu"):
                return (peer, pkt), path
            node, port = peer, peer_port
        raise AssertionError(f"forwarding loop: {path}")


def udp_packet(src, dst, sport=0xC000, dport=4791) -> dict:
    return {"eth_type": 0x0800, "eth_src": src.mac, "eth_dst": dst.mac, "ipv4_src": src.ip,
            "ipv4_dst": dst.ip, "ip_proto": 17, "udp_src": sport, "udp_dst": dport}
