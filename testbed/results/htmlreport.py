"""``report.html``: one self-contained page per run (plots inlined as base64 PNG, no scripts,
no network access needed to view it), plus the plots as PNG files in ``plots/``.

``write(run_dir)`` reads only what the run left in its directory, so it serves both the end of
a run and ``python -m testbed report DIR`` (operations.csv is the runner's, written as each
policy finishes). The page: status, fidelity verdict, the comparison
table, the plots, sweep, job-operation and per-GPU tables, the scenario, capabilities and the
files.
"""
from __future__ import annotations

import base64
import html
import logging
import os
from typing import Callable, List, Tuple

import yaml

from ..base.atomic import write_atomic
from . import breakdown, report, rundata, verdicts
from .model import RunResult

LOG = logging.getLogger(__name__)
REPORT = "report.html"
PLOTS_DIR = "plots"

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
max-width:1100px;color:#222;line-height:1.4;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;
margin-top:1.8em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th:first-child,td:first-child{text-align:left}thead th{background:#f2f4f7}
tbody tr:nth-child(even){background:#fafafa}
.meta{color:#555}.ok{color:#1a7f37;font-weight:600}.bad{color:#b42318;font-weight:600}
.warn{color:#9a6700;font-weight:600}
.banner{padding:.6em 1em;border-radius:4px;background:#fdecea;border:1px solid #f5c2c0}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}
figcaption{color:#555;font-size:.9em}
pre{background:#f6f8fa;padding:.8em;overflow:auto;font-size:.85em}
"""


def write(run_dir: str, progress: Callable[[str], None] = lambda s: None,
          emulated: bool = False) -> str:
    """Draw the plots and write ``report.html`` into ``run_dir``; returns its path. Times in
    the modelled fabric's time (``emulated``: as run)."""
    results = rundata.load_run(run_dir)
    modelled = report.modelled_time(results, emulated)
    figures, plot_note = _plots(run_dir, results, progress, modelled)
    page = render(results, figures, plot_note, emulated)
    path = os.path.join(run_dir, REPORT)
    write_atomic(path, page.encode("utf-8"))
    return path


Figure = Tuple[str, str, bytes]  # file name, caption, PNG


def _plots(run_dir: str, results: RunResult, progress, modelled: bool
           ) -> Tuple[List[Figure], str]:
    """Every plot the run's data supports, also saved under ``plots/``; times in the modelled
    fabric's time unless not ``modelled``."""
    try:
        from . import plots
    except ImportError as e:  # the page is still useful without them
        return [], f"plots were not drawn: matplotlib is missing ({e}); run scripts/install.sh"
    policies = list(results.policies)
    scale = results.time_scale if modelled else 1.0
    time = "modelled" if modelled else "emulated"
    out: List[Figure] = []
    progress(f"drawing plots for {len(policies)} polic{'y' if len(policies) == 1 else 'ies'}")
    lat = {name: rundata.latencies(run_dir, name, scale) for name in policies}
    out.append(("latency-cdf.png", "One-way latency of every data packet received, per "
                "policy (kernel timestamps; dotted lines: p99).", plots.latency_cdf(lat, time)))
    runs = rundata.headline_runs(results)
    if runs:
        key, what = runs
        out.append(("spread.png", f"Every run of each policy (repeat): {what}, the bar at the "
                    "median, the error bar from the smallest to the largest run.",
                    plots.run_spread(key, what)))
    iterations = rundata.iterations(results, not modelled)
    if iterations:
        out.append(("iterations.png", "The training job's iteration time, every iteration, "
                    "per policy.", plots.cct_per_iteration(iterations, "Iteration time",
                                                           "iteration", time)))
        out.append(("iteration-parts.png", "A GPU's median iteration per policy: compute, and "
                    "the communication no compute hid, per kind; the tick is the iteration "
                    "with a free network.",
                    plots.iteration_parts(rundata.iteration_parts(results))))
    else:
        out.append(("cct.png", "Collective completion time of every iteration, per policy.",
                    plots.cct_per_iteration(rundata.ccts(results, not modelled), time=time)))
    for name in policies:
        panels = rundata.gantt_panels(run_dir, name)
        if panels:
            out.append((f"gantt-{name}.png",
                        f"{name}: what each GPU did in its first and its slowest iteration "
                        f"(modelled us; {plots.GANTT_RANKS} ranks spread over the job): compute "
                        "spans, the waits of its compute stream, each communication stream. Every "
                        f"iteration and the switch queues: open timeline-{name}.json in "
                        "Perfetto (ui.perfetto.dev, Open trace file) or chrome://tracing.",
                        plots.gantt(name, panels)))
    for name in policies:
        tl = rundata.timeline(run_dir, name)
        if not tl.t_s:
            continue
        out.append((f"queues-{name}.png",
                    f"{name}: peak egress backlog per window of the four busiest switch ports"
                    + (" and the intervals PFC held each paused queue" if tl.paused else "")
                    + " (sampled by the queue emulator).",
                    plots.queue_timeline(name, tl.in_us(scale), plots.busiest(tl.backlogs),
                                         tl.paused_us(scale), time)))
    loads = rundata.spine_loads(results)
    if loads:
        out.append(("spine-load.png", "Packets forwarded by each spine, per policy (one busy "
                    "spine: a single tree; even bars: ECMP or spraying).",
                    plots.spine_load(loads)))
    folder = os.path.join(run_dir, PLOTS_DIR)
    os.makedirs(folder, exist_ok=True)
    for name, _caption, png in out:
        write_atomic(os.path.join(folder, name), png)
    return out, ""


def escape(value) -> str:
    return html.escape(str(value), quote=True)


def table(header: List[str], rows: List[List[str]], table_id: str = "") -> str:
    ident = f' id="{escape(table_id)}"' if table_id else ""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _verdicts(results: RunResult) -> str:
    items = []
    for name, p in results.policies.items():
        f = p.fidelity
        if f is None or f.verdict is None:
            items.append(f"<li><b>{escape(name)}</b>: no fidelity verdict recorded</li>")
            continue
        cls = "ok" if f.ok else "bad"
        text = f"<li><b>{escape(name)}</b>: <span class=\"{cls}\">{escape(f.verdict)}</span>"
        if f.problems:
            text += ": " + escape("; ".join(f.problems))
        if f.advice and not f.ok:
            text += f"<br><i>{escape(f.advice)}</i>"
        text += f"<br>emulation cost: {escape(verdicts.cost_text(p.emulation_cost))}"
        items.append(text + "</li>")
    for name, p in results.policies.items():
        for w in p.warnings:
            items.append(f"<li><b>{escape(name)}</b>: <span class=\"warn\">warning</span>: "
                         f"{escape(w)}</li>")
    return "<ul id=\"fidelity\">" + "".join(items) + "</ul>"


def _capabilities(results: RunResult) -> str:
    caps = results.capabilities or {}
    rows = [[k, _plain(v)] for k, v in caps.items()]
    rows += [[f"link emulation: {k}", _plain(v)]
             for k, v in (results.link_emulation or {}).items()]
    rows += [[f"CPU wake-ups: {k}", _plain(v)]
             for k, v in (results.cpu_wakeup.to_json() if results.cpu_wakeup else {}).items()]
    return table(["capability", "value"], rows, "capabilities")


def _plain(v) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}={_plain(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return ", ".join(_plain(x) for x in v) or "-"
    return "-" if v is None else str(v)


def _files(results: RunResult) -> str:
    links = [("results.json", "every figure (schema " + str(results.schema) + ")"),
             ("records/", "per-packet, per-iteration and per-operation CSV of every GPU"),
             (breakdown.FILE, "per policy, job, layer and kind: compute, exposed and total "
                              "communication per GPU and iteration, bandwidths"),
             (PLOTS_DIR + "/", "the plots as PNG")]
    for name in results.policies:
        links.append((f"timeline-{name}.json", f"{name}: the run as a trace (Chrome trace "
                      "format): open it in Perfetto (ui.perfetto.dev) or chrome://tracing"))
    for name, p in results.policies.items():
        for host, entry in (p.pcap or {}).items():
            links.append((entry["file"], f"{name}: capture on {host} ({entry['bytes']:,} B)"))
    items = "".join(f"<li><a href=\"{escape(href)}\">{escape(href)}</a>: {escape(what)}</li>"
                    for href, what in links)
    return f"<ul>{items}<li>controller-*.log, agent-*.log, switchq-*: the logs of each " \
           f"policy's controller, agents and queue emulator</li></ul>"


def render(results: RunResult, figures: List[Figure], plot_note: str = "",
           emulated: bool = False) -> str:
    """The page as a string (pure: results and PNGs in); times in the modelled fabric's time
    unless ``emulated``."""
    scenario = results.scenario.to_dict()
    policies = results.policies
    status = results.status
    parts = [f"<h1>AI-fabric testbed: {escape(results.scenario.name)}</h1>",
             f"<p class=\"meta\">run {escape(results.run_id)} &middot; status "
             f"<span id=\"status\" class=\"{'ok' if status == 'complete' else 'bad'}\">"
             f"{escape(status)}</span> &middot; {escape(results.started)} to "
             f"{escape(results.finished or '-')} &middot; testbed "
             f"{escape(results.version)} &middot; policies {escape(', '.join(policies))}</p>"]
    if status != "complete":
        parts.append(f"<p class=\"banner\">This run is <b>{escape(status)}</b>"
                     + (f" ({escape(results.error)})" if results.error else "")
                     + ": the figures cover what was gathered before it stopped.</p>")
    note = report.time_scale_note(results, emulated)
    if note:
        parts.append(f"<p class=\"meta\">{escape(note)}</p>")
    modelled = report.modelled_time(results, emulated)
    failures = verdicts.job_failures(results)
    if failures:  # a failed job is a result: said before the figures of what ran
        parts.append("<ul id=\"job-failed\" class=\"banner\">" + "".join(
            f"<li>{escape(line)}</li>" for line in failures) + "</ul>")
    parts.append("<h2>Fidelity</h2>" + _verdicts(results))
    parts.append("<h2>Comparison</h2>" + table(*report.comparison(results, emulated),
                                                "comparison"))
    if modelled:
        parts.append("<details><summary>The same in emulated time</summary>"
                     + table(*report.comparison(results, emulated=True), "comparison-emulated")
                     + "</details>")
    parts.append("<h2>Plots</h2>")
    if plot_note:
        parts.append(f"<p class=\"warn\">{escape(plot_note)}</p>")
    for name, caption, png in figures:
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<figure><img src=\"data:image/png;base64,{data}\" alt=\"{escape(caption)}\">"
                     f"<figcaption>{escape(caption)} <a href=\"{PLOTS_DIR}/{escape(name)}\">"
                     f"{escape(name)}</a></figcaption></figure>")
    views = {n: report.view(p, not modelled) for n, p in policies.items()}
    sweeps = [(n, p.collectives) for n, p in policies.items() if len(p.collectives) > 1]
    if sweeps:
        parts.append("<h2>Message-size sweep</h2>")
        parts += [table(*report.sweep(n, entries, not modelled)) for n, entries in sweeps]
    jobs = [(n, job) for n, p in policies.items() for job in report.jobs_of(p)]
    if jobs:
        parts.append("<h2>Training job operations</h2>")
        parts += [table(*report.per_operation(n, job)) for n, job in jobs]
    parts.append("<h2>Per GPU</h2>")
    parts += [table(*report.per_gpu(n, v, modelled)) for n, v in views.items()]
    parts.append("<h2>Scenario</h2><pre id=\"scenario\">"
                 + escape(yaml.safe_dump(scenario, sort_keys=False, default_flow_style=False))
                 + "</pre>")
    parts.append("<h2>Machine and emulation</h2>" + _capabilities(results))
    parts.append("<h2>Files</h2>" + _files(results))
    title = f"testbed report {results.run_id or ''}"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>\n"
            + "\n".join(parts) + "\n</body></html>\n")

