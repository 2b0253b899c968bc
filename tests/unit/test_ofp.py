"""The os-ken adapter turns plain messages into real OpenFlow 1.3 wire messages."""
from os_ken.ofproto import ofproto_v1_3, ofproto_v1_3_parser

import pytest

from controllers.messages import (Bucket, ClearFlows, GroupMod, Learn, Multipath, Output, Resubmit,
                               SetField, flow, prefix)
from controllers.ofp import to_ofp
from controllers.policy import policy_class
from testbed.base.topology import FabricPlan


class FakeDatapath:
    ofproto = ofproto_v1_3
    ofproto_parser = ofproto_v1_3_parser
    id = 0x10001

    def __init__(self):
        self.xid = 0

    def set_xid(self, msg):
        self.xid += 1
        msg.set_xid(self.xid)


def _wire(msg):
    dp = msg.datapath
    dp.set_xid(msg)
    msg.serialize()
    return bytes(msg.buf)


def test_flow_mod_serialises_and_parses_back():
    dp = FakeDatapath()
    m = flow(200, {"eth_type": 0x0800, "ipv4_dst": prefix("10.0.3.0/24")},
             SetField("eth_dst", "02:00:0a:00:03:01"), Output(1), cookie=0x4853)
    (ofp_msg,) = to_ofp(dp, m)
    data = _wire(ofp_msg)
    assert data[0] == ofproto_v1_3.OFP_VERSION and data[1] == ofproto_v1_3.OFPT_FLOW_MOD
    parsed = ofproto_v1_3_parser.OFPFlowMod.parser(dp, *_header(data), data)
    assert parsed.priority == 200 and parsed.cookie == 0x4853
    assert parsed.match["ipv4_dst"] == ("10.0.3.0", "255.255.255.0")
    actions = parsed.instructions[0].actions
    assert actions[0].key == "eth_dst" and actions[1].port == 1


def test_group_mod_and_clear():
    dp = FakeDatapath()
    (g,) = to_ofp(dp, GroupMod(1, "select", (Bucket((Output(3),)), Bucket((Output(4),)))))
    assert g.type == ofproto_v1_3.OFPGT_SELECT and len(g.buckets) == 2
    _wire(g)
    clear = to_ofp(dp, ClearFlows())
    assert clear[0].command == ofproto_v1_3.OFPFC_DELETE
    assert clear[1].group_id == ofproto_v1_3.OFPG_ALL
    for m in clear:
        _wire(m)


@pytest.mark.parametrize("name", ["enterprise", "hyperscale", "lossless"])
def test_every_message_of_every_policy_serialises(name):
    plan = FabricPlan(2, 4, 2)
    policy = policy_class(name)(plan)
    leaf = plan.leaves[0].dpid
    messages = [m for sw in plan.switches for m in policy.switch_connected(sw.dpid)]
    messages += policy.ecn_changed(leaf, 1, True)
    messages += [m for ms in policy.queue_load({leaf: {3: 90_000, 4: 0}}).values() for m in ms]
    messages += policy.packet_in(leaf, 1, 1, plan.host("gpu1").mac)
    for m in messages:
        for ofp_msg in to_ofp(FakeDatapath(), m):
            assert len(_wire(ofp_msg)) >= 8


def test_nicira_actions_carry_what_ovs_needs():
    dp = FakeDatapath()
    (fm,) = to_ofp(dp, flow(1, {"eth_type": 0x0800}, Multipath(64), Resubmit(2),
                            Learn(1, (("eth_type", 0x800), ("ip_proto", 17)),
                                  ("ipv4_src", "udp_src"), "reg0", 3, idle_timeout=1),
                            goto=4, metadata=7))
    mp, rs, learn = fm.instructions[1].actions
    assert (mp.fields, mp.max_link, mp.dst) == (3, 63, "reg1")  # symmetric_l3l4+udp
    assert (rs.table_id, rs.in_port) == (2, 0xFFF8)
    assert learn.table_id == 1 and learn.idle_timeout == 1 and len(learn.specs) == 5
    assert fm.instructions[0].metadata == 7 and fm.instructions[2].table_id == 4
    _wire(fm)


def _header(data):
    import struct
    version, msg_type, msg_len, xid = struct.unpack_from("!BBHI", data)
    return version, msg_type, msg_len, xid
