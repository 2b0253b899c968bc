"""What the report draws, read back from a run directory (the files a run leaves behind).

Everything here reads files a run wrote - ``results.json``, the agents' records and the queue
emulator's timeline - so ``python -m testbed report DIR`` redraws any saved run.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from ..base.errors import ConfigError, ResultsError
from . import trace
from .packets import load_packets, read_csv
from .model import RunResult


def load_results(run_dir: str) -> dict:
    path = os.path.join(run_dir, "results.json")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise ConfigError(f"{run_dir}: no results.json there ({e.strerror})")
    except ValueError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})")
    if not isinstance(data, dict) or "policies" not in data:
        raise ConfigError(f"{path}: not a testbed results file")
    return data


def load_run(run_dir: str) -> RunResult:
    """The typed result of a saved run (its results.json)."""
    data = load_results(run_dir)
    try:
        return RunResult.from_json(run_dir, data)
    except (ValueError, KeyError, TypeError, ResultsError) as e:
        raise ConfigError(f"{os.path.join(run_dir, 'results.json')}: not a testbed results "
                          f"file ({e})")


def latencies(run_dir: str, policy: str, time_scale: float = 1.0):
    """Per-packet one-way latency (us; divided by ``time_scale``: modelled) of every data
    packet the GPUs received under ``policy`` (empty when the records are missing)."""
    records = os.path.join(run_dir, "records", policy)
    if not os.path.isdir(records):
        return []
    return load_packets(records).latency / time_scale


def ccts(results: RunResult, emulated: bool = False) -> Dict[str, List[float]]:
    """Series label -> CCT (us, modelled unless ``emulated``) per iteration; a sweep gives one
    series per size."""
    out: Dict[str, List[float]] = {}
    for name, p in results.policies.items():
        collectives = (p.emulated if emulated else p).collectives
        for c in collectives:
            label = name if len(collectives) == 1 else f"{name} {c.size_bytes:,} B"
            out[label] = list(c.cct_us.per_iteration if c.cct_us else ())
    return out


def iterations(results: RunResult, emulated: bool = False) -> Dict[str, List[float]]:
    """Policy -> a training job's iteration time (us, modelled unless ``emulated``) per
    iteration."""
    out = {}
    for name, p in results.policies.items():
        it = (p.emulated if emulated else p).iteration_us
        if it:
            out[name] = list(it.per_iteration)
    return out


def iteration_parts(results: RunResult) -> Dict[str, Dict[str, float]]:
    """Policy -> what a GPU's median iteration is made of, in modelled ms: compute, exposed
    communication per kind, and the iteration with a free network ("ideal"); every policy
    has every kind any of them waited for (0 where it did not)."""
    out: Dict[str, Dict[str, float]] = {}
    for name, p in results.policies.items():
        if p.time != "modelled" or not p.iteration_us:
            continue
        exposed = {k: v / 1000 for k, v in (p.exposed_comm_us or {}).items() if k != "total"}
        out[name] = {"compute": (p.job_compute_us or 0.0) / 1000, **exposed,
                     "ideal": (p.ideal_iteration_us or 0.0) / 1000}
    kinds = sorted({k for parts in out.values() for k in parts})
    return {name: dict.fromkeys(kinds, 0.0) | parts for name, parts in out.items()}


def headline_runs(results: RunResult):
    """With ``repeat``: (policy -> its runs' headline figure, what the figure is) - a job's
    iteration p50, else a collective's CCT p50, modelled ms; None with one run each."""
    if not results.spread:
        return None
    for key, what in (("iteration_p50_us", "iteration p50 (ms, modelled)"),
                      ("cct_p50_us", "CCT p50 (ms, modelled)")):
        values = {n: [v / 1000 for v in s[key]["values"]]
                  for n, s in results.spread.items() if key in s}
        if values:
            return values, what
    return None


def spine_loads(results: RunResult) -> Dict[str, Dict[str, int]]:
    return {name: dict(p.spine_load_packets) for name, p in results.policies.items()
            if p.spine_load_packets}


def trace_path(run_dir: str, policy: str) -> str:
    return os.path.join(run_dir, f"timeline-{policy}.json")


def gantt_panels(run_dir: str, policy: str):
    """(title, rank -> bars) of the first and the slowest iteration in the policy's
    timeline-<policy>.json (empty when the run wrote none)."""
    path = trace_path(run_dir, policy)
    if not os.path.exists(path):
        return []
    t = trace.load(path)
    info = t["otherData"]
    if not info["iterations"]:
        return []
    first, slowest = info["first_iteration"], info["slowest_iteration"]
    panels = [(f"first iteration ({first})", trace.iteration_bars(t, first))]
    if slowest != first:
        panels.append((f"slowest iteration ({slowest})", trace.iteration_bars(t, slowest)))
    return panels


@dataclass
class Timeline:
    """The queue emulator's timeline of one policy: per-port peak backlog per window, and the
    intervals in which PFC held each queue paused (seconds since the first window)."""

    t_s: List[float] = field(default_factory=list)
    backlogs: Dict[str, List[float]] = field(default_factory=dict)
    paused: Dict[str, List[Tuple[float, float]]] = field(default_factory=dict)

    def in_us(self, time_scale: float = 1.0) -> List[float]:
        """The windows' starts in us (divided by ``time_scale``: modelled)."""
        return [t * 1e6 / time_scale for t in self.t_s]

    def paused_us(self, time_scale: float = 1.0) -> Dict[str, List[Tuple[float, float]]]:
        return {q: [(a * 1e6 / time_scale, b * 1e6 / time_scale) for a, b in spans]
                for q, spans in self.paused.items()}


def timeline(run_dir: str, policy: str) -> Timeline:
    path = os.path.join(run_dir, f"switchq-{policy}.timeline.csv")
    out = Timeline()
    if not os.path.exists(path):
        return out
    rows = read_csv(path, ("time_ns", "paused"))
    if not rows:
        return out
    ports = [k for k in rows[0] if k not in ("time_ns", "paused")]
    t0 = int(rows[0]["time_ns"])
    out.t_s = [(int(r["time_ns"]) - t0) / 1e9 for r in rows]
    out.backlogs = {p: [float(r[p] or 0) for r in rows] for p in ports}
    ends = out.t_s[1:] + [out.t_s[-1] + (out.t_s[-1] - out.t_s[-2] if len(rows) > 1 else 0.005)]
    open_since: Dict[str, float] = {}
    for r, start, end in zip(rows, out.t_s, ends):
        now = set(r["paused"].split())
        for q in now - set(open_since):
            open_since[q] = start
        for q in set(open_since) - now:
            out.paused.setdefault(q, []).append((open_since.pop(q), start))
        last_end = end
    for q, start in open_since.items():
        out.paused.setdefault(q, []).append((start, last_end))
    out.paused = dict(sorted(out.paused.items()))
    return out
