"""UET frames at packet rate (traffic.uetwire) against the project's Scapy layers
(traffic.uet): the same bytes out, the same fields back."""
from traffic import uet
from traffic.roce import PROBE, Endpoint
from traffic.uetwire import DataTemplate, ack_cc_frame, nack_frame, parse

A = Endpoint("02:00:00:00:00:01", "10.0.1.1")
B = Endpoint("02:00:00:00:00:02", "10.0.2.1")
TOS = 26 << 2 | 2


def _scapy_write(psn, flags, offset, length, payload, **kw):
    return bytes(uet.rud_write(A.mac, B.mac, A.ip, B.ip, entropy=0xC00A, psn=psn, spdcid=3,
                               dpdcid=4, message_id=9, offset=offset, length=length,
                               payload=payload, flags=flags, tos=TOS, **kw))


def test_a_data_frame_is_the_scapy_layers_frame():
    probe = PROBE.pack(123456789, 2, 5)
    middle = DataTemplate(A, B, 3, 4, som=False, payload=1024, tos=TOS)
    got = middle.fill(0xC00A, psn=41, flags=uet.AR, clear_psn=41, start_psn=0, message_id=9,
                      offset=2048, length=3072, eom=True, va=0, tx_ns=123456789, iteration=2,
                      step=5)
    assert bytes(got) == _scapy_write(41, uet.AR, 2048, 3072, probe + bytes(1024 - 16))
    first = DataTemplate(A, B, 3, 4, som=True, payload=1024, tos=TOS)
    syn = first.fill(0xC00A, psn=100, flags=uet.SYN, clear_psn=100, start_psn=98,
                     message_id=9, offset=0, length=3072, eom=False, va=0, tx_ns=123456789,
                     iteration=2, step=5)
    assert bytes(syn) == _scapy_write(100, uet.SYN, 0, 3072, probe + bytes(1024 - 16),
                                      start_psn=98)


def test_acks_and_nacks_are_the_scapy_layers_frames():
    frame = ack_cc_frame(B, A, 0xC00A, 4, 3, cack_psn=40, ack_psn=45, sack_base=41,
                         bitmap=0b10110, marked=True, received_bytes=0x123456, tos=46 << 2)
    want = uet.ack_cc(B.mac, A.mac, B.ip, A.ip, 0xC00A, cack_psn=40, ack_psn=45, spdcid=4,
                      dpdcid=3, sacked=(42, 43, 45), received_bytes=0x123456, marked=True,
                      tos=46 << 2)
    assert frame == bytes(want)
    nack = nack_frame(B, A, 0xC00A, 4, 3, uet.NACK_TRIMMED, psn=44, expected=46, tos=46 << 2)
    assert nack == bytes(uet.nack(B.mac, A.mac, B.ip, A.ip, 0xC00A, uet.NACK_TRIMMED, 44, 4,
                                  3, 46, tos=46 << 2))


def test_parse_reads_back_every_field_and_knows_a_trimmed_packet():
    probe = PROBE.pack(987, 1, 7)
    frame = _scapy_write(41, uet.AR | uet.RETX, 2048, 3072, probe + bytes(1008))
    d = parse(frame[42:])
    assert (d.psn, d.flags, d.spdcid, d.dpdcid, d.syn_offset) == (41, uet.AR | uet.RETX, 3, 4,
                                                                  None)
    assert (d.som, d.eom, d.message_id, d.buffer_offset, d.message_offset) == (
        False, True, 9, 2048, 2048)
    assert (d.request_length, d.payload, d.tx_ns, d.iteration, d.step) == (3072, 1024, 987,
                                                                           1, 7)
    syn = parse(_scapy_write(100, uet.SYN, 0, 3072, probe + bytes(1008), start_psn=98)[42:])
    assert syn.som and syn.dpdcid is None and syn.syn_offset == 2
    cut = parse(uet.trimmed(frame)[42:])
    assert cut.payload == 0 and cut.psn == 41 and cut.request_length == 3072
    ack = parse(ack_cc_frame(B, A, 1, 4, 3, 40, 45, 41, 0b10110, True, 77, 0)[42:])
    assert (ack.cack_psn, ack.ack_psn, ack.sack_base, ack.bitmap, ack.marked,
            ack.received_bytes) == (40, 45, 41, 0b10110, True, 77)
    nack = parse(nack_frame(B, A, 1, 4, 3, uet.NACK_TRIMMED, 44, 46, 0)[42:])
    assert (nack.code, nack.psn, nack.expected) == (uet.NACK_TRIMMED, 44, 46)
    assert parse(b"\x00") is None and parse(frame[42:60]) is None
