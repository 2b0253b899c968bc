"""What a validation case is: the runs it needs and the rule that judges their results (pure).

A case decides by sign and rough size with the tolerance its row states, never by an exact
figure; the sources are in docs/REFERENCE.md ("What the validation suite cites").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Tuple

from ..results.model import RunResult
from ..scenario.config import Scenario

# no congestion control and no ECN: what a case compares congestion control against
BARE = {"transport": {"congestion_control": "none"},
        "policy_params": {"hyperscale": {"ecn": "off"}}}


@dataclass(frozen=True)
class Run:
    """One run a case needs: a label, the scenario (its policies included)."""
    label: str
    scenario: Scenario


@dataclass(frozen=True)
class Verdict:
    """What a case measured and whether it holds. ``bars``: (figure, the model's value or
    bound, measured) for the suite's plot."""
    measured: str
    ok: bool
    why: str = ""
    bars: Tuple[Tuple[str, object, float], ...] = ()


@dataclass(frozen=True)
class Case:
    name: str
    title: str
    citation: str
    published: str
    predicts: str
    tolerance: str
    runs: Callable[[bool], List[Run]]  # quick -> the runs
    judge: Callable[[Dict[str, RunResult]], Verdict]
    notes: str = field(default="", compare=False)
