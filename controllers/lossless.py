"""Lossless-AI (InfiniBand / Spectrum-X-class) policy.

* Classes (every egress queue): CNPs highest priority; RoCE (DSCP 26) in a lossless class with
  PFC (pause the queues that feed the switch above XOFF, resume below XON) and RED-like ECN
  marking for DCQCN; everything else best effort, lossy. The RoCE buffer is XOFF plus headroom
  for what arrives while a pause takes effect. With ``flow_control: credit`` (InfiniBand) the
  RoCE class is kept lossless by credits instead: its feeders wait while it has less room
  than the headroom, inside its buffer; and the CNP class is a lossless lane too, with
  credits of its own (a buffer of ``other_buffer_bytes`` beyond the same headroom), so a
  data lane that waits never holds a CNP.
* Adaptive routing at the leaves: RoCE to another leaf looks up its flowlet (table FLOWLET);
  a new flowlet - a QP's RNIC draws a new UDP source port after ``flowlet_gap_us`` idle
  (modelled); a flow idle for ``flowlet_gap_s`` is forgotten - is hashed (5-tuple) over the
  leaf's least-loaded uplinks (one AR slot each), and the choice is learned for it. The
  slots follow the uplink backlog the switch-queue emulator reports, so new flows avoid
  uplinks whose queue builds (half the ECN threshold above the least loaded) while running
  flowlets stay in order; a change of the least-loaded set
  costs one flow mod per slot that moved, plus one for the hash when the set's size changed.
* Spraying: when senders vary the UDP source port per packet (``FabricContext.sprayed``),
  every packet is a new 5-tuple, hashed over the slots - spread over the least-loaded uplinks -
  and nothing is learned: a flowlet per packet would only cost Open vSwitch a flow table
  change for every packet.

Everything else (non-RoCE traffic, spines) is routed as in ``controllers.l3``.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from testbed.base.errors import ConfigError
from testbed.base.frames import ROCE_UDP_PORT, link_frame_bytes, link_mtu
from testbed.base.hops import model
from testbed.base.topology import leaf_subnet

from . import l3

from .classes import CreditRule, EcnRule, PfcRule, TrafficClass
from .messages import (ETH_TYPE_IPV4, IPPROTO_UDP, PRIO_MISS, PRIO_ROCE, PRIO_ROUTE,
                    ClearFlows, Learn, Message, Multipath, Resubmit, SetField, flow, prefix)
from .params import LosslessParams
from .policy import Policy, register

FLOWLET_FIELDS = ("ipv4_src", "ipv4_dst", "udp_src", "udp_dst")


@register
class LosslessPolicy(Policy):
    name = "lossless"
    parameters = LosslessParams
    colour = "#2ca02c"
    cookie = 0x4C4C  # "LL"
    default_congestion_control = "dcqcn"
    # nothing is dropped: the timer only has to outwait PFC's pauses and the coalesced ACKs of
    # QPs DCQCN slowed down (docs/fabric.md, "Reliable connection")
    default_rto_us = 1000.0

    def __init__(self, plan, params=None, context=None):
        super().__init__(plan, params, context)
        uplinks = [port for _, port in sorted(plan.uplinks().items())]
        # per leaf, the uplinks new flowlets are hashed over (slot i -> uplink)
        self.slots: Dict[int, List[int]] = {leaf.dpid: list(uplinks) for leaf in plan.leaves}

    def dscp(self):
        return self.params.roce_dscp, self.params.cnp_dscp

    @property
    def wants_queue_load(self) -> bool:
        return self.params.adaptive_routing

    def flowlet_gap_us(self) -> Optional[float]:
        """Flowlet switching's inactivity interval, in modelled time: the sender knows its own
        gaps to the nanosecond, where Open vSwitch's idle timeouts count whole seconds of the
        machine's time and cannot be scaled (docs/fabric.md, "Entropy")."""
        p = self.params
        if not p.adaptive_routing or not p.flowlet_gap_us or self.context.sprayed:
            return None
        return p.flowlet_gap_us

    def reorders_qps(self) -> bool:
        """Adaptive routing moves a flowlet that looked idle - also one whose frames a pause
        still holds on the old path - so its RNICs take packets out of order, as InfiniBand's
        and Spectrum-X's adaptive routing expects of theirs."""
        return self.params.adaptive_routing or super().reorders_qps()

    # --- queues -----------------------------------------------------------------------------
    def headroom_bytes(self) -> int:
        """Buffer beyond XOFF: every port that can feed one egress queue keeps sending for
        the emulated reaction time (plus two frames in flight) before its pause lands, and
        what it sent during the switch's per-hop delay (``testbed.base.hops``: frames wait in that
        delay line before they join the paused buffer) lands after it - the "rate x one-way
        delay" of docs/REFERENCE.md. Counted whether or not this kernel applies the delay."""
        if self.params.pfc_headroom_bytes:
            return self.params.pfc_headroom_bytes
        ctx, plan = self.context, self.plan
        rate = max(ctx.host_rate_mbit, ctx.fabric_rate_mbit) * 1e6 / 8
        feeders = max(plan.hosts_per_leaf - 1 + plan.n_spines, plan.n_leaves - 1,
                      plan.hosts_per_leaf)
        frame = link_mtu(ctx.mtu)  # the largest packet on a link
        hop = model(self.params, ctx.time_scale, ctx.cable_m, ctx.link_delay_us,
                    ctx.switch_latency)
        delay_s = max(hop.switch_us(r, link_frame_bytes(frame))
                      for r in (ctx.host_rate_mbit, ctx.fabric_rate_mbit)) / 1e6
        return int(feeders * (rate * (ctx.reaction_s + delay_s) + 2 * frame))

    def traffic_classes(self) -> Tuple[TrafficClass, ...]:
        p = self.params
        ecn = EcnRule("red", p.ecn_kmin_bytes, p.ecn_kmax_bytes, p.ecn_pmax)
        headroom = self.headroom_bytes()
        if p.flow_control == "credit":
            roce = TrafficClass("roce", 1, 1, (p.roce_dscp,), self.credit_buffer(headroom),
                                ecn=ecn, credit=self.credit_rule(headroom))
            cnp_lane = p.other_buffer_bytes + headroom  # InfiniBand: a lane of its own
            cnp = TrafficClass("cnp", 0, 0, (p.cnp_dscp,), cnp_lane,
                               credit=CreditRule(p.other_buffer_bytes, cnp_lane))
        else:
            roce = TrafficClass("roce", 1, 1, (p.roce_dscp,), p.pfc_xoff_bytes + headroom,
                                ecn=ecn, pfc=PfcRule(p.pfc_xoff_bytes, p.pfc_xon_bytes))
            cnp = TrafficClass("cnp", 0, 0, (p.cnp_dscp,), p.other_buffer_bytes)
        return (cnp, roce, TrafficClass("other", 2, 2, (), p.other_buffer_bytes))

    def credit_buffer(self, headroom: int) -> int:
        return self.params.credit_buffer_bytes or self.params.pfc_xoff_bytes + headroom

    def credit_rule(self, headroom: int) -> CreditRule:
        """Credits: the feeders stop while the lane has less room than they can send before
        the stop lands - the headroom PFC would keep beyond XOFF, here inside the buffer."""
        buffer = self.credit_buffer(headroom)
        frame = link_mtu(self.context.mtu)
        if buffer - headroom < frame:
            raise ConfigError(
                f"policy_params.lossless.credit_buffer_bytes: {buffer:,} B leaves no room "
                f"beyond the {headroom:,} B the feeders can send before a stop lands; give "
                f"at least {headroom + frame:,}")
        return CreditRule(buffer - headroom, buffer)

    # --- forwarding -------------------------------------------------------------------------
    def switch_connected(self, dpid: int) -> List[Message]:
        plan, cookie = self.plan, self.cookie
        sw = plan.switch_by_dpid(dpid)
        msgs: List[Message] = [ClearFlows(), flow(PRIO_MISS, {}, cookie=cookie)]
        if sw.role == "leaf":
            msgs += l3.local_hosts(plan, sw.index, cookie)
            if self.params.adaptive_routing:
                msgs += self._adaptive(sw.index, dpid)
            msgs += l3.ecmp(plan, sw.index, cookie)
        else:
            msgs += l3.spine_routes(plan, cookie)
        return msgs + l3.egress(l3.switch_ports(plan, dpid), cookie,
                                self.context.openflow_marking)

    def _adaptive(self, leaf: int, dpid: int) -> List[Message]:
        cookie = self.cookie
        msgs: List[Message] = []
        for other in self.plan.leaves:
            if other.index != leaf:
                msgs.append(flow(PRIO_ROCE, {"eth_type": ETH_TYPE_IPV4, "ip_proto": IPPROTO_UDP,
                                             "udp_dst": ROCE_UDP_PORT,
                                             "ipv4_dst": prefix(leaf_subnet(other.index))},
                                 Resubmit(l3.FLOWLET), Resubmit(l3.EGRESS), cookie=cookie))
        msgs.append(self._hash(len(self.slots[dpid])))
        msgs += [self._slot(i, port) for i, port in enumerate(self.slots[dpid])]
        return msgs

    def _hash(self, slots: int) -> Message:
        """FLOWLET's miss: a new flowlet is hashed (5-tuple) into one of ``slots`` slots."""
        return flow(PRIO_MISS, {}, Multipath(slots), Resubmit(l3.AR), table=l3.FLOWLET,
                    cookie=self.cookie)

    def _slot(self, slot: int, port: int) -> Message:
        if self.context.sprayed:
            return flow(PRIO_ROUTE, {"reg1": slot}, SetField("reg0", port), table=l3.AR,
                        cookie=self.cookie)
        learn = Learn(table=l3.FLOWLET, const=(("eth_type", ETH_TYPE_IPV4),
                                               ("ip_proto", IPPROTO_UDP)),
                      copy=FLOWLET_FIELDS, load_field="reg0", load_value=port,
                      idle_timeout=self.params.flowlet_gap_s, cookie=self.cookie)
        # learn reads the packet's UDP ports: the match must make them valid (prerequisites)
        return flow(PRIO_ROUTE, {"reg1": slot, "eth_type": ETH_TYPE_IPV4,
                                 "ip_proto": IPPROTO_UDP},
                    SetField("reg0", port), learn, table=l3.AR, cookie=self.cookie)

    def watched_ports(self):
        if not self.params.adaptive_routing:
            return None
        return {leaf.dpid: sorted(self.plan.uplinks().values()) for leaf in self.plan.leaves}

    def queue_load(self, load: Dict[int, Dict[int, int]]) -> Dict[int, List[Message]]:
        """Hash new flowlets of a leaf over its least-loaded uplinks: those whose backlog is
        within ``margin`` of the least - half the ECN marking threshold (a queue building
        toward congestion), at least a frame. A frame or two queued on a busy uplink is
        serialization, not congestion: moving flowlets away from it would only trade uplinks
        back and forth, a flow mod each time."""
        out: Dict[int, List[Message]] = {}
        margin = max(link_mtu(self.context.mtu), self.params.ecn_kmin_bytes // 2)
        for dpid, backlog in load.items():
            if dpid not in self.slots or not backlog:
                continue
            least = min(backlog.values())
            want = sorted(p for p, b in backlog.items() if b <= least + margin)
            old = self.slots[dpid]
            if want == old:
                continue
            # slots first, then the hash: a packet never hashes into a slot not yet pointed
            msgs = [self._slot(i, port) for i, port in enumerate(want)
                    if i >= len(old) or old[i] != port]
            if len(want) != len(old):
                msgs.append(self._hash(len(want)))
            out[dpid] = msgs
            self.slots[dpid] = want
        return out

    def ecn_changed(self, dpid: int, port: int, marking: bool) -> List[Message]:
        return [l3.mark_group(port, marking)]
