"""Scenario tests as a user writes them: a question about fabrics, answered on real packets.

Each asks something the seed of this project asks (docs/guide.md, "Scenario tests"); run them with
``sudo .venv/bin/python -m pytest tests/scenarios -s`` (``-s`` shows the progress).
"""
import pytest

from testbed.api import ack_frame_bytes, roce_frame_bytes

pytestmark = [pytest.mark.scenario, pytest.mark.integration]


def test_oversubscription_costs_lossy_fabrics_retransmissions_not_lossless(testbed_run):
    """Does 2:1 oversubscription hurt ring all-reduce more on hyperscale than on lossless -
    and how much of that does hyperscale's ECN with DCQCN win back?"""
    result = testbed_run("oversubscribed", policies=["hyperscale", "lossless"],
                         workload={"iterations": 2},
                         policy_params={"hyperscale": {"ecn": "off"}})  # the bare variant
    bare, ll = result.policy("hyperscale"), result.policy("lossless")
    assert ll.drops == 0 and ll.retransmitted_packets == 0
    assert ll.pfc_pause_events > 0  # the uplinks filled; PFC held the senders back
    assert bare.drops > 0 and bare.retransmitted_packets > 0
    assert bare.pfc_pause_events is None  # no PFC on that fabric: absent, not zero
    assert bare.congestion_control == "none" and not bare.ecn_marked_packets
    assert ll.cct_us.p50 < bare.cct_us.p50
    hs = testbed_run("oversubscribed", policies=["hyperscale"],
                     workload={"iterations": 2}).policy("hyperscale")
    assert hs.congestion_control == "dcqcn" and hs.ecn_marked_packets > 0
    assert hs.drops < bare.drops / 10  # the senders slow down before the buffer fills
    assert hs.cct_us.p50 < bare.cct_us.p50


def test_a_straggler_idles_the_other_ranks(testbed_run):
    """What does one GPU running 40 us late cost the others, here and on 10,000 GPUs?

    The others wait for it; it also ends its own iteration a little before or after them, by
    what its place in the ring costs in path delay (-1.9 us here), which the arithmetic
    below leaves out: a delay of tens of microseconds keeps that under 5% of it."""
    result = testbed_run({"topology": {"leaves": 2},
                          "workload": {"size_bytes": 16384, "chunks": 1, "iterations": 6,
                                       "compute_us": 4,
                                       "stragglers": {"ranks": [2], "delay_us": 40}}},
                         policies=["hyperscale"])
    c = result.policy("hyperscale").collective()
    later = c.straggler_idle_us.per_iteration[1:]  # the modelled fabric's time
    assert sum(later) / len(later) == pytest.approx(3 * 40.0, rel=0.15)  # 3 ranks x 40 us
    assert c.extrapolation.gpus == 10_000
    # each of 9,999 others waits about 40 us of modelled time per step (80% of it at least)
    assert c.extrapolation.gpu_seconds_per_step_modelled > 9_999 * 32e-6


def test_an_incast_from_a_neighbouring_job_reaches_every_byte_and_slows_its_senders(
        testbed_run):
    """A neighbouring job's seven GPUs burst into one of theirs beside my ring: does every
    byte of both jobs arrive, who drops, and do the bursts' own RNICs slow down?"""
    result = testbed_run("incast", policies=["hyperscale", "lossless"],
                         workload={"iterations": 3})
    hs, ll = result.policy("hyperscale"), result.policy("lossless")
    for p in (hs, ll):
        ring, incast = p.jobs
        assert (ring.job.name, incast.job.name) == ("ring-512k", "incast-bursts")
        for job in (ring, incast):
            sent = job.job.bytes_sent_per_rank
            assert sent.measured == sent.expected
        assert sum(incast.job.bytes_sent_per_rank.measured.values()) == 7 * 3 * 32000
        # the bursts' queue crossed the marking threshold: the senders' RNICs got CNPs
        assert p.congestion_control == "dcqcn" and p.ecn_marked_packets > 0 and p.cnps_sent > 0
    assert ll.drops == 0 and ll.switch_queue_drops == 0


def test_a_latency_bound_ring_takes_the_modelled_path_delay_per_step(testbed_run):
    """Does cut-through show in a small all-reduce, where every step waits for the last?

    8 GPUs on 8 leaves, 64 KiB ring all-reduce without pipelining: 14 dependent steps of two
    frames, each across leaves, then the last step's ACK back. The model: per step the
    cross-leaf fixed path delay plus both frames' transmission. At 10 Mbit/s: every frame
    of a step crosses one CPU's Open vSwitch, which adds its forwarding per frame and hop to
    each step; 10,000x slower links keep that a few percent of the modelled step."""
    result = testbed_run({"topology": {"spines": 2, "leaves": 8, "gpus_per_leaf": 1,
                                       "host_rate_mbit": 10},
                          "workload": {"size_bytes": 65536, "chunks": 1, "iterations": 6,
                                       "compute_us": 2}},
                         policies=["hyperscale", "lossless"])
    frame_us = roce_frame_bytes(4096) * 8 / 100e3  # a full data frame at the modelled 100 Gbit/s
    ack_us = ack_frame_bytes() * 8 / 100e3
    cct, model = {}, {}
    for name in ("hyperscale", "lossless"):
        p = result.policy(name)
        assert p.fidelity.ok, p.fidelity.problems
        fixed = p.path_delay_us["cross_leaf"] - frame_us  # the frame's own aside
        model[name] = 14 * (fixed + 2 * frame_us) + fixed + ack_us
        cct[name] = p.collective().cct_us.p50
        assert cct[name] == pytest.approx(model[name], rel=0.15), name
    assert result.policy("lossless").per_hop_latency.forwarding == "cut_through"
    assert result.policy("hyperscale").per_hop_latency.forwarding == "store_and_forward"
    # cut-through's advantage is the model's: 14 + 1 paths' worth of store-and-forward
    margin = cct["hyperscale"] - cct["lossless"]
    assert margin == pytest.approx(model["hyperscale"] - model["lossless"], rel=0.15)


CREDIT = {"lossless": {"flow_control": "credit"}}
JOBS = "testbed/scenario/builtin/jobs"


def test_infiniband_credits_keep_an_incast_lossless_without_a_pause(testbed_run):
    """InfiniBand instead of RoCE's PFC: does an oversubscribed all-to-all still lose nothing,
    and do the senders wait for credits instead of being paused?"""
    result = testbed_run("oversubscribed", policies=["lossless"], policy_params=CREDIT,
                         transport={"congestion_control": "none"},
                         workload={"collective": "all_to_all", "iterations": 2})
    ib = result.policy("lossless")
    assert ib.drops == 0 and ib.switch_queue_drops == 0 and ib.retransmitted_packets == 0
    assert ib.pfc_pause_events is None  # no PFC: absent, not zero
    assert ib.credit_waits > 0 and ib.credit_wait_ms > 0
    queues = ib.switch_queues
    assert queues.credit and all(q["waits"] > 0 for q in queues.credit.values())
    peaks = [by_class["roce"] for by_class in queues.max_backlog.values()
             if "roce" in by_class]
    assert peaks and max(peaks) <= queues.credit_buffer_bytes  # never beyond the lane


def test_credits_spread_congestion_to_a_victim_as_pfc_does(testbed_run):
    """Under credits, does an incast into leaf 4 slow a ring on leaves 1-3 that never crosses
    its port - congestion spreading hop by hop, as with PFC?"""
    victim = {"file": f"{JOBS}/ring6.yaml", "ranks": [0, 1, 4, 5, 8, 9]}
    incast = {"file": f"{JOBS}/incast-heavy.yaml", "ranks": [2, 3, 6, 7, 10, 11, 14, 15]}
    common = dict(policies=["lossless"], policy_params=CREDIT,
                  transport={"congestion_control": "none"},
                  topology={"oversubscription": 0.5})  # uplinks with room to spare
    alone = testbed_run("incast", workload={"iterations": 3, "jobs": [victim]}, **common)
    both = testbed_run("incast", workload={"iterations": 3, "jobs": [victim, incast]},
                       **common)
    ring_alone = alone.policy("lossless").iteration_us.p50  # one job: its figures on top
    ib = both.policy("lossless")
    assert ib.drops == 0 and ib.pfc_pause_events is None
    assert ib.jobs[0].iteration_us.p50 > 2 * ring_alone  # the victim slowed
    waited = {q["node"] for q in ib.switch_queues.credit.values()}
    assert {"lf1", "lf2", "lf3"} & waited  # the victim's leaves waited: hop by hop


def test_ib_vs_roce_puts_credits_beside_pfc_and_dcqcn(testbed_run):
    """The seed's question as a built-in: InfiniBand's credits or RoCE's PFC (alone, and with
    DCQCN) under one incast beside a victim ring - each lossless, each in its own column."""
    from testbed.results.report import comparison

    result = testbed_run("ib-vs-roce", workload={"iterations": 2})
    labels = ["ib-credits", "roce-pfc", "roce-dcqcn"]
    assert list(result.policies) == labels
    ib, pfc, dcqcn = (result.policy(n) for n in labels)
    for p in (ib, pfc, dcqcn):
        assert p.policy == "lossless" and p.fidelity.ok, p.fidelity.problems
        assert p.drops == 0 and p.retransmitted_packets == 0
        assert [j.job.name for j in p.jobs] == ["ring6", "incast-heavy"]
    assert ib.params["flow_control"] == "credit" and ib.congestion_control == "none"
    assert ib.credit_waits > 0 and ib.pfc_pause_events is None
    assert pfc.pfc_pause_events > 0 and pfc.credit_waits is None
    # InfiniBand: CNPs in a lane with credits of their own; RoCE: PFC on the data class only
    assert {n: lane["flow_control"] for n, lane in ib.switch_queues.lanes.items()} == {
        "cnp": "credit", "roce": "credit"}
    assert {n: lane["flow_control"] for n, lane in pfc.switch_queues.lanes.items()} == {
        "roce": "pfc"}
    assert dcqcn.congestion_control == "dcqcn" and dcqcn.cnps_sent > 0
    assert dcqcn.pfc_paused_ms < pfc.pfc_paused_ms  # DCQCN keeps most pauses away
    header, rows = comparison(result)
    assert header[1:] == labels
    cells = {r[0]: r[1:] for r in rows}
    assert cells["credit waits"][1:] == ["-", "-"] and cells["credit waits"][0] != "-"
    assert cells["PFC pause events"][0] == "-" and "-" not in cells["PFC pause events"][1:]
    assert "-" not in cells["largest switch queue (KB)"]
    assert "job 1 (ring6): iteration p50 (ms)" in cells  # the victim, per mode
    with open(f"{result.run_dir}/report.html", encoding="utf-8") as f:
        page = f.read()
    assert all(label in page for label in labels)


def test_credits_hold_the_data_lane_and_never_the_cnps(testbed_run):
    """InfiniBand's lanes: while the RoCE lane waits for credits, does every CNP DCQCN sends
    still get through, its own lane never waiting?"""
    result = testbed_run("oversubscribed", policies=["lossless"], policy_params=CREDIT,
                         transport={"congestion_control": "dcqcn"},
                         workload={"collective": "all_to_all", "iterations": 2})
    ib = result.policy("lossless")
    assert ib.fidelity.ok, ib.fidelity.problems
    assert ib.drops == 0 and ib.credit_waits > 0
    lanes = ib.switch_queues.lanes
    assert lanes["roce"]["holds"] == ib.credit_waits and lanes["roce"]["held_ms"] > 0
    assert lanes["cnp"]["flow_control"] == "credit" and lanes["cnp"]["holds"] == 0
    assert ib.cnps_sent > 0 and ib.cnps_received == ib.cnps_sent  # none lost, none held
