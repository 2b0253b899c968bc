"""OpenFlow 1.3 messages (with the Open vSwitch extensions we use) as plain, immutable data.

Policy cores return these; the os-ken app (``controllers.ofp``) turns them into wire messages
and the tests apply them to a fake switch (``tests/fakeoftable.py``). Field names are the OXM
names os-ken uses (``eth_type``, ``ipv4_dst``, ``udp_src``, ``reg0``, ``metadata``); a masked
value is a ``(value, mask)`` tuple.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

ETH_TYPE_IPV4 = 0x0800
IPPROTO_UDP = 17
CONTROLLER = 0xFFFFFFFD  # OFPP_CONTROLLER
ECN_CE = 3

# Flow priorities used across policies (higher wins).
PRIO_MISS = 0
PRIO_ROUTE = 100
PRIO_ROCE = 150
PRIO_HOST = 200
PRIO_ECT = 10  # in the egress table: ECT packets to a marking group


@dataclass(frozen=True)
class Output:
    port: int


@dataclass(frozen=True)
class Group:
    group_id: int


@dataclass(frozen=True)
class SetField:
    field: str  # OXM name, e.g. "eth_dst", "ip_ecn", "reg0"
    value: object


@dataclass(frozen=True)
class Resubmit:
    """OVS ``resubmit(,table)``: run ``table`` now, then continue with the next action."""

    table: int


@dataclass(frozen=True)
class Multipath:
    """OVS ``multipath``: hash the flow into ``0..links-1`` and store it in register ``dst``.

    ``fields="symmetric_l3l4+udp"`` hashes addresses, protocol and TCP/UDP ports - the 5-tuple
    (the hash of OVS select groups leaves UDP ports out, so RoCE entropy would be ignored).
    """

    links: int
    dst: str = "reg1"
    fields: str = "symmetric_l3l4+udp"
    basis: int = 0


@dataclass(frozen=True)
class Learn:
    """OVS ``learn``: install, in ``table``, a flow matching the ``const`` values and this
    packet's ``copy`` fields, whose action loads ``load_value`` into ``load_field``; it expires
    after ``idle_timeout`` seconds without packets."""

    table: int
    const: Tuple[Tuple[str, int], ...]
    copy: Tuple[str, ...]
    load_field: str
    load_value: int
    idle_timeout: int
    priority: int = 10
    cookie: int = 0


Action = Union[Output, Group, SetField, Resubmit, Multipath, Learn]


@dataclass(frozen=True)
class FlowMod:
    """Add (or replace) a flow whose instruction applies ``actions``; no actions = drop.

    ``goto`` continues in a later table; ``metadata`` writes the metadata register first.
    """

    priority: int
    match: Tuple[Tuple[str, object], ...]
    actions: Tuple[Action, ...] = ()
    table_id: int = 0
    cookie: int = 0
    goto: Optional[int] = None
    metadata: Optional[int] = None
    idle_timeout: int = 0

    def match_dict(self) -> dict:
        return dict(self.match)


@dataclass(frozen=True)
class Bucket:
    actions: Tuple[Action, ...]
    weight: int = 1


@dataclass(frozen=True)
class GroupMod:
    """Add (``modify=False``) or change a group: ``select``, ``all``, ``indirect`` or ``ff``."""

    group_id: int
    group_type: str
    buckets: Tuple[Bucket, ...]
    modify: bool = False


@dataclass(frozen=True)
class ClearFlows:
    """Delete every flow and group of the switch (sent before a policy programs it)."""


Message = Union[FlowMod, GroupMod, ClearFlows]


def match(**fields) -> Tuple[Tuple[str, object], ...]:
    """A match as a sorted tuple of (field, value) pairs, e.g. ``match(eth_type=0x800)``."""
    return tuple(sorted(fields.items()))


def flow(priority: int, match_fields: dict, *actions: Action, table: int = 0, cookie: int = 0,
         goto: Optional[int] = None, metadata: Optional[int] = None,
         idle_timeout: int = 0) -> FlowMod:
    return FlowMod(priority=priority, match=match(**match_fields), actions=tuple(actions),
                   table_id=table, cookie=cookie, goto=goto, metadata=metadata,
                   idle_timeout=idle_timeout)


def prefix(cidr: str) -> Tuple[str, str]:
    """``10.0.3.0/24`` -> ``("10.0.3.0", "255.255.255.0")`` (an OXM masked value)."""
    addr, length = cidr.split("/")
    bits = (0xFFFFFFFF << (32 - int(length))) & 0xFFFFFFFF
    return addr, ".".join(str((bits >> s) & 0xFF) for s in (24, 16, 8, 0))
