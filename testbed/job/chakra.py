"""Chakra execution traces (MLCommons; ASTRA-sim's input) in and out, as job graphs.

A trace is one file per rank, ``<prefix>.<rank>.et`` (optionally gzip'd): a stream of
protobuf messages, each preceded by its length as a varint - a ``GlobalMetadata`` first, then
``Node``s (package ``ChakraProtoMsg``; field numbers in docs/REFERENCE.md, "Workload files").
The messages are declared here from those numbers and read with the ``protobuf`` package.

A rank's nodes become its program, in an order their data and control dependencies allow:
COMP nodes are compute spans of ``duration_micros`` (run one at a time, in that order, as a
GPU runs kernels on its compute stream); COMM_COLL nodes are collectives (``comm_type``,
``comm_size``) over the ranks of their communicator group (``pg_name`` in the groups JSON
``{"<name>": [rank, ...]}``; without one, every rank) - the k-th collective of a group on each
member is one collective, and they must agree; COMM_SEND and COMM_RECV (``comm_src``,
``comm_dst``, ``comm_tag``) pair up as point-to-point transfers; other nodes take no time. A
malformed trace is refused with the file, the node and the field.
"""
from __future__ import annotations

import gzip
import json
import os
from collections import defaultdict
from typing import Dict, Iterable, Iterator, List, Sequence, Tuple

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from traffic.jobgraph import COMM, COMPUTE, Comm, JobGraph, Op

from ..base.errors import ConfigError

INVALID, METADATA, MEM_LOAD, MEM_STORE, COMP, COMM_SEND, COMM_RECV, COMM_COLL = range(8)
# CollectiveCommType -> the collective that runs it here
COLLECTIVES = {0: "ring", 2: "all_gather", 6: "all_to_all", 7: "reduce_scatter",
               8: "reduce_scatter"}
COMM_TYPE_NAMES = {0: "ALL_REDUCE", 1: "REDUCE", 2: "ALL_GATHER", 3: "GATHER", 4: "SCATTER",
                   5: "BROADCAST", 6: "ALL_TO_ALL", 7: "REDUCE_SCATTER",
                   8: "REDUCE_SCATTER_BLOCK", 9: "BARRIER"}
INT_VALUES = ("int32_val", "int64_val", "uint32_val", "uint64_val")


def _messages():
    """GlobalMetadata, Node and AttributeProto classes, from the published field numbers."""
    F = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="testbed_chakra_et.proto",
                                           package="ChakraProtoMsg", syntax="proto3")

    def message(name, fields, oneof=None):
        m = f.message_type.add(name=name)
        if oneof:
            m.oneof_decl.add(name=oneof)
        for fname, number, ftype, label, type_name, in_oneof in fields:
            field = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = type_name
            if in_oneof:
                field.oneof_index = 0

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    message("AttributeProto", [
        ("name", 1, F.TYPE_STRING, opt, None, False),
        ("doc_string", 2, F.TYPE_STRING, opt, None, False),
        ("double_val", 3, F.TYPE_DOUBLE, opt, None, True),
        ("int32_val", 7, F.TYPE_INT32, opt, None, True),
        ("int64_val", 9, F.TYPE_INT64, opt, None, True),
        ("uint32_val", 11, F.TYPE_UINT32, opt, None, True),
        ("uint64_val", 13, F.TYPE_UINT64, opt, None, True),
        ("bool_val", 27, F.TYPE_BOOL, opt, None, True),
        ("bool_list", 28, F.TYPE_BYTES, opt, None, True),
        ("string_val", 29, F.TYPE_STRING, opt, None, True)], oneof="value")
    message("GlobalMetadata", [
        ("version", 1, F.TYPE_STRING, opt, None, False),
        ("attr", 2, F.TYPE_MESSAGE, rep, ".ChakraProtoMsg.AttributeProto", False)])
    message("Node", [
        ("id", 1, F.TYPE_UINT64, opt, None, False),
        ("name", 2, F.TYPE_STRING, opt, None, False),
        ("type", 3, F.TYPE_INT32, opt, None, False),  # the NodeType enum, as its number
        ("ctrl_deps", 4, F.TYPE_UINT64, rep, None, False),
        ("data_deps", 5, F.TYPE_UINT64, rep, None, False),
        ("start_time_micros", 6, F.TYPE_UINT64, opt, None, False),
        ("duration_micros", 7, F.TYPE_UINT64, opt, None, False),
        ("inputs", 8, F.TYPE_BYTES, opt, None, False),  # IOInfo, not read
        ("outputs", 9, F.TYPE_BYTES, opt, None, False),
        ("attr", 10, F.TYPE_MESSAGE, rep, ".ChakraProtoMsg.AttributeProto", False)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    get = message_factory.GetMessageClass
    return (get(pool.FindMessageTypeByName("ChakraProtoMsg.GlobalMetadata")),
            get(pool.FindMessageTypeByName("ChakraProtoMsg.Node")),
            get(pool.FindMessageTypeByName("ChakraProtoMsg.AttributeProto")))


GlobalMetadata, Node, AttributeProto = _messages()


# --- the stream ---------------------------------------------------------------------------
def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _messages_in(data: bytes, path: str) -> Iterator[bytes]:
    at = 0
    while at < len(data):
        length, shift, start = 0, 0, at
        while True:
            if at >= len(data) or shift > 28:
                raise ConfigError(f"{path}: a message length at byte {start} is cut off")
            byte = data[at]
            at += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if at + length > len(data):
            raise ConfigError(f"{path}: the message at byte {start} needs {length} bytes, "
                              f"{len(data) - at} are left")
        yield data[at:at + length]
        at += length


def write_trace(path: str, nodes: Iterable, version: str = "0.0.4") -> None:
    """One rank's trace file (gzip'd if ``path`` ends in .gz): the metadata, then ``nodes``."""
    out = bytearray()
    for msg in [GlobalMetadata(version=version), *nodes]:
        body = msg.SerializeToString()
        out += _varint(len(body)) + body
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(bytes(out))


def node(id: int, name: str, type: int, data_deps=(), ctrl_deps=(), duration_micros: int = 0,
         **attrs) -> "Node":
    """A Node message; ``attrs`` become its attributes (int as uint64, str as string)."""
    n = Node(id=id, name=name, type=type, data_deps=list(data_deps), ctrl_deps=list(ctrl_deps),
             duration_micros=duration_micros)
    for key, value in attrs.items():
        a = n.attr.add(name=key)
        if isinstance(value, bool):
            a.bool_val = value
        elif isinstance(value, int):
            a.uint64_val = value
        else:
            a.string_val = str(value)
    return n


def read_trace(path: str) -> List["Node"]:
    """The nodes of one rank's trace file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror or e}") from None
    messages = list(_messages_in(data, path))
    if not messages:
        raise ConfigError(f"{path}: empty, not a Chakra trace")
    out = []
    for i, body in enumerate(messages[1:], 1):
        n = Node()
        try:
            n.ParseFromString(body)
        except Exception as e:  # the protobuf package's DecodeError
            raise ConfigError(f"{path}: message {i} is not a Chakra node ({e})") from None
        out.append(n)
    return out


# --- nodes to a job graph -------------------------------------------------------------------
def trace_files(prefix: str) -> List[str]:
    """``<prefix>.0.et``, ``<prefix>.1.et``, ... (each may end in .gz), in rank order."""
    out = []
    while True:
        base = f"{prefix}.{len(out)}.et"
        path = next((p for p in (base, base + ".gz") if os.path.exists(p)), None)
        if path is None:
            break
        out.append(path)
    if not out:
        raise ConfigError(f"workload.job.file: no Chakra trace {prefix}.0.et(.gz)")
    return out


def _attr(n, key: str, path: str, kind: str = "int", default=None):
    for a in n.attr:
        if a.name == key:
            which = a.WhichOneof("value")
            if kind == "int" and which in INT_VALUES:
                return int(getattr(a, which))
            if kind == "str" and which == "string_val":
                return a.string_val
            raise ConfigError(f"{path}: node {n.id} ({n.name}): attribute {key} is "
                              f"{which or 'empty'}, not {'an integer' if kind == 'int' else 'a string'}")
    if default is not None:
        return default
    raise ConfigError(f"{path}: node {n.id} ({n.name}): no attribute {key}")


def _ordered(nodes: Sequence, path: str) -> List:
    """The nodes in an order their dependencies allow (file order where it is free)."""
    by_id = {}
    for n in nodes:
        if n.id in by_id:
            raise ConfigError(f"{path}: node id {n.id} appears twice")
        by_id[n.id] = n
    waiting = {}
    users = defaultdict(list)
    for n in nodes:
        deps = set(n.data_deps) | set(n.ctrl_deps)
        for d in deps:
            if d not in by_id:
                field = "data_deps" if d in n.data_deps else "ctrl_deps"
                raise ConfigError(f"{path}: node {n.id} ({n.name}): {field} names node {d}, "
                                  "which the trace does not have")
            users[d].append(n.id)
        waiting[n.id] = len(deps)
    ready = [n.id for n in nodes if waiting[n.id] == 0]
    order = []
    position = {n.id: i for i, n in enumerate(nodes)}
    while ready:
        ready.sort(key=position.get, reverse=True)
        i = ready.pop()
        order.append(by_id[i])
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.append(u)
    if len(order) != len(nodes):
        stuck = next(n for n in nodes if waiting[n.id] > 0)
        raise ConfigError(f"{path}: node {stuck.id} ({stuck.name}) is in a dependency cycle")
    return order


def load(prefix: str, groups_path: str = "", name: str = "") -> JobGraph:
    """The job graph of a Chakra trace (modelled ns, full size)."""
    paths = trace_files(prefix)
    ranks = len(paths)
    groups = _groups(groups_path, ranks)
    comms: List[Comm] = []
    coll_of: Dict[tuple, int] = {}  # (group, k) -> comm
    coll_seen: Dict[tuple, int] = defaultdict(int)  # (rank, group) -> collectives so far
    p2p: Dict[tuple, List[int]] = defaultdict(list)  # (src, dst, tag) -> comms, in order
    p2p_seen: Dict[tuple, int] = defaultdict(int)  # (rank, src, dst, tag) -> so far
    programs = []
    for rank, path in enumerate(paths):
        ops: List[Op] = [Op(COMPUTE, "start")]
        index: Dict[int, int] = {}
        last_compute = 0
        for n in _ordered(read_trace(path), path):
            after = {index[d] for d in list(n.data_deps) + list(n.ctrl_deps)} or {0}
            where = f"{path}: node {n.id} ({n.name})"
            if n.type == COMP:
                after.add(last_compute)
                op = Op(COMPUTE, n.name or f"node {n.id}", "compute", tuple(sorted(after)),
                        int(n.duration_micros) * 1000)
                last_compute = len(ops)
            elif n.type == COMM_COLL:
                ctype = _attr(n, "comm_type", path)
                if ctype not in COLLECTIVES:
                    raise ConfigError(f"{where}: comm_type {COMM_TYPE_NAMES.get(ctype, ctype)} "
                                      f"is not supported (supported: "
                                      f"{', '.join(COMM_TYPE_NAMES[c] for c in COLLECTIVES)})")
                size = _attr(n, "comm_size", path)
                pg = _attr(n, "pg_name", path, "str", "")
                group = _group(groups, pg, ranks, where)
                if rank not in group:
                    raise ConfigError(f"{where}: rank {rank} is not in its group {pg!r} "
                                      f"{list(group)}")
                key = (group, coll_seen[(rank, group)])
                coll_seen[(rank, group)] += 1
                want = Comm(COLLECTIVES[ctype], group, size, 1, _kind(pg, "coll"))
                c = coll_of.setdefault(key, len(comms))
                if c == len(comms):
                    comms.append(want)
                elif comms[c] != want:
                    raise ConfigError(
                        f"{where}: collective {key[1] + 1} of group {list(group)} is "
                        f"{COMM_TYPE_NAMES[ctype]} of {size} B here, but "
                        f"{comms[c].collective} of {comms[c].size} B on another rank")
                op = Op(COMM, n.name or f"node {n.id}", f"{want.kind} {n.id}",
                        tuple(sorted(after)), comm=c)
            elif n.type in (COMM_SEND, COMM_RECV):
                src = _attr(n, "comm_src", path, default=rank)
                dst = _attr(n, "comm_dst", path, default=rank)
                tag = _attr(n, "comm_tag", path, default=0)
                size = _attr(n, "comm_size", path)
                if (n.type == COMM_SEND) != (src == rank) or src == dst or not (
                        0 <= src < ranks and 0 <= dst < ranks):
                    raise ConfigError(f"{where}: comm_src {src} / comm_dst {dst} do not fit a "
                                      f"{'send' if n.type == COMM_SEND else 'receive'} on "
                                      f"rank {rank} of {ranks}")
                key = (src, dst, tag)
                k = p2p_seen[(rank,) + key]
                p2p_seen[(rank,) + key] += 1
                pairs = p2p[key]
                if k == len(pairs):
                    pairs.append(len(comms))
                    comms.append(Comm("send_recv", (src, dst), size, 1, "p2p"))
                elif comms[pairs[k]].size != size:
                    raise ConfigError(f"{where}: message {k + 1} from {src} to {dst} (tag "
                                      f"{tag}) is {size} B here, {comms[pairs[k]].size} B at "
                                      "its other end")
                op = Op(COMM, n.name or f"node {n.id}", f"p2p {n.id}", tuple(sorted(after)),
                        comm=pairs[k])
            elif n.type in (METADATA, MEM_LOAD, MEM_STORE):
                op = Op(COMPUTE, n.name or f"node {n.id}", f"meta {n.id}", tuple(sorted(after)))
            else:
                raise ConfigError(f"{where}: type {n.type} is not a node type")
            index[n.id] = len(ops)
            ops.append(op)
        programs.append(tuple(ops))
    for c, comm in enumerate(comms):  # every member has its part
        have = [r for r, prog in enumerate(programs) if any(op.comm == c for op in prog)]
        if sorted(have) != sorted(comm.group):
            missing = sorted(set(comm.group) - set(have))
            raise ConfigError(f"{prefix}: a {comm.collective} of {comm.size} B over "
                              f"{list(comm.group)} has no node on rank(s) {missing}")
    return JobGraph(tuple(programs), tuple(comms), name or os.path.basename(prefix))


def _kind(pg: str, default: str) -> str:
    """A communicator group named like a parallel dimension names its traffic's kind."""
    low = pg.lower()
    return next((k for k in ("dp", "tp", "pp", "ep") if low == k or low.startswith(k + "_")),
                default)


def _groups(path: str, ranks: int) -> Dict[str, Tuple[int, ...]]:
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"workload.job.comm_groups: {path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must map group names to lists of ranks")
    out = {}
    for key, members in data.items():
        if not isinstance(members, list) or not members or not all(
                isinstance(r, int) and 0 <= r < ranks for r in members):
            raise ConfigError(f"{path}: group {key!r}: must be a list of ranks 0..{ranks - 1}, "
                              f"got {members!r}")
        out[str(key)] = tuple(members)
    return out


def _group(groups: Dict[str, Tuple[int, ...]], pg: str, ranks: int, where: str
           ) -> Tuple[int, ...]:
    if not pg:
        return tuple(range(ranks))
    if pg not in groups:
        raise ConfigError(f"{where}: pg_name {pg!r} is not in the communicator groups "
                          f"({', '.join(groups) or 'none given: workload.job.comm_groups'})")
    return groups[pg]
