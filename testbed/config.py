"""Scenario configuration: typed, validated, with declared defaults and units.

A scenario is a tree of frozen dataclasses. ``Scenario.from_dict`` validates a plain mapping
(from YAML or the CLI) in one pass: unknown keys and bad values raise one ``ConfigError`` that
names the path (``topology.leaves: must be >= 1, got 0``); nothing is started before that.

Scaled time (DESIGN.md): userspace Open vSwitch forwards tens of thousands of packets per second
on a small machine, so links run at tens of Mbit/s. Buffers and thresholds are in bytes at that
rate; ``Scenario.time_scale`` states how much slower than the modelled fabric the emulation runs.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Tuple

from .errors import ConfigError

MBIT = 1_000_000


@dataclass(frozen=True)
class TopologyConfig:
    spines: int = field(default=2, metadata={"min": 1, "max": 255, "doc": "spine switches"})
    leaves: int = field(default=4, metadata={"min": 1, "max": 255, "doc": "leaf switches"})
    gpus_per_leaf: int = field(default=2, metadata={"min": 1, "max": 254,
                                                    "doc": "GPU hosts under each leaf"})
    host_rate_mbit: float = field(default=40.0, metadata={
        "min": 0.1, "max": 1000.0, "unit": "Mbit/s", "doc": "GPU NIC and leaf downlink rate"})
    fabric_rate_mbit: float = field(default=40.0, metadata={
        "min": 0.1, "max": 1000.0, "unit": "Mbit/s", "doc": "leaf-spine link rate"})
    switch_buffer_bytes: int = field(default=64_000, metadata={
        "min": 3000, "max": 64_000_000, "unit": "B",
        "doc": "egress buffer of every switch port (tail-drop byte FIFO)"})
    nic_queue_bytes: int = field(default=256_000, metadata={
        "min": 3000, "max": 64_000_000, "unit": "B", "doc": "GPU NIC transmit queue"})
    link_delay_us: float = field(default=0.0, metadata={
        "min": 0.0, "max": 1_000_000.0, "unit": "us",
        "doc": "one-way propagation delay per link (netem; only where the kernel has it)"})
    modelled_rate_gbit: float = field(default=100.0, metadata={
        "min": 1.0, "max": 1600.0, "unit": "Gbit/s",
        "doc": "link rate of the real fabric being modelled (sets the time scale)"})

    @property
    def gpus(self) -> int:
        return self.leaves * self.gpus_per_leaf


@dataclass(frozen=True)
class WorkloadConfig:
    collective: str = field(default="ring_allreduce", metadata={
        "choices": ("ring_allreduce",), "doc": "collective to replay"})
    size_bytes: int = field(default=1 << 20, metadata={
        "min": 1, "max": 1 << 30, "unit": "B", "doc": "all-reduce buffer size per GPU"})
    iterations: int = field(default=10, metadata={"min": 1, "max": 100_000,
                                                  "doc": "collectives replayed back to back"})
    mtu: int = field(default=4096, metadata={
        "choices": (256, 512, 1024, 2048, 4096), "unit": "B", "doc": "RoCE path MTU"})
    step_timeout_ms: float = field(default=0.0, metadata={
        "min": 0.0, "max": 600_000.0, "unit": "ms",
        "doc": "give up waiting for a step's data after this long (0: derived from the rate)"})


@dataclass(frozen=True)
class Scenario:
    name: str = "default"
    policies: Tuple[str, ...] = ("hyperscale",)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)

    @property
    def time_scale(self) -> float:
        """How many times slower than the modelled fabric the emulated links run."""
        return self.topology.modelled_rate_gbit * 1000 / self.topology.host_rate_mbit

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Scenario":
        return _build(cls, data, "")

    def to_dict(self) -> dict:
        return _plain(dataclasses.asdict(self))

    def with_policies(self, policies) -> "Scenario":
        return dataclasses.replace(self, policies=tuple(policies))

    def override(self, changes: Mapping[str, Any]) -> "Scenario":
        """A copy with ``changes`` (a partial scenario mapping) applied and validated."""
        return Scenario.from_dict(_merge(self.to_dict(), changes))


def _merge(base: dict, changes: Mapping[str, Any]) -> dict:
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _build(cls, data, path):
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path or 'scenario'}: must be a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{path}.{unknown[0]}" if path else str(unknown[0])
        raise ConfigError(f"{where}: unknown key (allowed: {', '.join(sorted(fields))})")
    values: Dict[str, Any] = {}
    for name, value in data.items():
        f = fields[name]
        where = f"{path}.{name}" if path else name
        values[name] = _value(f, value, where)
    return cls(**values)


def _value(f, value, where):
    default = f.default_factory() if f.default is dataclasses.MISSING else f.default
    meta = f.metadata
    if dataclasses.is_dataclass(default):
        return _build(type(default), value, where)
    if isinstance(default, tuple):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)) or not value:
            raise ConfigError(f"{where}: must be a non-empty list, got {value!r}")
        return tuple(_scalar(str, v, f"{where}[{i}]", meta) for i, v in enumerate(value))
    return _scalar(type(default), value, where, meta)


def _scalar(kind, value, where, meta):
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: must be true or false, got {value!r}")
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: must be an integer, got {value!r}")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise ConfigError(f"{where}: must be a number, got {value!r}")
        value = float(value)
    elif kind is str:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}: must be a non-empty string, got {value!r}")
    if "choices" in meta and value not in meta["choices"]:
        allowed = ", ".join(str(c) for c in meta["choices"])
        raise ConfigError(f"{where}: must be one of {allowed}, got {value!r}")
    if "min" in meta and value < meta["min"]:
        raise ConfigError(f"{where}: must be >= {meta['min']}, got {value!r}")
    if "max" in meta and value > meta["max"]:
        raise ConfigError(f"{where}: must be <= {meta['max']}, got {value!r}")
    return value


DEFAULT = Scenario()
