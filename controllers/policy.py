"""The policy interface every switching policy implements, and the explicit registry.

A policy is a pure core (Faucet style): it takes fabric events and returns OpenFlow messages
(``controllers.messages``) and the traffic classes every egress queue must have
(``controllers.classes``); it never touches a socket. ``controllers.app`` is the thin os-ken
adapter that feeds it events; ``testbed.switchq.emulator`` emulates the switches' queue mechanisms
(ECN marking, PFC) that the classes ask for and reports queue state back as events.
"""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional, Tuple, Type

from testbed.base.topology import FabricPlan

from .classes import TrafficClass
from .messages import Message
from .params import resolve, to_dict

# After the emulator acts, frames that left the feeding queues before it still arrive: those
# in flight (netlink, the veth) and those Open vSwitch's userspace datapath held while it was
# late - it then forwards them at once. In a synchronised 7:1 lossless incast at 40 Mbit/s on
# the 2-core machine a spine port grew by up to 187 KB within one 1 ms sample, about 12 ms of
# its feeders' traffic. Real switches size PFC headroom the same way: rate x the time until
# a pause takes effect.
LANDING_S = 0.015


@dataclass(frozen=True)
class FabricContext:
    """What a policy needs to know of the emulation besides the plan."""

    host_rate_mbit: float = 40.0
    fabric_rate_mbit: float = 40.0
    mtu: int = 4096  # RoCE path MTU
    sample_interval_s: float = 0.001  # of the switch-queue emulator
    # the per-hop latency model's inputs (testbed.base.hops), besides the policy's own parameters
    time_scale: float = 1.0
    cable_m: float = 0.0
    link_delay_us: float = 0.0
    switch_latency: bool = False
    # sampled ECN marking through OpenFlow marking groups (only where the kernel cannot run
    # testbed.fabric.bpfmark's program): the EGRESS table then matches ip_ecn
    openflow_marking: bool = False
    modelled_gbit: float = 100.0  # the modelled fabric's link rate: the byte defaults scale
    sprayed: bool = False  # the senders draw a new UDP source port per packet

    @property
    def reaction_s(self) -> float:
        """Emulated reaction time of a queue mechanism (ECN, PFC), with margin: up to one
        sample interval before the emulator sees a queue cross a threshold, one more before
        it acts, one for a late sample on a busy machine, and ``LANDING_S`` for the change to
        land."""
        return 3 * self.sample_interval_s + LANDING_S

    @classmethod
    def of(cls, scenario) -> "FabricContext":
        t = scenario.topology
        return cls(t.host_rate_mbit, t.fabric_rate_mbit, scenario.workload.mtu,
                   scenario.sample_interval_us / 1e6, scenario.time_scale,
                   t.cable_m, t.link_delay_us, scenario.emulation.switch_latency,
                   modelled_gbit=t.modelled_rate_gbit,
                   sprayed=scenario.transport.entropy == "per-packet")


class Policy(ABC):
    """Switching policy for one leaf-spine fabric."""

    name: ClassVar[str]
    parameters: ClassVar[type]  # its parameters' dataclass (controllers.params)
    colour: ClassVar[str]  # in plots and the report
    cookie: ClassVar[int]  # marks this policy's flows (visible in ovs-ofctl dump-flows)
    wants_queue_load: bool = False  # send queue_load events (adaptive routing)
    wants_packet_in: bool = False  # switches send some packets to the controller
    default_congestion_control: str = "none"  # what senders run when the scenario says auto
    default_rto_us: float = 100.0  # the NICs' retransmission timeout when the scenario says auto

    def __init__(self, plan: FabricPlan, params=None, context: FabricContext = None):
        self.plan = plan
        self.context = context or FabricContext()
        self.params = params if params is not None else resolve(
            self.name, {}, self.context.modelled_gbit, self.context.mtu)

    def params_dict(self) -> dict:
        return to_dict(self.params)

    @abstractmethod
    def traffic_classes(self) -> Tuple[TrafficClass, ...]:
        """The classes of every switch egress queue and GPU NIC queue."""

    @abstractmethod
    def switch_connected(self, dpid: int) -> List[Message]:
        """Messages that program switch ``dpid`` (sent when it connects)."""

    def dscp(self) -> Tuple[int, int]:
        """(DSCP of RoCE data, DSCP of CNPs) the GPUs mark their packets with."""
        return 26, 48

    def congestion_control(self, configured: str) -> str:
        """``dcqcn`` or ``none``: ``configured`` (transport.congestion_control), or the
        policy's default for "auto"."""
        return self.default_congestion_control if configured == "auto" else configured

    def rto_us(self, configured, roce_buffer_bytes: int, slowest_gbit: float) -> float:
        """The NICs' retransmission timeout (modelled us): ``configured`` (transport.rto_us),
        or for "auto" the policy's default but at least twice the time the RoCE class's buffer
        takes to drain at the slowest link (Gbit/s, modelled) - a frame's way through a full
        queue and its coalesced ACK's back through another. A shorter timer resends frames that
        arrived (4 MB buffers at 100 us: 4-14 go-back-Ns a run)."""
        if configured != "auto":
            return float(configured)
        return max(self.default_rto_us, 2 * roce_buffer_bytes * 8 / (slowest_gbit * 1e3))

    def reorders_qps(self) -> bool:
        """Whether the fabric may deliver one QP's packets out of order (per-packet entropy,
        or routes that move a running flow): its RNICs must then place packets ahead of a gap,
        as the NICs such fabrics are built with do, and resend only a gap that outlives a
        reorder window."""
        return self.context.sprayed

    def flowlet_gap_us(self) -> Optional[float]:
        """How long a QP idles (modelled us) before its next packet starts a new flowlet with a
        new UDP source port, which the fabric may route anew (None: a QP keeps its port)."""
        return None

    def may_reach(self, src: str, dst: str) -> bool:
        """Whether GPU ``src`` may send to GPU ``dst`` (False: e.g. other tenants)."""
        return True

    def packet_in(self, dpid: int, in_port: int, metadata: int, eth_src: str) -> List[Message]:
        """A packet the switch sent to the controller (only policies that ask for them)."""
        return []

    def ecn_changed(self, dpid: int, port: int, marking: bool) -> List[Message]:
        """The emulated queue of (dpid, port) starts or stops marking ECN."""
        return []

    def queue_load(self, load: Dict[int, Dict[int, int]]) -> Dict[int, List[Message]]:
        """Latest backlog (bytes) of the watched queues, {dpid: {port: backlog}}; returns
        the messages for each switch."""
        return {}

    def watched_ports(self) -> Optional[Dict[int, List[int]]]:
        """{dpid: ports} whose backlog ``queue_load`` needs (None: none)."""
        return None


_REGISTRY: Dict[str, Type[Policy]] = {}


def register(cls: Type[Policy]) -> Type[Policy]:
    _REGISTRY[cls.name] = cls
    return cls


def make_policy(name: str, plan: FabricPlan, scenario, openflow_marking: bool = False) -> Policy:
    """The policy ``name`` configured by a scenario (its parameter overrides, rates, MTU);
    ``openflow_marking``: its switches mark ECN through OpenFlow (``testbed.plan.policyrun``)."""
    context = dataclasses.replace(FabricContext.of(scenario), openflow_marking=openflow_marking)
    params = resolve(name, scenario.policy_params.get(name, {}), context.modelled_gbit,
                     context.mtu)
    return policy_class(name)(plan, params, context)


def policy_names() -> List[str]:
    _load()
    return sorted(_REGISTRY)


def policy_class(name: str) -> Type[Policy]:
    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r} (known: {', '.join(sorted(_REGISTRY))})")


def _load() -> None:
    # The registry is the list of policy modules below; importing one registers it.
    from . import enterprise, hyperscale, lossless  # noqa: F401
