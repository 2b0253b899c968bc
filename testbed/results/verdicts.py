"""What a run says of itself in a line each (pure text): a job that failed under a policy, a
run outside the fidelity monitor's tolerances, where the machine's CPU went."""
from __future__ import annotations

from typing import List, Optional

from .model import EmulationCost, JobFailed, RunResult

OUTCOMES = {"retry-exceeded": "failed: QP error", "stalled": "stalled"}


def outcome(failed: Optional[JobFailed]) -> str:
    """A policy's job as the table's ``job`` row says it (``job_failed``: None when it ran
    to its end)."""
    return "completed" if failed is None else OUTCOMES.get(failed.reason, "failed")


def job_failures(results: RunResult) -> List[str]:
    """One line per policy whose job failed: which QP, where, when and what it saw last."""
    return [f"{name}: the job {outcome(p.job_failed)}: {p.job_failed.text}"
            for name, p in results.policies.items() if p.job_failed]


def fidelity_warnings(results: RunResult) -> List[str]:
    """One line per policy whose run was outside the fidelity monitor's tolerances."""
    out = []
    for name, p in results.policies.items():
        f = p.fidelity
        if f is not None and f.verdict == "outside tolerance":
            out.append(f"warning: {name}: fidelity outside tolerance: "
                       f"{'; '.join(f.problems)}. {f.advice or ''}".rstrip())
    return out


def cost_text(cost: Optional[EmulationCost]) -> str:
    """One line: where the machine went (the report's line beside the fidelity verdict)."""
    if not cost:
        return "not measured"
    if cost.total_us_per_frame is None:
        return "no frames delivered"
    parts = [f"{name.replace('_', ' ')} {v:,.0f}" for name, v in cost.us_per_frame.items() if v]
    return (f"{cost.total_us_per_frame:,.0f} us CPU per frame ("
            + ", ".join(parts) + f"); CPUs {cost.busy_share:.0%} busy")
