"""Sampled ECN marking in the kernel: a tc BPF program on every switch egress port.

The switch-queue emulator decides per sample which ports mark (``testbed.switchq``); this
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

import ctypes
import os
import socket
import struct
from typing import Dict, Iterable, List

from .netlink import (NLA_F_NESTED, NLM_F_ACK, NLM_F_REQUEST, NLMSGHDR, RTM_NEWQDISC, TCA_KIND,
                      TCA_OPTIONS, TCMSG, _attr, send_and_check)

# bpf(2) commands, map and program types, helpers
BPF_MAP_CREATE, BPF_MAP_UPDATE_ELEM, BPF_PROG_LOAD = 0, 2, 5
BPF_MAP_TYPE_HASH = 1
BPF_PROG_TYPE_SCHED_CLS = 3
HELPER_MAP_LOOKUP, HELPER_SKB_STORE_BYTES, HELPER_L3_CSUM_REPLACE = 1, 9, 10
HELPER_SKB_LOAD_BYTES = 26
SYS_BPF = {"x86_64": 321, "aarch64": 280}
# struct __sk_buff offsets
SKB_PROTOCOL, SKB_IFINDEX = 16, 40
ETH_P_IP_BE = 0x0008  # htons(0x0800) as the program reads it (little-endian load)
IP_OFFSET, IP_CSUM_OFFSET = 14, 24  # IPv4 header and its checksum in the frame
TC_ACT_OK = 0
MAX_PORTS = 4096

# tc: clsact's egress hook, the bpf classifier's attributes
RTM_NEWTFILTER = 44
RTM_DELQDISC = 37
NLM_F_EXCL, NLM_F_CREATE = 0x200, 0x400
TC_H_CLSACT, TC_H_MIN_EGRESS = 0xFFFFFFF1, 0xFFF3
TCA_BPF_FD, TCA_BPF_NAME, TCA_BPF_FLAGS = 6, 7, 8
TCA_BPF_FLAG_ACT_DIRECT = 1
ETH_P_ALL = 0x0003
FILTER_PRIO = 1
PROG_NAME = "testbed_ecn"

# eBPF instruction classes and codes (<linux/bpf_common.h>, <linux/bpf.h>)
INSN = struct.Struct("<BBhi")  # code, dst | src << 4, offset, immediate
R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10 = range(11)
OUT = object()  # the label every early exit jumps to


def _i(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return INSN.pack(code, dst | src << 4, off, imm)


def mov_k(dst, imm): return _i(0xB7, dst, imm=imm)  # noqa: E704  dst = imm (64-bit)
def mov_x(dst, src): return _i(0xBF, dst, src)  # noqa: E704  dst = src
def add_k(dst, imm): return _i(0x07, dst, imm=imm)  # noqa: E704
def and_k(dst, imm): return _i(0x57, dst, imm=imm)  # noqa: E704
def or_k(dst, imm): return _i(0x47, dst, imm=imm)  # noqa: E704
def rsh_k(dst, imm): return _i(0x77, dst, imm=imm)  # noqa: E704
def rsh_x(dst, src): return _i(0x7F, dst, src)  # noqa: E704
def ldx_w(dst, src, off): return _i(0x61, dst, src, off)  # noqa: E704  dst = *(u32 *)(src + off)
def ldx_h(dst, src, off): return _i(0x69, dst, src, off)  # noqa: E704
def ldx_dw(dst, src, off): return _i(0x79, dst, src, off)  # noqa: E704
def stx_w(dst, src, off): return _i(0x63, dst, src, off)  # noqa: E704  *(u32 *)(dst + off) = src
def stx_h(dst, src, off): return _i(0x6B, dst, src, off)  # noqa: E704
def jeq_out(dst, imm): return ("jump", 0x15, dst, imm)  # noqa: E704  if dst == imm: to OUT
def jne_out(dst, imm): return ("jump", 0x55, dst, imm)  # noqa: E704  if dst != imm: to OUT
def call(helper): return _i(0x85, imm=helper)  # noqa: E704
def exit_(): return _i(0x95)  # noqa: E704


def ld_map_fd(dst: int, fd: int) -> bytes:
    """The 16-byte ``ld_imm64`` that loads a map (BPF_PSEUDO_MAP_FD) into ``dst``."""
    return _i(0x18, dst, 1, imm=fd) + _i(0)


def program(map_fd: int) -> bytes:
    """The marking program. Returns TC_ACT_OK for every packet; sets CE (and fixes the IPv4
    checksum) on an ECT(0)/ECT(1) IPv4 packet whose DSCP bit is set in ``map[ifindex]``."""
    body = [
        mov_x(R6, R1),  # r6 = skb
        ldx_w(R1, R6, SKB_PROTOCOL),
        jne_out(R1, ETH_P_IP_BE),
        ldx_w(R1, R6, SKB_IFINDEX),
        stx_w(R10, R1, -4),  # key on the stack
        ld_map_fd(R1, map_fd),
        mov_x(R2, R10), add_k(R2, -4),
        call(HELPER_MAP_LOOKUP),
        jeq_out(R0, 0),  # port not marking
        ldx_dw(R7, R0, 0),  # r7 = DSCP set
        jeq_out(R7, 0),
        mov_x(R1, R6), mov_k(R2, IP_OFFSET), mov_x(R3, R10), add_k(R3, -8), mov_k(R4, 2),
        call(HELPER_SKB_LOAD_BYTES),  # version/IHL and TOS bytes
        jne_out(R0, 0),
        ldx_h(R8, R10, -8),  # r8 = the old 16-bit word as stored (TOS in the high byte)
        mov_x(R1, R8), rsh_k(R1, 8), and_k(R1, 3),  # ECN bits
        jeq_out(R1, 0),  # not ECN-capable: never marked
        jeq_out(R1, 3),  # already CE
        mov_x(R9, R8), rsh_k(R9, 10), and_k(R9, 63),  # DSCP
        rsh_x(R7, R9), and_k(R7, 1),
        jeq_out(R7, 0),  # this DSCP's class is not marking here
        mov_x(R9, R8), or_k(R9, 0x300),  # the new word: ECN = CE
        stx_h(R10, R9, -8),
        mov_x(R1, R6), mov_k(R2, IP_OFFSET), mov_x(R3, R10), add_k(R3, -8), mov_k(R4, 2),
        mov_k(R5, 0),
        call(HELPER_SKB_STORE_BYTES),
        jne_out(R0, 0),
        mov_x(R1, R6), mov_k(R2, IP_CSUM_OFFSET), mov_x(R3, R8), mov_x(R4, R9), mov_k(R5, 2),
        call(HELPER_L3_CSUM_REPLACE),
        OUT,
        mov_k(R0, TC_ACT_OK),
        exit_(),
    ]
    return _link(body)


def _link(body: List) -> bytes:
    """Lay out the instructions; a jump to OUT gets its offset (in 8-byte slots, counted
    from the instruction after the jump)."""
    at, pos, target = [], 0, None
    for item in body:
        if item is OUT:
            target = pos
            continue
        at.append((pos, item))
        pos += 1 if isinstance(item, tuple) else len(item) // INSN.size
    out = bytearray()
    for p, item in at:
        if isinstance(item, tuple):
            _kind, code, dst, imm = item
            item = _i(code, dst, off=target - p - 1, imm=imm)
        out += item
    return bytes(out)


# --- the bpf(2) system call -------------------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)
ATTR_SIZE = 128  # a zeroed union bpf_attr large enough for the commands used here


def _bpf(cmd: int, attr: bytes) -> int:
    number = SYS_BPF.get(os.uname().machine)
    if number is None:
        raise OSError(0, f"bpf: unknown system call number on {os.uname().machine}")
    buf = ctypes.create_string_buffer(attr.ljust(ATTR_SIZE, b"\0"), ATTR_SIZE)
    ret = _libc.syscall(ctypes.c_long(number), ctypes.c_int(cmd), buf, ctypes.c_uint(ATTR_SIZE))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf command {cmd}: {os.strerror(err)}")
    return ret


def create_map() -> int:
    """A hash map ifindex (u32) -> DSCP set (u64); returns its file descriptor."""
    return _bpf(BPF_MAP_CREATE, struct.pack("=IIIII", BPF_MAP_TYPE_HASH, 4, 8, MAX_PORTS, 0))


def load_program(map_fd: int) -> int:
    """Load ``program`` (GPL: the checksum helpers need it); returns its file descriptor.
    A verifier rejection raises OSError carrying the verifier's log."""
    code = program(map_fd)
    insns = ctypes.create_string_buffer(code, len(code))
    licence = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(65536)
    attr = struct.pack("=IIQQIIQII16s", BPF_PROG_TYPE_SCHED_CLS, len(code) // INSN.size,
                       ctypes.addressof(insns), ctypes.addressof(licence), 1, len(log),
                       ctypes.addressof(log), 0, 0, PROG_NAME.encode())
    try:
        return _bpf(BPF_PROG_LOAD, attr)
    except OSError as e:
        detail = log.value.decode(errors="replace").strip().splitlines()[-3:]
        raise OSError(e.errno, f"{e.strerror}; verifier: {' / '.join(detail)}") from None


def set_marking(map_fd: int, ifindex: int, dscps: int) -> None:
    """Mark the classes in ``dscps`` (a DSCP bit set; 0: none) at port ``ifindex``."""
    key = ctypes.create_string_buffer(struct.pack("=I", ifindex), 4)
    value = ctypes.create_string_buffer(struct.pack("=Q", dscps), 8)
    _bpf(BPF_MAP_UPDATE_ELEM, struct.pack("=IIQQQ", map_fd, 0, ctypes.addressof(key),
                                          ctypes.addressof(value), 0))


def dscp_set(dscps: Iterable[int]) -> int:
    out = 0
    for d in dscps:
        out |= 1 << d
    return out


# --- attaching with rtnetlink -----------------------------------------------------------------
def filter_message(ifindex: int, prog_fd: int) -> bytes:
    """``RTM_NEWTFILTER``: the program as a direct-action bpf filter on clsact's egress hook."""
    options = (_attr(TCA_BPF_FD, struct.pack("=I", prog_fd))
               + _attr(TCA_BPF_NAME, PROG_NAME.encode() + b"\0")
               + _attr(TCA_BPF_FLAGS, struct.pack("=I", TCA_BPF_FLAG_ACT_DIRECT)))
    info = (FILTER_PRIO << 16) | socket.htons(ETH_P_ALL)
    body = (TCMSG.pack(0, ifindex, 0, (TC_H_CLSACT & 0xFFFF0000) | TC_H_MIN_EGRESS, info)
            + _attr(TCA_KIND, b"bpf\0") + _attr(TCA_OPTIONS | NLA_F_NESTED, options))
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_NEWTFILTER,
                         NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, 0, 0) + body


def clsact_message(ifindex: int, add: bool) -> bytes:
    """``RTM_NEWQDISC`` / ``RTM_DELQDISC`` of the interface's clsact qdisc."""
    body = (TCMSG.pack(0, ifindex, TC_H_CLSACT & 0xFFFF0000, TC_H_CLSACT, 0)
            + _attr(TCA_KIND, b"clsact\0"))
    kind, flags = ((RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL) if add
                   else (RTM_DELQDISC, NLM_F_REQUEST | NLM_F_ACK))
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), kind, flags, 0, 0) + body


class Marker:
    """The program on a set of ports of this network namespace, and their marking switches.

    ``open`` raises OSError when the kernel refuses (no bpf, no cls_bpf): the caller reports
    it. ``close`` stops every port marking and removes what ``open`` added."""

    def __init__(self, interfaces: Iterable[str], dscps: Iterable[int]):
        self.interfaces = list(interfaces)
        self.dscps = dscp_set(dscps)
        self.index: Dict[str, int] = {}
        self.map_fd = self.prog_fd = -1
        self.sock = None
        self.attached: List[str] = []

    def open(self) -> None:
        names = {name: idx for idx, name in socket.if_nameindex()}
        missing = [i for i in self.interfaces if i not in names]
        if missing:
            raise LookupError(f"no interface {missing[0]} in this network namespace")
        self.index = {i: names[i] for i in self.interfaces}
        self.map_fd = create_map()
        self.prog_fd = load_program(self.map_fd)
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
        self.sock.bind((0, 0))
        for intf in self.interfaces:
            send_and_check(self.sock, [clsact_message(self.index[intf], True)])
            self.attached.append(intf)
            send_and_check(self.sock, [filter_message(self.index[intf], self.prog_fd)])

    def set(self, intf: str, marking: bool) -> None:
        set_marking(self.map_fd, self.index[intf], self.dscps if marking else 0)

    def close(self) -> None:
        if self.sock is not None:
            for intf in self.attached:
                try:
                    send_and_check(self.sock, [clsact_message(self.index[intf], False)])
                except OSError:
                    pass  # the port is gone already: so is its clsact
            self.sock.close()
            self.sock = None
        self.attached = []
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
    udp = struct.pack("!HHHH", 49152, 4791, 8 + 16, 0) + bytes(16)
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
