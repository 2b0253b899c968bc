"""Ultra Ethernet Transport (UE Spec 1.0) packets: Scapy layers of the packet delivery
sublayer (PDS) and the semantic sublayer's standard request header (SES), and builders.

Wire format (docs/REFERENCE.md, "Ultra Ethernet Transport on the wire"): Ethernet / IPv4 /
UDP (dst 4793; the entropy value in the source port) / PDS header / [SES header] / payload.
No ICRC: UET relies on the Ethernet FCS.

- PDS prologue, 2 B: type (5 bits), next header or control type (4), flags (7).
- RUD or ROD request, 12 B with the prologue: clear-PSN offset (signed 16, from the PSN),
  PSN (32), source PDC id (16), destination PDC id (16) - or, on the SYN packet that opens an
  ephemeral PDC, the PDC mode bit, 3 reserved bits and the PSN's offset from the PDC's start
  PSN (12).
- ACK, 12 B: ACK-PSN offset (signed 16, from the cumulative PSN), cumulative PSN (32), source
  and destination PDC ids. ACK_CC adds 20 B: CC type (4 bits), 4 reserved, the maximum PSN
  range (8), the SACK offset (16: the SACK bitmap's base PSN from the cumulative PSN), the
  64-bit SACK bitmap, 8 B of CC state (NSCC: service time 16, restore-cwnd bit and cwnd
  penalty 7, received bytes 24, out-of-order count 16).
- NACK, 16 B: code (8), vendor code (8), the NACKed PSN (32), PDC ids, the largest PSN
  received plus one (32).
- SES standard request, 44 B (next header 3): opcode (6 bits), flags (version 2, DC, IE, REL,
  HD, EOM, SOM), message id, index generation, job id (24), PID on FEP (12), resource index
  (12), buffer offset (64), initiator (32), memory key or match bits (64), then header data
  (64) on the first packet of a message (SOM) or the payload length (14) and the message
  offset (32) on the others, and the request length (32).
Field layouts as UE Spec 1.0.1 and Wireshark's dissector (epan/dissectors/packet-uet.c).
"""
from __future__ import annotations

from scapy.fields import (BitEnumField, BitField, ByteEnumField, ByteField, ConditionalField,
                          FlagsField, IntField, LongField, ShortField, SignedShortField,
                          X3BytesField, XLongField)
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw, bind_layers

from testbed.base.frames import UET_UDP_PORT

# PDS types (UE Spec 1.0 table 3-21)
RUD_REQ, ROD_REQ, ACK, ACK_CC, ACK_CCX, NACK, CTRL = 2, 3, 7, 8, 9, 10, 11
PDS_TYPES = {2: "RUD_REQ", 3: "ROD_REQ", 4: "RUDI_REQ", 5: "RUDI_RESP", 6: "UUD_REQ",
             7: "ACK", 8: "ACK_CC", 9: "ACK_CCX", 10: "NACK", 11: "CTRL", 12: "NACK_CCX",
             13: "RUD_CC_REQ", 14: "ROD_CC_REQ"}
REQUESTS = (RUD_REQ, ROD_REQ)
ACKS = (ACK, ACK_CC)

# the flags' bits (the prologue's low 7 bits); which ones a type has
RETX, AR, SYN = 0x10, 0x08, 0x04  # requests: retransmission, ACK request, opens a PDC
ECN_MARKED, PROBE = 0x20, 0x08  # ACKs (M, P; RETX too), NACKs (M; RETX)
FLAG_NAMES = ["r0", "r1", "SYN", "AR", "RETX", "M", "r6"]  # bit 0 first; AR is P on an ACK

# next header: the SES header behind a PDS request or ACK
NH_NONE, NH_REQ_STD = 0, 3
# SES opcodes (table 3-4)
UET_WRITE = 0x01
SES_OPCODES = {0x00: "NO_OP", 0x01: "WRITE", 0x02: "READ", 0x05: "SEND"}
SOM, EOM = 0x01, 0x02  # SES flags: start and end of message
SES_FLAG_NAMES = ["SOM", "EOM", "HD", "REL", "IE", "DC"]

# NACK codes (table 3-27)
NACK_TRIMMED, NACK_TRIMMED_LASTHOP, NACK_TRIMMED_ACK = 0x01, 0x02, 0x03
NACK_PSN_OUT_OF_WINDOW, NACK_ROD_OUT_OF_ORDER, NACK_INFERRED_LOSS = 0x0B, 0x0D, 0x1A
NACK_CODES = {0x01: "TRIMMED", 0x02: "TRIMMED_LASTHOP", 0x03: "TRIMMED_ACK",
              0x04: "NO_PDC_AVAIL", 0x07: "NO_PKT_BUFFER", 0x0B: "PSN_OOR_WINDOW",
              0x0D: "ROD_OOO", 0x0E: "INV_DPDCID", 0x15: "INVALID_SYN",
              0x16: "PDC_MODE_MISMATCH", 0x1A: "RCVR_INFER_LOSS"}

CC_NSCC, CC_CREDIT = 0, 1
PSN_OFFSET_MASK = 0x0FFF  # a SYN packet's PSN offset from the PDC's start PSN


class PDS(Packet):
    """The PDS prologue: type, next header (or a control packet's type) and flags."""

    name = "UET PDS"
    fields_desc = [BitEnumField("type", RUD_REQ, 5, PDS_TYPES),
                   BitField("next_hdr", NH_NONE, 4),
                   FlagsField("flags", 0, 7, FLAG_NAMES)]

    def guess_payload_class(self, payload):
        if self.type in REQUESTS:
            return PDSRequest
        if self.type in ACKS:
            return PDSAck
        if self.type == NACK:
            return PDSNack
        return Raw


def _syn(pkt) -> bool:
    pds = pkt.underlayer
    return bool(pds is not None and int(pds.flags) & SYN)


class PDSRequest(Packet):
    """A RUD or ROD request: PSNs and PDC ids; a SYN packet carries the PDC mode and its PSN's
    offset from the start PSN where the destination PDC id would be."""

    name = "UET PDS request"
    fields_desc = [SignedShortField("clear_psn_offset", 0),
                   IntField("psn", 0),
                   ShortField("spdcid", 0),
                   ConditionalField(ShortField("dpdcid", 0), lambda p: not _syn(p)),
                   ConditionalField(BitField("use_reserved_pdc", 0, 1), _syn),
                   ConditionalField(BitField("mode_reserved", 0, 3), _syn),
                   ConditionalField(BitField("psn_offset", 0, 12), _syn)]

    def guess_payload_class(self, payload):
        pds = self.underlayer
        return SESRequest if pds is not None and pds.next_hdr == NH_REQ_STD else Raw

    @property
    def clear_psn(self) -> int:
        return (self.psn + self.clear_psn_offset) & 0xFFFFFFFF


class PDSAck(Packet):
    """An ACK: the cumulative PSN (every PSN up to it arrived), the PSN this ACK answers as an
    offset from it, the PDC ids; ACK_CC adds the SACK bitmap and NSCC's state."""

    name = "UET PDS ACK"
    fields_desc = [SignedShortField("ack_psn_offset", 0),
                   IntField("cack_psn", 0),
                   ShortField("spdcid", 0),
                   ShortField("dpdcid", 0)]

    def guess_payload_class(self, payload):
        pds = self.underlayer
        return AckCC if pds is not None and pds.type == ACK_CC else Raw

    @property
    def ack_psn(self) -> int:
        return (self.cack_psn + self.ack_psn_offset) & 0xFFFFFFFF


class AckCC(Packet):
    """ACK_CC's extension: selective acknowledgement and the receiver's congestion state
    (NSCC)."""

    name = "UET ACK CC"
    fields_desc = [BitField("cc_type", CC_NSCC, 4),
                   BitField("cc_flags", 0, 4),
                   ByteField("mpr", 0),
                   SignedShortField("sack_offset", 0),
                   XLongField("sack_bitmap", 0),
                   ShortField("service_time", 0),
                   BitField("restore_cwnd", 0, 1),
                   BitField("cwnd_penalty", 0, 7),
                   X3BytesField("received_bytes", 0),
                   ShortField("out_of_order", 0)]

    def sacked(self, cack_psn: int):
        """The PSNs the bitmap says arrived: bit k is PSN (cumulative PSN + SACK offset + k)."""
        base = cack_psn + self.sack_offset
        return [(base + k) & 0xFFFFFFFF for k in range(64) if self.sack_bitmap >> k & 1]


class PDSNack(Packet):
    """A NACK: why (TRIMMED: a switch cut the packet to its headers), which PSN, and the
    receiver's largest PSN plus one."""

    name = "UET PDS NACK"
    fields_desc = [ByteEnumField("code", NACK_TRIMMED, NACK_CODES),
                   ByteField("vendor_code", 0),
                   IntField("nack_psn", 0),
                   ShortField("spdcid", 0),
                   ShortField("dpdcid", 0),
                   IntField("max_psn_plus_1", 0)]


class SESRequest(Packet):
    """The semantic sublayer's standard request header (an RMA write's on every packet)."""

    name = "UET SES request"
    fields_desc = [BitField("ses_reserved", 0, 2),
                   BitEnumField("opcode", UET_WRITE, 6, SES_OPCODES),
                   BitField("version", 0, 2),
                   FlagsField("ses_flags", 0, 6, SES_FLAG_NAMES),
                   ShortField("message_id", 0),
                   ByteField("index_generation", 0),
                   X3BytesField("job_id", 0),
                   BitField("pid_reserved", 0, 4),
                   BitField("pid_on_fep", 0, 12),
                   BitField("ri_reserved", 0, 4),
                   BitField("resource_index", 0, 12),
                   LongField("buffer_offset", 0),
                   IntField("initiator", 0),
                   XLongField("match_bits", 0),
                   ConditionalField(XLongField("header_data", 0),
                                    lambda p: int(p.ses_flags) & SOM),
                   ConditionalField(BitField("length_reserved", 0, 18),
                                    lambda p: not int(p.ses_flags) & SOM),
                   ConditionalField(BitField("payload_length", 0, 14),
                                    lambda p: not int(p.ses_flags) & SOM),
                   ConditionalField(IntField("message_offset", 0),
                                    lambda p: not int(p.ses_flags) & SOM),
                   IntField("request_length", 0)]


bind_layers(UDP, PDS, dport=UET_UDP_PORT)


def rud_write(src_mac: str, dst_mac: str, src_ip: str, dst_ip: str, entropy: int, psn: int,
              spdcid: int, dpdcid: int, message_id: int, offset: int, length: int,
              payload: bytes, flags: int = 0, start_psn: int = 0, tos: int = 0) -> Packet:
    """One packet of an RMA write over RUD: ``offset`` into a message of ``length`` bytes
    (the first packet carries SOM, the last EOM); ``flags`` may hold SYN (then ``start_psn``
    is the new PDC's first PSN and ``dpdcid`` is not sent), AR and RETX."""
    som, eom = offset == 0, offset + len(payload) >= length
    pds = PDS(type=RUD_REQ, next_hdr=NH_REQ_STD, flags=flags)
    if flags & SYN:
        req = PDSRequest(psn=psn, spdcid=spdcid, psn_offset=(psn - start_psn) & PSN_OFFSET_MASK)
    else:
        req = PDSRequest(psn=psn, spdcid=spdcid, dpdcid=dpdcid)
    ses = SESRequest(opcode=UET_WRITE, ses_flags=(SOM if som else 0) | (EOM if eom else 0),
                     message_id=message_id, buffer_offset=offset, request_length=length)
    if not som:
        ses.payload_length, ses.message_offset = len(payload), offset
    return (Ether(src=src_mac, dst=dst_mac) / IP(src=src_ip, dst=dst_ip, tos=tos)
            / UDP(sport=entropy, dport=UET_UDP_PORT, chksum=0) / pds / req / ses / Raw(payload))


def ack_cc(src_mac: str, dst_mac: str, src_ip: str, dst_ip: str, entropy: int, cack_psn: int,
           ack_psn: int, spdcid: int, dpdcid: int, sacked=(), service_time: int = 0,
           received_bytes: int = 0, marked: bool = False, tos: int = 0) -> Packet:
    """An ACK_CC: every PSN up to ``cack_psn`` arrived, and those in ``sacked`` (within 64
    after it) too; ``marked``: the packet it answers was CE-marked."""
    bitmap = 0
    for p in sacked:
        k = (p - cack_psn - 1) & 0xFFFFFFFF
        if k >= 64:
            raise ValueError(f"PSN {p} is outside the SACK bitmap after {cack_psn}")
        bitmap |= 1 << k
    return (Ether(src=src_mac, dst=dst_mac) / IP(src=src_ip, dst=dst_ip, tos=tos)
            / UDP(sport=entropy, dport=UET_UDP_PORT, chksum=0)
            / PDS(type=ACK_CC, flags=ECN_MARKED if marked else 0)
            / PDSAck(ack_psn_offset=ack_psn - cack_psn, cack_psn=cack_psn, spdcid=spdcid,
                     dpdcid=dpdcid)
            / AckCC(sack_offset=1, sack_bitmap=bitmap, service_time=service_time,
                    received_bytes=received_bytes))


def nack(src_mac: str, dst_mac: str, src_ip: str, dst_ip: str, entropy: int, code: int,
         psn: int, spdcid: int, dpdcid: int, max_psn_plus_1: int, tos: int = 0) -> Packet:
    """A NACK of ``psn`` for ``code`` (TRIMMED: retransmit it now)."""
    return (Ether(src=src_mac, dst=dst_mac) / IP(src=src_ip, dst=dst_ip, tos=tos)
            / UDP(sport=entropy, dport=UET_UDP_PORT, chksum=0) / PDS(type=NACK)
            / PDSNack(code=code, nack_psn=psn, spdcid=spdcid, dpdcid=dpdcid,
                      max_psn_plus_1=max_psn_plus_1))


def trimmed(frame: bytes) -> bytes:
    """A data packet cut to its headers, as a trimming switch forwards it (its IP and UDP
    lengths follow the cut; the PDS and SES headers, which say what was lost, stay)."""
    pkt = Ether(frame)
    head = len(frame) - len(pkt[Raw].load) if Raw in pkt[PDS] else len(frame)
    cut = Ether(frame[:head])
    del cut[IP].len, cut[IP].chksum, cut[UDP].len
    return bytes(cut)
