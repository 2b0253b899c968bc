"""The os-ken application: a thin adapter between OpenFlow events and a policy core.

It reads its settings from os-ken's configuration (registered by ``controllers.launcher``):
the fabric plan (JSON), the policy name and a state file. When a switch connects it sends the
policy's messages and a barrier; when the barrier reply arrives it appends a line
``{"event": "programmed", "dpid": ...}`` to the state file, which is how the runner knows the
switch is ready. Errors from switches are appended too (``"event": "error"``).
"""
from __future__ import annotations

import json
import logging
import time

from os_ken import cfg
from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.ofproto import ofproto_v1_3

from testbed.topology import FabricPlan

from .ofp import to_ofp
from .policy import policy_class

LOG = logging.getLogger(__name__)


class FabricController(app_manager.OSKenApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        conf = cfg.CONF
        with open(conf.testbed_fabric, encoding="utf-8") as f:
            plan = FabricPlan.from_dict(json.load(f))
        self.policy = policy_class(conf.testbed_policy)(plan)
        self.state_path = conf.testbed_state
        self.pending_barriers = {}  # xid -> dpid
        self.packet_ins = 0
        LOG.info("policy %s on %r", self.policy.name, plan)

    def _state(self, **event) -> None:
        event["time"] = time.time()
        with open(self.state_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(event) + "\n")

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def switch_features(self, ev):
        dp = ev.msg.datapath
        try:
            messages = self.policy.switch_connected(dp.id)
        except KeyError:
            LOG.warning("dpid %016x: not part of this fabric, ignored", dp.id)
            return
        name = self.policy.plan.switch_by_dpid(dp.id).name
        sent = 0
        for message in messages:
            for ofp_msg in to_ofp(dp, message):
                dp.send_msg(ofp_msg)
                sent += 1
        barrier = dp.ofproto_parser.OFPBarrierRequest(dp)
        dp.set_xid(barrier)
        self.pending_barriers[barrier.xid] = dp.id
        dp.send_msg(barrier)
        LOG.info("%s (dpid %016x): sent %d messages, waiting for barrier", name, dp.id, sent)

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def barrier_reply(self, ev):
        dpid = self.pending_barriers.pop(ev.msg.xid, None)
        if dpid is None:
            return
        name = self.policy.plan.switch_by_dpid(dpid).name
        LOG.info("%s (dpid %016x): programmed", name, dpid)
        self._state(event="programmed", dpid=dpid, switch=name)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def error_msg(self, ev):
        msg = ev.msg
        LOG.error("dpid %016x: OpenFlow error type=%d code=%d", msg.datapath.id, msg.type,
                  msg.code)
        self._state(event="error", dpid=msg.datapath.id, type=msg.type, code=msg.code)

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def packet_in(self, ev):
        # Policies here are proactive; a packet-in means a switch met a packet no flow expects.
        self.packet_ins += 1
        if self.packet_ins <= 10 or self.packet_ins % 1000 == 0:
            LOG.warning("dpid %016x: unexpected packet-in #%d (ignored)", ev.msg.datapath.id,
                        self.packet_ins)
