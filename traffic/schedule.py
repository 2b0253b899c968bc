"""Collective schedules as pure functions: which rank sends which chunk to whom, in what order.

Ring all-reduce (REFERENCE.md, "Collectives"; Patarasuk & Yuan 2009; NCCL): the buffer of
``size`` bytes is cut into ``n`` chunks. In ``n - 1`` reduce-scatter steps and then ``n - 1``
all-gather steps, rank ``r`` sends one chunk to ``r + 1`` and receives one from ``r - 1``;
step ``k + 1`` at rank ``r`` starts only after ``r`` has received step ``k`` from ``r - 1``.
Each rank therefore sends ``2 (n - 1) size / n`` bytes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List


@dataclass(frozen=True)
class Step:
    """What one rank does in one step of a collective."""

    index: int
    phase: str  # "reduce-scatter" | "all-gather"
    send_to: int
    recv_from: int
    send_chunk: int
    recv_chunk: int
    send_bytes: int
    recv_bytes: int


def chunk_sizes(size: int, n: int) -> List[int]:
    """Split ``size`` bytes into ``n`` chunks differing by at most one byte."""
    if n < 1:
        raise ValueError("need at least one rank")
    if size < n:
        raise ValueError(f"size {size} B cannot be split over {n} ranks")
    base, extra = divmod(size, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def ring_allreduce(rank: int, n: int, size: int) -> List[Step]:
    """The ``2 (n - 1)`` steps of ring all-reduce for ``rank`` of ``n`` ranks."""
    if n < 2:
        raise ValueError("ring all-reduce needs at least 2 ranks")
    if not 0 <= rank < n:
        raise ValueError(f"rank {rank} out of range for {n} ranks")
    chunks = chunk_sizes(size, n)
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    steps = []
    for k in range(2 * (n - 1)):
        # Reduce-scatter: at step k rank r sends chunk (r - k) and receives chunk (r - k - 1);
        # after n - 1 steps it owns the reduced chunk (r + 1). All-gather then circulates the
        # reduced chunks: at step n - 1 + j rank r sends chunk (r + 1 - j).
        if k < n - 1:
            phase, send_chunk = "reduce-scatter", (rank - k) % n
        else:
            phase, send_chunk = "all-gather", (rank + 1 - (k - (n - 1))) % n
        recv_chunk = (send_chunk - 1) % n
        steps.append(Step(k, phase, nxt, prv, send_chunk, recv_chunk,
                          chunks[send_chunk], chunks[recv_chunk]))
    return steps


def bytes_sent_per_rank(n: int, size: int) -> int:
    """Bytes each rank sends in a ring all-reduce: ``2 (n - 1) size / n`` (exact for n | size)."""
    return sum(s.send_bytes for s in ring_allreduce(0, n, size))


COLLECTIVES = {"ring_allreduce": ring_allreduce}


def bus_bandwidth_factor(collective: str, n: int) -> float:
    """nccl-tests busbw = algbw x factor (nccl-tests doc/PERFORMANCE.md)."""
    if collective == "ring_allreduce":
        return 2 * (n - 1) / n
    raise KeyError(collective)
