"""Scenario configuration: typed, validated, with declared defaults and units.

A scenario is a tree of frozen dataclasses. ``Scenario.from_dict`` validates a plain mapping
(from YAML or the CLI) in one pass: unknown keys and bad values raise one ``ConfigError`` that
names the path (``topology.leaves: must be >= 1, got 0``); nothing is started before that.

Scaled time (docs/DESIGN.md): userspace Open vSwitch forwards tens of thousands of packets per
second on a small machine, so links run at tens of Mbit/s. Buffers and thresholds are in bytes
at that rate; ``Scenario.time_scale`` states how much slower than the modelled fabric the
emulation runs.

Why one module over 400 lines: it is the whole scenario schema - every key with its default,
bounds, unit and help text in one tree, from which docs/scenario-reference.md is generated.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Tuple, Union

from controllers.params import LosslessParams
from controllers.policy import policy_names
from traffic import collectives

from ..job.model import PRESETS as _MODEL_PRESETS

from ..base.errors import ConfigError
from ..base.hops import MECHANISMS as PATH_DELAY_MECHANISMS
from ..base.topology import LAYOUTS, FabricPlan
from ..job.plan import check_fits
from ..base.schema import build, plain
from .timescale import AUTO, MAX_ATTEMPTS, REFERENCE_RATE_MBIT, require_rate

MODEL_PRESETS = tuple(_MODEL_PRESETS)


SAMPLING_MODELLED_US = 0.4  # the switches' reaction time in the modelled fabric
SAMPLING_FLOOR_US = 200  # the switch-queue emulator cannot sample faster (emulated us)


@dataclass(frozen=True)
class LossyLink:
    link: str = field(default="", metadata={
        "empty": True, "doc": "the link's two nodes, like lf1-sp1 or gpu3-lf2 (either order)"})
    drop_rate: float = field(default=0.0, metadata={
        "min": 0.0, "max": 0.5, "doc": "share of the IPv4 packets each end sends that the "
                                      "link loses, drawn per packet"})


@dataclass(frozen=True)
class TopologyConfig:
    spines: int = field(default=2, metadata={"min": 1, "max": 255, "doc": "spine switches"})
    leaves: int = field(default=4, metadata={"min": 1, "max": 255, "doc": "leaf switches"})
    gpus_per_leaf: int = field(default=2, metadata={"min": 1, "max": 254,
                                                    "doc": "GPU hosts under each leaf"})
    gpus_per_server: int = field(default=1, metadata={
        "min": 1, "max": 64,
        "doc": "GPUs per server: its scale-up domain (NVLink-class), where transfers between "
               "its GPUs go instead of the Ethernet fabric; ranks S*k..S*k+S-1 are server k"})
    layout: str = field(default="leaf-per-server", metadata={
        "choices": LAYOUTS,
        "doc": "leaf-per-server: a server's GPUs under one leaf; rail-optimized: GPU j of "
               "every server on leaf j of its rail group (DGX SuperPOD, Alibaba HPN), a group "
               "being gpus_per_server leaves holding gpus_per_leaf servers"})
    scale_up_gbyte_s: float = field(default=400.0, metadata={
        "min": 0.1, "max": 100_000.0, "unit": "GB/s (modelled)",
        "doc": "each GPU's scale-up bandwidth per direction (ASTRA-sim's validated HGX-H100: "
               "400 GB/s); emulated like compute, divided by the time scale"})
    scale_up_latency_ns: float = field(default=936.0, metadata={
        "min": 0.0, "max": 1_000_000_000.0, "unit": "ns (modelled)",
        "doc": "a scale-up transfer's latency (ASTRA-sim's validated HGX-H100: 936 ns)"})
    host_rate_mbit: Union[float, str] = field(default=AUTO, metadata={
        "auto": True, "min": 0.1, "max": 1000.0, "unit": "Mbit/s",
        "doc": "GPU NIC and leaf downlink rate; auto: the fastest rate this machine holds "
               "faithfully, from its calibration (python -m testbed calibrate)"})
    fabric_rate_mbit: Union[float, str] = field(default=AUTO, metadata={
        "auto": True, "min": 0.1, "max": 1000.0, "unit": "Mbit/s",
        "doc": "leaf-spine link rate; auto: from oversubscription, else the host rate"})
    nic_queue_bytes: int = field(default=256_000, metadata={
        "min": 3000, "max": 64_000_000, "unit": "B", "doc": "GPU NIC transmit queue"})
    oversubscription: float = field(default=0.0, metadata={
        "min": 0.0, "max": 64.0,
        "doc": "leaf uplink oversubscription (1 = full bisection, 2 = 2:1); sets "
               "fabric_rate_mbit = host rate x GPUs per leaf / (spines x this); 0 = off"})
    neighbours_per_leaf: int = field(default=0, metadata={
        "min": 0, "max": 253, "doc": "non-GPU hosts under each leaf: a noisy-neighbour tenant "
                                      "(see background)"})
    link_delay_us: float = field(default=0.0, metadata={
        "min": 0.0, "max": 1_000_000.0, "unit": "us",
        "doc": "extra one-way delay per link in emulated time, on top of the modelled cable "
               "and switch latency (applied as emulation.path_delay says)"})
    cable_m: float = field(default=10.0, metadata={
        "min": 0.0, "max": 100_000.0, "unit": "m",
        "doc": "cable length per link in the modelled fabric: 5 ns/m of propagation, emulated "
               "as that times the time scale (applied as emulation.path_delay says)"})
    modelled_rate_gbit: float = field(default=100.0, metadata={
        "min": 1.0, "max": 1600.0, "unit": "Gbit/s",
        "doc": "link rate of the real fabric being modelled (sets the time scale)"})
    lossy_links: Tuple[LossyLink, ...] = field(default=(), metadata={
        "item": LossyLink,
        "doc": "links that lose packets at random in both directions (a bad cable or optic), "
               "after the sender's queue; each is {link: its two nodes like lf1-sp1 or "
               "gpu3-lf2, drop_rate: 0..0.5 of the IPv4 packets}; counted apart from buffer "
               "drops as link_losses (one server only)"})

    def __post_init__(self):
        if self.host_rate_mbit != AUTO and self.fabric_rate_mbit == AUTO:
            object.__setattr__(self, "fabric_rate_mbit", self.uplink_rate_mbit())

    @property
    def gpus(self) -> int:
        return self.leaves * self.gpus_per_leaf

    def uplink_rate_mbit(self) -> float:
        """The leaf-spine rate the host rate implies: by ``oversubscription``, else equal."""
        host = require_rate(self.host_rate_mbit)
        if not self.oversubscription:
            return host
        return host * self.gpus_per_leaf / (self.spines * self.oversubscription)


# a scenario's collective runs on every GPU: point to point is for jobs' pipeline stages
ALGORITHM_NAMES = tuple(n for n in collectives.ALGORITHMS if n != "send_recv")
COLLECTIVE_NAMES = ALGORITHM_NAMES + tuple(collectives.ALIASES)


@dataclass(frozen=True)
class StragglerConfig:
    ranks: Tuple[int, ...] = field(default=(), metadata={
        "item": int, "doc": "ranks (0-based) whose compute phase runs late"})
    delay_us: float = field(default=2.0, metadata={
        "min": 0.0, "max": 600_000_000.0, "unit": "us (modelled)",
        "doc": "how late: the delay itself (fixed), or the mean of the distribution"})
    distribution: str = field(default="fixed", metadata={
        "choices": ("fixed", "uniform", "exponential"),
        "doc": "fixed: delay_us every time; uniform: 0..2 x delay_us; exponential: mean delay_us"})
    probability: float = field(default=1.0, metadata={
        "min": 0.0, "max": 1.0, "doc": "chance that a straggler rank is late in an iteration"})


@dataclass(frozen=True)
class JobConfig:
    model: str = field(default="", metadata={
        "empty": True, "choices": ("",) + MODEL_PRESETS + ("custom",),
        "doc": "a training job instead of the collective: a preset (dense-7b, dense-70b: "
               "Llama-2-class; moe-8x2: 8 experts, top 2), or custom (give every shape key); "
               "empty: no job"})
    layers: int = field(default=0, metadata={"min": 0, "max": 1000,
                                             "doc": "transformer layers (0: the preset's)"})
    hidden: int = field(default=0, metadata={"min": 0, "max": 1 << 17,
                                             "doc": "hidden size (0: the preset's)"})
    heads: int = field(default=0, metadata={"min": 0, "max": 1024,
                                            "doc": "attention heads (0: the preset's)"})
    seq_len: int = field(default=0, metadata={"min": 0, "max": 1 << 20,
                                              "doc": "sequence length (0: the preset's)"})
    vocab: int = field(default=-1, metadata={"min": -1, "max": 1 << 22,
                                             "doc": "vocabulary (-1: the preset's)"})
    experts: int = field(default=-1, metadata={
        "min": -1, "max": 1024, "doc": "MoE experts per layer (0: dense; -1: the preset's)"})
    top_k: int = field(default=0, metadata={"min": 0, "max": 64,
                                            "doc": "experts per token (0: the preset's)"})
    dp: int = field(default=0, metadata={
        "min": 0, "max": 1 << 20, "doc": "data-parallel ranks (0: the GPUs / (tp x pp))"})
    tp: int = field(default=1, metadata={
        "min": 1, "max": 64, "doc": "tensor-parallel ranks: consecutive ranks, a server's GPUs"})
    pp: int = field(default=1, metadata={"min": 1, "max": 1024, "doc": "pipeline stages (1F1B)"})
    ep: int = field(default=1, metadata={
        "min": 1, "max": 1024, "doc": "expert-parallel ranks, out of the data-parallel ones"})
    micro_batches: int = field(default=1, metadata={
        "min": 1, "max": 4096, "doc": "micro-batches per iteration (gradient accumulation)"})
    micro_batch_size: int = field(default=1, metadata={
        "min": 1, "max": 4096, "doc": "sequences per micro-batch"})
    bucket_mb: float = field(default=25.0, metadata={
        "min": 0.001, "max": 100_000.0, "unit": "MiB",
        "doc": "gradient bucket size of the data-parallel all-reduce (PyTorch DDP's 25 MiB)"})
    bytes_per_element: int = field(default=2, metadata={
        "choices": (1, 2, 4), "unit": "B", "doc": "2: BF16/FP16; 4: FP32; 1: FP8"})
    dp_collective: str = field(default="ring", metadata={
        "choices": ("ring", "double_binary_tree", "halving_doubling", "hierarchical"),
        "doc": "the data-parallel all-reduce (hierarchical: over the scale-up domain first)"})
    gpu_tflops: float = field(default=989.0, metadata={
        "min": 0.001, "max": 1e6, "unit": "TFLOP/s",
        "doc": "peak dense TFLOP/s at the training precision (H100 SXM BF16: 989)"})
    gpu_efficiency: float = field(default=0.4, metadata={
        "min": 0.001, "max": 1.0, "doc": "share of the peak a step achieves (MFU)"})
    byte_scale: Union[float, str] = field(default=AUTO, metadata={
        "auto": True, "min": 1.0, "max": 1e12,
        "doc": "every message and compute span divided by this, so the iteration fits the "
               "emulation (auto: an iteration of about iteration_s emulated)"})
    iteration_s: float = field(default=1.0, metadata={
        "min": 0.01, "max": 3600.0, "unit": "s (emulated)",
        "doc": "byte_scale auto: the emulated time one iteration should take"})
    file: str = field(default="", metadata={
        "empty": True,
        "doc": "a job from a file instead of a model: a Chakra trace (the prefix of "
               "<prefix>.<rank>.et), a SimAI/AICB workload, or the project's own graph "
               "(.yaml, .json; docs/guide.md); relative to the scenario file's folder (to "
               "the current directory in a scenario given as a mapping)"})
    format: str = field(default="auto", metadata={
        "choices": ("auto", "chakra", "aicb", "graph"),
        "doc": "the file's format (auto: .yaml/.json are graphs, a file starting "
               "HYBRID_TRANSFORMER_FWD_IN_BCKWD is AICB, else a Chakra prefix)"})
    comm_groups: str = field(default="", metadata={
        "empty": True, "doc": "Chakra: the communicator groups JSON ({name: [ranks]})"})
    ranks: Tuple[int, ...] = field(default=(), metadata={
        "item": int, "doc": "the GPUs (the fabric's ranks) the job runs on, in its rank "
                            "order; empty: every GPU, or with several jobs the next free ones"})

    @property
    def enabled(self) -> bool:
        return bool(self.model or self.file)


@dataclass(frozen=True)
class WorkloadConfig:
    collective: str = field(default="ring", metadata={
        "choices": COLLECTIVE_NAMES,
        "doc": "ring, halving_doubling (power-of-two GPUs), double_binary_tree, hierarchical "
               "(rail-aligned), all_to_all (MoE), all_gather, reduce_scatter; ring_allreduce "
               "is ring's old name"})
    size_bytes: int = field(default=1 << 20, metadata={
        "min": 1, "max": 1 << 30, "unit": "B", "doc": "buffer size per GPU"})
    sizes: Tuple[int, ...] = field(default=(), metadata={
        "item": int, "unit": "B",
        "doc": "message-size sweep (like nccl-tests): run the iterations at each size in turn; "
               "replaces size_bytes"})
    iterations: int = field(default=10, metadata={
        "min": 1, "max": 100_000, "doc": "training iterations (at each size of a sweep)"})
    chunks: int = field(default=4, metadata={
        "min": 1, "max": 64,
        "doc": "pipelining: each ring block / tree half is sent in this many pieces"})
    pxn: bool = field(default=False, metadata={
        "doc": "all-to-alls (the collective, and a job's expert parallelism) over PXN, as NCCL "
               "2.12+ does: a block for a GPU on another server and another rail first goes "
               "over the scale-up domain to the GPU of the sender's server on that rail, whose "
               "NIC sends it along the rail; needs topology.gpus_per_server > 1"})
    mtu: int = field(default=4096, metadata={
        "choices": (256, 512, 1024, 2048, 4096), "unit": "B", "doc": "RoCE path MTU"})
    compute_us: float = field(default=0.0, metadata={
        "min": 0.0, "max": 600_000_000.0, "unit": "us (modelled)",
        "doc": "compute phase before each collective"})
    compute_jitter_us: float = field(default=0.0, metadata={
        "min": 0.0, "max": 600_000_000.0, "unit": "us (modelled)",
        "doc": "each rank's compute phase varies uniformly by up to this much either way"})
    stragglers: StragglerConfig = field(default_factory=StragglerConfig)
    seed: int = field(default=1, metadata={"min": 0, "max": 2**31,
                                           "doc": "seed of the jitter and straggler draws"})
    job: JobConfig = field(default_factory=JobConfig)
    jobs: Tuple[JobConfig, ...] = field(default=(), metadata={
        "item": JobConfig,
        "doc": "several jobs on one fabric, each on its own GPUs and with the keys of "
               "workload.job (the first one's byte_scale and iteration_s hold for all; a "
               "GPU no job uses stays idle); replaces job"})
    extrapolate_gpus: int = field(default=10_000, metadata={
        "min": 2, "max": 10_000_000,
        "doc": "cluster size for the 'same tail on N GPUs' GPU-seconds extrapolation"})

    @property
    def run_sizes(self) -> Tuple[int, ...]:
        return self.sizes or (self.size_bytes,)

    @property
    def all_jobs(self) -> Tuple[JobConfig, ...]:
        """The jobs the GPUs replay instead of the collective (none: the collective)."""
        return (self.job,) if self.job.enabled else self.jobs


@dataclass(frozen=True)
class TransportConfig:
    congestion_control: str = field(default="auto", metadata={
        "choices": ("auto", "dcqcn", "none"),
        "doc": "sender rate control; auto: the policy's default (lossless and hyperscale "
               "with ECN: dcqcn; enterprise and bare hyperscale: none)"})
    retransmission: str = field(default="go-back-n", metadata={
        "choices": ("go-back-n", "go-back-0"),
        "doc": "go-back-n: resend from the lost packet (RoCE NICs today); go-back-0: a "
               "strawman that restarts the whole message, which livelocks under loss "
               "(SIGCOMM 2016); needs entropy per-qp"})
    qps_per_peer: int = field(default=1, metadata={
        "min": 1, "max": 64, "doc": "queue pairs per peer; a message is split over them"})
    entropy: str = field(default="per-qp", metadata={
        "choices": ("per-qp", "per-packet"),
        "doc": "UDP source port: derived from the QP, or a new one per packet (spraying)"})
    ack_every: int = field(default=16, metadata={
        "min": 1, "max": 4096, "unit": "packets", "doc": "responder ACK coalescing"})
    rto_us: Union[float, str] = field(default=AUTO, metadata={
        "auto": True, "min": 0.001, "max": 600_000_000.0, "unit": "us (modelled)",
        "doc": "the first retransmission timeout, doubling per retry up to the local ACK "
               "timeout (adaptive retransmission); auto: the policy's - lossless 1,000 us, "
               "longer than PFC's pauses and a slowed QP's coalesced ACKs take; 100 us "
               "elsewhere - and at least twice the time the RoCE class's buffer takes to "
               "drain at the slowest link"})
    ib_timeout: int = field(default=20, metadata={
        "min": 1, "max": 31,
        "doc": "the QPs' local ACK timeout exponent: 4.096 us x 2^ib_timeout, modelled "
               "(NCCL_IB_TIMEOUT: 20 since NCCL 2.23, 4.29 s; 18 in 2.14-2.22; 14 before)"})
    retry_limit: int = field(default=7, metadata={
        "min": 1, "max": 7,
        "doc": "local ACK timeouts without progress before a QP goes to error and the job "
               "fails (NCCL_IB_RETRY_CNT; the QP's 3-bit retry_cnt)"})
    dcqcn_timer_us: float = field(default=8.0, metadata={
        "min": 0.001, "max": 60_000_000.0, "unit": "us (modelled)",
        "doc": "DCQCN alpha-update and rate-increase timers (paper: 55 us, about ten base "
               "RTTs of its fabric)"})
    dcqcn_byte_counter: int = field(default=256_000, metadata={
        "min": 1000, "max": 1 << 30, "unit": "B",
        "doc": "DCQCN rate-increase byte counter (paper: 10 MB, scaled like the ECN "
               "thresholds)"})
    dcqcn_clamp_target: bool = field(default=False, metadata={
        "doc": "every CNP also lowers the rate a QP recovers to (the paper's rule); false: only "
               "after a timer increase since the previous cut, as ConnectX does by default "
               "(clamp_tgt_rate 0)"})
    cnp_interval_us: float = field(default=8.0, metadata={
        "min": 0.001, "max": 60_000_000.0, "unit": "us (modelled)",
        "doc": "a receiver sends at most one CNP per QP per interval (ConnectX: ~50 us)"})


@dataclass(frozen=True)
class NoisyNeighbourConfig:
    rate_gbit: float = field(default=0.0, metadata={
        "min": 0.0, "max": 1600.0, "unit": "Gbit/s (modelled)",
        "doc": "per neighbour host; 0 = off. Each neighbour host sends to one on the next leaf"})
    tool: str = field(default="flows", metadata={
        "choices": ("flows", "iperf3"), "doc": "the agents' own UDP flows, or iperf3 -u"})
    packet_bytes: int = field(default=1400, metadata={
        "min": 64, "max": 8900, "unit": "B", "doc": "UDP payload per packet"})
    dscp: int = field(default=0, metadata={"min": 0, "max": 63, "doc": "DSCP of its packets"})


@dataclass(frozen=True)
class IncastConfig:
    period_us: float = field(default=0.0, metadata={
        "min": 0.0, "max": 600_000_000.0, "unit": "us (modelled)",
        "doc": "time between synchronised bursts; 0 = off"})
    burst_bytes: int = field(default=64_000, metadata={
        "min": 1000, "max": 64_000_000, "unit": "B", "doc": "what each sender sends per burst"})
    senders: Tuple[str, ...] = field(default=(), metadata={
        "item": str, "doc": "hosts that burst (default: the neighbour hosts, else the GPUs "
                            "on other leaves than the target)"})
    target: str = field(default="", metadata={
        "empty": True, "doc": "host that receives (default: the last GPU)"})


@dataclass(frozen=True)
class BackgroundConfig:
    """Other traffic on the same fabric, only between the emulated hosts, only while the
    collectives run (and never longer than ``max_s``)."""

    noisy_neighbour: NoisyNeighbourConfig = field(default_factory=NoisyNeighbourConfig)
    incast: IncastConfig = field(default_factory=IncastConfig)
    start_us: float = field(default=0.0, metadata={
        "min": 0.0, "max": 3_600_000_000.0, "unit": "us (modelled)",
        "doc": "after the collectives start"})
    max_s: float = field(default=600.0, metadata={
        "min": 0.1, "max": 86_400.0, "unit": "s",
        "doc": "hard bound on background traffic (the machine's own time)"})

    @property
    def enabled(self) -> bool:
        return self.noisy_neighbour.rate_gbit > 0 or self.incast.period_us > 0


@dataclass(frozen=True)
class FidelityConfig:
    """Tolerances of the fidelity monitor (Mininet-HiFi: trust a result only where the
    emulator kept its timing invariants)."""

    inter_dequeue_tolerance: float = field(default=0.1, metadata={
        "min": 0.0, "max": 10.0,
        "doc": "a busy NIC's gap between frames may differ from the frame's serialization time "
               "by this fraction of one MTU frame's serialization time"})
    inter_dequeue_within: float = field(default=0.9, metadata={
        "min": 0.0, "max": 1.0, "doc": "... for at least this share of the gaps"})
    overhead_share: float = field(default=0.25, metadata={
        "min": 0.0, "max": 10.0,
        "doc": "idle-path latency overhead and agent timer lag may each be at most this share "
               "of one MTU frame's serialization time at the host rate"})
    cpu_busy_max: float = field(default=0.9, metadata={
        "min": 0.1, "max": 1.0, "doc": "the machine's CPUs may be at most this busy (p90)"})


@dataclass(frozen=True)
class EmulationConfig:
    sample_interval_us: Union[float, str] = field(default=AUTO, metadata={
        "auto": True, "min": SAMPLING_FLOOR_US, "max": 100_000, "unit": "us (emulated)",
        "doc": "how often the switch-queue emulator samples every egress queue: the emulated "
               "switches' reaction time for ECN marking, PFC and adaptive routing; auto: "
               f"{SAMPLING_MODELLED_US:g} us of modelled time (1 ms at 40 Mbit/s), at least "
               f"{SAMPLING_FLOOR_US} us (the emulator's floor)"})
    switch_rate_headroom: float = field(default=0.02, metadata={
        "min": 0.0, "max": 0.2,
        "doc": "switch ports send this much faster than their nominal rate, so that the "
               "emulator's bursty forwarding does not pile up as queueing on busy equal-rate "
               "links (measured: 2% halved the largest backlogs of a ring); 0 disables"})
    switch_latency: bool = field(default=True, metadata={
        "doc": "delay every switch egress by the policy's per-hop latency (pipeline, plus one "
               "serialization when store-and-forward) and every link by its cable, scaled by "
               "the time scale (applied as emulation.path_delay says)"})
    path_delay: str = field(default="auto", metadata={
        "choices": PATH_DELAY_MECHANISMS,
        "doc": "what applies the modelled fixed path delay (switch latency, cables, and each "
               "frame's own transmission): netem = a netem qdisc on every switch port (the "
               "receiving RNIC adds the sender's link and the transmission); nic = the "
               "receiving RNIC holds each frame for its whole path's delay; off = none; "
               "auto = netem where the kernel has it, else nic"})
    agent_processes: int = field(default=0, metadata={
        "min": 0, "max": 1024,
        "doc": "processes the GPU agents run in per server, each one event loop serving "
               "several GPU hosts; 0 = as few as the GPUs' line rate needs (one per 400 Mbit/s "
               "of GPU NICs, at most one per CPU)"})
    keep_cpus_awake: bool = field(default=True, metadata={
        "doc": "while the run lasts, hold a PM QoS request of 0 us (/dev/cpu_dma_latency) so "
               "idle CPUs wake for timers and packets at once instead of from deep idle "
               "(testbed.run.wakeup); costs power, not CPU time; recorded in results"})
    attempts: Union[int, str] = field(default=AUTO, metadata={
        "auto": True, "kind": int, "min": 1, "max": 5,
        "doc": "runs of every policy at most: while the fidelity monitor rejects some, the "
               "run goes again at the slower rate the rejections ask for (fabric links "
               "slowed alike), the rejected attempt kept in rejected/; auto: "
               f"{MAX_ATTEMPTS} when host_rate_mbit is auto, 1 (the rate as given) otherwise"})
    ecn_marking: str = field(default="auto", metadata={
        "choices": ("auto", "red", "sampled"),
        "doc": "how switches set CE: red = the kernel's RED qdisc marks per packet; sampled = "
               "the switch-queue emulator samples backlogs and toggles marking; auto = red "
               "where the kernel has it, else sampled"})


ALL_POLICIES = tuple(policy_names())  # the policy registry, in name order


@dataclass(frozen=True)
class VariantConfig:
    """A policy run under a label of its own, with its own parameters, beside other runs of
    the same policy (e.g. lossless with credits beside lossless with PFC): the label goes into
    policies and names its results."""

    policy: str = field(default="lossless", metadata={
        "choices": ALL_POLICIES, "doc": "the policy it runs"})
    congestion_control: str = field(default="auto", metadata={
        "choices": ("auto", "dcqcn", "none"),
        "doc": "transport.congestion_control for this run; auto: the scenario's"})
    # checked against the policy's own parameters (``_variants``)
    policy_params: Dict[str, Any] = field(default_factory=dict, metadata={
        "doc": "parameters that replace the policy's for this run, over policy_params"})


@dataclass(frozen=True)
class MeasurementConfig:
    """What is recorded besides the agents' records (kernel timestamps of every packet)."""

    pcap: bool = field(default=False, metadata={
        "doc": "capture every GPU NIC's RoCE traffic with tcpdump into pcap/<policy>/"})
    pcap_snaplen: int = field(default=128, metadata={
        "min": 64, "max": 65535, "unit": "B", "doc": "bytes kept of each captured frame"})
    pcap_hosts: Tuple[str, ...] = field(default=(), metadata={
        "item": str, "doc": "hosts to capture on (default: every GPU)"})


@dataclass(frozen=True)
class RxeConfig:
    """Real RoCE verbs traffic (``run --traffic rxe``): soft-RoCE (rdma_rxe) endpoints on the
    neighbour hosts of the first and last leaf run perftest across the fabric after the
    collective, under the same policy (testbed.fabric.rxe)."""

    enabled: bool = field(default=False, metadata={
        "doc": "run ib_write_lat and ib_write_bw over rdma_rxe (needs the rdma_rxe module and "
               "perftest: the Vagrant VM has both); adds a neighbour host per leaf if none"})
    size_bytes: int = field(default=4096, metadata={
        "min": 2, "max": 1 << 20, "unit": "B", "doc": "message size of both tests"})
    lat_iterations: int = field(default=200, metadata={
        "min": 5, "max": 1_000_000, "doc": "ib_write_lat exchanges"})
    bw_iterations: int = field(default=200, metadata={
        "min": 5, "max": 1_000_000, "doc": "ib_write_bw messages"})
    timeout_s: int = field(default=300, metadata={
        "min": 10, "max": 36_000, "unit": "s", "doc": "limit for each test"})


@dataclass(frozen=True)
class ClusterConfig:
    """Splitting the fabric over several machines (Mininet Cluster Edition)."""

    servers: Tuple[str, ...] = field(default=(), metadata={
        "item": str, "doc": "machines that hold the fabric, this one first (e.g. [localhost, "
                            "10.9.0.2]); empty: this machine alone"})
    placement: str = field(default="by-leaf", metadata={
        "choices": ("by-leaf", "spread"),
        "doc": "by-leaf: each leaf with its hosts on one server, spines where the cross-server "
               "links are fewest; spread: leaves and spines round-robin"})
    link: str = field(default="auto", metadata={
        "choices": ("auto", "vxlan", "ssh"),
        "doc": "cross-server links: vxlan, or ssh tap tunnels (sshd needs PermitTunnel yes); "
               "auto: vxlan where the kernel has it"})
    ssh_user: str = field(default="root", metadata={"doc": "user for ssh to the servers"})


@dataclass(frozen=True)
class Scenario:
    name: str = field(default="default", metadata={"doc": "a label for the run"})
    policies: Tuple[str, ...] = field(default=ALL_POLICIES, metadata={
        "doc": "policies to compare, each on a fresh fabric: enterprise, hyperscale, lossless"})
    repeat: int = field(default=1, metadata={
        "min": 1, "max": 100,
        "doc": "runs of each policy, each on a fresh fabric, in rounds over the policies: the "
               "table shows the headline figures' median [min-max], results.json keeps every "
               "run (spread, repeats)"})
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    emulation: EmulationConfig = field(default_factory=EmulationConfig)
    background: BackgroundConfig = field(default_factory=BackgroundConfig)
    measurement: MeasurementConfig = field(default_factory=MeasurementConfig)
    fidelity: FidelityConfig = field(default_factory=FidelityConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    rxe: RxeConfig = field(default_factory=RxeConfig)
    policy_params: Dict[str, Dict[str, Any]] = field(default_factory=dict, metadata={
        "doc": "per policy, parameters that replace its defaults (see the policy reference)"})
    variants: Dict[str, VariantConfig] = field(default_factory=dict, metadata={
        "doc": "labelled runs of a policy with parameters of their own (label: {policy, "
               "congestion_control, policy_params}); run a label by naming it in policies"})

    @property
    def time_scale(self) -> float:
        """How many times slower than the modelled fabric the emulated links run."""
        return self.topology.modelled_rate_gbit * 1000 / require_rate(self.topology.host_rate_mbit)

    @property
    def slowest_link_gbit(self) -> float:
        """The slower of the GPU NICs' and the fabric's links, at the modelled fabric's rate."""
        t = self.topology
        return min(t.host_rate_mbit, t.fabric_rate_mbit) * self.time_scale / 1000

    def emulated_ns(self, modelled_us: float) -> int:
        """A modelled-time constant as the emulation runs it, in ns."""
        return int(round(modelled_us * 1000 * self.time_scale))

    def emulated_mbit(self, modelled_gbit: float) -> float:
        """A modelled-fabric rate as the emulation runs it, in Mbit/s."""
        return modelled_gbit * 1000 / self.time_scale

    @property
    def sample_interval_us(self) -> float:
        """How often the switch-queue emulator samples (emulated us): ``auto`` scales the
        modelled reaction time, down to the emulator's floor."""
        given = self.emulation.sample_interval_us
        if given != AUTO:
            return float(given)
        return max(float(SAMPLING_FLOOR_US), round(SAMPLING_MODELLED_US * self.time_scale, 1))

    def unscaled_constants(self) -> List[str]:
        """The time constants the run cannot scale to the modelled fabric, and what they are
        in modelled time here."""
        out = []
        wanted = SAMPLING_MODELLED_US * self.time_scale
        if self.emulation.sample_interval_us == AUTO and wanted < SAMPLING_FLOOR_US:
            out.append(f"the switch-queue emulator samples every {SAMPLING_FLOOR_US} us (its "
                       f"floor), {SAMPLING_FLOOR_US / self.time_scale:.3g} us modelled instead "
                       f"of {SAMPLING_MODELLED_US:g}: ECN, PFC and adaptive routing react that "
                       "much later than the modelled switches")
        lossless = self.policy_params.get("lossless", {})
        if "lossless" in self.base_policies and not lossless.get(
                "flowlet_gap_us", LosslessParams.flowlet_gap_us):
            gap = lossless.get("flowlet_gap_s", LosslessParams.flowlet_gap_s)
            out.append(f"lossless: the flowlet gap is an OpenFlow idle timeout of {gap:g} s "
                       f"of the machine's time, {gap * 1e6 / self.time_scale:,.0f} us "
                       "modelled: adaptive routing moves a flow only after that long idle")
        return out

    def for_checks(self) -> "Scenario":
        """This scenario, or while its rate is still ``auto`` a copy at the rate the byte
        defaults are stated for: what is valid does not depend on the rate chosen later."""
        if self.topology.host_rate_mbit != AUTO:
            return self
        return self.with_host_rate(REFERENCE_RATE_MBIT)

    def with_host_rate(self, host_rate_mbit: float) -> "Scenario":
        """A copy whose GPU NICs run at ``host_rate_mbit`` (the fabric rate derived again)."""
        t = dataclasses.replace(self.topology, host_rate_mbit=float(host_rate_mbit))
        return _derive(dataclasses.replace(self, topology=t), {})

    def slowed_to(self, host_rate_mbit: float) -> "Scenario":
        """A copy whose GPU NICs run at ``host_rate_mbit`` and whose fabric links slow alike:
        the same modelled fabric at a larger time scale (a rejected run goes again so)."""
        t = self.topology
        factor = host_rate_mbit / require_rate(t.host_rate_mbit)
        t = dataclasses.replace(t, host_rate_mbit=float(host_rate_mbit),
                                fabric_rate_mbit=require_rate(t.fabric_rate_mbit) * factor)
        return dataclasses.replace(self, topology=t)

    @property
    def base_policies(self) -> Tuple[str, ...]:
        """The policies the runs use (a variant's own policy for its label), each once."""
        return tuple(dict.fromkeys(self.policy_run(label)[0] for label in self.policies))

    def policy_run(self, label: str) -> Tuple[str, "Scenario"]:
        """The policy a label of ``policies`` runs and the scenario it runs with: for a
        variant its parameters over ``policy_params`` and its congestion control."""
        v = self.variants.get(label)
        if v is None:
            return label, self
        params = dict(self.policy_params)
        params[v.policy] = {**params.get(v.policy, {}), **v.policy_params}
        transport = self.transport
        if v.congestion_control != AUTO:
            transport = dataclasses.replace(transport, congestion_control=v.congestion_control)
        return v.policy, dataclasses.replace(self, policy_params=params, transport=transport)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Scenario":
        _no_renamed_keys(data)
        loose = {}  # mappings whose keys are names: checked by their own rules
        if isinstance(data, Mapping):
            data = dict(data)
            loose = {k: data.pop(k) for k in ("policy_params", "variants") if k in data}
        scenario = _derive(build(cls, data), data)
        if "policy_params" in loose:
            scenario = dataclasses.replace(scenario,
                                           policy_params=_policy_params(loose["policy_params"]))
        if "variants" in loose:
            scenario = dataclasses.replace(scenario, variants=_variants(loose["variants"]))
        return scenario

    def to_dict(self) -> dict:
        return plain(self)

    def with_policies(self, policies) -> "Scenario":
        """A copy running ``policies``; parameters and variants no longer run are dropped."""
        policies = tuple(policies)
        variants = {k: v for k, v in self.variants.items() if k in policies}
        kept = dataclasses.replace(self, policies=policies, variants=variants)
        params = {k: v for k, v in self.policy_params.items() if k in kept.base_policies}
        return dataclasses.replace(kept, policy_params=params)

    def override(self, changes: Mapping[str, Any]) -> "Scenario":
        """A copy with ``changes`` (a partial scenario mapping) applied and validated."""
        return Scenario.from_dict(_merge(self.to_dict(), changes))


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``64K`` -> 65536 (K, M, G are powers of 1024, as in nccl-tests)."""
    t = text.strip().upper()
    unit = t[-1] if t and t[-1] in "KMGB" else ""
    number = t[:-1] if unit else t
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        raise ConfigError(f"--sizes: {text!r} is not a size (like 64K, 1M or 4096)")
    if value < 1 or value != int(value):
        raise ConfigError(f"--sizes: {text!r} is not a whole number of bytes")
    return int(value)


def parse_sizes(text: str) -> Tuple[int, ...]:
    """``64K:4M`` -> 64K, 128K, ..., 4M (doubling, like nccl-tests -b 64K -e 4M -f 2);
    ``64K,1M`` -> exactly those."""
    if ":" in text:
        lo_text, _, hi_text = text.partition(":")
        lo, hi = parse_size(lo_text), parse_size(hi_text)
        if hi < lo:
            raise ConfigError(f"--sizes: {text!r} ends below where it starts")
        sizes = [lo]
        while sizes[-1] * 2 <= hi:
            sizes.append(sizes[-1] * 2)
        return tuple(sizes)
    sizes = tuple(parse_size(p) for p in text.split(",") if p.strip())
    if not sizes:
        raise ConfigError("--sizes: give sizes like 64K:4M or 64K,1M")
    return sizes


def load_file(path: str) -> Scenario:
    """A scenario from a YAML file (safe loading: plain data only), validated."""
    import yaml

    try:
        with open(path, "rb") as f:  # bytes: PyYAML decodes them and reports bad encodings
            data = yaml.safe_load(f.read())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it: {e.strerror}")
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}")
    if data is None:
        data = {}
    try:
        return Scenario.from_dict(_job_files_beside(data, os.path.dirname(path)))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}")


def _job_files_beside(data: Any, folder: str) -> Any:
    """``data`` with its jobs' relative file paths made relative to ``folder`` (the scenario
    file's), so a scenario and its job files move together."""
    workload = data.get("workload") if isinstance(data, dict) else None
    if not isinstance(workload, dict):
        return data

    def placed(job):
        if isinstance(job, dict) and isinstance(job.get("file"), str) and job["file"] \
                and not os.path.isabs(job["file"]):
            return dict(job, file=os.path.join(folder, job["file"]))
        return job

    workload = dict(workload)
    if "job" in workload:
        workload["job"] = placed(workload["job"])
    if isinstance(workload.get("jobs"), list):
        workload["jobs"] = [placed(j) for j in workload["jobs"]]
    return dict(data, workload=workload)


# Keys that were emulated time or rate and are now the modelled fabric's: (section path, old
# key) -> (new key, what the default old value becomes at the reference 2,500x time scale).
RENAMED = {
    ("transport", "rto_ms"): ("rto_us", "250 ms -> 100 us"),
    ("transport", "dcqcn_timer_ms"): ("dcqcn_timer_us", "20 ms -> 8 us"),
    ("transport", "cnp_interval_ms"): ("cnp_interval_us", "20 ms -> 8 us"),
    ("workload", "compute_ms"): ("compute_us", "20 ms -> 8 us"),
    ("workload", "compute_jitter_ms"): ("compute_jitter_us", "1 ms -> 0.4 us"),
    ("workload.stragglers", "delay_ms"): ("delay_us", "5 ms -> 2 us"),
    ("background", "start_ms"): ("start_us", "10 ms -> 4 us"),
    ("background.incast", "bursts_per_s"): ("period_us", "5 per s -> 80 us"),
    ("background.noisy_neighbour", "rate_mbit"): ("rate_gbit", "15 Mbit/s -> 37.5 Gbit/s"),
}


def _no_renamed_keys(data) -> None:
    """A scenario written for the emulated units is refused with the key that replaced it."""
    for (path, old), (new, example) in RENAMED.items():
        section = data
        for part in path.split("."):
            section = section.get(part) if isinstance(section, Mapping) else None
        if isinstance(section, Mapping) and old in section:
            raise ConfigError(
                f"{path}.{old}: was emulated time or rate; it is now {path}.{new} in the "
                f"modelled fabric's units (divide by the time scale: at 40 Mbit/s, 2,500x, "
                f"{example})")


def _derive(scenario: "Scenario", data: Mapping[str, Any]) -> "Scenario":
    """Settings computed from others: the uplink rate from an oversubscription ratio (once the
    host rate is known); a neighbour host per leaf for the rxe endpoints."""
    t = scenario.topology
    if scenario.rxe.enabled and not t.neighbours_per_leaf:
        t = dataclasses.replace(t, neighbours_per_leaf=1)
    given = (data.get("topology") or {}).get("fabric_rate_mbit", AUTO)
    if t.oversubscription and t.host_rate_mbit == AUTO and given != AUTO:
        raise ConfigError(f"topology: fabric_rate_mbit {given:g} and oversubscription "
                          f"{t.oversubscription:g} both set the uplink rate (host_rate_mbit is "
                          "auto); set one of them")
    if t.oversubscription and t.host_rate_mbit != AUTO:
        rate = t.uplink_rate_mbit()
        if given != AUTO and abs(given - rate) > 1e-6 * rate:
            raise ConfigError(f"topology: fabric_rate_mbit {given:g} contradicts "
                              f"oversubscription {t.oversubscription:g} (which gives {rate:g}); "
                              "set one of them")
        if not 0.1 <= rate <= 1000.0:
            raise ConfigError(f"topology.oversubscription: gives a fabric rate of {rate:g} "
                              "Mbit/s, outside 0.1..1000")
        t = dataclasses.replace(t, fabric_rate_mbit=rate)
    plan = FabricPlan.for_topology(t)  # servers and layout fit the leaves
    for i, lossy in enumerate(t.lossy_links):
        plan.link_named(lossy.link, f"topology.lossy_links[{i}].link")
    named = [frozenset(x.link.split("-")) for x in t.lossy_links]
    if len(set(named)) < len(named):
        raise ConfigError("topology.lossy_links: a link is named twice")
    tr = scenario.transport
    if tr.retransmission == "go-back-0" and tr.entropy == "per-packet":
        raise ConfigError("transport.retransmission: go-back-0 restarts a message on any "
                          "gap, and sprayed packets arrive out of order; use entropy per-qp")
    if scenario.workload.pxn and t.gpus_per_server < 2:
        raise ConfigError("workload.pxn: PXN relays over a server's scale-up domain; set "
                          "topology.gpus_per_server above 1")
    scenario = dataclasses.replace(scenario, topology=t)
    check_fits(scenario)
    return scenario


def _policy_params(params) -> Dict[str, Dict[str, Any]]:
    """Check per-policy overrides against each policy's declared parameters."""
    from controllers.params import params_class  # the policies own their parameters

    if not isinstance(params, Mapping):
        raise ConfigError(f"policy_params: must be a mapping, got {type(params).__name__}")
    out = {}
    for name, values in params.items():
        cls = params_class(name)  # ConfigError for an unknown policy
        build(cls, values, f"policy_params.{name}")
        out[name] = dict(values)
    return out


def _variants(variants) -> Dict[str, VariantConfig]:
    """Labelled policy runs: a label is a name of its own (it names files), and each run's
    parameters are checked against its policy's."""
    from controllers.params import params_class

    if not isinstance(variants, Mapping):
        raise ConfigError(f"variants: must be a mapping, got {type(variants).__name__}")
    out = {}
    for label, values in variants.items():
        where = f"variants.{label}"
        if not isinstance(label, str) or not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,39}", label):
            raise ConfigError(f"variants: a label is 1-40 lowercase letters, digits and dashes, "
                              f"got {label!r}")
        if label in ALL_POLICIES:
            raise ConfigError(f"{where}: {label} is a policy's name; give the variant its own")
        v = build(VariantConfig, values, where)
        build(params_class(v.policy), v.policy_params, f"{where}.policy_params")
        out[label] = dataclasses.replace(v, policy_params=dict(v.policy_params))
    return out


def _merge(base: dict, changes: Mapping[str, Any]) -> dict:
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


DEFAULT = Scenario()
