"""Kernel timestamps for the agent and the flow tool.

* Receive: a UDP socket whose every packet comes with its kernel receive time
  (``SO_TIMESTAMPNS``), its IP TOS byte (``IP_RECVTOS``: the ECN bits) and the socket's overflow
  count (``SO_RXQ_OVFL``).
* Send: an AF_PACKET socket with ``SO_TIMESTAMPING`` software TX timestamps, taken when the
  driver (veth) transmits the frame - after the NIC's shaped queue, i.e. when it leaves the
  host. Each send gets a key (``OPT_ID``: 0, 1, 2, ... per socket); the timestamps come back on
  the socket's error queue (``read_tx_timestamps``).
"""
from __future__ import annotations

import socket
import struct
from typing import List, Tuple

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SO_RXQ_OVFL = getattr(socket, "SO_RXQ_OVFL", 40)
RCVBUF_BYTES = 8 << 20
ANCILLARY_BYTES = 128
TIMESPEC = struct.Struct("@qq")
U32 = struct.Struct("@I")


def open_rx(ip: str, port: int) -> socket.socket:
    """A non-blocking UDP socket on ``ip:port`` that reports time, TOS and overflows."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
    rx.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    rx.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
    rx.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    rx.bind((ip, port))
    rx.setblocking(False)
    return rx


def ancillary(anc) -> Tuple[int, int, int]:
    """(kernel receive time in ns or 0, IP TOS byte, datagrams the socket dropped or -1)."""
    rx_ns = tos = 0
    dropped = -1
    for level, kind, value in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, nsec = TIMESPEC.unpack_from(value)
            rx_ns = sec * 1_000_000_000 + nsec
        elif level == socket.IPPROTO_IP and kind == socket.IP_TOS:
            tos = value[0]
        elif level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL:
            dropped = U32.unpack_from(value)[0]
    return rx_ns, tos, dropped


SO_TIMESTAMPING = getattr(socket, "SO_TIMESTAMPING", 37)
SOF_TIMESTAMPING_TX_SOFTWARE = 1 << 1
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
SOF_TIMESTAMPING_OPT_ID = 1 << 7
SOF_TIMESTAMPING_OPT_TSONLY = 1 << 11
SOL_PACKET = 263
PACKET_TX_TIMESTAMP = 16
SCM_TIMESTAMPING = struct.Struct("@qqqqqq")
SOCK_EXTENDED_ERR = struct.Struct("@IBBBBII")  # errno, origin, type, code, pad, info, data
SO_EE_ORIGIN_TIMESTAMPING = 4


def open_tx(intf: str, sndbuf: int = 1 << 20) -> socket.socket:
    """A non-blocking AF_PACKET socket on ``intf`` that reports each frame's kernel transmit
    time; the GPU's NIC path keeps its queue short (``traffic.rnic``)."""
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)  # protocol 0: send only
    tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    tx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)  # for the timestamps
    tx.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING,
                  SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE
                  | SOF_TIMESTAMPING_OPT_ID | SOF_TIMESTAMPING_OPT_TSONLY)
    tx.bind((intf, 0))
    tx.setblocking(False)
    return tx


def read_tx_timestamps(tx: socket.socket):
    """Yield (key, kernel transmit time in ns) for every timestamp waiting on ``tx``."""
    while True:
        try:
            _data, anc, _flags, _addr = tx.recvmsg(64, 256, socket.MSG_ERRQUEUE)
        except BlockingIOError:
            return
        ts = key = None
        for level, kind, value in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING:
                sec, nsec = SCM_TIMESTAMPING.unpack_from(value)[:2]
                ts = sec * 1_000_000_000 + nsec
            elif level == SOL_PACKET and kind == PACKET_TX_TIMESTAMP:
                err = SOCK_EXTENDED_ERR.unpack_from(value)
                if err[1] == SO_EE_ORIGIN_TIMESTAMPING:
                    key = err[6]
        if ts is not None and key is not None:
            yield key, ts


RX_TIMESTAMP_CMSG = (16 + TIMESPEC.size, socket.SOL_SOCKET, SO_TIMESTAMPNS)
RX_TOS_CMSG = (17, socket.IPPROTO_IP, socket.IP_TOS)
TX_TIMESTAMP_CMSG = (16 + SCM_TIMESTAMPING.size, socket.SOL_SOCKET, SO_TIMESTAMPING)
TX_ERROR_CMSG = (SOL_PACKET, PACKET_TX_TIMESTAMP)
# One datagram's control messages as the kernel lays them out in the usual case, in one go:
# receive: timestamp cmsg (16 + 16 bytes), TOS cmsg (its one byte); transmit timestamp: the
# SO_TIMESTAMPING cmsg (16 + 3 timespecs), the extended error's cmsg (its origin and key)
RX_USUAL = struct.Struct("=QIIqqQIIB")
RX_USUAL_HEADS = RX_TIMESTAMP_CMSG + RX_TOS_CMSG
TX_USUAL = struct.Struct("=QIIqq32x8xII4xB7xI")
TX_USUAL_HEADS = TX_TIMESTAMP_CMSG + TX_ERROR_CMSG + (SO_EE_ORIGIN_TIMESTAMPING,)


class RxBatch:
    """Batched receive on an ``open_rx`` socket: per datagram its data (a view, valid until
    the next ``read``), source port and address, kernel receive time, TOS and the socket's
    overflow count - what ``recvmsg`` and ``ancillary`` give, without their allocations."""

    def __init__(self, sock: socket.socket, count: int = 32, size: int = 9216):
        from .mmsg import Batch

        self.batch = Batch(sock.fileno(), count, size, ANCILLARY_BYTES)
        self.count = count

    def read(self) -> int:
        return self.batch.recv()

    def meta(self, i: int) -> Tuple[int, int, int]:
        """(kernel receive time in ns or 0, IP TOS byte, datagrams dropped or -1)."""
        view, at = self.batch.ctl_view, i * ANCILLARY_BYTES
        # the usual layout: the timestamp, then the TOS (the overflow count comes between
        # them only once the socket dropped something)
        l1, v1, t1, sec, nsec, l2, v2, t2, tos = RX_USUAL.unpack_from(view, at)
        if (l1, v1, t1, l2, v2, t2) == RX_USUAL_HEADS:
            return sec * 1_000_000_000 + nsec, tos, -1
        rx_ns = tos = 0
        dropped = -1
        for level, kind, at in self.batch.cmsgs(i):
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                sec, nsec = TIMESPEC.unpack_from(view, at)
                rx_ns = sec * 1_000_000_000 + nsec
            elif level == socket.IPPROTO_IP and kind == socket.IP_TOS:
                tos = view[at]
            elif level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL:
                dropped = U32.unpack_from(view, at)[0]
        return rx_ns, tos, dropped


class StampBatch:
    """Batched read of the transmit timestamps waiting on an ``open_tx`` socket's error
    queue: ``read`` yields (key, kernel transmit time in ns) - ``read_tx_timestamps`` with
    one system call per batch."""

    def __init__(self, sock: socket.socket, count: int = 64):
        from .mmsg import MSG_DONTWAIT, MSG_ERRQUEUE, Batch

        self.batch = Batch(sock.fileno(), count, 64, 256, name=False,
                           flags=MSG_ERRQUEUE | MSG_DONTWAIT)
        self.count = count

    def read(self) -> List[Tuple[int, int]]:
        """Every (key, kernel transmit time in ns) waiting now."""
        batch, view = self.batch, self.batch.ctl_view
        out = []
        while True:
            n = batch.recv()
            for i in range(n):
                at = i * 256
                # the usual layout: the timestamp (64 bytes), then the extended error
                l1, v1, t1, sec, nsec, v2, t2, origin, key = TX_USUAL.unpack_from(view, at)
                if (l1, v1, t1, v2, t2, origin) == TX_USUAL_HEADS:
                    out.append((key, sec * 1_000_000_000 + nsec))
                    continue
                ts = key = None
                for level, kind, at in batch.cmsgs(i):
                    if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING:
                        sec, nsec = TIMESPEC.unpack_from(view, at)
                        ts = sec * 1_000_000_000 + nsec
                    elif level == SOL_PACKET and kind == PACKET_TX_TIMESTAMP:
                        err = SOCK_EXTENDED_ERR.unpack_from(view, at)
                        if err[1] == SO_EE_ORIGIN_TIMESTAMPING:
                            key = err[6]
                if ts is not None and key is not None:
                    out.append((key, ts))
            if n < self.count:
                return out
