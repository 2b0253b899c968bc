"""How long the emulated switches take to forward a packet, measured in the kernel.

What the emulator adds to a packet's latency, apart from the queues it models, is mostly the
time Open vSwitch takes from a frame's arrival at a switch port to its hand-over to the egress
port's queue. Two eBPF programs (the assembler of ``testbed.fabric.bpf``) time that for every
RoCE packet, whatever the queues hold:

* on every switch port's ``clsact`` ingress (where a frame arrives from its link), the
  packet's arrival time under its identity - source address, destination QP, PSN - in an LRU
  hash map;
* on every switch port's ``clsact`` egress (before its queue), the time since that arrival,
  counted in a histogram of ``BUCKET_NS`` buckets in an array map the emulator maps into its
  memory (``BPF_F_MMAPABLE``); the last bucket holds everything longer.

Each hop of a packet's path is one sample: a switch's egress always follows its own ingress,
and the next switch's ingress stores the time anew. A retransmitted PSN overwrites its entry;
a packet a switch drops leaves one the LRU map evicts. Both programs pass every packet on
unchanged (TC_ACT_UNSPEC).
"""
from __future__ import annotations

import socket
import struct
from typing import Dict, Iterable, List, Optional

from traffic import roce

from . import bpf
from .bpf import (BPF_MAP_TYPE_LRU_HASH, ETH_P_IP_BE, HELPER_KTIME_GET_NS, HELPER_MAP_DELETE,
                  HELPER_MAP_LOOKUP, HELPER_MAP_UPDATE, HELPER_SKB_LOAD_BYTES, OUT, R0, R1, R2,
                  R3, R4, R6, R7, R10, SKB_PROTOCOL, TC_ACT_UNSPEC, Clsact, add_k, call, div_k,
                  exit_, ja, jeq, jge, jne, ld_map_fd, ldx_dw, ldx_h, ldx_w, mov_k, mov_x,
                  stx_dw, stx_w, sub_x, xadd_dw)

STAMP_NAME, MEASURE_NAME = "testbed_fwd_in", "testbed_fwd_out"
IN_FLIGHT = 8192  # packets between a switch's ingress and egress at once, at most
BUCKET_NS = 2_000  # the histogram's resolution (emulated)
BUCKETS = 4096  # up to 8 ms; the last bucket holds anything longer
# The frame from the IPv4 source address to the end of the BTH's PSN (Ethernet, a 20-byte
# IPv4 header, UDP, BTH), read into the stack at FRAME.
SADDR_OFFSET = 26
READ = roce.BTH_OFFSET + 12 - SADDR_OFFSET  # 28 bytes
FRAME = -32  # stack offset of the bytes read; the key is built at KEY
KEY = -48  # u32 source address, u32 of the BTH's bytes 4-7 (destination QP), u32 of 8-11 (PSN)
VALUE = -56
DPORT = FRAME + roce.SPORT_OFFSET + 2 - SADDR_OFFSET
ROCE_PORT_AS_READ = socket.htons(roce.ROCE_UDP_PORT)  # as a little-endian 16-bit load reads it
BTH = FRAME + roce.BTH_OFFSET - SADDR_OFFSET


def _key(skb: int) -> List:
    """Instructions: the RoCE packet's identity into the stack at KEY (r1-r5 clobbered); a
    packet that is not IPv4 RoCE goes to OUT."""
    return [
        ldx_w(R1, skb, SKB_PROTOCOL),
        jne(R1, ETH_P_IP_BE),
        mov_x(R1, skb), mov_k(R2, SADDR_OFFSET), mov_x(R3, R10), add_k(R3, FRAME),
        mov_k(R4, READ), call(HELPER_SKB_LOAD_BYTES),
        jne(R0, 0),
        ldx_h(R1, R10, DPORT),
        jne(R1, ROCE_PORT_AS_READ),
        ldx_w(R1, R10, FRAME), stx_w(R10, R1, KEY),
        ldx_w(R1, R10, BTH + 4), stx_w(R10, R1, KEY + 4),
        ldx_w(R1, R10, BTH + 8), stx_w(R10, R1, KEY + 8),
    ]


def stamp_program(arrivals_fd: int) -> bytes:
    """At a switch port's ingress: ``arrivals[packet] = now``."""
    return bpf.link([mov_x(R6, R1)] + _key(R6) + [
        call(HELPER_KTIME_GET_NS), stx_dw(R10, R0, VALUE),
        ld_map_fd(R1, arrivals_fd), mov_x(R2, R10), add_k(R2, KEY),
        mov_x(R3, R10), add_k(R3, VALUE), mov_k(R4, 0),  # BPF_ANY
        call(HELPER_MAP_UPDATE),
        bpf.label(OUT), mov_k(R0, TC_ACT_UNSPEC), exit_()])


def measure_program(arrivals_fd: int, histogram_fd: int) -> bytes:
    """At a switch port's egress: ``histogram[(now - arrivals[packet]) / BUCKET_NS] += 1``,
    the entry deleted."""
    return bpf.link([mov_x(R6, R1)] + _key(R6) + [
        ld_map_fd(R1, arrivals_fd), mov_x(R2, R10), add_k(R2, KEY),
        call(HELPER_MAP_LOOKUP), jeq(R0, 0),
        ldx_dw(R7, R0, 0),
        ld_map_fd(R1, arrivals_fd), mov_x(R2, R10), add_k(R2, KEY),
        call(HELPER_MAP_DELETE),
        call(HELPER_KTIME_GET_NS), sub_x(R0, R7), div_k(R0, BUCKET_NS),
        jge(R0, BUCKETS - 1, "long"),
        ja("count"),
        bpf.label("long"), mov_k(R0, BUCKETS - 1),
        bpf.label("count"), stx_w(R10, R0, VALUE),
        ld_map_fd(R1, histogram_fd), mov_x(R2, R10), add_k(R2, VALUE),
        call(HELPER_MAP_LOOKUP), jeq(R0, 0),
        mov_k(R1, 1), xadd_dw(R0, R1, 0),
        bpf.label(OUT), mov_k(R0, TC_ACT_UNSPEC), exit_()])


def summary(counts: List[int]) -> Optional[dict]:
    """The histogram as figures: packets forwarded and the delay's percentiles (us, emulated,
    each bucket's upper edge; None without a packet)."""
    total = sum(counts)
    if not total:
        return None
    out: Dict[str, float] = {"hops": total, "bucket_us": BUCKET_NS / 1000}
    seen, wanted = 0, [("p10_us", 0.10), ("p50_us", 0.50), ("p90_us", 0.90), ("p99_us", 0.99)]
    for i, c in enumerate(counts):
        seen += c
        while wanted and seen >= wanted[0][1] * total:
            out[wanted.pop(0)[0]] = (i + 1) * BUCKET_NS / 1000
    return out


def summary_of(sparse: Optional[Dict[str, int]]) -> Optional[dict]:
    """``summary`` of a histogram kept as {bucket: count} (an emulator's report; None: not
    measured)."""
    if not sparse:
        return None
    counts = [0] * BUCKETS
    for bucket, count in sparse.items():
        counts[int(bucket)] += count
    return summary(counts)


class ForwardingClock:
    """The two programs on ``ports`` (this namespace's switch interfaces) through ``clsact``
    (shared with the emulator's other programs); ``histogram`` reads the counts."""

    def __init__(self, ports: Iterable[str], clsact: Clsact):
        self.ports = list(ports)
        self.clsact = clsact
        self.held = bpf.Held()
        self.values = struct.Struct(f"={BUCKETS}Q")

    def open(self) -> None:
        index = bpf.interface_index()
        held = self.held
        arrivals = held.fd(bpf.create_map(BPF_MAP_TYPE_LRU_HASH, 12, 8, IN_FLIGHT))
        histogram = held.fd(bpf.create_map(bpf.BPF_MAP_TYPE_ARRAY, 4, 8, BUCKETS,
                                           bpf.BPF_F_MMAPABLE))
        held.mapped(histogram, BUCKETS * 8)
        stamp = held.fd(bpf.load_program(stamp_program(arrivals), STAMP_NAME))
        measure = held.fd(bpf.load_program(measure_program(arrivals, histogram),
                                           MEASURE_NAME))
        for port in self.ports:
            self.clsact.attach(index[port], stamp, STAMP_NAME, bpf.PRIO_FORWARD, ingress=True)
            self.clsact.attach(index[port], measure, MEASURE_NAME, bpf.PRIO_FORWARD)

    def histogram(self) -> List[int]:
        return list(self.values.unpack_from(self.held.map))

    def close(self) -> None:
        self.held.release()
