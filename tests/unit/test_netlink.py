"""The raw netlink messages, against byte layouts built independently here."""
import struct

import pytest

from testbed.base import netlink


def qdisc_reply(ifindex, handle, backlog, qlen=3, drops=4, packets=5, kind=b"bfifo\0"):
    attrs = netlink._attr(netlink.TCA_KIND, kind)
    attrs += netlink._attr(netlink.TCA_STATS, struct.pack("=QIIIIIII", 1000, packets, drops,
                                                          0, 0, 0, qlen, backlog))
    body = struct.pack("=BxxxiIII", 0, ifindex, handle, 0x10000, 1) + attrs
    return struct.pack("=IHHII", 16 + len(body), netlink.RTM_NEWQDISC, 2, 7, 0) + body


DONE = struct.pack("=IHHII", 20, netlink.NLMSG_DONE, 2, 7, 0) + b"\0" * 4


def test_dump_keeps_only_the_wanted_queues():
    keys = {(5, 0x110000): ("lf1-eth1", 0x110000)}
    data = (qdisc_reply(5, 0x100000, 99) + qdisc_reply(5, 0x110000, 4200)
            + qdisc_reply(6, 0x110000, 1))
    out = {}
    assert not netlink.parse_qdisc_dump(memoryview(data), keys, out)
    assert out == {("lf1-eth1", 0x110000): netlink.QueueStats(4200, 3, 4, 5)}
    assert netlink.parse_qdisc_dump(memoryview(DONE), keys, out)


def test_dump_error_raises():
    err = (struct.pack("=IHHII", 36, netlink.NLMSG_ERROR, 0, 7, 0) + struct.pack("=i", -1)
           + bytes(16))
    with pytest.raises(OSError):
        netlink.parse_qdisc_dump(memoryview(err), {}, {})


def test_tc_handle():
    assert netlink.tc_handle("1:20") == 0x10020 and netlink.tc_handle("51:") == 0x510000


def test_tbf_change_message_layout():
    msg = netlink.tbf_message(7, 0x510000, 0x10011, rate_bytes=1, burst=4210, limit=100000)
    length, mtype, flags = struct.unpack_from("=IHH", msg)
    assert length == len(msg) and mtype == netlink.RTM_NEWQDISC
    assert flags == netlink.NLM_F_REQUEST | netlink.NLM_F_ACK  # a change: no CREATE/REPLACE
    _f, ifindex, handle, parent, _i = struct.unpack_from("=BxxxiIII", msg, 16)
    assert (ifindex, handle, parent) == (7, 0x510000, 0x10011)
    assert b"tbf\0" in msg
    # TCA_TBF_PARMS: rate (linklayer ethernet, 1 B/s), no peak rate, limit for the child FIFO
    parms = msg.index(struct.pack("=HH", 4 + 36, netlink.TCA_TBF_PARMS)) + 4
    cell_log, linklayer, _o, _a, _m, rate = struct.unpack_from("=BBHhHI", msg, parms)
    assert (linklayer, rate) == (netlink.TC_LINKLAYER_ETHERNET, 1)
    assert struct.unpack_from("=I", msg, parms + 24)[0] == 100000
    assert struct.pack("=HHI", 8, netlink.TCA_TBF_BURST, 4210) in msg
