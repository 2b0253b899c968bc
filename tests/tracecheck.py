"""What a Chrome trace event file must satisfy for Perfetto and chrome://tracing to load it
(the format's required fields per phase, and events on one track nesting, never overlapping);
shared by the unit and integration tests of ``timeline-<policy>.json``."""
from collections import Counter, defaultdict

REQUIRED = {"X": ("name", "cat", "pid", "tid", "ts", "dur", "args"),
            "i": ("name", "pid", "tid", "ts", "s"),
            "C": ("name", "pid", "ts", "args"),
            "M": ("name", "pid", "args")}
EPS_US = 1e-6


def check(trace: dict) -> Counter:
    """Assert ``trace`` is a loadable trace; returns how many events of each phase it has."""
    assert isinstance(trace, dict) and isinstance(trace.get("traceEvents"), list)
    phases = Counter()
    tracks = defaultdict(list)
    process_names, thread_names = set(), set()
    for e in trace["traceEvents"]:
        ph = e.get("ph")
        assert ph in REQUIRED, e
        for key in REQUIRED[ph]:
            assert key in e, (key, e)
        assert isinstance(e["pid"], int), e
        phases[ph] += 1
        if ph == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index",
                                 "thread_sort_index"), e
            if e["name"] == "process_name":
                assert isinstance(e["args"]["name"], str) and e["args"]["name"]
                process_names.add(e["pid"])
            if e["name"] == "thread_name":
                assert isinstance(e["args"]["name"], str) and e["args"]["name"]
                thread_names.add((e["pid"], e["tid"]))
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if ph == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            tracks[(e["pid"], e["tid"])].append((e["ts"], e["dur"], e["name"]))
        elif ph == "i":
            assert e["s"] in ("g", "p", "t"), e
        elif ph == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
    for (pid, tid), spans in tracks.items():
        assert pid in process_names, f"process {pid} has no name"
        assert (pid, tid) in thread_names, f"track {pid}/{tid} has no name"
        stack = []
        for ts, dur, name in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][0] <= ts + EPS_US:
                stack.pop()
            if stack:
                assert ts + dur <= stack[-1][0] + EPS_US, \
                    f"{name} overlaps {stack[-1][1]} on track {pid}/{tid}"
            stack.append((ts + dur, name))
    return phases
