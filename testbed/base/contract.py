"""Typed contracts between processes: JSON in, a frozen dataclass out, checked on the way.

Every process the runner starts - the GPU agents, the switch-queue emulator, the controller,
the background flows - reads its configuration as JSON and builds it with ``load``: declared
fields only (an unknown key is refused, with its path), nested dataclasses, ``Optional``,
``Tuple[X, ...]``, ``Dict[K, V]`` (JSON's string keys turned back into ``K``) and types that
build themselves from a mapping (a ``from_dict`` classmethod, e.g. ``FabricPlan``). ``dump``
turns a contract back into plain JSON values; ``Contract`` gives a dataclass both as
``to_dict`` / ``from_dict``. Scenario files have their own, richer checks
(``testbed.base.schema``: ranges, choices, user-facing errors); this is for what one part of
the testbed tells another.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any

from .errors import TestbedError


class ContractError(TestbedError):
    """A process was handed a configuration its contract does not declare."""


class Contract:
    """A process contract (a frozen dataclass): ``to_dict`` for the JSON file the runner
    writes, ``from_dict`` for the process that reads it."""

    def to_dict(self) -> dict:
        return dump(self)

    @classmethod
    def from_dict(cls, data: dict):
        return load(cls, data)


def load(tp: Any, value: Any, path: str = "") -> Any:
    """``value`` (from JSON) as type ``tp``; ``path`` names it in errors."""
    where = path or getattr(tp, "__name__", str(tp))
    origin = typing.get_origin(tp)
    if origin is typing.Union:  # Optional[X] (the only union a contract declares)
        if value is None:
            return None
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(inner) > 1:  # e.g. Union[int, str]: taken as it is
            return value
        return load(inner[0], value, path)
    if origin is tuple:
        _expect(value, (list, tuple), "a list", where)
        item = typing.get_args(tp)[0]
        return tuple(load(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        _expect(value, dict, "a mapping", where)
        key, item = typing.get_args(tp)
        return {(key(k) if key in (int, float) else k): load(item, v, f"{where}.{k}")
                for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        _expect(value, dict, "a mapping", where)
        hints = typing.get_type_hints(tp)
        fields = {f.name for f in dataclasses.fields(tp) if f.init}
        unknown = sorted(set(value) - fields)
        if unknown:
            raise ContractError(f"{where}.{unknown[0]}: unknown key (declared: "
                                f"{', '.join(sorted(fields))})")
        try:
            return tp(**{k: load(hints[k], v, f"{where}.{k}") for k, v in value.items()})
        except TypeError as e:  # a required field missing
            raise ContractError(f"{where}: {e}") from None
    if isinstance(tp, type) and hasattr(tp, "from_dict"):
        return tp.from_dict(value)
    return value


def dump(contract: Any) -> Any:
    """A contract as JSON values (the inverse of ``load``; types that build themselves from a
    mapping are written by their ``to_dict``)."""
    if dataclasses.is_dataclass(contract) and not isinstance(contract, type):
        return {f.name: dump(getattr(contract, f.name)) for f in dataclasses.fields(contract)
                if f.init}
    if hasattr(contract, "to_dict"):
        return contract.to_dict()
    if isinstance(contract, (list, tuple)):
        return [dump(v) for v in contract]
    if isinstance(contract, dict):
        return {k: dump(v) for k, v in contract.items()}
    return contract


def _expect(value: Any, kinds, what: str, where: str) -> None:
    if not isinstance(value, kinds):
        raise ContractError(f"{where}: must be {what}, got {type(value).__name__}")
