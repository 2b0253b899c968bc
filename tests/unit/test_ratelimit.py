"""The per-QP rate limiters' pure parts: netlink messages, the times of held frames."""
import struct

from testbed.base.netlink import NLMSGHDR, RATESPEC, TCMSG, netlink_errors
from traffic import ratelimit


def attrs(data: bytes, off: int, end: int) -> dict:
    out = {}
    while off + 4 <= end:
        length, kind = struct.unpack_from("=HH", data, off)
        out[kind & 0x7FFF] = data[off + 4:off + length]
        off += (length + 3) & ~3
    return out


def test_a_class_change_is_an_htb_class_of_equal_rate_and_ceil():
    m = ratelimit.class_message(7, 0x00110105, 1_250_000, 210, 4210)
    length, mtype, flags, _s, _p = NLMSGHDR.unpack_from(m)
    assert length == len(m) and mtype == ratelimit.RTM_NEWTCLASS
    assert not flags & ratelimit.NLM_F_CREATE  # a change: the class must exist
    _f, ifindex, handle, parent, _i = TCMSG.unpack_from(m, NLMSGHDR.size)
    assert (ifindex, handle, parent) == (7, 0x00110105, 0x00110000)
    top = attrs(m, NLMSGHDR.size + TCMSG.size, len(m))
    assert top[1] == b"htb\0"
    opt = attrs(top[2], 0, len(top[2]))[ratelimit.TCA_HTB_PARMS]
    rate, ceil, buffer, cbuffer, quantum, _l, _p = ratelimit.HTB_OPT.unpack(opt)
    assert RATESPEC.unpack(rate)[-1] == RATESPEC.unpack(ceil)[-1] == 1_250_000
    assert RATESPEC.unpack(rate)[1] == 1  # Ethernet link layer: no rate table needed
    assert buffer == cbuffer == 210 * 10**9 // 1_250_000 // 64 and quantum == 4210


def test_creating_asks_for_an_answer():
    m = ratelimit.class_message(7, 0x00110100, 1, 210, 4210, create=True)
    flags = NLMSGHDR.unpack_from(m)[2]
    assert flags & ratelimit.NLM_F_CREATE and flags & ratelimit.NLM_F_EXCL
    assert flags & ratelimit.NLM_F_ACK


def test_filter_keys_match_ect_tos_peer_and_destination_qp():
    keys = ratelimit.u32_keys(0x6A, "10.0.0.2", 0x101)
    assert keys == [(0x00FF0000, 0x006A0000, 0), (0xFFFFFFFF, 0x0A000002, 16),
                    (0x00FFFFFF, 0x101, 32)]
    m = ratelimit.filter_message(3, 0x00110000, keys, 0x00110100)
    top = attrs(m, NLMSGHDR.size + TCMSG.size, len(m))
    assert top[1] == b"u32\0"
    opts = attrs(top[2], 0, len(top[2]))
    assert struct.unpack("=I", opts[ratelimit.TCA_U32_CLASSID])[0] == 0x00110100
    sel = opts[ratelimit.TCA_U32_SEL]
    assert sel[0] == ratelimit.TC_U32_TERMINAL and sel[2] == 3
    assert len(sel) == ratelimit.U32_SEL.size + 3 * 16
    first = sel[ratelimit.U32_SEL.size:ratelimit.U32_SEL.size + 16]
    assert struct.unpack("!II", first[:8]) == (0x00FF0000, 0x006A0000)


def test_held_frames_after_a_rate_change():
    held = [[1, 1000, 500], [2, 1000, 900], [3, 500, 1300]]
    after = ratelimit.reschedule(held, 2.0)  # 2 ns a byte from now on
    assert [h[2] for h in held] == [500, 2500, 4500]  # the first keeps its time
    assert after == 5500
    assert ratelimit.reschedule([], 2.0) is None


def test_netlink_errors_are_found_in_a_batch_of_answers():
    def answer(err):
        body = struct.pack("=i", -err) + NLMSGHDR.pack(NLMSGHDR.size, 40, 0, 0, 0)
        return NLMSGHDR.pack(NLMSGHDR.size + len(body), 2, 0, 0, 0) + body
    assert netlink_errors(answer(0) + answer(2) + answer(0)) == [2]
    assert netlink_errors(b"") == []


def test_ready_times_follow_the_departure_before_at_the_rate_then():
    # bytes of 1000 at 8e6 bit/s: a 1 ms gap; open (0): 10x faster than the line
    frames = [(0, 100, 1000), (10, 1_100_000, 1000), (20, 2_500_000, 1000),
              (3_000_000, 3_000_000, 1000)]
    rates = [(0, 8e6), (2_000_000, 0.0)]
    got = ratelimit.ready_times(frames, rates, open_bps=80e6)
    # the second may leave 1 ms after the first left, the third 1 ms after the second (the
    # rate the second left with); the fourth was sent after the open class let it go
    assert got == {10: 1_000_100, 20: 2_100_000}
    assert ratelimit.ready_times([], rates, 80e6) == {}
