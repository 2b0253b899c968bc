"""Sampled ECN marking in the kernel: a tc BPF program on every switch egress port.

The switch-queue emulator decides per sample which ports mark (``testbed.switchq.emulator``); this
module applies the decision to the packets. One eBPF program (``program``), attached with
``clsact`` to the egress of every switch port, sets CE on ECN-capable IPv4 packets whose DSCP
is in the port's entry of a hash map (ifindex -> 64-bit DSCP set); the emulator turns marking
on and off with one map update. The program runs when the packet is handed to the port, before
its queue - where RED marks too - and rewrites the IP header checksum.

Why not Open vSwitch: marking with a flow that matches ``ip_ecn`` splits one RoCE flow into
two datapath flows, ECT and CE. The first CE packet of a flow at the next switch misses the
datapath's flow cache, and the userspace datapath executes a missed packet at once, ahead of
the earlier packets of the same receive batch that hit the cache: on a loaded machine the
marked packet overtook unmarked ones of the same flow (measured: 2-6 NAKs, with no drop, in
the lossless runs that reordered), and go-back-N retransmitted. With the program the
switches' pipeline never looks at the ECN bits.

The program is built here as bytecode (no compiler needed) and loaded with the ``bpf`` system
call through ctypes; the filter is attached with one rtnetlink message carrying the program's
file descriptor. Nothing is pinned: the filters go with the ports, the map with the program.
Layouts follow <linux/bpf.h>, <linux/pkt_cls.h> and <linux/rtnetlink.h>.
"""
from __future__ import annotations

import os
import socket
import struct
from typing import Dict, Iterable, Optional

from ..base.frames import ROCE_UDP_PORT
from . import bpf
from .bpf import (ETH_P_ALL, HELPER_L3_CSUM_REPLACE, HELPER_MAP_LOOKUP,  # noqa: F401
                  HELPER_SKB_LOAD_BYTES, HELPER_SKB_STORE_BYTES, INSN, IP_CSUM_OFFSET,
                  IP_OFFSET, OUT, R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10, RTM_NEWTFILTER,
                  SKB_IFINDEX, SKB_PROTOCOL, TC_ACT_UNSPEC, Clsact, add_k, and_k, call, dscp_set,
                  exit_, jeq, jne, ld_map_fd, ldx_dw, ldx_h, ldx_w, mov_k, mov_x, or_k, rsh_k,
                  rsh_x, stx_h, stx_w)
from .bpf import ETH_P_IP_BE

MAX_PORTS = 4096
PROG_NAME = "testbed_ecn"


def program(map_fd: int) -> bytes:
    """The marking program. Passes every packet to the next filter (TC_ACT_UNSPEC: the
    forwarding clock's comes after it); sets CE (and fixes the IPv4 checksum) on an
    ECT(0)/ECT(1) IPv4 packet whose DSCP bit is set in ``map[ifindex]``."""
    body = [
        mov_x(R6, R1),  # r6 = skb
        ldx_w(R1, R6, SKB_PROTOCOL),
        jne(R1, ETH_P_IP_BE),
        ldx_w(R1, R6, SKB_IFINDEX),
        stx_w(R10, R1, -4),  # key on the stack
        ld_map_fd(R1, map_fd),
        mov_x(R2, R10), add_k(R2, -4),
        call(HELPER_MAP_LOOKUP),
        jeq(R0, 0),  # port not marking
        ldx_dw(R7, R0, 0),  # r7 = DSCP set
        jeq(R7, 0),
        mov_x(R1, R6), mov_k(R2, IP_OFFSET), mov_x(R3, R10), add_k(R3, -8), mov_k(R4, 2),
        call(HELPER_SKB_LOAD_BYTES),  # version/IHL and TOS bytes
        jne(R0, 0),
        ldx_h(R8, R10, -8),  # r8 = the old 16-bit word as stored (TOS in the high byte)
        mov_x(R1, R8), rsh_k(R1, 8), and_k(R1, 3),  # ECN bits
        jeq(R1, 0),  # not ECN-capable: never marked
        jeq(R1, 3),  # already CE
        mov_x(R9, R8), rsh_k(R9, 10), and_k(R9, 63),  # DSCP
        rsh_x(R7, R9), and_k(R7, 1),
        jeq(R7, 0),  # this DSCP's class is not marking here
        mov_x(R9, R8), or_k(R9, 0x300),  # the new word: ECN = CE
        stx_h(R10, R9, -8),
        mov_x(R1, R6), mov_k(R2, IP_OFFSET), mov_x(R3, R10), add_k(R3, -8), mov_k(R4, 2),
        mov_k(R5, 0),
        call(HELPER_SKB_STORE_BYTES),
        jne(R0, 0),
        mov_x(R1, R6), mov_k(R2, IP_CSUM_OFFSET), mov_x(R3, R8), mov_x(R4, R9), mov_k(R5, 2),
        call(HELPER_L3_CSUM_REPLACE),
        bpf.label(OUT),
        mov_k(R0, TC_ACT_UNSPEC),
        exit_(),
    ]
    return bpf.link(body)


def create_map() -> int:
    """A hash map ifindex (u32) -> DSCP set (u64); returns its file descriptor."""
    return bpf.create_map(bpf.BPF_MAP_TYPE_HASH, 4, 8, MAX_PORTS)


def load_program(map_fd: int) -> int:
    return bpf.load_program(program(map_fd), PROG_NAME)


def set_marking(map_fd: int, ifindex: int, dscps: int) -> None:
    """Mark the classes in ``dscps`` (a DSCP bit set; 0: none) at port ``ifindex``."""
    bpf.update(map_fd, struct.pack("=I", ifindex), struct.pack("=Q", dscps))


def filter_message(ifindex: int, prog_fd: int) -> bytes:
    """``RTM_NEWTFILTER``: the program as a direct-action bpf filter on clsact's egress hook."""
    return bpf.filter_message(ifindex, prog_fd, PROG_NAME, bpf.PRIO_MARK)


class Marker:
    """The program on a set of ports of this network namespace, and their marking switches.

    ``open`` raises OSError when the kernel refuses (no bpf, no cls_bpf): the caller reports
    it. ``close`` stops every port marking and removes what ``open`` added (the clsact
    qdiscs with it, unless a ``clsact`` shared with another user was given: its owner's
    ``close`` removes them)."""

    def __init__(self, interfaces: Iterable[str], dscps: Iterable[int],
                 clsact: Optional[Clsact] = None):
        self.interfaces = list(interfaces)
        self.dscps = dscp_set(dscps)
        self.index: Dict[str, int] = {}
        self.map_fd = self.prog_fd = -1
        self.clsact, self.own = clsact, clsact is None
        self.sock = None

    def open(self) -> None:
        names = bpf.interface_index()
        missing = [i for i in self.interfaces if i not in names]
        if missing:
            raise LookupError(f"no interface {missing[0]} in this network namespace")
        self.index = {i: names[i] for i in self.interfaces}
        self.map_fd = create_map()
        self.prog_fd = load_program(self.map_fd)
        if self.clsact is None:
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
            self.sock.bind((0, 0))
            self.clsact = Clsact(self.sock)
        for intf in self.interfaces:
            self.clsact.attach(self.index[intf], self.prog_fd, PROG_NAME, bpf.PRIO_MARK)

    def set(self, intf: str, marking: bool) -> None:
        set_marking(self.map_fd, self.index[intf], self.dscps if marking else 0)

    def close(self) -> None:
        if self.own and self.clsact is not None:
            self.clsact.close()
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        for fd in (self.prog_fd, self.map_fd):
            if fd >= 0:
                os.close(fd)
        self.map_fd = self.prog_fd = -1


# --- the run-time probe -----------------------------------------------------------------------
def _probe_frame(tos: int) -> bytes:
    """An Ethernet/IPv4/UDP frame to the RoCE port with a correct header checksum."""
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, tos, 20 + 8 + 16, 0, 0x4000, 64, 17, 0,
                               bytes([10, 0, 1, 1]), bytes([10, 0, 2, 1])))
    struct.pack_into("!H", ip, 10, ip_checksum(bytes(ip)))
    udp = struct.pack("!HHHH", 49152, ROCE_UDP_PORT, 8 + 16, 0) + bytes(16)
    return b"\x02\0\0\0\0\x02" + b"\x02\0\0\0\0\x01" + b"\x08\x00" + bytes(ip) + udp


def ip_checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def selftest() -> None:
    """In a private network namespace (the caller's ``unshare --net``): a veth pair, the
    program on one end marking DSCP 26, one ECT(0) frame through it; raises unless it arrives
    with CE and a valid checksum."""
    import subprocess
    subprocess.run("ip link add tbbpf0 type veth peer name tbbpf1 && ip link set tbbpf0 up "
                   "&& ip link set tbbpf1 up", shell=True, check=True)
    rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
    rx.bind(("tbbpf1", 0))
    rx.settimeout(2)
    marker = Marker(["tbbpf0"], [26])
    marker.open()
    marker.set("tbbpf0", True)
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    tx.bind(("tbbpf0", 0))
    tx.send(_probe_frame(26 << 2 | 2))
    while True:
        data = rx.recv(2048)
        if data[30:34] == bytes([10, 0, 2, 1]):
            break
    header = data[14:34]
    if header[1] != (26 << 2 | 3) or ip_checksum(header) != 0:
        raise OSError(0, f"the marking program did not mark (TOS {header[1]:#x})")
    marker.close()


if __name__ == "__main__":
    selftest()
    print("ok")
