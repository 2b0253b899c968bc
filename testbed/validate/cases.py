"""The validation cases: published results about AI fabrics, each with what it predicts here,
the runs that measure it and the rule that judges them (pure: scenarios out, typed results in;
``testbed.validate.case``). PFC's spreading and DCQCN live in ``testbed.validate.congestion``.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

from traffic import roce

from ..base.errors import ConfigError
from ..base.frames import ack_frame_bytes, roce_frame_bytes
from ..results.model import RunResult
from ..scenario.config import DEFAULT
from ..scenario.catalog import find
from .case import BARE, Case, Run, Verdict
from .congestion import DCQCN, VICTIMS


# --- the seed's straggler arithmetic ---------------------------------------------------------

STRAGGLER_US, STRAGGLER_RANKS = 80.0, 4


def _straggler_runs(quick: bool) -> List[Run]:
    return [Run("straggler", DEFAULT.override({
        "topology": {"leaves": 2},
        "workload": {"size_bytes": 16384, "chunks": 1, "iterations": 4 if quick else 8,
                     "compute_us": 4,
                     "stragglers": {"ranks": [2], "delay_us": STRAGGLER_US}}}
    ).with_policies(["hyperscale"]))]


def _straggler_judge(results: Dict[str, RunResult]) -> Verdict:
    c = results["straggler"].policy("hyperscale").collective()
    later = c.straggler_idle_us.per_iteration[1:]  # the first iteration's start is uneven
    idle = sum(later) / len(later)
    expected = (STRAGGLER_RANKS - 1) * STRAGGLER_US
    per_step = c.extrapolation.gpu_seconds_per_step_modelled
    seed = 9_999 * 20e-6  # the seed's example: 20 us late on 10,000 GPUs
    scaled = per_step * 20.0 / STRAGGLER_US
    ok = abs(idle - expected) <= 0.10 * expected and abs(scaled - seed) <= 0.10 * seed
    return Verdict(f"idle {idle:.1f} us per iteration (model {expected:.0f}); 20 us late on "
                   f"10,000 GPUs: {scaled:.3f} GPU-s per step", ok,
                   "" if ok else "outside 10% of (n-1) x delay",
                   (("idle per iteration (us)", expected, idle),
                    ("GPU-s per step, 20 us on 10,000", seed, scaled)))


STRAGGLER = Case(
    "straggler", "A straggler idles every other GPU",
    "the seed (lock-step training: the slowest peer sets the pace)",
    "one GPU 20 us late on 10,000 GPUs costs about 0.2 GPU-seconds per step",
    "each of the n-1 others waits the delay: idle = (n-1) x delay per iteration",
    "within 10% of (n-1) x delay, and of 0.2 GPU-s once scaled to 20 us on 10,000 GPUs",
    _straggler_runs, _straggler_judge)


# --- cut-through vs store-and-forward -------------------------------------------------------

FRAME_US = roce_frame_bytes(4096) * 8 / 100e3  # a full data frame at the modelled 100 Gbit/s
ACK_US = ack_frame_bytes() * 8 / 100e3


def _hop_runs(quick: bool) -> List[Run]:
    return [Run("ring-64k", DEFAULT.override({
        "topology": {"spines": 2, "leaves": 8, "gpus_per_leaf": 1, "host_rate_mbit": 10},
        "workload": {"size_bytes": 65536, "chunks": 1, "iterations": 4 if quick else 6,
                     "compute_us": 2}}).with_policies(["hyperscale", "lossless"]))]


def hop_model_us(path_delay_cross_leaf_us: float, steps: int = 14) -> float:
    """A latency-bound ring all-reduce of two frames per step: per step the cross-leaf path
    delay (its frame's transmission apart) plus both frames' transmission, then the last
    step's ACK back."""
    fixed = path_delay_cross_leaf_us - FRAME_US
    return steps * (fixed + 2 * FRAME_US) + fixed + ACK_US


def _hop_judge(results: Dict[str, RunResult]) -> Verdict:
    run = results["ring-64k"]
    cct, model, floor = {}, {}, {}
    for name in ("hyperscale", "lossless"):
        p = run.policy(name)
        model[name] = hop_model_us(p.path_delay_us["cross_leaf"])
        cct[name] = p.collective().cct_us.p50
        floor[name] = p.latency_floor_us["cross_leaf"]
    off = {n: cct[n] / model[n] - 1 for n in cct}
    margin, model_margin = cct["hyperscale"] - cct["lossless"], \
        model["hyperscale"] - model["lossless"]
    ok = all(abs(v) <= 0.15 for v in off.values()) and margin > 0 and \
        abs(margin - model_margin) <= 0.15 * model_margin
    return Verdict(
        f"CCT {cct['hyperscale']:.2f} us store-and-forward, {cct['lossless']:.2f} us "
        f"cut-through (model {model['hyperscale']:.2f} / {model['lossless']:.2f}); idle "
        f"floor across leaves {floor['hyperscale']:.3f} / {floor['lossless']:.3f} us", ok,
        "" if ok else f"off the hop model by {off['hyperscale']:+.0%} / {off['lossless']:+.0%}",
        (("store-and-forward CCT (us)", model["hyperscale"], cct["hyperscale"]),
         ("cut-through CCT (us)", model["lossless"], cct["lossless"])))


HOPS = Case(
    "cut-through", "Cut-through vs store-and-forward in a latency-bound all-reduce",
    "the seed; InfiniBand switch latency under 150 ns, Ethernet 200-250 ns plus a "
    "serialization per hop",
    "cut-through saves a frame's serialization per hop",
    "each step of a 64 KiB ring on 8 leaves takes the modelled path delay; lossless (cut-"
    "through) beats hyperscale (store-and-forward) by 15 paths' serializations",
    "each CCT within 15% of the hop model, and the margin within 15% of the model's",
    _hop_runs, _hop_judge)


# --- lossy vs lossless under incast ---------------------------------------------------------

def _lossy_runs(quick: bool) -> List[Run]:
    s = find("oversubscribed").override({
        "workload": {"iterations": 2 if quick else 4},
        "policy_params": {"hyperscale": {"ecn": "off"}}})  # no marks: lossy and bare
    return [Run("oversubscribed", s.with_policies(["hyperscale", "lossless"]))]


def _lossy_judge(results: Dict[str, RunResult]) -> Verdict:
    run = results["oversubscribed"]
    hs, ll = run.policy("hyperscale"), run.policy("lossless")
    ok = (hs.drops > 0 and hs.retransmitted_packets > 0 and ll.drops == 0
          and ll.retransmitted_packets == 0 and (ll.pfc_pause_events or 0) > 0
          and ll.cct_us.p99 < hs.cct_us.p99)
    return Verdict(
        f"lossy: {hs.drops:,} drops, {hs.retransmitted_packets:,} retransmitted, CCT p99 "
        f"{hs.cct_us.p99:.0f} us; lossless: {ll.drops} drops, {ll.pfc_pause_events:,} "
        f"pauses, CCT p99 {ll.cct_us.p99:.0f} us", ok,
        "" if ok else "the signs differ from the prediction",
        (("CCT p99 lossless / lossy (bound 1)", 1.0, ll.cct_us.p99 / hs.cct_us.p99),))


LOSSY = Case(
    "lossy-vs-lossless", "Lossy vs lossless under 2:1 oversubscription",
    "Guo et al., RDMA over Commodity Ethernet at Scale, SIGCOMM 2016",
    "RoCE needs a lossless fabric: drops cost go-back-N retransmissions and tail latency",
    "hyperscale without ECN drops and retransmits; lossless drops nothing and pauses; the "
    "collective's tail is shorter lossless",
    "signs only: drops > 0 vs 0, pauses > 0, CCT p99 lossless < lossy",
    _lossy_runs, _lossy_judge)


# --- a training job's exposed communication -------------------------------------------------

def _job_runs(quick: bool) -> List[Run]:
    return [Run("default-job", find("default").override(
        {"workload": {"iterations": 2 if quick else 3}}).with_policies(["hyperscale"]))]


def _job_judge(results: Dict[str, RunResult]) -> Verdict:
    p = results["default-job"].policy("hyperscale")
    compute, ideal = p.job_compute_us, p.ideal_iteration_us
    exposed = p.exposed_comm_us["total"]
    comm = sum(r["comm_us"] for r in p.operations if r["kind"] != "compute")
    ok = abs(ideal - compute) <= 0.02 * compute and 0 < exposed < comm
    return Verdict(
        f"free-network iteration {ideal:.1f} us, compute {compute:.1f} us; communication "
        f"{comm:.1f} us per GPU and iteration, of it exposed {exposed:.1f} us "
        f"({exposed / comm:.0%})", ok,
        "" if ok else ("the free-network iteration is not the compute model"
                       if abs(ideal - compute) > 0.02 * compute
                       else "no communication was hidden under compute"),
        (("free-network iteration (us; model: compute)", compute, ideal),
         ("exposed communication (us; bound: all of it)", comm, exposed)))


JOB = Case(
    "exposed-communication", "A training job pays only for the communication it cannot hide",
    "SimAI (NSDI 2025) and ASTRA-sim: exposed communication as the fabric's cost",
    "with a free network the iteration is the compute model; of the communication, only the "
    "part no compute hides costs iteration time",
    "the free-network iteration equals the compute per GPU (no pipeline bubble in the default "
    "job); the gradient buckets overlap the backward pass, so exposed < total communication",
    "within 2% (free network); signs for the overlap (0 < exposed < total)",
    _job_runs, _job_judge)


# --- go-back-N vs go-back-0 under loss --------------------------------------------------------

LOSS_RATE, LOSS_SIZE = 0.01, 4 << 20  # a ring of 4 GPUs: 1 MiB messages, 256 packets each
LOSSY_LINK = "lf1-sp1"  # the one spine: every step's cross-leaf transfers cross it
GO_BACK_MARGIN = 2.5  # go-back-0 takes at least this many times go-back-N's time


def _loss_runs(quick: bool) -> List[Run]:
    base = DEFAULT.override(dict(BARE, topology={"spines": 1, "leaves": 2, "gpus_per_leaf": 2},
                                 workload={"collective": "ring", "size_bytes": LOSS_SIZE,
                                           "chunks": 1, "iterations": 2 if quick else 4}))
    lossy = base.override({"topology": {"lossy_links": [{"link": LOSSY_LINK,
                                                         "drop_rate": LOSS_RATE}]}})
    return [Run(label, s.with_policies(["hyperscale"])) for label, s in (
        ("clean", base), ("go-back-n", lossy),
        ("go-back-0", lossy.override({"transport": {"retransmission": "go-back-0"}})))]


def go_back_0_model(packets: int, drop_rate: float, messages: int = 2) -> float:
    """Go-back-0's cost of a ring step, in one message's packets: a message is sent again
    until all ``packets`` pass in a row (each lost with ``drop_rate``), and the step waits
    for the slowest of the ``messages`` that cross the lossy link (one each way): the mean
    of their maximum, from each one's distribution (a Markov chain over the packets passed
    in a row), NAK round trips left out."""
    mean = (1 - (1 - drop_rate) ** packets) / (drop_rate * (1 - drop_rate) ** packets)
    run = np.zeros(packets + 1)  # P(the current attempt has passed k packets in a row)
    run[0] = 1.0
    expected = 0.0
    for _ in range(int(40 * mean)):  # the tail beyond is below 1e-9
        expected += 1 - run[packets] ** messages  # P(max > n) summed: E[max]
        done = run[packets] + run[packets - 1] * (1 - drop_rate)
        run[1:packets] = run[0:packets - 1] * (1 - drop_rate)
        run[0] = (1 - done) - run[1:packets].sum()
        run[packets] = done
    return float(expected / packets)


def _loss_judge(results: Dict[str, RunResult]) -> Verdict:
    cct = {k: results[k].policy("hyperscale").collective().cct_us.mean
           for k in ("clean", "go-back-n", "go-back-0")}
    n, zero = cct["go-back-n"] / cct["clean"], cct["go-back-0"] / cct["clean"]
    lossy = {k: results[k].policy("hyperscale") for k in ("go-back-n", "go-back-0")}
    message = LOSS_SIZE // 4  # a step's message of the 4-GPU ring
    model = go_back_0_model(len(roce.packet_payloads(
        message, results["clean"].scenario.workload.mtu)), LOSS_RATE)
    lost = all((p.link_losses or 0) > 0 for p in lossy.values())
    ok = lost and zero >= GO_BACK_MARGIN * n and model / 2 <= zero <= 3 * model
    gbn = lossy["go-back-n"]
    return Verdict(
        f"{LOSS_RATE:.0%} lost on {LOSSY_LINK}: go-back-0 {zero:.1f}x the clean CCT (model "
        f"{model:.1f}x, {lossy['go-back-0'].link_losses or 0:,} losses), go-back-N {n:.2f}x "
        f"({gbn.link_losses or 0:,} losses, {gbn.naks} NAKs, {gbn.rto_timeouts} timeouts)",
        ok,
        "" if ok else ("the link lost nothing" if not lost else
                       f"go-back-0 did not take {GO_BACK_MARGIN:g}x go-back-N's time"
                       if zero < GO_BACK_MARGIN * n else
                       "go-back-0 is off its model (below half or above three times it)"),
        (("go-back-0 CCT / clean (model)", model, zero),
         (f"go-back-N CCT / clean (bound: go-back-0's / {GO_BACK_MARGIN:g})",
          zero / GO_BACK_MARGIN, n)))


GO_BACK = Case(
    "go-back-0", "Go-back-N vs go-back-0 under a small drop rate",
    "Guo et al., RDMA over Commodity Ethernet at Scale, SIGCOMM 2016",
    "go-back-0 (restart the message from its first packet) livelocked under small loss; "
    "go-back-N, which resends from the lost packet, fixed it",
    f"a 4-GPU ring of {LOSS_SIZE >> 20} MiB across a link losing {LOSS_RATE:.0%} of packets: "
    "go-back-0 resends each 256-packet message until all pass in one go, and a step waits for "
    "the slower of the two messages crossing the link: the mean of that maximum, over each "
    "one's distribution of packets sent; go-back-N resends from the lost packet (a lost "
    "message end waits for the timeout)",
    f"go-back-0's CCT (mean over iterations) from half to three times the model (it leaves "
    f"out the timeout after a lost message end, up to one per step), and at least "
    f"{GO_BACK_MARGIN:g}x go-back-N's",
    _loss_runs, _loss_judge)


# --- QP scaling on static ECMP ---------------------------------------------------------------

QP_MANY = 8


def _qp_runs(quick: bool) -> List[Run]:
    """A ring on two leaves, so one flow per direction crosses between them, with 1 and 8 QPs
    per peer: over leaf uplinks of half its rate (2 spines, 2:1) and of its whole rate (1:1)."""
    ring = DEFAULT.override({
        "topology": {"spines": 2, "leaves": 2, "gpus_per_leaf": 2},
        "workload": {"collective": "ring", "size_bytes": 4 << 20, "chunks": 1,
                     "iterations": 2 if quick else 3}}).with_policies(["hyperscale"])
    return [Run(f"{name}-{q}qp", ring.override({"topology": {"oversubscription": ratio},
                                                 "transport": {"qps_per_peer": q}}))
            for name, ratio in (("half-uplinks", 2), ("full-uplinks", 1)) for q in (1, QP_MANY)]


def _busbw(result: RunResult) -> float:
    return result.policy("hyperscale").collective().busbw_gbps_modelled


def _qp_judge(results: Dict[str, RunResult]) -> Verdict:
    half1, half_n = (_busbw(results[f"half-uplinks-{q}qp"]) for q in (1, QP_MANY))
    full1, full_n = (_busbw(results[f"full-uplinks-{q}qp"]) for q in (1, QP_MANY))
    line = results["half-uplinks-1qp"].scenario.topology.modelled_rate_gbit
    half_gain, full_gain = half_n / half1, full_n / full1
    ok = half1 <= 0.6 * line and half_gain >= 1.3 and full_gain <= 1.1
    return Verdict(
        f"uplinks at half the flow's rate: busbw {half1:.1f} -> {half_n:.1f} Gbit/s with "
        f"{QP_MANY} QPs per peer ({half_gain:.2f}x); at its whole rate: {full1:.1f} -> "
        f"{full_n:.1f} ({full_gain:.2f}x)", ok,
        "" if ok else ("one QP was not held to one uplink" if half1 > 0.6 * line else
                       "more QPs did not spread the flow over the uplinks"
                       if half_gain < 1.3 else "more QPs helped a flow its path already held"),
        ((f"busbw gain, {QP_MANY} QPs, half-rate uplinks (bound 1.3)", 1.3, half_gain),
         (f"busbw gain, {QP_MANY} QPs, full-rate uplinks (bound 1.1)", 1.1, full_gain)))


QP_SCALING = Case(
    "qp-scaling", "More QPs per peer on static ECMP: when they help",
    "Gangidi et al., RDMA over Ethernet for Distributed AI Training at Meta Scale, SIGCOMM 2024",
    "spreading a collective's few large flows over more QPs raised all-reduce bandwidth up to "
    "40% on static ECMP",
    "ECMP hashes all of a flow's packets to one path: a ring's one cross-leaf flow gets one "
    "of two half-rate uplinks (busbw at most about half the line), and 8 QPs spread it over "
    "both; where one uplink carries the flow's whole rate, more QPs change nothing",
    "half-rate uplinks: busbw with 1 QP at most 60% of the line, with 8 QPs at least 1.3x; "
    "full-rate uplinks: 8 QPs at most 1.1x",
    _qp_runs, _qp_judge)


# --- adaptive routing and spraying against static ECMP ---------------------------------------

def _spray_runs(quick: bool) -> List[Run]:
    """The ecmp-collisions all-to-all (4 spines, uplinks that fit only an even spread) under
    hyperscale (static ECMP) and lossless (adaptive routing), with each QP's flow hashed as
    one and with a new entropy per packet (sprayed)."""
    s = find("ecmp-collisions").override({
        # sprayed packets take the agents' Python receive path: at 20 Mbit/s the lossless
        # run's agents woke up to 501 us late (417 allowed)
        "topology": {"host_rate_mbit": 10},
        "workload": {"iterations": 2 if quick else 3}}).with_policies(["hyperscale", "lossless"])
    return [Run(entropy, s.override({"transport": {"entropy": entropy}}))
            for entropy in ("per-qp", "per-packet")]


def imbalance(load: Dict[str, int]) -> float:
    """The busiest spine's packets over the mean."""
    return max(load.values()) / (sum(load.values()) / len(load))


def _spray_judge(results: Dict[str, RunResult]) -> Verdict:
    line = results["per-qp"].scenario.topology.modelled_rate_gbit
    share, skew = {}, {}
    for entropy in ("per-qp", "per-packet"):
        for policy in ("hyperscale", "lossless"):
            p = results[entropy].policy(policy)
            share[policy, entropy] = p.collective().busbw_gbps_modelled / line
            skew[policy, entropy] = imbalance(p.spine_load_packets)
    ecmp, spectrum = ("hyperscale", "per-qp"), ("lossless", "per-packet")
    sprayed = ("hyperscale", "per-packet")
    ok = (share[spectrum] >= 0.8 and share[sprayed] >= 0.8 and share[ecmp] <= 0.7
          and skew[ecmp] >= 1.2 and skew[spectrum] <= 1.1 and skew[sprayed] <= 1.1)
    drops = results["per-qp"].policy("hyperscale").drops
    return Verdict(
        f"busbw as a share of the line: static ECMP {share[ecmp]:.0%} (busiest spine "
        f"{skew[ecmp]:.2f}x the mean, {drops:,} drops); adaptive routing and spraying "
        f"{share[spectrum]:.0%} ({skew[spectrum]:.2f}x); hyperscale sprayed "
        f"{share[sprayed]:.0%} ({skew[sprayed]:.2f}x); adaptive routing per flow "
        f"{share['lossless', 'per-qp']:.0%} ({skew['lossless', 'per-qp']:.2f}x, not judged)",
        ok,
        "" if ok else ("static ECMP did not collide" if skew[ecmp] < 1.2 else
                       "spraying left the spines uneven"
                       if max(skew[spectrum], skew[sprayed]) > 1.1 else
                       "the shares of the line differ from the prediction"),
        (("AR + spraying busbw / line (bound 0.8)", 0.8, share[spectrum]),
         ("hyperscale sprayed busbw / line (bound 0.8)", 0.8, share[sprayed]),
         ("static ECMP busbw / line (bound 0.7)", 0.7, share[ecmp])))


SPRAYING = Case(
    "spraying", "Adaptive routing with spraying against static ECMP under flow collisions",
    "NVIDIA Spectrum-X (adaptive routing and packet spraying); Meta, SIGCOMM 2024 (ECMP "
    "collisions)",
    "about 95% effective bandwidth with adaptive routing and spraying against about 60% for "
    "static ECMP under flow collisions",
    "static ECMP hashes the all-to-all's 48 cross-leaf flows unevenly onto 4 uplinks that "
    "only an even spread fits: the busiest spine carries more, its queues drop, and the "
    "collective pays; sprayed packets (lossless: over the least-loaded uplinks) fill the line",
    "sprayed (lossless and hyperscale): busbw at least 80% of the line, busiest spine within "
    "1.1x the mean; static ECMP: busbw at most 70%, busiest spine at least 1.2x the mean",
    _spray_runs, _spray_judge)


CASES: Tuple[Case, ...] = (STRAGGLER, HOPS, LOSSY, VICTIMS, DCQCN, JOB, GO_BACK, QP_SCALING,
                          SPRAYING)


def by_name(names) -> List[Case]:
    """The cases named (all for none), in suite order; unknown names refused."""
    known = {c.name: c for c in CASES}
    unknown = [n for n in names or () if n not in known]
    if unknown:
        raise ConfigError(f"--case: unknown case {', '.join(unknown)} (cases: "
                          f"{', '.join(known)})")
    return [c for c in CASES if not names or c.name in names]
