"""RoCEv2 RC RDMA WRITE packets: a RETH layer for Scapy, and templates patched in place.

Wire format (docs/REFERENCE.md, IBTA RoCEv2 annex A17):
Ethernet / IPv4 / UDP (dst 4791) / BTH (12 B) / [RETH 16 B] / payload / ICRC (4 B).

Scapy builds each template once (with its ICRC); the hot path then patches PSN, AckReq, the
probe header (send time, iteration, step) and the ICRC into a bytearray and hands the bytes to
a raw socket. The ICRC is a CRC-32 over a pseudo header whose variant fields are all ones; the
part that never changes for a template (8 x 0xFF, IPv4 and UDP headers, BTH bytes 0-7) is folded
into a precomputed CRC state, so each packet costs one ``zlib.crc32`` over BTH bytes 8.. and the
payload.
"""
from __future__ import annotations

import functools
import socket
import struct
import zlib
from dataclasses import dataclass
from typing import Dict, NamedTuple, Optional, Tuple

from scapy.contrib.roce import AETH, BTH, CNPPadding
from scapy.fields import IntField, XIntField, XLongField
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw, bind_layers

from testbed.base.frames import (BTH_LEN, ETH_LEN, ICRC_LEN, IP_LEN, RETH_LEN, ROCE_UDP_PORT,
                                 UDP_LEN, udp_frame_bytes)

# RC opcodes (IBTA vol. 1, table 35; docs/REFERENCE.md)
RC_RDMA_WRITE_FIRST = 0x06
RC_RDMA_WRITE_MIDDLE = 0x07
RC_RDMA_WRITE_LAST = 0x08
RC_RDMA_WRITE_ONLY = 0x0A
RC_RDMA_READ_REQUEST = 0x0C
RC_ACKNOWLEDGE = 0x11
CNP = 0x81
OPCODES_WITH_RETH = frozenset((RC_RDMA_WRITE_FIRST, RC_RDMA_WRITE_ONLY, RC_RDMA_READ_REQUEST))

DEFAULT_PKEY = 0xFFFF
# DSCP 26 (the usual RoCE class) with ECT(0): senders are ECN-capable (DCQCN).
ROCE_TOS = (26 << 2) | 0b10

BTH_OFFSET = udp_frame_bytes(0)  # 42, in a frame

SPORT_OFFSET = ETH_LEN + IP_LEN
PSN_MASK = 0xFFFFFF

# Probe header at the start of every RDMA payload: send time (CLOCK_REALTIME, ns),
# iteration, step. The receiver's one-way latency is its kernel RX time minus this send time.
PROBE = struct.Struct("!QII")
MIN_PAYLOAD = PROBE.size


class RETH(Packet):
    """RDMA Extended Transport Header (IBTA vol. 1, 9.3.3): on WRITE FIRST/ONLY, READ REQ."""

    name = "RETH"
    fields_desc = [
        XLongField("va", 0),  # virtual address
        XIntField("rkey", 0),  # remote key
        IntField("dlen", 0),  # DMA length (bytes of the whole message)
    ]


for _op in sorted(OPCODES_WITH_RETH):
    bind_layers(BTH, RETH, opcode=_op)


def opcodes_for(n_packets: int):
    """RDMA WRITE opcode of each packet of an ``n_packets`` message (FIRST..LAST or ONLY)."""
    if n_packets < 1:
        raise ValueError("a message has at least one packet")
    if n_packets == 1:
        return [RC_RDMA_WRITE_ONLY]
    return [RC_RDMA_WRITE_FIRST] + [RC_RDMA_WRITE_MIDDLE] * (n_packets - 2) + [RC_RDMA_WRITE_LAST]


def packet_payloads(message_bytes: int, mtu: int):
    """Payload length of each packet of a message at path MTU ``mtu`` (RDMA payload bytes)."""
    if message_bytes < 1:
        raise ValueError("message size must be positive")
    full, rest = divmod(message_bytes, mtu)
    sizes = [mtu] * full + ([rest] if rest else [])
    # Every packet carries the probe header; a tiny tail is padded up to it.
    return [max(s, MIN_PAYLOAD) for s in sizes]


@dataclass(frozen=True)
class Endpoint:
    """One side of a RoCE connection as seen on the wire."""

    mac: str
    ip: str


def scapy_packet(src: Endpoint, dst: Endpoint, sport: int, opcode: int, dqpn: int, psn: int,
                 payload: bytes, ackreq: bool = False, reth: Optional[Tuple[int, int, int]] = None,
                 tos: int = ROCE_TOS) -> Packet:
    """Build one RoCEv2 packet with Scapy (ICRC computed by ``BTH.post_build``)."""
    pkt = (Ether(src=src.mac, dst=dst.mac)
           / IP(src=src.ip, dst=dst.ip, tos=tos, ttl=64, id=0, flags="DF")
           / UDP(sport=sport, dport=ROCE_UDP_PORT, chksum=0)
           / BTH(opcode=opcode, pkey=DEFAULT_PKEY, dqpn=dqpn, ackreq=int(ackreq), psn=psn))
    if opcode in OPCODES_WITH_RETH:
        va, rkey, dlen = reth or (0, 0, len(payload))
        pkt = pkt / RETH(va=va, rkey=rkey, dlen=dlen)
    return pkt / Raw(payload)


class WriteTemplate:
    """One frame shape (opcode, payload length) of one connection, patched per packet."""

    __slots__ = ("buf", "view", "psn_off", "probe_off", "reth_off", "crc_from", "crc_end",
                 "crc_prefix", "icrc_off", "opcode")

    def __init__(self, frame: bytes, opcode: int):
        self.buf = bytearray(frame)
        self.view = memoryview(self.buf)
        self.opcode = opcode
        bth = BTH_OFFSET
        self.psn_off = bth + 8
        self.reth_off = bth + BTH_LEN if opcode in OPCODES_WITH_RETH else None
        self.probe_off = bth + BTH_LEN + (RETH_LEN if self.reth_off else 0)
        self.icrc_off = len(frame) - ICRC_LEN
        self.crc_from = self.psn_off
        self.crc_end = self.icrc_off
        self.crc_prefix = zlib.crc32(invariant_prefix(self.buf))

    def set_sport(self, sport: int) -> None:
        """Change the UDP source port (per-packet entropy): it is part of the ICRC's
        invariant header, so the precomputed CRC state is redone (about a microsecond)."""
        struct.pack_into("!H", self.buf, SPORT_OFFSET, sport)
        self.crc_prefix = zlib.crc32(invariant_prefix(self.buf))

    def fill(self, psn: int, ackreq: bool, tx_ns: int, iteration: int, step: int,
             va: int = 0, dlen: int = 0) -> bytearray:
        """Patch one packet into the template and return the frame (valid until next fill)."""
        buf = self.buf
        struct.pack_into("!I", buf, self.psn_off, (psn & PSN_MASK) | (0x80000000 if ackreq else 0))
        if self.reth_off is not None:
            struct.pack_into("!Q", buf, self.reth_off, va)
            struct.pack_into("!I", buf, self.reth_off + 12, dlen)
        PROBE.pack_into(buf, self.probe_off, tx_ns, iteration, step)
        crc = zlib.crc32(self.view[self.crc_from:self.crc_end], self.crc_prefix)
        struct.pack_into("<I", buf, self.icrc_off, crc)
        return buf


def ack_packet(src: Endpoint, dst: Endpoint, sport: int, dqpn: int, psn: int, syndrome: int,
               msn: int, tos: int = ROCE_TOS & 0xFC) -> Packet:
    """RC ACKNOWLEDGE (opcode 0x11) with an AETH: an ACK or a NAK (docs/REFERENCE.md)."""
    return (Ether(src=src.mac, dst=dst.mac)
            / IP(src=src.ip, dst=dst.ip, tos=tos, ttl=64, id=0, flags="DF")
            / UDP(sport=sport, dport=ROCE_UDP_PORT, chksum=0)
            / BTH(opcode=RC_ACKNOWLEDGE, pkey=DEFAULT_PKEY, dqpn=dqpn, psn=psn)
            / AETH(syndrome=syndrome, msn=msn))


def cnp_packet(src: Endpoint, dst: Endpoint, sport: int, dqpn: int, tos: int) -> Packet:
    """Congestion Notification Packet (opcode 0x81, BECN set, 16 reserved bytes)."""
    return (Ether(src=src.mac, dst=dst.mac)
            / IP(src=src.ip, dst=dst.ip, tos=tos, ttl=64, id=0, flags="DF")
            / UDP(sport=sport, dport=ROCE_UDP_PORT, chksum=0)
            / BTH(opcode=CNP, pkey=DEFAULT_PKEY, becn=1, dqpn=dqpn, psn=0) / CNPPadding())


class AckTemplate:
    """ACK/NAK frames of one connection, patched per packet (PSN, syndrome, MSN, ICRC)."""

    __slots__ = ("buf", "view", "crc_prefix")

    def __init__(self, frame: bytes):
        self.buf = bytearray(frame)
        self.view = memoryview(self.buf)
        self.crc_prefix = zlib.crc32(invariant_prefix(self.buf))

    def fill(self, psn: int, syndrome: int, msn: int) -> bytearray:
        buf = self.buf
        struct.pack_into("!II", buf, BTH_OFFSET + 8, psn & PSN_MASK,
                         (syndrome << 24) | (msn & PSN_MASK))
        crc = zlib.crc32(self.view[BTH_OFFSET + 8:len(buf) - ICRC_LEN], self.crc_prefix)
        struct.pack_into("<I", buf, len(buf) - ICRC_LEN, crc)
        return buf


def invariant_prefix(frame) -> bytes:
    """ICRC pseudo header up to (not including) BTH byte 8, variant fields set to ones.

    IBTA annex A17.4: 8 bytes of 0xFF stand in for the LRH; IPv4 TOS, TTL and header checksum,
    the UDP checksum and the BTH FECN/BECN/resv6 byte are replaced by all ones.
    """
    ip = bytearray(frame[ETH_LEN:ETH_LEN + IP_LEN])
    ip[1] = 0xFF  # TOS
    ip[8] = 0xFF  # TTL
    ip[10:12] = b"\xff\xff"  # header checksum
    udp = bytearray(frame[ETH_LEN + IP_LEN:BTH_OFFSET])
    udp[6:8] = b"\xff\xff"
    bth = bytearray(frame[BTH_OFFSET:BTH_OFFSET + 8])
    bth[4] = 0xFF
    return b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(bth)


def icrc(frame) -> int:
    """ICRC of a whole RoCEv2/IPv4 frame (as stored: the CRC value, not its byte order)."""
    body = bytes(frame[BTH_OFFSET + 8:len(frame) - ICRC_LEN])
    return zlib.crc32(body, zlib.crc32(invariant_prefix(frame)))


def icrc_ok(frame) -> bool:
    """True if the frame's trailing ICRC matches its contents."""
    return struct.unpack_from("<I", frame, len(frame) - ICRC_LEN)[0] == icrc(frame)


_PSEUDO_IP = struct.Struct("!BBHHHBBH4s4s")
_PSEUDO_UDP = struct.Struct("!HHHH")
_ADDRESS = functools.lru_cache(maxsize=1024)(socket.inet_aton)  # a run has few peers


def payload_icrc_ok(data, src_ip: str, dst_ip: str, sport: int) -> bool:
    """The ICRC check of a receiver that sees only the UDP payload (a UDP socket): the
    pseudo-header is rebuilt from the addresses, the lengths and what every RoCEv2 sender of
    this testbed puts in the variant-free IPv4 fields (ID 0, DF, UDP to 4791)."""
    n = len(data)
    if n < BTH_LEN + ICRC_LEN:
        return False
    crc = zlib.crc32(memoryview(data)[8:n - ICRC_LEN],
                     payload_prefix_crc(data, _ADDRESS(src_ip), _ADDRESS(dst_ip), sport))
    return _ICRC.unpack_from(data, n - ICRC_LEN)[0] == crc


def payload_prefix_crc(data, src_addr: bytes, dst_addr: bytes, sport: int) -> int:
    """CRC state of the ICRC pseudo-header up to BTH byte 8 of a UDP payload ``data``: the
    same for every packet of one QP with the same opcode and length (receivers cache it)."""
    n = len(data)
    ip = _PSEUDO_IP.pack(0x45, 0xFF, IP_LEN + UDP_LEN + n, 0, 0x4000, 0xFF, 17, 0xFFFF,
                         src_addr, dst_addr)
    udp = _PSEUDO_UDP.pack(sport, ROCE_UDP_PORT, UDP_LEN + n, 0xFFFF)
    view = memoryview(data)
    return zlib.crc32(b"\xff" * 8 + ip + udp + bytes(view[:4]) + b"\xff" + bytes(view[5:8]))


_ICRC = struct.Struct("<I")


class Connection:
    """Templates for one QP-to-QP connection (sender side); builds each shape once."""

    def __init__(self, src: Endpoint, dst: Endpoint, sport: int, dqpn: int,
                 tos: int = ROCE_TOS):
        self.src, self.dst, self.sport, self.dqpn, self.tos = src, dst, sport, dqpn, tos
        self._templates: Dict[Tuple[int, int], WriteTemplate] = {}

    def set_sport(self, sport: int) -> None:
        """A new flowlet: every frame from now on carries ``sport``."""
        self.sport = sport
        for tpl in self._templates.values():
            tpl.set_sport(sport)

    def template(self, opcode: int, payload_len: int) -> WriteTemplate:
        key = (opcode, payload_len)
        tpl = self._templates.get(key)
        if tpl is None:
            frame = readdress(_write_shape(opcode, payload_len, self.tos), self.src, self.dst,
                              self.sport, self.dqpn)
            tpl = self._templates[key] = WriteTemplate(bytes(frame), opcode)
        return tpl


# Scapy builds each frame shape once per process, between two placeholder endpoints;
# ``readdress`` turns it into any connection's frame (what Scapy would build for it).
_PLACEHOLDER = (Endpoint("02:00:00:00:00:01", "10.255.0.1"),
                Endpoint("02:00:00:00:00:02", "10.255.0.2"))


@functools.lru_cache(maxsize=None)
def _write_shape(opcode: int, payload_len: int, tos: int) -> bytes:
    return bytes(scapy_packet(*_PLACEHOLDER, 0xC000, opcode, 1, 0, bytes(payload_len),
                              tos=tos))


@functools.lru_cache(maxsize=None)
def _ack_shape(tos: int) -> bytes:
    return bytes(ack_packet(*_PLACEHOLDER, 0xC000, 1, 0, 0, 0, tos=tos))


@functools.lru_cache(maxsize=None)
def _cnp_shape(tos: int) -> bytes:
    return bytes(cnp_packet(*_PLACEHOLDER, 0xC000, 1, tos))


def ack_frame(src: Endpoint, dst: Endpoint, sport: int, dqpn: int, tos: int) -> bytes:
    """The bytes of ``ack_packet(src, dst, sport, dqpn, 0, 0, 0, tos)``, without Scapy."""
    return bytes(readdress(_ack_shape(tos), src, dst, sport, dqpn))


def cnp_frame(src: Endpoint, dst: Endpoint, sport: int, dqpn: int, tos: int) -> bytes:
    """The bytes of ``cnp_packet(src, dst, sport, dqpn, tos)``, without Scapy."""
    return bytes(readdress(_cnp_shape(tos), src, dst, sport, dqpn))


def readdress(frame: bytes, src: Endpoint, dst: Endpoint, sport: int, dqpn: int) -> bytearray:
    """``frame`` with new MAC and IPv4 addresses, UDP source port and destination QP: the
    IPv4 header checksum and the ICRC redone."""
    buf = bytearray(frame)
    buf[0:6] = bytes.fromhex(dst.mac.replace(":", ""))
    buf[6:12] = bytes.fromhex(src.mac.replace(":", ""))
    buf[ETH_LEN + 12:ETH_LEN + 16] = socket.inet_aton(src.ip)
    buf[ETH_LEN + 16:ETH_LEN + 20] = socket.inet_aton(dst.ip)
    buf[ETH_LEN + 10:ETH_LEN + 12] = b"\0\0"
    struct.pack_into("!H", buf, ETH_LEN + 10, ipv4_checksum(buf[ETH_LEN:ETH_LEN + IP_LEN]))
    struct.pack_into("!H", buf, SPORT_OFFSET, sport)
    buf[BTH_OFFSET + 5:BTH_OFFSET + 8] = (dqpn & PSN_MASK).to_bytes(3, "big")
    struct.pack_into("<I", buf, len(buf) - ICRC_LEN, icrc(buf))
    return buf


def ipv4_checksum(header) -> int:
    """RFC 791 header checksum (the checksum field itself zero)."""
    total = sum(struct.unpack(f"!{len(header) // 2}H", bytes(header)))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def udp_source_port(qpn: int) -> int:
    """UDP source port derived from the sending QP number, as RoCE NICs do for ECMP entropy.

    Kept in the 0xC000-0xFFFF range (the range rxe and ConnectX use); a multiplicative hash
    spreads consecutive QP numbers over it.
    """
    return 0xC000 | (((qpn * 0x9E3779B1) >> 16) & 0x3FFF)


def random_source_port(rng) -> int:
    """A UDP source port drawn from the range ``udp_source_port`` keeps to: a sprayed packet's
    or a new flowlet's entropy."""
    return 0xC000 | rng.getrandbits(14)


class Parsed(NamedTuple):
    """What a receiver needs from one RoCEv2 UDP payload (BTH onwards)."""

    opcode: int
    dqpn: int
    psn: int
    ackreq: bool
    tx_ns: int
    iteration: int
    step: int
    payload_len: int


def parse_udp_payload(data) -> Optional[Parsed]:
    """Parse a RoCEv2 UDP payload carrying a probe header; None if it is not one of ours."""
    n = len(data)
    if n < BTH_LEN + PROBE.size + ICRC_LEN:
        return None
    opcode = data[0]
    if opcode not in (RC_RDMA_WRITE_FIRST, RC_RDMA_WRITE_MIDDLE, RC_RDMA_WRITE_LAST,
                      RC_RDMA_WRITE_ONLY):
        return None
    off = BTH_LEN + (RETH_LEN if opcode in OPCODES_WITH_RETH else 0)
    if n < off + PROBE.size + ICRC_LEN:
        return None
    word = int.from_bytes(data[8:12], "big")
    tx_ns, iteration, step = PROBE.unpack_from(data, off)
    return Parsed(opcode, int.from_bytes(data[5:8], "big"), word & PSN_MASK,
                  bool(word >> 31), tx_ns, iteration, step, n - off - ICRC_LEN)
