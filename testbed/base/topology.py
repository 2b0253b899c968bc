"""Leaf-spine fabric plan: names, DPIDs, ports and addresses, decided once and here only.

Naming and addressing plan (every other module asks the plan, none rebuilds a name):

=========  =====================  ==========================================================
node       name                   details
=========  =====================  ==========================================================
spine s    ``sp<s>``              DPID ``0x2_0000 + s``; port ``l`` goes to leaf ``l``
leaf l     ``lf<l>``              DPID ``0x1_0000 + l``; ports ``1..H`` go to its GPUs,
                                  port ``H + s`` goes up to spine ``s``
GPU        ``gpu<n>``             rank ``n - 1``, on leaf ``l`` at position ``i`` as the
                                  layout says (below); IP ``10.0.<l>.<i>/16``,
                                  MAC ``02:00:0a:00:<l>:<i>`` (hex), NIC ``gpu<n>-eth0``
neighbour  ``nb<k>``              a non-GPU host (noisy-neighbour tenant); the ``j``-th of
                                  leaf ``l`` sits on leaf port ``G + j``, with the address
                                  scheme of that port; no rank
=========  =====================  ==========================================================

``G`` is the number of GPUs per leaf and ``H`` the number of hosts per leaf (GPUs, then
neighbours): leaf ports ``1..H`` go down, ``H + s`` up.

Servers: ranks ``S*k .. S*k + S-1`` form server ``k`` (``S`` GPUs per server, its scale-up
domain). Layout ``leaf-per-server``: rank ``r`` is GPU ``r mod G + 1`` of leaf ``r // G + 1``,
so a server's GPUs share a leaf. Layout ``rail-optimized`` (DGX SuperPOD, Alibaba HPN): GPU
``j`` of every server sits on the ``j``-th leaf of its rail group; a group is ``S`` leaves
holding ``G`` servers, so server ``k`` is in group ``k // G`` at position ``k mod G + 1``.
With ``S = 1`` both are the same fabric.

All GPUs share one IP subnet (10.0.0.0/16) with static ARP entries, so no ARP or flooding is
needed; switches route on the destination IP (leaf ``l`` owns 10.0.<l>.0/24). Interfaces are
named ``<node>-eth<port>`` (Mininet's scheme), so every name is known before anything is built.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

from .errors import ConfigError
from .schema import shown

LAYOUTS = ("leaf-per-server", "rail-optimized")
LEAF_DPID_BASE = 0x10000
SPINE_DPID_BASE = 0x20000
PREFIX_LEN = 16
MAX_LEAVES = 255
MAX_HOSTS_PER_LEAF = 254
MAX_SPINES = 255


@dataclass(frozen=True)
class Switch:
    name: str
    dpid: int
    role: str  # "leaf" | "spine"
    index: int  # 1-based

    @property
    def dpid_hex(self) -> str:
        return "%016x" % self.dpid


@dataclass(frozen=True)
class Host:
    name: str
    rank: int  # -1 for a neighbour host
    leaf: int  # 1-based leaf index
    index: int  # 1-based position on its leaf (= its leaf port)
    ip: str
    mac: str
    role: str = "gpu"  # "gpu" | "neighbour"
    server: int = -1  # 0-based server (scale-up domain) of a GPU

    @property
    def is_gpu(self) -> bool:
        return self.role == "gpu"

    @property
    def intf(self) -> str:
        return f"{self.name}-eth0"

    @property
    def leaf_subnet(self) -> str:
        return leaf_subnet(self.leaf)


@dataclass(frozen=True)
class Link:
    """One cable. ``node1`` is the lower tier (host below leaf, leaf below spine)."""

    node1: str
    port1: int
    node2: str
    port2: int
    kind: str  # "host" (GPU-leaf) | "fabric" (leaf-spine)

    @property
    def intf1(self) -> str:
        return f"{self.node1}-eth{self.port1}"

    @property
    def intf2(self) -> str:
        return f"{self.node2}-eth{self.port2}"


def leaf_subnet(leaf: int) -> str:
    return f"10.0.{leaf}.0/24"


class FabricPlan:
    """The pure description of a leaf-spine fabric: no Mininet, no I/O."""

    def __init__(self, spines: int, leaves: int, gpus_per_leaf: int,
                 neighbours_per_leaf: int = 0, gpus_per_server: int = 1,
                 layout: str = "leaf-per-server"):
        for name, value, top in (("spines", spines, MAX_SPINES), ("leaves", leaves, MAX_LEAVES),
                                 ("gpus_per_leaf", gpus_per_leaf, MAX_HOSTS_PER_LEAF)):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top:
                raise ConfigError(f"topology.{name}: must be an integer in 1..{top}, "
                                  f"got {shown(value)}")
        top = MAX_HOSTS_PER_LEAF - gpus_per_leaf
        if not isinstance(neighbours_per_leaf, int) or not 0 <= neighbours_per_leaf <= top:
            raise ConfigError(f"topology.neighbours_per_leaf: must be an integer in 0..{top} "
                              f"with {gpus_per_leaf} GPUs per leaf, got {neighbours_per_leaf!r}")
        _check_servers(leaves, gpus_per_leaf, gpus_per_server, layout)
        self.gpus_per_server = gpus_per_server
        self.layout = layout
        self.n_spines = spines
        self.n_leaves = leaves
        self.gpus_per_leaf = gpus_per_leaf
        self.neighbours_per_leaf = neighbours_per_leaf
        self.hosts_per_leaf = gpus_per_leaf + neighbours_per_leaf  # leaf ports going down
        self.spines = [Switch(f"sp{s}", SPINE_DPID_BASE + s, "spine", s)
                       for s in range(1, spines + 1)]
        self.leaves = [Switch(f"lf{lf}", LEAF_DPID_BASE + lf, "leaf", lf)
                       for lf in range(1, leaves + 1)]
        g, m = gpus_per_leaf, neighbours_per_leaf
        self.gpus = []  # in rank order
        for r in range(leaves * g):
            lf, i = _position(r, g, gpus_per_server, layout)
            self.gpus.append(Host(name=f"gpu{r + 1}", rank=r, leaf=lf, index=i,
                                  ip=f"10.0.{lf}.{i}", mac="02:00:0a:00:%02x:%02x" % (lf, i),
                                  server=r // gpus_per_server))
        self.neighbours = [
            Host(name=f"nb{(lf - 1) * m + j}", rank=-1, leaf=lf, index=g + j,
                 ip=f"10.0.{lf}.{g + j}", mac="02:00:0a:00:%02x:%02x" % (lf, g + j),
                 role="neighbour")
            for lf in range(1, leaves + 1) for j in range(1, m + 1)]
        self.hosts = self.gpus + self.neighbours
        self.links = (
            [Link(h.name, 0, f"lf{h.leaf}", h.index, "host") for h in self.hosts]
            + [Link(f"lf{lf}", self.uplink_port(s), f"sp{s}", lf, "fabric")
               for lf in range(1, leaves + 1) for s in range(1, spines + 1)])

    # --- look-ups ---------------------------------------------------------------------------
    def server_ranks(self, rank: int) -> Tuple[int, ...]:
        """The ranks of ``rank``'s server (its scale-up domain), itself included."""
        first = rank // self.gpus_per_server * self.gpus_per_server
        return tuple(range(first, first + self.gpus_per_server))

    @property
    def switches(self) -> List[Switch]:
        return self.leaves + self.spines

    def switch_by_dpid(self, dpid: int) -> Switch:
        for sw in self.switches:
            if sw.dpid == dpid:
                return sw
        raise KeyError(f"no switch with DPID {dpid:#x} in this fabric")

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def is_host(self, name: str) -> bool:
        """Whether ``name`` is a host (GPU or neighbour), not a switch."""
        return any(h.name == name for h in self.hosts)

    def hosts_on_leaf(self, leaf: int) -> List[Host]:
        return sorted((h for h in self.hosts if h.leaf == leaf), key=lambda h: h.index)

    def uplink_port(self, spine: int) -> int:
        """Leaf port that goes up to spine ``spine`` (1-based)."""
        return self.hosts_per_leaf + spine

    def uplinks(self) -> Dict[int, int]:
        """Spine index -> leaf port (the same on every leaf)."""
        return {s.index: self.uplink_port(s.index) for s in self.spines}

    def spine_port(self, leaf: int) -> int:
        """Spine port that goes down to leaf ``leaf``."""
        return leaf

    def switch_interfaces(self) -> List[Tuple[str, str]]:
        """(interface, kind) of every switch port: the switch egress queues."""
        out = []
        for link in self.links:
            if link.kind == "host":
                out.append((link.intf2, "host"))
            else:
                out += [(link.intf1, "fabric"), (link.intf2, "fabric")]
        return out

    def link_named(self, name: str, where: str = "link") -> Link:
        """The link between the two nodes ``name`` joins with ``-`` (either order)."""
        ends = name.split("-")
        for link in self.links:
            if len(ends) == 2 and set(ends) == {link.node1, link.node2}:
                return link
        raise ConfigError(f"{where}: {shown(name)} is no link of this fabric (name its two "
                          f"nodes, like {self.links[-1].node1}-{self.links[-1].node2} or "
                          f"{self.links[0].node1}-{self.links[0].node2})")

    def interface_names(self) -> List[str]:
        return [name for link in self.links for name in (link.intf1, link.intf2)]

    # --- serialisation (the controller gets the plan as JSON) -------------------------------
    def to_dict(self) -> dict:
        return {"spines": self.n_spines, "leaves": self.n_leaves,
                "gpus_per_leaf": self.gpus_per_leaf,
                "neighbours_per_leaf": self.neighbours_per_leaf,
                "gpus_per_server": self.gpus_per_server, "layout": self.layout}

    @classmethod
    def from_dict(cls, data: dict) -> "FabricPlan":
        return cls(data["spines"], data["leaves"], data["gpus_per_leaf"],
                   data.get("neighbours_per_leaf", 0), data.get("gpus_per_server", 1),
                   data.get("layout", LAYOUTS[0]))

    @classmethod
    def for_topology(cls, t) -> "FabricPlan":
        """The plan of a scenario's ``topology`` section."""
        return cls(t.spines, t.leaves, t.gpus_per_leaf, t.neighbours_per_leaf,
                   t.gpus_per_server, t.layout)

    def __repr__(self) -> str:
        return (f"FabricPlan(spines={self.n_spines}, leaves={self.n_leaves}, "
                f"gpus_per_leaf={self.gpus_per_leaf}, "
                f"neighbours_per_leaf={self.neighbours_per_leaf}, "
                f"gpus_per_server={self.gpus_per_server}, layout={self.layout!r})")


def _check_servers(leaves: int, gpus_per_leaf: int, per_server: int, layout: str) -> None:
    if layout not in LAYOUTS:
        raise ConfigError(f"topology.layout: must be one of {', '.join(LAYOUTS)}, got "
                          f"{layout!r}")
    if not isinstance(per_server, int) or per_server < 1:
        raise ConfigError(f"topology.gpus_per_server: must be a positive integer, got "
                          f"{per_server!r}")
    if layout == "leaf-per-server" and gpus_per_leaf % per_server:
        raise ConfigError(f"topology.gpus_per_server: {per_server} GPUs per server do not "
                          f"divide the {gpus_per_leaf} GPUs per leaf (leaf-per-server layout)")
    if layout == "rail-optimized" and leaves % per_server:
        raise ConfigError(f"topology.gpus_per_server: rail-optimized puts each of a server's "
                          f"{per_server} GPUs on its own leaf; the {leaves} leaves are not whole "
                          "rail groups of that many")


def _position(rank: int, per_leaf: int, per_server: int, layout: str) -> Tuple[int, int]:
    """(leaf, position on it), both 1-based, of GPU ``rank``."""
    if layout == "leaf-per-server" or per_server == 1:
        return rank // per_leaf + 1, rank % per_leaf + 1
    server, j = divmod(rank, per_server)
    group, at = divmod(server, per_leaf)
    return group * per_server + j + 1, at + 1
