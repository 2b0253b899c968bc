"""The fidelity monitor's checks, on hand-made timelines."""
from dataclasses import replace

import numpy as np
import pytest

from testbed.base.frames import full_frame_bytes
from testbed.results.model import (AgentLoopLag, CpuCheck, FidelityChecks, InterDequeueCheck,
                                   LagCheck, TimerLag)
from testbed.run import fidelity as F
from testbed.scenario.config import Scenario
from testbed.base.topology import FabricPlan

RATE = 40e6
FRAME = full_frame_bytes(4096)  # bytes: 4 KiB RoCE payload + headers
SER_US = FRAME * 8 / 40  # 834 us at 40 Mbit/s


def _ideal_link(arrivals_us, sizes, rate=RATE):
    """Departure times of an ideal FIFO serializer."""
    out, free = [], float("-inf")
    for a, s in zip(arrivals_us, sizes):
        dep = max(a, free)
        out.append(dep)
        free = dep + s * 8e6 / rate
    return out


def test_a_backlogged_ideal_link_has_no_deviation():
    arrivals = [0.0] * 50  # all queued at once
    tx = _ideal_link(arrivals, [FRAME] * 50)
    d, _ = F.busy_gap_deviation([int(a * 1000) for a in arrivals], [int(t * 1000) for t in tx],
                             [FRAME] * 50, RATE, SER_US)
    assert d.size == 49 and np.abs(d).max() < 1e-3
    assert F.inter_dequeue_check(d, 0.1, 0.9).ok


def test_frames_leaving_early_are_caught():
    tx = [i * SER_US * 0.5 for i in range(20)]  # a link twice too fast
    d, _ = F.busy_gap_deviation([0] * 20, [int(t * 1000) for t in tx], [FRAME] * 20, RATE, SER_US)
    c = F.inter_dequeue_check(d, 0.1, 0.9)
    assert not c.ok and c.deviation_p50 == pytest.approx(-0.5, abs=1e-3)


def test_gaps_of_an_idle_link_do_not_count():
    # each frame arrives long after the previous one left: the link was never busy
    arrivals = [i * 5000.0 for i in range(10)]
    d, _ = F.busy_gap_deviation([int(a * 1000) for a in arrivals],
                             [int(a * 1000) + 5000 for a in arrivals], [FRAME] * 10, RATE, SER_US)
    assert d.size == 0
    assert F.inter_dequeue_check(d, 0.1, 0.9).ok is None


def test_an_ack_followed_back_to_back_costs_a_small_fraction_of_a_frame():
    # a 62 B ACK (12 us) and a data frame sent 2 us after it: 10 us early = 1% of a frame
    sent = [0, 1000, 2000]
    tx = [0, 2000, 2000 + int(SER_US * 1000)]
    d, _ = F.busy_gap_deviation(sent, tx, [62, FRAME, FRAME], RATE, SER_US)
    assert list(np.round(d, 3)) == [-0.012, 0.0]


def test_a_gap_pfc_paused_is_left_out_and_counted():
    # a backlog; PFC pauses the NIC between frames 4 and 5 for ten frame times
    tx = [i * SER_US for i in range(5)] + [(i + 10) * SER_US for i in range(5, 10)]
    pause = (int(4.5 * SER_US * 1000), int(14.5 * SER_US * 1000))
    tx_ns = [int(t * 1000) for t in tx]
    d, _ = F.busy_gap_deviation([0] * 10, tx_ns, [FRAME] * 10, RATE, SER_US)
    assert d.size == 9 and d.max() == pytest.approx(10.0, abs=1e-3)  # without the pause
    d, left_out = F.busy_gap_deviation([0] * 10, tx_ns, [FRAME] * 10, RATE, SER_US, [pause])
    assert left_out == 1 and d.size == 8 and np.abs(d).max() < 1e-3


def test_gaps_overlap_spans_only_where_they_meet():
    spans = [(10, 20), (30, 40)]
    start = np.array([0, 5, 12, 20, 21, 39, 41])
    end = np.array([5, 10, 15, 30, 29, 50, 60])
    assert list(F.overlaps_a_span(start, end, spans)) == [False, False, True, False, False,
                                                          True, False]
    assert not F.overlaps_a_span(start, end, []).any()


def test_idle_path_overhead_is_the_excess_over_the_model():
    minima = {(0, 1): 150.0, (1, 2): 250.0, (2, 0): 200.0}
    excess = {(0, 1): 50.0, (1, 2): 50.0, (2, 0): 100.0}
    c = F.idle_path_check(minima, excess, allowed_us=80.0)
    assert c.overhead_us == 50.0 and c.overhead_us_worst == 100.0 and c.ok
    assert not F.idle_path_check(minima, dict.fromkeys(minima, 90.0), allowed_us=80.0).ok


def test_an_incasts_pairs_count_as_their_one_destination():
    """Measured (ib-vs-roce, PFC alone, 20 Mbit/s): six ring pairs 8-251 us over the model,
    the seven pairs of an incast into gpu16 779-12,003 us - they queue behind its port for
    the whole run. Per pair the median is an incast pair's; per destination, a ring's."""
    ring = {(0, 1): 8.3, (1, 4): 114.2, (4, 5): 7.7, (5, 8): 59.9, (8, 9): 8.0, (9, 0): 250.5}
    incast = {(2, 15): 12002.6, (3, 15): 8799.0, (6, 15): 1014.5, (7, 15): 2145.7,
              (10, 15): 5624.9, (11, 15): 3944.4, (14, 15): 778.8}
    excess = {**ring, **incast}
    c = F.idle_path_check(excess, excess, allowed_us=417.0)
    assert c.ok and c.paths == 13 and c.destinations == 7
    assert c.overhead_us == 59.9 and c.overhead_us_worst == 12002.6
    # a forwarding cost every path pays still fails, however the pairs fall
    slow = {k: v + 400.0 for k, v in excess.items()}
    assert not F.idle_path_check(slow, slow, allowed_us=417.0).ok


def test_where_no_path_is_idle_the_switches_forwarding_time_is_what_the_emulator_adds():
    """The default job under enterprise: every frame across leaves shares one spine, so the
    lowest latency into each GPU carries queueing (263-322 us over the model at 32 Mbit/s,
    261 allowed). Measured per hop in the kernel, the switches add 3 x their floor (a tenth
    of hops took less)."""
    minima = {(0, 2): 610.0, (2, 4): 640.0, (4, 6): 590.0, (6, 0): 620.0}
    excess = {k: v - 300.0 for k, v in minima.items()}  # 290-340 us: all queueing
    calm = {"hops": 90_000, "bucket_us": 2.0, "p10_us": 20.0, "p50_us": 30.0, "p90_us": 60.0,
            "p99_us": 200.0}
    c = F.idle_path_check(minima, excess, allowed_us=261.0, forwarding=calm, hops=3)
    assert c.ok and c.overhead_from == "forwarding" and c.overhead_us == 60.0
    assert c.floor_overhead_us == 315.0  # what the floor alone would have said
    loaded = dict(calm, p10_us=100.0, p50_us=150.0)  # Open vSwitch woken late: every hop pays
    c = F.idle_path_check(minima, excess, allowed_us=261.0, forwarding=loaded, hops=3)
    assert not c.ok and c.overhead_us == 300.0
    problem = F.verdict(FidelityChecks(idle_path_latency=c), 32.0).problems[0]
    assert "forwarding adds 300 us to a path of 3 hops (a tenth of hops took under 100 us)" \
        in problem
    # without the kernel's measurement, the floor stands for it
    assert F.idle_path_check(minima, excess, allowed_us=261.0).overhead_from == \
        "latency floor"


def test_a_histogram_of_forwarding_times_gives_percentiles_at_the_buckets_upper_edge():
    from testbed.fabric.bpfforward import BUCKET_NS, summary, summary_of

    counts = [0] * 4096
    counts[10], counts[20], counts[4095] = 50, 49, 1  # 20-22 us, 40-42 us, 8 ms or more
    s = summary(counts)
    assert s["hops"] == 100 and s["bucket_us"] == BUCKET_NS / 1000
    assert (s["p10_us"], s["p50_us"], s["p90_us"], s["p99_us"]) == (22.0, 22.0, 42.0, 42.0)
    assert summary_of({"10": 50, "20": 49, "4095": 1}) == s
    assert summary_of(None) is None and summary([0] * 4096) is None


def test_a_floor_below_the_model_is_a_delay_not_applied():
    minima = {(0, 1): 10.0, (1, 0): 12.0, (0, 2): 9.0}
    c = F.idle_path_check(minima, {(0, 1): 5.0, (1, 0): 6.0, (0, 2): -200.0}, allowed_us=80.0)
    assert not c.ok and c.overhead_us_lowest == -200.0
    assert "not applied" in F.verdict(FidelityChecks(idle_path_latency=c), 40.0).problems[0]


def test_cpu_and_lag_checks():
    assert F.cpu_check([0.5] * 9 + [1.0], 0.9).ok
    assert not F.cpu_check([0.95] * 10, 0.9).ok
    assert F.cpu_check([], 0.9).ok is None
    lag = AgentLoopLag(count=100, p50_us=5.0, p95_us=50.0, p99_us=900.0, max_us=2000.0)
    assert F.lag_check(lag, 100.0).ok
    assert not F.lag_check(replace(lag, p95_us=150.0), 100.0).ok
    assert F.lag_check(None, 100.0).ok is None


def test_verdict_lists_problems_and_advises_a_lower_rate():
    checks = FidelityChecks(cpu=CpuCheck(ok=False, busy_p90=0.99, allowed_busy_p90=0.9),
                            inter_dequeue=InterDequeueCheck(ok=True),
                            agent_loop_lag=LagCheck(ok=None))
    v = F.verdict(checks, host_rate_mbit=40.0)
    assert v.verdict == "outside tolerance" and len(v.problems) == 1
    assert "saturated" in v.problems[0] and "e.g. 20" in v.advice
    ok = F.verdict(FidelityChecks(cpu=CpuCheck(ok=True)), 40.0)
    assert ok.ok and "advice" not in ok.to_json()


def test_evaluate_reads_the_agents_tx_files(tmp_path):
    plan = FabricPlan(1, 1, 2)
    tx = _ideal_link([0.0] * 10, [FRAME] * 10)
    for h in plan.gpus:
        with open(tmp_path / f"{h.name}.tx.csv", "w") as f:
            f.write("sent_ns,tx_ns,bytes,kind\n")
            for t in tx:
                f.write(f"0,{int(t * 1000)},{FRAME},d\n")
    figures = {"unexplained_drops": 0, "agent_loop_lag_us": None}
    out = F.evaluate(str(tmp_path), plan, figures, {(0, 1): 60.0}, {(0, 1): 60.0}, [0.3, 0.4],
                     Scenario.from_dict({}).for_checks(), {})
    assert out.checks.inter_dequeue.busy_gaps == 18
    # the NIC's bucket: a twentieth of a 4,110-byte frame, 205 B at 40 Mbit/s
    assert out.checks.inter_dequeue.shaper_run_ahead_us_max == pytest.approx(41.0)
    assert out.verdict == "ok"


def test_cpu_sampler_measures_a_busy_cpu():
    import time
    with F.CpuSampler(interval_s=0.02) as s:
        deadline = time.monotonic() + 10
        while len(s.samples) < 3 and time.monotonic() < deadline:
            pass  # keep one CPU busy
    assert len(s.samples) >= 3
    assert all(0.0 <= x <= 1.0 for x in s.samples) and max(s.samples) > 0


def test_a_late_run_names_the_kind_of_timer_with_the_latest_tail():
    lag = AgentLoopLag(count=10, p50_us=10.0, p95_us=251.0, p99_us=400.0, max_us=500.0,
                       by_timer={"compute": TimerLag(8, 5.0, 10.0, 20.0),
                                 "dcqcn": TimerLag(2, 300.0, 400.0, 500.0)})
    check = F.lag_check(lag, 209.0)
    assert not check.ok and check.by_timer == lag.by_timer
    v = F.verdict(FidelityChecks(agent_loop_lag=check), host_rate_mbit=40.0)
    assert "latest: dcqcn timers (p95 400 us of 2)" in v.problems[0]


def test_the_monitors_checks_are_declared_records_that_round_trip_through_json():
    """What evaluate writes (testbed.run.fidelity) is what results.json's readers declare
    (testbed.results.model): every figure of every check loads strictly, reads as an
    attribute, and is written back as it was; a figure the check could not measure (None)
    is left out."""
    import json

    from testbed.results.model import Fidelity
    from testbed.run import fidelity as F

    inter = replace(F.inter_dequeue_check([0.01, -0.02, 0.5], 0.1, 0.5), paused_gaps_left_out=0,
                    shaper_burst_bytes=3000, shaper_run_ahead_us_max=12.0)
    lag = AgentLoopLag(count=3, p50_us=1.0, p95_us=2.0, p99_us=3.0, max_us=4.0,
                       by_timer={"rto": TimerLag(1, 1.0, 2.0, 2.0)})
    checks = FidelityChecks(
        inter_dequeue=inter,
        idle_path_latency=F.idle_path_check({(0, 1): 10.0}, {(0, 1): 1.0}, 50.0,
                                            {"p10_us": 2.0, "hops": 9}, 3),
        cpu=F.cpu_check([0.2, 0.95, 0.97], 0.9), agent_loop_lag=F.lag_check(lag, 50.0),
        emulator_drops=F.drops_check(0))
    section = json.loads(json.dumps(F.verdict(checks, 40.0).to_json()))
    typed = Fidelity.from_json(section, "fidelity", strict=True)
    assert not typed.ok and typed.checks.cpu.ok is False and len(typed.problems) == 1
    assert typed.checks.cpu.busy_p90 == section["checks"]["cpu"]["busy_p90"]
    assert typed.checks.idle_path_latency.overhead_us == 6.0  # the hop floor x 3 hops
    assert typed.checks.agent_loop_lag.by_timer["rto"].count == 1
    written = json.loads(json.dumps(typed.to_json()))
    for name, check in section["checks"].items():
        assert written["checks"][name] == {k: v for k, v in check.items()
                                           if v is not None or k == "ok"}, name
    unmeasured = Fidelity.from_json(json.loads(json.dumps(F.verdict(
        FidelityChecks(cpu=F.cpu_check([], 0.9)), 40.0).to_json())), strict=True)
    assert unmeasured.checks.cpu.ok is None and unmeasured.checks.cpu.samples == 0
    assert [name for name, _c in unmeasured.checks.items()] == ["cpu"]
