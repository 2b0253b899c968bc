"""Scenario tests as a user writes them: a question about fabrics, answered on real packets.

Each asks something the seed of this project asks (docs/guide.md, "Scenario tests"); run them with
``sudo .venv/bin/python -m pytest tests/scenarios -s`` (``-s`` shows the progress).
"""
import pytest

pytestmark = [pytest.mark.scenario, pytest.mark.integration]


def test_oversubscription_costs_lossy_fabrics_retransmissions_not_lossless(testbed_run):
    """Does 2:1 oversubscription hurt ring all-reduce more on hyperscale than on lossless?"""
    result = testbed_run("oversubscribed", policies=["hyperscale", "lossless"],
                         workload={"iterations": 2})
    hs, ll = result.policy("hyperscale"), result.policy("lossless")
    assert ll.drops == 0 and ll.retransmitted_packets == 0
    assert ll.pfc_pause_events > 0  # the uplinks filled; PFC held the senders back
    assert hs.drops > 0 and hs.retransmitted_packets > 0
    assert hs.pfc_pause_events is None  # no PFC on that fabric: absent, not zero
    assert ll.cct_us.p50 < hs.cct_us.p50


def test_a_straggler_idles_the_other_ranks(testbed_run):
    """What does one GPU running 2 us late cost the others, here and on 10,000 GPUs?"""
    result = testbed_run({"topology": {"leaves": 2},
                          "workload": {"size_bytes": 16384, "chunks": 1, "iterations": 6,
                                       "compute_us": 4,
                                       "stragglers": {"ranks": [2], "delay_us": 2}}},
                         policies=["hyperscale"])
    c = result.policy("hyperscale").collective()
    later = c.modelled.straggler_idle_us.per_iteration[1:]  # the modelled fabric's time
    assert sum(later) / len(later) == pytest.approx(3 * 2.0, rel=0.15)  # 3 ranks x 2 us
    assert c.extrapolation["gpus"] == 10_000
    # each of 9,999 others waits about 2 us of modelled time per step (80% of it at least)
    assert c.extrapolation["gpu_seconds_per_step_modelled"] > 9_999 * 1.6e-6


def test_incast_overflows_shallow_buffers_but_not_the_lossless_class(testbed_run):
    """Eight hosts burst into one GPU: who drops, and does the all-reduce notice?"""
    result = testbed_run("incast", policies=["hyperscale", "lossless"],
                         workload={"iterations": 3})
    hs, ll = result.policy("hyperscale"), result.policy("lossless")
    assert hs.switch_queue_drops > 0
    assert ll.drops == 0 and ll.switch_queue_drops == 0
    assert ll.background["incast"]["packets_received"] == ll.background["incast"]["packets_sent"]
