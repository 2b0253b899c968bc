"""The report's plots: data in, PNG bytes out (matplotlib's Agg canvas: no display, no pyplot
state, no network).

Each function takes plain mappings keyed by policy (or port) and returns one PNG. The data is
gathered from a run directory by ``testbed.results.rundata``; ``testbed.results.htmlreport`` places
the PNGs.
"""
from __future__ import annotations

import io
from collections import defaultdict
from typing import Dict, List, Mapping, Sequence, Tuple

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from controllers.policy import policy_class, policy_names

POLICY_COLOURS = {name: policy_class(name).colour for name in policy_names()}
OTHER_COLOURS = ["#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
SIZE = (8.0, 4.2)
DPI = 100


def colour(name: str, index: int = 0) -> str:
    return POLICY_COLOURS.get(name, OTHER_COLOURS[index % len(OTHER_COLOURS)])


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#555")
    ax.set_xticks([])
    ax.set_yticks([])


def latency_cdf(latencies: Mapping[str, Sequence[float]], time: str = "modelled") -> bytes:
    """One CDF of per-packet one-way latency (us in ``time``, log scale) per policy, p99
    marked."""
    fig = Figure(figsize=SIZE)
    ax = fig.add_subplot()
    drawn = False
    for i, (name, values) in enumerate(latencies.items()):
        v = np.sort(np.asarray(values, dtype=float))
        v = v[v > 0]
        if not v.size:
            continue
        y = np.arange(1, v.size + 1) / v.size
        c = colour(name, i)
        ax.step(v, y, where="post", color=c, label=f"{name} ({v.size:,} packets)")
        ax.axvline(np.percentile(v, 99), color=c, linestyle=":", linewidth=1)
        drawn = True
    if not drawn:
        _empty(ax, "no packets received")
    else:
        ax.set_xscale("log")
        ax.set_xlabel(f"one-way latency (us, {time} time; dotted: p99)")
        ax.set_ylabel("fraction of packets")
        ax.set_ylim(0, 1.01)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right")
    ax.set_title("Per-packet latency CDF")
    return _png(fig)


def cct_per_iteration(ccts: Mapping[str, Sequence[float]],
                      what: str = "Collective completion time", short: str = "CCT",
                      time: str = "modelled") -> bytes:
    """``what`` (ms in ``time``; CCT, or a job's iteration time) of every iteration, one line
    per series."""
    fig = Figure(figsize=SIZE)
    ax = fig.add_subplot()
    drawn = False
    for i, (label, values) in enumerate(ccts.items()):
        if not values:
            continue
        ms = np.asarray(values, dtype=float) / 1000.0
        ax.plot(np.arange(1, ms.size + 1), ms, marker="o", markersize=3,
                color=colour(label.split(" ")[0], i), label=label)
        drawn = True
    if not drawn:
        _empty(ax, "no completed iterations")
    else:
        ax.set_xlabel("iteration")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(f"{short} (ms, {time} time)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend()
    ax.set_title(f"{what} per iteration")
    return _png(fig)


def iteration_parts(parts: Mapping[str, Mapping[str, float]]) -> bytes:
    """Per policy one bar of a GPU's iteration (modelled ms; ``rundata.iteration_parts``):
    compute, then the exposed communication of each kind stacked on it; a tick marks the
    free-network iteration."""
    fig = Figure(figsize=SIZE)
    ax = fig.add_subplot()
    kinds = sorted({k for p in parts.values() for k in p} - {"compute", "ideal"})
    if not parts:
        _empty(ax, "no job iterations")
    else:
        y = np.arange(len(parts))
        left = np.asarray([p["compute"] for p in parts.values()])
        ax.barh(y, left, color="#bbbbbb", label="compute")
        for i, kind in enumerate(kinds):
            width = np.asarray([p[kind] for p in parts.values()])
            ax.barh(y, width, left=left, color=OTHER_COLOURS[i % len(OTHER_COLOURS)],
                    label=f"exposed {kind}")
            left = left + width
        ax.scatter([p["ideal"] for p in parts.values()], y, marker="|", s=400,
                   color="black", label="free network", zorder=3)
        ax.set_yticks(y)
        ax.set_yticklabels(list(parts))
        ax.invert_yaxis()  # the policies top to bottom, as in the table
        ax.set_xlabel("ms per iteration and GPU (modelled)")
        ax.grid(True, axis="x", alpha=0.3)
        ax.legend(fontsize="small")
    ax.set_title("What an iteration is made of")
    return _png(fig)


def queue_timeline(policy: str, t_us: Sequence[float], backlogs: Mapping[str, Sequence[float]],
                   paused: Mapping[str, List[Tuple[float, float]]],
                   time: str = "modelled") -> bytes:
    """Egress backlog (KB) of the busiest ports over time (us in ``time`` since the first
    sample) and, below it, when PFC held which port paused."""
    fig = Figure(figsize=(SIZE[0], SIZE[1] + (1.2 if paused else 0)))
    if paused:
        ax, bx = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    else:
        ax, bx = fig.add_subplot(), None
    t = np.asarray(t_us, dtype=float)
    for i, (port, values) in enumerate(backlogs.items()):
        ax.plot(t, np.asarray(values, dtype=float) / 1000.0, linewidth=1, color=f"C{i % 10}",
                label=port)
    if backlogs:
        ax.set_ylabel("egress backlog (KB)")
        ax.legend(loc="upper right", fontsize="small")
        ax.grid(True, alpha=0.3)
    else:
        _empty(ax, "no switch port held a backlog in this run" if t.size else
               "no queue samples")
    ax.set_title(f"{policy}: queue occupancy of the busiest ports"
                 + (" and PFC pauses" if paused else ""))
    if bx is not None:
        ports = list(paused)
        least = 1e-3 * (t[-1] - t[0]) if t.size > 1 else 1.0  # a pause stays visible
        for row, port in enumerate(ports):
            bx.broken_barh([(a, max(b - a, least)) for a, b in paused[port]], (row - 0.4, 0.8),
                           color="#d62728")
        bx.set_yticks(range(len(ports)))
        bx.set_yticklabels(ports, fontsize="small")
        bx.set_ylabel("paused")
        bx.set_xlabel(f"us since the first sample ({time} time)")
    else:
        ax.set_xlabel(f"us since the first sample ({time} time)")
    return _png(fig)


KIND_COLOURS = {"compute": "#9fb3c8", "wait": "#e8590c", "dp": "#2f9e44", "tp": "#1971c2",
                "pp": "#9c36b5", "ep": "#a0522d", "coll": "#0c8599"}
GANTT_RANKS = 8

Bar = Tuple[str, float, float, str]  # track, start, duration (modelled us), category


def spread(items: Sequence[int], n: int) -> List[int]:
    """``n`` of ``items``, evenly spaced, the first and the last included (all if fewer)."""
    if len(items) <= n:
        return list(items)
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)]


def gantt(policy: str, panels: Sequence[Tuple[str, Mapping[int, Sequence[Bar]]]],
          max_ranks: int = GANTT_RANKS) -> bytes:
    """Per rank (``max_ranks`` of them, spread evenly from the first to the last) one row for
    its compute stream - compute spans and the waits between them - and one per communication
    track; one panel per iteration."""
    ranks = spread(sorted({r for _title, bars in panels for r in bars}), max_ranks)
    panels = [(title, defaultdict(list, bars)) for title, bars in panels]  # absent: no bars
    rows: List[Tuple[int, str]] = []
    for r in ranks:
        tracks = sorted({b[0] for _t, bars in panels for b in bars[r]},
                        key=lambda t: (t != "compute", t))
        rows += [(r, t) for t in tracks]
    fig = Figure(figsize=(SIZE[0] + 2, 1.4 + 0.22 * max(4, len(rows))))
    axes = fig.subplots(1, max(1, len(panels)), sharey=True, squeeze=False)[0]
    seen = set()
    for ax, (title, bars) in zip(axes, panels):
        for y, (r, track) in enumerate(rows):
            for cat in sorted({b[3] for b in bars[r] if b[0] == track}):
                spans = [(b[1], max(b[2], 1e-3)) for b in bars[r]
                         if b[0] == track and b[3] == cat]
                ax.broken_barh(spans, (y - 0.4, 0.8), color=KIND_COLOURS.get(cat, "#868e96"),
                               label=None if cat in seen else
                               ("waiting (compute stream idle)" if cat == "wait" else cat))
                seen.add(cat)
        ax.set_title(title, fontsize="medium")
        ax.set_xlabel("us since the iteration began (modelled)")
        ax.grid(True, axis="x", alpha=0.3)
        ax.set_xlim(left=0)
    if not rows:
        _empty(axes[0], "no spans recorded")
    else:
        axes[0].set_yticks(range(len(rows)))
        axes[0].set_yticklabels([f"rank {r} {t}" for r, t in rows], fontsize="x-small")
        axes[0].set_ylim(len(rows) - 0.5, -0.5)
        handles, labels = axes[0].get_legend_handles_labels()
        for ax in axes[1:]:
            h, lab = ax.get_legend_handles_labels()
            handles, labels = handles + h, labels + lab
        fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)),
                   fontsize="small", frameon=False)
    fig.suptitle(f"{policy}: what each GPU did, iteration by iteration", fontsize="medium")
    FigureCanvasAgg(fig)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def spine_load(loads: Mapping[str, Mapping[str, int]]) -> bytes:
    """Packets each spine forwarded, grouped bars per policy (one spine = no ECMP)."""
    fig = Figure(figsize=SIZE)
    ax = fig.add_subplot()
    spines = sorted({s for per in loads.values() for s in per})
    if not spines:
        _empty(ax, "no spine counters")
    else:
        width = 0.8 / max(1, len(loads))
        x = np.arange(len(spines))
        for i, (name, per) in enumerate(loads.items()):
            ax.bar(x + i * width - 0.4 + width / 2, [per.get(s, 0) for s in spines], width,
                   color=colour(name, i), label=name)
        ax.set_xticks(x)
        ax.set_xticklabels(spines)
        ax.set_ylabel("packets forwarded")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend()
    ax.set_title("Per-spine load")
    return _png(fig)


def run_spread(values: Mapping[str, Sequence[float]], what: str) -> bytes:
    """A policy's runs (``repeat``): a bar at their median, an error bar from the smallest to
    the largest, and a dot per run."""
    fig = Figure(figsize=SIZE)
    ax = fig.add_subplot()
    shown = {name: np.asarray(v, dtype=float) for name, v in values.items() if len(v)}
    if not shown:
        _empty(ax, "no runs")
    else:
        for i, (name, v) in enumerate(shown.items()):
            mid = float(np.median(v))
            ax.bar(i, mid, 0.6, color=colour(name, i), alpha=0.6, label=name)
            ax.errorbar(i, mid, yerr=[[mid - v.min()], [v.max() - mid]], color="black",
                        capsize=8)
            ax.scatter(np.full(v.size, i), v, color="black", s=12, zorder=3)
        ax.set_xticks(range(len(shown)))
        ax.set_xticklabels(list(shown))
        ax.set_ylabel(what)
        ax.set_ylim(bottom=0)
        ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(f"Run to run: {what}, median and min-max of "
                 f"{max(len(v) for v in shown.values()) if shown else 0} runs")
    return _png(fig)


PASS_COLOUR, FAIL_COLOUR = "#2f9e44", "#e03131"


def predicted_measured(name: str, bars: Sequence[Tuple[str, object, float]],
                       ok: bool) -> bytes:
    """A validation case's figures: per figure (its own scale) the model's value or bound
    (grey) and the measured one (green: the case holds)."""
    fig = Figure(figsize=(SIZE[0], 0.6 + 0.9 * max(1, len(bars))))
    axes = fig.subplots(max(1, len(bars)), 1, squeeze=False)[:, 0]
    for ax, (label, predicted, measured) in zip(axes, bars):
        values = [("measured", measured, PASS_COLOUR if ok else FAIL_COLOUR)]
        if predicted is not None:
            values.insert(0, ("model", float(predicted), "#adb5bd"))
        ax.barh([v[0] for v in values], [v[1] for v in values],
                color=[v[2] for v in values])
        ax.set_title(label, fontsize="small", loc="left")
        ax.grid(True, axis="x", alpha=0.3)
        ax.invert_yaxis()
    fig.suptitle(name, fontsize="medium")
    return _png(fig)


def busiest(backlogs: Mapping[str, Sequence[float]], n: int = 4) -> Dict[str, Sequence[float]]:
    """The ``n`` ports with the highest peak backlog (ports that never queued left out)."""
    peaks = sorted(((max(v) if len(v) else 0, port) for port, v in backlogs.items()),
                   reverse=True)
    return {port: backlogs[port] for peak, port in peaks[:n] if peak > 0}
