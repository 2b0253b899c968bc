"""Translate ``controllers.flows`` messages into os-ken OpenFlow 1.3 parser objects."""
from __future__ import annotations

from typing import List

from .flows import ClearFlows, FlowMod, Group, GroupMod, Message, Output, SetField

_GROUP_TYPES = {"select": "OFPGT_SELECT", "all": "OFPGT_ALL", "indirect": "OFPGT_INDIRECT",
                "ff": "OFPGT_FF"}


def to_ofp(datapath, message: Message) -> List[object]:
    """os-ken messages (not yet sent) for one ``Message`` on ``datapath``."""
    ofp, parser = datapath.ofproto, datapath.ofproto_parser
    if isinstance(message, FlowMod):
        actions = [_action(ofp, parser, a) for a in message.actions]
        inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)] if actions else []
        return [parser.OFPFlowMod(datapath=datapath, cookie=message.cookie,
                                  table_id=message.table_id, command=ofp.OFPFC_ADD,
                                  priority=message.priority,
                                  match=parser.OFPMatch(**message.match_dict()),
                                  instructions=inst)]
    if isinstance(message, GroupMod):
        buckets = [parser.OFPBucket(weight=b.weight, watch_port=ofp.OFPP_ANY,
                                    watch_group=ofp.OFPG_ANY,
                                    actions=[_action(ofp, parser, a) for a in b.actions])
                   for b in message.buckets]
        return [parser.OFPGroupMod(datapath, ofp.OFPGC_ADD,
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
        return parser.OFPActionOutput(action.port)
    if isinstance(action, Group):
        return parser.OFPActionGroup(action.group_id)
    if isinstance(action, SetField):
        return parser.OFPActionSetField(**{action.field: action.value})
    raise TypeError(f"not an action: {action!r}")
