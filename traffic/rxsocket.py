"""The receive side shared by the agent and the flow tool: a UDP socket whose every packet
comes with its kernel receive time (``SO_TIMESTAMPNS``), its IP TOS byte (``IP_RECVTOS``: the
ECN bits) and the socket's overflow count (``SO_RXQ_OVFL``)."""
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
