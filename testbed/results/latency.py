"""A packet's one-way latency in its parts (pure): the modelled fabric's fixed path delay
(``testbed.base.hops``: its GPU pair's switch ports and cables, and its own transmission) and
the remainder measured on the packet - queueing and the emulator's forwarding."""
from __future__ import annotations

from typing import Dict

import numpy as np

from traffic import metrics

from ..base.frames import roce_frame_bytes
from ..base.hops import PathDelay, path_floor_us, transmission_us


def expected_path_us(plan, path: PathDelay) -> Dict[tuple, float]:
    """(src rank, dst rank) -> the modelled fixed delay between the two GPUs, their frames'
    transmission aside (zero when the path delay is off)."""
    return {(a.rank, b.rank): path.expected_us(a.leaf == b.leaf)
            for a in plan.gpus for b in plan.gpus if a.rank != b.rank}


def expected_latency_us(packets, plan, path: PathDelay, rate_mbit: float) -> np.ndarray:
    """Per data packet, what the modelled path puts into its one-way latency (emulated us):
    the fixed delay of its GPU pair, plus its frame's own transmission where applied (the
    frame's size from its payload, with a WRITE MIDDLE's headers: a FIRST's RETH, 16 B more,
    is not counted)."""
    fixed = expected_path_us(plan, path)
    out = np.asarray([fixed.get(k, 0.0) for k in zip(packets.src.tolist(),
                                                     packets.dst.tolist())], dtype=float)
    if path.transmission:
        out += transmission_us(roce_frame_bytes(packets.payload.astype(float)), rate_mbit)
    return out


def full_frame_path_us(path: PathDelay, mtu: int, rate_mbit: float) -> Dict[str, float]:
    """The modelled fixed path delay of a full data frame, on one leaf and across leaves."""
    own = transmission_us(roce_frame_bytes(mtu), rate_mbit) if path.transmission else 0.0
    return {"same_leaf": round(path.expected_us(True) + own, 3),
            "cross_leaf": round(path.expected_us(False) + own, 3)}


def latency_parts(packets, plan, path: PathDelay, expected_us: np.ndarray,
                  minima_us: Dict[tuple, float], mtu: int, rate_mbit: float) -> dict:
    """The figures of a run's latency parts (emulated us), given each packet's
    ``expected_latency_us`` and the pairs' lowest latencies (``Packets.path_minima_us``):
    ``latency_queueing_us`` (latency less its modelled path delay; None when the path delay
    is off), ``path_delay_us`` (a full frame's, per path kind) and ``latency_floor_us`` (the
    lowest latency measured, per path kind)."""
    queueing = None
    if path.mechanism != "off" and packets.latency.size:
        queueing = metrics.percentiles(packets.latency - expected_us)
    return {"latency_queueing_us": queueing,
            "path_delay_us": full_frame_path_us(path, mtu, rate_mbit),
            "latency_floor_us": path_floor_us(plan, minima_us)}
