"""Results: gather the agents' records into per-policy figures, write them, print the table.

Layout of a run directory (``results/<run-id>/``)::

    results.json                 the figures below, per policy (schema RESULTS_SCHEMA)
    controller-<policy>.log      the os-ken controller's log
    agent-<policy>-<host>.log    each traffic agent's log
    records/<policy>/<host>.packets.csv   one row per data packet that arrived
    records/<policy>/<host>.steps.csv     one row per collective step of each rank
    records/<policy>/<host>.qps.csv       DCQCN: each QP's rate over time, bytes sent
    records/<policy>/<host>.summary.json  the agent's counters

``results.json`` is written atomically (temporary file + rename), so a reader never sees half
of it.
"""
from __future__ import annotations

import csv
import glob
import json
import os
from typing import Dict, List

from traffic import metrics

RESULTS_SCHEMA = "ai-fabric-testbed/results/1"


def read_csv(path: str) -> List[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def load_tx_times(records_dir: str, host: str) -> Dict[int, int]:
    """sent_ns -> kernel transmit time of the data packets a GPU sent (its tx file)."""
    path = os.path.join(records_dir, f"{host}.tx.csv")
    if not os.path.exists(path):
        return {}
    return {int(r["sent_ns"]): int(r["tx_ns"]) for r in read_csv(path)}


def collect(records_dir: str, size_bytes: int) -> dict:
    """Per-policy figures from the records the agents wrote into ``records_dir``.

    One-way latency of a packet = the receiver's kernel receive time - the sender's kernel
    transmit time (joined on the send time the packet carries); for a packet whose transmit
    time is missing, the send time itself stands in (counted in ``latency_app_clock``).
    """
    all_latency = []
    steps: List[dict] = []
    counters: Dict[str, int] = {}
    per_gpu: Dict[str, dict] = {}
    summaries = []
    for path in sorted(glob.glob(os.path.join(records_dir, "*.summary.json"))):
        with open(path, encoding="utf-8") as f:
            summaries.append(json.load(f))
    tx_times = {s["rank"]: load_tx_times(records_dir, s["host"]) for s in summaries}
    app_clock = 0
    for summary in summaries:
        host = summary["host"]
        for key, value in summary["counters"].items():
            counters[key] = counters.get(key, 0) + value
        rows = read_csv(os.path.join(records_dir, f"{host}.packets.csv"))
        sent_at = []
        for r in rows:
            sent = int(r["sent_ns"])
            tx = tx_times.get(int(r["src"]), {}).get(sent)
            if tx is None:
                app_clock += 1
                tx = sent
            sent_at.append(tx)
        latency = metrics.latency_us(sent_at, [int(r["rx_ns"]) for r in rows])
        all_latency.append(latency)
        lat = metrics.percentiles(latency) or {}
        mine = summary["counters"]
        per_gpu[host] = {"rank": summary["rank"],
                         "packets_sent": mine.get("tx_packets", 0) + mine.get("retransmitted", 0),
                         "packets_received": len(rows),
                         "latency_us_p50": lat.get("p50"), "latency_us_p99": lat.get("p99")}
        steps += read_csv(os.path.join(records_dir, f"{host}.steps.csv"))
    latency = metrics.percentiles(metrics.concat(all_latency))
    rates = [float(r["rate_bps"]) for s in summaries
             for r in _rows_if_any(os.path.join(records_dir, f"{s['host']}.qps.csv"))]
    cct_summary = metrics.cct_summary(metrics.iteration_cct_us(steps))
    sent = counters.get("tx_packets", 0) + counters.get("retransmitted", 0)
    received = sum(g["packets_received"] for g in per_gpu.values())
    return {
        "agents_reporting": len(summaries),
        "latency_app_clock": app_clock,
        "latency_us": latency,
        "cct_us": cct_summary,
        "algbw_gbps_emulated": (round(metrics.algbw_gbps(size_bytes, cct_summary["p50"]), 6)
                                if cct_summary else None),
        "packets_sent": sent,
        "packets_received": received,
        "drops": sent - received,
        "retransmitted_packets": counters.get("retransmitted", 0),
        "naks": counters.get("naks_sent", 0),
        "rto_timeouts": counters.get("timeouts", 0),
        "out_of_order_dropped": counters.get("resp_out_of_order_dropped", 0),
        "ecn_marked_packets": counters.get("rx_ce", 0),
        "cnps_sent": counters.get("cnps_sent", 0),
        "cnps_received": counters.get("cnps_received", 0),
        "dcqcn_min_rate_mbit": round(min(rates) / 1e6, 3) if rates else None,
        "rx_socket_drops": counters.get("rx_socket_drops", 0),
        "rx_invalid": counters.get("rx_invalid", 0),
        "rx_no_timestamp": counters.get("rx_no_timestamp", 0),
        "nic_backpressure_waits": counters.get("tx_blocked", 0),
        "per_gpu": dict(sorted(per_gpu.items(), key=lambda kv: kv[1]["rank"])),
    }


def _rows_if_any(path: str) -> List[dict]:
    return read_csv(path) if os.path.exists(path) else []


def write_json_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fmt(value, digits=1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool) or isinstance(value, str):
        return str(value)
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}"


def summary_table(results: dict) -> str:
    """The comparison printed at the end of a run: one column per policy, then per GPU."""
    policies = results.get("policies", {})
    rows = [
        ("GPUs", lambda p: p.get("gpus")),
        ("packets sent", lambda p: p.get("packets_sent")),
        ("packets received", lambda p: p.get("packets_received")),
        ("drops (sent - received)", lambda p: p.get("drops")),
        ("  of which switch queue drops", lambda p: p.get("switch_queue_drops")),
        ("ECN-marked packets received", lambda p: p.get("ecn_marked_packets")),
        ("PFC pause events", lambda p: p.get("pfc_pause_events")),
        ("PFC paused time (ms)", lambda p: p.get("pfc_paused_ms")),
        ("latency p50 (us)", lambda p: (p.get("latency_us") or {}).get("p50")),
        ("latency p99 (us)", lambda p: (p.get("latency_us") or {}).get("p99")),
        ("latency p99.9 (us)", lambda p: (p.get("latency_us") or {}).get("p999")),
        ("latency max (us)", lambda p: (p.get("latency_us") or {}).get("max")),
        ("CCT p50 (ms)", lambda p: _ms((p.get("cct_us") or {}).get("p50"))),
        ("CCT p99 (ms)", lambda p: _ms((p.get("cct_us") or {}).get("p99"))),
        ("CCT max (ms)", lambda p: _ms((p.get("cct_us") or {}).get("max"))),
        ("retransmitted packets", lambda p: p.get("retransmitted_packets")),
        ("NAKs / RTO timeouts", lambda p: _pair(p.get("naks"), p.get("rto_timeouts"))),
        ("CNPs sent", lambda p: p.get("cnps_sent")),
        ("spine load (packets)", lambda p: " / ".join(
            f"{v:,}" for v in (p.get("spine_load_packets") or {}).values()) or None),
    ]
    names = list(policies)
    out = [_table(["per policy"] + names,
                  [[label] + [_fmt(get(policies[n])) for n in names] for label, get in rows])]
    for name in names:
        gpus = policies[name].get("per_gpu") or {}
        out.append(_table(
            [f"{name}: per GPU", "rank", "sent", "received", "rx p50 (us)", "rx p99 (us)"],
            [[host, _fmt(g["rank"]), _fmt(g["packets_sent"]), _fmt(g["packets_received"]),
              _fmt(g["latency_us_p50"]), _fmt(g["latency_us_p99"])]
             for host, g in gpus.items()]))
    scale = results.get("time_scale")
    if scale:
        modelled = results.get("scenario", {}).get("topology", {}).get("modelled_rate_gbit")
        out.append(f"time scale: emulated links run {scale:,.0f}x slower than the modelled "
                   f"{modelled:g} Gbit/s fabric; latencies and CCTs are emulated time")
    return "\n\n".join(out)


def _table(header: List[str], rows: List[List[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(str(h).ljust(w) if i == 0 else str(h).rjust(w)
                       for i, (h, w) in enumerate(zip(header, widths)))]
    lines.append("-" * len(lines[0]))
    for r in rows:
        lines.append("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(lines)


def _pair(a, b):
    return None if a is None and b is None else f"{_fmt(a)} / {_fmt(b)}"


def _ms(us):
    return None if us is None else us / 1000.0
