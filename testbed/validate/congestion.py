"""The validation cases about congestion in a lossless fabric: PFC spreads an incast's
congestion to victim flows, and DCQCN against PFC alone (pure: scenarios out, typed results
in; ``testbed.validate.case``).
"""
from __future__ import annotations

import os
from typing import Dict, List

import numpy as np

from ..results.model import PolicyResult, RunResult
from ..scenario.catalog import SCENARIO_DIR, find
from ..scenario.config import DEFAULT
from .case import BARE, Case, Run, Verdict

# --- PFC spreads congestion to victim flows -------------------------------------------------

JOBS = os.path.join(SCENARIO_DIR, "jobs")
VICTIM = {"file": os.path.join(JOBS, "ring6.yaml"), "ranks": [0, 1, 4, 5, 8, 9]}
INCAST = {"file": os.path.join(JOBS, "incast-heavy.yaml"),
          "ranks": [2, 3, 6, 7, 10, 11, 14, 15]}


def _victim_runs(quick: bool) -> List[Run]:
    """The victim ring on leaves 1-3 alone, then beside an incast into leaf 4 from GPUs on
    the victim's leaves: without congestion control (lossy and PFC alone), and lossless with
    DCQCN."""
    base = find("incast").override({"topology": {"oversubscription": 0.5},  # idle uplinks
                                    "workload": {"iterations": 3 if quick else 4}})
    alone = base.override(dict(BARE, workload={"jobs": [VICTIM]}))
    both = base.override({"workload": {"jobs": [VICTIM, INCAST]}})
    return [Run("alone", alone.with_policies(["hyperscale", "lossless"])),
            Run("incast", both.override(BARE).with_policies(["hyperscale", "lossless"])),
            Run("incast-dcqcn", both.override({"transport": {"congestion_control": "dcqcn"}})
                .with_policies(["lossless"]))]


def _ring_us(result: RunResult, policy: str) -> float:
    p = result.policy(policy)
    return p.iteration_us.p50


VICTIM_LEAVES = ("lf1", "lf2", "lf3")  # the ring's; the incast targets lf4
SPREAD_LESS = 0.5  # DCQCN: the victim's leaves paused less than this x PFC alone's time


def paused_ms_on(p: PolicyResult, nodes) -> float:
    """The PFC paused time of the queues on ``nodes`` (switch or host names), emulated ms."""
    pfc = p.switch_queues.pfc if p.switch_queues else {}
    return sum(q["paused_ms"] for q in pfc.values() if q["node"] in nodes)


def _victim_judge(results: Dict[str, RunResult]) -> Verdict:
    """PFC alone slows the victim more than twice what the lossy fabric does (pauses > 0);
    DCQCN pauses the victim's leaves less than SPREAD_LESS x PFC alone's time. The victim's
    slowdown with DCQCN is shown: its own QPs are marked at the uplinks PFC backs up in the
    first burst (every QP at line rate) and recover at DCQCN's additive pace."""
    alone = {n: _ring_us(results["alone"], n) for n in ("hyperscale", "lossless")}
    lossy = _ring_us(results["incast"], "hyperscale") / alone["hyperscale"]
    pfc = _ring_us(results["incast"], "lossless") / alone["lossless"]
    dcqcn = _ring_us(results["incast-dcqcn"], "lossless") / alone["lossless"]
    pauses = results["incast"].policy("lossless").pfc_pause_events or 0
    held = {k: paused_ms_on(results[k].policy("lossless"), VICTIM_LEAVES)
            for k in ("incast", "incast-dcqcn")}
    spread = held["incast-dcqcn"] / held["incast"] if held["incast"] else float("inf")
    ok = pauses > 0 and pfc > 2 * lossy and spread < SPREAD_LESS
    return Verdict(
        f"the victim ring slows {lossy:.1f}x on the lossy fabric, {pfc:.1f}x under PFC alone "
        f"({pauses:,} pauses); DCQCN pauses the victim's leaves {spread:.2f}x as long, the "
        f"victim slows {dcqcn:.1f}x (not judged)", ok,
        "" if ok else ("PFC did not slow the victim twice as much as the lossy fabric"
                       if not (pauses > 0 and pfc > 2 * lossy) else
                       "DCQCN did not shorten the pauses on the victim's leaves"),
        (("victim slowdown under PFC alone (bound: 2 x the lossy fabric's)", 2 * lossy, pfc),
         (f"victim leaves' paused time, DCQCN / PFC alone (bound {SPREAD_LESS:g})",
          SPREAD_LESS, spread)))


VICTIMS = Case(
    "pfc-spreading", "PFC spreads an incast's congestion to victim flows",
    "Guo et al., RDMA over Commodity Ethernet at Scale, SIGCOMM 2016; Zhu et al. (DCQCN), "
    "SIGCOMM 2015",
    "PFC pauses propagate upstream and slow flows that never cross the congested port; DCQCN "
    "reduces the spreading",
    "a ring on leaves 1-3 (uplinks with room to spare), beside an incast into leaf 4 from GPUs "
    "on its leaves, keeps its pace on a lossy fabric and slows under PFC alone, whose pauses "
    "reach the ring's leaves; DCQCN keeps most of those pauses away, but the first burst "
    "(every QP at line rate) backs the uplinks up, marks the ring's packets there and cuts "
    "its QPs, which recover at DCQCN's additive pace: the ring's own slowdown is shown",
    f"slowdown under PFC > 2 x the lossy fabric's, PFC pauses > 0; with DCQCN the victim's "
    f"leaves paused less than {SPREAD_LESS:g}x PFC alone's time (the victim's slowdown with "
    "DCQCN is shown, not judged)",
    _victim_runs, _victim_judge)


# --- DCQCN against PFC alone ----------------------------------------------------------------

INCAST_LONG = os.path.join(JOBS, "incast-long.yaml")  # GPUs 0-6 write 4 MiB each into GPU 7
# (spines, oversubscription): full bisection on two spines, 2:1 on one, full on four
FABRICS = ((2, 1.0), (1, 2.0), (4, 1.0))
FEWER, SHORTER, KEPT, FAIR = 0.5, 0.5, 0.9, 0.95  # the tolerances (docstring of _dcqcn_judge)


def _fabric(spines: int, over: float) -> str:
    return f"{spines} spine{'s' * (spines > 1)}, {over:g}:1"


def _dcqcn_runs(quick: bool) -> List[Run]:
    """The long incast on 4 leaves of 2 GPUs, lossless, PFC alone and with DCQCN, on each
    fabric (quick: the first)."""
    runs = []
    for spines, over in FABRICS[:1] if quick else FABRICS:
        s = DEFAULT.override({
            "topology": {"spines": spines, "leaves": 4, "gpus_per_leaf": 2,
                         "oversubscription": over, "host_rate_mbit": 20},
            "workload": {"iterations": 2 if quick else 3, "job": {"file": INCAST_LONG}}}
        ).with_policies(["lossless"])
        for cc in ("none", "dcqcn"):
            runs.append(Run(f"{cc}-{spines}x{over:g}",
                            s.override({"transport": {"congestion_control": cc}})))
    return runs


def steady(p: PolicyResult, key: str) -> float:
    """The incast's ``key`` over the iterations after the first (mean over them)."""
    rows = p.fan_in["incast"].per_iteration[1:]
    return float(np.mean([getattr(r, key) for r in rows]))


def _dcqcn_judge(results: Dict[str, RunResult]) -> Verdict:
    """Per fabric, DCQCN against PFC alone: PFC pauses below FEWER x and queueing p50 below
    SHORTER x PFC alone's; over the iterations after the first, the receiver's throughput while
    all seven send at least KEPT x PFC alone's and Jain's index at least FAIR."""
    shown, bars, failed = [], [], []
    for spines, over in FABRICS:
        key = f"{spines}x{over:g}"
        if f"none-{key}" not in results:
            continue  # quick: the first fabric only
        pfc, dc = (results[f"{cc}-{key}"].policy("lossless") for cc in ("none", "dcqcn"))
        pauses = (dc.pfc_pause_events or 0) / max(1, pfc.pfc_pause_events or 0)
        queue = dc.latency_queueing_us.p50 / pfc.latency_queueing_us.p50
        kept = steady(dc, "gbps_modelled") / steady(pfc, "gbps_modelled")
        fair, unfair = steady(dc, "jain"), steady(pfc, "jain")
        first = dc.fan_in["incast"].per_iteration[0].gbps_modelled / steady(
            pfc, "gbps_modelled")
        whole = steady(dc, "whole_us") / steady(pfc, "whole_us")
        name = _fabric(spines, over)
        for what, bad in (("pauses", pauses >= FEWER), ("queues", queue >= SHORTER),
                          ("throughput", kept < KEPT), ("fairness", fair < FAIR)):
            if bad:
                failed.append(f"{what} on {name}")
        shown.append(f"{name}: pauses {pfc.pfc_pause_events:,} -> {dc.pfc_pause_events:,}, "
                     f"queueing p50 {queue:.2f}x, throughput while all send {kept:.2f}x, "
                     f"Jain {unfair:.2f} -> {fair:.3f}; first iteration {first:.2f}x, "
                     f"whole incast {whole:.2f}x (not judged)")
        bars += [(f"{name}: throughput / PFC alone's (bound {KEPT:g})", KEPT, kept),
                 (f"{name}: Jain's index (bound {FAIR:g})", FAIR, fair)]
    ok = bool(shown) and not failed
    return Verdict("; ".join(shown), ok,
                   "" if ok else "DCQCN fell short: " + ", ".join(failed), tuple(bars))


DCQCN = Case(
    "dcqcn", "DCQCN against PFC alone under a long incast",
    "Zhu et al., Congestion Control for Large-Scale RDMA Deployments (DCQCN), SIGCOMM 2015",
    "with PFC alone an incast pauses upstream ports and shares the bottleneck unfairly; DCQCN "
    "cuts pauses and keeps queues short while throughput and fair shares among the senders "
    "hold",
    "7 GPUs on 4 leaves write 4 MiB each into one: PFC alone keeps its link busy but pauses "
    "senders unevenly (those behind a paused uplink get less); DCQCN's rates converge to "
    "even shares with short queues at about the same throughput. The first iteration starts "
    "every QP at line rate into PFC: a CNP storm cuts them deep and additive increase brings "
    "them back slowly, so the rates are judged once converged, in the iterations after it; "
    "after the first sender is done the others speed up only at DCQCN's pace, so the whole "
    "incast takes longer (both shown)",
    f"on 2 spines 1:1, 1 spine 2:1 and 4 spines 1:1: pauses below {FEWER:g}x and queueing p50 "
    f"below {SHORTER:g}x PFC alone's; after the first iteration, throughput while all send at "
    f"least {KEPT:g}x PFC alone's and Jain's index at least {FAIR:g}",
    _dcqcn_runs, _dcqcn_judge)
