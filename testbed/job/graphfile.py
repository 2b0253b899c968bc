"""The project's own job format (YAML or JSON): an iteration's graph written out, for jobs no
model preset or trace format describes. Times are modelled microseconds, sizes bytes.

```yaml
name: my-job
comms:                                   # each one collective over its group of ranks
  - {collective: ring, group: [0, 1, 2, 3], bytes: 4194304, kind: dp}
  - {collective: send_recv, group: [0, 1], bytes: 65536, kind: pp}
programs:                                # one list of ops per rank, in the order they are listed
  - - {compute: forward, us: 120}        # op 0 of rank 0
    - {comm: 1, after: [0]}              # its part in comm 1, once op 0 ended
    - {comm: 0, after: [0]}
  - - {compute: forward, us: 120}
    ...
```

An op is ``{compute: NAME, us: T}`` or ``{comm: INDEX}`` (optionally ``name``), with ``after``
(indices of earlier ops of the same rank) and ``stream`` (ops of one stream run one at a time;
default: ``compute`` for compute ops, the comm's kind for comms). A comm has ``collective``
(ring, halving_doubling, double_binary_tree, hierarchical, all_to_all, all_gather,
reduce_scatter, send_recv), ``group``, ``bytes``, and optionally ``kind`` (dp, tp, pp, ep or
any label: its own QPs and its line in the results) and ``chunks``.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List

import yaml

from traffic.collectives import ALGORITHMS, ScheduleError
from traffic.jobgraph import COMM, COMPUTE, Comm, JobGraph, Op, check

from ..base.errors import ConfigError


def dump(graph: JobGraph) -> dict:
    """``graph`` (modelled ns) as the file's mapping."""
    def op(o: Op) -> dict:
        out: Dict[str, Any] = ({"compute": o.name, "us": o.ns / 1000} if o.kind == COMPUTE
                               else {"comm": o.comm, "name": o.name})
        if o.after:
            out["after"] = list(o.after)
        out["stream"] = o.stream
        return out
    return {"name": graph.name,
            "comms": [{"collective": c.collective, "group": list(c.group), "bytes": c.size,
                       "kind": c.kind, "chunks": c.chunks} for c in graph.comms],
            "programs": [[op(o) for o in prog] for prog in graph.programs]}


def load(path: str) -> JobGraph:
    """The graph a job file holds (modelled ns), checked; ConfigError naming the file and the
    entry otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f) if path.endswith(".json") else yaml.safe_load(f)
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise ConfigError(f"workload.job.file: {path}: {e}") from None
    return checked(parse(data, path), path)


def checked(graph: JobGraph, path: str) -> JobGraph:
    """``graph`` if it is sound (``traffic.jobgraph.check``), else ConfigError naming ``path``."""
    try:
        check(graph)
    except ScheduleError as e:
        raise ConfigError(f"{path}: {e}") from None
    return graph


def parse(data: Any, path: str) -> JobGraph:
    _keys(data, {"name", "comms", "programs"}, path)
    comms = [_comm(c, f"{path}: comms[{i}]") for i, c in enumerate(_list(data, "comms", path))]
    programs = []
    for r, prog in enumerate(_list(data, "programs", path)):
        where = f"{path}: programs[{r}]"
        if not isinstance(prog, list) or not prog:
            raise ConfigError(f"{where}: must be a non-empty list of ops")
        programs.append(tuple(_op(o, f"{where}[{i}]", comms) for i, o in enumerate(prog)))
    for r, prog in enumerate(programs):  # the GPU adds its compute phase to op 0
        if prog[0].kind != COMPUTE:
            programs[r] = (Op(COMPUTE, "start"),) + tuple(
                Op(o.kind, o.name, o.stream, tuple(a + 1 for a in o.after) or (0,), o.ns,
                   o.comm) for o in prog)
    return JobGraph(tuple(programs), tuple(comms), str(data.get("name") or "job"))


def _keys(data: Any, allowed: set, where: str) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a mapping")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (allowed: "
                          f"{', '.join(sorted(allowed))})")


def _list(data: dict, key: str, where: str) -> List:
    value = data.get(key)
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: {key} must be a non-empty list")
    return value


def _int(data: dict, key: str, where: str, low: int = 0, default=None) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{where}: {key} must be an integer >= {low}, got {value!r}")
    return value


def _comm(c: Any, where: str) -> Comm:
    _keys(c, {"collective", "group", "bytes", "kind", "chunks"}, where)
    if c.get("collective") not in ALGORITHMS:
        raise ConfigError(f"{where}: collective must be one of {', '.join(ALGORITHMS)}, got "
                          f"{c.get('collective')!r}")
    group = c.get("group")
    if not isinstance(group, list) or len(group) < 2 or not all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in group):
        raise ConfigError(f"{where}: group must be a list of at least 2 ranks, got {group!r}")
    return Comm(c["collective"], tuple(group), _int(c, "bytes", where, 1),
                _int(c, "chunks", where, 1, 1), str(c.get("kind", "coll")))


def _op(o: Any, where: str, comms: List[Comm]) -> Op:
    _keys(o, {"compute", "us", "comm", "name", "after", "stream"}, where)
    after = o.get("after", [])
    if not isinstance(after, list) or not all(isinstance(a, int) and not isinstance(a, bool)
                                              for a in after):
        raise ConfigError(f"{where}: after must be a list of op indices, got {after!r}")
    if ("compute" in o) == ("comm" in o):
        raise ConfigError(f"{where}: give either compute (a name) or comm (an index)")
    if "compute" in o:
        us = o.get("us")
        if isinstance(us, bool) or not isinstance(us, (int, float)) or us < 0:
            raise ConfigError(f"{where}: us must be a number >= 0, got {us!r}")
        return Op(COMPUTE, str(o["compute"]), str(o.get("stream", "compute")), tuple(after),
                  int(round(us * 1000)))
    c = _int(o, "comm", where)
    if c >= len(comms):
        raise ConfigError(f"{where}: comm {c}: there are {len(comms)} comms")
    return Op(COMM, str(o.get("name", comms[c].collective)),
              str(o.get("stream", comms[c].kind)), tuple(after), comm=c)
