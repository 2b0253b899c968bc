import json

import pytest

from testbed import calibrate, runner, timescale
from testbed.config import Scenario
from testbed.errors import ConfigError
from testbed.timescale import AUTO, Calibration, choose, warning

POLICIES = ("enterprise", "hyperscale", "lossless")


def cal(busy=0.66, noise=90.0, allowed=208.6, machine="m"):
    return Calibration(machine=machine, cpus=2, measured="2026-12-02 16:24", gpus=8,
                       host_rate_mbit=40.0,
                       busy={"enterprise": busy - 0.03, "hyperscale": busy - 0.05,
                             "lossless": busy},
                       noise_us={p: noise for p in POLICIES}, allowed_us=allowed)


def test_auto_keeps_the_aggregate_rate_the_calibration_says_fits():
    c = cal()
    assert choose(AUTO, POLICIES, 8, c).host_rate_mbit == 40.0  # 8 x 45 would fit: step 40
    assert choose(AUTO, POLICIES, 64, c).host_rate_mbit == 5.0  # the same 320 Mbit/s
    busier = cal(busy=0.9)  # the same fabric keeps this machine 90% busy at 40 Mbit/s
    assert choose(AUTO, POLICIES, 8, busier).host_rate_mbit == 32.0
    assert choose(AUTO, POLICIES, 8, busier).predicted_busy <= timescale.TARGET_BUSY


def test_the_busiest_policy_decides_and_an_unmeasured_one_counts_as_the_busiest():
    c = cal(busy=0.9)
    assert choose(AUTO, ("hyperscale",), 8, c).host_rate_mbit == 32.0  # 0.85 at 40
    only_lossless = Calibration("m", 2, "t", 8, 40.0, busy={"lossless": 0.9})
    assert timescale.predicted_busy(only_lossless, ("new-policy",), 320) == pytest.approx(0.9)


def test_the_machines_own_delays_cap_the_rate_of_a_small_fabric():
    # 4 GPUs would fit 80 Mbit/s by CPU, but the tolerances (a quarter frame) shrink with the
    # rate while 90 us of timer lag does not: 40 x 208.6 / (90 x 1.5) = 61.8 -> step 50
    assert timescale.noise_limit_mbit(cal(), POLICIES) == pytest.approx(61.8, abs=0.1)
    assert choose(AUTO, POLICIES, 4, cal()).host_rate_mbit == 50.0
    assert choose(AUTO, POLICIES, 4, cal(noise=150.0)).host_rate_mbit == 32.0
    assert timescale.noise_limit_mbit(cal(noise=0.0), POLICIES) == float("inf")


def test_nothing_fits_gives_the_slowest_step():
    assert choose(AUTO, POLICIES, 4096, cal()).host_rate_mbit == timescale.RATE_STEPS[0]


def test_an_explicit_rate_is_kept_and_warned_about_when_it_exceeds_the_budget():
    over = choose(200.0, POLICIES, 8, cal())
    assert over.host_rate_mbit == 200.0 and over.chosen_by == "scenario"
    text = warning(over)
    assert "host_rate_mbit 200" in text and "330% of this machine's 2 CPUs" in text
    assert "40 Mbit/s would fit" in text
    assert warning(choose(20.0, POLICIES, 8, cal())) is None
    assert warning(choose(AUTO, POLICIES, 8, cal())) is None
    # within the CPU budget, beyond what the machine's delays allow
    small = choose(80.0, POLICIES, 4, cal())
    assert not small.over_budget and "too little room" in warning(small)
    assert "50 Mbit/s would fit" in warning(small)


def test_the_choice_is_recorded_with_its_calibration():
    d = choose(AUTO, POLICIES, 8, cal()).to_dict()
    assert d["host_rate_mbit"] == 40.0 and d["chosen_by"] == "auto" and d["warning"] is None
    assert d["target_busy"] == timescale.TARGET_BUSY and d["fits_mbit"] == 40.0
    assert Calibration.from_dict(d["calibration"]) == cal()
    assert "40 Mbit/s, 2,500x slower" in timescale.describe(choose(AUTO, POLICIES, 8, cal()),
                                                            100.0)


def test_a_calibration_with_impossible_shares_is_refused():
    bad = dict(cal().to_dict(), busy={"lossless": 1.5})
    with pytest.raises(ValueError, match="busy shares"):
        Calibration.from_dict(bad)


def test_the_cached_calibration_is_this_machines_only(tmp_path):
    path = str(tmp_path / "calibration.json")
    assert calibrate.load(path) is None
    mine = cal(machine=calibrate.machine_key())
    with open(path, "w") as f:
        json.dump(mine.to_dict(), f)
    assert calibrate.load(path) == mine
    for other in (dict(mine.to_dict(), machine="elsewhere"), dict(mine.to_dict(), version=1)):
        with open(path, "w") as f:
            json.dump(other, f)
        assert calibrate.load(path) is None
    with open(path, "w") as f:
        f.write("{not json")
    assert calibrate.load(path) is None


def test_the_scenario_says_auto_or_a_number():
    s = Scenario.from_dict({"topology": {"host_rate_mbit": "auto"}})
    assert s.topology.host_rate_mbit == AUTO
    with pytest.raises(ConfigError, match="must be a number or auto, got 'fast'"):
        Scenario.from_dict({"topology": {"host_rate_mbit": "fast"}})
    with pytest.raises(ConfigError, match=">= 0.1"):
        Scenario.from_dict({"topology": {"host_rate_mbit": 0}})
    s = Scenario.from_dict({"topology": {"host_rate_mbit": 25}})
    assert s.topology.fabric_rate_mbit == 25.0 and s.time_scale == pytest.approx(4000)


def test_the_runner_applies_auto_and_only_checks_an_explicit_rate():
    said = []
    s, choice = runner.choose_time_scale(Scenario(), said.append, calibration=cal())
    assert s.topology.host_rate_mbit == 40.0 == s.topology.fabric_rate_mbit
    assert choice.chosen_by == "auto" and said[0].startswith("time scale: GPU NICs at 40")
    said.clear()
    fast = Scenario.from_dict({"topology": {"host_rate_mbit": 200}})
    s, choice = runner.choose_time_scale(fast, said.append, calibration=cal())
    assert s is fast and choice.chosen_by == "scenario"
    assert said[1].startswith("warning: topology.host_rate_mbit 200")
    over = Scenario.from_dict({"topology": {"oversubscription": 2}})
    s, _ = runner.choose_time_scale(over, said.append, calibration=cal())
    assert s.topology.fabric_rate_mbit == 20.0  # 40 x 2 per leaf / (2 spines x 2)
