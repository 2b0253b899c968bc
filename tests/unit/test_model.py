"""The typed results: built where the figures are made, written to and read from JSON
unchanged, in modelled time by default (no fabric: the collector's own output)."""
import json

import pytest

from testbed.base.contract import dump
from testbed.base.errors import ResultsError
from testbed.results.collect import RunContext, collect
from testbed.results.model import PolicyResult, RunResult, with_modelled
from testbed.results.report import fmt, sig, summary_table
from testbed.scenario.config import DEFAULT
from tests.unit.test_results import RING, _two_gpus

SCALE = 2.0


def _figures(tmp_path):
    d = str(tmp_path)
    _two_gpus(d)
    figures, _packets = collect(d, RunContext(ranks=2, workloads=[RING], time_scale=SCALE))
    return figures


def test_the_collectors_figures_are_all_declared_and_round_trip_through_json(tmp_path):
    figures = _figures(tmp_path)
    typed = PolicyResult.from_json(figures, "policies.ring", strict=True, name="ring")
    written = typed.to_json()
    for key, value in figures.items():  # nothing the collector made is lost or changed
        want = dump(value)
        if key == "collectives":  # each one's modelled section: the runner adds it
            want = [dict(c, modelled=None) for c in want]
        assert written[key] == want, key
    again = PolicyResult.from_json(json.loads(json.dumps(written)), strict=True, name="ring")
    assert again.to_json() == written
    assert again == typed


def test_a_figure_nobody_declared_is_an_error_where_it_is_made(tmp_path):
    figures = dict(_figures(tmp_path), queue_depth_us=3.0)
    with pytest.raises(ResultsError, match=r"policies\.ring: queue_depth_us: not declared"):
        PolicyResult.from_json(figures, "policies.ring", strict=True, name="ring")
    figures = _figures(tmp_path)
    figures["collectives"][0]["busbw_tbps"] = 1.0
    with pytest.raises(ResultsError, match=r"collectives\[0\]: busbw_tbps"):
        PolicyResult.from_json(figures, "policies.ring", strict=True, name="ring")
    # a file of another version: the unknown key is kept in raw, not refused
    assert PolicyResult.from_json(dict(figures, later_figure=1)).raw["later_figure"] == 1


def _run(tmp_path):
    figures = _figures(tmp_path)
    policy = with_modelled(PolicyResult.from_json(figures, strict=True, name="hyperscale"),
                           SCALE).to_json()  # as the runner writes it
    return RunResult.from_json(str(tmp_path), {
        "status": "complete", "scenario": DEFAULT.with_policies(["hyperscale"]).to_dict(),
        "time_scale": SCALE, "policies": {"hyperscale": policy}})


def test_times_are_modelled_by_default_and_emulated_one_step_away(tmp_path):
    run = _run(tmp_path)
    p = run.policy("hyperscale")
    assert run.modelled and p.time == "modelled"
    assert p.cct_us.p50 == 49.0 / SCALE and p.emulated.cct_us.p50 == 49.0
    assert p.latency_us.max == 30.0 / SCALE and p.emulated.latency_us.max == 30.0
    assert p.collective().cct_us.per_iteration == (49.0 / SCALE,)
    assert p.collective().emulated.cct_us.per_iteration == (49.0,)
    assert p.per_gpu["gpu2"].latency_us_p50 == 20.0 / SCALE
    assert p.emulated.per_gpu["gpu2"].latency_us_p50 == 20.0
    assert p.packets_received == p.emulated.packets_received == 3  # counts are not times
    assert p.to_json() == p.emulated.to_json()  # a view writes what was measured


def test_the_apis_cct_is_the_printed_tables(tmp_path):
    run = _run(tmp_path)
    row = next(line for line in summary_table(run).splitlines()
               if line.startswith("CCT p50 (ms)"))
    assert row.split()[-1] == sig(run.policy("hyperscale").cct_us.p50 / 1000)
    emulated = next(line for line in summary_table(run, emulated=True).splitlines()
                    if line.startswith("CCT p50 (ms)"))
    assert emulated.split()[-1] == fmt(run.policy("hyperscale").emulated.cct_us.p50 / 1000)
