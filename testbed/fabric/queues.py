"""Egress queue counters of the fabric, read at the end of a run.

Each class buffer of each switch port and GPU NIC is a FIFO whose kernel counters say how many
packets left through it and how many it dropped. Switches live in the root namespace (one
dump covers them all); each GPU NIC is read in its host's namespace. Frames still queued when
the collectives end (a retransmission held by a DCQCN rate limiter, a paused queue) are in
flight, not lost: the runner lets them drain for a bounded time and counts what is left.
"""
from __future__ import annotations

import json
import time
from typing import Callable, Dict

from ..base.topology import FabricPlan
from .shaping import FIFO_KINDS

DRAIN_POLL_S = 0.2


def parse_tc_json(text: str) -> Dict[str, dict]:
    """``tc -s -j qdisc show`` output -> {interface: counters summed over its class buffers
    (the FIFOs of ``testbed.fabric.shaping``), with each buffer's counters under ``classes``}.
    A RED buffer also counts the packets it marked CE (``marked``); the FIFO RED keeps inside
    itself is not counted again. ``queued``: frames waiting anywhere in the interface's qdisc tree
    (the root qdisc's length, which also counts the per-QP rate limiters' FIFOs that ``tc``
    does not list)."""
    out: Dict[str, dict] = {}
    qdiscs = json.loads(text or "[]")
    inside_red = {(q.get("dev"), q.get("handle", "") + "1") for q in qdiscs
                  if q.get("kind") == "red"}
    queued = {q["dev"]: q.get("qlen", 0) for q in qdiscs if q.get("root") and "dev" in q}
    for q in qdiscs:
        if (q.get("kind") not in FIFO_KINDS or "dev" not in q
                or (q["dev"], q.get("parent")) in inside_red):
            continue
        dev = out.setdefault(q["dev"], {"packets": 0, "bytes": 0, "drops": 0, "backlog": 0,
                                        "marked": 0, "queued": queued.get(q["dev"], 0),
                                        "classes": {}})
        one = {"packets": q.get("packets", 0), "bytes": q.get("bytes", 0),
               "drops": q.get("drops", 0), "backlog": q.get("backlog", 0),
               "marked": q.get("marked", 0)}
        for k, v in one.items():
            dev[k] += v
        dev["classes"][q.get("handle", "?")] = one
    return out


def egress_stats(fabric) -> Dict[str, dict]:
    """{interface: FIFO counters} for every switch port and GPU NIC of a running fabric."""
    plan: FabricPlan = fabric.plan
    wanted = set(plan.interface_names())
    stats: Dict[str, dict] = {}
    for node in fabric.nodes_for_stats():  # one switch per server, and every host
        out = fabric.run(node, "tc -s -j qdisc show", check=False)
        try:
            stats.update({k: v for k, v in parse_tc_json(out).items() if k in wanted})
        except ValueError:  # not JSON: the command failed there; its ports stay unreported
            pass
    return stats


def queued_frames(stats: Dict[str, dict]) -> int:
    """Frames waiting in the fabric's buffers (switch ports and GPU NICs)."""
    return sum(v.get("queued", 0) for v in stats.values())


def drain(fabric, limit_s: float, say: Callable[[str], None]) -> Dict[str, dict]:
    """Read the egress counters until no frame is queued, for at most ``limit_s``; the last
    reading. Frames left then are counted as in flight at the end, not as lost."""
    deadline = time.monotonic() + limit_s
    stats = egress_stats(fabric)
    if queued_frames(stats):
        say(f"letting {queued_frames(stats):,} frames still queued in the fabric drain "
            f"(at most {limit_s:.0f} s)")
    while queued_frames(stats) and time.monotonic() < deadline:
        time.sleep(DRAIN_POLL_S)
        stats = egress_stats(fabric)
    return stats


def spine_load(plan: FabricPlan, stats: Dict[str, dict]) -> Dict[str, int]:
    """Packets each spine forwarded: the sum over its egress ports (down to the leaves)."""
    load = {}
    for spine in plan.spines:
        load[spine.name] = sum(stats.get(f"{spine.name}-eth{plan.spine_port(leaf.index)}", {})
                               .get("packets", 0) for leaf in plan.leaves)
    return load


def queue_drops(plan: FabricPlan, stats: Dict[str, dict]):
    """(switch egress drops, GPU NIC drops, {interface: drops} where non-zero)."""
    nics = {h.intf for h in plan.hosts}
    switch = sum(v["drops"] for k, v in stats.items() if k not in nics)
    nic = sum(v["drops"] for k, v in stats.items() if k in nics)
    per_port = {k: v["drops"] for k, v in sorted(stats.items()) if v["drops"]}
    return switch, nic, per_port
