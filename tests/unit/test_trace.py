"""timeline-<policy>.json from records' rows: a loadable trace in modelled time, bounded."""
from testbed.results import trace
from tests.tracecheck import check

SCALE = 1000.0  # emulated time runs 1000x slower than the modelled fabric


def _span(rank, it, op, name, kind, start, end, stream="compute", comm_kind="", coll="",
          group=0, size=0):
    return {"rank": rank, "iteration": it, "op": op, "name": name, "kind": kind,
            "stream": stream, "comm_kind": comm_kind, "collective": coll,
            "group_size": group, "bytes": size, "start_ns": start, "end_ns": end}


def _records(iterations=2, slow=1):
    """Two ranks; each iteration: compute 0-100 us, two dp ops overlapping on one stream
    (100-400, 200-500), compute again after the second; iteration ``slow`` takes 2x longer."""
    spans, its, waits = [], [], {}
    t = 1_000_000_000
    for it in range(iterations):
        k = 2 if it == slow else 1
        for r in range(2):
            us = lambda x: t + int(x * 1000 * k)  # noqa: E731
            spans += [_span(r, it, 0, "fwd L0", "compute", us(0), us(100)),
                      _span(r, it, 1, "dp bucket 0", "comm", us(100), us(400), "dp", "dp",
                            "ring", 2, 1 << 20),
                      _span(r, it, 2, "dp bucket 1", "comm", us(200), us(500), "dp", "dp",
                            "ring", 2, 1 << 20),
                      _span(r, it, 3, "step", "compute", us(500), us(520))]
            its.append({"rank": r, "iteration": it, "workload": 0, "collective": "job",
                        "size": 0, "compute_start_ns": us(0), "end_ns": us(520)})
            waits[(r, it)] = [(us(100), us(500), "dp", "dp bucket 1")]
        t += int(600_000 * k)
    return spans, its, waits


def test_a_trace_of_two_gpus_loads_and_keeps_overlapping_ops_on_separate_lanes():
    spans, its, waits = _records()
    events = {0: [{"t_ns": its[0]["compute_start_ns"] + 150_000, "kind": "rto", "peer": 1}]}
    queue = [{"time_ns": str(its[0]["compute_start_ns"] - 10_000 + 50_000 * i),
              "lf1-eth1": str(1000 * i), "sp1-eth1": "0",
              "paused": "gpu2-eth0 lf1-eth3" if i == 2 else ""} for i in range(6)]
    t = trace.build({0: "gpu1", 1: "gpu2"}, spans, its, waits, events, [queue], SCALE)
    phases = check(t)
    assert phases["X"] == 2 * 2 * (1 + 4 + 1)  # iteration, 4 spans and a wait per rank
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in t["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"dp", "dp #2", "compute", "iterations", "NIC"} <= set(names.values())
    procs = {e["pid"]: e["args"]["name"] for e in t["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs[1] == "gpu1 (rank 0)" and "switch lf1" in procs.values()
    # modelled microseconds: 300 us emulated of a dp op are 0.3 us modelled
    dp = next(e for e in t["traceEvents"] if e["ph"] == "X" and e["name"] == "dp bucket 0")
    assert dp["dur"] == 0.3 and dp["args"]["bytes"] == 1 << 20 and dp["args"]["kind"] == "dp"
    assert dp["args"]["emulated_us"] == 100.0
    rto = [e for e in t["traceEvents"] if e["ph"] == "i" and e["cat"] == "rto"]
    assert len(rto) == 1 and rto[0]["pid"] == 1 and rto[0]["ts"] == 0.15
    pfc = [e for e in t["traceEvents"] if e["ph"] == "i" and e["cat"] == "pfc"]
    assert {e["args"]["queue"] for e in pfc} == {"gpu2-eth0", "lf1-eth3"}
    assert any(e["pid"] == 2 for e in pfc)  # gpu2's NIC queue: on its GPU's process
    counters = [e for e in t["traceEvents"] if e["ph"] == "C" and e["name"] == "lf1-eth1 backlog"]
    assert [c["args"]["bytes"] for c in counters] == [0.0, 1000.0, 2000.0, 3000.0, 4000.0,
                                                      5000.0][:len(counters)]
    assert t["otherData"]["slowest_iteration"] == 1 and t["otherData"]["first_iteration"] == 0


def test_a_large_run_keeps_the_first_and_slowest_iterations_within_the_budget():
    spans, its, waits = _records(iterations=6, slow=4)
    per_iteration = 2 * 4 + 2  # spans and waits
    t = trace.build({0: "gpu1", 1: "gpu2"}, spans, its, waits, {}, [], SCALE,
                    max_span_events=3 * per_iteration)
    check(t)
    kept = sorted({e["args"]["iteration"] for e in t["traceEvents"] if e["ph"] == "X"})
    assert kept == [0, 1, 4]
    assert t["otherData"]["omitted_iterations"] == [2, 3, 5]


def test_iteration_bars_start_at_the_iterations_first_span():
    spans, its, waits = _records()
    t = trace.build({0: "gpu1", 1: "gpu2"}, spans, its, waits, {}, [], SCALE)
    bars = trace.iteration_bars(t, 1)
    assert set(bars) == {0, 1}
    assert min(b[1] for b in bars[0]) == 0.0
    assert {b[3] for b in bars[0]} == {"compute", "dp", "wait"}
    assert max(b[1] + b[2] for b in bars[0]) == 1.04  # 520 us emulated x 2, modelled


def test_the_checker_refuses_overlapping_events_on_one_track():
    import pytest
    bad = {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "p"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 0, "args": {"name": "t"}},
        {"ph": "X", "name": "a", "cat": "c", "pid": 1, "tid": 0, "ts": 0, "dur": 2, "args": {}},
        {"ph": "X", "name": "b", "cat": "c", "pid": 1, "tid": 0, "ts": 1, "dur": 2, "args": {}}]}
    with pytest.raises(AssertionError, match="overlaps"):
        check(bad)


def test_the_gantt_shows_ranks_spread_from_the_first_to_the_last():
    from testbed.results.plots import spread
    assert spread(list(range(64)), 8) == [0, 9, 18, 27, 36, 45, 54, 63]
    assert spread([3, 5], 8) == [3, 5]


def test_only_the_first_instants_are_kept_and_the_rest_counted():
    spans, its, waits = _records()
    t0 = its[0]["compute_start_ns"]
    events = {0: [{"t_ns": t0 + 1000 * k, "kind": "nak", "peer": 1} for k in range(5)]}
    t = trace.build({0: "gpu1", 1: "gpu2"}, spans, its, waits, events, [], SCALE,
                    max_instant_events=3)
    naks = [e["ts"] for e in t["traceEvents"] if e["ph"] == "i"]
    assert naks == [0.0, 0.001, 0.002] and t["otherData"]["omitted_instants"] == 2


def test_events_at_the_same_time_on_one_gpu_are_all_kept():
    spans, its, waits = _records()
    t0 = its[0]["compute_start_ns"]
    events = {0: [{"t_ns": t0, "kind": "nak", "peer": p} for p in (1, 2, 1)]}
    t = trace.build({0: "gpu1", 1: "gpu2"}, spans, its, waits, events, [], SCALE)
    peers = [e["args"]["peer_rank"] for e in t["traceEvents"] if e["ph"] == "i"]
    assert peers == [1, 2, 1]
