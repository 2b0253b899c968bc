"""Typed settings from plain mappings: frozen dataclasses whose fields declare their rules.

A field's ``metadata`` may hold ``min``, ``max``, ``choices``, ``unit`` and ``doc``
(and ``empty`` for a string that may be empty, ``auto`` for a number that may be the string
"auto": chosen later). ``build``
turns a mapping into the dataclass, checking every key and value and raising one
``ConfigError`` that names the path and what is allowed. Used by the scenario and by the
policies' parameters, so both report errors the same way.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Mapping

from .errors import ConfigError


def shown(value, limit: int = 80) -> str:
    """A value as an error message quotes it: its repr, cut at ``limit`` characters (a
    scenario file can hold a whole tree where one value belongs)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def build(cls, data, path: str = ""):
    """``cls(**data)`` after checking every key and value of ``data`` against ``cls``."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path or 'scenario'}: must be a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(key_text(k) for k in set(data) - set(fields))
    if unknown:
        where = f"{path}.{unknown[0]}" if path else unknown[0]
        raise ConfigError(f"{where}: unknown key (allowed: {', '.join(sorted(fields))})")
    values: Dict[str, Any] = {}
    for name, value in data.items():
        where = f"{path}.{name}" if path else name
        values[name] = _value(fields[name], value, where)
    return cls(**values)


def key_text(key) -> str:
    """A key as an error message shows it: plain when it is a name, quoted otherwise (so a
    key of spaces, control characters or a number stays visible and on one line)."""
    return key if isinstance(key, str) and key.replace("-", "_").isidentifier() else repr(key)


def default_of(f):
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _value(f, value, where):
    default = default_of(f)
    meta = f.metadata
    if dataclasses.is_dataclass(default):
        return build(type(default), value, where)
    if "item" in meta:  # a list of a scalar type, possibly empty
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: must be a list, got {shown(value)}")
        return tuple(_list_item(meta["item"], v, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(default, tuple):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)) or not value:
            raise ConfigError(f"{where}: must be a non-empty list, got {shown(value)}")
        return tuple(scalar(str, v, f"{where}[{i}]", meta) for i, v in enumerate(value))
    if meta.get("auto"):
        if isinstance(value, str) and value != "auto":
            raise ConfigError(f"{where}: must be a number or auto, got {shown(value)}")
        return value if value == "auto" else scalar(meta.get("kind", float), value, where, meta)
    return scalar(type(default), value, where, meta)


def _list_item(kind, value, where):
    if dataclasses.is_dataclass(kind):  # a list of sections
        return build(kind, value, where)
    if kind == "names":  # a list of non-empty strings (e.g. a tenant's hosts)
        if not isinstance(value, (list, tuple)) or not value:
            raise ConfigError(f"{where}: must be a non-empty list of names, got {shown(value)}")
        return tuple(scalar(str, v, f"{where}[{i}]", {}) for i, v in enumerate(value))
    return scalar(kind, value, where, {})


def scalar(kind, value, where, meta):
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: must be true or false, got {shown(value)}")
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: must be an integer, got {shown(value)}")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise ConfigError(f"{where}: must be a number, got {shown(value)}")
        value = float(value)
    elif kind is str:
        if value is False and "off" in meta.get("choices", ()):
            value = "off"  # YAML 1.1 reads an unquoted off as false
        if not isinstance(value, str) or not (value or meta.get("empty")):
            raise ConfigError(f"{where}: must be a non-empty string, got {shown(value)}")
    if "choices" in meta and value not in meta["choices"]:
        allowed = ", ".join(str(c) for c in meta["choices"])
        raise ConfigError(f"{where}: must be one of {allowed}, got {shown(value)}")
    if "min" in meta and value < meta["min"]:
        raise ConfigError(f"{where}: must be >= {meta['min']}, got {shown(value)}")
    if "max" in meta and value > meta["max"]:
        raise ConfigError(f"{where}: must be <= {meta['max']}, got {shown(value)}")
    return value


def plain(value):
    """A dataclass tree as plain dicts, lists and scalars (for JSON)."""
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
