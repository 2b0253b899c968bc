"""What an agent writes for each GPU when its iterations are done (the runner's
``testbed.results.collect`` reads them): packets, transmit times, transfers, op spans,
iterations, RTO/NAK events, QP rates (CSV) and a summary (JSON)."""
from __future__ import annotations

import csv
import json
import os
from typing import TYPE_CHECKING, Dict, List

from testbed.base.atomic import atomic_file

from . import ratelimit
from .contract import AgentSummary

if TYPE_CHECKING:
    from .gpu import Gpu
    from .rnic import Rnic

# sent_ns: the sender's clock when it handed the packet to its NIC (carried in the packet);
# the kernel transmit time is in the sender's tx file, joined on (src, sent_ns). The tx file
# lists every frame the NIC sent (kind d: data, c: ACK/NAK/CNP) with its length.
PACKET_FIELDS = ("src", "dst", "psn", "bytes", "sent_ns", "rx_ns", "iteration", "step", "ecn",
                 "delivered", "retx")
TX_FIELDS = ("sent_ns", "tx_ns", "bytes", "kind", "ready_ns")
OP_FIELDS = ("rank", "iteration", "kind", "peer", "tag", "phase", "bytes", "start_ns", "end_ns")
ITERATION_FIELDS = ("rank", "iteration", "workload", "collective", "size", "compute_start_ns",
                    "start_ns", "end_ns", "compute_ns", "straggle_ns", "bytes_sent",
                    "bytes_received")
QP_FIELDS = ("qpn", "peer", "t_ns", "rate_bps", "bytes_sent")
# one row per op of each iteration (traffic.jobgraph): a compute span or this rank's part in a
# communication, from when the ops it waits for ended to when it ended
# retransmission timeouts (at the sender) and NAKs (at the receiver that sent them)
EVENT_FIELDS = ("t_ns", "kind", "peer")
SPAN_FIELDS = ("rank", "iteration", "op", "name", "kind", "stream", "comm_kind", "collective",
               "group_size", "bytes", "start_ns", "end_ns")
# <host>.<kind>.csv -> its columns: what the results' readers may index
RECORDS = {"packets": PACKET_FIELDS, "tx": TX_FIELDS, "ops": OP_FIELDS,
           "iterations": ITERATION_FIELDS, "qps": QP_FIELDS, "events": EVENT_FIELDS,
           "spans": SPAN_FIELDS}


def record_path(records_dir: str, host: str, kind: str) -> str:
    """A GPU's record file of one kind (``RECORDS``)."""
    return os.path.join(records_dir, f"{host}.{kind}.csv")


def counters(gpu: Gpu) -> dict:
    """The GPU's counters and its RNIC's, its QPs' summed up."""
    nic = gpu.nic
    c = dict(nic.counters)
    c.update(gpu.counters)
    for qp in nic.qps.values():
        for k, v in qp.req.counters.items():
            c[f"req_{k}"] = c.get(f"req_{k}", 0) + v
        for k, v in qp.resp.counters.items():
            c[f"resp_{k}"] = c.get(f"resp_{k}", 0) + v
        if qp.np is not None:
            c["cnps_sent"] = c.get("cnps_sent", 0) + qp.np.cnps_sent
    c["tx_packets"] = c.get("req_tx_packets", 0)
    c["retransmitted"] = c.get("req_retransmitted", 0)
    c["naks_received"] = c.get("req_naks", 0)
    c["timeouts"] = c.get("req_timeouts", 0)
    c["naks_sent"] = c.get("resp_naks_sent", 0)
    c["tx_bytes"] = sum(qp.bytes_sent for qp in nic.qps.values())
    if nic.limiters is not None:
        c["limiter_changes"] = nic.limiters.changes
        c["limiter_change_us"] = round(nic.limiters.change_ns / 1000)
        c["limiter_change_us_max"] = round(nic.limiters.change_ns_max / 1000)
    return c


def frames_to(nic: Rnic) -> Dict[str, List[int]]:
    """Per peer rank: [data frames, their bytes, control frames, their bytes] sent."""
    out: Dict[str, List[int]] = {}
    for qp in nic.qps.values():
        r = qp.req.counters
        row = out.setdefault(str(qp.peer), [0, 0, 0, 0])
        row[0] += r["tx_packets"] + r["retransmitted"]
        row[1] += qp.bytes_sent
        row[2] += qp.control_frames
        row[3] += qp.control_bytes
    return {k: v for k, v in out.items() if any(v)}


def limiter_ready_times(nic: Rnic) -> Dict[int, int]:
    """sent ns -> when its QP's limiter let it go, for the frames a limiter held (the tx
    file's ready_ns: when they reached the NIC's shaper)."""
    if nic.limiters is None:
        return {}
    left = {row[0]: (row[1], row[2]) for row in nic.tx_log if row[3] == "d"}
    out: Dict[int, int] = {}
    for qp in nic.qps.values():
        frames = [(s, *left[s]) for s in qp.sent_log if s in left]
        out.update(ratelimit.ready_times(frames, qp.limit_log, nic.limiters.open_bps))
    return out


def write(gpu: Gpu, out_dir: str) -> None:
    """Every record file of ``gpu`` and its RNIC into ``out_dir``."""
    nic = gpu.nic
    nic.collect_stamps()
    if nic.limiters is not None:
        nic.limiters.check()

    def record(kind, rows):
        write_csv(record_path(out_dir, gpu.host, kind), RECORDS[kind], rows)

    record("packets", nic.packets)
    record("ops", gpu.progress.op_rows(gpu.iteration_rows))
    record("iterations", gpu.iteration_rows)
    record("spans", gpu.progress.span_rows(gpu.iteration_rows))
    record("events", nic.events)
    ready = limiter_ready_times(nic)
    record("tx", (row + (ready.get(row[0], ""),) for row in nic.tx_log))
    rows = []
    for qp in nic.qps.values():
        if qp.rp is None:
            continue
        for t, rate in qp.rp.history:
            rows.append((qp.qpn, qp.peer, t, round(rate), ""))
        for t, rate, sent in qp.samples:
            rows.append((qp.qpn, qp.peer, t, round(rate), sent))
    rows.sort(key=lambda r: (r[0], r[2]))
    record("qps", rows)
    summary = AgentSummary(
        rank=gpu.rank, host=gpu.host, counters=counters(gpu), rx_packets=len(nic.packets),
        loop_lag=gpu.lag.summary(),
        loop_lag_by_timer={k: h.summary() for k, h in gpu.lag_by.items()},
        first_start_lag_us=round(gpu.first_start_lag_ns / 1000.0, 3),
        scheduling=gpu.loop.scheduling,
        frames_to={k: tuple(v) for k, v in frames_to(nic).items()})
    with atomic_file(os.path.join(out_dir, f"{gpu.host}.summary.json"), sync=False) as f:
        json.dump(summary.to_dict(), f)


def write_csv(path: str, header, rows) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
