"""The Python API for scenario tests: run a scenario, get a typed result.

    from testbed.api import run_scenario
    result = run_scenario("oversubscribed", policies=["hyperscale", "lossless"],
                          workload={"iterations": 2})
    assert result.policy("lossless").drops == 0
    assert result.policy("lossless").cct_us.p50 < result.policy("hyperscale").cct_us.p50

``run_scenario`` takes a built-in name, a YAML file, a mapping or a ``Scenario``, plus partial
overrides; ``load_result`` reads a saved run directory. Results are the frozen dataclasses of
``testbed.results.model`` mirroring ``results.json`` (docs/results.md); every figure keeps its
name from there, and ``raw`` holds the whole dictionary. A counter whose mechanism was absent
(no ECN, no PFC, no DCQCN) is ``None``. Times are the modelled fabric's, as the printed table
shows them (emulated / time scale); ``.emulated`` is the same result in emulated time, as run:

    assert result.policy("lossless").cct_us.p50 < 200  # us at 100 Gbit/s
    assert result.policy("lossless").emulated.cct_us.p50 > 100_000  # us on this machine

A model a test compares with counts frames as the wire does: ``roce_frame_bytes(payload)``
(a data packet) and ``ack_frame_bytes()``.
"""
from __future__ import annotations

from typing import Any, Mapping, Union

from .base.frames import ack_frame_bytes, roce_frame_bytes
from .results import breakdown
from .results.model import (Cct, CollectiveResult, EmulationCost, Fidelity, FidelityChecks,
                            Jitter, JobResult, Modelled, Percentiles, PolicyResult, RunResult,
                            StragglerIdle)
from .scenario.config import Scenario

__all__ = ["run_scenario", "load_result", "scenario_of", "RunResult", "PolicyResult",
           "CollectiveResult", "JobResult", "Percentiles", "Cct", "Jitter", "StragglerIdle",
           "Modelled", "Fidelity", "FidelityChecks", "EmulationCost", "OPERATIONS_CSV",
           "roce_frame_bytes", "ack_frame_bytes"]

OPERATIONS_CSV = (breakdown.FILE, breakdown.COLUMN_DOCS)  # a run's operations.csv: its columns


def load_result(run_dir: str) -> RunResult:
    """The result of a saved run (its ``results.json``)."""
    from .results.rundata import load_run

    return load_run(run_dir)


ScenarioLike = Union[str, Mapping[str, Any], Scenario]


def scenario_of(spec: ScenarioLike, policies=None, **overrides) -> Scenario:
    """A ``Scenario`` from a built-in name, a file, a mapping or a ``Scenario``, with overrides
    (partial sections, e.g. ``workload={"iterations": 2}``)."""
    from .scenario.catalog import find

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
    from .run import runner

    return runner.run(scenario_of(spec, policies, **overrides), out_root=out_root,
                      progress=progress)
