"""The modelled fabric's fixed path delay, and where a run applies it (pure).

The emulated links serialize every frame (HTB), but a veth hands the next node a whole frame
the moment its serialization starts, so the emulation alone behaves like an ideal cut-through
switch with no pipeline, and a frame's one-way time holds neither its own transmission nor any
switching or propagation delay. What a real fabric adds is modelled here:

* a switch egress port delays every frame by the policy's pipeline latency (InfiniBand NDR:
  under 150 ns; Ethernet: about 200-250 ns - docs/REFERENCE.md), plus, when the policy forwards
  store-and-forward, one serialization of a full frame at the port's rate (the frame must have
  arrived whole before it is forwarded);
* every link, GPU NIC included, delays by its cable: 5 ns per metre;
* the receiver has a frame only when its last bit arrived: one transmission of the frame at
  the GPU NIC's rate after its first left the sender.

Modelled nanoseconds become emulated time through the run's time scale (emulated links run
``time_scale`` times slower than the modelled ones), so the latency a frame sees relative to
its serialization time is the modelled fabric's. ``topology.link_delay_us`` is added as given
(emulated time).

``emulation.path_delay`` chooses the mechanism (``mechanism``): ``netem`` puts each switch
port's delay in a netem qdisc (kernels that have it); ``nic`` holds each frame in the receiving
GPU's RNIC until the whole path's fixed delay after its arrival has passed (``traffic.delayline``);
``off`` applies nothing. Under both ``netem`` and ``nic`` the receiving RNIC adds the sender's
NIC link and the frame's own transmission, which no qdisc can put after the transmit stamp, so
the two give the same one-way time.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError

PROPAGATION_NS_PER_M = 5.0
PORT_KINDS = ("gpu_nic", "switch_to_gpu", "switch_to_switch")
MECHANISMS = ("auto", "netem", "nic", "off")  # emulation.path_delay
MECHANISM_TEXT = {"netem": "netem", "nic": "RNIC delay line", "off": "off"}  # for results


@dataclass(frozen=True)
class HopModel:
    forwarding: str = "cut_through"  # | "store_and_forward"
    pipeline_ns: float = 0.0
    cable_m: float = 0.0
    time_scale: float = 1.0
    extra_us: float = 0.0

    def link_us(self) -> float:
        """What every link adds: cable propagation (scaled) plus the extra delay."""
        return self.extra_us + self.cable_m * PROPAGATION_NS_PER_M * self.time_scale / 1000

    def switch_us(self, rate_mbit: float, frame_bytes: int) -> float:
        """What a switch egress port of ``rate_mbit`` adds to every frame, cable included."""
        serialization = (frame_bytes * 8 / rate_mbit
                         if self.forwarding == "store_and_forward" else 0.0)  # bits/Mbps = us
        return self.link_us() + self.pipeline_ns * self.time_scale / 1000 + serialization

    def delays_us(self, host_rate_mbit: float, fabric_rate_mbit: float,
                  frame_bytes: int) -> dict:
        """Delay per port kind: GPU NIC, leaf port toward a GPU, switch-to-switch port."""
        return {"gpu_nic": round(self.link_us(), 3),
                "switch_to_gpu": round(self.switch_us(host_rate_mbit, frame_bytes), 3),
                "switch_to_switch": round(self.switch_us(fabric_rate_mbit, frame_bytes), 3)}


def model(params, time_scale: float, cable_m: float = 0.0, extra_us: float = 0.0,
          enabled: bool = True) -> HopModel:
    """The model of a policy with ``params`` (its ``forwarding`` and ``switch_latency_ns``);
    ``enabled`` False (``emulation.switch_latency``) keeps only ``extra_us``."""
    if not enabled:
        return HopModel(extra_us=extra_us, time_scale=time_scale)
    return HopModel(params.forwarding, params.switch_latency_ns, cable_m, time_scale, extra_us)


def hop_model(scenario, params) -> HopModel:
    """The model a run of ``scenario`` under a policy with ``params`` asks for."""
    t = scenario.topology
    return model(params, scenario.time_scale, t.cable_m, t.link_delay_us,
                 scenario.emulation.switch_latency)


def switch_path_us(delays: dict, same_leaf: bool) -> float:
    """What the switch ports on the way between two GPUs add: the leaf port toward the
    receiver, and across leaves also the leaf uplink and the spine downlink."""
    d = delays["switch_to_gpu"]
    return d if same_leaf else d + 2 * delays["switch_to_switch"]


def fixed_path_us(delays: dict, same_leaf: bool) -> float:
    """The fixed delay between two GPUs, the frame's own transmission aside: the sender's NIC
    link (its cable) and the switch ports on the way."""
    return delays["gpu_nic"] + switch_path_us(delays, same_leaf)


def transmission_us(frame_bytes, rate_mbit: float):
    """A frame's own transmission time at ``rate_mbit`` (bits / Mbit/s = us)."""
    return frame_bytes * 8 / rate_mbit


def mechanism(setting: str, netem_available: bool) -> str:
    """What applies the path delay: "netem", "nic" or "off" (``emulation.path_delay``; auto:
    netem where the kernel has it, else the RNIC's delay line)."""
    if setting not in MECHANISMS:
        raise ConfigError(f"emulation.path_delay: {setting!r} is not one of {MECHANISMS}")
    if setting == "auto":
        return "netem" if netem_available else "nic"
    if setting == "netem" and not netem_available:
        raise ConfigError("emulation.path_delay: netem is not possible here: the kernel has "
                          "no netem qdisc (sch_netem); use nic (the receiving RNIC's delay "
                          "line) or auto")
    return setting


@dataclass(frozen=True)
class PathDelay:
    """Where a run applies the model's delays (``mechanism``) and what each part gets."""

    mechanism: str  # "netem" | "nic" | "off"
    delays_us: dict  # per port kind (``HopModel.delays_us``), emulated us

    def netem_us(self) -> dict:
        """Per port kind, what netem applies: the switch ports, under ``netem`` only. A GPU
        NIC gets none: its link's delay is the receiving RNIC's (after the transmit stamp)."""
        if self.mechanism != "netem":
            return dict.fromkeys(PORT_KINDS, 0.0)
        return dict(self.delays_us, gpu_nic=0.0)

    def neighbour_nic_us(self) -> float:
        """What a neighbour host's NIC (no RNIC of ours: kernel traffic) gets from netem."""
        return self.delays_us["gpu_nic"] if self.mechanism == "netem" else 0.0

    def rnic_us(self, same_leaf: bool) -> float:
        """What the receiving RNIC's delay line holds a frame for, its transmission aside."""
        if self.mechanism == "off":
            return 0.0
        if self.mechanism == "netem":
            return self.delays_us["gpu_nic"]
        return fixed_path_us(self.delays_us, same_leaf)

    @property
    def transmission(self) -> bool:
        """Whether the receiving RNIC adds each frame's own transmission time."""
        return self.mechanism != "off"

    def expected_us(self, same_leaf: bool) -> float:
        """The fixed delay all mechanisms together put between two GPUs (transmission aside):
        the model's, or 0 when off."""
        return 0.0 if self.mechanism == "off" else fixed_path_us(self.delays_us, same_leaf)


def path_floor_us(plan, minima_us: dict) -> dict:
    """The measured one-way latency floor: the lowest latency seen between GPUs on one leaf
    and across leaves (``minima_us``: (src rank, dst rank) -> lowest latency; None where no
    such pair carried traffic)."""
    leaf = {g.rank: g.leaf for g in plan.gpus}
    out = {}
    for name, same in (("same_leaf", True), ("cross_leaf", False)):
        values = [v for (a, b), v in minima_us.items() if (leaf[a] == leaf[b]) == same]
        out[name] = round(min(values), 3) if values else None
    return out
