"""UET's wire format (traffic.uet): what the builders put on the wire, byte by byte against
the layouts of UE Spec 1.0.1 (as Wireshark's packet-uet.c reads them), and what the layers
read back."""
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from testbed.base.frames import (PDS_ACK_CC_LEN, PDS_NACK_LEN, PDS_REQUEST_LEN,
                                 SES_REQUEST_LEN, UET_UDP_PORT, uet_frame_bytes,
                                 udp_frame_bytes)
from traffic import uet

A = ("02:00:00:00:00:01", "02:00:00:00:00:02", "10.0.1.1", "10.0.1.2")
B = ("02:00:00:00:00:02", "02:00:00:00:00:01", "10.0.1.2", "10.0.1.1")
PDS_AT = udp_frame_bytes(0)  # 42: the PDS header follows the UDP header


def _write(**kw):
    args = dict(entropy=0xC007, psn=100, spdcid=3, dpdcid=9, message_id=5, offset=0,
                length=3000, payload=b"x" * 1000) | kw
    return bytes(uet.rud_write(*A, **args))


def test_a_rud_write_s_first_packet_is_a_pds_request_and_an_ses_standard_header():
    frame = _write(flags=uet.AR)
    assert len(frame) == uet_frame_bytes(1000) == 14 + 20 + 8 + 12 + 44 + 1000
    udp = Ether(frame)[UDP]
    assert udp.dport == UET_UDP_PORT == 4793 and udp.sport == 0xC007  # the entropy value
    pds = frame[PDS_AT:PDS_AT + PDS_REQUEST_LEN]
    # type 2 (RUD) in the top 5 bits, next header 3 (standard request) in the next 4, AR 0x08
    assert pds[:2] == bytes.fromhex("1188") == ((2 << 11) | (3 << 7) | 0x08).to_bytes(2, "big")
    # clear-PSN offset 0, PSN 100, source PDC 3, destination PDC 9
    assert pds[2:] == bytes.fromhex("0000" "00000064" "0003" "0009")
    ses = frame[PDS_AT + PDS_REQUEST_LEN:PDS_AT + PDS_REQUEST_LEN + SES_REQUEST_LEN]
    assert ses[0] == 0x01 and ses[1] == 0x01  # opcode UET_WRITE; flags: version 0, SOM
    assert ses[2:4] == (5).to_bytes(2, "big")  # message id
    assert ses[12:20] == bytes(8)  # buffer offset 0
    assert ses[-4:] == (3000).to_bytes(4, "big")  # request length: the whole message
    assert frame[-1000:] == b"x" * 1000


def test_later_packets_carry_their_offset_and_length_and_the_last_one_eom():
    frame = _write(offset=2000, payload=b"z" * 1000)
    ses = Ether(frame)[uet.SESRequest]
    assert int(ses.ses_flags) == uet.EOM and ses.buffer_offset == 2000
    assert (ses.payload_length, ses.message_offset, ses.request_length) == (1000, 2000, 3000)
    raw = frame[PDS_AT + PDS_REQUEST_LEN:][:SES_REQUEST_LEN]
    # not SOM: 18 reserved bits and the 14-bit payload length, then the message offset
    assert raw[32:36] == (1000).to_bytes(4, "big") and raw[36:40] == (2000).to_bytes(4, "big")


def test_the_syn_packet_opening_a_pdc_carries_its_psn_s_offset_from_the_start_psn():
    frame = _write(psn=1003, flags=uet.SYN | uet.RETX, start_psn=1000)
    assert frame[PDS_AT:PDS_AT + 2] == ((2 << 11) | (3 << 7) | 0x14).to_bytes(2, "big")
    assert frame[PDS_AT + 10:PDS_AT + 12] == (3).to_bytes(2, "big")  # mode 0, offset 3
    req = Ether(frame)[uet.PDSRequest]
    assert req.psn_offset == 3 and req.psn - req.psn_offset == 1000
    assert req.getfieldval("dpdcid") is None or "dpdcid" not in req.fields


def test_an_ack_cc_acknowledges_cumulatively_and_selectively_with_nscc_state():
    frame = bytes(uet.ack_cc(*B, entropy=0xC007, cack_psn=100, ack_psn=103, spdcid=9, dpdcid=3,
                             sacked=[102, 103], service_time=7, received_bytes=4096,
                             marked=True))
    assert len(frame) == PDS_AT + PDS_ACK_CC_LEN
    pds = frame[PDS_AT:]
    assert pds[:2] == ((8 << 11) | 0x20).to_bytes(2, "big")  # ACK_CC, M: the request was marked
    # ACK-PSN offset +3 from the cumulative PSN 100, PDC ids 9 and 3
    assert pds[2:12] == bytes.fromhex("0003" "00000064" "0009" "0003")
    ext = pds[12:]
    assert ext[0] >> 4 == uet.CC_NSCC and ext[2:4] == (1).to_bytes(2, "big")  # SACK base 101
    assert int.from_bytes(ext[4:12], "big") == 0b110  # PSNs 102 and 103 arrived
    assert ext[12:14] == (7).to_bytes(2, "big") and ext[15:18] == (4096).to_bytes(3, "big")
    d = Ether(frame)
    assert d[uet.PDSAck].ack_psn == 103 and d[uet.AckCC].sacked(100) == [102, 103]
    with pytest.raises(ValueError, match="outside the SACK bitmap"):
        uet.ack_cc(*B, entropy=1, cack_psn=100, ack_psn=100, spdcid=9, dpdcid=3, sacked=[165])


def test_a_nack_names_the_trimmed_psn_and_the_largest_psn_received():
    frame = bytes(uet.nack(*B, entropy=0xC007, code=uet.NACK_TRIMMED, psn=101, spdcid=9,
                           dpdcid=3, max_psn_plus_1=104))
    assert len(frame) == PDS_AT + PDS_NACK_LEN
    assert frame[PDS_AT:] == bytes.fromhex("5000" "01" "00" "00000065" "0009" "0003" "00000068")
    n = Ether(frame)[uet.PDSNack]
    assert n.code == uet.NACK_TRIMMED and n.nack_psn == 101 and n.max_psn_plus_1 == 104


def test_a_trimmed_packet_keeps_its_headers_and_says_so_in_its_lengths():
    frame = _write(offset=1000, payload=b"y" * 1000, flags=uet.AR)
    cut = uet.trimmed(frame)
    assert len(cut) == uet_frame_bytes(0) == 98
    d = Ether(cut)
    assert d[IP].len == len(cut) - 14 and d[UDP].len == len(cut) - 34
    assert d[uet.PDSRequest].psn == 100 and d[uet.SESRequest].message_offset == 1000
    assert Raw not in d
    assert cut[PDS_AT:] == frame[PDS_AT:PDS_AT + PDS_REQUEST_LEN + SES_REQUEST_LEN]
