"""A policy's run, decided once (pure): ``decide`` builds the policy as it runs on this machine
and settles everything the fabric, the switch-queue emulator, the agents, the controller and
the results take from it - traffic classes, who marks ECN and how, link MTU, per-hop latency,
congestion control and DCQCN's rate limiters, placement over servers, the collectives and the
traffic beside them, the time scale. Each of them reads the frozen ``PolicyRun`` it is handed;
none works these out again, and no policy is changed after it is built.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from controllers.classes import TrafficClass, class_of
from controllers.policy import Policy, make_policy
from traffic.contract import QpLimiter, WorkloadSpec
from traffic.ratelimit import limiter_qdisc

from ..base.capabilities import Capabilities
from ..base.frames import link_frame_bytes, link_mtu
from ..base.hops import HopModel, PathDelay, hop_model, mechanism
from ..base.topology import FabricPlan, Host
from ..job.plan import JobPlan, plan_job
from ..scenario.config import Scenario
from .background import BackgroundPlan, background_plan, rxe_endpoints
from .marking import marking_method, marking_via
from .placement import LOCAL, place


@dataclass(frozen=True)
class PolicyRun:
    """One policy's run at one time scale, as decided before its fabric is built."""

    policy: Policy
    scenario: Scenario  # at the GPU NIC rate this run goes at
    classes: Tuple[TrafficClass, ...]  # of every switch egress queue and GPU NIC queue
    marking: Optional[str]  # ECN: "red" (the kernel's RED) | "sampled" | None (no ECN class)
    marking_via: Optional[str]  # who applies sampled marking: "bpf" | "openflow" | None
    link_mtu: int  # Ethernet MTU of every link
    hops: HopModel
    path_delay: PathDelay  # the hop model's delays per port kind, and what applies them
    congestion_control: str  # what the GPUs' NICs run: "dcqcn" | "none"
    rto_us: float  # the GPUs' NICs' retransmission timeout (modelled us)
    qp_limiter: Optional[QpLimiter]  # DCQCN's per-QP rate limiters (None without DCQCN)
    placement: Optional[Dict[str, str]]  # node -> server of a split fabric (None: one server)
    workloads: Tuple[WorkloadSpec, ...]  # the collectives every GPU replays, one per size
    background: BackgroundPlan  # who sends background traffic to whom
    rxe_endpoints: Optional[Tuple[Host, Host]]  # the hosts real verbs traffic runs between
    job: Optional[JobPlan] = None  # the training job they replay instead, if the scenario has one
    label: str = ""  # what names its results: the policy's name or a variant's label
    repetition: int = 1  # which of the scenario's ``repeat`` runs of the policy this is

    @property
    def title(self) -> str:
        """What names its results: the policy's name or a variant's label."""
        return self.label or self.policy.name

    @property
    def name(self) -> str:
        """What names its files and progress: the title, and from the second repetition on
        its number (``hyperscale.2``)."""
        return self.title if self.repetition == 1 else f"{self.title}.{self.repetition}"

    @property
    def plan(self) -> FabricPlan:
        return self.policy.plan

    @property
    def time_scale(self) -> float:
        return self.scenario.time_scale


def decide(label: str, plan: FabricPlan, scenario: Scenario, caps: Capabilities) -> PolicyRun:
    """The run of ``label`` (a policy, or a variant of one) of ``scenario`` on a machine with
    ``caps``."""
    name, scenario = scenario.policy_run(label)
    draft = make_policy(name, plan, scenario)
    marking = ecn_marking(scenario, draft.traffic_classes(), caps)
    via = marking_via(marking, caps.bpf_marking)
    # who marks is part of the policy's context (OpenFlow marking changes its pipeline), and
    # the classes that decide it do not depend on it: built once more with it, never changed
    policy = (make_policy(name, plan, scenario, openflow_marking=True) if via == "openflow"
              else draft)
    classes = tuple(policy.traffic_classes())
    cc = policy.congestion_control(scenario.transport.congestion_control)
    hops = hop_model(scenario, policy.params)
    return PolicyRun(
        policy=policy, scenario=scenario, classes=classes, marking=marking, marking_via=via,
        link_mtu=link_mtu(scenario.workload.mtu), hops=hops,
        path_delay=path_delay(scenario, hops, caps),
        congestion_control=cc,
        rto_us=policy.rto_us(scenario.transport.rto_us, roce_class(policy, classes).buffer_bytes,
                             scenario.slowest_link_gbit),
        qp_limiter=qp_limiter(scenario, policy, classes) if cc == "dcqcn" else None,
        placement=cluster_placement(scenario, plan), workloads=workload_specs(scenario, plan),
        background=background_plan(plan, scenario),
        rxe_endpoints=rxe_endpoints(plan) if scenario.rxe.enabled else None,
        job=plan_job(scenario), label=label)


def ecn_marking(scenario: Scenario, classes, caps: Capabilities) -> Optional[str]:
    """How switches with these classes mark ECN here: "red", "sampled" or None (ConfigError
    for a marking this machine cannot do)."""
    return marking_method(scenario.emulation.ecn_marking, caps.red, classes, caps.datapath)


def path_delay(scenario: Scenario, hops: HopModel, caps: Capabilities) -> PathDelay:
    """The hop model's delay per port kind at this run's rates, and the mechanism that applies
    it here (``emulation.path_delay``; ConfigError for one this machine lacks)."""
    t = scenario.topology
    delays = hops.delays_us(t.host_rate_mbit, t.fabric_rate_mbit,
                            link_frame_bytes(link_mtu(scenario.workload.mtu)))
    return PathDelay(mechanism(scenario.emulation.path_delay, caps.netem), delays)


def roce_class(policy: Policy, classes) -> TrafficClass:
    """The class RoCE data travels in (the default class if none names its DSCP)."""
    roce = policy.dscp()[0]
    return class_of(roce, classes)


def qp_limiter(scenario: Scenario, policy: Policy, classes) -> QpLimiter:
    """Where DCQCN's per-QP rate limiters live on every GPU NIC: the HTB qdisc of the class
    RoCE data travels in (its handle is that class's minor) and the settings of the QP classes
    the agents add to it (``traffic.ratelimit``)."""
    cls = roce_class(policy, classes)
    return QpLimiter(major=cls.minor, **limiter_qdisc(scenario.topology.host_rate_mbit,
                                                      link_mtu(scenario.workload.mtu)))


def workload_specs(scenario: Scenario, plan: FabricPlan) -> Tuple[WorkloadSpec, ...]:
    """The collectives each agent replays: one entry per size (a sweep has several). The
    hierarchical collective's groups are the servers, or without servers the leaves."""
    w = scenario.workload
    group = plan.gpus_per_server if plan.gpus_per_server > 1 else plan.gpus_per_leaf
    return tuple(WorkloadSpec(w.collective, size, w.iterations, w.chunks, group, w.pxn)
                 for size in w.run_sizes)


def cluster_servers(scenario: Scenario) -> List[str]:
    """The scenario's servers, this machine named ``localhost``."""
    servers = list(scenario.cluster.servers)
    return [LOCAL] + servers[1:] if servers else []


def cluster_placement(scenario: Scenario, plan: FabricPlan) -> Optional[Dict[str, str]]:
    """Node -> server when the fabric is split over several servers, else None."""
    servers = cluster_servers(scenario)
    if len(servers) < 2:
        return None
    return place(plan, servers, scenario.cluster.placement)
