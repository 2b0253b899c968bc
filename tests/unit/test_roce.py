import struct

import pytest
from scapy.layers.l2 import Ether

from traffic import roce
from traffic.roce import (RC_RDMA_WRITE_FIRST, RC_RDMA_WRITE_LAST, RC_RDMA_WRITE_MIDDLE,
                          RC_RDMA_WRITE_ONLY, RETH, Connection, Endpoint)

SRC = Endpoint("02:00:0a:00:01:01", "10.0.1.1")
DST = Endpoint("02:00:0a:00:02:01", "10.0.2.1")

# Golden frames, checked once against tshark's InfiniBand dissector and Scapy's ICRC
# (tests/unit/test_tshark.py re-checks templates, tests/integration/test_capture.py live frames).
GOLDEN_FIRST = bytes.fromhex(
    "02000a00020102000a0001010800456a005c00004000401123260a0001010a000201c12312b7004800000600"
    "ffff0001010000123456000000deadbeef00000000000000004011223344556677880000000300000005000000"
    "0000000000000000000000000052b61f0b")
GOLDEN_LAST = bytes.fromhex(
    "02000a00020102000a0001010800456a004c00004000401123360a0001010a000201c12312b7003800000800"
    "ffff00010100801234561122334455667788000000030000000500000000000000000000000000000000369de7d7")


def _fill(op, payload_len=32):
    tpl = Connection(SRC, DST, 0xC123, 0x10100).template(op, payload_len)
    return bytes(tpl.fill(0x123456, op == RC_RDMA_WRITE_LAST, 0x1122334455667788, 3, 5,
                          va=0xDEADBEEF00, dlen=64))


def test_patched_templates_match_golden_bytes():
    assert _fill(RC_RDMA_WRITE_FIRST) == GOLDEN_FIRST
    assert _fill(RC_RDMA_WRITE_LAST) == GOLDEN_LAST


@pytest.mark.parametrize("op", [RC_RDMA_WRITE_FIRST, RC_RDMA_WRITE_MIDDLE, RC_RDMA_WRITE_LAST,
                                RC_RDMA_WRITE_ONLY])
@pytest.mark.parametrize("psn", [0, 1, 0xFFFFFF, 0x123456])
def test_template_fill_equals_a_packet_built_by_scapy(op, psn):
    conn = Connection(SRC, DST, 0xD001, 0x10203)
    tpl = conn.template(op, 1024)
    ackreq = op in (RC_RDMA_WRITE_LAST, RC_RDMA_WRITE_ONLY)
    frame = bytes(tpl.fill(psn, ackreq, 987654321, 7, 11, va=0x1000, dlen=4096))
    payload = bytearray(1024)
    roce.PROBE.pack_into(payload, 0, 987654321, 7, 11)
    ref = bytes(roce.scapy_packet(SRC, DST, 0xD001, op, 0x10203, psn, bytes(payload), ackreq,
                                  reth=(0x1000, 0, 4096)))
    assert frame == ref
    assert roce.icrc_ok(frame)


def test_one_template_serves_many_packets_with_correct_icrc():
    tpl = Connection(SRC, DST, 0xC000, 5).template(RC_RDMA_WRITE_MIDDLE, 4096)
    for psn in range(0, 5000, 499):
        assert roce.icrc_ok(tpl.fill(psn, False, psn * 1000, 1, 2))


def test_corrupted_frame_fails_icrc():
    frame = bytearray(GOLDEN_FIRST)
    frame[60] ^= 0x01
    assert not roce.icrc_ok(frame)


def test_icrc_ignores_variant_fields():
    frame = bytearray(GOLDEN_LAST)
    frame[15] = 0x03  # TOS: ECN CE set by a switch
    frame[22] = 1  # TTL
    assert roce.icrc_ok(frame)


def test_scapy_dissects_reth_and_probe():
    pkt = Ether(GOLDEN_FIRST)
    assert pkt[RETH].va == 0xDEADBEEF00 and pkt[RETH].dlen == 64
    assert pkt["BTH"].psn == 0x123456 and pkt["BTH"].dqpn == 0x10100


def test_parse_udp_payload_round_trip():
    udp_payload = GOLDEN_LAST[roce.BTH_OFFSET:]
    p = roce.parse_udp_payload(udp_payload)
    assert (p.opcode, p.dqpn, p.psn, p.ackreq) == (RC_RDMA_WRITE_LAST, 0x10100, 0x123456, True)
    assert (p.tx_ns, p.iteration, p.step, p.payload_len) == (0x1122334455667788, 3, 5, 32)
    first = roce.parse_udp_payload(GOLDEN_FIRST[roce.BTH_OFFSET:])
    assert first.psn == 0x123456 and not first.ackreq and first.payload_len == 32


@pytest.mark.parametrize("data", [b"", b"\x06" * 10, bytes([0x11]) + bytes(40),
                                  bytes([0x81]) + bytes(40), bytes([0x06]) + bytes(20)])
def test_parse_rejects_short_or_foreign_payloads(data):
    assert roce.parse_udp_payload(data) is None


def test_message_segmentation():
    assert roce.packet_payloads(4096 * 3, 4096) == [4096] * 3
    assert roce.packet_payloads(10000, 4096) == [4096, 4096, 1808]
    assert roce.packet_payloads(5, 4096) == [roce.MIN_PAYLOAD]
    assert roce.opcodes_for(1) == [RC_RDMA_WRITE_ONLY]
    assert roce.opcodes_for(2) == [RC_RDMA_WRITE_FIRST, RC_RDMA_WRITE_LAST]
    assert roce.opcodes_for(4)[1:3] == [RC_RDMA_WRITE_MIDDLE] * 2


def test_udp_source_port_derives_from_qp_in_the_nic_range():
    ports = {roce.udp_source_port(q) for q in range(0x10000, 0x10040)}
    assert all(0xC000 <= p <= 0xFFFF for p in ports)
    assert len(ports) == 64  # consecutive QPs get distinct ports
    assert roce.udp_source_port(0x10001) == roce.udp_source_port(0x10001)


def test_ackreq_and_psn_share_one_word():
    frame = _fill(RC_RDMA_WRITE_LAST)
    word = struct.unpack_from("!I", frame, roce.BTH_OFFSET + 8)[0]
    assert word >> 31 == 1 and word & 0xFFFFFF == 0x123456


def test_per_packet_source_port_keeps_the_icrc_right():
    conn = Connection(SRC, DST, 0xC000, 5, tos=(26 << 2) | 1)
    tpl = conn.template(RC_RDMA_WRITE_MIDDLE, 256)
    for sport in (0xC001, 0xD00D, 0xFFFF):
        tpl.set_sport(sport)
        frame = bytes(tpl.fill(7, False, 1, 0, 0))
        assert roce.icrc_ok(frame)
        assert Ether(frame)["UDP"].sport == sport and Ether(frame)["IP"].tos == (26 << 2) | 1


def _payload_check(frame, src=SRC.ip, dst=DST.ip):
    sport = struct.unpack_from("!H", frame, roce.ETH_LEN + roce.IP_LEN)[0]
    return roce.payload_icrc_ok(frame[roce.BTH_OFFSET:], src, dst, sport)


@pytest.mark.parametrize("frame", [
    GOLDEN_FIRST, GOLDEN_LAST,
    bytes(roce.ack_packet(DST, SRC, 0xC001, 0x10100, 77, 0x1F, 3)),
    bytes(roce.cnp_packet(DST, SRC, 0xC001, 0x10100, 0x6A))])
def test_a_receiver_with_only_the_udp_payload_checks_the_icrc(frame):
    """The agents receive on a UDP socket: the check rebuilds the pseudo-header."""
    src, dst = (SRC.ip, DST.ip) if frame in (GOLDEN_FIRST, GOLDEN_LAST) else (DST.ip, SRC.ip)
    assert roce.icrc_ok(frame) and _payload_check(frame, src, dst)
    for where in (roce.BTH_OFFSET, roce.BTH_OFFSET + 9, len(frame) - 5, len(frame) - 1):
        bad = bytearray(frame)
        bad[where] ^= 0x10
        assert not _payload_check(bytes(bad), src, dst), where
    assert not _payload_check(frame, "10.0.9.9", dst)  # the addresses are covered
    assert not roce.payload_icrc_ok(frame[roce.BTH_OFFSET:roce.BTH_OFFSET + 10], src, dst, 1)


@pytest.mark.parametrize("src, dst, sport, dqpn", [
    (SRC, DST, 0xC123, 0x10100), (DST, SRC, 0xFFFF, 0x1), (SRC, DST, 0xC000, 0xFFFFFF)])
def test_frames_readdressed_from_one_shape_equal_what_scapy_builds(src, dst, sport, dqpn):
    for op, size in ((RC_RDMA_WRITE_FIRST, 4096), (roce.RC_RDMA_WRITE_MIDDLE, 1024),
                     (RC_RDMA_WRITE_ONLY, 16)):
        want = bytes(roce.scapy_packet(src, dst, sport, op, dqpn, 0, bytes(size), tos=0x6A))
        assert bytes(Connection(src, dst, sport, dqpn, tos=0x6A).template(op, size).buf) == want
    assert roce.ack_frame(src, dst, sport, dqpn, 0x68) == bytes(
        roce.ack_packet(src, dst, sport, dqpn, 0, 0, 0, tos=0x68))
    assert roce.cnp_frame(src, dst, sport, dqpn, 0xC0) == bytes(
        roce.cnp_packet(src, dst, sport, dqpn, 0xC0))
