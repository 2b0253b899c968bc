"""A run's collectives as nccl-tests (2.x) prints them, so the tools that read nccl-tests logs
read the testbed's: per policy the header, a row per message size and the trailer, in the
modelled fabric's time and GB/s (bytes / 1e9 / s), time being the median completion time.

Only the out-of-place columns: the emulated GPUs have no separate in-place buffers. ``#wrong``
is ``N/A``, as nccl-tests prints it without data checking: the agents check that every byte
arrived, not its values. The JSON twin (``as_json``) holds the same rows.
"""
from __future__ import annotations

from typing import List, Optional

from traffic.collectives import KINDS, bus_bandwidth_factor

from .model import PolicyResult, RunResult

ELEMENT_TYPE, ELEMENT_BYTES = "float", 4
REDOP = {"allreduce": "sum", "reducescatter": "sum"}  # the rest reduce nothing: "none"
HEADER = ("#                                                              out-of-place",
          "#       size         count      type   redop    root     time   algbw   busbw #wrong",
          "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)")


def rows(policy: PolicyResult) -> List[dict]:
    """One row per collective size the policy replayed with a modelled completion time (the
    policy in modelled time, as a run's results give it)."""
    out = []
    for entry in policy.collectives:
        cct = entry.cct_us.p50 if entry.time == "modelled" and entry.cct_us else None
        if not cct:
            continue
        kind = KINDS[entry.collective]
        size = int(entry.size_bytes)
        algbw = size / 1e3 / cct  # B/us = 1e6 B/s; GB/s = B / 1e9 / s
        out.append({"size": size, "count": size // ELEMENT_BYTES, "type": ELEMENT_TYPE,
                    "redop": REDOP.get(kind, "none"), "root": -1, "time": cct,
                    "algbw": algbw,
                    "busbw": algbw * bus_bandwidth_factor(kind, int(policy.gpus)),
                    "wrong": None})
    return out


def _time(us: float) -> str:
    """As nccl-tests formats a time: fewer decimals as it grows."""
    if us >= 10000.0:
        return f"{us:7.0f}"
    return f"{us:7.1f}" if us >= 100.0 else f"{us:7.2f}"


def average_busbw(table: List[dict]) -> Optional[float]:
    return sum(r["busbw"] for r in table) / len(table) if table else None


def text(name: str, policy: PolicyResult) -> str:
    """One policy's collectives as an nccl-tests log."""
    table = rows(policy)
    what = ", ".join(sorted({e.collective for e in policy.collectives}))
    lines = [f"# testbed: policy {name}, {what} on {policy.gpus} GPUs; modelled "
             "fabric time and GB/s", "#", *HEADER]
    for r in table:
        lines.append(f"{r['size']:12d}  {r['count']:12d}  {r['type']:>8s}  {r['redop']:>6s}  "
                     f"{r['root']:6d}  {_time(r['time'])}  {r['algbw']:6.2f}  "
                     f"{r['busbw']:6.2f}  {'N/A':>5s}")
    avg = average_busbw(table)
    lines += ["# Out of bounds values : 0 OK",
              f"# Avg bus bandwidth    : {avg:g} " if avg is not None else
              "# Avg bus bandwidth    : N/A ", "#"]
    return "\n".join(lines)


def as_json(results: RunResult) -> dict:
    """The same rows per policy, with the average bus bandwidth."""
    out = {}
    for name, policy in results.policies.items():
        table = rows(policy)
        out[name] = {"gpus": policy.gpus, "rows": table,
                     "avg_bus_bandwidth": average_busbw(table)}
    return {"format": "nccl-tests", "time": "us, modelled", "bandwidth": "GB/s",
            "policies": out}
