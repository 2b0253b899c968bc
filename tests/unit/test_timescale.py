import dataclasses
import json
import os

import pytest

from testbed.run import calibrate, runner
from testbed.scenario import timescale
from testbed.scenario.config import Scenario
from testbed.base.errors import ConfigError
from testbed.results.model import PolicyResult, RunResult
from testbed.scenario.timescale import AUTO, Calibration, choose, warning

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


def test_a_workload_whose_bytes_cross_more_switches_than_the_ring_s_runs_slower():
    """Open vSwitch forwards a frame once per switch: the default job's bytes all cross the
    spines (3 switches), the calibrated ring's half of them (2 on average). With half the
    ring's CPU in Open vSwitch, the job costs 1.25x the ring per NIC byte."""
    c = dataclasses.replace(cal(), ovs_share={p: 0.5 for p in POLICIES}, hops=2.0)
    assert timescale.load_factor(c, "lossless", 3.0) == pytest.approx(1.25)
    assert timescale.load_factor(c, "lossless", 2.0) == 1.0 and \
        timescale.load_factor(c, "lossless", None) == 1.0
    assert choose(AUTO, POLICIES, 8, c, hops=2.0).host_rate_mbit == 40.0  # the ring itself
    job = choose(AUTO, POLICIES, 8, c, hops=3.0)  # 0.66 x 1.25 = 0.83 at 40
    assert job.host_rate_mbit == 32.0 and job.predicted_busy <= timescale.TARGET_BUSY
    assert job.to_dict()["workload_hops"] == 3.0
    # a calibration from before the share was measured predicts as it did
    assert choose(AUTO, POLICIES, 8, cal(), hops=3.0).host_rate_mbit == 40.0


def test_the_switches_a_workload_s_bytes_cross():
    from testbed.job.plan import switch_hops
    from testbed.scenario.catalog import find
    assert switch_hops(find("ring")) == 2.0  # neighbours: one inside a leaf, the next across
    assert switch_hops(find("default")) == 3.0  # data parallel across servers, one per leaf
    assert switch_hops(find("3d-64")) == 1.0  # rails: a rail's GPUs share their leaf


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
    for other in (dict(mine.to_dict(), machine="elsewhere"), dict(mine.to_dict(), version=2)):
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


def test_time_constants_are_the_modelled_fabrics_and_scale_with_the_run():
    from testbed.run.agent_processes import agent_configs, transport_config
    from .decided import decided
    from testbed.base.topology import FabricPlan

    plan = FabricPlan(2, 4, 2)
    spec = {"transport": {"rto_us": 100, "dcqcn_timer_us": 8, "cnp_interval_us": 8},
            "workload": {"compute_us": 8, "stragglers": {"ranks": [1], "delay_us": 2}}}
    at = {}
    for rate in (40, 20):
        s = Scenario.from_dict(spec).with_host_rate(rate)
        t = transport_config(decided("lossless", plan, s))
        cfg = agent_configs(decided("lossless", plan, s), "/tmp/x")[1]
        at[rate] = (t.rto_ns, t.dcqcn_timer_ns, t.cnp_interval_ns,
                    cfg.compute.ns, cfg.straggler.delay_ns)
    assert at[40] == (250_000_000, 20_000_000, 20_000_000, 20_000_000, 5_000_000)
    assert at[20] == tuple(2 * v for v in at[40])  # half the rate: twice the emulated time
    s = Scenario.from_dict({"background": {"noisy_neighbour": {"rate_gbit": 37.5}}})
    assert s.with_host_rate(40).emulated_mbit(37.5) == 15.0


def test_a_scenario_in_the_old_emulated_units_is_refused_with_the_new_key():
    for old, new in ((("transport", "rto_ms"), "transport.rto_us"),
                     (("workload", "compute_ms"), "workload.compute_us"),
                     (("background", "incast", "bursts_per_s"), "background.incast.period_us")):
        data = value = {}
        for part in old[:-1]:
            value[part] = {}
            value = value[part]
        value[old[-1]] = 5
        with pytest.raises(ConfigError, match=f"now {new} in the modelled fabric's units"):
            Scenario.from_dict(data)


def test_the_run_names_the_constants_it_cannot_scale():
    at_40 = Scenario.from_dict({"policies": ["hyperscale"]}).with_host_rate(40)
    assert at_40.unscaled_constants() == []  # 1 ms sampling is the modelled 0.4 us
    # the senders mark flowlets in modelled time; only without them the idle timeout decides
    assert len(Scenario.from_dict({}).with_host_rate(1000).unscaled_constants()) == 1
    fast = Scenario.from_dict({"policy_params": {"lossless": {"flowlet_gap_us": 0,
                                                              "flowlet_gap_s": 2}}})
    notes = fast.with_host_rate(1000).unscaled_constants()
    assert notes[0].startswith("the switch-queue emulator samples every 200 us (its floor), "
                               "2 us modelled instead of 0.4")
    assert "idle timeout of 2 s" in notes[1] and "20,000 us modelled" in notes[1]


def test_each_calibration_round_gives_busy_share_and_delay_per_policy():
    def policy(share, lag, idle, ovs_s):
        return {"emulation_cost": {"busy_share": share, "total_cpu_s": 20.0,
                                   "cpu_s": {"open_vswitch": ovs_s, "agents": 20.0 - ovs_s}},
                "fidelity": {"checks": {"agent_loop_lag": {"p95_us": lag,
                                                           "allowed_p95_us": 208.6},
                                        "idle_path_latency": {"overhead_us": idle}}}}
    def run(policies):
        return RunResult.from_json("run", {"scenario": {}, "policies": policies})
    got = calibrate.round_figures(run({"hyperscale": policy(0.61, 31.6, 83.2, 10.0),
                                       "lossless": policy(0.66, 250.0, 90.0, 9.0)}))
    assert got == {"hyperscale": (0.61, 83.2, 208.6, 0.5), "lossless": (0.66, 250.0, 208.6, 0.45)}
    with pytest.raises(Exception, match="no CPU share"):
        calibrate.round_figures(run({"lossless": {"emulation_cost": {}}}))


def test_a_calibration_keeps_each_policys_quietest_round_and_busiest_switch(tmp_path,
                                                                           monkeypatch):
    rounds = iter([{"hyperscale": (0.6, 40.0, 208.6, 0.5), "lossless": (0.7, 90.0, 208.6, 0.4)},
                   {"hyperscale": (0.5, 60.0, 208.6, 0.6), "lossless": (0.8, 70.0, 0.0, 0.3)},
                   {"hyperscale": (0.7, 50.0, 0.0, 0.4), "lossless": (0.9, 80.0, 0.0, 0.5)}])
    monkeypatch.setattr(calibrate, "ROUNDS", 3)
    monkeypatch.setattr(calibrate, "wait_quiet", lambda progress: 0.05)
    monkeypatch.setattr(runner, "run", lambda *a, **k: None)
    monkeypatch.setattr(calibrate, "round_figures", lambda result: next(rounds))
    got = calibrate.measure(path=str(tmp_path / "calibration.json"))
    assert got.busy == {"hyperscale": 0.5, "lossless": 0.7}
    assert got.noise_us == {"hyperscale": 40.0, "lossless": 70.0}
    assert got.ovs_share == {"hyperscale": 0.6, "lossless": 0.5}
    assert got.allowed_us == 208.6 and got.busy_before == 0.05


def test_calibrate_if_missing_keeps_the_machines_calibration(tmp_path, monkeypatch, capsys):
    from testbed.cli import main
    mine = cal(machine=calibrate.machine_key())
    monkeypatch.setattr(calibrate, "load", lambda path=None: mine)
    monkeypatch.setattr(calibrate, "measure", lambda *a, **k: pytest.fail("measured again"))
    assert main(["calibrate", "--if-missing", "--quiet"]) == 0
    assert "ring: 8 GPUs at auto run at 40 Mbit/s" in capsys.readouterr().out


def _fidelity(**failed):
    """A policy's fidelity section with the given checks failed (name -> figures)."""
    checks = {name: dict(figures, ok=False) for name, figures in failed.items()}
    checks.setdefault("cpu", {"ok": True})
    return {"verdict": "outside tolerance" if failed else "ok", "checks": checks,
            "problems": [f"{name} failed" for name in failed]}


def test_a_rejected_run_asks_for_the_rate_its_own_figures_say_fits():
    idle = _fidelity(idle_path_latency={"overhead_us": 487.0, "allowed_overhead_us": 208.6})
    # the machine's delay is absolute: 40 x 208.6 / 487 = 17.1 -> step 16
    assert timescale.retry_rate(40.0, {"hyperscale": idle["checks"]}) == 16.0
    lag = _fidelity(agent_loop_lag={"p95_us": 631.0, "allowed_p95_us": 208.6})
    assert timescale.retry_rate(40.0, {"lossless": lag["checks"]}) == 10.0  # 13.2
    cpu = _fidelity(cpu={"busy_p90": 0.95, "allowed_busy_p90": 0.9})
    assert timescale.retry_rate(40.0, {"lossless": cpu["checks"]}) == 20.0  # the load: half
    # the slowest asked
    assert timescale.retry_rate(40.0, {"a": lag["checks"], "b": cpu["checks"]}) == 10.0
    # delays measured on saturated CPUs are the load's: half the rate, not 40 x 208.6 / 1,900
    both = _fidelity(cpu={"busy_p90": 1.0}, agent_loop_lag={"p95_us": 1259.0,
                                                             "allowed_p95_us": 208.6})
    assert timescale.retry_rate(40.0, {"lossless": both["checks"]}) == 20.0
    # a delay just over the tolerance still asks for a slower step, never the same rate
    near = _fidelity(agent_loop_lag={"p95_us": 210.0, "allowed_p95_us": 208.6})
    assert timescale.retry_rate(40.0, {"x": near["checks"]}) == 32.0
    assert timescale.retry_rate(40.0, {"x": _fidelity()["checks"]}) is None  # nothing rejected
    # no slower step
    assert timescale.retry_rate(timescale.RATE_STEPS[0], {"x": cpu["checks"]}) is None
    assert timescale.retry_rate(1.0, {"x": lag["checks"]}) == timescale.RATE_STEPS[0]


def test_a_rate_is_learned_once_a_scenario_was_rejected_in_two_runs():
    learn = timescale.learn
    once = learn({}, 16.0, first=True, capped=False)
    assert once == {"cap_mbit": 16.0, "rejected_runs": 1}
    assert timescale.learned_cap({"lossless": once}, POLICIES) is None  # maybe a passing load
    retried = learn(once, 8.0, first=False, capped=False)  # its retry was rejected too
    assert retried == {"cap_mbit": 8.0, "rejected_runs": 1}
    twice = learn(retried, 10.0, first=True, capped=False)
    assert twice == {"cap_mbit": 8.0, "rejected_runs": 2}
    assert timescale.learned_cap({"lossless": twice}, POLICIES) == 8.0
    assert timescale.learned_cap({"lossless": twice}, ("hyperscale",)) is None
    # passing at the kept rate says nothing of faster ones; passing at the calibration's does
    assert learn(twice, None, first=True, capped=True) == twice
    assert learn(twice, None, first=False, capped=False) == twice
    assert learn(twice, None, first=True, capped=False) == {"cap_mbit": 8.0, "rejected_runs": 1}
    assert learn(once, None, first=True, capped=False) == {"cap_mbit": None, "rejected_runs": 0}
    entries = {"lossless": twice, "hyperscale": {"cap_mbit": 4.0, "rejected_runs": 3}}
    assert timescale.learned_cap(entries, POLICIES) == 4.0
    capped = choose(AUTO, POLICIES, 8, cal(), cap_mbit=10.0)
    assert capped.host_rate_mbit == 10.0 and capped.fits_mbit == 10.0
    assert "as earlier runs of this scenario here asked for" in timescale.describe(capped, 100.0)
    assert choose(AUTO, POLICIES, 8, cal(), cap_mbit=64.0).host_rate_mbit == 40.0
    assert choose(80.0, POLICIES, 8, cal(), cap_mbit=10.0).host_rate_mbit == 80.0  # explicit


def test_a_retried_choice_records_the_rejected_attempt():
    first = choose(AUTO, POLICIES, 8, cal())
    attempt = timescale.Attempt(40.0, {"lossless": ["the CPUs were saturated (p90 95%)"]},
                                "rejected/1-at-40-mbit")
    again = timescale.retried(first, 20.0, attempt, POLICIES, 8)
    assert again.host_rate_mbit == 20.0 and again.attempts == (attempt,)
    assert again.predicted_busy == pytest.approx(first.predicted_busy / 2)
    d = again.to_dict()
    assert d["attempts"] == [{"host_rate_mbit": 40.0, "kept_in": "rejected/1-at-40-mbit",
                              "problems": {"lossless": ["the CPUs were saturated (p90 95%)"]}}]
    text = timescale.retry_text(attempt, 20.0)
    assert "rejected the run at 40 Mbit/s (lossless: the CPUs were saturated" in text
    assert "again at 20 Mbit/s" in text and "rejected/1-at-40-mbit/" in text
    # results.json holds it; the reader types it and the table's note names the attempt
    from testbed.results.report import time_scale_note
    run = RunResult.from_json("run", {"scenario": {}, "time_scale": 3125.0,
                                      "time_scale_choice": json.loads(json.dumps(d))})
    assert run.time_scale_choice.attempts[0].problems == {
        "lossless": ("the CPUs were saturated (p90 95%)",)}
    assert run.time_scale_choice.calibration == first.calibration
    note = time_scale_note(run)
    assert "GPU NICs at 20 Mbit/s: chosen for this machine" in note
    assert "rejected the run at 40 Mbit/s first (kept in rejected/1-at-40-mbit)" in note


def test_what_runs_taught_is_kept_per_scenario_and_policy_until_the_next_calibration(tmp_path):
    path = str(tmp_path / "scenarios.json")
    c = cal(machine=calibrate.machine_key())
    s = Scenario.from_dict({"name": "mine", "topology": {"oversubscription": 2}})
    assert calibrate.learned(s, c, path) == {}
    calibrate.remember(s, c, {"lossless": 16.0, "hyperscale": None}, True, False, path)
    calibrate.remember(s, c, {"lossless": 20.0, "hyperscale": 32.0}, True, False, path)
    kept = calibrate.learned(s, c, path)
    assert {p: (e["cap_mbit"], e["rejected_runs"]) for p, e in kept.items()} == {
        "lossless": (16.0, 2), "hyperscale": (32.0, 1)}
    # the same traffic under another name, fewer iterations or fewer policies: the same cost
    same = s.override({"name": "other", "workload": {"iterations": 2}}).with_policies(
        ["lossless"])
    assert list(calibrate.learned(same, c, path)) == ["lossless"]
    assert calibrate.learned(s.override({"topology": {"oversubscription": 1}}), c, path) == {}
    tuned = s.override({"policy_params": {"lossless": {"ecn_kmin_bytes": 20000}}})
    assert list(calibrate.learned(tuned, c, path)) == ["hyperscale"]
    # a pass at the calibration's rate takes a rejected run back; none left: forgotten
    calibrate.remember(s, c, {"hyperscale": None}, True, False, path)
    assert list(calibrate.learned(s, c, path)) == ["lossless"]
    recalibrated = Calibration.from_dict(dict(c.to_dict(), measured="2026-12-03 10:00"))
    assert calibrate.learned(s, recalibrated, path) == {}


def _rejected_results(rate, fidelity):
    """A run's run-level keys, and what its attempt kept: each policy's fidelity section."""
    return ({"scenario": {}, "status": "running"},
            runner.Kept({name: PolicyResult.from_json({"fidelity": f}, name=name)
                         for name, f in fidelity.items()}))


def test_a_run_at_auto_that_the_monitor_rejected_goes_again_slower(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_CACHE_DIR", str(tmp_path))
    asked = Scenario.from_dict({"policies": ["hyperscale", "lossless"]})
    said = []
    scenario, choice = runner.choose_time_scale(asked, said.append,
                                                calibration=cal(machine=calibrate.machine_key()))
    run_dir = tmp_path / "run"
    (run_dir / "records" / "lossless").mkdir(parents=True)
    (run_dir / "records" / "lossless" / "gpu1.tx.csv").write_text("x")
    (run_dir / "results.json").write_text("{}")
    lag = _fidelity(agent_loop_lag={"p95_us": 501.0, "allowed_p95_us": 208.6})
    results = _rejected_results(40.0, {"hyperscale": _fidelity(), "lossless": lag})
    scenario2, choice2 = runner.run_again(asked, scenario, choice, *results, str(run_dir),
                                          said.append)
    assert scenario2.topology.host_rate_mbit == 16.0 and choice2.host_rate_mbit == 16.0
    kept = run_dir / "rejected" / "1-at-40-mbit"
    assert (kept / "records" / "lossless" / "gpu1.tx.csv").read_text() == "x"
    assert not (run_dir / "records").exists() and (run_dir / "results.json").exists()
    assert "ran again at 16 Mbit/s" in json.loads((kept / "results.json").read_text())[
        "superseded"]
    assert said[-1].startswith("time scale: the fidelity monitor rejected the run at 40")
    # passing at 16: done, and once is not yet a lesson
    assert runner.run_again(asked, scenario2, choice2, *_rejected_results(
        16.0, {"lossless": _fidelity()}), str(run_dir), said.append) is None
    _, next_choice = runner.choose_time_scale(asked, said.append,
                                              calibration=choice.calibration)
    assert next_choice.host_rate_mbit == 40.0 and next_choice.learned_cap_mbit is None
    # rejected in a second run: the next run starts at what the rejections asked for
    assert runner.run_again(asked, scenario, next_choice, *results, str(tmp_path / "run2"),
                            said.append) is not None
    _, third = runner.choose_time_scale(asked, said.append, calibration=choice.calibration)
    assert third.host_rate_mbit == 16.0 and third.learned_cap_mbit == 16.0
    # the last attempt allowed is final, but still teaches the machine
    last = choice2
    for _ in range(timescale.MAX_ATTEMPTS - 2):
        last = timescale.retried(last, 8.0, last.attempts[0], asked.policies, 8)
    cpu = _fidelity(cpu={"busy_p90": 0.95, "allowed_busy_p90": 0.9})
    assert runner.run_again(asked, asked.with_host_rate(8.0), last, *_rejected_results(
        8.0, {"lossless": cpu}), str(run_dir), said.append) is None
    assert calibrate.learned(asked, choice.calibration)["lossless"]["cap_mbit"] == 4.0


def test_an_explicit_rate_runs_again_only_when_the_scenario_allows_attempts(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("TESTBED_CACHE_DIR", str(tmp_path))
    fast = Scenario.from_dict({"topology": {"host_rate_mbit": 200}})
    _, choice = runner.choose_time_scale(fast, lambda s: None, calibration=cal())
    cpu = _fidelity(cpu={"busy_p90": 0.99, "allowed_busy_p90": 0.9})
    assert runner.run_again(fast, fast, choice, *_rejected_results(200.0, {"lossless": cpu}),
                            str(tmp_path), lambda s: None) is None
    assert not (tmp_path / "rejected").exists()
    # attempts allowed: slower, the fabric links (oversubscribed 2:1 here) slowed alike, and
    # nothing learned for the machine (only auto learns)
    given = Scenario.from_dict({"topology": {"host_rate_mbit": 40, "fabric_rate_mbit": 20},
                                "emulation": {"attempts": 2}})
    _, choice = runner.choose_time_scale(given, lambda s: None, calibration=cal())
    again = runner.run_again(given, given, choice, *_rejected_results(40.0, {"lossless": cpu}),
                             str(tmp_path / "run"), lambda s: None)
    assert again is not None
    slower, choice2 = again
    assert (slower.topology.host_rate_mbit, slower.topology.fabric_rate_mbit) == (20.0, 10.0)
    assert slower.time_scale == pytest.approx(2 * given.time_scale)
    assert choice2.chosen_by == "scenario" and choice2.attempts[0].host_rate_mbit == 40.0
    assert (tmp_path / "run" / "rejected" / "1-at-40-mbit" / "results.json").exists()
    assert not os.path.exists(calibrate.learned_path())
    # the second of two attempts is final
    assert runner.run_again(given, slower, choice2, *_rejected_results(
        20.0, {"lossless": cpu}), str(tmp_path / "run"), lambda s: None) is None


def test_attempts_default_to_three_at_auto_and_one_at_a_given_rate():
    assert timescale.attempts_allowed("auto", "auto") == timescale.MAX_ATTEMPTS == 3
    assert timescale.attempts_allowed("auto", "scenario") == 1
    assert timescale.attempts_allowed(2, "scenario") == 2
    assert Scenario.from_dict({"emulation": {"attempts": 4}}).emulation.attempts == 4
    for bad in (0, 1.5, "twice"):
        with pytest.raises(ConfigError, match="emulation.attempts"):
            Scenario.from_dict({"emulation": {"attempts": bad}})
