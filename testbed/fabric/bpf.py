"""eBPF without a compiler: an instruction assembler, the bpf(2) system call, tc attachment.

The switch-port programs (``testbed.fabric.bpfmark`` marks ECN, ``testbed.fabric.bpfqueue`` counts
queue bytes) are written here as lists of instructions and labels, laid out by ``link``, loaded with
the ``bpf`` system call through ctypes, and attached as direct-action ``bpf`` filters of an
interface's ``clsact`` qdisc with one rtnetlink message each. Nothing is pinned: the filters go with
the interfaces, the maps with the programs' file descriptors. Layouts follow <linux/bpf.h>,
<linux/bpf_common.h>, <linux/pkt_cls.h>, <linux/rtnetlink.h>.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import socket
import struct
from typing import Dict, Iterable, List, Optional

from ..base.netlink import (NLA_F_NESTED, NLM_F_ACK, NLM_F_REQUEST, NLMSGHDR, RTM_NEWQDISC,
                            TCA_KIND, TCA_OPTIONS, TCMSG, _attr, send_and_check)

# bpf(2) commands, map and program types, map flags, helpers
BPF_MAP_CREATE, BPF_MAP_LOOKUP_ELEM, BPF_MAP_UPDATE_ELEM, BPF_PROG_LOAD = 0, 1, 2, 5
BPF_MAP_TYPE_HASH, BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_LRU_HASH = 1, 2, 9
BPF_F_MMAPABLE = 1 << 10
BPF_PROG_TYPE_SCHED_CLS = 3
HELPER_MAP_LOOKUP, HELPER_SKB_STORE_BYTES, HELPER_L3_CSUM_REPLACE = 1, 9, 10
HELPER_SKB_LOAD_BYTES, HELPER_SKB_CHANGE_TAIL = 26, 38
HELPER_MAP_UPDATE, HELPER_MAP_DELETE, HELPER_KTIME_GET_NS = 2, 3, 5
SYS_BPF = {"x86_64": 321, "aarch64": 280}
# struct __sk_buff offsets
SKB_LEN, SKB_PROTOCOL, SKB_IFINDEX = 0, 16, 40
ETH_P_IP_BE = 0x0008  # htons(0x0800) as a program reads it (little-endian load)
IP_OFFSET, IP_CSUM_OFFSET = 14, 24  # IPv4 header and its checksum in the frame
TC_ACT_UNSPEC, TC_ACT_OK = -1, 0  # next filter / let the packet go
# The order of the programs on a switch port's clsact egress (lowest first): the link's losses,
# trimming, the queue counters, ECN marking, the forwarding clock. Each passes every packet on.
PRIO_LOSS, PRIO_TRIM, PRIO_COUNT, PRIO_MARK, PRIO_FORWARD = 1, 2, 3, 4, 5

# tc: clsact's hooks, the bpf classifier's attributes
RTM_NEWTFILTER = 44
RTM_DELQDISC = 37
NLM_F_EXCL, NLM_F_CREATE = 0x200, 0x400
TC_H_CLSACT, TC_H_MIN_INGRESS, TC_H_MIN_EGRESS = 0xFFFFFFF1, 0xFFF2, 0xFFF3
TCA_BPF_FD, TCA_BPF_NAME, TCA_BPF_FLAGS = 6, 7, 8
TCA_BPF_FLAG_ACT_DIRECT = 1
ETH_P_ALL = 0x0003
EEXIST = 17

# eBPF instructions
INSN = struct.Struct("<BBhi")  # code, dst | src << 4, offset, immediate
R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10 = range(11)
OUT = "out"  # the label every early exit of a program jumps to


def _i(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return INSN.pack(code, dst | src << 4, off, imm)


def mov_k(dst, imm): return _i(0xB7, dst, imm=imm)  # noqa: E704  dst = imm (64-bit)
def mov_x(dst, src): return _i(0xBF, dst, src)  # noqa: E704  dst = src
def add_k(dst, imm): return _i(0x07, dst, imm=imm)  # noqa: E704
def and_k(dst, imm): return _i(0x57, dst, imm=imm)  # noqa: E704
def or_k(dst, imm): return _i(0x47, dst, imm=imm)  # noqa: E704
def rsh_k(dst, imm): return _i(0x77, dst, imm=imm)  # noqa: E704
def rsh_x(dst, src): return _i(0x7F, dst, src)  # noqa: E704
def sub_x(dst, src): return _i(0x1F, dst, src)  # noqa: E704  dst -= src
def add_x(dst, src): return _i(0x0F, dst, src)  # noqa: E704  dst += src
def div_k(dst, imm): return _i(0x37, dst, imm=imm)  # noqa: E704  dst /= imm (unsigned)
def ldx_w(dst, src, off): return _i(0x61, dst, src, off)  # noqa: E704  dst = *(u32 *)(src + off)
def ldx_h(dst, src, off): return _i(0x69, dst, src, off)  # noqa: E704
def ldx_b(dst, src, off): return _i(0x71, dst, src, off)  # noqa: E704
def ldx_dw(dst, src, off): return _i(0x79, dst, src, off)  # noqa: E704
def stx_w(dst, src, off): return _i(0x63, dst, src, off)  # noqa: E704  *(u32 *)(dst + off) = src
def stx_h(dst, src, off): return _i(0x6B, dst, src, off)  # noqa: E704
def stx_dw(dst, src, off): return _i(0x7B, dst, src, off)  # noqa: E704  *(u64 *)(dst + off) = src
def st_w(dst, off, imm): return _i(0x62, dst, off=off, imm=imm)  # noqa: E704  *(u32 *) = imm
def xadd_dw(dst, src, off): return _i(0xDB, dst, src, off)  # noqa: E704  *(u64 *)(dst+off) += src
def call(helper): return _i(0x85, imm=helper)  # noqa: E704
def exit_(): return _i(0x95)  # noqa: E704
def jeq(dst, imm, label=OUT): return ("jump", 0x15, dst, imm, label)  # noqa: E704
def jne(dst, imm, label=OUT): return ("jump", 0x55, dst, imm, label)  # noqa: E704
def jge(dst, imm, label=OUT): return ("jump", 0x35, dst, imm, label)  # noqa: E704  unsigned
def ja(label): return ("jump", 0x05, 0, 0, label)  # noqa: E704  always
def jge_x(dst, src, label=OUT): return ("jump", 0x3D, dst | src << 4, 0, label)  # noqa: E704
def jle_x(dst, src, label=OUT): return ("jump", 0xBD, dst | src << 4, 0, label)  # noqa: E704
def label(name): return ("label", name)  # noqa: E704


def ld_imm64(dst: int, value: int) -> bytes:
    """The 16-byte ``ld_imm64``: a 64-bit constant into ``dst``."""
    return (_i(0x18, dst, imm=struct.unpack("<i", struct.pack("<I", value & 0xFFFFFFFF))[0])
            + _i(0, imm=struct.unpack("<i", struct.pack("<I", value >> 32))[0]))


def ld_map_fd(dst: int, fd: int) -> bytes:
    """The 16-byte ``ld_imm64`` that loads a map (BPF_PSEUDO_MAP_FD) into ``dst``."""
    return _i(0x18, dst, 1, imm=fd) + _i(0)


def link(body: List) -> bytes:
    """Lay out the instructions; each jump gets the offset of its label (in 8-byte slots,
    counted from the instruction after the jump)."""
    at, pos, labels = [], 0, {}
    for item in body:
        if isinstance(item, tuple) and item[0] == "label":
            labels[item[1]] = pos
            continue
        at.append((pos, item))
        pos += 1 if isinstance(item, tuple) else len(item) // INSN.size
    out = bytearray()
    for p, item in at:
        if isinstance(item, tuple):
            _kind, code, regs, imm, name = item  # regs: dst | src << 4
            item = _i(code, regs & 0xF, regs >> 4, off=labels[name] - p - 1, imm=imm)
        out += item
    return bytes(out)


def load_dscp(skb: int, dst: int) -> List:
    """Instructions: the IPv4 packet's DSCP into ``dst`` (r1-r5 clobbered, the stack at
    -8..-7 holds the version/IHL and TOS bytes as a 16-bit word); not IPv4 goes to OUT."""
    return [
        ldx_w(R1, skb, SKB_PROTOCOL),
        jne(R1, ETH_P_IP_BE),
        mov_x(R1, skb), mov_k(R2, IP_OFFSET), mov_x(R3, R10), add_k(R3, -8), mov_k(R4, 2),
        call(HELPER_SKB_LOAD_BYTES),
        jne(R0, 0),
        ldx_h(dst, R10, -8), rsh_k(dst, 10), and_k(dst, 63),
    ]


# --- the bpf(2) system call -------------------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)
ATTR_SIZE = 128  # a zeroed union bpf_attr large enough for the commands used here


def bpf(cmd: int, attr: bytes) -> int:
    number = SYS_BPF.get(os.uname().machine)
    if number is None:
        raise OSError(0, f"bpf: unknown system call number on {os.uname().machine}")
    buf = ctypes.create_string_buffer(attr.ljust(ATTR_SIZE, b"\0"), ATTR_SIZE)
    ret = _libc.syscall(ctypes.c_long(number), ctypes.c_int(cmd), buf, ctypes.c_uint(ATTR_SIZE))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf command {cmd}: {os.strerror(err)}")
    return ret


def create_map(kind: int, key_size: int, value_size: int, entries: int, flags: int = 0) -> int:
    """A map; returns its file descriptor."""
    return bpf(BPF_MAP_CREATE, struct.pack("=IIIII", kind, key_size, value_size, entries, flags))


def update(map_fd: int, key: bytes, value: bytes) -> None:
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(value, len(value))
    bpf(BPF_MAP_UPDATE_ELEM, struct.pack("=IIQQQ", map_fd, 0, ctypes.addressof(k),
                                         ctypes.addressof(v), 0))


def lookup(map_fd: int, key: bytes, value_size: int) -> bytes:
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(value_size)
    bpf(BPF_MAP_LOOKUP_ELEM, struct.pack("=IIQQQ", map_fd, 0, ctypes.addressof(k),
                                         ctypes.addressof(v), 0))
    return v.raw


def load_program(code: bytes, name: str) -> int:
    """Load a sched_cls program (GPL: the checksum helpers need it); returns its file
    descriptor. A verifier rejection raises OSError carrying the verifier's log."""
    insns = ctypes.create_string_buffer(code, len(code))
    licence = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(65536)
    attr = struct.pack("=IIQQIIQII16s", BPF_PROG_TYPE_SCHED_CLS, len(code) // INSN.size,
                       ctypes.addressof(insns), ctypes.addressof(licence), 1, len(log),
                       ctypes.addressof(log), 0, 0, name.encode())
    try:
        return bpf(BPF_PROG_LOAD, attr)
    except OSError as e:
        detail = log.value.decode(errors="replace").strip().splitlines()[-3:]
        raise OSError(e.errno, f"{e.strerror}; verifier: {' / '.join(detail)}") from None


def dscp_set(dscps: Iterable[int]) -> int:
    out = 0
    for d in dscps:
        out |= 1 << d
    return out


# --- attaching with rtnetlink -----------------------------------------------------------------
def filter_message(ifindex: int, prog_fd: int, name: str, prio: int = 1,
                   ingress: bool = False) -> bytes:
    """``RTM_NEWTFILTER``: the program as a direct-action bpf filter on a clsact hook."""
    options = (_attr(TCA_BPF_FD, struct.pack("=I", prog_fd))
               + _attr(TCA_BPF_NAME, name.encode() + b"\0")
               + _attr(TCA_BPF_FLAGS, struct.pack("=I", TCA_BPF_FLAG_ACT_DIRECT)))
    info = (prio << 16) | socket.htons(ETH_P_ALL)
    hook = TC_H_MIN_INGRESS if ingress else TC_H_MIN_EGRESS
    body = (TCMSG.pack(0, ifindex, 0, (TC_H_CLSACT & 0xFFFF0000) | hook, info)
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


class Clsact:
    """The clsact qdiscs of some interfaces of one network namespace (its netlink socket):
    added where missing, removed at ``close`` where this added them - with every filter on
    them. Several users of the same interfaces share one."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.added: List[int] = []
        self.present: set = set()

    def ensure(self, ifindex: int) -> None:
        if ifindex in self.present:
            return
        try:
            send_and_check(self.sock, [clsact_message(ifindex, True)])
            self.added.append(ifindex)
        except OSError as e:
            if e.errno != EEXIST:
                raise
        self.present.add(ifindex)

    def attach(self, ifindex: int, prog_fd: int, name: str, prio: int,
               ingress: bool = False) -> None:
        self.ensure(ifindex)
        send_and_check(self.sock, [filter_message(ifindex, prog_fd, name, prio, ingress)])

    def close(self) -> None:
        for ifindex in self.added:
            try:
                send_and_check(self.sock, [clsact_message(ifindex, False)])
            except OSError:
                pass  # the interface is gone already: so is its clsact
        self.added, self.present = [], set()


class Held:
    """What a program's owner holds: the file descriptors of its maps and programs, and one
    map mapped into this process's memory (``BPF_F_MMAPABLE``); ``release`` lets go of all."""

    def __init__(self):
        self.fds: List[int] = []
        self.map: Optional[mmap.mmap] = None

    def fd(self, fd: int) -> int:
        self.fds.append(fd)
        return fd

    def mapped(self, fd: int, size: int) -> None:
        """Map the first ``size`` bytes of map ``fd``, read-only."""
        pages = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        self.map = mmap.mmap(fd, pages, mmap.MAP_SHARED, mmap.PROT_READ)

    def release(self) -> None:
        if self.map is not None:
            self.map.close()
            self.map = None
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def interface_index() -> Dict[str, int]:
    return {name: idx for idx, name in socket.if_nameindex()}
