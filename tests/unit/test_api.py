"""The typed result API (no fabric: parsing saved results)."""
import json

import pytest

from testbed.api import RunResult, load_result, scenario_of
from testbed.scenario.config import DEFAULT
from testbed.base.errors import ConfigError

POLICY = {
    "gpus": 8, "packets_sent": 10, "packets_received": 10, "drops": 0,
    "latency_us": {"p50": 1.0, "p99": 2.0, "p999": 3.0, "max": 4.0, "mean": 1.5, "count": 10},
    "jitter_us": {"ipdv_abs_p50": 0.1, "ipdv_abs_p99": 0.5, "ipdv_abs_max": 1.0,
                  "ipdv_count": 9, "p99_minus_p50": 1.0},
    "cct_us": {"p50": 100.0, "p99": 120.0, "max": 130.0, "mean": 105.0,
               "per_iteration": [100.0, 110.0]},
    "pfc_pause_events": None, "ecn_marked_packets": 0,
    "straggler_idle_us": {"per_iteration": [5.0, 7.0], "total": 12.0, "mean": 6.0},
    "fidelity": {"verdict": "ok", "problems": [], "checks": {}},
    "collectives": [{"collective": "ring", "size_bytes": 1024, "iterations": 2, "ranks": 8,
                     "cct_us": {"p50": 100.0, "per_iteration": [100.0, 110.0]},
                     "busbw_gbps_modelled": 90.0},
                    {"collective": "ring", "size_bytes": 2048, "iterations": 2, "ranks": 8,
                     "cct_us": {"p50": 150.0}}],
}


def _results(**policies):
    return {"status": "complete", "scenario": DEFAULT.to_dict(), "policies": policies}


def test_results_become_typed_objects_with_null_for_absent_mechanisms(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(_results(lossless=POLICY)))
    r = load_result(str(tmp_path))
    p = r.policy("lossless")
    assert r.status == "complete" and r.scenario == DEFAULT
    assert p.latency_us.p99 == 2.0 and p.cct_us.per_iteration == (100.0, 110.0)
    assert p.jitter_us.ipdv_abs_p99 == 0.5 and p.straggler_idle_us.total == 12.0
    assert p.pfc_pause_events is None and p.ecn_marked_packets == 0
    assert p.fidelity.ok and p.collective().busbw_gbps_modelled == 90.0
    assert p.collective(2048).cct_us.p50 == 150.0
    assert p.raw["gpus"] == 8
    with pytest.raises(KeyError, match="no collective of 4096 B"):
        p.collective(4096)
    with pytest.raises(KeyError, match=r"ran: lossless"):
        r.policy("hyperscale")


def test_a_missing_or_foreign_results_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no results.json"):
        load_result(str(tmp_path))
    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(ConfigError, match="not a testbed results file"):
        load_result(str(tmp_path))


def test_scenarios_from_names_mappings_and_overrides():
    s = scenario_of("straggler", policies=["lossless"], workload={"iterations": 2})
    assert s.policies == ("lossless",) and s.workload.iterations == 2
    assert s.workload.stragglers.ranks == (5,)
    assert scenario_of({"topology": {"leaves": 2}}).topology.gpus == 4
    assert scenario_of(DEFAULT) is DEFAULT
    assert isinstance(RunResult.from_json("/x", _results()).policies, dict)
