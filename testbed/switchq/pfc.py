"""Link-level flow control as the switch-queue emulator applies it - PFC, or InfiniBand's
credits (pure: backlogs in, pause/resume out).

A real switch sends PAUSE on the ingress ports whose packets fill a lossless queue. Here, when
a lossless egress queue of switch S rises above XOFF, every queue that can feed it - the egress
queues at the far end of S's other links that may carry traffic towards it - is paused; when
it falls below XON they resume (a queue paused on behalf of several congested queues resumes
when the last one clears). The paused queues then fill and, being lossless queues of their
own switches, pause their feeders in turn: backpressure spreads hop by hop up to the GPU NICs.
Under credits (``controllers.classes.CreditRule``) the same feeders wait while the queue has
less room than they can still send, and go on as soon as it has: a wait, not a pause.

Which links can feed an egress port of a leaf-spine fabric: at a leaf, traffic towards a GPU
may come from any other port; traffic towards a spine comes only from the leaf's GPUs (a leaf
never sends from one spine to another); at a spine, any other leaf.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Set, Tuple, Union

from controllers.classes import CreditRule, PfcRule

from ..base.topology import FabricPlan


class Queue(NamedTuple):
    """An egress queue: the interface ``intf`` of node ``node``."""

    node: str
    intf: str


def feeders(plan: FabricPlan, node: str, intf: str) -> List[Queue]:
    """The queues at the far end of ``node``'s links that can send towards ``intf``."""
    peers = []  # (my interface, far queue, far node is a GPU)
    for link in plan.links:
        if link.node1 == node:
            peers.append((link.intf1, Queue(link.node2, link.intf2), False))
        elif link.node2 == node:
            peers.append((link.intf2, Queue(link.node1, link.intf1), link.kind == "host"))
    is_leaf = node.startswith("lf")
    towards_spine = is_leaf and any(link.intf1 == intf and link.kind == "fabric"
                                    for link in plan.links)
    out = []
    for mine, far, from_gpu in peers:
        if mine == intf:
            continue
        if towards_spine and not from_gpu:
            continue
        out.append(far)
    return out


@dataclass
class PfcState:
    """Per lossless egress queue whether it holds its feeders (the rule's), pause - or credit
    wait - bookkeeping per fed queue."""

    plan: FabricPlan
    rule: Union[PfcRule, CreditRule]
    congested: Set[Queue] = field(default_factory=set)
    paused_by: Dict[Queue, Set[Queue]] = field(default_factory=dict)
    paused_since: Dict[Queue, int] = field(default_factory=dict)
    pause_events: Dict[Queue, int] = field(default_factory=dict)
    paused_ns: Dict[Queue, int] = field(default_factory=dict)
    spans: Dict[Queue, List[Tuple[int, int]]] = field(default_factory=dict)  # (paused, resumed)
    _feeders: Dict[Queue, List[Queue]] = field(default_factory=dict)

    def feeders_of(self, q: Queue) -> List[Queue]:
        if q not in self._feeders:
            self._feeders[q] = feeders(self.plan, q.node, q.intf)
        return self._feeders[q]

    def update(self, backlog: Dict[Queue, int], now_ns: int) -> Tuple[List[Queue], List[Queue]]:
        """New backlogs of the lossless egress queues -> (queues to pause, to resume)."""
        holds = self.rule.holds
        for q, b in backlog.items():
            held = q in self.congested
            if not held and holds(b, False):
                self.congested.add(q)
                for f in self.feeders_of(q):
                    self.paused_by.setdefault(f, set()).add(q)
            elif held and not holds(b, True):
                self.congested.discard(q)
                for f in self.feeders_of(q):
                    self.paused_by.get(f, set()).discard(q)
        pause = [f for f, by in self.paused_by.items() if by and f not in self.paused_since]
        resume = [f for f in list(self.paused_since) if not self.paused_by.get(f)]
        for f in pause:
            self.paused_since[f] = now_ns
            self.pause_events[f] = self.pause_events.get(f, 0) + 1
        for f in resume:
            self._close(f, now_ns)
        return sorted(pause, key=_key), sorted(resume, key=_key)

    def finish(self, now_ns: int) -> None:
        """Close the open pause intervals (at the end of a run)."""
        for f in list(self.paused_since):
            self._close(f, now_ns)

    def _close(self, f: Queue, now_ns: int) -> None:
        since = self.paused_since.pop(f)
        self.paused_ns[f] = self.paused_ns.get(f, 0) + now_ns - since
        self.spans.setdefault(f, []).append((since, now_ns))

    def spans_of(self, nodes) -> Dict[str, List[Tuple[int, int]]]:
        """{node: [(paused ns, resumed ns), ...]} of the queues of ``nodes`` (a GPU has one:
        its NIC), in time order."""
        out: Dict[str, List[Tuple[int, int]]] = {}
        for q, spans in self.spans.items():
            if q.node in nodes:
                out.setdefault(q.node, []).extend(spans)
        return {n: sorted(v) for n, v in sorted(out.items())}

    def report(self) -> Dict[str, dict]:
        """{interface: {"node", "events": n, "paused_ms": t}} for every queue ever paused;
        under credits {"node", "waits": n, "waited_ms": t} for every queue that waited."""
        events, held = ("events", "paused_ms") if self.rule.kind == "pfc" else \
            ("waits", "waited_ms")
        return {q.intf: {"node": q.node, events: self.pause_events.get(q, 0),
                         held: round(self.paused_ns.get(q, 0) / 1e6, 3)}
                for q in sorted(self.pause_events, key=_key)}


def _key(q: Queue):
    return (q.node, q.intf)
