"""Results in the modelled fabric's time first, emulated figures beside them."""
from testbed.results.compare import compare
from testbed.results.model import CollectiveResult, PolicyResult, RunResult
from testbed.results.report import per_gpu, sig, summary_table, sweep
from testbed.results.model import with_modelled

SCALE = 2500.0


def policy(cct_us=380_000.0, latency_p50=172.0):
    p = {"gpus": 8, "packets_sent": 10, "packets_received": 10, "drops": 0,
         "latency_us": {"p50": latency_p50, "p99": 563.5, "p999": 700.0, "max": 900.0,
                        "mean": 200.0, "count": 35840},
         "jitter_us": {"ipdv_abs_p50": 10.0, "ipdv_abs_p99": 332.1, "ipdv_abs_max": 400.0,
                       "ipdv_count": 35832, "p99_minus_p50": 391.5},
         "collectives": [{
             "collective": "ring", "size_bytes": 1 << 20,
             "cct_us": {"p50": cct_us, "p99": 386_400.0, "max": 386_900.0,
                        "mean": 381_000.0, "per_iteration": [380_000.0, 382_500.0]},
             "straggler_idle_us": {"per_iteration": [9700.0], "total": 9700.0,
                                   "mean": 9700.0}}],
         "pfc_paused_ms": 25.0,
         "per_gpu": {"gpu1": {"rank": 0, "packets_sent": 5, "packets_received": 5,
                              "latency_us_p50": 250.0, "latency_us_p99": 500.0}},
         "fidelity": {"verdict": "ok"}}
    return written(p)


def written(policy, scale=SCALE):
    """A policy's figures as a run at ``scale`` writes them: with the modelled section."""
    return with_modelled(PolicyResult.from_json(policy), scale).to_json()


def results(**policies):
    return RunResult.from_json("", raw(**policies))


def raw(**policies):
    return {"time_scale": SCALE, "scenario": {"topology": {"modelled_rate_gbit": 100.0},
                                              "workload": {"collective": "ring",
                                                           "size_bytes": 1 << 20}},
            "policies": policies or {"hyperscale": policy()}}


def test_every_time_summary_is_divided_by_the_time_scale_and_counts_are_kept():
    p = policy()
    m, c = p["modelled"], p["collectives"][0]["modelled"]
    assert c["cct_us"]["p50"] == 152.0 and c["cct_us"]["per_iteration"] == [152.0, 153.0]
    assert m["latency_us"]["p50"] == 0.0688 and m["latency_us"]["count"] == 35840
    assert m["jitter_us"]["ipdv_count"] == 35832 and m["jitter_us"]["ipdv_abs_p99"] == 0.13284
    assert c["straggler_idle_us"]["mean"] == 3.88 and m["pfc_paused_ms"] == 0.01
    assert set(m) == {"latency_us", "jitter_us", "pfc_paused_ms"}
    assert set(c) == {"cct_us", "straggler_idle_us"}
    assert "latency_us" not in written({"latency_us": None})["modelled"]


def test_the_summary_leads_with_modelled_time_and_shows_emulated_on_request():
    text = summary_table(results())
    head = text.splitlines()[0]
    assert "modelled time" in head
    cct = next(line for line in text.splitlines() if line.startswith("CCT p50 (ms)"))
    assert cct.split()[-1] == "0.1520"  # 380 ms emulated / 2,500
    lat = next(line for line in text.splitlines() if line.startswith("latency p50 (us)"))
    assert lat.split()[-1] == "0.06880"
    gpu = next(line for line in text.splitlines() if line.startswith("gpu1"))
    assert gpu.split()[-2:] == ["0.1000", "0.2000"]
    assert "modelled fabric's time (emulated / 2,500" in text and "--emulated" in text
    emulated = summary_table(results(), emulated=True)
    assert "emulated time" in emulated.splitlines()[0]
    cct = next(line for line in emulated.splitlines() if line.startswith("CCT p50 (ms)"))
    assert cct.split()[-1] == "380.0"
    assert "latencies and CCTs are emulated time" in emulated


def test_results_without_modelled_figures_stay_in_emulated_time():
    old = policy()
    del old["modelled"]
    text = summary_table(results(hyperscale=old))
    assert "emulated time" in text.splitlines()[0]
    assert per_gpu("hyperscale", PolicyResult.from_json(old), modelled=False)[1][0][-1] == "500.0"


def test_the_sweep_gives_modelled_time_and_bandwidth():
    entry = {"collective": "ring", "size_bytes": 1 << 20, "iterations": 5,
             "cct_us": {"p50": 380_000.0}, "latency_us": {"p99": 9000.0},
             "algbw_gbps_emulated": 0.022, "busbw_gbps_emulated": 0.0386,
             "algbw_gbps_modelled": 55.2, "busbw_gbps_modelled": 96.6}
    entry = with_modelled(CollectiveResult.from_json(entry), SCALE).in_modelled_time(SCALE)
    header, rows = sweep("lossless", [entry])
    assert header[2:5] == ["time (us)", "algbw (Gb/s)", "busbw (Gb/s)"]
    assert rows[0][2:] == ["152.0", "55.20", "96.60", "3.600"]
    header, _ = sweep("lossless", [entry], emulated=True)
    assert "busbw (Mb/s)" in header


def test_two_runs_at_different_time_scales_compare_in_modelled_time():
    a = raw(hyperscale=policy(cct_us=380_000.0))
    b = raw(hyperscale=policy(cct_us=380_000.0))
    b["time_scale"] = 1250.0
    b["policies"]["hyperscale"]["collectives"][0]["cct_us"] = {"p50": 190_000.0}
    b["policies"]["hyperscale"] = written(b["policies"]["hyperscale"], 1250.0)
    for r, name in ((a, "a"), (b, "b")):
        r.update(run_id=name, status="complete")
    text = compare(RunResult.from_json("a", a), RunResult.from_json("b", b), "a", "b")
    assert "times: the modelled fabric's" in text
    cct = next(line for line in text.splitlines() if line.startswith("CCT p50 (ms)"))
    assert cct.split()[3:6] == ["0.1520", "0.1520", "="], cct  # 152 us modelled in both


def test_significant_digits_never_use_an_exponent():
    assert [sig(v) for v in (0.0000123, 0.0688, 152.13, 1234.5, 0)] == [
        "0.00001230", "0.06880", "152.1", "1,234", "0"]
    assert sig(None) == "-"


def test_every_time_row_is_a_row_of_the_comparison():
    from testbed.results.report import ROWS, TIME_ROWS
    assert TIME_ROWS <= {label for label, _ in ROWS}  # a renamed row keeps its time format


def test_the_busy_share_between_two_cpu_readings():
    from testbed.run.fidelity import busy_between
    assert busy_between((100, 40), (200, 65)) == 0.75
    assert busy_between((100, 40), (100, 40)) is None
