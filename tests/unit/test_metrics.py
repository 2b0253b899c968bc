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
