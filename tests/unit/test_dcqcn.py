"""DCQCN against a trajectory computed by hand from the paper's rules."""
import pytest

from traffic.dcqcn import NotificationPoint, Parameters, ReactionPoint

LINE = 40e6


def params(**kw):
    base = dict(line_rate_bps=LINE, g=1 / 256, alpha_timer_ns=1000, rate_timer_ns=1000,
                byte_counter=10_000, fast_recovery_steps=5, rai_bps=40e3, rhai_bps=400e3)
    base.update(kw)
    return Parameters(**base)


def test_cnp_cuts_the_rate_by_half_alpha_and_raises_alpha():
    rp = ReactionPoint(params(clamp_target=True))  # the paper's rule: every CNP sets the target
    rp.on_cnp(0)
    alpha = (1 - 1 / 256) * 1.0 + 1 / 256  # = 1
    assert rp.alpha == pytest.approx(alpha)
    assert rp.rate == pytest.approx(LINE * (1 - alpha / 2))  # 20 Mb/s
    assert rp.target == LINE
    rp.on_cnp(10)
    assert rp.target == pytest.approx(20e6)
    assert rp.rate == pytest.approx(20e6 * (1 - rp.alpha / 2))


def test_cnps_in_a_row_cut_the_rate_but_not_the_target_until_a_timer_raised_it():
    rp = ReactionPoint(params())  # ConnectX's default (clamp_tgt_rate 0)
    rp.on_cnp(0)
    rp.on_cnp(10)
    rp.on_cnp(20)
    assert rp.target == LINE and rp.rate == pytest.approx(LINE / 8)
    rp.tick(20 + 1000)  # one timer event: fast recovery, halfway back to the target
    assert rp.rate == pytest.approx((LINE + LINE / 8) / 2)
    rp.on_cnp(1030)  # after a timer increase the target follows the rate down again
    assert rp.target == pytest.approx((LINE + LINE / 8) / 2)


def test_the_kept_target_brings_the_rate_back_sooner_after_a_run_of_cnps():
    def recovered_by(clamp: bool) -> int:
        rp = ReactionPoint(params(clamp_target=clamp, byte_counter=10**12))
        for t in range(6):
            rp.on_cnp(t)
        t = 5
        while rp.rate < 0.9 * LINE:
            t += 1000
            rp.tick(t)
        return t
    assert recovered_by(False) <= 5 * 1000 < recovered_by(True) / 10


def test_recovery_trajectory_fast_then_additive_then_hyper():
    rp = ReactionPoint(params(byte_counter=10**12))  # timer events only
    rp.on_cnp(0)  # rate 20 Mb/s, target 40
    rate, target, alpha = 20e6, 40e6, 1.0
    expected = []
    for t in range(1, 9):  # timer fires at 1000, 2000, ... ns
        alpha *= 1 - 1 / 256  # the alpha timer has the same period here
        if t < 5:  # fast recovery: target stays
            pass
        else:  # T >= F, BC = 0 < F: additive increase
            target = min(LINE, target + 40e3)
        rate = min(LINE, (target + rate) / 2)
        expected.append(rate)
    got = []
    for t in range(1, 9):
        rp.tick(t * 1000)
        got.append(rp.rate)
    assert got == pytest.approx(expected)
    assert rp.alpha == pytest.approx(alpha)


def test_hyper_increase_needs_both_counters_past_f():
    rp = ReactionPoint(params(line_rate_bps=1e9, rai_bps=1e3, rhai_bps=1e6))
    rp.on_cnp(0)  # rate 500 Mb/s, target 1 Gb/s
    for i in range(5):
        rp.on_sent(10_000, i * 100)  # byte events 1..5
    for t in range(1, 6):
        rp.tick(t * 1000)  # timer events 1..5
    # T = 5 and BC = 5 are both >= F: the next event is a hyper increase
    rp.target = 600e6  # pretend the target had dropped, to see the step
    before = rp.rate
    rp.on_sent(10_000, 5_500)  # BC = 6: i = min(5, 6) - 5 + 1 = 1
    assert rp.target == pytest.approx(600e6 + 1e6)
    assert rp.rate == pytest.approx((601e6 + before) / 2)


def test_rates_stay_between_the_minimum_and_the_line_rate():
    rp = ReactionPoint(params())
    for t in range(60):
        rp.on_cnp(t)
    assert rp.rate == pytest.approx(LINE / 1000)
    assert rp.history[0] == (0, LINE) and rp.history[-1][1] == rp.rate
    for t in range(1, 3000):
        rp.tick(60 + t * 1000)
    assert rp.rate == LINE and not rp.congested  # recovered: timers stop


def test_emulated_parameters_and_rates_relative_to_the_line():
    p = Parameters.emulated(40e6, timer_ns=20_000_000, byte_counter=256_000,
                            cnp_interval_ns=20_000_000)
    assert p.alpha_timer_ns == p.rate_timer_ns == p.cnp_interval_ns == 20_000_000
    assert p.byte_counter == 256_000 and p.g == 1 / 256 and p.fast_recovery_steps == 5
    assert p.rai == 40e3 and p.rhai == 400e3 and p.min_rate == 40e3


def test_notification_point_sends_at_most_one_cnp_per_interval():
    np_ = NotificationPoint(interval_ns=1000)
    sent = [np_.on_ce(t) for t in (0, 100, 999, 1000, 1500, 2100)]
    assert sent == [True, False, False, True, False, True]
    assert np_.cnps_sent == 3 and np_.ce_seen == 6
