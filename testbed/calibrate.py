"""Calibration (thin edge of ``testbed.timescale``): how busy this machine's CPUs get while the
reference fabric - the default scenario, 8 GPUs at 40 Mbit/s - runs under each policy.

Measured once per machine by a short real run, kept in ``CACHE`` (keyed by the machine: its
id, CPUs, memory and kernel), and redone by ``python -m testbed calibrate``.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from typing import Callable, Optional

from .errors import TestbedError
from .results import write_json_atomic
from .timescale import CALIBRATION_VERSION, REFERENCE_RATE_MBIT, Calibration

CACHE = os.path.join(os.environ.get("TESTBED_CACHE_DIR", "/var/lib/ai-fabric-testbed"),
                     "calibration.json")
REFERENCE_GPUS_PER_LEAF, REFERENCE_LEAVES = 2, 4
REFERENCE_ITERATIONS = 5


def machine_key() -> str:
    """Which machine this is, as far as its CPU budget goes."""
    parts = [platform.release(), str(os.cpu_count())]
    for path, prefix in (("/etc/machine-id", ""), ("/proc/cpuinfo", "model name"),
                         ("/proc/meminfo", "MemTotal")):
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                parts += [line.strip() for line in f if line.startswith(prefix)][:1]
        except OSError:
            parts.append("")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def load(path: str = CACHE) -> Optional[Calibration]:
    """This machine's calibration, if one was measured here (None otherwise)."""
    try:
        with open(path, encoding="utf-8") as f:
            cal = Calibration.from_dict(json.load(f))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if cal.machine != machine_key() or cal.version != CALIBRATION_VERSION:
        return None
    return cal


def measure(progress: Callable[[str], None] = lambda s: None, path: str = CACHE) -> Calibration:
    """Run the reference fabric under every policy and keep how busy the CPUs were."""
    from . import runner  # the runner chooses rates from this module's answer
    from .config import Scenario

    scenario = Scenario.from_dict({
        "name": "calibration",
        "topology": {"leaves": REFERENCE_LEAVES, "gpus_per_leaf": REFERENCE_GPUS_PER_LEAF,
                     "host_rate_mbit": REFERENCE_RATE_MBIT},
        "workload": {"iterations": REFERENCE_ITERATIONS}})
    progress(f"calibrating this machine once: the reference fabric ({scenario.topology.gpus} "
             f"GPUs at {REFERENCE_RATE_MBIT:g} Mbit/s) under each policy, about 20 s")
    work = tempfile.mkdtemp(prefix="testbed-calibration-")
    try:
        results, _ = runner.run(scenario, out_root=work, progress=_outcomes(progress),
                                calibrated=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    busy, noise, allowed = {}, {}, 0.0
    for name, p in results["policies"].items():
        share = (p.get("emulation_cost") or {}).get("busy_share")
        if not share:
            raise TestbedError(f"calibration: the {name} run measured no CPU share")
        busy[name] = float(share)
        checks = (p.get("fidelity") or {}).get("checks") or {}
        lag, idle = checks.get("agent_loop_lag") or {}, checks.get("idle_path_latency") or {}
        noise[name] = max(lag.get("p95_us") or 0.0, idle.get("overhead_us") or 0.0)
        allowed = lag.get("allowed_p95_us") or idle.get("allowed_overhead_us") or allowed
    cal = Calibration(machine=machine_key(), cpus=os.cpu_count() or 1,
                      measured=time.strftime("%Y-%m-%d %H:%M", time.localtime()),
                      gpus=scenario.topology.gpus, host_rate_mbit=REFERENCE_RATE_MBIT, busy=busy,
                      noise_us=noise, allowed_us=float(allowed))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json_atomic(path, cal.to_dict())
    return cal


def _outcomes(progress: Callable[[str], None]) -> Callable[[str], None]:
    """The reference run's progress, one line per policy run ("calibration: [hyperscale 2/3]
    done: ..."); its other lines would read like the user's own run."""
    def say(line: str) -> None:
        if "] done: " in line:
            progress(f"calibration: {line}")
    return say


def calibration(progress: Callable[[str], None] = lambda s: None) -> Calibration:
    """This machine's calibration, measured first if there is none."""
    return load() or measure(progress)
