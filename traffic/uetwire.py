"""UET frames at packet rate: a data frame patched in place per packet, ACK_CC and NACK frames,
and the parse of a received datagram - the bytes ``traffic.uet``'s Scapy layers build and
read (tests/unit/test_uetwire.py), without Scapy on the hot path.

A data frame: Ethernet / IPv4 / UDP (the entropy value in the source port, checksum 0) / PDS
request (12 B) / SES standard request (44 B) / payload, whose first 16 bytes are the probe
(``roce.PROBE``: send time, iteration, step) that one-way latency is measured from.
"""
from __future__ import annotations

import socket
import struct
from typing import NamedTuple, Optional, Sequence

from testbed.base.frames import ETH_LEN, IP_LEN, PDS_REQUEST_LEN, SES_REQUEST_LEN, UDP_LEN

from .roce import PROBE, Endpoint, ipv4_checksum
from .uet import (ACK_CC, ECN_MARKED, EOM, NACK, NH_NONE, NH_REQ_STD, PSN_OFFSET_MASK, RUD_REQ,
                  SOM, SYN, UET_UDP_PORT, UET_WRITE)

UDP_OFF = ETH_LEN + IP_LEN
PDS_OFF = UDP_OFF + UDP_LEN
SES_OFF = PDS_OFF + PDS_REQUEST_LEN
PAYLOAD_OFF = SES_OFF + SES_REQUEST_LEN
# the PDS request: prologue word, clear-PSN offset, PSN, source PDC id, destination PDC id (or
# on SYN the mode bit and the PSN's offset from the start PSN)
REQUEST = struct.Struct("!HhIHH")
# the SES request: opcode, version and flags, message id, index generation and job id,
# PID on FEP, resource index, buffer offset, initiator, match bits
SES_HEAD = struct.Struct("!BBHIHHQIQ")
SES_TAIL_SOM = struct.Struct("!QI")  # header data, request length
SES_TAIL = struct.Struct("!III")  # reserved and payload length, message offset, request length
# ACK_CC: prologue, ACK-PSN offset, cumulative PSN, PDC ids; CC type and flags, maximum PSN
# range, SACK offset, SACK bitmap, service time, restore-cwnd and penalty, received bytes (24
# bits: 8 + 16), out-of-order count
ACK_CC_BODY = struct.Struct("!HhIHHBBhQHBBHH")
# NACK: prologue, code, vendor code, NACKed PSN, PDC ids, the largest PSN received plus one
NACK_BODY = struct.Struct("!HBBIHHI")


def _prologue(kind: int, next_hdr: int, flags: int) -> int:
    return kind << 11 | next_hdr << 7 | flags


def _headers(src: Endpoint, dst: Endpoint, entropy: int, tos: int, udp_payload: int) -> bytearray:
    """Ethernet, IPv4 (checksum done) and UDP headers for ``udp_payload`` bytes after UDP."""
    buf = bytearray(UDP_OFF + UDP_LEN)
    buf[0:6] = bytes.fromhex(dst.mac.replace(":", ""))
    buf[6:12] = bytes.fromhex(src.mac.replace(":", ""))
    buf[12:14] = b"\x08\x00"
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, tos, IP_LEN + UDP_LEN + udp_payload, 1, 0, 64, 17,
                     0, socket.inet_aton(src.ip), socket.inet_aton(dst.ip))
    buf[ETH_LEN:UDP_OFF] = ip
    struct.pack_into("!H", buf, ETH_LEN + 10, ipv4_checksum(ip))
    struct.pack_into("!HHHH", buf, UDP_OFF, entropy, UET_UDP_PORT, UDP_LEN + udp_payload, 0)
    return buf


class DataTemplate:
    """The data frames of one shape (first packet of a message or not, payload length) from
    one PDC to another; ``fill`` patches a packet's fields in place and returns the frame."""

    def __init__(self, src: Endpoint, dst: Endpoint, spdcid: int, dpdcid: int, som: bool,
                 payload: int, tos: int):
        self.spdcid, self.dpdcid, self.som = spdcid, dpdcid, som
        self.buf = _headers(src, dst, 0, tos, PDS_REQUEST_LEN + SES_REQUEST_LEN + payload) \
            + bytearray(PDS_REQUEST_LEN + SES_REQUEST_LEN + payload)
        self.probe = payload >= PROBE.size

    def fill(self, entropy: int, psn: int, flags: int, clear_psn: int, start_psn: int,
             message_id: int, offset: int, length: int, eom: bool, va: int, tx_ns: int,
             iteration: int, step: int) -> bytearray:
        """The frame of PSN ``psn`` (``flags``: SYN, AR, RETX): ``offset`` into a message of
        ``length`` bytes written at remote address ``va``; the probe's fields."""
        buf = self.buf
        struct.pack_into("!H", buf, UDP_OFF, entropy)
        last = (psn - start_psn) & PSN_OFFSET_MASK if flags & SYN else self.dpdcid
        REQUEST.pack_into(buf, PDS_OFF, _prologue(RUD_REQ, NH_REQ_STD, flags),
                          _offset16(clear_psn - psn), psn & 0xFFFFFFFF, self.spdcid, last)
        ses_flags = (SOM if self.som else 0) | (EOM if eom else 0)
        SES_HEAD.pack_into(buf, SES_OFF, UET_WRITE, ses_flags, message_id & 0xFFFF, 0, 0, 0,
                           va + offset, 0, 0)
        tail = SES_OFF + SES_HEAD.size
        if self.som:
            SES_TAIL_SOM.pack_into(buf, tail, 0, length)
        else:
            payload = len(buf) - PAYLOAD_OFF
            SES_TAIL.pack_into(buf, tail, payload & 0x3FFF, offset, length)
        if self.probe:
            PROBE.pack_into(buf, PAYLOAD_OFF, tx_ns, iteration, step)
        return buf


def _offset16(d: int) -> int:
    """A PSN difference as the headers' signed 16-bit offset (clamped)."""
    return max(-0x8000, min(0x7FFF, d))


def ack_cc_frame(src: Endpoint, dst: Endpoint, entropy: int, spdcid: int, dpdcid: int,
                 cack_psn: int, ack_psn: int, sack_base: int, bitmap: int, marked: bool,
                 received_bytes: int, tos: int) -> bytes:
    """An ACK_CC: every PSN up to ``cack_psn`` received, bit k of ``bitmap`` the PSN
    ``sack_base + k``; ``marked``: the packet ``ack_psn`` came CE-marked."""
    body = ACK_CC_BODY.pack(
        _prologue(ACK_CC, NH_NONE, ECN_MARKED if marked else 0),
        _offset16(ack_psn - cack_psn), cack_psn & 0xFFFFFFFF, spdcid, dpdcid,
        0, 0, _offset16(sack_base - cack_psn), bitmap, 0, 0, (received_bytes >> 16) & 0xFF,
        received_bytes & 0xFFFF, 0)
    return bytes(_headers(src, dst, entropy, tos, len(body)) + body)


def nack_frame(src: Endpoint, dst: Endpoint, entropy: int, spdcid: int, dpdcid: int, code: int,
               psn: int, expected: int, tos: int) -> bytes:
    body = NACK_BODY.pack(_prologue(NACK, NH_NONE, 0), code, 0, psn & 0xFFFFFFFF, spdcid,
                          dpdcid, expected & 0xFFFFFFFF)
    return bytes(_headers(src, dst, entropy, tos, len(body)) + body)


class Data(NamedTuple):
    psn: int
    flags: int
    spdcid: int
    dpdcid: Optional[int]  # None on SYN
    syn_offset: Optional[int]
    clear_psn: int
    som: bool
    eom: bool
    message_id: int
    buffer_offset: int
    message_offset: int
    request_length: int
    payload: int  # bytes after the headers (0: trimmed, or an empty write)
    tx_ns: int  # the probe's fields (0 without a probe)
    iteration: int
    step: int


class Ack(NamedTuple):
    cack_psn: int
    ack_psn: int
    sack_base: int
    bitmap: int
    marked: bool
    received_bytes: int
    spdcid: int
    dpdcid: int


class Nack(NamedTuple):
    code: int
    psn: int
    expected: int
    spdcid: int
    dpdcid: int


def parse(data: Sequence[int]):
    """A UDP payload on port 4793 as ``Data``, ``Ack`` or ``Nack`` (None: not one, or short)."""
    if len(data) < 2:
        return None
    word = data[0] << 8 | data[1]
    kind, flags = word >> 11, word & 0x7F
    if kind == RUD_REQ and len(data) >= PDS_REQUEST_LEN + SES_REQUEST_LEN:
        _w, clear, psn, spdcid, last = REQUEST.unpack_from(data, 0)
        syn = bool(flags & SYN)
        s = PDS_REQUEST_LEN
        _op, ses_flags, mid, _j, _p, _r, boff, _i, _m = SES_HEAD.unpack_from(data, s)
        tail = s + SES_HEAD.size
        som = bool(ses_flags & SOM)
        if som:
            _hd, length = SES_TAIL_SOM.unpack_from(data, tail)
            moffset = 0
        else:
            _len, moffset, length = SES_TAIL.unpack_from(data, tail)
        payload = len(data) - PDS_REQUEST_LEN - SES_REQUEST_LEN
        tx_ns = it = step = 0
        if payload >= PROBE.size:
            tx_ns, it, step = PROBE.unpack_from(data, PDS_REQUEST_LEN + SES_REQUEST_LEN)
        return Data(psn, flags, spdcid, None if syn else last,
                    (last & PSN_OFFSET_MASK) if syn else None, (psn + clear) & 0xFFFFFFFF,
                    som, bool(ses_flags & EOM), mid, boff, moffset, length, payload, tx_ns, it,
                    step)
    if kind == ACK_CC and len(data) >= ACK_CC_BODY.size:
        (_w, ack_off, cack, spdcid, dpdcid, _t, _mpr, sack_off, bitmap, _st, _pen, rb_hi,
         rb_lo, _ooo) = ACK_CC_BODY.unpack_from(data, 0)
        return Ack(cack, (cack + ack_off) & 0xFFFFFFFF, (cack + sack_off) & 0xFFFFFFFF, bitmap,
                   bool(flags & ECN_MARKED), rb_hi << 16 | rb_lo, spdcid, dpdcid)
    if kind == NACK and len(data) >= NACK_BODY.size:
        _w, code, _v, psn, spdcid, dpdcid, expected = NACK_BODY.unpack_from(data, 0)
        return Nack(code, psn, expected, spdcid, dpdcid)
    return None

