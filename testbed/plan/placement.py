"""Which server holds which switch and host when a fabric is split over machines (pure).

``by-leaf`` (the default) keeps each leaf with all its hosts on one server - host links never
cross servers - with the leaves in contiguous blocks, and puts every spine on the server that
holds the most leaves: each spine links to every leaf, so that is where its cross-server links
are fewest. ``spread`` deals leaves and spines out round-robin: the CPU load is balanced, at
the price of more cross-server links. Mininet Cluster places by these names.
"""
from __future__ import annotations

from collections import Counter
from typing import Dict, List, Sequence

from ..base.errors import ConfigError
from ..base.topology import FabricPlan, Link

PLACEMENTS = ("by-leaf", "spread")
LOCAL = "localhost"  # this machine, in a list of servers


def place(plan: FabricPlan, servers: Sequence[str], placement: str = "by-leaf"
          ) -> Dict[str, str]:
    """Node name -> server, for every switch and host of ``plan``."""
    servers = list(servers)
    if not servers:
        raise ConfigError("cluster.servers: give at least one server")
    if len(set(servers)) != len(servers):
        raise ConfigError("cluster.servers: each server may appear once")
    if placement not in PLACEMENTS:
        raise ConfigError(f"cluster.placement: must be one of {', '.join(PLACEMENTS)}, "
                          f"got {placement!r}")
    n, k = plan.n_leaves, len(servers)
    if k > n:
        raise ConfigError(f"cluster.servers: {k} servers for {n} leaves; a server without a "
                          "leaf would hold no GPU (use at most as many servers as leaves)")
    where: Dict[str, str] = {}
    for leaf in plan.leaves:
        i = leaf.index - 1
        where[leaf.name] = servers[i * k // n] if placement == "by-leaf" else servers[i % k]
    if placement == "by-leaf":
        counts = Counter(where[lf.name] for lf in plan.leaves)
        busiest = max(servers, key=lambda s: (counts[s], -servers.index(s)))
        for spine in plan.spines:
            where[spine.name] = busiest
    else:
        for spine in plan.spines:
            where[spine.name] = servers[(spine.index - 1) % k]
    for host in plan.hosts:
        where[host.name] = where[f"lf{host.leaf}"]
    for gpu in plan.gpus:  # a server's scale-up transfers are one agent's timers
        first = plan.gpus[plan.server_ranks(gpu.rank)[0]]
        if where[gpu.name] != where[first.name]:
            raise ConfigError(f"cluster.placement: server {gpu.server}'s GPUs ({first.name}, "
                              f"{gpu.name}) would be on different machines; its scale-up "
                              "domain needs them on one (rail-optimized: give each machine "
                              "whole rail groups of leaves, or use leaf-per-server)")
    return where


def cross_links(plan: FabricPlan, where: Dict[str, str]) -> List[Link]:
    """The links whose two ends are on different servers."""
    return [link for link in plan.links if where[link.node1] != where[link.node2]]


def by_server(where: Dict[str, str], servers: Sequence[str]) -> Dict[str, List[str]]:
    """Server -> the nodes it holds (for results and progress)."""
    out: Dict[str, List[str]] = {s: [] for s in servers}
    for node, server in where.items():
        out[server].append(node)
    return out


def remote_servers(where: Dict[str, str]) -> List[str]:
    """The servers other than this machine that ``where`` puts nodes on, sorted."""
    return sorted({s for s in where.values() if s != LOCAL})
