"""The policy interface every switching policy implements, and the explicit registry.

A policy is a pure core (Faucet style): it takes fabric events and returns OpenFlow messages
(``controllers.flows``); it never touches a socket. ``controllers.app`` is the thin os-ken
adapter that feeds it events and sends what it returns.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Dict, List, Type

from testbed.topology import FabricPlan

from .flows import Message


class Policy(ABC):
    """Switching policy for one leaf-spine fabric."""

    name: ClassVar[str]
    cookie: ClassVar[int]  # marks this policy's flows (visible in ovs-ofctl dump-flows)

    def __init__(self, plan: FabricPlan):
        self.plan = plan

    @abstractmethod
    def switch_connected(self, dpid: int) -> List[Message]:
        """Messages that program switch ``dpid`` completely (proactive: no packet-ins needed)."""


_REGISTRY: Dict[str, Type[Policy]] = {}


def register(cls: Type[Policy]) -> Type[Policy]:
    _REGISTRY[cls.name] = cls
    return cls


def policy_names() -> List[str]:
    _load()
    return sorted(_REGISTRY)


def policy_class(name: str) -> Type[Policy]:
    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r} (known: {', '.join(sorted(_REGISTRY))})")


def _load() -> None:
    # The registry is the list of policy modules below; importing one registers it.
    from . import hyperscale  # noqa: F401
