"""A training iteration as a graph of operations, pure: what each rank computes and
communicates, in which order, after what - checked and replayed without packets.

Each rank runs a program of ``Op``s. An op starts once every op of the same rank named in
``after`` has ended. A compute op then takes ``ns``. A communication op is this rank's part in
``Comm`` number ``comm``: a collective (``traffic.collectives``) over the comm's group of
ranks; it ends on this rank when all its transfers from this rank are acknowledged and all
transfers to it delivered (``traffic.progress``). ``stream`` names the op's stream (compute,
dp, tp, pp, ep, coll): ops of one stream run one at a time, an order the graph states in
``after`` like any dependency, so the graph alone says what may overlap.

``needs`` and ``makes`` name the values an op reads and writes on its rank (a layer's
activations, a gradient bucket). ``check`` proves with them that every value is made before it
is read and that the ops of a stream never overlap, and that the graph cannot deadlock across
ranks; ``reduced`` drops the dependencies others imply, so that removing any one left is
caught. ``replay`` gives every op's start and end for given costs: with free communication, the
compute model's iteration time, the reference a run is compared with.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from .collectives import ALIASES, Collective, ScheduleError, Transfer, build

COMPUTE, COMM = "compute", "comm"


@dataclass(frozen=True)
class Op:
    kind: str  # COMPUTE | COMM
    name: str
    stream: str = COMPUTE
    after: Tuple[int, ...] = ()  # ops of this rank (program indices) that must end first
    ns: int = 0  # compute: its duration
    comm: int = -1  # COMM: index into the graph's comms
    needs: Tuple[str, ...] = ()  # values of this rank it reads
    makes: Tuple[str, ...] = ()  # values of this rank it writes


@dataclass(frozen=True)
class Comm:
    """One communication operation, shared by the ranks of its group."""
    collective: str  # a name of ``traffic.collectives.ALGORITHMS``
    group: Tuple[int, ...]  # global ranks, in the collective's rank order
    size: int  # bytes per rank, as the collective counts them
    chunks: int = 1
    kind: str = "coll"  # what it serves, for the results: dp, tp, pp, ep, coll
    local_group: int = 1  # hierarchical: consecutive ranks of the group per server
    pxn: Tuple[Tuple[int, int], ...] = ()  # all-to-all over PXN: each member's (server, rail)


@dataclass(frozen=True)
class JobGraph:
    """One iteration of a job: every rank's program and the communications they share."""
    programs: Tuple[Tuple[Op, ...], ...]  # per global rank
    comms: Tuple[Comm, ...]
    name: str = "job"

    @property
    def ranks(self) -> int:
        return len(self.programs)

    def scaled(self, factor: float) -> "JobGraph":
        """The same graph with every compute span multiplied by ``factor`` (modelled to
        emulated time)."""
        return replace(self, programs=tuple(
            tuple(replace(op, ns=int(round(op.ns * factor))) if op.kind == COMPUTE else op
                  for op in prog) for prog in self.programs))


def collective_graph(collective: str, ranks: int, size: int, chunks: int = 1,
                     local_group: int = 1, pxn: bool = False) -> JobGraph:
    """Today's iteration as a graph: a compute phase, then one collective over every rank
    (``pxn``: an all-to-all over PXN, servers of ``local_group`` GPUs)."""
    comm = Comm(collective, tuple(range(ranks)), size, chunks, "coll", local_group)
    if pxn:
        comm = replace(comm, pxn=pxn_places(comm.group, local_group))
    prog = (Op(COMPUTE, "compute"), Op(COMM, collective, "coll", after=(0,), comm=0))
    return JobGraph(tuple(prog for _ in range(ranks)), (comm,), collective)


@lru_cache(maxsize=None)
def collective_of(comm: Comm) -> Collective:
    """The comm's collective in its group's local ranks (built once per shape)."""
    return build(comm.collective, len(comm.group), comm.size, comm.chunks, comm.local_group,
                 comm.pxn)


def pxn_places(group: Tuple[int, ...], per_server: int) -> Tuple[Tuple[int, int], ...]:
    """Each rank's (server, rail): global rank S*k + i is GPU i of server k."""
    return tuple(divmod(g, per_server) for g in group)


def with_pxn(graph: JobGraph, per_server: int) -> JobGraph:
    """``graph`` with its all-to-alls over PXN on servers of ``per_server`` GPUs."""
    comms = tuple(replace(c, pxn=pxn_places(c.group, per_server))
                  if ALIASES.get(c.collective, c.collective) == "all_to_all" else c
                  for c in graph.comms)
    return replace(graph, comms=comms)


@lru_cache(maxsize=None)
def _sends_per_rank(comm: Comm) -> Tuple[int, ...]:
    counts = Counter(t.src for t in collective_of(comm).transfers)
    return tuple(counts.get(r, 0) for r in range(len(comm.group)))


def tag_bases(graph: JobGraph) -> List[Dict[int, int]]:
    """Per comm, per member rank: the first tag of its transfers in that comm. A rank's tags
    number all its transfers of the iteration, comm after comm, so a (source, tag) names one
    transfer on the wire."""
    used = [0] * graph.ranks
    out = []
    for comm in graph.comms:
        bases = {}
        for local, r in enumerate(comm.group):
            bases[r] = used[r]
            used[r] += _sends_per_rank(comm)[local]
        out.append(bases)
    return out


@lru_cache(maxsize=None)
def _by_rank(comm: Comm) -> Tuple[Dict[int, List[Transfer]], Dict[int, List[Transfer]]]:
    """The comm's transfers by local sender and by local receiver."""
    sends: Dict[int, List[Transfer]] = {}
    receives: Dict[int, List[Transfer]] = {}
    for t in collective_of(comm).transfers:
        sends.setdefault(t.src, []).append(t)
        receives.setdefault(t.dst, []).append(t)
    return sends, receives


def _global(t: Transfer, g: Tuple[int, ...], bases: Dict[int, int]) -> Transfer:
    src = g[t.src]
    return replace(t, src=src, dst=g[t.dst], tag=bases[src] + t.tag,
                   after=tuple((g[s], bases[g[s]] + tag) for s, tag in t.after))


def comm_transfers(comm: Comm) -> Iterator[Tuple[int, int, int]]:
    """(source, destination, bytes) of every transfer of ``comm``, in global ranks."""
    g = comm.group
    for t in collective_of(comm).transfers:
        yield g[t.src], g[t.dst], t.nbytes


def same_server(a: int, b: int, per_server: int) -> bool:
    """Whether ranks ``a`` and ``b`` are GPUs of one server (ranks S*k..S*k+S-1 are server k)."""
    return a // per_server == b // per_server


def rank_transfers(comm: Comm, bases: Dict[int, int], rank: int
                   ) -> Tuple[List[Transfer], List[Transfer]]:
    """``rank``'s sends and receives in the comm, in global ranks and tags. A comm over every
    rank in order with nothing before it keeps the collective's own transfers (shared by
    every GPU of a process: ``large``'s ring holds 32,256)."""
    g = comm.group
    local = g.index(rank)
    sends, receives = _by_rank(comm)
    mine, theirs = sends.get(local, []), receives.get(local, [])
    if g == tuple(range(len(g))) and not any(bases.values()):
        return mine, theirs
    return [_global(t, g, bases) for t in mine], [_global(t, g, bases) for t in theirs]


@dataclass
class RankPlan:
    """What one rank executes each iteration: its program and its transfers by op."""
    ops: Tuple[Op, ...]
    sends: Dict[int, List[Transfer]]  # op index -> its transfers from this rank
    receives: Dict[Tuple[int, int], Tuple[int, Transfer]]  # (src, tag) -> (op, transfer)
    op_of_tag: Dict[int, int]  # tag of a send -> its op
    successors: List[List[int]]
    open_transfers: List[int]  # per op: transfers to acknowledge or deliver before it ends
    comms: Tuple[Comm, ...]

    def all_sends(self) -> List[Transfer]:
        return [t for op in sorted(self.sends) for t in self.sends[op]]


def rank_plan(graph: JobGraph, rank: int, bases: Optional[List[Dict[int, int]]] = None
              ) -> RankPlan:
    bases = tag_bases(graph) if bases is None else bases
    ops = graph.programs[rank]
    sends: Dict[int, List[Transfer]] = {}
    receives: Dict[Tuple[int, int], Tuple[int, Transfer]] = {}
    op_of_tag: Dict[int, int] = {}
    open_transfers = [0] * len(ops)
    successors: List[List[int]] = [[] for _ in ops]
    for i, op in enumerate(ops):
        for j in op.after:
            successors[j].append(i)
        if op.kind != COMM:
            continue
        mine, theirs = rank_transfers(graph.comms[op.comm], bases[op.comm], rank)
        for t in mine:
            op_of_tag[t.tag] = i
        for t in theirs:
            receives[t.ref] = (i, t)
        sends[i] = mine
        open_transfers[i] = len(mine) + len(theirs)
    return RankPlan(ops, sends, receives, op_of_tag, successors, open_transfers, graph.comms)


# --- checks -----------------------------------------------------------------------------------
def ancestors(ops: Sequence[Op], rank: int = -1) -> List[int]:
    """Per op, the set of ops it transitively waits for, as a bit mask."""
    anc: List[int] = []
    for i, op in enumerate(ops):
        mask = 0
        for j in op.after:
            if not 0 <= j < i:
                raise ScheduleError(f"rank {rank}: op {i} ({op.name}) waits for op {j}: a "
                                    "program lists an op after every op it waits for")
            mask |= anc[j] | (1 << j)
        anc.append(mask)
    return anc


def check(graph: JobGraph) -> None:
    """Raise ``ScheduleError`` unless the graph is sound: comms well formed, every value made
    before it is read, the ops of each stream in sequence, no deadlock across ranks."""
    members: Dict[int, List[int]] = {c: [] for c in range(len(graph.comms))}
    for r, prog in enumerate(graph.programs):
        anc = ancestors(prog, r)
        made: Dict[str, int] = {}
        for i, op in enumerate(prog):
            for v in op.makes:
                if v in made:
                    raise ScheduleError(f"rank {r}: {v!r} is made by ops {made[v]} and {i}")
                made[v] = i
            if op.kind == COMM:
                if not 0 <= op.comm < len(graph.comms):
                    raise ScheduleError(f"rank {r} op {i} ({op.name}): no comm {op.comm}")
                members[op.comm].append(r)
            elif op.kind != COMPUTE:
                raise ScheduleError(f"rank {r} op {i}: unknown kind {op.kind!r}")
        for i, op in enumerate(prog):
            for v in op.needs:
                p = made.get(v)
                if p is None or not anc[i] >> p & 1:
                    raise ScheduleError(f"rank {r} op {i} ({op.name}) reads {v!r} "
                                        + ("that no op makes" if p is None else
                                           f"without waiting for op {p} "
                                           f"({prog[p].name}) that makes it"))
        last: Dict[str, int] = {}
        for i, op in enumerate(prog):
            j = last.get(op.stream)
            if j is not None and not anc[i] >> j & 1:
                raise ScheduleError(f"rank {r}: ops {j} ({prog[j].name}) and {i} ({op.name}) "
                                    f"of stream {op.stream!r} may overlap")
            last[op.stream] = i
    for c, comm in enumerate(graph.comms):
        if len(set(comm.group)) != len(comm.group) or not all(
                0 <= r < graph.ranks for r in comm.group):
            raise ScheduleError(f"comm {c} ({comm.collective}): bad group {comm.group}")
        if sorted(members[c]) != sorted(comm.group):
            raise ScheduleError(f"comm {c} ({comm.collective}) over {comm.group}: the ranks "
                                f"with an op for it are {sorted(members[c])}")
        collective_of(comm)  # buildable
    replay(graph, lambda r, op: 0, lambda comm: 0)  # no deadlock


def reduced(graph: JobGraph) -> JobGraph:
    """The graph without the dependencies other dependencies imply."""
    programs = []
    for prog in graph.programs:
        anc = ancestors(prog)
        out = []
        for op in prog:
            implied = 0
            for j in op.after:
                implied |= anc[j]
            out.append(replace(op, after=tuple(j for j in op.after if not implied >> j & 1)))
        programs.append(tuple(out))
    return replace(graph, programs=tuple(programs))


# --- replay -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Timeline:
    """Every op's (start, end) per rank, and the iteration's end."""
    spans: Tuple[Tuple[Tuple[int, int], ...], ...]

    @property
    def end(self) -> int:
        return max((e for prog in self.spans for _s, e in prog), default=0)


def replay(graph: JobGraph, compute_ns: Callable[[int, Op], int],
           comm_ns: Callable[[Comm], int]) -> Timeline:
    """Start and end of every op when a compute op takes ``compute_ns(rank, op)`` and a comm
    starts once every member is ready for it and takes ``comm_ns(comm)`` for all of them.
    Raises ``ScheduleError`` on a deadlock (ops that wait for each other across ranks)."""
    n = graph.ranks
    waiting = [[len(op.after) for op in prog] for prog in graph.programs]
    ready_at = [[0] * len(prog) for prog in graph.programs]
    spans: List[List[Optional[Tuple[int, int]]]] = [[None] * len(p) for p in graph.programs]
    successors = [[[] for _ in prog] for prog in graph.programs]
    for r, prog in enumerate(graph.programs):
        for i, op in enumerate(prog):
            for j in op.after:
                successors[r][j].append(i)
    comm_ready: Dict[int, List[Tuple[int, int]]] = {}  # comm -> members ready (rank, op)
    stack = [(r, i) for r in range(n) for i, op in enumerate(graph.programs[r]) if not op.after]
    done = 0

    def finish(r: int, i: int, start: int, end: int) -> None:
        spans[r][i] = (start, end)
        for k in successors[r][i]:
            ready_at[r][k] = max(ready_at[r][k], end)
            waiting[r][k] -= 1
            if waiting[r][k] == 0:
                stack.append((r, k))

    while stack:
        r, i = stack.pop()
        op = graph.programs[r][i]
        if op.kind == COMPUTE:
            start = ready_at[r][i]
            finish(r, i, start, start + compute_ns(r, op))
            done += 1
            continue
        got = comm_ready.setdefault(op.comm, [])
        got.append((r, i))
        comm = graph.comms[op.comm]
        if len(got) == len(comm.group):
            start = max(ready_at[m][k] for m, k in got)
            end = start + comm_ns(comm)
            for m, k in got:
                finish(m, k, start, end)
            done += len(got)
    total = sum(len(p) for p in graph.programs)
    if done != total:
        stuck = [(r, i) for r in range(n) for i in range(len(graph.programs[r]))
                 if spans[r][i] is None]
        r, i = stuck[0]
        raise ScheduleError(f"deadlock: {total - done} ops never start, first rank {r} op {i} "
                            f"({graph.programs[r][i].name})")
    return Timeline(tuple(tuple(s) for s in spans))  # type: ignore[arg-type]
