"""Calibration (thin edge of ``testbed.scenario.timescale``): how busy this machine's CPUs get
while the reference fabric - the ring scenario, 8 GPUs at 40 Mbit/s - runs under each
policy.

Measured once per machine by short real runs, kept in ``cache_path()`` (keyed by the machine: its
id, CPUs, memory and kernel), and redone by ``python -m testbed calibrate``. What else the
machine does would be charged to the fabric, so it first waits for the CPUs to be quiet and
runs the reference ``ROUNDS`` times, keeping per policy the least busy and least delayed
round: a passing load makes one round worse, not the machine's answer.

Beside it, ``learned_path()`` keeps what runs at ``auto`` taught: per scenario and policy, the rate
its rejected runs asked for (``timescale.retry_rate``) and in how many runs it was rejected
(``timescale.learn``). It belongs to the calibration it was learned under: a new calibration
starts it afresh.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from typing import Callable, Dict, Optional

from ..base.atomic import write_json_atomic
from ..base.errors import TestbedError
from ..job.plan import switch_hops
from ..results.model import FidelityChecks, IdlePathCheck, LagCheck, RunResult
from ..scenario import timescale
from ..scenario.timescale import CALIBRATION_VERSION, REFERENCE_RATE_MBIT, Calibration
from .fidelity import busy_between, cpu_counters


MACHINE_DIR = "/var/lib/ai-fabric-testbed"


def cache_dir() -> str:
    """Where this machine's calibration and learned rates are kept (``TESTBED_CACHE_DIR``
    moves them; read at each use, so a test session can point it elsewhere)."""
    return os.environ.get("TESTBED_CACHE_DIR", MACHINE_DIR)


def cache_path() -> str:
    return os.path.join(cache_dir(), "calibration.json")


def learned_path() -> str:
    return os.path.join(cache_dir(), "scenarios.json")


REFERENCE_GPUS_PER_LEAF, REFERENCE_LEAVES = 2, 4
REFERENCE_ITERATIONS = 5
ROUNDS = 2
QUIET_BUSY = 0.15  # the CPUs' busy share below which the machine counts as quiet
QUIET_WAIT_S = 20.0


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


def load(path: str = "") -> Optional[Calibration]:
    """This machine's calibration, if one was measured here (None otherwise)."""
    try:
        with open(path or cache_path(), encoding="utf-8") as f:
            cal = Calibration.from_dict(json.load(f))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if cal.machine != machine_key() or cal.version != CALIBRATION_VERSION:
        return None
    return cal


def measure(progress: Callable[[str], None] = lambda s: None, path: str = "") -> Calibration:
    """Run the reference fabric under every policy and keep how busy the CPUs were."""
    from . import runner  # the runner chooses rates from this module's answer
    from ..scenario.config import Scenario

    scenario = Scenario.from_dict({
        "name": "calibration",
        "topology": {"leaves": REFERENCE_LEAVES, "gpus_per_leaf": REFERENCE_GPUS_PER_LEAF,
                     "host_rate_mbit": REFERENCE_RATE_MBIT},
        "workload": {"iterations": REFERENCE_ITERATIONS}})
    progress(f"calibrating this machine once: the reference fabric ({scenario.topology.gpus} "
             f"GPUs at {REFERENCE_RATE_MBIT:g} Mbit/s) under each policy, {ROUNDS} rounds, "
             "about 40 s")
    before = wait_quiet(progress)
    rounds = []
    for _ in range(ROUNDS):
        work = tempfile.mkdtemp(prefix="testbed-calibration-")
        try:
            result = runner.run(scenario, out_root=work, progress=_outcomes(progress),
                                calibrated=False)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        rounds.append(round_figures(result))
    # per policy the quietest round's busy share and delay, the busiest round's OVS share
    busy = {n: min(r[n][0] for r in rounds) for n in rounds[0]}
    noise = {n: min(r[n][1] for r in rounds) for n in rounds[0]}
    ovs = {n: max(r[n][3] for r in rounds) for n in rounds[0]}
    allowed = next((f[2] for r in reversed(rounds) for f in reversed(list(r.values())) if f[2]),
                   0.0)
    cal = Calibration(machine=machine_key(), cpus=os.cpu_count() or 1,
                      measured=time.strftime("%Y-%m-%d %H:%M", time.localtime()),
                      gpus=scenario.topology.gpus, host_rate_mbit=REFERENCE_RATE_MBIT, busy=busy,
                      noise_us=noise, allowed_us=float(allowed), busy_before=round(before, 3),
                      ovs_share=ovs, hops=round(switch_hops(scenario), 3))
    path = path or cache_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json_atomic(path, cal.to_dict())
    return cal


def round_figures(run: RunResult) -> dict:
    """Per policy of one reference run (pure): (CPU busy share, the machine's delay - the
    larger of agent timer lag p95 and idle-path overhead, us -, the tolerance both had, Open
    vSwitch's share of the run's CPU time)."""
    out = {}
    for name, p in run.policies.items():
        cost = p.emulation_cost
        share = cost.busy_share if cost else None
        if not share:
            raise TestbedError(f"calibration: the {name} run measured no CPU share")
        checks = (p.fidelity.checks if p.fidelity else None) or FidelityChecks()
        lag = checks.agent_loop_lag or LagCheck()
        idle = checks.idle_path_latency or IdlePathCheck()
        delay = max(lag.p95_us or 0.0, idle.overhead_us or 0.0)
        ovs = cost.cpu_s["open_vswitch"] / max(cost.total_cpu_s or 0.0, 1e-9)
        out[name] = (float(share), delay, lag.allowed_p95_us or idle.allowed_overhead_us or 0.0,
                     round(ovs, 3))
    return out


def busy_share(seconds: float = 1.0) -> float:
    """How busy the machine's CPUs were over the next ``seconds`` (0..1)."""
    last = cpu_counters()
    time.sleep(seconds)
    return busy_between(last, cpu_counters()) or 0.0


def wait_quiet(progress: Callable[[str], None]) -> float:
    """Wait (up to ``QUIET_WAIT_S``) for the CPUs to be quiet; their busy share when the
    calibration starts."""
    deadline = time.monotonic() + QUIET_WAIT_S
    share = busy_share()
    while share > QUIET_BUSY and time.monotonic() < deadline:
        progress(f"calibration: waiting for a quiet machine (CPUs {share:.0%} busy)")
        share = busy_share(2.0)
    if share > QUIET_BUSY:
        progress(f"calibration: the CPUs stay {share:.0%} busy without the testbed: the "
                 "rates chosen leave that load room; calibrate again once it is gone")
    return share


def scenario_key(scenario, policy: str) -> str:
    """What a policy's run of ``scenario`` costs this machine depends on: everything but the
    scenario's name, its rates (``auto`` here), its other policies, how many iterations and
    how many attempts it may make."""
    d = scenario.to_dict()
    for key in ("name", "policies", "policy_params"):
        d.pop(key, None)
    d["workload"] = {k: v for k, v in d["workload"].items() if k != "iterations"}
    d["emulation"] = {k: v for k, v in d["emulation"].items() if k != "attempts"}
    d["policy"] = [policy, scenario.policy_params.get(policy, {})]
    text = json.dumps(d, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _learned_file(cal: Calibration, path: str) -> dict:
    """The learned caps under ``cal`` (empty if none, or learned under another calibration)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if data["machine"] == cal.machine and data["calibration"] == cal.measured:
            return data
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return {"machine": cal.machine, "calibration": cal.measured, "caps": {}}


def learned(scenario, cal: Calibration, path: str = "") -> Dict[str, dict]:
    """Policy -> what this machine kept of its runs of ``scenario`` (``timescale.learn``)."""
    kept = _learned_file(cal, path or learned_path())["caps"]
    out = {}
    for policy in scenario.policies:
        entry = kept.get(scenario_key(scenario, policy))
        if entry:
            out[policy] = entry
    return out


def remember(scenario, cal: Calibration, asked: Dict[str, Optional[float]], first: bool,
             capped: bool, path: str = "") -> None:
    """Keep what one attempt of ``scenario`` at ``auto`` taught (``asked``: policy -> the rate
    its rejection asked for, None where it passed; see ``timescale.learn``)."""
    path = path or learned_path()
    data = _learned_file(cal, path)
    for policy, rate in asked.items():
        key = scenario_key(scenario, policy)
        entry = timescale.learn(data["caps"].get(key, {}), rate, first, capped)
        if entry["cap_mbit"] is None:
            data["caps"].pop(key, None)
            continue
        data["caps"][key] = dict(entry, scenario=scenario.name, policy=policy,
                                 updated=time.strftime("%Y-%m-%d %H:%M", time.localtime()))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json_atomic(path, data)


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
