"""The validation suite's logic without a fabric: choosing cases, judging typed results, the
table, and the exit code that names what failed."""
import pytest

from testbed.cli import main
from testbed.results.model import RunResult
from testbed.scenario.config import DEFAULT
from testbed.validate import cases, congestion, suite


def _run(policies):
    return RunResult.from_json("", {"scenario": DEFAULT.to_dict(), "policies": policies})


def test_cases_are_chosen_by_name_in_suite_order_and_unknown_ones_refused():
    assert [c.name for c in cases.by_name(["lossy-vs-lossless", "straggler"])] == [
        "straggler", "lossy-vs-lossless"]
    assert cases.by_name(None) == list(cases.CASES)
    with pytest.raises(Exception, match="unknown case nope"):
        cases.by_name(["nope"])


def test_every_case_names_its_citation_tolerance_and_runs():
    for case in cases.CASES:
        assert case.citation and case.published and case.tolerance
        for quick in (True, False):
            runs = case.runs(quick)
            assert runs and all(r.scenario.policies for r in runs)


def _straggler(idle_per_iteration, per_step):
    c = {"collective": "ring", "size_bytes": 16384,
         "straggler_idle_us": {"per_iteration": [0.0] + idle_per_iteration},
         "extrapolation": {"gpus": 10_000, "gpu_seconds_per_step_modelled": per_step}}
    return {"straggler": _run({"hyperscale": {"collectives": [c]}})}


def test_the_straggler_case_holds_within_ten_percent_of_n_minus_one_delays():
    expected = 3 * cases.STRAGGLER_US
    per_step = 9_999 * cases.STRAGGLER_US * 1e-6
    assert cases.STRAGGLER.judge(_straggler([expected * 0.95] * 3, per_step)).ok
    late = cases.STRAGGLER.judge(_straggler([expected * 0.8] * 3, per_step))
    assert not late.ok and "outside 10%" in late.why


def test_the_hop_model_counts_fourteen_steps_and_the_last_ack():
    frame = cases.FRAME_US
    assert cases.hop_model_us(frame + 1.0) == pytest.approx(
        14 * (1.0 + 2 * frame) + 1.0 + cases.ACK_US)


def test_lossy_vs_lossless_judges_by_signs():
    def run(ll_drops):
        return {"oversubscribed": _run({
            "hyperscale": {"drops": 10, "retransmitted_packets": 12,
                           "cct_us": {"p50": 1.0, "p99": 900.0}},
            "lossless": {"drops": ll_drops, "retransmitted_packets": 0,
                         "pfc_pause_events": 3, "cct_us": {"p50": 1.0, "p99": 300.0}}})}
    assert cases.LOSSY.judge(run(0)).ok
    assert not cases.LOSSY.judge(run(1)).ok


def _outcome(name, status, note=""):
    case = next(c for c in cases.CASES if c.name == name)
    verdict = cases.Verdict("measured text", status == suite.PASS, note, (("x (us)", 1.0, 1.1),))
    return suite.Outcome(case, verdict, status, {"run": "/tmp/x/20261205-000000-abcd"}, note)


def test_the_go_back_0_model_is_the_closed_form_for_one_message_and_more_for_the_slower():
    m, p = 256, 0.01
    q = (1 - p) ** m
    assert cases.go_back_0_model(m, p, messages=1) == pytest.approx((1 - q) / (p * q) / m,
                                                                    rel=1e-6)
    assert cases.go_back_0_model(m, p) == pytest.approx(6.71, abs=0.01)  # the slower of two
    assert cases.go_back_0_model(64, p) < cases.go_back_0_model(m, p)  # collapses with size


def test_go_back_0_judges_the_collapse_against_go_back_n_and_the_model():
    def run(cct_us, lost=50):
        c = {"collective": "ring", "size_bytes": cases.LOSS_SIZE, "cct_us": {"mean": cct_us}}
        return _run({"hyperscale": {"collectives": [c], "link_losses": lost,
                                    "retransmitted_packets": 10, "packets_sent": 100}})
    model = cases.go_back_0_model(cases.LOSS_SIZE // 4 // DEFAULT.workload.mtu,
                                  cases.LOSS_RATE)

    def judge(n, zero, lost=50):
        return cases.GO_BACK.judge({"clean": run(100.0, None), "go-back-n": run(n, lost),
                                    "go-back-0": run(zero, lost)})
    assert judge(180.0, 100 * model).ok
    assert "did not take 2.5x go-back-N's" in judge(300.0, 100 * model).why
    assert "off its model" in judge(120.0, 400 * model).why
    assert "off its model" in judge(100.0, 45 * model).why
    assert "lost nothing" in judge(120.0, 100 * model, lost=0).why


def test_the_table_has_a_row_per_case_with_its_citation_and_verdict():
    text = suite.markdown([_outcome("straggler", suite.PASS),
                           _outcome("cut-through", suite.FAIL, "off the hop model")], True)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| case | published result (citation)")
    assert "straggler" in rows[1] and "pass (tolerance:" in rows[1]
    assert "FAIL: off the hop model" in rows[2] and "the seed" in rows[2]
    page = suite.page([_outcome("straggler", suite.PASS)], True)
    assert '<table id="validation">' in page and "data:image/png;base64," in page


def test_the_terminal_table_wraps_what_was_measured_under_each_case():
    long = suite.Outcome(_outcome("dcqcn", suite.PASS).case,
                         cases.Verdict("pauses 3,546 -> 109; " * 20, True, "", ()),
                         suite.PASS, {})
    text = suite.summary([_outcome("straggler", suite.PASS), long], width=80)
    lines = text.splitlines()
    assert lines[0].split() == ["straggler", "pass"]
    assert lines[1] == "    measured text"
    assert lines[2].split() == ["dcqcn", "pass"]
    assert len(lines) > 5 and all(len(line) <= 80 for line in lines)
    assert all(line.startswith("    ") and line[4] != " " for line in lines[3:])
    assert " ".join(line.strip() for line in lines[3:]) == long.verdict.measured.strip()


def test_a_failed_or_unfaithful_case_exits_non_zero_and_says_which_and_why(
        monkeypatch, tmp_path, capsys):
    outcomes = [_outcome("straggler", suite.PASS),
                _outcome("cut-through", suite.UNFAITHFUL, "run 'ring-64k' rejected twice")]
    monkeypatch.setattr(suite, "run_suite", lambda *a, **k: (outcomes, str(tmp_path)))
    assert main(["validate", "--quick", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "cut-through: not measured faithfully: run 'ring-64k' rejected twice" in err
    assert "straggler" not in err
    monkeypatch.setattr(suite, "run_suite", lambda *a, **k: (outcomes[:1], str(tmp_path)))
    assert main(["validate", "--quick", "--quiet"]) == 0


def test_qp_scaling_must_help_a_flow_larger_than_its_path_and_only_that_one():
    def run(busbw):
        c = {"collective": "ring", "size_bytes": 4 << 20, "busbw_gbps_modelled": busbw}
        return _run({"hyperscale": {"collectives": [c]}})

    def judge(half1, half8, full1=95.0, full8=95.0):
        return cases.QP_SCALING.judge({
            "half-uplinks-1qp": run(half1), "half-uplinks-8qp": run(half8),
            "full-uplinks-1qp": run(full1), "full-uplinks-8qp": run(full8)})
    assert judge(40.0, 66.0).ok
    assert "not held to one uplink" in judge(70.0, 95.0).why
    assert "did not spread" in judge(40.0, 48.0).why
    assert "already held" in judge(40.0, 66.0, full1=60.0, full8=95.0).why


def test_spraying_judges_the_share_of_the_line_and_the_spines_spread():
    even, skewed = {"sp1": 100, "sp2": 102, "sp3": 98, "sp4": 100}, \
        {"sp1": 150, "sp2": 100, "sp3": 100, "sp4": 50}

    def run(busbw, load):
        def one(b, lo):
            return {"collectives": [{"collective": "all_to_all", "size_bytes": 1 << 20,
                                     "busbw_gbps_modelled": b}],
                    "spine_load_packets": lo, "drops": 0}
        return _run({"hyperscale": one(busbw, load), "lossless": one(busbw, load)})

    def judge(static=(30.0, skewed), sprayed=(85.0, even)):
        return cases.SPRAYING.judge({"per-qp": run(*static), "per-packet": run(*sprayed)})
    assert cases.imbalance(skewed) == 1.5
    assert judge().ok
    assert "did not collide" in judge(static=(30.0, even)).why
    assert "left the spines uneven" in judge(sprayed=(85.0, skewed)).why
    assert "shares of the line" in judge(sprayed=(60.0, even)).why


def _fan_in_run(pauses, queueing_p50, gbps, jain):
    rows = [{"jain": j, "gbps_modelled": g, "all_send_us": 1000.0, "whole_us": 1200.0}
            for g, j in zip(gbps, jain)]
    return _run({"lossless": {
        "pfc_pause_events": pauses,
        "latency_queueing_us": {"p50": queueing_p50},
        "fan_in": {"incast": {"receivers": 1, "senders": 7, "iterations": [0, 1, 2],
                              "per_iteration": rows}}}})


def _dcqcn(**dc):
    pfc = dict(pauses=3500, queueing_p50=100.0, gbps=[100.0] * 3, jain=[0.85] * 3)
    dcqcn = dict(pauses=120, queueing_p50=5.0, gbps=[70.0, 98.0, 99.0],
                 jain=[0.99, 0.99, 0.99]) | dc
    out = {}
    for spines, over in congestion.FABRICS:
        out[f"none-{spines}x{over:g}"] = _fan_in_run(**pfc)
        out[f"dcqcn-{spines}x{over:g}"] = _fan_in_run(**dcqcn)
    return congestion.DCQCN.judge(out)


def test_dcqcn_is_judged_on_every_fabric_after_the_first_iteration():
    good = _dcqcn()
    assert good.ok and "first iteration 0.70x" in good.measured  # shown, not judged
    assert "throughput on 2 spines, 1:1" in _dcqcn(gbps=[100.0, 85.0, 85.0]).why
    assert "fairness" in _dcqcn(jain=[1.0, 0.9, 0.9]).why
    assert "pauses" in _dcqcn(pauses=2000).why
    assert "queues" in _dcqcn(queueing_p50=60.0).why


def _ring(p50, paused_ms=0.0, pauses=0):
    pfc = {"lf1-eth5": {"node": "lf1", "events": 3, "paused_ms": paused_ms},
           "lf4-eth1": {"node": "lf4", "events": 9, "paused_ms": 1000.0}}  # not the victim's
    return {"iteration_us": {"p50": p50}, "pfc_pause_events": pauses,
            "switch_queues": {"pfc": pfc}}


def test_pfc_spreading_needs_pfc_to_slow_the_victim_and_dcqcn_to_keep_pauses_away():
    def judge(pfc_us=300.0, dcqcn_paused=10.0):
        return congestion.VICTIMS.judge({
            "alone": _run({"hyperscale": _ring(60.0), "lossless": _ring(60.0)}),
            "incast": _run({"hyperscale": _ring(66.0),
                            "lossless": _ring(pfc_us, paused_ms=100.0, pauses=50)}),
            "incast-dcqcn": _run({"lossless": _ring(250.0, paused_ms=dcqcn_paused,
                                                    pauses=5)})})
    ok = judge()
    assert ok.ok and "0.10x as long" in ok.measured and "slows 4.2x (not judged)" in ok.measured
    assert "twice as much as the lossy fabric" in judge(pfc_us=100.0).why
    assert "did not shorten the pauses" in judge(dcqcn_paused=60.0).why
