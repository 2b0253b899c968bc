"""Per-QP rate limiters in the GPU NIC's qdisc, as an RNIC has them in hardware.

With DCQCN every QP sends at its own rate. Pacing that from the agent's loop costs one wake
per frame, and a wake made late by a busy CPU is a frame sent late. Here the kernel paces:
the RoCE class of a GPU NIC holds an HTB qdisc (``testbed.fabric.shaping`` builds it) whose default
class is open (``OPEN_FACTOR`` x the line rate; the NIC's own shaper above sets the pace);
the agent adds one class per QP that sends data and a u32 filter that steers the QP's data
frames into it (ECN-capable TOS, destination address, destination QP in the BTH), and sets
the class's rate whenever DCQCN changes the QP's rate. ACKs and NAKs (no ECT) and CNPs
(another class) are never rate-limited, as on an RNIC.

The messages are built here (pure, <linux/pkt_sched.h>, <linux/pkt_cls.h>); ``Limiters`` is
the thin I/O edge: one netlink socket in the host's namespace, rate changes sent without
waiting for an answer and the socket checked for errors on every send.
"""
from __future__ import annotations

import bisect
import os
import socket
import struct
import time
from typing import Dict, List, Optional, Sequence, Tuple

from testbed.base.frames import link_frame_bytes
from testbed.base.netlink import (NLA_F_NESTED, NLM_F_ACK, NLM_F_REQUEST, NLMSGHDR, RATESPEC,
                             TC_LINKLAYER_ETHERNET, TCA_KIND, TCA_OPTIONS, TCMSG,
                             PSCHED_NS_PER_TICK, _attr, netlink_errors, send_and_check)

RTM_NEWTCLASS, RTM_NEWTFILTER = 40, 44
NLM_F_EXCL, NLM_F_CREATE = 0x200, 0x400
TCA_HTB_PARMS = 1
HTB_OPT = struct.Struct("=12s12sIIIII")  # rate, ceil, buffer, cbuffer, quantum, level, prio
TCA_U32_CLASSID, TCA_U32_SEL = 1, 5
U32_SEL = struct.Struct("=BBBxHHhhI")  # flags, offshift, nkeys, offmask, off, offoff, hoff, hmask
TC_U32_TERMINAL = 1
ETH_P_IP = 0x0800

DEFAULT_MINOR = 1  # the open class every unmatched frame of the RoCE class takes
QP_MINOR_BASE = 0x100  # QP classes are QP_MINOR_BASE + i
OPEN_FACTOR = 10  # an open class's rate, in line rates: the NIC's shaper decides the pace
HTB_QUANTUM = 1600  # bytes; at least one frame
NIC_RUN_AHEAD = 0.05  # of a frame: a GPU NIC's burst (half the monitor's default tolerance)
FILTER_PRIO = 1
# u32 offsets from the IP header: TOS (byte 1), destination address, the BTH's destination QP
TOS_WORD, DST_WORD, DQPN_WORD = 0, 16, 20 + 8 + 4


def ticks(burst: int, rate_bytes: int) -> int:
    """A token bucket of ``burst`` bytes at ``rate_bytes`` per second, in psched ticks."""
    return max(1, min(0xFFFFFFFF, burst * 1_000_000_000 // max(1, rate_bytes)
                      // PSCHED_NS_PER_TICK))


def class_message(ifindex: int, classid: int, rate_bytes: int, burst: int, quantum: int,
                  create: bool = False) -> bytes:
    """``RTM_NEWTCLASS``: an HTB class of ``rate = ceil = rate_bytes`` (bytes/s) directly
    under its qdisc (what ``tc class replace ... htb rate R ceil R burst B cburst B`` sends)."""
    rate = RATESPEC.pack(0, TC_LINKLAYER_ETHERNET, 0, -1, 0,
                         max(1, min(int(rate_bytes), 0xFFFFFFFF)))
    t = ticks(burst, rate_bytes)
    opt = HTB_OPT.pack(rate, rate, t, t, quantum, 0, 0)
    body = (TCMSG.pack(0, ifindex, classid, classid & 0xFFFF0000, 0) + _attr(TCA_KIND, b"htb\0")
            + _attr(TCA_OPTIONS | NLA_F_NESTED, _attr(TCA_HTB_PARMS, opt)))
    flags = NLM_F_REQUEST | (NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK if create else 0)
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_NEWTCLASS, flags, 0, 0) + body


def u32_keys(tos: int, dst_ip: str, dqpn: int) -> List[Tuple[int, int, int]]:
    """(mask, value, offset) of the words a QP's data frames carry: the full TOS byte (DSCP
    and ECT; ACKs carry no ECT), the peer's address, the destination QP."""
    return [(0x00FF0000, tos << 16, TOS_WORD),
            (0xFFFFFFFF, int.from_bytes(socket.inet_aton(dst_ip), "big"), DST_WORD),
            (0x00FFFFFF, dqpn & 0x00FFFFFF, DQPN_WORD)]


def filter_message(ifindex: int, parent: int, keys: Sequence[Tuple[int, int, int]],
                   classid: int) -> bytes:
    """``RTM_NEWTFILTER``: a u32 filter on ``parent`` matching every key, to ``classid``."""
    sel = U32_SEL.pack(TC_U32_TERMINAL, 0, len(keys), 0, 0, 0, 0, 0) + b"".join(
        struct.pack("!II", mask, value & mask) + struct.pack("=ii", off, 0)
        for mask, value, off in keys)
    options = _attr(TCA_U32_CLASSID, struct.pack("=I", classid)) + _attr(TCA_U32_SEL, sel)
    info = (FILTER_PRIO << 16) | socket.htons(ETH_P_IP)
    body = (TCMSG.pack(0, ifindex, 0, parent, info) + _attr(TCA_KIND, b"u32\0")
            + _attr(TCA_OPTIONS | NLA_F_NESTED, options))
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_NEWTFILTER,
                         NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, 0, 0) + body


def reschedule(held: Sequence[list], ns_per_byte: float) -> Optional[int]:
    """The frames a limiter holds, ``[sent ns, bytes, ready ns]`` in order, after its rate
    changed: HTB charges a frame at the rate it leaves with, so the first keeps its time (the
    frame before it was charged at the old rate) and each later one leaves one gap at the new
    rate after the one before. Returns when a frame after them may leave (None: none held)."""
    if not held:
        return None
    at = held[0][2]
    for h in held:
        h[2] = at
        at += int(h[1] * ns_per_byte)
    return at


def ready_times(frames: Sequence[Tuple[int, int, int]], rates: Sequence[Tuple[int, float]],
                open_bps: float) -> Dict[int, int]:
    """When a QP's limiter let each of its frames go, from what left: ``frames`` are its
    (sent ns, kernel transmit ns, bytes), ``rates`` its limiter's (since ns, bit/s; 0: open)
    in time order. A frame may leave one gap at the limiter's rate after the frame before it
    left (HTB charges a frame when it leaves, and its burst is a small part of a frame), and
    not before it was sent. Returns sent ns -> that time, for the frames it held."""
    out: Dict[int, int] = {}
    times = [t for t, _r in rates]
    prev = None
    for sent, tx, size in sorted(frames, key=lambda f: f[1]):
        if prev is not None:
            i = bisect.bisect_right(times, prev[0]) - 1
            rate = (rates[i][1] if i >= 0 else 0.0) or open_bps
            ready = prev[0] + int(prev[1] * 8e9 / rate)
            if ready > sent:
                out[sent] = ready
        prev = (tx, size)
    return out


def nic_burst_bytes(mtu: int) -> int:
    """A GPU NIC's HTB burst at link MTU ``mtu``: ``NIC_RUN_AHEAD`` of a frame
    (``testbed.fabric.shaping.burst_bytes``)."""
    return max(1, int(link_frame_bytes(mtu) * NIC_RUN_AHEAD))


def limiter_qdisc(rate_mbit: float, mtu: int) -> dict:
    """The QP classes' settings on a NIC of ``rate_mbit`` and link MTU ``mtu``: open rate,
    burst (the NIC's) and quantum (one frame, so the NIC serves its QPs round-robin by
    frames)."""
    return {"open_bytes": int(OPEN_FACTOR * rate_mbit * 1e6 / 8),
            "burst": nic_burst_bytes(mtu),
            "quantum": max(HTB_QUANTUM, link_frame_bytes(mtu))}


class Limiters:
    """The QP classes of one GPU NIC. ``sock``: a NETLINK_ROUTE socket in the host's
    namespace; ``major``: the handle of the RoCE class's HTB qdisc; ``open_bytes``, ``burst``,
    ``quantum``: the classes' settings (``limiter_qdisc``)."""

    def __init__(self, sock: socket.socket, ifindex: int, major: int, open_bytes: int,
                 burst: int, quantum: int):
        self.sock, self.ifindex, self.major = sock, ifindex, major
        self.open_bytes = open_bytes
        self.open_bps = open_bytes * 8.0  # an open class's rate
        self.burst, self.quantum = burst, quantum
        self.changes = 0  # rate changes sent, and the time the calls took
        self.change_ns = self.change_ns_max = 0
        sock.setblocking(False)

    def classid(self, index: int) -> int:
        return (self.major << 16) | (QP_MINOR_BASE + index)

    def create(self, qps: Sequence[Tuple[int, str, int]], tos: int) -> None:
        """One open class and one filter per (index, peer address, destination QP)."""
        msgs = []
        for index, ip, dqpn in qps:
            cid = self.classid(index)
            msgs.append(class_message(self.ifindex, cid, self.open_bytes, self.burst,
                                      self.quantum, create=True))
            msgs.append(filter_message(self.ifindex, self.major << 16, u32_keys(tos, ip, dqpn),
                                       cid))
        self.sock.setblocking(True)
        try:
            send_and_check(self.sock, msgs)
        finally:
            self.sock.setblocking(False)

    def set_rate(self, index: int, rate_bps: float) -> None:
        """The QP's class to ``rate_bps`` (0: open). Sent at once; the kernel answers only
        with an error, which ``check`` raises."""
        rate = self.open_bytes if not rate_bps else max(1, int(rate_bps / 8))
        msg = class_message(self.ifindex, self.classid(index), rate, self.burst, self.quantum)
        t0 = time.monotonic_ns()
        self.sock.send(msg)  # the kernel applies it inside the call (under the RTNL lock)
        took = time.monotonic_ns() - t0
        self.changes += 1
        self.change_ns += took
        self.change_ns_max = max(self.change_ns_max, took)

    def check(self) -> None:
        """Raise the first error the kernel answered a rate change with."""
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return
        errors = netlink_errors(data)
        if errors:
            raise OSError(errors[0], f"QP rate limiter: {os.strerror(errors[0])}")

    def close(self) -> None:
        self.sock.close()
