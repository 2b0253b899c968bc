"""A job's fan-ins: where several GPUs write to one at once (an incast), how fairly the senders
shared the receiver and how busy they kept it (pure over the records' rows and packets).

Per communication kind, iteration and receiver, each round of overlapping ops of that kind
from two or more senders (``rounds``): Jain's index of the senders' throughputs (each one's
payload delivered over its op's time, posted to acknowledged), and the receiver's throughput
while all of them send (payload delivered from them between the last one's start and the
first one's end). DCQCN's published claims (fair shares, throughput kept: docs/REFERENCE.md)
are about that window; once the first sender is done the others must speed up, which a rate
control does at its own pace, so the whole fan-in's time is given beside it.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from traffic.jobgraph import COMPUTE, JobGraph, comm_transfers

from .model import FanIn, FanInRound


def jain_index(values: Sequence[float]) -> float:
    """(sum x)^2 / (n sum x^2): 1 when all are equal, 1/n when one has everything."""
    x = np.asarray(values, dtype=float)
    square = float((x * x).sum())
    return float(x.sum() ** 2 / (x.size * square)) if square else 1.0


def sends(graph: JobGraph, spans: Sequence[dict]) -> Dict[tuple, List[Tuple[int, int, int]]]:
    """(kind, iteration, receiver) -> [(sender, start_ns, end_ns)] of every communication op
    that sends to another rank, from the senders' spans."""
    out: Dict[tuple, List[Tuple[int, int, int]]] = defaultdict(list)
    for s in spans:
        if s["kind"] == COMPUTE:
            continue
        rank = int(s["rank"])
        comm = graph.comms[graph.programs[rank][int(s["op"])].comm]
        for dst in sorted({b for a, b, _n in comm_transfers(comm) if a == rank and b != rank}):
            out[(s["comm_kind"], int(s["iteration"]), dst)].append(
                (rank, int(s["start_ns"]), int(s["end_ns"])))
    return out


def fan_in(graph: JobGraph, spans: Sequence[dict], src: np.ndarray, dst: np.ndarray,
           rx_ns: np.ndarray, payload: np.ndarray, time_scale: float) -> Dict[str, FanIn]:
    """Per kind with a fan-in: receivers, senders (the most into one receiver) and per
    iteration (the mean over its fan-ins: receivers, rounds) ``jain``, ``gbps_modelled``
    (while all send), ``all_send_us`` and ``whole_us`` (first start to last end), in modelled
    time. ``src``, ``dst``, ``rx_ns`` and ``payload``: the delivered packets."""
    rows: Dict[str, Dict[int, List[FanInRound]]] = defaultdict(lambda: defaultdict(list))
    receivers: Dict[str, set] = defaultdict(set)
    most: Dict[str, int] = defaultdict(int)
    for (kind, it, to), ops in sorted(sends(graph, spans).items()):
        for group in rounds(ops):
            row = _round(group, to, src, dst, rx_ns, payload, time_scale)
            if row is None:
                continue  # the ops overlapped, their transfers did not
            rows[kind][it].append(row)
            receivers[kind].add(to)
            most[kind] = max(most[kind], len(group))
    return {kind: FanIn(len(receivers[kind]), most[kind], tuple(sorted(by_it)),
                        tuple(_mean(by_it[it]) for it in sorted(by_it)))
            for kind, by_it in sorted(rows.items())}


def _mean(rounds_: Sequence[FanInRound]) -> FanInRound:
    """An iteration's fan-ins, each figure averaged (4 digits)."""
    columns = zip(*(dataclasses.astuple(r) for r in rounds_))
    return FanInRound(*(round(float(np.mean(column)), 4) for column in columns))


def rounds(ops: Sequence[Tuple[int, int, int]]) -> List[List[Tuple[int, int, int]]]:
    """The fan-ins among one receiver's ops: in order of start, an op joins the current
    round unless its sender is in it already or the round's first op has ended; rounds of
    one sender are none."""
    out: List[List[Tuple[int, int, int]]] = [[]]
    senders, first_end = set(), 0
    for op in sorted(ops, key=lambda o: (o[1], o[0])):
        sender, start, end = op
        if out[-1] and (sender in senders or start >= first_end):
            out.append([])
            senders = set()
        first_end = min(first_end, end) if out[-1] else end
        out[-1].append(op)
        senders.add(sender)
    return [r for r in out if len(r) > 1]


def _round(ops, to: int, src, dst, rx_ns, payload, time_scale: float
           ) -> Optional[FanInRound]:
    """One fan-in's figures (``fan_in``); None when a sender delivered nothing while all
    of them were sending (one-packet ops that overlap only by their acknowledgements)."""
    senders = [a for a, _s, _e in ops]
    first_end, last_start = min(e for _a, _s, e in ops), max(s for _a, s, _e in ops)
    into = dst == to
    rates = []
    for a, start, end in ops:
        mine = into & (src == a) & (rx_ns >= start) & (rx_ns <= end)
        rates.append(int(payload[mine].sum()) / max(1, end - start))
    together = into & np.isin(src, senders) & (rx_ns >= last_start) & (rx_ns <= first_end)
    if set(src[together].tolist()) != set(senders):
        return None
    bits = 8 * int(payload[together].sum())
    return FanInRound(jain_index(rates), bits / (first_end - last_start) * time_scale,
                      (first_end - last_start) / 1000 / time_scale,
                      (max(e for _a, _s, e in ops) - min(s for _a, s, _e in ops))
                      / 1000 / time_scale)
