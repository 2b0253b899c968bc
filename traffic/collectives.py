"""Collective schedules as pure functions: who sends which bytes to whom, after what.

A collective on ``n`` ranks over a buffer of ``size`` bytes is a set of ``Transfer``s. Each
transfer is one RDMA WRITE message from ``src`` to ``dst``: ``nbytes`` read at ``offset`` of
the sender's buffer, placed at ``dst_offset`` of the receiver's, where the receiver either
reduces (adds) or copies them. ``after`` names the transfers the sender must have *received*
before it may send this one - the data dependency. A rank is done when all its transfers are
acknowledged and all transfers to it delivered. The agent runs this graph as it is; nothing
else orders the messages, so pipelining comes from the graph alone.

Algorithms (docs/REFERENCE.md, "Collectives"; S = size, n = ranks):

=====================  =========================================================  =========
name                   what                                                       per rank
=====================  =========================================================  =========
``ring``               reduce-scatter then all-gather around the ring r -> r+1,   2(n-1)S/n
                       blocks of S/n, each cut into ``chunks`` pipelined pieces
``halving_doubling``   Rabenseifner: recursive halving reduce-scatter with        2(n-1)S/n
                       partner r xor 2^d (S/2, S/4, ...), then recursive
                       doubling all-gather; n must be a power of two
``double_binary_tree`` NCCL's two binary trees (the second mirrored, or shifted   varies;
                       for odd n), each reducing up and broadcasting down half    total
                       of the buffer in ``chunks`` pipelined pieces               2(n-1)S
``hierarchical``       rail-aligned: reduce-scatter inside each leaf, a ring      2(n-1)S/n
                       all-reduce of S/g per rail (the GPUs with the same local
                       index on every leaf), all-gather inside each leaf
``all_to_all``         MoE dispatch: every rank sends S/n to every other rank     (n-1)S/n
``all_gather``         ring all-gather: rank r contributes block (r+1) mod n      (n-1)S/n
``reduce_scatter``     ring reduce-scatter: rank r ends owning block (r+1) mod n  (n-1)S/n
                       reduced over all ranks
``send_recv``          point to point (pipeline stages): rank 0 sends S to 1      S
=====================  =========================================================  =========

``simulate`` replays a collective on symbolic data (which rank's contribution each byte
holds) in the most adversarial order the dependencies allow, so tests prove that the
dependencies are sufficient and that every rank ends with the right result.

Why one module over 400 lines: the five algorithms side by side, each a short pure function
producing the same kind of transfer graph, and the symbolic replay that checks them all.
"""
from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

Ref = Tuple[int, int]  # (src rank, tag): one transfer


class ScheduleError(ValueError):
    """A collective cannot be built for these ranks and sizes."""


@dataclass(frozen=True)
class Transfer:
    src: int
    dst: int
    tag: int  # unique among the transfers of ``src``: 0, 1, 2, ... in posting order
    offset: int
    dst_offset: int
    nbytes: int
    op: str  # "reduce" | "copy"
    after: Tuple[Ref, ...]
    phase: str
    source: str = "work"  # "work": the reduction buffer; "input": a separate send buffer

    @property
    def ref(self) -> Ref:
        return (self.src, self.tag)


@dataclass(frozen=True)
class Collective:
    name: str
    ranks: int
    size: int
    transfers: Tuple[Transfer, ...]
    kind: str  # "allreduce" | "alltoall" | "allgather" | "reducescatter" | "sendrecv"
    scratch: int = 0  # staging bytes past the buffer the schedule writes and reads (PXN)

    def sends(self, rank: int) -> List[Transfer]:
        return [t for t in self.transfers if t.src == rank]

    def receives(self, rank: int) -> List[Transfer]:
        return [t for t in self.transfers if t.dst == rank]

    def bytes_sent(self, rank: int) -> int:
        return sum(t.nbytes for t in self.transfers if t.src == rank)

    def bytes_received(self, rank: int) -> int:
        return sum(t.nbytes for t in self.transfers if t.dst == rank)

    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.transfers)


def chunk_sizes(size: int, n: int) -> List[int]:
    """Split ``size`` bytes into ``n`` chunks differing by at most one byte."""
    if n < 1:
        raise ScheduleError("need at least one chunk")
    if size < n:
        raise ScheduleError(f"{size} B cannot be split into {n} parts")
    base, extra = divmod(size, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def _offsets(sizes: Sequence[int], start: int = 0) -> List[int]:
    out, at = [], start
    for s in sizes:
        out.append(at)
        at += s
    return out


class _Builder:
    def __init__(self, n: int):
        self.n = n
        self.transfers: List[Transfer] = []
        self.next_tag = [0] * n

    def send(self, src: int, dst: int, offset: int, nbytes: int, op: str, after, phase: str,
             dst_offset: Optional[int] = None, source: str = "work") -> Ref:
        tag = self.next_tag[src]
        self.next_tag[src] += 1
        self.transfers.append(Transfer(src, dst, tag, offset,
                                       offset if dst_offset is None else dst_offset, nbytes, op,
                                       tuple(dict.fromkeys(after)), phase, source))
        return (src, tag)


class _Region:
    """``length`` bytes at ``offset`` cut into ``m`` blocks, each into up to ``chunks`` pieces."""

    def __init__(self, offset: int, length: int, m: int, chunks: int):
        self.blocks = chunk_sizes(length, m)
        self.block_offsets = _offsets(self.blocks, offset)
        self.pieces = [chunk_sizes(b, min(chunks, b)) for b in self.blocks]
        self.n_pieces = max(len(p) for p in self.pieces)

    def piece(self, block: int, j: int) -> Optional[Tuple[int, int]]:
        """(offset, nbytes) of piece ``j`` of ``block``, or None when the block has fewer."""
        sizes = self.pieces[block]
        if j >= len(sizes):
            return None
        return self.block_offsets[block] + sum(sizes[:j]), sizes[j]


def _reduce_scatter(b: _Builder, members: Sequence[int], region: _Region,
                    entry: Dict[int, Tuple[Ref, ...]], phase: str) -> Dict[int, List[Tuple[Ref, ...]]]:
    """Ring reduce-scatter; member at position p ends owning block (p + 1) mod m.

    Returns, per rank, the transfers (per piece) that complete its owned block."""
    m = len(members)
    if m == 1:
        r = members[0]
        return {r: [entry.get(r, ())] * region.n_pieces}
    last: Dict[Tuple[int, int], Tuple[Ref, ...]] = {}  # (rank, piece) -> deps for next send
    for k in range(m - 1):
        sent: Dict[Tuple[int, int], Ref] = {}
        for p, r in enumerate(members):
            block = (p - k) % m
            for j in range(region.n_pieces):
                piece = region.piece(block, j)
                if piece is None:
                    continue
                # its own contribution must be ready (entry) at every step, not only the first
                after = entry.get(r, ()) + (last[(r, j)] if k else ())
                sent[(p, j)] = b.send(r, members[(p + 1) % m], piece[0], piece[1], "reduce",
                                      after, phase)
        last = {}
        for (p, j), ref in sent.items():
            last[(members[(p + 1) % m], j)] = (ref,)
    return {r: [entry.get(r, ()) + last.get((r, j), ()) for j in range(region.n_pieces)]
            for r in members}


def _all_gather(b: _Builder, members: Sequence[int], region: _Region,
                entry: Dict[int, List[Tuple[Ref, ...]]], phase: str) -> Dict[int, List[Ref]]:
    """Ring all-gather; member at position p starts with block (p + 1) mod m, which it may send
    once ``entry[rank][piece]`` arrived. Returns every rank's receives."""
    m = len(members)
    received: Dict[int, List[Ref]] = defaultdict(list)
    if m == 1:
        return received
    last: Dict[Tuple[int, int], Tuple[Ref, ...]] = {}
    for k in range(m - 1):
        sent: Dict[Tuple[int, int], Ref] = {}
        for p, r in enumerate(members):
            block = (p + 1 - k) % m
            for j in range(region.n_pieces):
                piece = region.piece(block, j)
                if piece is None:
                    continue
                after = entry[r][j] if k == 0 else last[(r, j)]
                sent[(p, j)] = b.send(r, members[(p + 1) % m], piece[0], piece[1], "copy",
                                      after, phase)
        last = {}
        for (p, j), ref in sent.items():
            dst = members[(p + 1) % m]
            last[(dst, j)] = (ref,)
            received[dst].append(ref)
    return received


def ring(n: int, size: int, chunks: int = 1, **_) -> Collective:
    _at_least(n, 2, "ring")
    b = _Builder(n)
    members = list(range(n))
    region = _Region(0, size, n, chunks)
    owned = _reduce_scatter(b, members, region, {}, "reduce-scatter")
    _all_gather(b, members, region, owned, "all-gather")
    return Collective("ring", n, size, tuple(b.transfers), "allreduce")


def halving_doubling(n: int, size: int, **_) -> Collective:
    _at_least(n, 2, "halving_doubling")
    if n & (n - 1):
        raise ScheduleError(f"halving_doubling (Rabenseifner) needs a power-of-two number of "
                            f"ranks, got {n}; use ring or double_binary_tree")
    blocks = chunk_sizes(size, n)
    offs = _offsets(blocks) + [size]
    b = _Builder(n)
    lo, hi = [0] * n, [n] * n  # each rank's current range of blocks
    got: List[List[Ref]] = [[] for _ in range(n)]  # every receive so far, per rank
    dist = n // 2
    while dist >= 1:  # reduce-scatter by recursive halving
        step = []
        for r in range(n):
            mid = (lo[r] + hi[r]) // 2
            keep, give = ((lo[r], mid), (mid, hi[r])) if not r & dist else ((mid, hi[r]), (lo[r], mid))
            step.append((r, keep, give))
        sent = {}
        for r, keep, give in step:
            sent[r] = b.send(r, r ^ dist, offs[give[0]], offs[give[1]] - offs[give[0]], "reduce",
                             got[r], "reduce-scatter")
        for r, keep, _give in step:
            lo[r], hi[r] = keep
            got[r].append(sent[r ^ dist])
        dist //= 2
    dist = 1
    while dist < n:  # all-gather by recursive doubling
        sent = {r: b.send(r, r ^ dist, offs[lo[r]], offs[hi[r]] - offs[lo[r]], "copy", got[r],
                          "all-gather") for r in range(n)}
        ranges = [(lo[r], hi[r]) for r in range(n)]
        for r in range(n):
            p_lo, p_hi = ranges[r ^ dist]
            lo[r], hi[r] = min(lo[r], p_lo), max(hi[r], p_hi)
            got[r].append(sent[r ^ dist])
        dist *= 2
    return Collective("halving_doubling", n, size, tuple(b.transfers), "allreduce")


def btree_parents(n: int) -> List[int]:
    """Parent of each rank in NCCL's binary tree rooted at 0 (-1 for the root).

    From the lowest set bit of r: parent = (r xor bit) | (bit << 1), or r xor bit when that is
    out of range (NCCL ``ncclGetBtree``)."""
    parents = [-1] * n
    for r in range(1, n):
        bit = r & -r
        up = (r ^ bit) | (bit << 1)
        parents[r] = up if up < n else r ^ bit
    return parents


def double_binary_trees(n: int) -> Tuple[List[int], List[int]]:
    """Parents in NCCL's two trees: the binary tree, and its mirror (even n) or its shift by
    one rank (odd n), so that most ranks are a leaf in one tree and inner in the other."""
    first = btree_parents(n)
    if n % 2 == 0:
        second = [-1] * n
        for r in range(n):
            p = first[n - 1 - r]
            second[r] = -1 if p == -1 else n - 1 - p
    else:
        second = [-1] * n
        for r in range(n):
            p = first[(r - 1) % n]
            second[r] = -1 if p == -1 else (p + 1) % n
    return first, second


def double_binary_tree(n: int, size: int, chunks: int = 1, **_) -> Collective:
    _at_least(n, 2, "double_binary_tree")
    b = _Builder(n)
    halves = chunk_sizes(size, 2)
    for t, (parents, offset, length) in enumerate(zip(double_binary_trees(n),
                                                     _offsets(halves), halves)):
        children: Dict[int, List[int]] = defaultdict(list)
        for r, p in enumerate(parents):
            if p >= 0:
                children[p].append(r)
        root = parents.index(-1)
        order = _postorder(root, children)
        pieces = chunk_sizes(length, min(chunks, length))
        for j, (off, nbytes) in enumerate(zip(_offsets(pieces, offset), pieces)):
            up: Dict[int, Ref] = {}
            for r in order:  # reduce towards the root, children first
                if r != root:
                    up[r] = b.send(r, parents[r], off, nbytes, "reduce",
                                   [up[c] for c in children[r]], f"tree{t} reduce")
            down: Dict[int, Ref] = {}
            for r in reversed(order):  # broadcast from the root, parents first
                for c in children[r]:
                    after = [up[x] for x in children[r]] if r == root else [down[r]]
                    down[c] = b.send(r, c, off, nbytes, "copy", after, f"tree{t} broadcast")
    return Collective("double_binary_tree", n, size, tuple(b.transfers), "allreduce")


def _postorder(root: int, children: Dict[int, List[int]]) -> List[int]:
    out, stack = [], [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            out.append(node)
            continue
        stack.append((node, True))
        stack += [(c, False) for c in reversed(children[node])]
    return out


def hierarchical(n: int, size: int, chunks: int = 1, group: int = 1, **_) -> Collective:
    """Rail-aligned all-reduce for ``n`` ranks in groups (leaves) of ``group`` consecutive
    ranks: intra-group reduce-scatter, per-rail ring all-reduce, intra-group all-gather."""
    _at_least(n, 2, "hierarchical")
    if group < 1 or n % group:
        raise ScheduleError(f"hierarchical needs the ranks ({n}) to be whole groups of {group}")
    leaves = n // group
    b = _Builder(n)
    groups = [list(range(g * group, (g + 1) * group)) for g in range(leaves)]
    intra = _Region(0, size, group, chunks)
    owned: Dict[int, List[Tuple[Ref, ...]]] = {}
    for members in groups:
        owned.update(_reduce_scatter(b, members, intra, {}, "intra reduce-scatter"))
    rail_done: Dict[int, List[Tuple[Ref, ...]]] = {}
    for p in range(group):  # rail p: local position p on every leaf; owns block (p + 1) % g
        block = (p + 1) % group
        rail = [members[p] for members in groups]
        region = _Region(intra.block_offsets[block], intra.blocks[block], leaves, chunks)
        entry = {r: tuple(ref for refs in owned[r] for ref in refs) for r in rail}
        rs = _reduce_scatter(b, rail, region, entry, "rail reduce-scatter")
        ag = _all_gather(b, rail, region, rs, "rail all-gather")
        for r in rail:
            done = tuple(ref for refs in rs[r] for ref in refs) + tuple(ag[r])
            rail_done[r] = [done or entry[r]] * intra.n_pieces
    for members in groups:
        _all_gather(b, members, intra, rail_done, "intra all-gather")
    return Collective("hierarchical", n, size, tuple(b.transfers), "allreduce")


def all_to_all(n: int, size: int, pxn: Tuple[Tuple[int, int], ...] = (), **_) -> Collective:
    """Every rank sends block j (S/n bytes, floor) of its input buffer to rank j, which places
    it at block (sender) of its output.

    ``pxn``: each rank's (server, rail). A block for a rank on another server and another
    rail then first goes to the rank of the sender's server on the destination's rail (over
    the scale-up domain), which stages it past its buffer and sends it on along its rail, as
    NCCL's PXN does; without such a rank in the group the block goes directly."""
    _at_least(n, 2, "all_to_all")
    block = size // n
    if block < 1:
        raise ScheduleError(f"all_to_all: {size} B cannot be split over {n} ranks")
    relay_of = {place: r for r, place in enumerate(pxn)}
    b = _Builder(n)
    staged = 0
    for r in range(n):
        for k in range(1, n):  # r+1 first, then r+2, ...: not everyone at rank 0 at once
            j = (r + k) % n
            relay = (relay_of.get((pxn[r][0], pxn[j][1]))
                     if pxn and pxn[r][0] != pxn[j][0] and pxn[r][1] != pxn[j][1] else None)
            if relay is None:
                b.send(r, j, j * block, block, "copy", (), "exchange", dst_offset=r * block,
                       source="input")
                continue
            at = size + staged
            staged += block
            hop = b.send(r, relay, j * block, block, "copy", (), "pxn to rail", dst_offset=at,
                         source="input")
            b.send(relay, j, at, block, "copy", (hop,), "pxn along rail", dst_offset=r * block)
    return Collective("all_to_all", n, size, tuple(b.transfers), "alltoall", staged)


def all_gather(n: int, size: int, chunks: int = 1, **_) -> Collective:
    _at_least(n, 2, "all_gather")
    b = _Builder(n)
    members = list(range(n))
    region = _Region(0, size, n, chunks)
    _all_gather(b, members, region, {r: [()] * region.n_pieces for r in members}, "all-gather")
    return Collective("all_gather", n, size, tuple(b.transfers), "allgather")


def reduce_scatter(n: int, size: int, chunks: int = 1, **_) -> Collective:
    _at_least(n, 2, "reduce_scatter")
    b = _Builder(n)
    _reduce_scatter(b, list(range(n)), _Region(0, size, n, chunks), {}, "reduce-scatter")
    return Collective("reduce_scatter", n, size, tuple(b.transfers), "reducescatter")


def send_recv(n: int, size: int, **_) -> Collective:
    """A pipeline stage's activations or gradients: rank 0 sends its buffer to rank 1."""
    if n != 2:
        raise ScheduleError(f"send_recv is between 2 ranks, got {n}")
    b = _Builder(2)
    b.send(0, 1, 0, size, "copy", (), "p2p", source="input")
    return Collective("send_recv", 2, size, tuple(b.transfers), "sendrecv")


def _at_least(n: int, k: int, name: str) -> None:
    if n < k:
        raise ScheduleError(f"{name} needs at least {k} ranks, got {n}")


ALGORITHMS: Dict[str, Callable[..., Collective]] = {
    "ring": ring,
    "halving_doubling": halving_doubling,
    "double_binary_tree": double_binary_tree,
    "hierarchical": hierarchical,
    "all_to_all": all_to_all,
    "all_gather": all_gather,
    "reduce_scatter": reduce_scatter,
    "send_recv": send_recv,
}
# what each algorithm's ``kind`` is (nccl-tests' names for the bus bandwidth factor)
KINDS = {"ring": "allreduce", "halving_doubling": "allreduce",
         "double_binary_tree": "allreduce", "hierarchical": "allreduce",
         "all_to_all": "alltoall", "all_gather": "allgather",
         "reduce_scatter": "reducescatter", "send_recv": "sendrecv"}
ALIASES = {"ring_allreduce": "ring"}


def build(name: str, n: int, size: int, chunks: int = 1, group: int = 1,
          pxn: Tuple[Tuple[int, int], ...] = ()) -> Collective:
    name = ALIASES.get(name, name)
    if name not in ALGORITHMS:
        raise ScheduleError(f"unknown collective {name!r} (known: {', '.join(ALGORITHMS)})")
    return ALGORITHMS[name](n, size, chunks=chunks, group=group, pxn=pxn)


def bus_bandwidth_factor(kind: str, n: int) -> float:
    """nccl-tests busbw = algbw x factor (nccl-tests, its performance notes): 2(n-1)/n for
    all-reduce; (n-1)/n for all-gather, reduce-scatter and all-to-all; 1 for broadcast and
    reduce."""
    factors = {"allreduce": 2 * (n - 1) / n, "allgather": (n - 1) / n,
               "reducescatter": (n - 1) / n, "alltoall": (n - 1) / n,
               "broadcast": 1.0, "reduce": 1.0, "sendrecv": 1.0}
    if kind not in factors:
        raise KeyError(kind)
    return factors[kind]


# --- symbolic replay --------------------------------------------------------------------------
def simulate(c: Collective, seed: int = 0) -> List[List[Counter]]:
    """Each rank's buffer after the collective (its staging space after it): per byte, a
    multiset of (rank, byte) inputs.

    Adversarial order: every transfer is sent as soon as its dependencies have been delivered
    (so it carries no data it did not wait for), and deliveries happen in random order.
    Raises ``ScheduleError`` on a deadlock or a transfer that reads outside the buffer."""
    n, size = c.ranks, c.size + c.scratch
    inputs = [[Counter({(r, i): 1}) for i in range(size)] for r in range(n)]
    work = [[Counter(x) for x in row] for row in inputs]
    pending = {t.ref: t for t in c.transfers}
    delivered = set()
    in_flight: List[Tuple[Transfer, List[Counter]]] = []
    rng = random.Random(seed)
    while pending or in_flight:
        ready = [t for t in pending.values() if all(d in delivered for d in t.after)]
        for t in ready:
            if t.offset + t.nbytes > size or t.dst_offset + t.nbytes > size:
                raise ScheduleError(f"transfer {t} reads or writes outside the buffer")
            buf = inputs[t.src] if t.source == "input" else work[t.src]
            in_flight.append((t, [Counter(x) for x in buf[t.offset:t.offset + t.nbytes]]))
            del pending[t.ref]
        if not in_flight:
            raise ScheduleError(f"deadlock: {len(pending)} transfers wait for nothing in flight")
        t, payload = in_flight.pop(rng.randrange(len(in_flight)))
        dst = work[t.dst]
        for i, data in enumerate(payload):
            if t.op == "reduce":
                dst[t.dst_offset + i] = dst[t.dst_offset + i] + data
            else:
                dst[t.dst_offset + i] = data
        delivered.add(t.ref)
    return work


def expected_result(c: Collective, rank: int) -> List[Optional[Counter]]:
    """What ``simulate`` must leave in ``rank``'s buffer (None: a byte the collective leaves
    undefined, as a reduce-scatter does outside the rank's own block)."""
    n = c.ranks
    if c.kind == "allreduce":
        return [Counter({(r, i): 1 for r in range(n)}) for i in range(c.size)]
    if c.kind in ("allgather", "reducescatter"):
        blocks = chunk_sizes(c.size, n)
        starts = _offsets(blocks) + [c.size]
        owner = [b for b in range(n) for _ in range(blocks[b])]  # byte -> its block
        if c.kind == "allgather":  # block b is rank (b - 1)'s contribution
            return [Counter({((owner[i] - 1) % n, i): 1}) for i in range(c.size)]
        mine = (rank + 1) % n
        return [Counter({(r, i): 1 for r in range(n)}) if starts[mine] <= i < starts[mine + 1]
                else None for i in range(c.size)]
    if c.kind == "sendrecv":
        return [Counter({(0, i): 1}) for i in range(c.size)]
    block = c.size // n
    out = [Counter({(src, rank * block + k): 1}) for src in range(n) for k in range(block)]
    return out + [Counter({(rank, i): 1}) for i in range(len(out), c.size)]


def result_ok(c: Collective, rank: int, buf: List[Counter]) -> bool:
    """Whether ``buf`` (from ``simulate``) is what the collective must leave at ``rank``."""
    return all(want is None or want == got
               for want, got in zip(expected_result(c, rank), buf))
