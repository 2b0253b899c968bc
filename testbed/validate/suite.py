"""``python -m testbed validate``: run the validation cases on fresh fabrics and judge them.

Each case's runs go through the runner like any run (their directories under the suite's);
a run the fidelity monitor rejects goes again slower, at an explicit rate too, as a run at
``auto`` does (the runner's ``emulation.attempts``), and a case whose runs stay rejected is
"not measured faithfully", never a pass. The suite writes ``validation.json`` (every case's
verdict and run directories), ``validation.md`` (the table) and ``report.html`` (the table and
a plot per case) into its directory.
"""
from __future__ import annotations

import base64
import datetime
import json
import os
import textwrap
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from ..base.atomic import write_atomic
from ..results.model import RunResult
from ..run import runner
from ..scenario.timescale import AUTO, MAX_ATTEMPTS
from .case import Case, Run, Verdict

PASS, FAIL, UNFAITHFUL = "pass", "FAIL", "not measured faithfully"


@dataclass
class Outcome:
    case: Case
    verdict: Optional[Verdict]
    status: str  # PASS, FAIL or UNFAITHFUL
    runs: Dict[str, str]  # label -> run directory
    note: str = ""


def faithful(result: RunResult) -> List[str]:
    """The policies of a run the fidelity monitor rejected (empty: all faithful)."""
    return [name for name, p in result.policies.items() if not (p.fidelity and p.fidelity.ok)]


def run_case(case: Case, quick: bool, out_dir: str, say: Callable[[str], None]) -> Outcome:
    results: Dict[str, RunResult] = {}
    dirs: Dict[str, str] = {}
    runs = case.runs(quick)
    for k, run in enumerate(runs, 1):
        result, where = _faithful_run(run, out_dir, f"[{case.name} run {k}/{len(runs)}]", say)
        dirs[run.label] = where
        if result is None:
            return Outcome(case, None, UNFAITHFUL, dirs,
                           f"run {run.label!r} rejected by the fidelity monitor at every rate "
                           "it went (its run directory's rejected/ keeps the attempts)")
        results[run.label] = result
    verdict = case.judge(results)
    return Outcome(case, verdict, PASS if verdict.ok else FAIL, dirs, verdict.why)


def _faithful_run(run: Run, out_dir: str, prefix: str, say):
    """(result, run directory) of ``run``, going again slower while the monitor rejects it
    (``timescale.MAX_ATTEMPTS`` unless the case says); (None, directory) when it rejected
    the last attempt."""
    scenario = run.scenario
    if scenario.emulation.attempts == AUTO:
        scenario = scenario.override({"emulation": {"attempts": MAX_ATTEMPTS}})
    say(f"{prefix} {run.label}: {', '.join(scenario.policies)}")
    result = runner.run(scenario, out_root=out_dir, progress=lambda line: say(f"{prefix} {line}"))
    rejected = faithful(result)
    if rejected:
        say(f"{prefix} fidelity outside tolerance under {', '.join(rejected)}")
        return None, result.run_dir
    return result, result.run_dir


def run_suite(cases: List[Case], quick: bool, out_root: str,
              say: Callable[[str], None] = lambda s: None):
    """Every case in order; returns (outcomes, the suite's directory)."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = os.path.abspath(os.path.join(out_root, f"validate-{stamp}"))
    os.makedirs(out_dir)
    outcomes = []
    for i, case in enumerate(cases, 1):
        say(f"case {i}/{len(cases)}: {case.name} ({case.title})")
        outcome = run_case(case, quick, out_dir, say)
        say(f"case {i}/{len(cases)}: {case.name}: {outcome.status}")
        outcomes.append(outcome)
        write(out_dir, outcomes, quick)  # what is measured is kept as it comes
    return outcomes, out_dir


COLUMNS = ("case", "published result (citation)", "predicts here", "measured", "verdict")


def rows(outcomes: List[Outcome]) -> List[List[str]]:
    out = []
    for o in outcomes:
        c = o.case
        measured = o.verdict.measured if o.verdict else "-"
        verdict = o.status + (f": {o.note}" if o.note else "") + \
            (f" (tolerance: {c.tolerance})" if o.status == PASS else "")
        out.append([c.name, f"{c.published} ({c.citation})", c.predicts, measured, verdict])
    return out


def summary(outcomes: List[Outcome], width: int = 100) -> str:
    """The terminal's table: a line per case (name, verdict) and what was measured below it,
    wrapped and indented."""
    name_w = max([len(o.case.name) for o in outcomes] + [4])
    lines = []
    for o in outcomes:
        lines.append(f"{o.case.name.ljust(name_w)}  {o.status}")
        measured = o.verdict.measured if o.verdict else "-"
        lines += textwrap.wrap(measured, width, initial_indent="    ",
                               subsequent_indent="    ", break_on_hyphens=False)
    return "\n".join(lines)


def markdown(outcomes: List[Outcome], quick: bool) -> str:
    lines = [f"| {' | '.join(COLUMNS)} |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in r) + " |"
              for r in rows(outcomes)]
    mode = " --quick" if quick else ""
    return (f"Validation suite (`python -m testbed validate{mode}`), "
            f"{datetime.date.today().isoformat()}:\n\n" + "\n".join(lines) + "\n")


def write(out_dir: str, outcomes: List[Outcome], quick: bool) -> None:
    data = {"quick": quick, "cases": [
        {"name": o.case.name, "citation": o.case.citation, "published": o.case.published,
         "predicts": o.case.predicts, "tolerance": o.case.tolerance, "status": o.status,
         "measured": o.verdict.measured if o.verdict else None, "note": o.note,
         "bars": [list(b) for b in o.verdict.bars] if o.verdict else [],
         "runs": {label: os.path.relpath(d, out_dir) for label, d in o.runs.items()}}
        for o in outcomes]}
    write_atomic(os.path.join(out_dir, "validation.json"),
                 json.dumps(data, indent=2).encode("utf-8"))
    write_atomic(os.path.join(out_dir, "validation.md"),
                 markdown(outcomes, quick).encode("utf-8"))
    write_atomic(os.path.join(out_dir, "report.html"), page(outcomes, quick).encode("utf-8"))


def page(outcomes: List[Outcome], quick: bool) -> str:
    """The suite's report: the table and, per case, its predicted and measured figures."""
    from ..results.htmlreport import CSS, escape as e, table

    parts = ["<h1>AI-fabric testbed: validation</h1>",
             f"<p class=\"meta\">{len(outcomes)} cases{' (quick)' if quick else ''}: "
             f"{sum(o.status == PASS for o in outcomes)} pass</p>",
             table(list(COLUMNS), rows(outcomes), "validation")]
    for o in outcomes:
        if o.verdict and o.verdict.bars:
            png = _plot(o)
            if png:
                data = base64.b64encode(png).decode("ascii")
                parts.append(f"<figure><img src=\"data:image/png;base64,{data}\" "
                             f"alt=\"{e(o.case.name)}\"><figcaption>{e(o.case.title)}: "
                             "the model's value or bound (grey) and the measured one"
                             "</figcaption></figure>")
        links = "".join(f"<li><a href=\"{e(os.path.basename(d))}/report.html\">{e(label)}"
                        "</a></li>" for label, d in o.runs.items())
        parts.append(f"<p>{e(o.case.name)}: runs</p><ul>{links}</ul>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>"
            f"validation</title><style>{CSS}#validation td{{text-align:left;vertical-align:top}}"
            "</style></head><body>\n" + "\n".join(parts)
            + "\n</body></html>\n")


def _plot(o: Outcome) -> Optional[bytes]:
    try:
        from ..results import plots
    except ImportError:
        return None
    return plots.predicted_measured(o.case.name, o.verdict.bars, o.status == PASS)
