"""The os-ken application: a thin adapter between OpenFlow events and a policy core.

Settings come from os-ken's configuration (registered by ``controllers.launcher``): a policy
file (policy name, fabric plan, parameters, context), a state file and an event socket.

* When a switch connects it sends the policy's messages and a barrier; the barrier reply
  appends ``{"event": "programmed", "dpid": ...}`` to the state file - how the runner knows
  the switch is ready. Errors from switches are appended too (``"event": "error"``).
* Packet-ins go to ``policy.packet_in``.
* The switch-queue emulator connects to the event socket (a UNIX socket in the run's private
  directory) and sends JSON lines: ``{"ecn": [[dpid, port, marking], ...],
  "load": {dpid: {port: backlog}}}`` (either part optional); they go to
  ``policy.ecn_changed`` and ``policy.queue_load``.

os-ken 4 runs on native threads (its default hub): one per connection, one for this app's
event loop, one per task spawned here. The policy is called only from the event loop. Every
handler is ``served``: the native hub's ``TaskExit`` is ``Exception``, so os-ken's event loop
re-raises whatever a handler raises and ends without a word - no later event would be handled.
A handler's failure is logged and appended as ``{"event": "handler_failed", ...}`` instead.
"""
from __future__ import annotations

import functools
import gc
import json
import logging
import os
import socket
import sys
import time
import traceback
from typing import Dict, List, Optional, Tuple

from os_ken import cfg
from os_ken.base import app_manager
from os_ken.controller import event, ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.lib import hub
from os_ken.lib.packet import ethernet, packet
from os_ken.ofproto import ofproto_v1_3

from .contract import ControllerConfig, ControllerEvent
from .ofp import to_ofp

LOG = logging.getLogger(__name__)
WATCH_S = 10.0  # while a switch of the plan waits to be programmed, say why this often


def load_policy(path: str):
    """The policy described by a policy file written by the runner."""
    with open(path, encoding="utf-8") as f:
        return ControllerConfig.from_dict(json.load(f)).build()


class QueueEvent(event.EventBase):
    """One line from the switch-queue emulator: ECN changes [(dpid, port, marking)] and the
    latest backlogs {dpid: {port: bytes}} (None: not in this line)."""

    def __init__(self, ecn: List[Tuple[int, int, bool]],
                 load: Optional[Dict[int, Dict[int, int]]]):
        super().__init__()
        self.ecn, self.load = ecn, load

    @classmethod
    def parse(cls, line: str) -> "QueueEvent":
        raw = json.loads(line)
        ecn = [(int(d), int(p), bool(m)) for d, p, m in raw.get("ecn", ())]
        load = None
        if "load" in raw:
            load = {int(d): {int(p): int(b) for p, b in ports.items()}
                    for d, ports in raw["load"].items()}
        return cls(ecn, load)


def where(thread, depth: int = 6) -> str:
    """The innermost frames one of os-ken's (native) threads is in, on one line."""
    if not getattr(thread, "is_alive", lambda: True)():
        return "(ended)"  # its ident may already be another thread's
    frame = sys._current_frames().get(getattr(thread, "ident", None))
    if frame is None:
        return "(not running)"
    return " < ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"
                      for f in reversed(traceback.extract_stack(frame)[-depth:]))


def served(handler):
    """``handler`` with its failures logged and reported to the runner, not raised into
    os-ken's event loop (which would end it; module docstring)."""
    @functools.wraps(handler)
    def serve(self, ev):
        try:
            handler(self, ev)
        except Exception as e:
            LOG.exception("%s failed on %s", handler.__name__, type(ev).__name__)
            datapath = getattr(getattr(ev, "msg", None), "datapath", None)
            self._state(event="handler_failed", handler=handler.__name__,
                        dpid=getattr(datapath, "id", None), error=f"{type(e).__name__}: {e}")
    return serve


class FabricController(app_manager.OSKenApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        conf = cfg.CONF
        self.policy = load_policy(conf.testbed_policy_file)
        self.state_path = conf.testbed_state
        self.datapaths = {}
        self.pending_barriers = {}  # xid -> dpid
        self.programmed = set()
        self.counters = {"packet_in": 0, "ecn_events": 0, "load_events": 0, "flow_mods": 0,
                         "bad_events": 0}
        LOG.info("policy %s on %r, params %s", self.policy.name, self.policy.plan,
                 self.policy.params_dict())
        if conf.testbed_events:
            hub.spawn(self._serve_events, conf.testbed_events)
        hub.spawn(self._watch)

    def _state(self, **event) -> None:
        line = ControllerEvent(time=time.time(), **event).to_dict()
        with open(self.state_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")

    def _send(self, dpid, messages) -> None:
        dp = self.datapaths.get(dpid)
        if dp is None:
            return
        for message in messages:
            for ofp_msg in to_ofp(dp, message):
                dp.send_msg(ofp_msg)
                self.counters["flow_mods"] += 1

    # --- OpenFlow ---------------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    @served
    def switch_features(self, ev):
        # the reply's own id: os-ken's handler sets datapath.id from it in its own thread,
        # which may not have run yet (dp.id None on a slow machine)
        dp, dpid = ev.msg.datapath, ev.msg.datapath_id
        try:
            messages = self.policy.switch_connected(dpid)
        except KeyError:
            LOG.warning("dpid %016x: not part of this fabric, ignored", dpid)
            return
        name = self.policy.plan.switch_by_dpid(dpid).name
        self.datapaths[dpid] = dp
        try:
            self._send(dpid, messages)
        except Exception as e:  # os-ken would swallow it; the runner must hear of it
            LOG.exception("%s: could not program the switch", name)
            self._state(event="failed", dpid=dpid, error=f"{type(e).__name__}: {e}")
            return
        barrier = dp.ofproto_parser.OFPBarrierRequest(dp)
        dp.set_xid(barrier)
        self.pending_barriers[barrier.xid] = dpid
        dp.send_msg(barrier)
        LOG.info("%s (dpid %016x): sent %d messages, waiting for barrier", name, dpid,
                 len(messages))

    # os-ken's own handler asks for the port description in the connection's thread while
    # this app sends the policy's messages and barrier from its own: a switch may answer the
    # barrier first, and os-ken dispatches that reply still in CONFIG_DISPATCHER.
    @set_ev_cls(ofp_event.EventOFPBarrierReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    @served
    def barrier_reply(self, ev):
        dpid = self.pending_barriers.pop(ev.msg.xid, None)
        if dpid is None:
            return
        name = self.policy.plan.switch_by_dpid(dpid).name
        LOG.info("%s (dpid %016x): programmed", name, dpid)
        self.programmed.add(dpid)
        self._state(event="programmed", dpid=dpid, switch=name)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    @served
    def error_msg(self, ev):
        msg = ev.msg
        LOG.error("dpid %016x: OpenFlow error type=%d code=%d data=%s", msg.datapath.id,
                  msg.type, msg.code, bytes(msg.data[:64]).hex())
        self._state(event="error", dpid=msg.datapath.id, type=msg.type, code=msg.code)

    @set_ev_cls(ofp_event.EventOFPPacketIn, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    @served
    def packet_in(self, ev):
        msg = ev.msg
        self.counters["packet_in"] += 1
        if not self.policy.wants_packet_in:
            if self.counters["packet_in"] <= 10:
                LOG.warning("dpid %016x: unexpected packet-in (ignored)", msg.datapath.id)
            return
        try:
            eth = packet.Packet(msg.data).get_protocol(ethernet.ethernet)
        except Exception:  # a malformed frame must not take the controller down
            eth = None
        if eth is None:
            return
        in_port = msg.match.get("in_port", 0)
        metadata = msg.match.get("metadata", 0)
        self._send(msg.datapath.id, self.policy.packet_in(msg.datapath.id, in_port, metadata,
                                                          eth.src))

    def _watch(self) -> None:
        """While a switch of the plan is not programmed: each OpenFlow connection's handshake
        state in os-ken and the events queued for this app and for os-ken's own handler - the
        last lines the runner quotes when it gives up (a switch that connected but was never
        programmed: did its features reach this app, or does the app's queue stand still?)."""
        from os_ken.controller.controller import Datapath
        while True:
            hub.sleep(WATCH_S)
            waiting = [s.name for s in self.policy.plan.switches
                       if s.dpid not in self.programmed]
            if not waiting:
                return
            conns = sorted(f"{dp.address[1] if dp.address else '?'}:{dp.state}:"
                           f"{dp.id if dp.id is None else format(dp.id, 'x')}:"
                           f"{dp.send_q.qsize() if dp.send_q is not None else '-'}"
                           for dp in gc.get_objects() if isinstance(dp, Datapath))
            handler = app_manager.lookup_service_brick("ofp_event")
            LOG.warning("waiting to program %s; events queued: this app %d, os-ken's handler "
                        "%s; connections (port:state:dpid:messages waiting to be sent): %s; "
                        "CPU %.1f s; this app's event loop at %s",
                        ", ".join(waiting), self.events.qsize(),
                        handler.events.qsize() if handler else "?", " ".join(conns) or "none",
                        time.process_time(), where(self.threads[0]) if self.threads else "?")

    # --- events from the switch-queue emulator ------------------------------------------------
    # os-ken runs each app, connection and spawned task in a native thread: the socket's
    # readers hand events to this app's own queue, so the policy is only called from its loop.
    def _serve_events(self, path: str) -> None:
        if os.path.exists(path):
            os.unlink(path)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        os.chmod(path, 0o600)
        server.listen(4)
        LOG.info("listening for queue events on %s", path)
        while True:
            conn, _ = server.accept()
            hub.spawn(self._read_events, conn)

    def _read_events(self, conn) -> None:
        with conn, conn.makefile("r", encoding="utf-8") as lines:
            for line in lines:
                try:
                    parsed = QueueEvent.parse(line)
                except (ValueError, KeyError, TypeError, AttributeError) as e:
                    self.counters["bad_events"] += 1
                    LOG.warning("bad queue event %r: %s", line[:80], e)
                    continue
                self.send_event(self.name, parsed)

    @set_ev_cls(QueueEvent)
    @served
    def queue_event(self, ev: QueueEvent) -> None:
        for dpid, port, marking in ev.ecn:
            self.counters["ecn_events"] += 1
            self._send(dpid, self.policy.ecn_changed(dpid, port, marking))
        if ev.load is not None:
            self.counters["load_events"] += 1
            for dpid, messages in self.policy.queue_load(ev.load).items():
                self._send(dpid, messages)

    def close(self):
        LOG.info("counters %s", json.dumps(self.counters))
        super().close()
