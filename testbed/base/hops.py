"""Per-hop latency of the modelled fabric, as the netem delay of every egress (pure).

The emulated links serialize every frame (HTB), but a veth hands the next node a whole frame
the moment its serialization starts, so the emulation alone behaves like an ideal cut-through
switch with no pipeline. What real switches add is modelled here and applied with netem where
the kernel has it (``testbed.fabric.shaping``):

* a switch egress port delays every frame by the policy's pipeline latency (InfiniBand NDR:
  under 150 ns; Ethernet: about 200-250 ns - docs/REFERENCE.md), plus, when the policy forwards
  store-and-forward, one serialization of a full frame at the port's rate (the frame must have
  arrived whole before it is forwarded);
* every link, GPU NIC included, delays by its cable: 5 ns per metre.

Modelled nanoseconds become emulated time through the run's time scale (emulated links run
``time_scale`` times slower than the modelled ones), so the latency a frame sees relative to
its serialization time is the modelled fabric's. ``topology.link_delay_us`` is added as given
(emulated time).
"""
from __future__ import annotations

from dataclasses import dataclass

PROPAGATION_NS_PER_M = 5.0
PORT_KINDS = ("gpu_nic", "switch_to_gpu", "switch_to_switch")


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


def path_delay_us(delays: dict, same_leaf: bool) -> float:
    """One-way delay the model adds to a frame between two GPUs after the sender's kernel
    stamped it: the leaf port toward the receiver, and across leaves also the leaf uplink and
    the spine downlink. The sender NIC's own cable delay is not in it: the NIC's delay line
    sits in its qdisc, before the stamp (it still delays the frame, and the collective)."""
    d = delays["switch_to_gpu"]
    return d if same_leaf else d + 2 * delays["switch_to_switch"]


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
