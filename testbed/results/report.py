"""What a run prints: the comparison table, the size sweep, per-GPU and per-operation tables
(pure text; the one-line verdicts are ``testbed.results.verdicts``).

Reads the typed results (``testbed.results.model``). Times lead in the modelled fabric's time
(the emulated time divided by the time scale); ``emulated=True`` shows them as run. A policy
run ``repeat`` times shows its headline figures as ``median [min-max]`` (``SPREAD_ROWS``).

Why one module over 400 lines: every table a run prints is made here from one set of row
definitions and one way of formatting a figure; apart, they would trade both across modules.
"""
from __future__ import annotations

import math
from statistics import fmean
from typing import Dict, List, Optional, Sequence, Tuple

from .model import (CollectiveResult, IdleOnGpus, Job, PolicyResult, RunResult,
                    TimeScaleChoice, entry_of, figure_at)
from .verdicts import outcome


def fmt(value, digits=1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool) or isinstance(value, str):
        return str(value)
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}"


def sig(value, digits: int = 4) -> str:
    """A time in the modelled fabric: ``digits`` significant digits, never an exponent."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return fmt(value)
    if value == 0 or abs(value) >= 10 ** (digits - 1):
        return f"{value:,.0f}"
    return f"{value:,.{max(0, digits - 1 - math.floor(math.log10(abs(value))))}f}"


def view(p: PolicyResult, emulated: bool = False) -> PolicyResult:
    """A policy's figures as the tables show them: modelled time (as read), or as run."""
    return p.emulated if emulated else p


ROWS = [
    ("GPUs", lambda p: p.gpus),
    ("packets sent", lambda p: p.packets_sent),
    ("packets received", lambda p: p.packets_received),
    ("drops (sent - received)", lambda p: p.drops),
    ("  of which switch queue drops", lambda p: p.switch_queue_drops),
    ("  of which still queued at the end", lambda p: p.queued_at_end),
    ("ECN-marked packets received", lambda p: p.ecn_marked_packets),
    ("PFC pause events", lambda p: p.pfc_pause_events),
    ("PFC paused time (ms)", lambda p: p.pfc_paused_ms),
    ("credit waits", lambda p: p.credit_waits),
    ("credit wait time (ms)", lambda p: p.credit_wait_ms),
    ("largest switch queue (KB)", lambda p: _largest_kb(p.switch_queues)),
    ("latency p50 (us)", lambda p: figure_at(p.latency_us, "p50")),
    ("  fixed path delay on one leaf (us)", lambda p: entry_of(p.path_delay_us, "same_leaf")),
    ("  fixed path delay across leaves (us)", lambda p: entry_of(p.path_delay_us, "cross_leaf")),
    ("  queueing + forwarding p50 (us)", lambda p: figure_at(p.latency_queueing_us, "p50")),
    ("latency p99 (us)", lambda p: figure_at(p.latency_us, "p99")),
    ("  queueing + forwarding p99 (us)", lambda p: figure_at(p.latency_queueing_us, "p99")),
    ("latency p99.9 (us)", lambda p: figure_at(p.latency_us, "p999")),
    ("latency max (us)", lambda p: figure_at(p.latency_us, "max")),
    ("jitter |IPDV| p99 (us)", lambda p: figure_at(p.jitter_us, "ipdv_abs_p99")),
    ("latency p99 / p50", lambda p: p.tail_ratio_p99_p50),
    ("job", lambda p: outcome(p.job_failed)),
    ("iteration p50 (ms)", lambda p: _ms(figure_at(p.iteration_us, "p50"))),
    ("iteration p99 (ms)", lambda p: _ms(figure_at(p.iteration_us, "p99"))),
    ("  at full size (ms, modelled; byte scale)", lambda p: _full_size(p.job)),
    ("  with a free network (ms)", lambda p: _ms(p.ideal_iteration_us)),
    ("  network cost p50 (ms)", lambda p: _ms(p.network_cost_us)),
    ("compute per GPU (ms)", lambda p: _ms(p.job_compute_us)),
    ("exposed communication (ms)", lambda p: _ms(entry_of(p.exposed_comm_us, "total"))),
    ("  share of the iteration", lambda p: _share(figure_at(p.job, "exposed_share"))),
    ("  dp / tp / pp / ep (ms)", lambda p: _kinds(p.exposed_comm_us)),
    ("  pipeline bubble, free network (ms)", lambda p: _ms(p.pipeline_bubble_us)),
    ("idle GPU time / iteration (GPU-ms)", lambda p: _ms(p.idle_gpu_us)),
    ("  at full size on N GPUs (GPU-s)",
     lambda p: _idle_on_n(figure_at(p.job, "idle_gpu_seconds_on_n_gpus"))),
    ("bytes / iteration: fabric, scale-up",
     lambda p: _split(figure_at(p.job, "bytes_per_iteration"))),
    ("fan-in: Jain / Gbit/s (modelled) while all send", lambda p: _fan_in(p.fan_in)),
    ("CCT p50 (ms)", lambda p: _ms(figure_at(p.cct_us, "p50"))),
    ("CCT p99 (ms)", lambda p: _ms(figure_at(p.cct_us, "p99"))),
    ("CCT max (ms)", lambda p: _ms(figure_at(p.cct_us, "max"))),
    ("busbw (Gbit/s, modelled)", lambda p: p.busbw_gbps_modelled),
    ("straggler idle / iteration (ms)", lambda p: _ms(figure_at(p.straggler_idle_us, "mean"))),
    ("same tail on N GPUs (GPU-s/step)", lambda p: _gpu_s(p.extrapolation)),
    ("retransmitted packets", lambda p: p.retransmitted_packets),
    ("NAKs / RTO timeouts", lambda p: _pair(p.naks, p.rto_timeouts)),
    ("CNPs sent", lambda p: p.cnps_sent),
    ("path delay (emulation.path_delay)", lambda p: _hop(p.per_hop_latency)),
    ("latency floor across leaves (us)", lambda p: entry_of(p.latency_floor_us, "cross_leaf")),
    ("ECN marking", lambda p: " ".join(filter(None, (p.ecn_marking, p.ecn_marking_via)))
     or None),
    ("rxe ib_write_lat typical (us)", lambda p: _rxe(p, "ib_write_lat", "t_typical_usec")),
    ("rxe ib_write_bw average (MB/s)", lambda p: _rxe(p, "ib_write_bw", "bw_average_mb_per_sec")),
    ("fidelity", lambda p: figure_at(p.fidelity, "verdict")),
    ("CPU per delivered frame (us)",
     lambda p: p.emulation_cost.total_us_per_frame if p.emulation_cost else None),
    ("  agents / OVS / kernel / rest", lambda p: _cost_split(p.emulation_cost)),
    ("spine load (packets)", lambda p: " / ".join(
        f"{v:,}" for v in (p.spine_load_packets or {}).values()) or None),
]
"""The comparison: (label, figure of a policy's results) per row."""
JOB_ROWS = {label for label, _ in ROWS[ROWS.index(next(r for r in ROWS if r[0] == "job")):
                                       ROWS.index(next(r for r in ROWS
                                                       if r[0] == "CCT p50 (ms)"))]}
"""Rows of a training job's figures (shown when a policy ran one)."""
COLLECTIVE_ROWS = {"CCT p50 (ms)", "CCT p99 (ms)", "CCT max (ms)", "busbw (Gbit/s, modelled)",
                   "straggler idle / iteration (ms)", "same tail on N GPUs (GPU-s/step)"}
"""Rows of a collective's figures (shown when a policy replayed collectives)."""
CREDIT_ROWS = {"credit waits", "credit wait time (ms)"}
"""Rows of InfiniBand's credits (shown when a policy ran with them)."""
TIME_ROWS = {"PFC paused time (ms)", "credit wait time (ms)", "latency p50 (us)",
             "latency p99 (us)",
             "latency p99.9 (us)", "latency max (us)", "jitter |IPDV| p99 (us)", "CCT p50 (ms)",
             "CCT p99 (ms)", "CCT max (ms)", "straggler idle / iteration (ms)",
             "  fixed path delay on one leaf (us)", "  fixed path delay across leaves (us)",
             "  queueing + forwarding p50 (us)",
             "  queueing + forwarding p99 (us)", "latency floor across leaves (us)",
             "iteration p50 (ms)", "iteration p99 (ms)", "  with a free network (ms)",
             "  network cost p50 (ms)", "compute per GPU (ms)", "exposed communication (ms)",
             "  pipeline bubble, free network (ms)", "idle GPU time / iteration (GPU-ms)"}
"""The rows that are times: in the modelled fabric's time unless emulated ones are asked for."""


def _largest_kb(queues):
    """The largest backlog any switch egress queue held (any class), in KB."""
    peaks = [b for by_class in (queues.max_backlog if queues else {}).values()
             for b in by_class.values()]
    return round(max(peaks) / 1000, 1) if peaks else None


def _fan_in(fan_in):
    """Per kind with a fan-in: Jain's index and the receiver's Gbit/s while all send (means
    over the iterations)."""
    if not fan_in:
        return None
    return "; ".join(f"{kind} {fmean(r.jain for r in f.per_iteration):.2f} / "
                     f"{fmean(r.gbps_modelled for r in f.per_iteration):.1f}"
                     for kind, f in fan_in.items())


def _share(x):
    return None if x is None else f"{x:.0%}"


def _kinds(exposed):
    if not exposed:
        return None
    return " / ".join(sig(exposed.get(k, 0) / 1000, 3) for k in ("dp", "tp", "pp", "ep"))


def _split(moved):
    if not moved:
        return None
    return " / ".join(f"{sum(moved[k].values()) / 1e6:,.1f} MB"
                      for k in ("fabric", "scale_up"))


def _hop(h):
    """What applied the modelled path delay, and the forwarding mode it models."""
    if not h:
        return None
    how = h.mechanism  # as emulation.path_delay names it
    return f"{how}, {h.forwarding.replace('_', '-')}" if h.applied else how


def _cost_split(c):
    """Where the machine went, per delivered frame: the three big shares and the rest."""
    if not c or c.total_us_per_frame is None:
        return None
    us = c.us_per_frame
    big = ("agents", "open_vswitch", "kernel")
    rest = c.total_us_per_frame - sum(us[k] for k in big)
    return " / ".join(f"{v:,.0f}" for v in [us[k] for k in big] + [rest])


def _rxe(p: PolicyResult, test, figure):
    return p.rxe.figure(test, figure) if p.rxe else None


def modelled_time(results: RunResult, emulated: bool = False) -> bool:
    """Whether the tables show modelled time (every policy has its modelled figures)."""
    return not emulated and results.modelled


def comparison(results: RunResult, emulated: bool = False) -> Tuple[List[str], List[List[str]]]:
    """The comparison table as text cells: header (what, then one column per policy), rows."""
    policies = results.policies
    names = list(policies)
    w = results.scenario.workload
    if w.job.enabled:
        what = f"per policy ({w.job.model or w.job.file} job)"
    elif w.jobs:
        what = f"per policy ({len(w.jobs)} jobs: the first one's figures, then each one's)"
    elif not w.sizes:
        what = f"per policy ({w.collective}, {_size(w.size_bytes)})"
    else:
        what = "per policy"
    modelled = modelled_time(results, emulated)
    what += ", modelled time" if modelled else ", emulated time"
    spreads = results.spread if modelled else {}
    if spreads:
        what += f"; {1 + max(len(r) for r in results.repeats.values())} runs: median [min-max]"
    views = {n: view(policies[n], not modelled) for n in names}
    rxe = any(policies[n].rxe for n in names)
    job = any(policies[n].job for n in names)
    coll = not job or any(policies[n].collectives for n in names)
    credit = any(policies[n].credit_waits is not None for n in names)
    rows = [[label] + [_spread_cell(spreads.get(n), label) or
                       (sig if modelled and label in TIME_ROWS else fmt)(get(views[n]))
                       for n in names] for label, get in ROWS
            if (rxe or not label.startswith("rxe ")) and (job or label not in JOB_ROWS)
            and (coll or label not in COLLECTIVE_ROWS) and (credit or label not in CREDIT_ROWS)]
    at = next((i for i, r in enumerate(rows) if r[0] == "bytes / iteration: fabric, scale-up"),
              len(rows) - 1) + 1
    rows[at:at] = _per_job_rows({n: views[n] for n in names}, names, modelled)
    return [what] + names, rows


# rows that show a policy's runs (``repeat``): the spread figure and its factor to the row's unit
SPREAD_ROWS = {
    "iteration p50 (ms)": ("iteration_p50_us", 1e-3),
    "iteration p99 (ms)": ("iteration_p99_us", 1e-3),
    "  at full size (ms, modelled; byte scale)": ("full_size_iteration_ms", 1),
    "  network cost p50 (ms)": ("network_cost_us", 1e-3),
    "exposed communication (ms)": ("exposed_comm_us", 1e-3),
    "idle GPU time / iteration (GPU-ms)": ("idle_gpu_us", 1e-3),
    "CCT p50 (ms)": ("cct_p50_us", 1e-3),
    "CCT p99 (ms)": ("cct_p99_us", 1e-3),
    "busbw (Gbit/s, modelled)": ("busbw_gbps", 1),
    "latency p99 (us)": ("latency_p99_us", 1),
    "drops (sent - received)": ("drops", 1),
    "retransmitted packets": ("retransmitted_packets", 1),
    "ECN-marked packets received": ("ecn_marked_packets", 1),
    "PFC pause events": ("pfc_pause_events", 1),
}


def _spread_cell(spread, label: str):
    """``median [min-max]`` of a row over a policy's runs (None: one run, or not a row that
    varies)."""
    key, factor = SPREAD_ROWS.get(label, (None, 1))
    s = (spread or {}).get(key)
    if s is None or len(s["values"]) < 2:
        return None
    show = sig if isinstance(s["median"], float) else fmt
    low, mid, high = (show(s[k] * factor) for k in ("min", "median", "max"))
    return mid if low == high else f"{mid} [{low}-{high}]"


def _per_job_rows(views: Dict[str, PolicyResult], names: List[str],
                  modelled: bool) -> List[List[str]]:
    """With several jobs on the fabric, each one's iteration, exposed communication and
    network cost (the rows above are the first job's)."""
    count = max((len(views[n].jobs) for n in names), default=0)
    out = []
    for k in range(count if count > 1 else 0):
        label = next(p.jobs[k].job.name for p in views.values() if len(p.jobs) > k)
        for what, get in PER_JOB_ROWS:
            out.append([f"job {k + 1} ({label}): {what}"]
                       + [(sig if modelled else fmt)(_ms(get(views[n].jobs[k]))
                                                     if k < len(views[n].jobs) else None)
                          for n in names])
    return out


PER_JOB_ROWS = (("iteration p50 (ms)", lambda j: figure_at(j.iteration_us, "p50")),
                ("exposed communication (ms)", lambda j: entry_of(j.exposed_comm_us, "total")),
                ("network cost p50 (ms)", lambda j: j.network_cost_us))


def per_gpu(name: str, p: PolicyResult, modelled: bool = True
            ) -> Tuple[List[str], List[List[str]]]:
    """One row per GPU; latencies in the time of ``p`` (modelled: 4 significant digits)."""
    t = sig if modelled else fmt
    return ([f"{name}: per GPU", "rank", "sent", "received", "rx p50 (us)", "rx p99 (us)"],
            [[host, fmt(g.rank), fmt(g.packets_sent), fmt(g.packets_received),
              t(g.latency_us_p50), t(g.latency_us_p99)]
             for host, g in (p.per_gpu or {}).items()])


def time_scale_note(results: RunResult, emulated: bool = False) -> str:
    scale = results.time_scale
    if not scale:
        return ""
    modelled = results.scenario.topology.modelled_rate_gbit
    if modelled_time(results, emulated):
        shown = (f"latencies and CCTs are the modelled fabric's time (emulated / {scale:,.0f}; "
                 "emulated figures in results.json, or --emulated)")
    else:
        shown = "latencies and CCTs are emulated time"
    note = (f"time scale: emulated links run {scale:,.0f}x slower than the modelled "
            f"{modelled:g} Gbit/s fabric; {shown}")
    choice = results.time_scale_choice or TimeScaleChoice()
    if choice.chosen_by == "auto":
        note += (f" (GPU NICs at {choice.host_rate_mbit:g} Mbit/s: chosen for this machine, "
                 f"predicted CPUs {choice.predicted_busy:.0%} busy)")
    if choice.attempts:
        rates = ", ".join(f"{a.host_rate_mbit:g}" for a in choice.attempts)
        note += (f"\ntime scale: the fidelity monitor rejected the run at {rates} Mbit/s first "
                 f"(kept in {', '.join(a.kept_in for a in choice.attempts)})")
    if choice.warning:
        note += f"\nwarning: {choice.warning}"
    return note


def summary_table(results: RunResult, emulated: bool = False) -> str:
    """The comparison printed at the end of a run: one column per policy, then per GPU."""
    modelled = modelled_time(results, emulated)
    out = [table(*comparison(results, emulated))]
    out += [table(*per_gpu(name, view(p, not modelled), modelled))
            for name, p in results.policies.items()]
    for name, p in results.policies.items():
        if len(p.collectives) > 1:
            out.append(sweep_table(name, p.collectives, not modelled))
        out += [table(*per_operation(name, job)) for job in jobs_of(p)]
    note = time_scale_note(results, emulated)
    if note:
        out.append(note)
    return "\n\n".join(out)


def jobs_of(policy: PolicyResult) -> List[Job]:
    """A policy's jobs (none: [])."""
    return [j.job for j in policy.jobs]


def per_operation(policy: str, job: Job) -> Tuple[List[str], List[List[str]]]:
    """A job's communications by kind, collective, group and size: how many per run, the
    median time and the bandwidths they reached (modelled, at the run's byte scale)."""
    scale = f", bytes / {job.byte_scale:,g}" if job.byte_scale not in (None, 1) else ""
    header = [f"{policy}: {job.name or 'job'} operations{scale}", "collective", "group",
              "bytes", "count", "time p50 (us)", "algbw (Gb/s)", "busbw (Gb/s)"]
    rows = [[o.kind, o.collective, o.group, fmt(o.bytes), fmt(o.count), fmt(o.time_us_p50),
             fmt(o.algbw_gbps), fmt(o.busbw_gbps)] for o in job.operations]
    return header, rows


def table(header: List[str], rows: List[List[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(str(h).ljust(w) if i == 0 else str(h).rjust(w)
                       for i, (h, w) in enumerate(zip(header, widths)))]
    lines.append("-" * len(lines[0]))
    for r in rows:
        lines.append("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(lines)


def _pair(a, b):
    return None if a is None and b is None else f"{fmt(a)} / {fmt(b)}"


def _ms(us):
    return None if us is None else us / 1000.0


def _full_size(job: Optional[Job]):
    if job is None or job.full_size_iteration_ms_modelled is None:
        return None
    return f"{sig(job.full_size_iteration_ms_modelled, 4)} (x{job.byte_scale:,g})"


def _idle_on_n(on_n: Optional[IdleOnGpus]):
    if on_n is None or on_n.full_size is None:  # absent in results of earlier versions
        return None
    return f"{sig(on_n.full_size, 3)} @ {on_n.gpus:,}"


def _gpu_s(extrapolation):
    if not extrapolation:
        return None
    return f"{extrapolation.gpu_seconds_per_step_modelled:.3g} @ {extrapolation.gpus:,}"


def sweep(policy: str, entries: Sequence[CollectiveResult], emulated: bool = False
          ) -> Tuple[List[str], List[List[str]]]:
    """nccl-tests style: one row per message size (time = median CCT), in the modelled fabric's
    time and bandwidths (entries in modelled time: views); ``emulated`` (or entries as run):
    as run."""
    name = entries[0].collective if entries else ""
    if not emulated and entries and all(e.time == "modelled" for e in entries):
        return ([f"{policy}: {name} sweep", "iters", "time (us)", "algbw (Gb/s)",
                 "busbw (Gb/s)", "lat p99 (us)"],
                [[_size(e.size_bytes), fmt(e.iterations), sig(figure_at(e.cct_us, "p50")),
                  fmt(e.algbw_gbps_modelled, 2), fmt(e.busbw_gbps_modelled, 2),
                  sig(figure_at(e.latency_us, "p99"))] for e in entries])
    entries = [e.emulated for e in entries]
    rows = []
    for e in entries:
        rows.append([_size(e.size_bytes), fmt(e.iterations), fmt(figure_at(e.cct_us, "p50"), 0),
                     fmt(_mbit(e.algbw_gbps_emulated), 2),
                     fmt(_mbit(e.busbw_gbps_emulated), 2),
                     fmt(e.busbw_gbps_modelled, 2), fmt(figure_at(e.latency_us, "p99"), 0)])
    return ([f"{policy}: {name} sweep", "iters", "time (us)", "algbw (Mb/s)",
             "busbw (Mb/s)", "busbw modelled (Gb/s)", "lat p99 (us)"], rows)


def sweep_table(policy: str, entries: Sequence[CollectiveResult],
                emulated: bool = False) -> str:
    return table(*sweep(policy, entries, emulated))


def _mbit(gbps):
    return None if gbps is None else gbps * 1000.0


def _size(n) -> str:
    if n is None:
        return "-"
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return f"{n}B"
