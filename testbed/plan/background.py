"""Traffic beside the job's, planned (pure): the background flows (noisy neighbours, an incast
from another job's QPs) and the hosts real verbs traffic (rxe) runs between. ``ConfigError``
where the scenario asks for hosts the fabric lacks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from ..base.errors import ConfigError
from ..base.topology import FabricPlan, Host


@dataclass(frozen=True)
class Flow:
    kind: str  # "noisy" | "incast"
    src: str
    dst: str


@dataclass(frozen=True)
class BackgroundPlan:
    noisy: Tuple[Flow, ...] = ()
    incast: Tuple[Flow, ...] = ()
    incast_target: Optional[str] = None

    @property
    def empty(self) -> bool:
        return not self.noisy and not self.incast


def background_plan(plan: FabricPlan, scenario) -> BackgroundPlan:
    """Who sends to whom; ``ConfigError`` when the scenario asks for what the fabric lacks."""
    bg = scenario.background
    noisy: List[Flow] = []
    if bg.noisy_neighbour.rate_gbit > 0:
        if len(plan.neighbours) < 2:
            raise ConfigError("background.noisy_neighbour: needs at least two neighbour hosts "
                              "(set topology.neighbours_per_leaf)")
        m, leaves = plan.neighbours_per_leaf, plan.n_leaves
        for h in plan.neighbours:
            j = h.index - plan.gpus_per_leaf  # 1..m on its leaf
            if leaves > 1:
                peer_leaf, peer_j = h.leaf % leaves + 1, j
            else:
                peer_leaf, peer_j = h.leaf, j % m + 1
            peer = next(p for p in plan.neighbours
                        if p.leaf == peer_leaf and p.index - plan.gpus_per_leaf == peer_j)
            noisy.append(Flow("noisy", h.name, peer.name))
    inc = bg.incast
    if inc.period_us <= 0:
        return BackgroundPlan(tuple(noisy))
    names = {h.name for h in plan.hosts}
    target = inc.target or plan.gpus[-1].name
    if target not in names:
        raise ConfigError(f"background.incast.target: no host named {target!r}")
    senders = list(inc.senders) or _default_senders(plan, plan.host(target))
    for s in senders:
        if s not in names:
            raise ConfigError(f"background.incast.senders: no host named {s!r}")
        if s == target:
            raise ConfigError(f"background.incast.senders: {s} is the target")
    if not senders:
        raise ConfigError("background.incast: no host left to send to the target")
    return BackgroundPlan(tuple(noisy), tuple(Flow("incast", s, target) for s in senders),
                          target)


def _default_senders(plan: FabricPlan, target: Host) -> List[str]:
    if plan.neighbours:
        return [h.name for h in plan.neighbours if h.name != target.name]
    far = [h.name for h in plan.gpus if h.leaf != target.leaf]
    return far or [h.name for h in plan.gpus if h.name != target.name]


def rxe_endpoints(plan: FabricPlan) -> Tuple[Host, Host]:
    """The first neighbour host of the first leaf and of the last leaf: a cross-leaf path."""
    first = [h for h in plan.neighbours if h.leaf == 1]
    last = [h for h in plan.neighbours if h.leaf == plan.n_leaves]
    if not first or not last or plan.n_leaves < 2:
        raise ConfigError("rxe: needs at least 2 leaves and a neighbour host on each "
                          "(topology.neighbours_per_leaf >= 1)")
    return first[0], last[0]
