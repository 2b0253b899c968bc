import pytest

from traffic import metrics


def test_percentiles():
    p = metrics.percentiles(list(range(1, 1001)))
    assert p["p50"] == pytest.approx(500.5)
    assert p["p99"] == pytest.approx(990.01)
    assert p["max"] == 1000 and p["count"] == 1000 and p["mean"] == pytest.approx(500.5)
    assert metrics.percentiles([]) is None


def test_latency_is_rx_minus_tx_in_microseconds():
    lat = metrics.latency_us([1_000, 2_000], [3_500, 2_250])
    assert list(lat) == [2.5, 0.25]


def test_cct_is_last_rank_done_minus_first_rank_start():
    steps = [
        {"iteration": 0, "start_ns": 1000, "end_ns": 5000},
        {"iteration": 0, "start_ns": 1200, "end_ns": 9000},  # slowest rank sets the end
        {"iteration": 1, "start_ns": 9000, "end_ns": 12000},
        {"iteration": 1, "start_ns": 9500, "end_ns": 11000},
    ]
    assert metrics.iteration_cct_us(steps) == [8.0, 3.0]
    s = metrics.cct_summary([8.0, 3.0])
    assert s["max"] == 8.0 and s["per_iteration"] == [8.0, 3.0]
    assert metrics.cct_summary([]) is None


def test_algbw():
    # 1 MiB in 1 ms = 8.39 Gbit/s
    assert metrics.algbw_gbps(1 << 20, 1000.0) == pytest.approx(8.388608)


def test_ipdv_is_the_difference_of_consecutive_one_way_delays():
    # RFC 3393 section 2.4: IPDV = D(i) - D(i-1)
    assert list(metrics.ipdv_us([10.0, 12.0, 11.0, 11.0])) == [2.0, -1.0, 0.0]
    j = metrics.jitter_summary([2.0, -1.0, 0.0], {"p50": 11.0, "p99": 12.0})
    assert j["ipdv_abs_max"] == 2.0 and j["ipdv_abs_p50"] == 1.0
    assert j["p99_minus_p50"] == 1.0
    assert metrics.jitter_summary([], None) is None


def test_tail_ratio_is_p99_over_p50():
    assert metrics.tail_ratio({"p50": 40.0, "p99": 100.0}) == 2.5
    assert metrics.tail_ratio(None) is None


def test_the_seeds_straggler_arithmetic():
    # docs/REFERENCE.md: a 40-45 us all-reduce on 10,000 GPUs with one 60 us straggler costs
    # 9,999 x ~20 us = about 0.2 GPU-seconds each time.
    import random
    rng = random.Random(7)
    finish = [rng.uniform(40.0, 45.0) for _ in range(9_999)] + [60.0]
    gpu_seconds = metrics.idle_us(finish) / 1e6
    assert 0.15 < gpu_seconds < 0.2
    assert gpu_seconds == pytest.approx(9_999 * (60 - 42.5) / 1e6, rel=0.01)


def test_straggler_idle_per_iteration_and_total():
    ready = {0: [1_000, 1_000, 6_000], 1: [0, 2_000, 2_000]}  # ns
    s = metrics.straggler_idle(ready)
    assert s["per_iteration"] == [10.0, 2.0] and s["total"] == 12.0 and s["mean"] == 6.0
    assert metrics.straggler_idle({}) is None


def test_extrapolation_to_more_gpus_scales_the_mean_lag():
    # 8 ranks, 35 us idle per iteration: 5 us per waiting rank; on 10,000 GPUs 9,999 wait
    e = metrics.extrapolate_idle(35.0, 8, 10_000, time_scale=2500.0)
    assert e["mean_lag_us_emulated"] == 5.0
    assert e["gpu_seconds_per_step_emulated"] == pytest.approx(9_999 * 5e-6)
    assert e["gpu_seconds_per_step_modelled"] == pytest.approx(9_999 * 5e-6 / 2500)
    same = metrics.extrapolate_idle(35.0, 8, 8)
    assert same["gpu_seconds_per_step_emulated"] == pytest.approx(35e-6)
