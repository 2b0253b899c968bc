"""The GPU NIC's system-call edge: RoCEv2 datagrams in (batched, parsed, ICRC checked),
frames out (a template patched and sent), kernel transmit timestamps in.

Every operation has a pure-Python implementation here; where the project's C extension
(``traffic/_nicio.c``, built by ``pip install``) is present, the same operations run in C
with the same results (``tests/unit/test_nicio.py`` runs both). The agent's transport logic
only ever sees what these return.

``Receiver.read`` gives, per datagram, the tuple
``(status, rx_ns, tos, dropped, addr, sport, opcode, dqpn, word, a, b, c, d, size)``:
``status`` OK, SHORT (no room for BTH and ICRC) or BAD_ICRC; the kernel receive time (0
without one), the IP TOS byte, the socket's overflow count (-1: none reported); the source
IPv4 address (an integer) and UDP port; the BTH opcode, destination QP and its third word
(AckReq and PSN); for an RDMA WRITE ``a, b, c`` = the probe's send time, iteration and step
and ``d`` = the payload length (below 16: no probe); for an ACK ``a, b`` = the AETH syndrome
and MSN (``a`` = -1: no AETH); the datagram's size.
"""
from __future__ import annotations

import socket
import struct
import zlib
from typing import Callable, List, Tuple

from . import roce
from .mmsg import MMSGHDR_SIZE, OFF_LEN
from .rxsocket import ANCILLARY_BYTES, RxBatch, StampBatch

try:
    from . import _nicio
except ImportError:  # not built: the pure-Python implementations below
    _nicio = None

OK, SHORT, BAD_ICRC = 0, 1, 2
BATCH = 32
BTH = struct.Struct("!BxxxII")
SOURCE = struct.Struct("!HI")
MSG_LEN = struct.Struct("=I")
ICRC = struct.Struct("<I")
WRITES_WITH_RETH = frozenset((roce.RC_RDMA_WRITE_FIRST, roce.RC_RDMA_WRITE_ONLY))
WRITES = WRITES_WITH_RETH | {roce.RC_RDMA_WRITE_MIDDLE, roce.RC_RDMA_WRITE_LAST}
STAMP_CTL = 256


def accelerated() -> bool:
    """Whether the C implementation is in use."""
    return _nicio is not None


class Receiver:
    """Batched receive on an ``rxsocket.open_rx`` socket bound to ``my_ip``."""

    def __init__(self, sock: socket.socket, my_ip: str, use_c: bool = True):
        self.sock, self.fd = sock, sock.fileno()
        self.addr = int.from_bytes(socket.inet_aton(my_ip), "big")
        self.addr_bytes = socket.inet_aton(my_ip)
        self.c = _nicio if use_c else None
        if self.c is not None:
            self.data = bytearray(BATCH * 9216)
            self.ctl = bytearray(BATCH * ANCILLARY_BYTES)
            self.names = bytearray(BATCH * 16)
        else:
            self.batch = RxBatch(sock, BATCH)
        self.prefixes = {}  # ICRC pseudo-header CRC per packet shape (pure Python)

    def deliver(self, fast: tuple, handler: Callable[..., None]) -> None:
        """Every datagram waiting, in arrival order, to ``handler(*tuple)`` - except, with
        the C implementation, the agent's common case: ``fast`` = (QPs by number, ranks by
        address, the packet records, rank, iterations, probe clock slack ns); an in-order
        data packet of a message that needs no answer is delivered to its QP's responder and
        recorded right where it is parsed (``_nicio.receive_fast``)."""
        if self.c is None:
            for t in self.read():
                handler(*t)
            return
        while self.c.receive_fast(self.fd, self.data, self.ctl, self.names, BATCH, 9216,
                                  self.addr, *fast, handler) == BATCH:
            pass

    def deliver_parsed(self, datagrams: List[tuple], fast: tuple,
                       handler: Callable[..., None]) -> None:
        """``deliver`` for datagrams ``read`` earlier (``traffic.delayline`` held them): each
        in order to ``handler(*tuple)``, the agent's common case the fast way in C."""
        if self.c is None:
            for t in datagrams:
                handler(*t)
            return
        self.c.deliver_parsed(datagrams, *fast, handler)

    def read(self) -> List[tuple]:
        """Every datagram waiting (in batches of ``BATCH``), parsed."""
        if self.c is not None:
            out = self.c.receive(self.fd, self.data, self.ctl, self.names, BATCH, 9216,
                                 self.addr)
            while len(out) % BATCH == 0 and out:
                more = self.c.receive(self.fd, self.data, self.ctl, self.names, BATCH, 9216,
                                      self.addr)
                out += more
                if len(more) < BATCH:
                    break
            return out
        out = []
        while True:
            n = self.batch.read()
            out += [self._parse(i) for i in range(n)]
            if n < BATCH:
                return out

    def _parse(self, i: int) -> tuple:
        raw = self.batch.batch
        size = MSG_LEN.unpack_from(raw.raw, i * MMSGHDR_SIZE + OFF_LEN)[0]
        at = i * raw.size
        data = raw.data_view[at:at + size]
        rx_ns, tos, dropped = self.batch.meta(i)
        sport, addr = SOURCE.unpack_from(raw.names_view, i * 16 + 2)
        if size < roce.BTH_LEN + roce.ICRC_LEN:
            return (SHORT, rx_ns, tos, dropped, addr, sport, 0, 0, 0, 0, 0, 0, 0, size)
        opcode, dqpn, word = BTH.unpack_from(data)
        dqpn &= roce.PSN_MASK
        key = (addr, sport, size, opcode)
        prefix = self.prefixes.get(key)
        if prefix is None:
            if len(self.prefixes) > 4096:  # foreign traffic with ever new ports
                self.prefixes.clear()
            prefix = self.prefixes[key] = roce.payload_prefix_crc(
                data, addr.to_bytes(4, "big"), self.addr_bytes, sport)
        if zlib.crc32(data[8:size - 4], prefix) != ICRC.unpack_from(data, size - 4)[0]:
            return (BAD_ICRC, rx_ns, tos, dropped, addr, sport, opcode, dqpn, word, 0, 0, 0, 0,
                    size)
        a = b = c = d = 0
        if opcode == roce.RC_ACKNOWLEDGE:
            if size >= roce.BTH_LEN + 4 + roce.ICRC_LEN:
                a, b = data[12], int.from_bytes(data[13:16], "big")
            else:
                a = -1
        elif opcode in WRITES:
            off = roce.BTH_LEN + (roce.RETH_LEN if opcode in WRITES_WITH_RETH else 0)
            d = size - off - roce.ICRC_LEN
            if d >= roce.PROBE.size:
                a, b, c = roce.PROBE.unpack_from(data, off)
        return (OK, rx_ns, tos, dropped, addr, sport, opcode, dqpn, word, a, b, c, d, size)


class Sender:
    """RDMA WRITE templates out of an ``rxsocket.open_tx`` socket."""

    def __init__(self, sock: socket.socket, use_c: bool = True):
        self.sock, self.fd = sock, sock.fileno()
        self.c = _nicio if use_c else None

    def send(self, tpl: roce.WriteTemplate, psn: int, ackreq: bool, tx_ns: int, iteration: int,
             step: int, va: int = 0, dlen: int = 0) -> int:
        """Patch ``tpl`` (as ``WriteTemplate.fill``) and send it; the frame's size, or 0 when
        the socket would block."""
        if self.c is not None:
            return self.c.fill_send(
                self.fd, tpl.buf, tpl.psn_off,
                (psn & roce.PSN_MASK) | (0x80000000 if ackreq else 0),
                -1 if tpl.reth_off is None else tpl.reth_off, va, dlen, tpl.probe_off,
                tx_ns, iteration, step, tpl.crc_from, tpl.crc_end, tpl.crc_prefix, tpl.icrc_off)
        frame = tpl.fill(psn, ackreq, tx_ns, iteration, step, va, dlen)
        try:
            return self.sock.send(frame)
        except BlockingIOError:
            return 0


class Stamps:
    """The kernel transmit timestamps waiting on an ``rxsocket.open_tx`` socket."""

    def __init__(self, sock: socket.socket, use_c: bool = True):
        self.fd = sock.fileno()
        self.c = _nicio if use_c else None
        if self.c is not None:
            self.ctl = bytearray(64 * STAMP_CTL)
        else:
            self.batch = StampBatch(sock)

    def read(self) -> List[Tuple[int, int]]:
        """Every (key, kernel transmit time in ns) waiting now."""
        if self.c is not None:
            return self.c.stamps(self.fd, self.ctl, 64)
        return self.batch.read()

    def join(self, pending: dict, log: list) -> Tuple[int, int, int]:
        """Each waiting stamp's frame, popped from ``pending`` {key: (sent ns, bytes, kind)},
        appended to ``log`` as (sent ns, kernel transmit ns, bytes, kind). Returns (stamps
        read, the last joined frame's kernel time or -1, its bytes)."""
        if self.c is not None:
            return self.c.stamps_join(self.fd, self.ctl, 64, pending, log)
        n, last, size = 0, -1, 0
        for key, ts in self.read():
            n += 1
            sent = pending.pop(key, None)
            if sent is not None:
                log.append((sent[0], ts, sent[1], sent[2]))
                last, size = ts, sent[1]
        return n, last, size

