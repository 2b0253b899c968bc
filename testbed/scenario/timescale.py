"""The time scale of a run: which emulated link rate this machine can hold faithfully.

Pure: from a ``Calibration`` (how busy this machine's CPUs were while a reference fabric ran at
a known rate, per policy) it predicts how busy a run would keep them and chooses the fastest
GPU NIC rate from ``RATE_STEPS`` that fits two bounds:

* CPU: the predicted busy share stays under ``TARGET_BUSY``, linear in the GPU NICs' aggregate
  rate (frames per second through the fabric), Open vSwitch's part of it also in the switches
  a byte of the scenario's workload crosses against the calibrated ring's (``load_factor``:
  a job whose every byte crosses the spines costs it half as much again as a ring that keeps
  half its bytes inside a leaf);
* noise: the fidelity monitor's latency tolerances are a share of one frame's time at the GPU
  NIC rate, while the machine's own delays (agent timer lag, idle-path overhead) are absolute:
  the rate stays low enough that the delays measured at the reference rate keep
  ``NOISE_MARGIN`` inside the tolerance.

The calibration runs one reference fabric; a scenario whose traffic costs more per frame (an
all-to-all through more switches, background traffic, DCQCN at work) can still be rejected by
the fidelity monitor at the rate it predicts. A run at ``auto`` then goes again at a slower
rate (``retry_rate``: from the rejected run's own figures), and this machine remembers that
rate for the scenario (``learn``): once it was rejected in two runs, its next runs start there
(``learned_cap``).

Each run records the choice beside what it measured, so the model's error stays visible
(docs/time-scale.md). The measurement itself is ``testbed.run.calibrate``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Mapping, Optional, Tuple

from controllers.params import REFERENCE_RATE_MBIT

from ..base.errors import ConfigError

AUTO = "auto"
# The mean share of the machine's CPUs a run may keep busy: the fidelity monitor wants 10%
# idle in 90% of its samples, and a run's p90 was 0.05-0.15 above its mean on the reference VM.
TARGET_BUSY = 0.75
# Rates auto may choose (Mbit/s): round numbers, so time scales compare across machines.
RATE_STEPS = (0.5, 1.0, 2.0, 2.5, 4.0, 5.0, 8.0, 10.0, 16.0, 20.0, 25.0, 32.0, 40.0, 50.0,
              64.0, 80.0, 100.0, 125.0, 160.0, 200.0, 250.0, 320.0, 400.0, 500.0, 640.0,
              800.0, 1000.0)
NOISE_MARGIN = 1.5  # measured delay x this must stay within the tolerance
CALIBRATION_VERSION = 5  # a new one when the reference run changes (5: Open vSwitch's share)
# A run at auto: the rate chosen first, then slower ones after rejections, this many in all
# (emulation.attempts says otherwise).
MAX_ATTEMPTS = 3
# Runs a scenario's policy must have been rejected in before its next runs start slower: one
# rejection may be a passing load (the default scenario, once, at 40 Mbit/s, CPUs p90 100%).
LEARN_AFTER = 2
# The checks whose measure is one of this machine's delays, absolute while the tolerance is a
# share of a frame's time: (what was measured, what was allowed) in the check's figures.
DELAY_CHECKS = {"agent_loop_lag": ("p95_us", "allowed_p95_us"),
                "idle_path_latency": ("overhead_us", "allowed_overhead_us")}


@dataclass(frozen=True)
class Calibration:
    """How busy this machine's CPUs were (mean share, 0..1) while ``gpus`` GPU NICs ran at
    ``host_rate_mbit`` each, per policy."""
    machine: str
    cpus: int
    measured: str  # ISO time
    gpus: int
    host_rate_mbit: float
    busy: Dict[str, float] = field(default_factory=dict)
    # per policy, the larger of agent timer lag p95 and idle-path overhead (us), and the
    # tolerance both had at the reference rate
    noise_us: Dict[str, float] = field(default_factory=dict)
    allowed_us: float = 0.0
    busy_before: float = 0.0  # the CPUs' busy share without the testbed, when measured
    # per policy, Open vSwitch's share of the run's CPU time, and the switches a byte of the
    # reference ring crossed on average (0: not measured)
    ovs_share: Dict[str, float] = field(default_factory=dict)
    hops: float = 0.0
    version: int = CALIBRATION_VERSION

    @property
    def nic_mbit(self) -> float:
        return self.gpus * self.host_rate_mbit

    def to_dict(self) -> dict:
        return {"machine": self.machine, "cpus": self.cpus, "measured": self.measured,
                "gpus": self.gpus, "host_rate_mbit": self.host_rate_mbit,
                "busy": dict(self.busy), "noise_us": dict(self.noise_us),
                "allowed_us": self.allowed_us, "busy_before": self.busy_before,
                "ovs_share": dict(self.ovs_share), "hops": self.hops,
                "version": self.version}

    @classmethod
    def from_dict(cls, d: dict) -> "Calibration":
        busy = {str(k): float(v) for k, v in d["busy"].items()}
        if not busy or any(not 0.0 < v <= 1.0 for v in busy.values()):
            raise ValueError(f"calibration: busy shares must be in (0, 1], got {busy}")
        return cls(machine=str(d["machine"]), cpus=int(d["cpus"]), measured=str(d["measured"]),
                   gpus=int(d["gpus"]), host_rate_mbit=float(d["host_rate_mbit"]), busy=busy,
                   noise_us={str(k): float(v) for k, v in d.get("noise_us", {}).items()},
                   allowed_us=float(d.get("allowed_us", 0.0)),
                   busy_before=float(d.get("busy_before", 0.0)),
                   ovs_share={str(k): float(v) for k, v in d.get("ovs_share", {}).items()},
                   hops=float(d.get("hops", 0.0)),
                   version=int(d.get("version", 0)))


@dataclass(frozen=True)
class Attempt:
    """A run at ``auto`` that the fidelity monitor rejected, and where its results are kept."""
    host_rate_mbit: float
    problems: Mapping[str, List[str]]  # rejected policy -> the monitor's problem lines
    kept_in: str  # the attempt's directory, relative to the run's

    def to_dict(self) -> dict:
        return {"host_rate_mbit": self.host_rate_mbit,
                "problems": {k: list(v) for k, v in self.problems.items()},
                "kept_in": self.kept_in}


@dataclass(frozen=True)
class Choice:
    """The GPU NIC rate a run uses, and why."""
    host_rate_mbit: float
    chosen_by: str  # "auto" (from the calibration) or "scenario" (an explicit rate)
    predicted_busy: float  # the calibration's prediction for the busiest policy, 0..1
    fits_mbit: float  # the fastest step predicted to fit
    calibration: Calibration
    # the rate earlier rejected runs of this scenario asked for on this machine
    learned_cap_mbit: Optional[float] = None
    attempts: Tuple[Attempt, ...] = ()  # rejected runs before this rate, first first
    hops: Optional[float] = None  # the switches a byte of the workload crosses (load_factor)

    @property
    def over_budget(self) -> bool:
        return self.predicted_busy > TARGET_BUSY

    def to_dict(self) -> dict:
        return {"host_rate_mbit": self.host_rate_mbit, "chosen_by": self.chosen_by,
                "predicted_busy": round(self.predicted_busy, 3), "target_busy": TARGET_BUSY,
                "fits_mbit": self.fits_mbit, "warning": warning(self),
                "learned_cap_mbit": self.learned_cap_mbit,
                "workload_hops": self.hops,
                "attempts": [a.to_dict() for a in self.attempts],
                "calibration": self.calibration.to_dict()}


def load_factor(cal: Calibration, policy: str, hops: Optional[float]) -> float:
    """A workload's CPU per NIC byte against the calibrated ring's: Open vSwitch's share of
    it scales with the switches a byte crosses (``hops`` against the ring's), the rest
    (agents, kernel) does not; 1 where either was not measured."""
    share = cal.ovs_share.get(policy, max(cal.ovs_share.values(), default=0.0))
    if not hops or not cal.hops or not share:
        return 1.0
    return 1.0 - share + share * hops / cal.hops


def predicted_busy(cal: Calibration, policies: Tuple[str, ...], nic_mbit: float,
                   hops: Optional[float] = None) -> float:
    """The mean CPU share the busiest of ``policies`` would keep with ``nic_mbit`` of GPU NICs
    carrying a workload whose bytes cross ``hops`` switches (a policy the calibration did not
    measure counts as its busiest one)."""
    worst = max(cal.busy.values())
    return max(cal.busy.get(p, worst) * load_factor(cal, p, hops)
               for p in policies) * nic_mbit / cal.nic_mbit


def noise_limit_mbit(cal: Calibration, policies: Tuple[str, ...]) -> float:
    """The fastest GPU NIC rate whose tolerances still hold the machine's own delays with
    ``NOISE_MARGIN`` (tolerances shrink as 1 / rate; infinite without a measurement)."""
    worst = max(cal.noise_us.values(), default=0.0)
    noise = max((cal.noise_us.get(p, worst) for p in policies), default=0.0)
    if noise <= 0 or cal.allowed_us <= 0:
        return float("inf")
    return cal.host_rate_mbit * cal.allowed_us / (noise * NOISE_MARGIN)


def fitting_rate(cal: Calibration, policies: Tuple[str, ...], gpus: int,
                 hops: Optional[float] = None) -> float:
    """The fastest of ``RATE_STEPS`` predicted to keep the CPUs under ``TARGET_BUSY`` and the
    machine's delays inside the tolerances (the slowest step if none is)."""
    cap = noise_limit_mbit(cal, policies)
    fits = [r for r in RATE_STEPS
            if r <= cap and predicted_busy(cal, policies, r * gpus, hops) <= TARGET_BUSY]
    return fits[-1] if fits else RATE_STEPS[0]


def choose(host_rate_mbit, policies: Tuple[str, ...], gpus: int, cal: Calibration,
           cap_mbit: Optional[float] = None, hops: Optional[float] = None) -> Choice:
    """The rate of a run whose scenario says ``host_rate_mbit`` (a number or ``AUTO``);
    ``cap_mbit``: what this machine learned of the scenario (``learned_cap``); ``hops``: the
    switches a byte of its workload crosses (``load_factor``)."""
    fits = fitting_rate(cal, policies, gpus, hops)
    if cap_mbit is not None:
        fits = min(fits, cap_mbit)
    if host_rate_mbit == AUTO:
        rate, by = fits, "auto"
    else:
        rate, by = float(host_rate_mbit), "scenario"
    return Choice(rate, by, predicted_busy(cal, policies, rate * gpus, hops), fits, cal,
                  cap_mbit, hops=hops)


def attempts_allowed(setting, chosen_by: str) -> int:
    """The runs of every policy a run may make while the monitor rejects some: the scenario's
    ``emulation.attempts``, at ``AUTO`` ``MAX_ATTEMPTS`` for a rate auto chose and one for
    a rate the scenario gave."""
    if setting != AUTO:
        return int(setting)
    return MAX_ATTEMPTS if chosen_by == "auto" else 1


def step_below(rate_mbit: float) -> Optional[float]:
    """The fastest of ``RATE_STEPS`` slower than ``rate_mbit`` (None below the slowest)."""
    slower = [r for r in RATE_STEPS if r < rate_mbit]
    return slower[-1] if slower else None


def learn(entry: Mapping, asked: Optional[float], first: bool, capped: bool) -> dict:
    """What this machine keeps of a scenario's policy after one attempt at ``auto``:
    ``asked`` the rate its rejection asked for (None: it passed), ``first`` whether it was the
    run's first attempt, ``capped`` whether that ran at the kept rate. The rate asked for is
    kept (the slowest so far); a first attempt rejected counts one more rejected run, one
    that passed at the calibration's own rate one fewer (a passing load made the other)."""
    cap, runs = entry.get("cap_mbit"), int(entry.get("rejected_runs", 0))
    if asked is not None:
        cap = asked if cap is None else min(cap, asked)
        runs += 1 if first else 0
    elif first and not capped and runs:
        runs -= 1
        cap = cap if runs else None
    return {"cap_mbit": cap, "rejected_runs": runs}


def learned_cap(entries: Mapping[str, Mapping], policies: Tuple[str, ...]) -> Optional[float]:
    """The rate a scenario's run of ``policies`` starts at or below on this machine: the
    slowest kept for a policy rejected in ``LEARN_AFTER`` runs (``learn``); None: none."""
    caps = [e["cap_mbit"] for p, e in entries.items()
            if p in policies and e.get("cap_mbit") and e.get("rejected_runs", 0) >= LEARN_AFTER]
    return min(caps) if caps else None


def retry_rate(rate_mbit: float, checks: Mapping[str, Mapping[str, dict]]) -> Optional[float]:
    """The rate to run again at after the monitor rejected some of the policies run at
    ``rate_mbit`` (``checks``: each policy's fidelity checks), or None when it rejected
    none or no slower step is left. A failed delay check asks for the rate whose tolerance
    holds the delay it measured (taken as this machine's, absolute; part of it is the load's
    and shrinks at the slower rate, which is the margin: oversubscribed under lossless, timer
    lag p95 631 us at 40 Mbit/s, 316 at 8); any other failed check (CPU, pacing, drops: the
    load) asks for half the rate - and so does a delay measured on saturated CPUs."""
    wanted = []
    for mine in checks.values():  # only failed checks ask for a rate
        saturated = (mine.get("cpu") or {}).get("ok") is False
        for name, check in mine.items():
            if check.get("ok") is not False:
                continue
            measured, allowed = (check.get(k) for k in DELAY_CHECKS.get(name, ("", "")))
            if measured and allowed and not saturated:
                wanted.append(rate_mbit * allowed / measured)
            else:
                wanted.append(rate_mbit / 2)
    below = step_below(rate_mbit)
    if not wanted or below is None:
        return None
    fits = [r for r in RATE_STEPS if r <= min(min(wanted), below)]
    return fits[-1] if fits else RATE_STEPS[0]


def retried(choice: Choice, rate_mbit: float, attempt: Attempt, policies: Tuple[str, ...],
            gpus: int) -> Choice:
    """The choice for the run again at ``rate_mbit`` after ``attempt`` was rejected."""
    return replace(choice, host_rate_mbit=rate_mbit,
                   predicted_busy=predicted_busy(choice.calibration, policies,
                                                 rate_mbit * gpus, choice.hops),
                   attempts=choice.attempts + (attempt,))


def warning(choice: Choice) -> Optional[str]:
    """What to tell the user before a run whose explicit rate exceeds the budget."""
    if choice.chosen_by != "scenario" or choice.host_rate_mbit <= choice.fits_mbit:
        return None
    c = choice.calibration
    if choice.over_budget:
        why = (f"is predicted to keep {choice.predicted_busy:.0%} of this machine's {c.cpus} "
               f"CPUs busy (a faithful run needs at most {TARGET_BUSY:.0%})")
    else:
        why = ("leaves the fidelity tolerances (a share of one frame's time) too little room "
               "for this machine's own timer and forwarding delays")
    return (f"topology.host_rate_mbit {choice.host_rate_mbit:g} {why}: the fidelity monitor "
            f"will likely reject the run; {choice.fits_mbit:g} Mbit/s would fit (or "
            f"host_rate_mbit: auto; calibration of {c.measured}, python -m testbed calibrate "
            "redoes it)")


def retry_text(attempt: Attempt, rate_mbit: float) -> str:
    """The line that says why a run at ``auto`` goes again, and at which rate."""
    why = "; ".join(f"{name}: {lines[0]}" + (f" (and {len(lines) - 1} more)"
                                              if len(lines) > 1 else "")
                    for name, lines in attempt.problems.items())
    return (f"time scale: the fidelity monitor rejected the run at {attempt.host_rate_mbit:g} "
            f"Mbit/s ({why}); running it again at {rate_mbit:g} Mbit/s, where this machine's "
            f"delays and load fit (the rejected run is kept in {attempt.kept_in}/)")


def describe(choice: Choice, modelled_gbit: float) -> str:
    """One line for the start of a run."""
    scale = modelled_gbit * 1000 / choice.host_rate_mbit
    c = choice.calibration
    how = ("chosen for this machine" if choice.chosen_by == "auto" else "set by the scenario")
    if choice.chosen_by == "auto" and choice.learned_cap_mbit is not None \
            and choice.host_rate_mbit == choice.learned_cap_mbit:
        how += ", as earlier runs of this scenario here asked for"
    return (f"time scale: GPU NICs at {choice.host_rate_mbit:g} Mbit/s, {scale:,.0f}x slower "
            f"than the modelled {modelled_gbit:g} Gbit/s ({how}; predicted CPUs "
            f"{choice.predicted_busy:.0%} busy of {TARGET_BUSY:.0%} allowed, from the "
            f"calibration of {c.measured})")


def require_rate(host_rate_mbit) -> float:
    """``host_rate_mbit`` as a number, once the run has chosen it."""
    if host_rate_mbit == AUTO:
        raise ConfigError("topology.host_rate_mbit is auto: the runner chooses it before the "
                          "fabric is built (testbed.run.calibrate)")
    return float(host_rate_mbit)
