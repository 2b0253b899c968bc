"""Queue backlogs counted in the kernel, read by the switch-queue emulator without a syscall.

The emulator acts on one traffic class's backlog at every switch egress port (ECN marking,
PFC, adaptive routing's load) every sample interval. Asking the kernel for 24 qdiscs costs
about 0.1 ms per sample on the 2-core VM; these counters cost a memory read. Two kinds of
eBPF programs keep them, in one array map the emulator maps into its memory
(``BPF_F_MMAPABLE``):

* on every switch port's ``clsact`` egress (before its queue, beside the marking program of
  ``testbed.fabric.bpfmark``, which runs after it), the bytes of each packet of the class that
  enters the port: ``counters[slot]``;
* on the ``clsact`` ingress of the port's peer (the next switch's port, or a GPU's NIC in its
  namespace) - where every frame the queue sends arrives - the bytes that left it:
  ``counters[N + slot]``.

The backlog of a port's class is the difference (``backlogs``); packets the queue dropped
never arrive at the peer, so the emulator corrects a port by the qdisc's own figure after a
drop (``testbed.switchq.emulator``). Both programs pass every packet on unchanged (TC_ACT_UNSPEC).
"""
from __future__ import annotations

import socket
import struct
from typing import Dict, Iterable, List, Optional, Tuple

from ..base.netlink import socket_in_netns
from . import bpf
from .bpf import (OUT, R0, R1, R2, R6, R7, R10, SKB_IFINDEX, SKB_LEN, TC_ACT_UNSPEC, Clsact,
                  and_k, call, dscp_set, exit_, jeq, ld_imm64, ld_map_fd, ldx_w, load_dscp,
                  mov_k, mov_x, add_k, rsh_x, st_w, stx_w, xadd_dw)

IN_NAME, OUT_NAME = "testbed_q_in", "testbed_q_out"
MAX_SLOTS = 4096


def _tracked(dst_flag: int, dscp: int, tracked: int) -> List:
    """Instructions: to OUT unless the DSCP in ``dscp`` is in the ``tracked`` set."""
    return [ld_imm64(dst_flag, tracked), rsh_x(dst_flag, dscp), and_k(dst_flag, 1),
            jeq(dst_flag, 0)]


def _add_len(counters_fd: int) -> List:
    """Instructions: ``counters[key at r10-16] += skb->len``."""
    return [ld_map_fd(R1, counters_fd), mov_x(R2, R10), add_k(R2, -16),
            bpf.call(bpf.HELPER_MAP_LOOKUP), jeq(R0, 0),
            ldx_w(R1, R6, SKB_LEN), xadd_dw(R0, R1, 0)]


def enqueue_program(slots_fd: int, counters_fd: int, tracked: int) -> bytes:
    """Into the queue (a switch port's egress hook): the port's slot from ``slots``
    (ifindex -> slot)."""
    body = [mov_x(R6, R1)] + load_dscp(R6, R7) + _tracked(R1, R7, tracked) + [
        ldx_w(R1, R6, SKB_IFINDEX), stx_w(R10, R1, -12),
        ld_map_fd(R1, slots_fd), mov_x(R2, R10), add_k(R2, -12),
        call(bpf.HELPER_MAP_LOOKUP), jeq(R0, 0),
        ldx_w(R1, R0, 0), stx_w(R10, R1, -16),
    ] + _add_len(counters_fd) + [bpf.label(OUT), mov_k(R0, TC_ACT_UNSPEC), exit_()]
    return bpf.link(body)


def dequeue_program(counters_fd: int, key: int, tracked: int) -> bytes:
    """Out of the queue (at the peer's ingress hook): ``key`` = N + the port's slot."""
    body = [mov_x(R6, R1)] + load_dscp(R6, R7) + _tracked(R1, R7, tracked) + [
        st_w(R10, -16, key),
    ] + _add_len(counters_fd) + [bpf.label(OUT), mov_k(R0, TC_ACT_UNSPEC), exit_()]
    return bpf.link(body)


class QueueCounters:
    """The counters of one class at ``ports`` (this namespace's switch egress interfaces, in
    the order ``backlogs`` returns them). ``peers``: port -> (pid of the peer's namespace or
    None for this one, the peer interface). ``clsact``: this namespace's, shared with the
    marking program."""

    def __init__(self, ports: Iterable[str], dscps: Iterable[int],
                 peers: Dict[str, Tuple[Optional[int], str]], clsact: Clsact):
        self.ports = list(ports)
        if len(self.ports) > MAX_SLOTS:
            raise OSError(0, f"more than {MAX_SLOTS} switch ports")
        self.tracked = dscp_set(dscps)
        self.peers, self.clsact = peers, clsact
        self.held = bpf.Held()
        self.counters_fd = -1  # the counters map, for programs that read it (bpftrim)
        self.socks: List[socket.socket] = []
        self.remote: List[Clsact] = []  # the clsacts of peers in other namespaces
        n = len(self.ports)
        self.values = struct.Struct(f"={2 * n}Q")
        self.n = n

    def open(self) -> None:
        index = bpf.interface_index()
        n = self.n
        held = self.held
        slots = held.fd(bpf.create_map(bpf.BPF_MAP_TYPE_HASH, 4, 4, MAX_SLOTS))
        counters = self.counters_fd = held.fd(bpf.create_map(bpf.BPF_MAP_TYPE_ARRAY, 4, 8,
                                                             2 * n, bpf.BPF_F_MMAPABLE))
        held.mapped(counters, 2 * n * 8)
        into = held.fd(bpf.load_program(enqueue_program(slots, counters, self.tracked),
                                        IN_NAME))
        by_ns: Dict[int, Tuple[Clsact, Dict[str, int]]] = {}
        for slot, port in enumerate(self.ports):
            bpf.update(slots, struct.pack("=I", index[port]), struct.pack("=I", slot))
            self.clsact.attach(index[port], into, IN_NAME, bpf.PRIO_COUNT)
            pid, peer = self.peers[port]
            if pid is None:
                clsact, names = self.clsact, index
            else:
                if pid not in by_ns:
                    sock, names = socket_in_netns(pid)
                    self.socks.append(sock)
                    by_ns[pid] = (Clsact(sock), names)
                    self.remote.append(by_ns[pid][0])
                clsact, names = by_ns[pid]
            out = held.fd(bpf.load_program(dequeue_program(counters, n + slot, self.tracked),
                                           OUT_NAME))
            clsact.attach(names[peer], out, OUT_NAME, bpf.PRIO_COUNT, ingress=True)

    def keys(self) -> Dict[str, Tuple[int, int]]:
        """Each port's keys in the counters map: its bytes in, its bytes out."""
        return {port: (slot, self.n + slot) for slot, port in enumerate(self.ports)}

    def backlogs(self) -> List[int]:
        """Bytes of the class queued at each port now (in ``ports`` order)."""
        v = self.values.unpack_from(self.held.map)
        n = self.n
        return [v[i] - v[n + i] for i in range(n)]

    def close(self) -> None:
        for clsact in self.remote:
            clsact.close()
        for sock in self.socks:
            sock.close()
        self.held.release()
        self.counters_fd = -1
        self.socks, self.remote = [], []
