"""Built-in named scenarios (``testbed/scenario/builtin/*.yaml``) and finding a scenario by name or
file.

A built-in scenario is an ordinary scenario file shipped with the package; its leading comment
says what question it answers. ``python -m testbed scenarios`` lists them, and ``run --scenario``
takes a name or a path.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List

from ..base.errors import ConfigError
from .config import Scenario, load_file

SCENARIO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "builtin")


@dataclass(frozen=True)
class BuiltIn:
    name: str
    path: str
    summary: str  # the first line of its leading comment

    def load(self) -> Scenario:
        return load_file(self.path)


def builtins() -> Dict[str, BuiltIn]:
    out = {}
    for entry in sorted(os.listdir(SCENARIO_DIR)):
        if entry.endswith(".yaml"):
            path = os.path.join(SCENARIO_DIR, entry)
            out[entry[:-5]] = BuiltIn(entry[:-5], path, _summary(path))
    return out


def _summary(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") and line.strip("# \n"):
                return line.strip("# \n")
    return ""


def find(spec: str) -> Scenario:
    """The scenario a user named: an existing file, else a built-in name."""
    if os.path.exists(spec) or spec.endswith((".yaml", ".yml")) or os.sep in spec:
        return load_file(spec)
    known = builtins()
    if spec in known:
        return known[spec].load()
    raise ConfigError(f"--scenario: no file and no built-in scenario named {spec!r} "
                      f"(built-in: {', '.join(known)})")


def describe(names: List[str] = None) -> str:
    """The table ``python -m testbed scenarios`` prints."""
    rows = []
    for b in builtins().values():
        if names and b.name not in names:
            continue
        s = b.load()
        w = s.workload
        sizes = "sweep" if w.sizes else _size(w.size_bytes)
        what = f"{w.collective} {sizes}"
        if w.all_jobs:
            what = " + ".join(
                (f"{j.model} job, dp {j.dp or 'auto'} tp {j.tp} pp {j.pp}"
                 + (f" ep {j.ep}" if j.ep > 1 else "")) if j.model else f"job {os.path.basename(j.file)}"
                for j in w.all_jobs)
        rows.append((b.name, f"{s.topology.gpus} GPUs, {what}, {', '.join(s.policies)}",
                     b.summary))
    width = max(len(r[0]) for r in rows)
    lines = []
    for name, what, summary in rows:
        lines.append(f"{name.ljust(width)}  {summary}")
        lines.append(f"{' ' * width}  ({what})")
    return "\n".join(lines)


def _size(n: int) -> str:
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"
