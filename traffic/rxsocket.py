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
from typing import Tuple

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
SOL_IP_RECVERR = (0, 11)  # (SOL_IP, IP_RECVERR)
SOL_PACKET = 263
PACKET_TX_TIMESTAMP = 16
SCM_TIMESTAMPING = struct.Struct("@qqqqqq")
SOCK_EXTENDED_ERR = struct.Struct("@IBBBBII")  # errno, origin, type, code, pad, info, data
SO_EE_ORIGIN_TIMESTAMPING = 4


def open_tx(intf: str, sndbuf: int = 1 << 20) -> socket.socket:
    """A non-blocking AF_PACKET socket on ``intf`` that reports each frame's kernel transmit
    time; the agent itself keeps the NIC's queue short (``traffic.agent``)."""
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
