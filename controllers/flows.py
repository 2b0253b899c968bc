"""OpenFlow 1.3 messages as plain, immutable data.

Policy cores return these; the os-ken app (``controllers.app``) turns them into wire messages
and the tests apply them to a fake flow table. Field names are OpenFlow 1.3 OXM names as os-ken
spells them (``eth_type``, ``ipv4_dst``, ``udp_src``); a masked value is a ``(value, mask)``
tuple.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple, Union

ETH_TYPE_IPV4 = 0x0800
IPPROTO_UDP = 17

# Flow priorities used across policies (higher wins).
PRIO_MISS = 0
PRIO_ROUTE = 100
PRIO_HOST = 200


@dataclass(frozen=True)
class Output:
    port: int


@dataclass(frozen=True)
class Group:
    group_id: int


@dataclass(frozen=True)
class SetField:
    field: str
    value: object


Action = Union[Output, Group, SetField]


@dataclass(frozen=True)
class FlowMod:
    """Add a flow (OFPFC_ADD) whose instruction applies ``actions``; no actions = drop."""

    priority: int
    match: Tuple[Tuple[str, object], ...]
    actions: Tuple[Action, ...] = ()
    table_id: int = 0
    cookie: int = 0

    def match_dict(self) -> dict:
        return dict(self.match)


@dataclass(frozen=True)
class Bucket:
    actions: Tuple[Action, ...]
    weight: int = 1


@dataclass(frozen=True)
class GroupMod:
    """Add a group (OFPGC_ADD). ``group_type`` is ``select``, ``all``, ``indirect`` or ``ff``."""

    group_id: int
    group_type: str
    buckets: Tuple[Bucket, ...]


@dataclass(frozen=True)
class ClearFlows:
    """Delete every flow and group of the switch (sent before a policy programs it)."""


Message = Union[FlowMod, GroupMod, ClearFlows]


def match(**fields) -> Tuple[Tuple[str, object], ...]:
    """A match as a sorted tuple of (field, value) pairs, e.g. ``match(eth_type=0x800)``."""
    return tuple(sorted(fields.items()))


def flow(priority: int, match_fields: dict, *actions: Action, cookie: int = 0) -> FlowMod:
    return FlowMod(priority=priority, match=match(**match_fields), actions=tuple(actions),
                   cookie=cookie)


def prefix(cidr: str) -> Tuple[str, str]:
    """``10.0.3.0/24`` -> ``("10.0.3.0", "255.255.255.0")`` (an OXM masked value)."""
    addr, length = cidr.split("/")
    bits = (0xFFFFFFFF << (32 - int(length))) & 0xFFFFFFFF
    return addr, ".".join(str((bits >> s) & 0xFF) for s in (24, 16, 8, 0))
