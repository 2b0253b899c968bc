"""Metrics from per-packet and per-iteration records (pure; definitions as in docs/DESIGN.md).

* one-way packet latency: kernel RX time minus kernel TX time;
* jitter: IPDV (RFC 3393) - the difference between the one-way delays of consecutive packets
  of one flow, in send order - and the spread p99 - p50 of the latency;
* tail ratio: latency p99 / p50;
* collective completion time (CCT) of an iteration: last rank done minus first rank start;
* algbw = bytes / CCT and busbw = algbw x the nccl-tests factor (``collectives``);
* straggler idle time of an iteration: the sum over ranks of (the slowest rank's finish - the
  rank's own finish), where a rank's finish is the moment it finished its own work (its compute
  phase) and reached the collective - from then on it can only wait for the slowest;
* extrapolation: the same lag on N GPUs idles N - 1 of them (the seed's arithmetic).
"""
from __future__ import annotations

import math
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np

from .contract import LagSummary


def percentiles(values_us: Sequence[float]) -> Optional[Dict[str, float]]:
    """p50, p99, p99.9, max and mean of a sample (None when it is empty)."""
    a = np.asarray(values_us, dtype=float)
    if a.size == 0:
        return None
    p50, p99, p999 = np.percentile(a, [50, 99, 99.9])
    return {"p50": _r(p50), "p99": _r(p99), "p999": _r(p999), "max": _r(a.max()),
            "mean": _r(a.mean()), "count": int(a.size)}


def latency_us(tx_ns: Sequence[int], rx_ns: Sequence[int]) -> np.ndarray:
    return (np.asarray(rx_ns, dtype=np.int64) - np.asarray(tx_ns, dtype=np.int64)) / 1000.0


def iteration_cct_us(steps: Iterable[dict]) -> List[float]:
    """CCT of each iteration from step records (``iteration``, ``start_ns``, ``end_ns``).

    CCT = latest end of any rank's last step - earliest start of any rank's first step.
    """
    first: Dict[int, int] = {}
    last: Dict[int, int] = {}
    for s in steps:
        it = int(s["iteration"])
        start, end = int(s["start_ns"]), int(s["end_ns"])
        first[it] = min(first.get(it, start), start)
        last[it] = max(last.get(it, end), end)
    return [(last[i] - first[i]) / 1000.0 for i in sorted(first)]


def cct_summary(cct_us: Sequence[float]) -> Optional[Dict[str, float]]:
    a = np.asarray(cct_us, dtype=float)
    if a.size == 0:
        return None
    p50, p99 = np.percentile(a, [50, 99])
    return {"p50": _r(p50), "p99": _r(p99), "max": _r(a.max()), "mean": _r(a.mean()),
            "per_iteration": [_r(v) for v in a]}


def algbw_gbps(size_bytes: int, cct_us: float) -> float:
    """nccl-tests algorithm bandwidth: buffer size over completion time, in Gbit/s."""
    return size_bytes * 8 / (cct_us * 1000.0)


def ipdv_us(latencies_in_send_order: Sequence[float]) -> np.ndarray:
    """RFC 3393 IPDV of one flow: D(i) - D(i-1) for consecutive packets."""
    return np.diff(np.asarray(latencies_in_send_order, dtype=float))


def jitter_summary(ipdv: Sequence[float], latency: Optional[Dict[str, float]]
                   ) -> Optional[Dict[str, float]]:
    """|IPDV| percentiles and the latency spread p99 - p50 (None without packets)."""
    a = np.abs(np.asarray(ipdv, dtype=float))
    if a.size == 0 or not latency:
        return None
    p50, p99 = np.percentile(a, [50, 99])
    return {"ipdv_abs_p50": _r(p50), "ipdv_abs_p99": _r(p99), "ipdv_abs_max": _r(a.max()),
            "ipdv_count": int(a.size), "p99_minus_p50": _r(latency["p99"] - latency["p50"])}


def tail_ratio(latency: Optional[Dict[str, float]]) -> Optional[float]:
    """Latency p99 / p50 (None without packets)."""
    if not latency or latency["p50"] <= 0:
        return None
    return _r(latency["p99"] / latency["p50"])


def idle_us(finish_us: Sequence[float]) -> float:
    """Sum over ranks of (slowest finish - own finish): GPU-microseconds spent waiting."""
    a = np.asarray(finish_us, dtype=float)
    return float((a.max() - a).sum()) if a.size else 0.0


def straggler_idle(ready_ns_by_iteration: Dict[int, Sequence[int]]) -> Optional[dict]:
    """Idle GPU time per iteration and in total, from each rank's finish of its own work."""
    if not ready_ns_by_iteration:
        return None
    per = [idle_us(np.asarray(ready_ns_by_iteration[i], dtype=float) / 1000.0)
           for i in sorted(ready_ns_by_iteration)]
    return {"per_iteration": [_r(v) for v in per], "total": _r(sum(per)),
            "mean": _r(sum(per) / len(per))}


def extrapolate_idle(idle_per_iteration_us: float, ranks: int, gpus: int,
                     time_scale: float = 1.0) -> dict:
    """GPU-seconds idled per step if the measured lag hit ``gpus`` GPUs: each of the other
    ``gpus - 1`` waits as long as a rank waited here on average (emulated microseconds,
    divided by ``time_scale`` for the modelled fabric)."""
    lag_us = idle_per_iteration_us / max(1, ranks - 1)
    return {"gpus": gpus, "mean_lag_us_emulated": _r(lag_us),
            "mean_lag_us_modelled": _r(lag_us / time_scale),
            "gpu_seconds_per_step_emulated": round((gpus - 1) * lag_us / 1e6, 6),
            "gpu_seconds_per_step_modelled": round((gpus - 1) * lag_us / time_scale / 1e6, 9)}


def _r(x) -> float:
    return round(float(x), 3)


class LagHistogram:
    """Counts of delays (ns) in log-spaced bins, fifty per decade from 1 us to 100 s: cheap to
    keep per event, and histograms of several processes add up (``merge``). A quantile is the
    upper edge of its bin, within 4.7% above the true value: a check against a tolerance
    errs strict by at most that."""

    BINS_PER_DECADE = 50
    DECADES = 8  # 1 us .. 100 s

    def __init__(self, counts: Optional[List[int]] = None):
        n = self.BINS_PER_DECADE * self.DECADES + 2  # + below 1 us, + above 100 s
        self.counts = list(counts) if counts else [0] * n

    def add(self, lag_ns: int) -> None:
        us = lag_ns / 1000.0
        if us < 1.0:
            i = 0
        else:
            i = min(len(self.counts) - 1, 1 + int(math.log10(us) * self.BINS_PER_DECADE))
        self.counts[i] += 1

    def upper_us(self, i: int) -> float:
        """Upper edge of bin ``i`` in microseconds."""
        return 10 ** (i / self.BINS_PER_DECADE)

    def quantile_us(self, q: float) -> Optional[float]:
        """An upper bound (within one bin, 4.7%) of the ``q`` quantile."""
        total = sum(self.counts)
        if not total:
            return None
        want, seen = q * total, 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= want and c:
                return _r(self.upper_us(i))
        return _r(self.upper_us(len(self.counts) - 1))

    def merge(self, other: "LagHistogram") -> "LagHistogram":
        return LagHistogram([a + b for a, b in zip(self.counts, other.counts)])

    def summary(self) -> LagSummary:
        """The histogram as the agents report it (``traffic.contract.LagSummary``)."""
        return LagSummary(count=sum(self.counts), p50_us=self.quantile_us(0.5),
                          p95_us=self.quantile_us(0.95), p99_us=self.quantile_us(0.99),
                          max_us=self.quantile_us(1.0), counts=tuple(self.counts))
