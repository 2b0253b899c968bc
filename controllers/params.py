"""Each policy's parameters: documented defaults, scaled to the modelled fabric's link rate.

Byte quantities (buffers, ECN and PFC thresholds) are declared for the modelled 100 Gbit/s
fabric and scale linearly with ``topology.modelled_rate_gbit``, as published thresholds do with
real link rates (HPCC's Kmin/Kmax "scaled linearly with link rate"), never below two frames -
not with the emulated rate: a byte is a byte at every time scale (the emulation slows the
links, the frames stay), so a buffer drains in the same modelled time at 40 or 5 Mbit/s. A
value given in the scenario (``policy_params: {lossless: {pfc_xoff_bytes: 60000}}``) is used
as it is.

Ordering kept by the lossless defaults, as in real deployments: ECN marks before PFC pauses
(Kmin < Kmax <= XOFF), and the RoCE class buffer is XOFF plus the headroom that absorbs what
arrives while a pause takes effect, so the class never drops. Kmin is eight 4 KB frames: the
emulated queues wander by a few frames even without contention (Open vSwitch forwards in
bursts on a busy CPU), and a threshold below that would mark - and throttle senders - for
nothing.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Tuple

from testbed.base.errors import ConfigError
from testbed.base.frames import link_mtu
from testbed.base.schema import build

REFERENCE_RATE_MBIT = 40.0  # the emulated rate the testbed's defaults were measured at
REFERENCE_MODELLED_GBIT = 100.0  # the modelled rate the byte defaults are declared for
SCALED = {"scaled": True, "unit": "B"}


def _bytes(default, doc, **extra):
    return field(default=default, metadata=dict(SCALED, min=0, max=1 << 30, doc=doc, **extra))


FORWARDING = ("cut_through", "store_and_forward")


def _forwarding(default):
    return field(default=default, metadata={
        "choices": FORWARDING,
        "doc": "switching mode: cut_through forwards after the header, store_and_forward "
               "adds one frame serialization per hop (netem; only where the kernel has it)"})


def _pipeline_ns(default, doc):
    return field(default=default, metadata={
        "min": 0.0, "max": 1_000_000.0, "unit": "ns",
        "doc": f"switch pipeline latency per hop in the modelled fabric ({doc}); emulated "
               "as this times the run's time scale (netem; only where the kernel has it)"})


@dataclass(frozen=True)
class HyperscaleParams:
    """Tomahawk-class: ECMP, shallow buffers, tail drop, ECN step marking for DCQCN."""

    buffer_bytes: int = _bytes(96_000, "egress buffer per port (shallow, drop when full)")
    ecn: str = field(default="step", metadata={
        "choices": ("off", "step"),
        "doc": "ECN marking: step (DCTCP-style, and the senders run DCQCN when "
               "transport.congestion_control is auto), or off (the bare variant: no marks, "
               "no congestion control)"})
    ecn_k_bytes: int = _bytes(32_000, "step marking threshold K")
    forwarding: str = _forwarding("store_and_forward")
    switch_latency_ns: float = _pipeline_ns(250.0, "Ethernet: about 200-250 ns")


@dataclass(frozen=True)
class EnterpriseParams:
    """Trident-class: one spanning tree, L2 learning, tenants, strict-priority interactive."""

    buffer_bytes: int = _bytes(192_000, "best-effort (RoCE) buffer per port: a moderate share")
    interactive_buffer_bytes: int = _bytes(32_000, "interactive class buffer per port")
    interactive_dscp: int = field(default=46, metadata={
        "min": 0, "max": 63, "doc": "DSCP of the strict-priority interactive class (EF)"})
    spanning_tree_root: int = field(default=1, metadata={
        "min": 1, "max": 255, "doc": "the spine that carries all inter-leaf traffic"})
    tenants: Tuple[Tuple[str, ...], ...] = field(default=(), metadata={
        "item": "names", "doc": "GPU names per tenant; GPUs not listed form one more tenant "
                                "(default: all GPUs in one tenant)"})
    forwarding: str = _forwarding("store_and_forward")
    switch_latency_ns: float = _pipeline_ns(250.0, "Ethernet: about 200-250 ns")


@dataclass(frozen=True)
class LosslessParams:
    """InfiniBand / Spectrum-X-class: lossless RoCE class (PFC, or InfiniBand's credits), ECN
    for DCQCN, adaptive routing and spraying, CNPs in the highest priority."""

    flow_control: str = field(default="pfc", metadata={
        "choices": ("pfc", "credit"),
        "doc": "what keeps the RoCE class lossless: pfc (Ethernet, the Spectrum-X reading: "
               "pause above XOFF, resume below XON) or credit (InfiniBand: a queue's feeders "
               "send only while it has room for what they can still send before a stop "
               "lands; no hysteresis, no pause frames; docs/fabric.md, \"Credits\")"})
    credit_buffer_bytes: int = _bytes(0, "credit: the RoCE lane's buffer per egress queue "
                                         "(0: XOFF plus headroom, the buffer PFC gets)")
    pfc_xoff_bytes: int = _bytes(128_000, "RoCE class backlog that pauses the upstream queues")
    pfc_xon_bytes: int = _bytes(96_000, "RoCE class backlog below which they resume")
    pfc_headroom_bytes: int = _bytes(0, "RoCE buffer beyond XOFF (0: computed from the link "
                                        "rate, the reaction time and the feeding ports)")
    ecn_kmin_bytes: int = _bytes(32_000, "RED-like marking starts (docs/REFERENCE.md: Kmin)")
    ecn_kmax_bytes: int = _bytes(96_000, "every ECT packet is marked above (Kmax)")
    ecn_pmax: float = field(default=0.2, metadata={
        "min": 0.0, "max": 1.0, "doc": "marking probability at Kmax (Pmax)"})
    other_buffer_bytes: int = _bytes(96_000, "buffer of the lossy best-effort class and of "
                                             "CNPs' (credit: the CNP lane's, beyond headroom)")
    roce_dscp: int = field(default=26, metadata={"min": 0, "max": 63,
                                                 "doc": "DSCP of the lossless RoCE class"})
    cnp_dscp: int = field(default=48, metadata={"min": 0, "max": 63,
                                                "doc": "DSCP of CNPs (highest priority)"})
    adaptive_routing: bool = field(default=True, metadata={
        "doc": "new flows and flowlets take the least-loaded uplink (else: ECMP hash)"})
    # the sender marks a flowlet's start (a new UDP source port) after it was idle this long,
    # in modelled time: Open vSwitch learns a flow's idleness only in whole seconds
    flowlet_gap_us: float = field(default=16.0, metadata={
        "min": 0.0, "max": 32_000.0, "unit": "us (modelled)",
        "doc": "a QP idle this long starts a new flowlet - its RNIC draws a new UDP source "
               "port, which adaptive routing places on a least-loaded uplink (flowlet "
               "switching's inactivity interval: Juniper ALB's default 16 us, range "
               "16 us-32 ms); 0: a flow moves only after flowlet_gap_s"})
    # Open vSwitch knows a learned flowlet's last packet only from its revalidator's sweeps
    # (every 0.5 s, later on a loaded machine): a gap of a few sweeps, so that no running
    # flowlet looks idle and moves while its frames are still queued on the old path
    flowlet_gap_s: int = field(default=5, metadata={
        "min": 1, "max": 60, "unit": "s",
        "doc": "how long a leaf keeps a learned flowlet's uplink after its last packet "
               "(OpenFlow idle timeout, whole seconds of the machine's time; Open vSwitch "
               "sees a flow's idleness only every 0.5 s or later, so a shorter one may move "
               "a running flow and reorder it)"})
    forwarding: str = _forwarding("cut_through")
    switch_latency_ns: float = _pipeline_ns(130.0, "InfiniBand NDR: under 150 ns")


@dataclass(frozen=True)
class UltraEthernetParams:
    """UEC 1.0-class: ECMP on the entropy value, shallow lossy buffers that trim instead of
    dropping, ECN between 0.2 and 0.8 BDP for NSCC, a strict-priority class for trimmed
    headers, ACKs and NACKs."""

    buffer_bytes: int = _bytes(128_000, "UET data buffer per port: one bandwidth-delay "
                                        "product (100 Gbit/s x a 10 us base round trip; "
                                        "uet-htsim's queue with trimming)")
    trimming: bool = field(default=True, metadata={
        "doc": "a UET data packet that would overflow its queue is cut to its headers and "
               "forwarded in the header class (NDP, UE Spec 1.0); off: it is dropped"})
    ecn_kmin_bytes: int = _bytes(25_600, "marking starts (0.2 BDP)")
    ecn_kmax_bytes: int = _bytes(102_400, "every ECT packet is marked above (0.8 BDP)")
    data_dscp: int = field(default=26, metadata={"min": 0, "max": 63,
                                                 "doc": "DSCP of UET data (trimmable)"})
    header_dscp: int = field(default=46, metadata={
        "min": 0, "max": 63,
        "doc": "DSCP of trimmed packets, ACKs and NACKs (strict priority)"})
    header_buffer_bytes: int = _bytes(64_000, "buffer of the header class per port")
    other_buffer_bytes: int = _bytes(96_000, "buffer of everything else per port")
    forwarding: str = _forwarding("store_and_forward")
    switch_latency_ns: float = _pipeline_ns(250.0, "Ethernet: about 200-250 ns")


def params_class(policy: str):
    """The parameter class the policy ``policy`` declares (``Policy.parameters``)."""
    from .policy import policy_class, policy_names  # the registry imports this module
    try:
        return policy_class(policy).parameters
    except KeyError:
        raise ConfigError(f"policy_params: unknown policy {policy!r} "
                          f"(known: {', '.join(policy_names())})")


def resolve(policy: str, overrides: Mapping[str, Any], modelled_gbit: float, mtu: int):
    """The policy's parameters for a fabric modelling ``modelled_gbit`` links: scaled
    defaults, then the overrides."""
    cls = params_class(policy)
    given = build(cls, overrides or {}, f"policy_params.{policy}")
    frame = link_mtu(mtu)  # the largest packet on a link
    values: Dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        value = getattr(given, f.name)
        if f.name not in (overrides or {}) and f.metadata.get("scaled") and value:
            value = max(2 * frame, int(round(value * modelled_gbit / REFERENCE_MODELLED_GBIT)))
        values[f.name] = value
    return cls(**values)


def to_dict(params) -> dict:
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
