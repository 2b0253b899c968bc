"""``python -m testbed compare A B``: what changed between two saved runs (pure text).

For every policy both runs hold, each figure of the comparison table side by side with its
change; then the scenario keys that differ, so a difference in figures can be traced to a
difference in set-up.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

from . import report
from .model import RunResult


def flatten(d: Any, prefix: str = "") -> Dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists stay values)."""
    if not isinstance(d, dict):
        return {prefix: d}
    out: Dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


ABSENT = object()  # a key one scenario has and the other has not


def scenario_diff(a: dict, b: dict) -> List[Tuple[str, Any, Any]]:
    fa, fb = flatten(a or {}), flatten(b or {})
    return [(k, fa.get(k, ABSENT), fb.get(k, ABSENT)) for k in sorted(set(fa) | set(fb))
            if fa.get(k, ABSENT) != fb.get(k, ABSENT)]


def _change(a, b) -> str:
    if isinstance(a, bool) or isinstance(b, bool):
        return "" if a == b else "changed"
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        delta = b - a
        if delta == 0:
            return "="
        text = f"{delta:+,.1f}" if isinstance(delta, float) else f"{delta:+,}"
        if a:
            text += f" ({100.0 * delta / abs(a):+.0f}%)"
        return text
    return "=" if a == b else "changed"


def compare(a: RunResult, b: RunResult, label_a: str = "A", label_b: str = "B") -> str:
    pa, pb = a.policies, b.policies
    out = [f"A = {label_a} ({a.scenario.name or '?'}, {a.status})",
           f"B = {label_b} ({b.scenario.name or '?'}, {b.status})"]
    both = [n for n in pa if n in pb]
    only = [f"{n} only in A" for n in pa if n not in pb] + \
           [f"{n} only in B" for n in pb if n not in pa]
    if only:
        out.append("policies not compared: " + ", ".join(only))
    # times in the modelled fabric's where both runs have them: runs at two time scales compare
    modelled = report.modelled_time(a) and report.modelled_time(b)
    out.append("times: " + ("the modelled fabric's" if modelled else "emulated"))
    for name in both:
        rows = []
        for label, get in report.ROWS:
            va = get(report.view(pa[name], not modelled))
            vb = get(report.view(pb[name], not modelled))
            if va is None and vb is None:
                continue
            show = report.sig if modelled and label in report.TIME_ROWS else report.fmt
            rows.append([label, show(va), show(vb), _change(va, vb)])
        out.append(report.table([name, "A", "B", "B - A"], rows))
    diff = scenario_diff(a.raw["scenario"], b.raw["scenario"])  # as the runs wrote them
    if diff:
        out.append(report.table(["scenario key", "A", "B"],
                                 [[k, _value(va), _value(vb)] for k, va, vb in diff]))
    else:
        out.append("scenarios: identical")
    if not both:
        out.append("no policy ran in both: nothing to compare figure by figure")
    return "\n\n".join(out)


def _value(v) -> str:
    if v is ABSENT:
        return "(absent)"
    if v is None:
        return "null"
    return f"{v:g}" if isinstance(v, float) else str(v)
