import csv
import dataclasses
import json
import os

import pytest

from testbed.base.atomic import write_json_atomic
from testbed.base.errors import ResultsError
from testbed.results.report import summary_table, sweep_table
from testbed.results.verdicts import fidelity_warnings, job_failures
from testbed.results.collect import Mechanisms, RunContext, collect
from testbed.results.model import BytesPerRank, CollectiveResult, PolicyResult, RunResult
from traffic.records import ITERATION_FIELDS, PACKET_FIELDS, TX_FIELDS
from traffic.contract import WorkloadSpec

RING = WorkloadSpec("ring", size=300, iterations=1, chunks=1, group=1)


def typed(results):
    """A results.json's content as the readers get it."""
    return RunResult.from_json("", dict({"scenario": {}}, **results))


def typed_policy(figures, time_scale=2500.0):
    """One policy's figures as a reader gets them, in modelled time."""
    return PolicyResult.from_json(figures, name="p").in_modelled_time(time_scale)


def _csv(path, header, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def _agent(d, host, rank, packets, iterations, tx_packets, lag=None):
    """packets: (src, dst, psn, bytes, sent_ns, rx_ns, iteration[, step, ecn, delivered,
    retx]); iterations: (iteration, workload, size, start_ns, end_ns)."""
    _csv(os.path.join(d, f"{host}.packets.csv"), PACKET_FIELDS,
         [p if len(p) == 11 else p + (0, 0, 1, 0) for p in packets])
    _csv(os.path.join(d, f"{host}.iterations.csv"), ITERATION_FIELDS,
         [(rank, it, w, "ring", size, start, start, end, 0, 0, 0, 0)
          for it, w, size, start, end in iterations])
    with open(os.path.join(d, f"{host}.summary.json"), "w") as f:
        json.dump({"rank": rank, "host": host, "counters": {"tx_packets": tx_packets},
                   "rx_packets": len(packets), "loop_lag": lag}, f)


def _two_gpus(d):
    # gpu1 receives 2 packets from rank 1 (10 us, 30 us); gpu2 receives 1 from rank 0 (20 us)
    _agent(d, "gpu1", 0, [(1, 0, 0, 100, 1000, 11000, 0), (1, 0, 1, 50, 2000, 32000, 0)],
           [(0, 0, 300, 1000, 40000)], tx_packets=1)
    _agent(d, "gpu2", 1, [(0, 1, 0, 150, 5000, 25000, 0)], [(0, 0, 300, 6000, 50000)],
           tx_packets=3)


def test_collect_from_agent_records(tmp_path):
    d = str(tmp_path)
    _two_gpus(d)
    r, _packets = collect(d, RunContext(ranks=2, workloads=[RING], time_scale=2.0))
    assert r["packets_sent"] == 4 and r["packets_received"] == 3 and r["drops"] == 1
    assert r["latency_us"]["max"] == 30.0 and r["latency_us"]["count"] == 3
    assert r["collectives"][0]["cct_us"]["per_iteration"] == [49.0]  # 50000 - 1000 ns
    assert list(r["per_gpu"]) == ["gpu1", "gpu2"]
    assert r["per_gpu"]["gpu1"]["packets_received"] == 2
    assert r["per_gpu"]["gpu2"]["latency_us_p50"] == 20.0
    assert r["agents_reporting"] == 2
    c = r["collectives"][0]
    # algbw = 300 B / 49 us; busbw = algbw x 2(n-1)/n = algbw for n = 2
    assert c["algbw_gbps_emulated"] == pytest.approx(300 * 8 / 49_000, abs=1e-6)
    assert c["busbw_gbps_emulated"] == pytest.approx(c["algbw_gbps_emulated"])
    assert c["busbw_gbps_modelled"] == pytest.approx(2 * c["busbw_gbps_emulated"], abs=1e-5)
    # payload delivered per sender vs the ring's 2(n-1)S/n = 300 B
    assert c["bytes_sent_per_rank"] == BytesPerRank(expected={"0": 300, "1": 300},
                                                    measured={"0": 150, "1": 150})
    # rank 1 reached the collective 5 us after rank 0: 5 us idle in that iteration
    assert c["straggler_idle_us"] == {"per_iteration": [5.0], "total": 5.0, "mean": 5.0}
    assert c["extrapolation"]["gpus"] == 10_000
    assert "cct_us" not in r and "straggler_idle_us" not in r  # the collective's only
    # jitter: the one flow with two packets (rank 1 -> 0): IPDV 30 - 10 = 20 us
    assert r["jitter_us"]["ipdv_abs_max"] == 20.0 and r["jitter_us"]["ipdv_count"] == 1
    assert r["tail_ratio_p99_p50"] == pytest.approx(r["latency_us"]["p99"] / 20.0, abs=1e-3)


def test_absent_mechanisms_are_null_and_present_ones_zero(tmp_path):
    d = str(tmp_path)
    _two_gpus(d)
    none = collect(d, RunContext(2, [RING], mechanisms=Mechanisms(False, False, False)))[0]
    assert none["ecn_marked_packets"] is None and none["cnps_sent"] is None
    some = collect(d, RunContext(2, [RING], mechanisms=Mechanisms(True, True, True)))[0]
    assert some["ecn_marked_packets"] == 0 and some["cnps_sent"] == 0


def test_a_sweep_gives_one_entry_per_size(tmp_path):
    d = str(tmp_path)
    big = dataclasses.replace(RING, size=600)
    _agent(d, "gpu1", 0, [(1, 0, 0, 150, 1000, 2000, 0), (1, 0, 1, 300, 9000, 9500, 1)],
           [(0, 0, 300, 1000, 5000), (1, 1, 600, 6000, 16000)], tx_packets=2)
    _agent(d, "gpu2", 1, [(0, 1, 0, 150, 1000, 2000, 0), (0, 1, 1, 300, 9000, 9600, 1)],
           [(0, 0, 300, 1000, 5000), (1, 1, 600, 6000, 16000)], tx_packets=2)
    r, _ = collect(d, RunContext(2, [RING, big], mechanisms=Mechanisms(ecn=False)))
    assert [c["size_bytes"] for c in r["collectives"]] == [300, 600]
    assert [c["packets_received"] for c in r["collectives"]] == [2, 2]
    assert r["collectives"][0]["ecn_marked_packets"] is None
    assert [c["cct_us"]["p50"] for c in r["collectives"]] == [4.0, 10.0]
    assert r["collectives"][1]["latency_us"]["count"] == 2
    assert "cct_us" not in r  # the collectives' own


def test_latency_joins_the_senders_kernel_transmit_times(tmp_path):
    d = str(tmp_path)
    # rank 1 sent at app time 1000 and 2000; the kernel transmitted them at 1500 and 2600
    _agent(d, "gpu1", 0, [(1, 0, 0, 100, 1000, 11000, 0), (1, 0, 1, 100, 2000, 32000, 0)],
           [(0, 0, 300, 1000, 40000)], tx_packets=0)
    _agent(d, "gpu2", 1, [], [(0, 0, 300, 3000, 50000)], tx_packets=2)
    _csv(os.path.join(d, "gpu2.tx.csv"), TX_FIELDS,
         [(1000, 1500, 4172, "d", 900), (2000, 2600, 4172, "d", 1900), (1000, 1700, 60, "c", 900)])
    r, packets = collect(d, RunContext(2, [RING]))
    assert r["latency_app_clock"] == 0
    assert r["latency_us"]["max"] == 29.4 and r["latency_us"]["count"] == 2  # 32000 - 2600
    assert packets.path_minima_us() == {(1, 0): 9.5}


def test_a_record_file_without_a_column_its_readers_index_is_refused_by_name(tmp_path):
    d = str(tmp_path)
    _two_gpus(d)
    _csv(os.path.join(d, "gpu2.iterations.csv"), ITERATION_FIELDS[:-1], [])
    with pytest.raises(ResultsError, match=r"gpu2\.iterations\.csv: no column bytes_received"):
        collect(d, RunContext(2, [RING]))


def test_summary_table_lists_policies_every_gpu_and_absent_counters_as_dashes():
    results = {"time_scale": 2500.0,
               "scenario": {"topology": {"modelled_rate_gbit": 100.0},
                            "workload": {"collective": "ring", "size_bytes": 1 << 20}},
               "policies": {"hyperscale": {
                   "gpus": 2, "packets_sent": 10, "packets_received": 9, "drops": 1,
                   "pfc_pause_events": None, "ecn_marked_packets": 0,
                   "latency_us": {"p50": 1.5, "p99": 2.0, "p999": 2.0, "max": 3.0},
                   "cct_us": {"p50": 2000.0, "p99": 2500.0, "max": 2600.0},
                   "straggler_idle_us": {"mean": 5000.0},
                   "extrapolation": {"gpus": 10_000, "gpu_seconds_per_step_modelled": 0.02},
                   "spine_load_packets": {"sp1": 3, "sp2": 4},
                   "fidelity": {"verdict": "ok"},
                   "per_gpu": {"gpu1": {"rank": 0, "packets_sent": 5, "packets_received": 4,
                                        "latency_us_p50": 1.0, "latency_us_p99": 2.0},
                               "gpu2": {"rank": 1, "packets_sent": 5, "packets_received": 5,
                                        "latency_us_p50": None, "latency_us_p99": None}}}}}
    text = summary_table(typed(results))
    assert "hyperscale" in text and "3 / 4" in text and "2.0" in text  # CCT p50 in ms
    assert "gpu1" in text and "gpu2" in text and "2,500x" in text
    assert "ring, 1M" in text and "0.02 @ 10,000" in text
    pfc = next(line for line in text.splitlines() if line.startswith("PFC pause events"))
    ecn = next(line for line in text.splitlines() if line.startswith("ECN-marked"))
    assert pfc.split()[-1] == "-" and ecn.split()[-1] == "0"
    assert not any(line.startswith("largest switch queue") and line.split()[-1] != "-"
                   for line in text.splitlines())  # no queue recorded: a dash
    results["policies"]["hyperscale"]["switch_queues"] = {"max_backlog": {
        "lf1-eth1": {"roce": 1500, "other": 120_400}, "sp1-eth2": {"roce": 90_000}}}
    text = summary_table(typed(results))
    peak = next(line for line in text.splitlines() if line.startswith("largest switch queue"))
    assert peak.split()[-1] == "120.4"  # KB, any class of any port


def test_rxe_s_report_is_typed_where_the_runner_takes_it_and_read_in_the_table():
    """What testbed.fabric.rxe writes: a test that measured, one that failed."""
    rxe = {"mode": "root-namespace", "kernel": "6.1.0", "endpoints": ["gpu1", "gpu3"],
           "path": "cross-leaf", "devices": ["rxe-gpu1", "rxe-gpu3"],
           "gid_index": {"gpu1": 1, "gpu3": 1}, "traffic_class": 106, "size_bytes": 4096,
           "tests": {"ib_write_lat": {"command": "ib_write_lat -d rxe-gpu1", "exit_code": 0,
                                      "results": {"t_typical_usec": 41.2, "t_stdev_usec": None},
                                      "log": "rxe/lossless/ib_write_lat-client.txt",
                                      "clock": {"cycles_per_usec": 2000.0, "source": "cpu"},
                                      "attempts": 1, "nic_packets": {"a_tx": 2000, "b_rx": 2000}},
                     "ib_write_bw": {"command": "ib_write_bw -d rxe-gpu1", "exit_code": 1,
                                     "results": None, "log": "x", "error": "failed (exit 1)",
                                     "uncalibrated": False, "nic_packets": {"a_tx": 3}}}}
    p = PolicyResult.from_json({"gpus": 4, "rxe": rxe}, strict=True)
    assert p.rxe.tests["ib_write_lat"].results["t_typical_usec"] == 41.2
    assert p.rxe.figure("ib_write_lat", "t_typical_usec") == 41.2
    assert p.rxe.figure("ib_write_bw", "bw_average_mb_per_sec") == "failed"
    assert p.to_json()["rxe"] == rxe  # written back as it came
    with pytest.raises(ResultsError, match=r"rxe\.tests\.ib_write_lat: cycles: not declared"):
        bad = dict(rxe, tests={"ib_write_lat": dict(rxe["tests"]["ib_write_lat"], cycles=1)})
        PolicyResult.from_json({"rxe": bad}, strict=True)
    text = summary_table(typed({"time_scale": 1.0, "scenario": {}, "policies": {
        "lossless": dict(p.to_json(), fidelity={"verdict": "ok"})}}))
    lat = next(line for line in text.splitlines() if line.startswith("rxe ib_write_lat"))
    bw = next(line for line in text.splitlines() if line.startswith("rxe ib_write_bw"))
    assert lat.split()[-1] == "41.2" and bw.split()[-1] == "failed"


def test_a_job_s_table_shows_full_size_figures_and_its_operations():
    job = {"name": "dense-7b", "byte_scale": 100.0, "full_size_iteration_ms_modelled": 121.0,
           "idle_gpu_seconds_on_n_gpus": {"gpus": 10_000, "modelled": 0.0789,
                                          "full_size": 7.89},
           "operations": [{"kind": "dp", "collective": "ring", "group": 4, "bytes": 2_013_265,
                           "count": 48, "time_us_p50": 397.1, "algbw_gbps": 40.6,
                           "busbw_gbps": 60.8}]}
    results = {"time_scale": 2500.0, "scenario": {"topology": {"modelled_rate_gbit": 100.0}},
               "policies": {"hyperscale": {
                   "gpus": 8, "iteration_us": {"p50": 3_025_000.0, "p99": 3_030_000.0},
                   "idle_gpu_us": 15_000_000.0, "job": job, "per_gpu": {}}}}
    lines = summary_table(typed(results)).splitlines()
    full = next(line for line in lines if line.strip().startswith("at full size (ms"))
    assert full.split()[-2:] == ["121.0", "(x100)"]  # 1.21 ms as run, x100
    on_n = next(line for line in lines if "full size on N GPUs" in line)
    assert on_n.split()[-3:] == ["7.89", "@", "10,000"]
    at = next(i for i, line in enumerate(lines) if line.startswith("hyperscale: dense-7b operations"))
    assert "bytes / 100" in lines[at] and "busbw (Gb/s)" in lines[at]
    assert lines[at + 2].split() == ["dp", "ring", "4", "2,013,265", "48", "397.1", "40.6",
                                     "60.8"]
    assert not any(line.startswith("CCT p50") for line in lines)  # no collective rows


def test_sweep_table_has_nccl_tests_columns():
    entries = [{"collective": "ring", "size_bytes": 65536, "iterations": 5,
                "cct_us": {"p50": 30000.0}, "algbw_gbps_emulated": 0.0175,
                "busbw_gbps_emulated": 0.0306, "busbw_gbps_modelled": 76.5,
                "latency_us": {"p99": 2000.0}},
               {"collective": "ring", "size_bytes": 1 << 20, "iterations": 5,
                "cct_us": {"p50": 300000.0}, "algbw_gbps_emulated": 0.028,
                "busbw_gbps_emulated": 0.049, "busbw_gbps_modelled": 122.5,
                "latency_us": {"p99": 9000.0}}]
    text = sweep_table("lossless", [CollectiveResult.from_json(e) for e in entries])
    lines = text.splitlines()
    assert "time (us)" in lines[0] and "algbw (Mb/s)" in lines[0] and "busbw (Mb/s)" in lines[0]
    assert lines[2].split()[:2] == ["64K", "5"] and lines[3].split()[0] == "1M"
    assert "30.60" in lines[2] and "122.50" in lines[3]


def test_fidelity_warnings_name_the_policy_and_the_advice():
    results = {"policies": {
        "lossless": {"fidelity": {"verdict": "outside tolerance",
                                  "problems": ["the CPUs were saturated (p90 busy 99%)"],
                                  "advice": "rerun with lower link rates"}},
        "hyperscale": {"fidelity": {"verdict": "ok", "problems": []}}}}
    lines = fidelity_warnings(typed(results))
    assert len(lines) == 1 and lines[0].startswith("warning: lossless: fidelity outside")
    assert "saturated" in lines[0] and "lower link rates" in lines[0]


def test_a_failed_job_reads_as_nccl_says_it_in_the_table_and_a_line_of_its_own():
    from testbed.results.model import JobFailed
    from testbed.run.runner import job_failure
    from traffic.contract import JobFailure, QpFailure, QpSeen

    qp = QpFailure(peer_rank=2, peer_host="gpu3", qpn=0x110, psn=93, retries=12,
                   last_progress_ns=6_000_000_000, seen=QpSeen(40, 3, 12, 900))
    said = JobFailure("retry-exceeded", "gpu1", 0, iteration=1, at_ns=6_250_000_000,
                      no_progress_ns=93_750_000_000, status="IBV_WC_RETRY_EXC_ERR (12)", qp=qp)
    # what the agent says crosses to the runner as a contract
    assert JobFailure.from_dict(json.loads(json.dumps(said.to_dict()))) == said
    failure = job_failure(said, time_scale=3125.0)
    assert failure.at_us == 2000.0 and failure.no_progress_us == 30_000.0
    assert failure.last_progress_us == 1920.0 and failure.seen.naks == 3
    assert failure.text == (
        "QP 0x110 of gpu1 (rank 0) to gpu3 (rank 2) completed with IBV_WC_RETRY_EXC_ERR (12) "
        "in iteration 2, 2.000 ms into the run (modelled): PSN 93 unacknowledged for 30,000 us "
        "after 12 retries; it had 40 ACKs, 3 NAKs, 12 timeouts")
    stalled = job_failure(JobFailure("stalled", "gpu4", 3, iteration=0, at_ns=3125_000,
                                     no_progress_ns=3125_000_000,
                                     detail="no packet moved in dp, 1,024 B"), time_scale=3125.0)
    assert "made no progress for as long as this run waits" in stalled.text
    # a failure without a QP writes none of a QP's keys
    assert not {"qpn", "seen", "last_progress_us"} & set(stalled.to_json())
    assert JobFailed.from_json(json.loads(json.dumps(failure.to_json())), strict=True) == failure
    job = {"name": "dense-7b", "byte_scale": 100.0, "operations": []}
    results = {"time_scale": 3125.0, "scenario": {"topology": {"modelled_rate_gbit": 100.0}},
               "policies": {"enterprise": {"gpus": 8, "job": job, "per_gpu": {},
                                           "job_failed": failure.to_json()},
                            "lossless": {"gpus": 8, "job": job, "per_gpu": {},
                                         "iteration_us": {"p50": 3_000_000.0}}}}
    typed_results = typed(results)
    row = next(line for line in summary_table(typed_results).splitlines()
               if line.startswith("job "))
    assert row.split()[1:] == ["failed:", "QP", "error", "completed"]
    assert job_failures(typed_results) == [
        f"enterprise: the job failed: QP error: {failure.text}"]


def test_figures_count_only_the_iterations_every_rank_finished():
    from testbed.results.jobfigures import whole_iterations

    rows = [{"rank": r, "iteration": it} for it in (0, 1) for r in range(4)]
    rows += [{"rank": 0, "iteration": 2}, {"rank": 2, "iteration": 2}]  # the job failed
    assert {row["iteration"] for row in whole_iterations(rows, 4)} == {0, 1}
    assert whole_iterations(rows[:3], 4) == []


def test_atomic_write_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "results.json"
    write_json_atomic(str(path), {"a": 1})
    write_json_atomic(str(path), {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert os.listdir(tmp_path) == ["results.json"]


def test_per_collective_counts_of_marks_and_retransmissions(tmp_path):
    d = str(tmp_path)
    # one CE-marked packet, one retransmission that arrived again
    _agent(d, "gpu1", 0, [(1, 0, 0, 100, 1000, 2000, 0, 0, 3, 1, 0),
                          (1, 0, 1, 50, 1500, 2500, 0, 0, 2, 1, 1)],
           [(0, 0, 300, 1000, 5000)], tx_packets=1)
    _agent(d, "gpu2", 1, [], [(0, 0, 300, 1000, 6000)], tx_packets=2)
    c = collect(d, RunContext(2, [RING]))[0]["collectives"][0]
    assert (c["packets_received"], c["ecn_marked_packets"], c["retransmissions_received"]) == (
        2, 1, 1)


def test_pooled_timer_lag_is_split_by_kind_of_timer():
    from testbed.results.collect import _pooled_lag
    from traffic.metrics import LagHistogram

    def hist(*us):
        h = LagHistogram()
        for u in us:
            h.add(int(u * 1000))
        return h.summary()
    from traffic.contract import AgentSummary

    a = AgentSummary(0, "gpu1", loop_lag=hist(5, 400),
                     loop_lag_by_timer={"compute": hist(5), "dcqcn": hist(400)})
    b = AgentSummary(1, "gpu2", loop_lag=hist(6, 300),
                     loop_lag_by_timer={"rto": hist(6), "dcqcn": hist(300)})
    # an agent whose timers of no kind acted late still counts in the total
    other = AgentSummary(2, "gpu3", loop_lag=hist(7))
    d = _pooled_lag([a, b, other])
    assert d.count == 5
    assert set(d.by_timer) == {"compute", "dcqcn", "rto"}
    assert d.by_timer["dcqcn"].count == 2 and d.by_timer["dcqcn"].p95_us >= 400
    assert d.by_timer["compute"].p95_us < 10


def test_a_policy_run_several_times_shows_its_headline_figures_median_and_range():
    from testbed.results.spread import spread

    def run(cct_us, drops):
        return {"gpus": 8, "drops": drops, "per_gpu": {},
                "cct_us": {"p50": cct_us * 2500, "p99": cct_us * 2500},
                "modelled": {"cct_us": {"p50": cct_us, "p99": cct_us}}}

    first, later = run(400.0, 0), [run(380.0, 0), run(450.0, 0)]
    s = spread([typed_policy(r) for r in [first] + later])
    assert s["cct_p50_us"] == {"median": 400.0, "min": 380.0, "max": 450.0,
                               "values": [400.0, 380.0, 450.0]}
    assert s["drops"]["values"] == [0, 0, 0] and "iteration_p50_us" not in s
    results = {"time_scale": 2500.0, "scenario": {"topology": {"modelled_rate_gbit": 100.0}},
               "policies": {"hyperscale": first}, "repeats": {"hyperscale": later},
               "spread": {"hyperscale": s}}
    typed_results = typed(results)
    assert [p.cct_us.p50 for p in typed_results.runs("hyperscale")] == [400.0, 380.0, 450.0]
    lines = summary_table(typed_results).splitlines()
    assert "3 runs: median [min-max]" in lines[0]
    cct = next(line for line in lines if line.startswith("CCT p50 (ms)"))
    assert cct.split()[-2:] == ["0.4000", "[0.3800-0.4500]"]
    drops = next(line for line in lines if line.startswith("drops"))
    assert drops.split()[-1] == "0"  # the same in every run: no range


def test_an_agent_summary_is_a_contract_and_a_key_it_does_not_declare_names_its_file(tmp_path):
    """What an agent writes of each GPU (traffic.contract.AgentSummary) is read back as the
    contract: declared fields, counters never incremented read as 0; an undeclared key (a
    writer's bug, or a file of another version) is refused, naming the file."""
    from testbed.results.packets import read_summaries
    from traffic.contract import AgentSummary, LagSummary

    d = str(tmp_path)
    _two_gpus(d)
    (s,) = [x for x in read_summaries(d) if x.host == "gpu2"]
    assert (s.rank, s.counter("tx_packets"), s.counter("naks_sent"), s.loop_lag) == (
        1, 3, 0, None)
    written = AgentSummary(rank=0, host="gpu1", counters={"tx_packets": 4}, rx_packets=2,
                           loop_lag=LagSummary(count=1, counts=(0, 1)), first_start_lag_us=1.5,
                           scheduling="nice -20", frames_to={"1": (4, 4096, 1, 58)})
    assert AgentSummary.from_dict(json.loads(json.dumps(written.to_dict()))) == written
    path = tmp_path / "gpu2.summary.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), queue_us=1)))
    with pytest.raises(ResultsError, match=r"gpu2\.summary\.json: queue_us: not declared"):
        read_summaries(d)
