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
    "pfc_pause_events": None, "ecn_marked_packets": 0,
    "fidelity": {"verdict": "ok", "problems": [], "checks": {}},
    "collectives": [{"collective": "ring", "size_bytes": 1024, "iterations": 2, "ranks": 8,
                     "cct_us": {"p50": 100.0, "per_iteration": [100.0, 110.0]},
                     "straggler_idle_us": {"per_iteration": [5.0, 7.0], "total": 12.0,
                                           "mean": 6.0},
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
    first = p.collective()
    assert p.latency_us.p99 == 2.0 and first.cct_us.per_iteration == (100.0, 110.0)
    assert p.jitter_us.ipdv_abs_p99 == 0.5 and first.straggler_idle_us.total == 12.0
    assert p.cct_us is None and p.busbw_gbps_modelled is None  # a sweep: no one collective
    assert p.pfc_pause_events is None and p.ecn_marked_packets == 0
    assert p.fidelity.ok and first.busbw_gbps_modelled == 90.0
    assert p.collective(2048).cct_us.p50 == 150.0
    assert p.raw["gpus"] == 8
    with pytest.raises(KeyError, match="no collective of 4096 B"):
        p.collective(4096)
    with pytest.raises(KeyError, match=r"ran: lossless"):
        r.policy("hyperscale")


def test_a_run_of_one_collective_or_one_job_reads_its_figures_at_the_policy(tmp_path):
    one = dict(POLICY, collectives=POLICY["collectives"][:1])
    job = {"gpus": 8, "collectives": [], "jobs": [
        {"iteration_us": {"p50": 900.0}, "network_cost_us": 40.0, "job": {"name": "dp"}},
        {"iteration_us": {"p50": 950.0}, "job": {"name": "other"}}]}
    (tmp_path / "results.json").write_text(json.dumps(_results(lossless=one, hyperscale=job)))
    r = load_result(str(tmp_path))
    p, j = r.policy("lossless"), r.policy("hyperscale")
    assert p.cct_us.per_iteration == (100.0, 110.0) and p.straggler_idle_us.total == 12.0
    assert p.busbw_gbps_modelled == 90.0 and p.iteration_us is None and p.job is None
    assert j.iteration_us.p50 == 900.0 and j.network_cost_us == 40.0 and j.job.name == "dp"
    assert j.cct_us is None and [k.job.name for k in j.jobs] == ["dp", "other"]
    # written back, the figures stay in collectives[] and jobs[] only
    assert "cct_us" not in p.to_json() and "iteration_us" not in j.to_json()


def test_a_results_2_file_reads_with_its_copies_moved_into_collectives_and_jobs(tmp_path):
    """results/2 also wrote the one collective's and the first job's figures at the policy's
    level, and a single job only there."""
    cct = {"p50": 100.0, "per_iteration": [100.0, 110.0]}
    first = dict(POLICY["collectives"][0], cct_us=cct, modelled={"cct_us": {"p50": 1.0}})
    one = dict(POLICY, collectives=[first], cct_us=cct,
               busbw_gbps_modelled=90.0, modelled={"cct_us": {"p50": 1.0}, "latency_us":
                                                   {"p50": 0.01}})
    job = {"gpus": 8, "collectives": [], "iteration_us": {"p50": 900.0},
           "network_cost_us": 40.0, "job": {"name": "dp"},
           "modelled": {"iteration_us": {"p50": 9.0}}}
    data = dict(_results(lossless=one, hyperscale=job), schema="ai-fabric-testbed/results/2",
                time_scale=100.0)
    (tmp_path / "results.json").write_text(json.dumps(data))
    r = load_result(str(tmp_path))
    p, j = r.policy("lossless"), r.policy("hyperscale")
    assert len(p.collectives) == 1 and p.cct_us.p50 == 1.0 and p.emulated.cct_us.p50 == 100.0
    assert p.latency_us.p50 == 0.01 and p.busbw_gbps_modelled == 90.0
    assert len(j.jobs) == 1 and j.iteration_us.p50 == 9.0 and j.job.name == "dp"
    assert j.emulated.network_cost_us == 40.0 and "cct_us" not in p.raw


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
