"""The Python API for scenario tests: run a scenario, get a typed result.

    from testbed.api import run_scenario
    result = run_scenario("oversubscribed", policies=["hyperscale", "lossless"],
                          workload={"iterations": 2})
    assert result.policy("lossless").drops == 0
    assert result.policy("lossless").cct_us.p50 < result.policy("hyperscale").cct_us.p50

``run_scenario`` takes a built-in name, a YAML file, a mapping or a ``Scenario``, plus partial
overrides; ``load_result`` reads a saved run directory. Results are frozen dataclasses mirroring
``results.json`` (docs/results.md); every figure keeps its name and unit suffix from there, and
``raw`` holds the whole dictionary for anything not surfaced here. A counter whose mechanism
was absent (no ECN, no PFC, no DCQCN) is ``None``. Times are emulated, as in ``results.json``;
``modelled`` holds the same time figures in the modelled fabric's time (divided by the time
scale), which is what compares across machines and rates:

    assert result.policy("lossless").modelled.cct_us.p50 < 200  # us at 100 Gbit/s
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from .config import Scenario
from .errors import ConfigError


def _from(cls, data: Optional[Mapping[str, Any]]):
    """``cls`` from the keys of ``data`` it declares (absent ones: None); None for None."""
    if data is None:
        return None
    values = {}
    for f in dataclasses.fields(cls):
        if f.name == "raw":
            values["raw"] = dict(data)
            continue
        v = data.get(f.name)
        if isinstance(v, list):
            v = tuple(v)
        values[f.name] = v
    return cls(**values)


@dataclass(frozen=True)
class Percentiles:
    p50: Optional[float] = None
    p99: Optional[float] = None
    p999: Optional[float] = None
    max: Optional[float] = None
    mean: Optional[float] = None
    count: Optional[int] = None


@dataclass(frozen=True)
class Cct:
    p50: Optional[float] = None
    p99: Optional[float] = None
    max: Optional[float] = None
    mean: Optional[float] = None
    per_iteration: Tuple[float, ...] = ()


@dataclass(frozen=True)
class Jitter:
    ipdv_abs_p50: Optional[float] = None
    ipdv_abs_p99: Optional[float] = None
    ipdv_abs_max: Optional[float] = None
    ipdv_count: Optional[int] = None
    p99_minus_p50: Optional[float] = None


@dataclass(frozen=True)
class StragglerIdle:
    per_iteration: Tuple[float, ...] = ()
    total: Optional[float] = None
    mean: Optional[float] = None


@dataclass(frozen=True)
class Modelled:
    """The time figures in the modelled fabric's time (results.json ``modelled``)."""
    cct_us: Optional[Cct] = None
    latency_us: Optional[Percentiles] = None
    jitter_us: Optional[Jitter] = None
    straggler_idle_us: Optional[StragglerIdle] = None
    pfc_paused_ms: Optional[float] = None

    @classmethod
    def parse(cls, d: Optional[Mapping[str, Any]]) -> Optional["Modelled"]:
        if not d:
            return None
        return cls(_from(Cct, d.get("cct_us")), _from(Percentiles, d.get("latency_us")),
                   _from(Jitter, d.get("jitter_us")),
                   _from(StragglerIdle, d.get("straggler_idle_us")), d.get("pfc_paused_ms"))


@dataclass(frozen=True)
class Fidelity:
    verdict: Optional[str] = None
    problems: Tuple[str, ...] = ()
    advice: Optional[str] = None
    checks: Optional[Dict[str, dict]] = None

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"


@dataclass(frozen=True)
class CollectiveResult:
    collective: str
    size_bytes: int
    iterations: int
    ranks: int
    cct_us: Optional[Cct]
    latency_us: Optional[Percentiles]
    jitter_us: Optional[Jitter]
    tail_ratio_p99_p50: Optional[float]
    algbw_gbps_emulated: Optional[float]
    busbw_gbps_emulated: Optional[float]
    algbw_gbps_modelled: Optional[float]
    busbw_gbps_modelled: Optional[float]
    straggler_idle_us: Optional[StragglerIdle]
    extrapolation: Optional[Dict[str, Any]]
    bytes_sent_per_rank: Optional[Dict[str, Any]]
    packets_received: Optional[int]
    retransmissions_received: Optional[int]
    ecn_marked_packets: Optional[int]
    modelled: Optional[Modelled] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def parse(cls, d: Mapping[str, Any]) -> "CollectiveResult":
        c = _from(cls, d)
        return dataclasses.replace(
            c, cct_us=_from(Cct, d.get("cct_us")), latency_us=_from(Percentiles, d.get("latency_us")),
            jitter_us=_from(Jitter, d.get("jitter_us")),
            straggler_idle_us=_from(StragglerIdle, d.get("straggler_idle_us")),
            modelled=Modelled.parse(d.get("modelled")))


@dataclass(frozen=True)
class PolicyResult:
    name: str
    gpus: Optional[int]
    packets_sent: Optional[int]
    packets_received: Optional[int]
    drops: Optional[int]
    switch_queue_drops: Optional[int]
    unexplained_drops: Optional[int]
    retransmitted_packets: Optional[int]
    naks: Optional[int]
    rto_timeouts: Optional[int]
    ecn_marked_packets: Optional[int]
    cnps_sent: Optional[int]
    pfc_pause_events: Optional[int]
    pfc_paused_ms: Optional[float]
    latency_us: Optional[Percentiles]
    jitter_us: Optional[Jitter]
    tail_ratio_p99_p50: Optional[float]
    cct_us: Optional[Cct]
    busbw_gbps_modelled: Optional[float]
    straggler_idle_us: Optional[StragglerIdle]
    extrapolation: Optional[Dict[str, Any]]
    spine_load_packets: Optional[Dict[str, int]]
    collectives: Tuple[CollectiveResult, ...]
    fidelity: Optional[Fidelity]
    background: Optional[Dict[str, Any]]
    pcap: Optional[Dict[str, Dict[str, Any]]] = None
    ecn_marking: Optional[str] = None  # "red" (kernel), "sampled" (emulator), None (no ECN)
    ecn_marking_via: Optional[str] = None  # sampled marking applied by "bpf" or "openflow"
    per_hop_latency: Optional[Dict[str, Any]] = None  # model, what was applied, floors seen
    rxe: Optional[Dict[str, Any]] = None  # --traffic rxe: mode and perftest figures
    queued_at_end: Optional[int] = None  # frames still in the fabric's queues at the end
    modelled: Optional[Modelled] = None  # the time figures in the modelled fabric's time
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def parse(cls, name: str, d: Mapping[str, Any]) -> "PolicyResult":
        p = _from(cls, dict(d, name=name))
        fid = d.get("fidelity")
        return dataclasses.replace(
            p, latency_us=_from(Percentiles, d.get("latency_us")),
            jitter_us=_from(Jitter, d.get("jitter_us")), cct_us=_from(Cct, d.get("cct_us")),
            straggler_idle_us=_from(StragglerIdle, d.get("straggler_idle_us")),
            collectives=tuple(CollectiveResult.parse(c) for c in d.get("collectives") or ()),
            fidelity=_from(Fidelity, fid) if fid else None,
            modelled=Modelled.parse(d.get("modelled")))

    def collective(self, size_bytes: Optional[int] = None) -> CollectiveResult:
        """The collective's figures (at ``size_bytes`` in a sweep)."""
        for c in self.collectives:
            if size_bytes is None or c.size_bytes == size_bytes:
                return c
        sizes = ", ".join(str(c.size_bytes) for c in self.collectives)
        raise KeyError(f"{self.name}: no collective of {size_bytes} B (sizes: {sizes})")


@dataclass(frozen=True)
class RunResult:
    run_dir: str
    status: str
    scenario: Scenario
    policies: Dict[str, PolicyResult]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    def policy(self, name: str) -> PolicyResult:
        if name not in self.policies:
            raise KeyError(f"policy {name!r} was not run (ran: {', '.join(self.policies)})")
        return self.policies[name]

    @classmethod
    def parse(cls, run_dir: str, d: Mapping[str, Any]) -> "RunResult":
        return cls(run_dir, d.get("status", "unknown"), Scenario.from_dict(d["scenario"]),
                   {n: PolicyResult.parse(n, p) for n, p in (d.get("policies") or {}).items()},
                   dict(d))


def load_result(run_dir: str) -> RunResult:
    """The result of a saved run (its ``results.json``)."""
    from .rundata import load_results

    data = load_results(run_dir)
    try:
        return RunResult.parse(run_dir, data)
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{os.path.join(run_dir, 'results.json')}: not a testbed results "
                          f"file ({e})")


ScenarioLike = Union[str, Mapping[str, Any], Scenario]


def scenario_of(spec: ScenarioLike, policies=None, **overrides) -> Scenario:
    """A ``Scenario`` from a built-in name, a file, a mapping or a ``Scenario``, with overrides
    (partial sections, e.g. ``workload={"iterations": 2}``)."""
    from .catalog import find

    if isinstance(spec, Scenario):
        scenario = spec
    elif isinstance(spec, Mapping):
        scenario = Scenario.from_dict(spec)
    else:
        scenario = find(str(spec))
    if overrides:
        scenario = scenario.override(overrides)
    if policies:
        scenario = scenario.with_policies(policies)
    return scenario


def run_scenario(spec: ScenarioLike, policies=None, out_root: str = "results",
                 progress=lambda message: None, **overrides) -> RunResult:
    """Run a scenario on real fabrics (root and Open vSwitch needed) and return its result."""
    from . import runner

    results, run_dir = runner.run(scenario_of(spec, policies, **overrides), out_root=out_root,
                                  progress=progress)
    return RunResult.parse(run_dir, results)
