"""A fake OpenFlow 1.3 switch and fabric for policy unit tests (Faucet's fakeoftable idea).

Policies return ``controllers.messages`` messages; ``FakeSwitch`` applies them to its tables and
groups and answers "where does this packet go?" with the semantics Open vSwitch has for what
the policies use: priorities, masked matches, goto_table, write_metadata, registers,
set_field, resubmit (returns to the action list), groups (buckets act on a copy), multipath
(5-tuple hash into a register), learn (installs a flow) and output to the controller.
``FakeFabric`` follows packets across the leaf-spine plan hop by hop, hands packet-ins to the
policy and applies its answers, as the os-ken app does.
"""
from __future__ import annotations

import ipaddress
import zlib
from typing import Dict, List, Optional, Tuple

from controllers.messages import (CONTROLLER, ClearFlows, FlowMod, Group, GroupMod, Learn,
                               Multipath, Output, Resubmit, SetField)
from testbed.base.topology import FabricPlan

HASHED = ("ipv4_src", "ipv4_dst", "ip_proto", "udp_src", "udp_dst")


def _field_matches(value, want) -> bool:
    if isinstance(want, tuple):  # (value, mask)
        addr, mask = want
        if value is None:
            return False
        m = int(ipaddress.ip_address(mask))
        return int(ipaddress.ip_address(value)) & m == int(ipaddress.ip_address(addr)) & m
    return value == want


def five_tuple_hash(pkt: dict, basis: int = 0) -> int:
    """A deterministic 5-tuple hash standing in for OVS's symmetric_l3l4+udp."""
    key = "|".join(str(pkt.get(k)) for k in HASHED) + f"|{basis}"
    return zlib.crc32(key.encode())


class FakeSwitch:
    def __init__(self, dpid: int):
        self.dpid = dpid
        self.flows: List[FlowMod] = []
        self.groups: Dict[int, GroupMod] = {}

    # --- programming ------------------------------------------------------------------------
    def apply(self, messages) -> None:
        for m in messages:
            if isinstance(m, ClearFlows):
                self.flows, self.groups = [], {}
            elif isinstance(m, FlowMod):
                self.add_flow(m)
            elif isinstance(m, GroupMod):
                if m.modify and m.group_id not in self.groups:
                    raise AssertionError(f"modify of missing group {m.group_id:#x}")
                if not m.modify and m.group_id in self.groups:
                    raise AssertionError(f"group {m.group_id:#x} added twice on {self.dpid:#x}")
                self.groups[m.group_id] = m
            else:
                raise AssertionError(f"unexpected message {m!r}")

    def add_flow(self, m: FlowMod) -> None:
        """OFPFC_ADD: replaces a flow with the same table, priority and match."""
        self.flows = [f for f in self.flows if not (f.priority == m.priority and
                                                    f.match == m.match and
                                                    f.table_id == m.table_id)]
        self.flows.append(m)

    def table(self, table_id: int) -> List[FlowMod]:
        return [f for f in self.flows if f.table_id == table_id]

    # --- forwarding ---------------------------------------------------------------------------
    def lookup(self, table_id: int, pkt: dict) -> Optional[FlowMod]:
        best = None
        for f in self.flows:
            if f.table_id == table_id and all(_field_matches(pkt.get(k), v) for k, v in f.match):
                if best is None or f.priority > best.priority:
                    best = f
        return best

    def process(self, pkt: dict) -> Tuple[List[Tuple[int, dict]], List[dict]]:
        """Run ``pkt`` (with ``in_port``) through the pipeline from table 0.

        Returns (outputs as (port, packet), packet-ins as packets)."""
        state = {"outputs": [], "packet_ins": []}
        self._table(0, dict(pkt), state, depth=0)
        return state["outputs"], state["packet_ins"]

    def _table(self, table_id: int, pkt: dict, state, depth: int) -> dict:
        if depth > 16:
            raise AssertionError("resubmit/goto loop")
        flow = self.lookup(table_id, pkt)
        if flow is None:
            return pkt  # table miss: drop
        if flow.metadata is not None:
            pkt["metadata"] = flow.metadata
        pkt = self._actions(flow.actions, pkt, state, depth)
        if flow.goto is not None:
            assert flow.goto > table_id, "goto_table must go forward"
            pkt = self._table(flow.goto, pkt, state, depth + 1)
        return pkt

    def _actions(self, actions, pkt, state, depth) -> dict:
        for a in actions:
            if isinstance(a, SetField):
                pkt[a.field] = a.value
            elif isinstance(a, Output):
                if a.port == CONTROLLER:
                    state["packet_ins"].append(dict(pkt))
                elif a.port != pkt.get("in_port"):  # OVS never outputs to the in-port
                    state["outputs"].append((a.port, dict(pkt)))
            elif isinstance(a, Group):
                group = self.groups[a.group_id]
                buckets = group.buckets
                if group.group_type == "select":
                    buckets = [buckets[five_tuple_hash(pkt) % len(buckets)]]
                for bucket in buckets:  # a bucket acts on a copy of the packet
                    self._actions(bucket.actions, dict(pkt), state, depth + 1)
            elif isinstance(a, Resubmit):
                pkt = self._table(a.table, pkt, state, depth + 1)
            elif isinstance(a, Multipath):
                pkt[a.dst] = five_tuple_hash(pkt, a.basis) % a.links
            elif isinstance(a, Learn):
                match = dict(a.const)
                match.update({f: pkt.get(f) for f in a.copy})
                self.add_flow(FlowMod(priority=a.priority, match=tuple(sorted(match.items())),
                                      actions=(SetField(a.load_field, a.load_value),),
                                      table_id=a.table, cookie=a.cookie,
                                      idle_timeout=a.idle_timeout))
            else:
                raise AssertionError(f"unknown action {a!r}")
        return pkt


class FakeFabric:
    """Every switch of a plan, programmed by a policy, with the cabling of the plan."""

    def __init__(self, plan: FabricPlan, policy):
        self.plan, self.policy = plan, policy
        self.switches: Dict[str, FakeSwitch] = {}
        for sw in plan.switches:
            fake = FakeSwitch(sw.dpid)
            fake.apply(policy.switch_connected(sw.dpid))
            self.switches[sw.name] = fake
        self.by_dpid = {sw.dpid: self.switches[sw.name] for sw in plan.switches}
        self.wires = {}
        for link in plan.links:
            self.wires[(link.node1, link.port1)] = (link.node2, link.port2)
            self.wires[(link.node2, link.port2)] = (link.node1, link.port1)
        self.packet_ins = 0

    def apply(self, per_switch: Dict[int, list]) -> None:
        for dpid, messages in per_switch.items():
            self.by_dpid[dpid].apply(messages)

    def deliver(self, src_host: str, pkt: dict, max_hops: int = 12):
        """Inject ``pkt`` from a GPU; returns [(receiving GPU, packet, switches on its path)]."""
        node, port = self.wires[(src_host, 0)]
        pending = [(node, port, dict(pkt), [])]
        delivered = []
        while pending:
            node, port, pkt, path = pending.pop()
            path = path + [node]
            if len(path) > max_hops:
                raise AssertionError(f"forwarding loop: {path}")
            sw = self.switches[node]
            outputs, packet_ins = sw.process(dict(pkt, in_port=port))
            for p in packet_ins:
                self.packet_ins += 1
                sw.apply(self.policy.packet_in(sw.dpid, p["in_port"], p.get("metadata", 0),
                                               p["eth_src"]))
            for out_port, out in outputs:
                for k in ("in_port", "metadata", "reg0", "reg1"):  # pipeline state stays behind
                    out.pop(k, None)
                peer, peer_port = self.wires[(node, out_port)]
                if peer.startswith("gpu"):
                    delivered.append((peer, out, path))
                else:
                    pending.append((peer, peer_port, out, path))
        return delivered

    def send(self, src_host: str, pkt: dict):
        """Unicast: (receiving GPU, packet) or None, and the path; asserts one copy at most."""
        got = self.deliver(src_host, pkt)
        assert len(got) <= 1, f"{len(got)} copies delivered: {[g[0] for g in got]}"
        if not got:
            return None, None
        host, out, path = got[0]
        return (host, out), path


def udp_packet(src, dst, sport=0xC000, dport=4791, ecn=2) -> dict:
    return {"eth_type": 0x0800, "eth_src": src.mac, "eth_dst": dst.mac, "ipv4_src": src.ip,
            "ipv4_dst": dst.ip, "ip_proto": 17, "udp_src": sport, "udp_dst": dport,
            "ip_ecn": ecn}
