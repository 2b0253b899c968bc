"""``timeline-<policy>.json``: one policy's run in the Chrome trace event format, which Perfetto
(ui.perfetto.dev, "Open trace file") and chrome://tracing open.

One process per GPU (its host and rank) with a thread per track: ``iterations``, ``compute``
(compute spans, and the waits between them charged to the op waited for), one per
communication stream (a stream whose ops overlap gets more lanes: events on one track never
overlap) and ``NIC`` (instants: PFC pauses of its queue, retransmission timeouts, NAKs). One
process per switch with a counter track per port: the largest backlog of the port's watched
class per emulator window, and instants when PFC paused one of its queues.

Times (``ts``, ``dur``) are modelled microseconds since the first GPU's first iteration began
(emulated time / time scale); each event's args hold its emulated start (``emulated_us``).
Bounded: at most ``MAX_SPAN_EVENTS`` span events - whole iterations, the first and the slowest
first, the rest in order while they fit; ``otherData.omitted_iterations`` names what was left
out - at most ``MAX_COUNTER_EVENTS`` counter samples (neighbouring windows merged, peaks
kept) and the first ``MAX_INSTANT_EVENTS`` RTOs and NAKs (``omitted_instants``: the rest).
Pure: ``build`` takes the records' rows; ``write`` is the file edge.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

from ..base.atomic import write_atomic

MAX_SPAN_EVENTS = 250_000
MAX_COUNTER_EVENTS = 100_000
MAX_INSTANT_EVENTS = 50_000  # RTOs and NAKs: the first ones in time
SWITCH_PID = 100_000  # switches' process ids start here (GPUs: rank + 1)
ITERATIONS_TID, COMPUTE_TID, NIC_TID, FIRST_STREAM_TID = 0, 1, 2, 10

Wait = Tuple[int, int, str, str]  # start ns, end ns, kind waited for, op waited for


class Clock:
    """Emulated ns since the epoch -> modelled us since ``t0_ns``."""

    def __init__(self, t0_ns: int, time_scale: float):
        self.t0_ns, self.time_scale = t0_ns, time_scale

    def us(self, ns: int) -> float:
        return round((ns - self.t0_ns) / 1000 / self.time_scale, 3)

    def emulated_us(self, ns: int) -> float:
        return round((ns - self.t0_ns) / 1000, 3)


def build(hosts: Dict[int, str], spans: Sequence[dict], iterations: Sequence[dict],
          waits: Dict[Tuple[int, int], List[Wait]], events: Dict[int, Sequence[dict]],
          queue_timelines: Sequence[Sequence[dict]], time_scale: float,
          max_span_events: int = MAX_SPAN_EVENTS,
          max_counter_events: int = MAX_COUNTER_EVENTS,
          max_instant_events: int = MAX_INSTANT_EVENTS) -> dict:
    """The trace of one policy's run. ``hosts``: rank -> host; ``spans``, ``iterations`` and
    ``events`` (per rank) as the agents' CSV rows; ``waits``: (rank, iteration) -> the compute
    stream's waits; ``queue_timelines``: each queue emulator's timeline rows (none: no switch
    tracks)."""
    if not iterations:
        return {"traceEvents": [], "displayTimeUnit": "ms",
                "otherData": {"time_unit": "us, modelled", "time_scale": time_scale,
                              "iterations": 0}}
    clock = Clock(min(int(r["compute_start_ns"]) for r in iterations), time_scale)
    durations = _iteration_durations(iterations)
    per_it: Counter = Counter()  # iteration -> its span and wait events
    for s in spans:
        per_it[int(s["iteration"])] += 1
    for key, ws in waits.items():
        per_it[key[1]] += len(ws)
    kept = _kept_iterations(durations, per_it, max_span_events)
    out: List[dict] = []
    for rank, host in sorted(hosts.items()):
        pid = rank + 1
        out.append(_meta("process_name", pid, 0, f"{host} (rank {rank})"))
        out.append(_meta("process_sort_index", pid, 0, rank, key="sort_index"))
        for tid, name in ((ITERATIONS_TID, "iterations"), (COMPUTE_TID, "compute"),
                          (NIC_TID, "NIC")):
            out.append(_meta("thread_name", pid, tid, name))
    for r in iterations:
        it = int(r["iteration"])
        if it in kept:
            out.append(_complete(clock, f"iteration {it}", "iteration", int(r["rank"]) + 1,
                                 ITERATIONS_TID, int(r["compute_start_ns"]), int(r["end_ns"]),
                                 {"iteration": it, "collective": r["collective"],
                                  "size_bytes": int(r["size"])}))
    out += _span_events(clock, [s for s in spans if int(s["iteration"]) in kept])
    for (rank, it), ws in sorted(waits.items()):
        if it in kept:
            for start, end, kind, op in ws:
                out.append(_complete(clock, f"wait: {kind}", "wait", rank + 1, COMPUTE_TID,
                                     start, end, {"iteration": it, "waited_for": op,
                                                  "kind": kind}))
    instants = sorted(((int(e["t_ns"]), rank, e) for rank, rows in events.items() for e in rows),
                      key=lambda x: x[:2])  # events at one time on one GPU keep their order
    for t_ns, rank, e in instants[:max_instant_events]:
        kind = e["kind"]
        name = {"rto": "retransmission timeout", "nak": "NAK sent"}.get(kind, kind)
        out.append(_instant(clock, name, kind, rank + 1, t_ns, {"peer_rank": int(e["peer"])}))
    switches: Dict[str, int] = {}
    window_us = None
    for rows in queue_timelines:
        windows = _merged(rows, max_counter_events // len(queue_timelines))
        window_us = window_us or _window_us(windows, clock)
        out += _queue_events(clock, windows, {h: r for r, h in hosts.items()}, switches,
                             max(int(r["end_ns"]) for r in iterations))
    slowest = max(durations, key=lambda i: durations[i])
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"time_unit": "us, modelled (emulated time / time_scale)",
                          "time_scale": time_scale, "t0_ns_emulated": clock.t0_ns,
                          "iterations": len(durations), "first_iteration": min(durations),
                          "slowest_iteration": slowest,
                          "omitted_iterations": sorted(set(durations) - kept),
                          "omitted_instants": max(0, len(instants) - max_instant_events),
                          "queue_window_us_modelled": window_us}}


def _iteration_durations(iterations: Sequence[dict]) -> Dict[int, int]:
    """Iteration -> first rank's start to last rank's end (ns)."""
    starts: Dict[int, List[int]] = defaultdict(list)
    ends: Dict[int, List[int]] = defaultdict(list)
    for r in iterations:
        starts[int(r["iteration"])].append(int(r["compute_start_ns"]))
        ends[int(r["iteration"])].append(int(r["end_ns"]))
    return {it: max(ends[it]) - min(starts[it]) for it in starts}


def _kept_iterations(durations: Dict[int, int], events: Counter, budget: int) -> set:
    """The iterations whose events fit the budget: the first and the slowest always, then the
    rest in order."""
    first, slowest = min(durations), max(durations, key=lambda i: durations[i])
    kept = {first, slowest}
    used = sum(events[i] for i in kept)
    for it in sorted(durations):
        if it not in kept and used + events[it] <= budget:
            kept.add(it)
            used += events[it]
    return kept


def _span_events(clock: Clock, spans: Sequence[dict]) -> List[dict]:
    """Compute spans on the compute track; each communication stream's ops on its own lanes."""
    out: List[dict] = []
    lanes: Dict[Tuple[int, str], List[int]] = defaultdict(list)  # (pid, stream) -> lane ends
    tids: Dict[Tuple[int, str, int], int] = {}
    next_tid: Dict[int, int] = defaultdict(lambda: FIRST_STREAM_TID)
    order = sorted(spans, key=lambda s: (int(s["rank"]), int(s["start_ns"]),
                                         -int(s["end_ns"])))
    for s in order:
        pid = int(s["rank"]) + 1
        start, end = int(s["start_ns"]), int(s["end_ns"])
        args = {"iteration": int(s["iteration"]), "op": int(s["op"])}
        if s["kind"] == "compute":
            out.append(_complete(clock, s["name"], "compute", pid, COMPUTE_TID, start, end,
                                 args))
            continue
        stream = s["stream"]
        ends = lanes[(pid, stream)]
        lane = next((i for i, e in enumerate(ends) if e <= start), len(ends))
        if lane == len(ends):
            ends.append(end)
            tid = tids[(pid, stream, lane)] = next_tid[pid]
            next_tid[pid] += 1
            out.append(_meta("thread_name", pid, tid,
                             stream if lane == 0 else f"{stream} #{lane + 1}"))
        else:
            ends[lane] = end
        args.update(kind=s["comm_kind"], collective=s["collective"],
                    group=int(s["group_size"]), bytes=int(s["bytes"]))
        out.append(_complete(clock, s["name"], s["comm_kind"] or "comm", pid,
                             tids[(pid, stream, lane)], start, end, args))
    return out


def _merged(rows: Sequence[dict], budget: int) -> List[Tuple[int, Dict[str, float], set]]:
    """The timeline's windows as (start ns, port -> peak bytes, paused queues), neighbouring
    windows merged (peaks and pauses kept) until ports x windows fits ``budget``."""
    if not rows:
        return []
    ports = [k for k in rows[0] if k not in ("time_ns", "paused")]
    group = max(1, -(-len(rows) * max(1, len(ports)) // budget))
    out = []
    for i in range(0, len(rows), group):
        chunk = rows[i:i + group]
        out.append((int(chunk[0]["time_ns"]),
                    {p: max(float(r[p] or 0) for r in chunk) for p in ports},
                    set().union(*(r["paused"].split() for r in chunk))))
    return out


def _window_us(windows, clock: Clock) -> Optional[float]:
    if len(windows) < 2:
        return None
    return round((windows[1][0] - windows[0][0]) / 1000 / clock.time_scale, 3)


def _queue_events(clock: Clock, windows, rank_of_host: Dict[str, int],
                  switches: Dict[str, int], t_end: int) -> List[dict]:
    """Counter samples of each switch port (only when the peak changes) from the window
    before the first iteration to the last one's end; PFC pause instants on the paused
    queue's switch or GPU."""
    out: List[dict] = []
    t0 = clock.t0_ns
    last: Dict[str, float] = {}
    was_paused: set = set()
    inside = [w for w in windows if w[0] <= t_end]
    before = [w for w in inside if w[0] < t0]
    inside = ([before[-1]] if before else []) + [w for w in inside if w[0] >= t0]
    for start, peaks, paused in inside:
        at = max(start, t0)
        for port, value in peaks.items():
            pid = _switch_pid(switches, port, out)
            if last.get(port) != value:
                last[port] = value
                out.append({"ph": "C", "name": f"{port} backlog", "pid": pid,
                            "ts": clock.us(at), "args": {"bytes": value}})
        for queue in sorted(paused - was_paused):
            host = queue.split("-")[0]
            if host in rank_of_host:
                out.append(_instant(clock, "PFC pause", "pfc", rank_of_host[host] + 1, at,
                                    {"queue": queue}))
            else:
                out.append(_instant(clock, "PFC pause", "pfc", _switch_pid(switches, queue,
                                                                           out), at,
                                    {"queue": queue}, tid=0))
        was_paused = paused
    return out


def _switch_pid(switches: Dict[str, int], port: str, out: List[dict]) -> int:
    name = port.split("-")[0]
    if name not in switches:
        switches[name] = SWITCH_PID + len(switches)
        out.append(_meta("process_name", switches[name], 0, f"switch {name}"))
        out.append(_meta("process_sort_index", switches[name], 0, switches[name],
                         key="sort_index"))
    return switches[name]


def _meta(name: str, pid: int, tid: int, value, key: str = "name") -> dict:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": {key: value}}


def _complete(clock: Clock, name: str, cat: str, pid: int, tid: int, start: int, end: int,
              args: dict) -> dict:
    ts = clock.us(start)
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts,
            "dur": max(0.0, round(clock.us(end) - ts, 3)),
            "args": dict(args, emulated_us=clock.emulated_us(start))}


def _instant(clock: Clock, name: str, cat: str, pid: int, at: int, args: dict,
             tid: int = NIC_TID) -> dict:
    return {"ph": "i", "s": "t", "name": name, "cat": cat, "pid": pid, "tid": tid,
            "ts": clock.us(at), "args": dict(args, emulated_us=clock.emulated_us(at))}


def write(path: str, trace: dict) -> None:
    write_atomic(path, json.dumps(trace, separators=(",", ":")).encode("utf-8"))


def load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def iteration_bars(trace: dict, iteration: int) -> Dict[int, List[Tuple[str, float, float, str]]]:
    """Rank -> (track, start, duration, category) of the iteration's spans and waits, times in
    modelled us since the iteration's first start (what the report's Gantt draws)."""
    names: Dict[Tuple[int, int], str] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    bars: Dict[int, list] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["pid"] < SWITCH_PID and e["tid"] != ITERATIONS_TID \
                and e["args"]["iteration"] == iteration:
            bars[e["pid"] - 1].append((names[(e["pid"], e["tid"])], e["ts"], e["dur"],
                                       e["cat"]))
    if not bars:
        return {}
    t0 = min(b[1] for rank_bars in bars.values() for b in rank_bars)
    return {r: [(track, ts - t0, dur, cat) for track, ts, dur, cat in rank_bars]
            for r, rank_bars in sorted(bars.items())}

