"""Raw rtnetlink for the hot paths: the queue sampler and PFC pause/resume.

pyroute2 is the right tool for set-up, but a generic pyroute2 qdisc dump parses every attribute
of every qdisc into Python objects: about 3.8 ms for the 82 qdiscs of the default fabric on the
development VM. The switch-queue emulator samples every millisecond, so this module speaks the
few messages it needs directly:

* ``QdiscSampler``: one ``RTM_GETQDISC`` dump per sample, decoding only the ``tcmsg`` header of
  each reply and, for the queues of interest, the legacy ``TCA_STATS`` block (backlog, qlen,
  drops, packets);
* ``tbf_message``: a prebuilt ``RTM_NEWQDISC`` that sets the rate of a class's PFC gate - PFC
  pause and resume are each one ``send`` of bytes computed in advance;
* ``socket_in_netns``: a netlink socket bound to another network namespace (a GPU host's), so
  its NIC queue can be paused from the root namespace.

Layouts follow <linux/rtnetlink.h>, <linux/pkt_sched.h> and <linux/gen_stats.h>.
"""
from __future__ import annotations

import os
import socket
import struct
from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple

from .procutil import in_netns

NETLINK_ROUTE = 0
RTM_NEWQDISC, RTM_GETQDISC = 36, 38
NLM_F_REQUEST, NLM_F_ACK, NLM_F_ECHO, NLM_F_DUMP = 0x1, 0x4, 0x8, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCA_KIND, TCA_OPTIONS, TCA_STATS = 1, 2, 3
TCA_TBF_PARMS, TCA_TBF_BURST = 1, 6
NLA_F_NESTED = 0x8000
TC_LINKLAYER_ETHERNET = 1

NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
TCMSG = struct.Struct("=BxxxiIII")  # family, ifindex, handle, parent, info
RTATTR = struct.Struct("=HH")  # len, type
TC_STATS = struct.Struct("=QIIIIIII")  # bytes, packets, drops, overlimits, bps, pps, qlen, backlog
BACKLOG, BACKLOG_AT = struct.Struct("=I"), TC_STATS.size - 4
RATESPEC = struct.Struct("=BBHhHI")  # cell_log, linklayer, overhead, cell_align, mpu, rate
TBF_QOPT = struct.Struct("=12s12sIII")  # rate, peakrate, limit, buffer, mtu
PSCHED_NS_PER_TICK = 64  # kernel PSCHED_SHIFT = 6


def _align(n: int) -> int:
    return (n + 3) & ~3


def _attr(kind: int, payload: bytes) -> bytes:
    data = RTATTR.pack(RTATTR.size + len(payload), kind) + payload
    return data + b"\0" * (_align(len(data)) - len(data))


class QueueStats(NamedTuple):
    backlog: int  # bytes waiting
    qlen: int  # packets waiting
    drops: int
    packets: int  # packets that left


class QdiscSampler:
    """Backlog of selected qdiscs: all of them by one netlink dump of the namespace's qdiscs
    (``sample``), or a subset by one batch of requests for exactly those (``sample_subset``:
    the kernel fills and this parses only the qdiscs asked for)."""

    def __init__(self, wanted: Iterable[Tuple[str, int]], sock: Optional[socket.socket] = None,
                 subset: Iterable[Tuple[str, int]] = ()):
        """``wanted``: (interface name, qdisc handle) pairs; the handle as a 32-bit value;
        ``subset``: some of them."""
        self.sock = sock or socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.sock.bind((0, 0))
        index = {name: idx for idx, name in socket.if_nameindex()}
        self.keys: Dict[Tuple[int, int], Tuple[str, int]] = {}
        for name, handle in wanted:
            if name not in index:
                raise LookupError(f"no interface {name} in this network namespace")
            self.keys[(index[name], handle)] = (name, handle)
        self.seq = 0
        self.buf = bytearray(1 << 18)  # one recv() holds many replies
        self.offsets: Dict[Tuple[str, int], Optional[int]] = {}
        subset = [(index[name], handle) for name, handle in subset]
        self.subset_at = {k: i for i, k in enumerate(subset)}  # (ifindex, handle) -> position
        self.subset_offsets: Dict[int, int] = {}  # position -> TCA_STATS offset in its reply
        # one RTM_GETQDISC per qdisc (ECHO: kernels that send the reply to the TC group only
        # unicast it to us then)
        self.subset_request = b"".join(
            NLMSGHDR.pack(NLMSGHDR.size + TCMSG.size, RTM_GETQDISC,
                          NLM_F_REQUEST | NLM_F_ECHO, i + 1, 0) + TCMSG.pack(0, ifi, h, 0, 0)
            for i, (ifi, h) in enumerate(subset))

    def close(self) -> None:
        self.sock.close()

    def request(self) -> bytes:
        self.seq += 1
        body = TCMSG.pack(0, 0, 0, 0, 0)
        return NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_GETQDISC,
                             NLM_F_REQUEST | NLM_F_DUMP, self.seq, 0) + body

    def sample(self) -> Dict[Tuple[str, int], QueueStats]:
        """Stats of every wanted qdisc, keyed by (interface, handle)."""
        self.sock.send(self.request())
        out: Dict[Tuple[str, int], QueueStats] = {}
        while True:
            n = self.sock.recv_into(self.buf)
            if parse_qdisc_dump(memoryview(self.buf)[:n], self.keys, out, self.offsets):
                return out

    def sample_subset(self) -> List[int]:
        """The backlog of each ``subset`` qdisc, in ``subset`` order (0 for one that is gone):
        one reply, or one error, per qdisc."""
        out = [0] * len(self.subset_at)
        if not out:
            return out
        self.sock.send(self.subset_request)
        replies = 0
        while replies < len(out):
            n = self.sock.recv_into(self.buf)
            replies += parse_qdisc_replies(memoryview(self.buf)[:n], self.subset_at, out,
                                           self.subset_offsets)
        return out


def parse_qdisc_dump(view, keys, out, offsets=None) -> bool:
    """Decode one recv() of a qdisc dump into ``out``; True once the dump is complete.

    ``offsets`` caches where each wanted qdisc's ``TCA_STATS`` sits in its message (the
    layout of one qdisc's reply does not change between dumps), so the attribute walk runs
    once per qdisc, not once per sample.
    """
    offsets = {} if offsets is None else offsets
    off, n = 0, len(view)
    while off + NLMSGHDR.size <= n:
        length, mtype, _flags, _seq, _pid = NLMSGHDR.unpack_from(view, off)
        if length < NLMSGHDR.size:
            raise OSError("malformed netlink message in a qdisc dump")
        if mtype == RTM_NEWQDISC:
            _fam, ifindex, handle, _parent, _info = TCMSG.unpack_from(view, off + 16)
            key = keys.get((ifindex, handle))
            if key is not None:
                rel = offsets.get(key)
                if rel is None or rel + RTATTR.size + TC_STATS.size > length or \
                        RTATTR.unpack_from(view, off + rel)[1] != TCA_STATS:
                    rel = _find_tc_stats(view, off, off + 16 + TCMSG.size, off + length)
                    offsets[key] = rel
                if rel is not None:
                    _b, packets, drops, _o, _bps, _pps, qlen, backlog = TC_STATS.unpack_from(
                        view, off + rel + RTATTR.size)
                    out[key] = QueueStats(backlog, qlen, drops, packets)
        elif mtype == NLMSG_DONE:
            return True
        elif mtype == NLMSG_ERROR:
            err = -struct.unpack_from("=i", view, off + NLMSGHDR.size)[0]
            raise OSError(err, f"qdisc dump failed: {os.strerror(err)}")
        off += (length + 3) & ~3
    return False


def parse_qdisc_replies(view, positions, out: List[int], offsets: Dict[int, int]) -> int:
    """Decode one recv() of replies to single-qdisc requests: the backlog of the qdisc at
    ``positions[(ifindex, handle)]`` goes to ``out[position]``; ``offsets`` caches where
    each reply's ``TCA_STATS`` sits. Returns how many replies (qdiscs, or errors: a qdisc
    that is gone) the buffer held."""
    replies, off, n = 0, 0, len(view)
    while off + NLMSGHDR.size <= n:
        length, mtype = NLMSGHDR.unpack_from(view, off)[:2]
        if length < NLMSGHDR.size:
            raise OSError("malformed netlink message in a qdisc reply")
        if mtype == RTM_NEWQDISC:
            replies += 1
            _fam, ifindex, handle, _parent, _info = TCMSG.unpack_from(view, off + 16)
            at = positions.get((ifindex, handle))
            if at is not None:
                rel = offsets.get(at)
                if rel is None or rel + RTATTR.size + TC_STATS.size > length or \
                        RTATTR.unpack_from(view, off + rel)[1] != TCA_STATS:
                    rel = _find_tc_stats(view, off, off + 16 + TCMSG.size, off + length)
                    if rel is None:
                        off += (length + 3) & ~3
                        continue
                    offsets[at] = rel
                out[at] = BACKLOG.unpack_from(view, off + rel + RTATTR.size + BACKLOG_AT)[0]
        elif mtype == NLMSG_ERROR:
            replies += 1
        off += (length + 3) & ~3
    return replies


def _find_tc_stats(view, msg: int, off: int, end: int) -> Optional[int]:
    """Offset, from the message start ``msg``, of the ``TCA_STATS`` attribute (or None)."""
    while off + RTATTR.size <= end:
        alen, kind = RTATTR.unpack_from(view, off)
        if alen < RTATTR.size:
            return None
        if kind == TCA_STATS:
            return off - msg
        off += _align(alen)
    return None


def tc_handle(text: str) -> int:
    """``"1a:"`` or ``"1:20"`` (hex, as tc writes them) -> 32-bit handle."""
    major, _, minor = text.partition(":")
    return (int(major or "0", 16) << 16) | int(minor or "0", 16)


def tbf_message(ifindex: int, handle: int, parent: int, rate_bytes: int, burst: int,
                limit: int) -> bytes:
    """``RTM_NEWQDISC`` changing an existing tbf (what ``tc qdisc change ... tbf`` sends).

    The rate is in bytes per second with the Ethernet link layer (no rate table needed); the
    burst is given in bytes (``TCA_TBF_BURST``); ``limit`` is passed on to the child FIFO.
    """
    rate = RATESPEC.pack(0, TC_LINKLAYER_ETHERNET, 0, -1, 0, max(1, min(rate_bytes, 0xFFFFFFFF)))
    ticks = min(0xFFFFFFFF, burst * 1_000_000_000 // max(1, rate_bytes) // PSCHED_NS_PER_TICK)
    qopt = TBF_QOPT.pack(rate, bytes(RATESPEC.size), limit, max(1, ticks), 0)
    options = _attr(TCA_TBF_PARMS, qopt) + _attr(TCA_TBF_BURST, struct.pack("=I", burst))
    body = (TCMSG.pack(0, ifindex, handle, parent, 0) + _attr(TCA_KIND, b"tbf\0")
            + _attr(TCA_OPTIONS | NLA_F_NESTED, options))
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK,
                         0, 0) + body


def netlink_errors(data: bytes) -> List[int]:
    """The non-zero error codes in a buffer of netlink answers."""
    out, off = [], 0
    while off + NLMSGHDR.size <= len(data):
        length, mtype, _f, _s, _p = NLMSGHDR.unpack_from(data, off)
        if mtype == NLMSG_ERROR:
            err = -struct.unpack_from("=i", data, off + NLMSGHDR.size)[0]
            if err:
                out.append(err)
        if length < NLMSGHDR.size:
            break
        off += _align(length)
    return out


def send_and_check(sock: socket.socket, messages: List[bytes]) -> None:
    """Send requests that ask for an ACK; raise on the first netlink error."""
    for m in messages:
        sock.send(m)
    for _ in messages:
        errors = netlink_errors(sock.recv(65536))
        if errors:
            raise OSError(errors[0], f"netlink request failed: {os.strerror(errors[0])}")


def socket_in_netns(pid: int, family: int = socket.AF_NETLINK
                    ) -> Tuple[socket.socket, Dict[str, int]]:
    """A NETLINK_ROUTE (or, with ``family=AF_PACKET``, a raw packet) socket living in the
    network namespace of process ``pid``, and the interface indexes of that namespace."""
    with in_netns(pid):
        if family == socket.AF_PACKET:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        else:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
            sock.bind((0, 0))
        index = {name: idx for idx, name in socket.if_nameindex()}
    return sock, index
