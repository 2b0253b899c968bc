"""SimAI / AICB workload files (``HYBRID_TRANSFORMER_FWD_IN_BCKWD``) as job graphs.

Layout (docs/REFERENCE.md, "Workload files users already have"): a header line naming the
parallelism - ``model_parallel_NPU_group`` (tp), ``ep``, ``pp``, ``vpp``, ``ga`` (micro-batches),
``all_gpus``, ``pp_comm`` (bytes a stage sends per micro-batch); published files write
``key: value`` or, for some keys, ``key value`` - then the number of rows, then one row per
layer (or part of one) of 12 fields: name, dependency, forward compute, forward comm type and
size, input-gradient compute, comm type and size, weight-gradient compute, comm type and size,
weight update time. Times are ticks: nanoseconds.

As ASTRA-sim runs such a workload: the forward pass runs the rows in order, each compute
followed by its communication, which the next row waits for; the backward pass runs them in
reverse, input-gradient compute and communication first, then the weight-gradient compute,
whose communication (after the last micro-batch) overlaps the rest of the pass; the weight
update follows when it is done. Forward and input-gradient communication goes to the tensor-
parallel group, weight-gradient communication to the data-parallel group; a type ending in
``_EP`` to the expert-parallel group, ``_DP_EP`` to the data-parallel ranks holding the same
experts. With ``pp`` stages the rows are dealt out to the stages in order, in equal shares, and
the stages run 1F1B over ``ga`` micro-batches, sending ``pp_comm`` bytes. Ranks are placed as
Megatron-LM places them (``testbed.job.build.Placement``). ALLREDUCEALLTOALL runs as an
all-reduce; the dependency column is not used (published files write -1). A malformed file is
refused naming the line and the field; ``write`` produces the layout (for tests).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Tuple

from traffic.jobgraph import COMM, COMPUTE, Comm, JobGraph, reduced

from ..base.errors import ConfigError
from .build import Parallelism, Placement, ProgramWriter, one_f_one_b

MAGIC = "HYBRID_TRANSFORMER_FWD_IN_BCKWD"
HEADER_KEYS = {"model_parallel_NPU_group": "tp", "ep": "ep", "pp": "pp", "vpp": "vpp",
               "ga": "ga", "all_gpus": "all_gpus", "checkpoints": "checkpoints",
               "checkpoint_initiates": "checkpoint_initiates", "pp_comm": "pp_comm"}
COLLECTIVES = {"ALLREDUCE": "ring", "ALLGATHER": "all_gather",
               "REDUCESCATTER": "reduce_scatter", "ALLTOALL": "all_to_all",
               "ALLREDUCEALLTOALL": "ring"}
FIELDS = ("name", "dep", "fwd_compute", "fwd_comm_type", "fwd_comm_size", "ig_compute",
          "ig_comm_type", "ig_comm_size", "wg_compute", "wg_comm_type", "wg_comm_size",
          "wg_update_time")


@dataclass(frozen=True)
class Row:
    name: str
    fwd: Tuple[int, str, int]  # compute ns, comm type, comm bytes
    ig: Tuple[int, str, int]
    wg: Tuple[int, str, int]
    update_ns: int


@dataclass(frozen=True)
class Workload:
    tp: int
    ep: int
    pp: int
    ga: int
    gpus: int
    pp_comm: int
    rows: Tuple[Row, ...]


def parse(text: str, path: str) -> Workload:
    lines = [(i + 1, line.split()) for i, line in enumerate(text.splitlines()) if line.strip()]
    if not lines or lines[0][1][0] != MAGIC:
        raise ConfigError(f"{path}: line 1: not an AICB workload (expected {MAGIC} first)")
    header = _header(lines[0][1][1:], path)
    if len(lines) < 2 or len(lines[1][1]) != 1 or not lines[1][1][0].isdigit():
        raise ConfigError(f"{path}: line {lines[1][0] if len(lines) > 1 else 2}: the number "
                          "of rows must follow the header")
    count = int(lines[1][1][0])
    rows = [_row(fields, f"{path}: line {n}") for n, fields in lines[2:]]
    if len(rows) != count:
        raise ConfigError(f"{path}: line 2 says {count} rows, the file has {len(rows)}")
    tp, pp, gpus = header.get("tp", 1), header.get("pp", 1), header.get("all_gpus", 0)
    if gpus < 1 or gpus % (tp * pp):
        raise ConfigError(f"{path}: line 1: all_gpus {gpus} is not a multiple of "
                          f"model_parallel_NPU_group x pp = {tp} x {pp}")
    ep = header.get("ep", 1)
    if (gpus // (tp * pp)) % ep:
        raise ConfigError(f"{path}: line 1: ep {ep} does not divide the data-parallel ranks "
                          f"({gpus // (tp * pp)})")
    if pp > len(rows):
        raise ConfigError(f"{path}: {pp} pipeline stages for {len(rows)} rows")
    return Workload(tp, ep, pp, max(1, header.get("ga", 1)), gpus, header.get("pp_comm", 0),
                    tuple(rows))


def _header(tokens: List[str], path: str) -> Dict[str, int]:
    out: Dict[str, int] = {}
    i = 0
    while i < len(tokens):
        key = tokens[i].rstrip(":")
        if key not in HEADER_KEYS or i + 1 >= len(tokens):
            raise ConfigError(f"{path}: line 1: unexpected {tokens[i]!r} (keys: "
                              f"{', '.join(HEADER_KEYS)})")
        out[HEADER_KEYS[key]] = _number(tokens[i + 1], f"{path}: line 1: {key}")
        i += 2
    return out


def _number(text: str, where: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{where}: must be a number, got {text!r}") from None
    if value < 0 or value != value:
        raise ConfigError(f"{where}: must be >= 0, got {text!r}")
    return int(value)


def _row(fields: List[str], where: str) -> Row:
    if len(fields) != len(FIELDS):
        raise ConfigError(f"{where}: {len(fields)} fields, a row has {len(FIELDS)} "
                          f"({' '.join(FIELDS)})")
    values = dict(zip(FIELDS, fields))

    def part(prefix: str) -> Tuple[int, str, int]:
        kind = values[f"{prefix}_comm_type"]
        base = kind.replace("_DP_EP", "").replace("_EP", "")
        if kind != "NONE" and base not in COLLECTIVES:
            raise ConfigError(f"{where}: {prefix}_comm_type {kind!r} (known: NONE, "
                              f"{', '.join(COLLECTIVES)}, with _EP or _DP_EP)")
        return (_number(values[f"{prefix}_compute"], f"{where}: {prefix}_compute"), kind,
                _number(values[f"{prefix}_comm_size"], f"{where}: {prefix}_comm_size"))
    return Row(values["name"], part("fwd"), part("ig"), part("wg"),
               _number(values["wg_update_time"], f"{where}: wg_update_time"))


def write(w: Workload, path: str) -> None:
    """``w`` in the published layout (tab-separated rows, as SimAI's examples)."""
    head = (f"{MAGIC} model_parallel_NPU_group: {w.tp} ep: {w.ep} pp: {w.pp} vpp: 1 "
            f"ga: {w.ga} all_gpus: {w.gpus} checkpoints: 0 checkpoint_initiates: 0 "
            f"pp_comm: {w.pp_comm}")
    lines = [head, str(len(w.rows))]
    for row in w.rows:
        fields = [row.name, -1, *row.fwd, *row.ig, *row.wg, row.update_ns]
        lines.append("\t".join(str(f) for f in fields))
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def load(path: str) -> JobGraph:
    """The job graph of an AICB workload file (modelled ns, full size)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"workload.job.file: {path}: {e}") from None
    return graph(parse(text, path), os.path.basename(path))


def graph(w: Workload, name: str = "aicb") -> JobGraph:
    dp = w.gpus // (w.tp * w.pp)
    par = Parallelism(dp=dp, tp=w.tp, pp=w.pp, ep=w.ep, micro_batches=w.ga)
    place = Placement(par)
    comms: List[Comm] = []
    index: Dict[tuple, int] = {}
    programs = []
    share = [len(w.rows) // w.pp + (1 if s < len(w.rows) % w.pp else 0) for s in range(w.pp)]
    starts = [sum(share[:s]) for s in range(w.pp)]
    for r in range(w.gpus):
        _t, d, stage = place.coords(r)
        rows = w.rows[starts[stage]:starts[stage] + share[stage]]
        prog = ProgramWriter()
        prog.add(COMPUTE, "start", "compute", makes=("start",))

        def group_of(kind: str, weight_grad: bool) -> Tuple[str, Tuple[int, ...]]:
            if kind.endswith("_DP_EP"):
                members = [x for x in place.dp_group(r)
                           if place.coords(x)[1] % w.ep == d % w.ep]
                return "dp", tuple(members)
            if kind.endswith("_EP"):
                return "ep", place.ep_group(r)
            return ("dp", place.dp_group(r)) if weight_grad else ("tp", place.tp_group(r))

        def comm(label: str, part: Tuple[int, str, int], x: str, weight_grad: bool = False,
                 stream: str = "") -> str:
            _ns, kind, size = part
            if kind == "NONE" or size == 0:
                return x
            tag, group = group_of(kind, weight_grad)
            if len(group) < 2:
                return x
            base = kind.replace("_DP_EP", "").replace("_EP", "")
            key = (label, group)
            c = index.setdefault(key, len(comms))
            if c == len(comms):
                comms.append(Comm(COLLECTIVES[base], group, max(size, len(group)), 1, tag))
            prog.add(COMM, label, stream or tag, needs=(x,), makes=(x + "'",), comm=c)
            return x + "'"

        def p2p(label: str, step: int, recv: bool, x: str, stream: str) -> str:
            peer = place.stage_peer(r, step)
            group = (peer, r) if recv else (r, peer)
            key = (label, group)
            c = index.setdefault(key, len(comms))
            if c == len(comms):
                comms.append(Comm("send_recv", group, max(1, w.pp_comm), 1, "pp"))
            made = (f"in {label}",) if recv else ()
            prog.add(COMM, label, stream, needs=() if recv else (x,), makes=made, comm=c)
            return made[0] if recv else x

        m = w.ga
        reduced_grads = []
        for pas, mb in one_f_one_b(w.pp, stage, m):
            if pas == "F":
                x = "start"
                if stage > 0:
                    x = p2p(f"act mb{mb} {place.stage_peer(r, -1)}>{r}", -1, True, x,
                            "pp recv fwd")
                for i, row in enumerate(rows):
                    v = f"f{i} mb{mb}"
                    prog.add(COMPUTE, f"fwd {row.name} mb{mb}", "compute", needs=(x,),
                             makes=(v,), ns=row.fwd[0])
                    x = comm(f"fwd {i} {row.name} mb{mb}", row.fwd, v)
                if stage < w.pp - 1:
                    p2p(f"act mb{mb} {r}>{place.stage_peer(r, 1)}", 1, False, x,
                        "pp send fwd")
            else:
                g = f"f{len(rows) - 1} mb{mb}" if stage == w.pp - 1 else None
                if stage < w.pp - 1:
                    g = p2p(f"grad mb{mb} {place.stage_peer(r, 1)}>{r}", 1, True, "",
                            "pp recv bwd")
                for i in reversed(range(len(rows))):
                    row = rows[i]
                    v = f"ig{i} mb{mb}"
                    prog.add(COMPUTE, f"ig {row.name} mb{mb}", "compute",
                             needs=(g, f"f{i} mb{mb}"), makes=(v,), ns=row.ig[0])
                    g = comm(f"ig {i} {row.name} mb{mb}", row.ig, v)
                    wv = f"wg{i} mb{mb}"
                    prog.add(COMPUTE, f"wg {row.name} mb{mb}", "compute", needs=(v,),
                             makes=(wv,), ns=row.wg[0])
                    if mb == m - 1:
                        reduced_grads.append(comm(f"wg {i} {row.name}", row.wg, wv, True))
                if stage > 0:
                    p2p(f"grad mb{mb} {r}>{place.stage_peer(r, -1)}", -1, False, g,
                        "pp send bwd")
        prog.add(COMPUTE, "update", "compute", needs=tuple(reduced_grads),
                 ns=sum(row.update_ns for row in rows))
        programs.append(tuple(prog.ops))
    return reduced(JobGraph(tuple(programs), tuple(comms), name))
