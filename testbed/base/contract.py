"""Typed contracts between processes: JSON in, a frozen dataclass out, checked on the way.

Every process the runner starts - the GPU agents, the switch-queue emulator, the controller,
the background flows - reads its configuration as JSON and builds it with ``load``: declared
fields only (an unknown key is refused, with its path), nested dataclasses (or instances of
them, as built), ``Optional``, ``Tuple[X, ...]``, ``Dict[K, V]`` (JSON's string keys turned
back into ``K``) and types that build themselves from a mapping (a ``from_dict``
classmethod, e.g. ``FabricPlan``). ``dump`` turns a contract back into plain JSON values;
``Contract`` gives a dataclass both as ``to_dict`` / ``from_dict``. Scenario files have their own, richer checks
(``testbed.base.schema``: ranges, choices, user-facing errors); this is for what one part of
the testbed tells another.

results.json is read with the same loader (``testbed.results.model``), leniently: a file of
another version may hold keys this one does not declare, so ``strict=False`` leaves them out
of the fields and a dataclass field named ``raw`` receives the mapping as read. A field
whose metadata says ``json: False`` is the object's own, never read from the mapping.
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


def load(tp: Any, value: Any, path: str = "", strict: bool = True) -> Any:
    """``value`` (from JSON) as type ``tp``; ``path`` names it in errors. ``strict``: a key
    a dataclass does not declare is refused (otherwise left out; module docstring)."""
    where = path or getattr(tp, "__name__", str(tp))
    origin = typing.get_origin(tp)
    if origin is typing.Union:  # Optional[X] (the only union a contract declares)
        if value is None:
            return None
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(inner) > 1:  # e.g. Union[int, str]: taken as it is
            return value
        return load(inner[0], value, path, strict)
    if origin is tuple:
        _expect(value, (list, tuple), "a list", where)
        item = typing.get_args(tp)[0]
        return tuple(load(item, v, f"{where}[{i}]", strict) for i, v in enumerate(value))
    if origin is dict:
        _expect(value, dict, "a mapping", where)
        key, item = typing.get_args(tp)
        return {(key(k) if key in (int, float) else k): load(item, v, f"{where}.{k}", strict)
                for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):  # built as a record where it was made
            return value
        return _load_fields(tp, value, where, strict)
    if isinstance(tp, type) and hasattr(tp, "from_dict"):
        return tp.from_dict(value)
    return value


def _load_fields(tp: Any, value: Any, where: str, strict: bool) -> Any:
    _expect(value, dict, "a mapping", where)
    hints = typing.get_type_hints(tp)
    declared = {f.name for f in dataclasses.fields(tp)
                if f.init and f.metadata.get("json", True)}
    unknown = sorted(set(value) - declared)
    if unknown and strict:
        raise ContractError(f"{where}: {', '.join(unknown)}: not declared in "
                            f"{tp.__module__.replace('.', '/')}.py ({tp.__qualname__})")
    kwargs = {k: load(hints[k], v, f"{where}.{k}", strict) for k, v in value.items()
              if k in declared}
    if "raw" in hints and "raw" not in declared:  # what a file of another version held
        kwargs["raw"] = dict(value)
    try:
        return tp(**kwargs)
    except TypeError as e:  # a required field missing
        raise ContractError(f"{where}: {e}") from None


def dump(contract: Any) -> Any:
    """A contract as JSON values (the inverse of ``load``: ``json: False`` fields left out;
    a record that writes itself by its ``to_json`` does, and types that build themselves
    from a mapping are written by their ``to_dict``)."""
    if hasattr(contract, "to_json") and not isinstance(contract, type):
        return contract.to_json()
    if dataclasses.is_dataclass(contract) and not isinstance(contract, type):
        return {f.name: dump(getattr(contract, f.name)) for f in dataclasses.fields(contract)
                if f.init and f.metadata.get("json", True)}
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
