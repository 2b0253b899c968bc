"""The records an agent writes, read back (pure readers): its CSV files, the kernel transmit
times of the frames it sent, its summary, and every data packet the GPUs received as one
table of columns with its one-way latency joined (``Packets``)."""
from __future__ import annotations

import csv
import glob
import json
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from traffic import metrics
from traffic.contract import AgentSummary
from traffic.records import RECORDS, record_path

from ..base.contract import ContractError, load
from ..base.errors import ResultsError


def read_csv(path: str, columns: Sequence[str] = ()) -> List[dict]:
    """The rows of a CSV file; ``columns``: those its readers index, which it must have."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or ())]
        if missing and reader.fieldnames:
            raise ResultsError(f"{path}: no column {', '.join(missing)} (records of another "
                               "version?)")
        return list(reader)


def record_rows(records_dir: str, host: str, kind: str) -> List[dict]:
    """A GPU's rows of one record file (``<host>.<kind>.csv``, ``traffic.records``; none:
    [])."""
    path = record_path(records_dir, host, kind)
    return read_csv(path, RECORDS[kind]) if os.path.exists(path) else []


def load_tx_times(records_dir: str, host: str) -> Dict[int, int]:
    """sent_ns -> kernel transmit time of the data packets a GPU sent (its tx file)."""
    return {int(r["sent_ns"]): int(r["tx_ns"])
            for r in record_rows(records_dir, host, "tx") if r["kind"] == "d"}


class Packets:
    """Every data packet the GPUs received, as columns (numpy), latency joined."""

    COLUMNS = ("src", "dst", "sent", "latency", "iteration", "payload", "delivered", "ce",
               "retx")

    def __init__(self, **columns):
        for name in self.COLUMNS:
            setattr(self, name, columns[name])

    def select(self, mask) -> "Packets":
        return Packets(**{name: getattr(self, name)[mask] for name in self.COLUMNS})

    def ipdv_us(self) -> np.ndarray:
        """RFC 3393 IPDV over every flow (src -> dst), consecutive packets in send order."""
        if self.src.size < 2:
            return np.zeros(0)
        order = np.lexsort((self.sent, self.dst, self.src))
        flow = self.src[order] * 1_000_000 + self.dst[order]
        same = flow[1:] == flow[:-1]
        return metrics.ipdv_us(self.latency[order])[same]

    def path_minima_us(self, less_us: Optional[np.ndarray] = None) -> Dict[tuple, float]:
        """(src, dst) -> the lowest one-way latency seen on that GPU pair (less ``less_us``,
        per packet, if given)."""
        out: Dict[tuple, float] = {}
        latency = self.latency if less_us is None else self.latency - less_us
        for s, d, lat in zip(self.src.tolist(), self.dst.tolist(), latency.tolist()):
            if lat < out.get((s, d), float("inf")):
                out[(s, d)] = lat
        return out

    def latency_figures(self) -> dict:
        latency = metrics.percentiles(self.latency)
        return {"latency_us": latency,
                "jitter_us": metrics.jitter_summary(self.ipdv_us(), latency),
                "tail_ratio_p99_p50": metrics.tail_ratio(latency)}


def read_summaries(records_dir: str) -> List[AgentSummary]:
    """Every GPU's summary the agents wrote (a process contract: a key it does not declare
    is an error naming the file)."""
    out = []
    for path in sorted(glob.glob(os.path.join(records_dir, "*.summary.json"))):
        with open(path, encoding="utf-8") as f:
            try:
                out.append(load(AgentSummary, json.load(f), os.path.basename(path)))
            except ContractError as e:
                raise ResultsError(f"agent records: {e}") from None
    return out


def load_packets(records_dir: str) -> Packets:
    """Every data packet the GPUs received, from the records of one policy's run."""
    return packets_and_gpus(records_dir, read_summaries(records_dir))[0]


def packets_and_gpus(records_dir: str, summaries: List[AgentSummary]):
    tx_times = {(s.rank, sent): tx for s in summaries
                for sent, tx in load_tx_times(records_dir, s.host).items()}
    cols: Dict[str, list] = {k: [] for k in Packets.COLUMNS}
    per_gpu: Dict[str, dict] = {}
    app_clock = 0
    for summary in summaries:
        host = summary.host
        rows = read_csv(record_path(records_dir, host, "packets"), RECORDS["packets"])
        sent_at, rx = [], []
        for r in rows:
            sent = int(r["sent_ns"])
            tx = tx_times.get((int(r["src"]), sent))
            if tx is None:
                app_clock += 1
                tx = sent
            sent_at.append(tx)
            rx.append(int(r["rx_ns"]))
        latency = metrics.latency_us(sent_at, rx)
        cols["latency"].append(latency)
        cols["sent"].append(np.asarray(sent_at, dtype=np.int64))
        for key, name, kind in (("src", "src", np.int64), ("dst", "dst", np.int64),
                                ("iteration", "iteration", np.int64),
                                ("payload", "bytes", np.int64),
                                ("delivered", "delivered", np.int64),
                                ("retx", "retx", np.int64)):
            cols[key].append(np.asarray([int(r[name]) for r in rows], dtype=kind))
        cols["ce"].append(np.asarray([int(r["ecn"]) == 3 for r in rows], dtype=np.int64))
        lat = metrics.percentiles(latency)
        count = summary.counter
        per_gpu[host] = {"rank": summary.rank,
                         "packets_sent": count("tx_packets") + count("retransmitted"),
                         "packets_received": len(rows),
                         "latency_us_p50": lat["p50"] if lat else None,
                         "latency_us_p99": lat["p99"] if lat else None,
                         "loop_lag_us_p99": summary.loop_lag.p99_us if summary.loop_lag else None,
                         "rx_foreign_qp": count("rx_foreign_qp")}
    joined = {k: (np.concatenate(v) if v else np.zeros(0, dtype=np.int64))
              for k, v in cols.items()}
    joined["latency"] = joined["latency"].astype(float)
    return Packets(**joined), per_gpu, app_clock
