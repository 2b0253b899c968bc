"""Packet trimming in the kernel: a tc BPF program on every switch egress port.

A switch that trims (NDP, SIGCOMM 2017; UE Spec 1.0; Spectrum-4/5 and SONiC's packet trimming)
does not drop a packet of the trimmable class that would overflow its queue: it cuts the
packet to its headers, re-marks it to the header class's DSCP and forwards it there, in strict
priority, so that the receiver learns of the loss within about a round trip and NACKs it.

The program (``program``) runs on the port's ``clsact`` egress, before its queue and before the
queue counters of ``testbed.fabric.bpfqueue`` (``bpf.PRIO_TRIM``). For an IPv4 UET packet
(UDP destination port 4793) of a trimmable DSCP it reads the class's backlog at that port
from those counters - bytes into the queue less bytes out at the peer's ingress, per packet
and without a sample's delay - and when the backlog plus the packet would exceed the port's
limit it cuts the packet to ``TRIMMED_FRAME`` bytes (``bpf_skb_change_tail``), rewrites the
IPv4 total length and checksum, the UDP length (and a zero UDP checksum, which IPv4 allows),
sets the header class's DSCP, and counts the trim at the port (``trims``). The root qdisc's
DSCP filters then put it in the header class (``testbed.fabric.shaping``). Every other packet
passes unchanged (TC_ACT_UNSPEC).

The ports' table (``ports``: ifindex -> the counters' two keys and the limit) and the trim
counters (an array the owner maps into its memory) belong to the ``Trimmer``.
"""
from __future__ import annotations

import os
import socket
import struct
from typing import Dict, Iterable, List, Tuple

from ..base.frames import (ETH_LEN, IP_LEN, PDS_REQUEST_LEN, SES_REQUEST_LEN, UDP_LEN,
                           UET_UDP_PORT)
from . import bpf
from .bpf import (HELPER_L3_CSUM_REPLACE, HELPER_MAP_LOOKUP, HELPER_SKB_CHANGE_TAIL,
                  HELPER_SKB_LOAD_BYTES, HELPER_SKB_STORE_BYTES, IP_CSUM_OFFSET, IP_OFFSET, OUT,
                  R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10, SKB_IFINDEX, SKB_LEN,
                  TC_ACT_UNSPEC, Clsact, add_k, add_x, and_k, call, dscp_set, exit_, ja, jeq,
                  jge_x, jle_x, jne, ld_imm64, ld_map_fd, ldx_dw, ldx_h, ldx_w, load_dscp,
                  mov_k, mov_x, or_k, rsh_x, stx_h, stx_w, sub_x, xadd_dw)

PROG_NAME = "testbed_trim"
MAX_PORTS = 4096
# what a trimmed packet keeps: Ethernet, IPv4, UDP, the PDS request and SES headers
TRIMMED_FRAME = ETH_LEN + IP_LEN + UDP_LEN + PDS_REQUEST_LEN + SES_REQUEST_LEN
IP_TOTAL_LENGTH = IP_OFFSET + 2
UDP_OFFSET = IP_OFFSET + IP_LEN  # the programs assume IPv4 headers without options
UDP_DPORT, UDP_LENGTH = UDP_OFFSET + 2, UDP_OFFSET + 4
PORT_ENTRY = struct.Struct("=IIQ")  # the counters' key of bytes in, of bytes out; the limit


def _raw16(value: int) -> int:
    """A 16-bit field in network order as a program's 16-bit load reads it (little-endian)."""
    return struct.unpack("<H", struct.pack("!H", value))[0]


def _bytes_at(offset: int, stack: int, size: int) -> List:
    """Instructions: ``size`` packet bytes at ``offset`` onto the stack at ``stack``."""
    return [mov_x(R1, R6), mov_k(R2, offset), mov_x(R3, R10), add_k(R3, stack), mov_k(R4, size),
            call(HELPER_SKB_LOAD_BYTES), jne(R0, 0)]


def _store(offset: int, stack: int, size: int) -> List:
    return [mov_x(R1, R6), mov_k(R2, offset), mov_x(R3, R10), add_k(R3, stack), mov_k(R4, size),
            mov_k(R5, 0), call(HELPER_SKB_STORE_BYTES), jne(R0, 0)]


def _ip_csum(old: int, new: int) -> List:
    """Instructions: fix the IPv4 checksum for a 16-bit word changed from reg ``old`` to
    reg ``new``."""
    return [mov_x(R1, R6), mov_k(R2, IP_CSUM_OFFSET), mov_x(R3, old), mov_x(R4, new),
            mov_k(R5, 2), call(HELPER_L3_CSUM_REPLACE), jne(R0, 0)]


def program(ports_fd: int, counters_fd: int, trims_fd: int, trimmable: int,
            header_dscp: int) -> bytes:
    """The trimming program: ``trimmable`` the DSCP set of the class it trims, ``header_dscp``
    the DSCP a trimmed packet leaves with. Stack: -8 the IPv4 version/TOS word, -12 the
    ifindex, -16 a counter key, -20 the trim counter's key, -24 scratch."""
    body = [mov_x(R6, R1)] + load_dscp(R6, R7) + [
        ld_imm64(R1, trimmable), rsh_x(R1, R7), and_k(R1, 1), jeq(R1, 0),
        ldx_w(R1, R6, SKB_LEN), mov_k(R2, TRIMMED_FRAME), jle_x(R1, R2),  # nothing to cut
    ] + _bytes_at(UDP_DPORT, -24, 2) + [
        ldx_h(R1, R10, -24), jne(R1, _raw16(UET_UDP_PORT)),
        ldx_w(R1, R6, SKB_IFINDEX), stx_w(R10, R1, -12),
        ld_map_fd(R1, ports_fd), mov_x(R2, R10), add_k(R2, -12),
        call(HELPER_MAP_LOOKUP), jeq(R0, 0),  # not a trimming port
        ldx_w(R7, R0, 0), ldx_w(R8, R0, 4), ldx_dw(R9, R0, 8),  # in key, out key, limit
        stx_w(R10, R7, -20), stx_w(R10, R7, -16),
        ld_map_fd(R1, counters_fd), mov_x(R2, R10), add_k(R2, -16),
        call(HELPER_MAP_LOOKUP), jeq(R0, 0),
        ldx_dw(R7, R0, 0),  # bytes into the queue
        stx_w(R10, R8, -16),
        ld_map_fd(R1, counters_fd), mov_x(R2, R10), add_k(R2, -16),
        call(HELPER_MAP_LOOKUP), jeq(R0, 0),
        ldx_dw(R1, R0, 0),  # bytes out of it
        jge_x(R7, R1, "backlog"),
        mov_k(R7, 0), ja("sum"),  # the counters behind a drop's correction: empty
        bpf.label("backlog"), sub_x(R7, R1),
        bpf.label("sum"), ldx_w(R1, R6, SKB_LEN), add_x(R7, R1),
        jle_x(R7, R9),  # the packet fits
        # cut it to its headers
        mov_x(R1, R6), mov_k(R2, TRIMMED_FRAME), mov_k(R3, 0),
        call(HELPER_SKB_CHANGE_TAIL), jne(R0, 0),
    ] + _bytes_at(IP_TOTAL_LENGTH, -24, 2) + [
        ldx_h(R8, R10, -24), mov_k(R9, _raw16(TRIMMED_FRAME - ETH_LEN)), stx_h(R10, R9, -24),
    ] + _store(IP_TOTAL_LENGTH, -24, 2) + _ip_csum(R8, R9) + [
        mov_k(R1, _raw16(TRIMMED_FRAME - UDP_OFFSET)), stx_w(R10, R1, -24),  # length, csum 0
    ] + _store(UDP_LENGTH, -24, 4) + [
        ldx_h(R8, R10, -8),  # version/IHL and TOS as loaded: the DSCP in bits 10-15
        mov_x(R9, R8), and_k(R9, 0x03FF), or_k(R9, header_dscp << 10), stx_h(R10, R9, -8),
    ] + _store(IP_OFFSET, -8, 2) + _ip_csum(R8, R9) + [
        ld_map_fd(R1, trims_fd), mov_x(R2, R10), add_k(R2, -20),
        call(HELPER_MAP_LOOKUP), jeq(R0, 0),
        mov_k(R1, 1), xadd_dw(R0, R1, 0),
        bpf.label(OUT), mov_k(R0, TC_ACT_UNSPEC), exit_(),
    ]
    return bpf.link(body)


class Trimmer:
    """The program on ``ports`` of this network namespace. ``limits``: port -> the class's
    queue limit in bytes; ``keys``: port -> the two keys of its bytes in and out in the
    counters map ``counters_fd`` (``testbed.fabric.bpfqueue.QueueCounters``).

    ``open`` raises OSError when the kernel refuses (no bpf, no bpf_skb_change_tail) and
    LookupError for a port this namespace does not have; ``close`` removes the filters' maps
    and program (the filters go with the shared ``clsact``)."""

    def __init__(self, ports: Iterable[str], limits: Dict[str, int],
                 keys: Dict[str, Tuple[int, int]], counters_fd: int, trimmable: Iterable[int],
                 header_dscp: int, clsact: Clsact):
        self.ports = list(ports)
        self.limits, self.keys, self.counters_fd = limits, keys, counters_fd
        self.trimmable, self.header_dscp, self.clsact = dscp_set(trimmable), header_dscp, clsact
        self.held = bpf.Held()
        self.values = struct.Struct(f"={max(len(self.ports), 1)}Q")

    def open(self) -> None:
        index = bpf.interface_index()
        missing = [p for p in self.ports if p not in index]
        if missing:
            raise LookupError(f"no interface {missing[0]} in this network namespace")
        held = self.held
        ports = held.fd(bpf.create_map(bpf.BPF_MAP_TYPE_HASH, 4, PORT_ENTRY.size, MAX_PORTS))
        trims = held.fd(bpf.create_map(bpf.BPF_MAP_TYPE_ARRAY, 4, 8, self.slots(),
                                       bpf.BPF_F_MMAPABLE))
        held.mapped(trims, self.slots() * 8)
        prog = held.fd(bpf.load_program(program(ports, self.counters_fd, trims,
                                                self.trimmable, self.header_dscp), PROG_NAME))
        for port in self.ports:
            key_in, key_out = self.keys[port]
            bpf.update(ports, struct.pack("=I", index[port]),
                       PORT_ENTRY.pack(key_in, key_out, self.limits[port]))
            self.clsact.attach(index[port], prog, PROG_NAME, bpf.PRIO_TRIM)

    def slots(self) -> int:
        """The trim counters' size: one per key of bytes in."""
        return max([k for k, _ in self.keys.values()] + [0]) + 1

    def trims(self) -> Dict[str, int]:
        """Packets trimmed at each port so far."""
        v = struct.unpack_from(f"={self.slots()}Q", self.held.map)
        return {port: v[self.keys[port][0]] for port in self.ports}

    def close(self) -> None:
        self.held.release()


# --- the run-time probe -----------------------------------------------------------------------
def _uet_frame(payload: int, dscp: int) -> bytes:
    """An Ethernet/IPv4/UDP frame to UET's port with headers of UET's sizes and a correct IPv4
    checksum (bytes only: the probe needs no Scapy)."""
    from .bpfmark import ip_checksum
    udp_len = UDP_LEN + PDS_REQUEST_LEN + SES_REQUEST_LEN + payload
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, dscp << 2 | 2, IP_LEN + udp_len, 0,
                               0x4000, 64, 17, 0, bytes([10, 0, 1, 1]), bytes([10, 0, 2, 1])))
    struct.pack_into("!H", ip, 10, ip_checksum(bytes(ip)))
    udp = struct.pack("!HHHH", 0xC001, UET_UDP_PORT, udp_len, 0x1234)
    body = bytes(range(256)) * (-(-(udp_len - UDP_LEN) // 256))
    return (b"\x02\0\0\0\0\x02" + b"\x02\0\0\0\0\x01" + b"\x08\x00" + bytes(ip) + udp
            + body[:udp_len - UDP_LEN])


def selftest() -> List[bytes]:
    """In a private network namespace (the caller's ``unshare --net``): a veth pair, the program
    on one end trimming DSCP 26 to DSCP 46 above a limit of 10,000 B, the counters map standing
    in for a queue holding 9,000 B; one 500 B and one 2,000 B UET frame through it. Returns the
    two frames as they arrived, and raises unless the trim counter says one."""
    import subprocess
    subprocess.run("ip link add tbtrim0 mtu 9000 type veth peer name tbtrim1 mtu 9000 && "
                   "ip link set tbtrim0 up && ip link set tbtrim1 up", shell=True, check=True)
    rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
    rx.bind(("tbtrim1", 0))
    rx.settimeout(2)
    counters = bpf.create_map(bpf.BPF_MAP_TYPE_ARRAY, 4, 8, 2)
    bpf.update(counters, struct.pack("=I", 0), struct.pack("=Q", 19_000))  # in
    bpf.update(counters, struct.pack("=I", 1), struct.pack("=Q", 10_000))  # out
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    sock.bind((0, 0))
    clsact = Clsact(sock)
    trimmer = Trimmer(["tbtrim0"], {"tbtrim0": 10_000}, {"tbtrim0": (0, 1)}, counters, [26],
                      46, clsact)
    try:
        trimmer.open()
        tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        tx.bind(("tbtrim0", 0))
        got = []
        for payload in (500, 2000):
            tx.send(_uet_frame(payload, 26))
            while True:
                data = rx.recv(4096)
                if data[30:34] == bytes([10, 0, 2, 1]):
                    got.append(data)
                    break
        tx.close()
        if trimmer.trims() != {"tbtrim0": 1}:
            raise OSError(0, f"the trimming program counted {trimmer.trims()}")
        return got
    finally:
        trimmer.close()
        clsact.close()
        sock.close()
        rx.close()
        os.close(counters)


if __name__ == "__main__":
    for frame in selftest():
        print(frame.hex())
