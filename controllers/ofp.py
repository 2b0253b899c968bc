"""Translate ``controllers.messages`` messages into os-ken OpenFlow 1.3 parser objects
(Nicira extensions for resubmit, multipath and learn, as Open vSwitch implements them)."""
from __future__ import annotations

from typing import List

from .messages import (CONTROLLER, ClearFlows, FlowMod, Group, GroupMod, Learn, Message,
                    Multipath, Output, Resubmit, SetField)

_GROUP_TYPES = {"select": "OFPGT_SELECT", "all": "OFPGT_ALL", "indirect": "OFPGT_INDIRECT",
                "ff": "OFPGT_FF"}
# <openflow/nicira-ext.h> enum nx_hash_fields; os-ken names only the first two.
_HASH_FIELDS = {"eth_src": 0, "symmetric_l4": 1, "symmetric_l3l4": 2,
                "symmetric_l3l4+udp": 3, "nw_src": 4, "nw_dst": 5, "symmetric_l3": 6}
NX_MP_ALG_MODULO_N = 0
NX_IN_PORT = 0xFFF8  # OFPP_IN_PORT in the 16-bit port numbers of Nicira actions
_BITS = {"eth_type": 16, "ip_proto": 8, "ipv4_src": 32, "ipv4_dst": 32, "udp_src": 16,
         "udp_dst": 16, "reg0": 32, "reg1": 32}


def to_ofp(datapath, message: Message) -> List[object]:
    """os-ken messages (not yet sent) for one ``Message`` on ``datapath``."""
    ofp, parser = datapath.ofproto, datapath.ofproto_parser
    if isinstance(message, FlowMod):
        inst = []
        if message.metadata is not None:
            inst.append(parser.OFPInstructionWriteMetadata(message.metadata,
                                                           0xFFFFFFFFFFFFFFFF))
        actions = [_action(ofp, parser, a) for a in message.actions]
        if actions:
            inst.append(parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions))
        if message.goto is not None:
            inst.append(parser.OFPInstructionGotoTable(message.goto))
        return [parser.OFPFlowMod(datapath=datapath, cookie=message.cookie,
                                  table_id=message.table_id, command=ofp.OFPFC_ADD,
                                  idle_timeout=message.idle_timeout,
                                  priority=message.priority, buffer_id=ofp.OFP_NO_BUFFER,
                                  match=parser.OFPMatch(**message.match_dict()),
                                  instructions=inst)]
    if isinstance(message, GroupMod):
        buckets = [parser.OFPBucket(weight=b.weight if message.group_type == "select" else 0,
                                    watch_port=ofp.OFPP_ANY, watch_group=ofp.OFPG_ANY,
                                    actions=[_action(ofp, parser, a) for a in b.actions])
                   for b in message.buckets]
        command = ofp.OFPGC_MODIFY if message.modify else ofp.OFPGC_ADD
        return [parser.OFPGroupMod(datapath, command,
                                   getattr(ofp, _GROUP_TYPES[message.group_type]),
                                   message.group_id, buckets)]
    if isinstance(message, ClearFlows):
        return [parser.OFPFlowMod(datapath=datapath, table_id=ofp.OFPTT_ALL,
                                  command=ofp.OFPFC_DELETE, out_port=ofp.OFPP_ANY,
                                  out_group=ofp.OFPG_ANY, match=parser.OFPMatch()),
                parser.OFPGroupMod(datapath, ofp.OFPGC_DELETE, 0, ofp.OFPG_ALL)]
    raise TypeError(f"not an OpenFlow message: {message!r}")


def _action(ofp, parser, action):
    if isinstance(action, Output):
        if action.port == CONTROLLER:
            return parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)
        return parser.OFPActionOutput(action.port)
    if isinstance(action, Group):
        return parser.OFPActionGroup(action.group_id)
    if isinstance(action, SetField):
        return parser.OFPActionSetField(**{action.field: action.value})
    if isinstance(action, Resubmit):
        return parser.NXActionResubmitTable(in_port=NX_IN_PORT, table_id=action.table)
    if isinstance(action, Multipath):
        from os_ken.ofproto import nicira_ext
        return parser.NXActionMultipath(
            fields=_HASH_FIELDS[action.fields], basis=action.basis,
            algorithm=NX_MP_ALG_MODULO_N, max_link=action.links - 1, arg=0,
            ofs_nbits=nicira_ext.ofs_nbits(0, 15), dst=action.dst)
    if isinstance(action, Learn):
        specs = [parser.NXFlowSpecMatch(src=value, dst=(f"{field}_nxm", 0),
                                        n_bits=_BITS[field]) for field, value in action.const]
        specs += [parser.NXFlowSpecMatch(src=(f"{f}_nxm", 0), dst=(f"{f}_nxm", 0),
                                         n_bits=_BITS[f]) for f in action.copy]
        specs.append(parser.NXFlowSpecLoad(src=action.load_value, dst=(action.load_field, 0),
                                           n_bits=_BITS[action.load_field]))
        return parser.NXActionLearn(table_id=action.table, specs=specs,
                                    idle_timeout=action.idle_timeout, hard_timeout=0,
                                    priority=action.priority, cookie=action.cookie, flags=0,
                                    fin_idle_timeout=0, fin_hard_timeout=0)
    raise TypeError(f"not an action: {action!r}")
