"""The real os-ken controller against a scripted OpenFlow 1.3 switch on loopback.

os-ken 4 runs each connection and each app in its own native thread: the connection's thread
asks for the port description (os-ken moves the datapath to MAIN_DISPATCHER when the reply is
handled) while the app's thread sends the policy's messages and its barrier. Whichever is
sent first is answered first, so the barrier's reply can arrive while os-ken still has the
datapath in CONFIG_DISPATCHER. The switch must count as programmed anyway.

The switch-queue emulator's events reach the policy through the app's own event queue.
"""
import json
import socket
import struct
import time

import pytest

from controllers.app import QueueEvent
from controllers.policy import make_policy
from os_ken.ofproto import ofproto_v1_3 as ofp
from testbed.scenario.config import Scenario
from testbed.base.errors import ControllerError
from testbed.run.controller_process import ControllerProcess
from testbed.base.topology import FabricPlan

PLAN = FabricPlan(2, 2, 1)


class ScriptedSwitch:
    """One OpenFlow 1.3 connection: answers the handshake, holds back what it is told to."""

    def __init__(self, port: int, dpid: int):
        deadline = time.monotonic() + 60  # the controller imports os-ken first
        while True:
            try:
                self.sock = socket.create_connection(("127.0.0.1", port), timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.sock.settimeout(30)
        self.dpid, self.buf = dpid, b""
        self.send(ofp.OFPT_HELLO, 1)

    def send(self, kind: int, xid: int, body: bytes = b"") -> None:
        self.sock.sendall(struct.pack("!BBHI", ofp.OFP_VERSION, kind, 8 + len(body), xid)
                          + body)

    def next_message(self):
        """(type, xid) of the next message from the controller."""
        while len(self.buf) < 8 or len(self.buf) < struct.unpack("!H", self.buf[2:4])[0]:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the controller closed the connection")
            self.buf += chunk
        _, kind, length, xid = struct.unpack("!BBHI", self.buf[:8])
        self.buf = self.buf[length:]
        return kind, xid

    def answer(self, kind: int, xid: int) -> None:
        if kind == ofp.OFPT_FEATURES_REQUEST:
            # datapath_id, n_buffers, n_tables, auxiliary_id, pad, capabilities, reserved
            self.send(ofp.OFPT_FEATURES_REPLY, xid,
                      struct.pack("!QIBB2xII", self.dpid, 0, 254, 0, 0, 0))
        elif kind == ofp.OFPT_ECHO_REQUEST:
            self.send(ofp.OFPT_ECHO_REPLY, xid)

    def port_description(self, xid: int) -> None:
        # multipart type, flags, pad: a port description with no ports
        self.send(ofp.OFPT_MULTIPART_REPLY, xid, struct.pack("!HH4x", ofp.OFPMP_PORT_DESC, 0))

    def run_barrier_first(self) -> None:
        """Answer everything, but the port description only after the barrier's reply."""
        held = None
        while True:
            kind, xid = self.next_message()
            if kind == ofp.OFPT_MULTIPART_REQUEST:
                held = xid  # os-ken's port-description request
            elif kind == ofp.OFPT_BARRIER_REQUEST:
                self.send(ofp.OFPT_BARRIER_REPLY, xid)
                time.sleep(0.5)  # the controller reads the barrier reply on its own
                if held is not None:
                    self.port_description(held)
                return
            else:
                self.answer(kind, xid)

    def run_in_order(self) -> None:
        """Answer everything in order until the barrier's reply is sent."""
        while True:
            kind, xid = self.next_message()
            if kind == ofp.OFPT_MULTIPART_REQUEST:
                self.port_description(xid)
            elif kind == ofp.OFPT_BARRIER_REQUEST:
                self.send(ofp.OFPT_BARRIER_REPLY, xid)
                return
            else:
                self.answer(kind, xid)

    def flow_mods(self, seconds: float) -> int:
        """How many flow mods arrive within ``seconds`` (echo requests answered)."""
        count, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            self.sock.settimeout(max(0.05, end - time.monotonic()))
            try:
                kind, xid = self.next_message()
            except socket.timeout:
                break
            count += kind == ofp.OFPT_FLOW_MOD
            self.answer(kind, xid)
        self.sock.settimeout(30)
        return count


class NoLedger:
    def add_pid(self, pid):
        pass


@pytest.fixture
def controller(tmp_path):
    started = []

    def start(name):
        scenario = Scenario.from_dict({}).for_checks()
        ctl = ControllerProcess(make_policy(name, PLAN, scenario), str(tmp_path),
                                str(tmp_path), NoLedger())
        started.append(ctl)
        ctl.start()
        return ctl
    yield start
    for ctl in started:
        ctl.stop()


@pytest.mark.parametrize("name", ["enterprise", "hyperscale", "lossless"])
def test_a_barrier_answered_before_the_port_description_still_programs_the_switch(
        controller, name):
    ctl = controller(name)
    dpid = PLAN.switches[0].dpid
    switch = ScriptedSwitch(ctl.port, dpid)
    switch.run_barrier_first()
    ctl.wait_programmed([dpid], timeout=20)  # ControllerError otherwise
    switch.sock.close()


def test_queue_load_from_the_emulator_moves_adaptive_routing_slots(controller):
    """A backlog report on the event socket reaches the lossless policy (in the app's own
    thread) and comes out as flow mods to the leaf; a malformed line is skipped."""
    ctl = controller("lossless")
    leaf = PLAN.leaves[0]
    switch = ScriptedSwitch(ctl.port, leaf.dpid)
    switch.run_in_order()
    ctl.wait_programmed([leaf.dpid], timeout=20)
    switch.flow_mods(0.5)  # anything still on its way from the programming
    uplinks = sorted(PLAN.uplinks().values())
    events = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    events.connect(ctl.events_path)
    busy = {str(leaf.dpid): {str(uplinks[0]): 500_000, str(uplinks[1]): 0}}
    events.sendall(b"not json\n" + json.dumps({"load": busy}).encode() + b"\n")
    # one uplink left: its slot rewritten and the hash over one slot
    assert switch.flow_mods(10) == 2
    events.close()
    switch.sock.close()


def test_queue_event_lines_parse_into_typed_events():
    e = QueueEvent.parse('{"ecn": [[65537, 3, 1]], "load": {"65537": {"3": 1500}}}')
    assert e.ecn == [(65537, 3, True)] and e.load == {65537: {3: 1500}}
    assert QueueEvent.parse('{"ecn": []}').load is None
    for bad in ("not json", '{"ecn": [[1, 2]]}', '{"load": {"x": {}}}', "[]"):
        with pytest.raises((ValueError, KeyError, TypeError, AttributeError)):
            QueueEvent.parse(bad)


def test_a_handler_that_raises_leaves_the_app_serving_and_says_so(controller, tmp_path):
    """os-ken's native hub re-raises a handler's exception out of the app's event loop, which
    then ends without a word: every later event - a switch's features, a barrier reply - would
    wait forever. A queue event the policy cannot turn into a valid message (a port number
    past OpenFlow's 32 bits) must not stop the next one from being served."""
    ctl = controller("lossless")
    leaf = PLAN.leaves[0]
    switch = ScriptedSwitch(ctl.port, leaf.dpid)
    switch.run_in_order()
    ctl.wait_programmed([leaf.dpid], timeout=20)
    switch.flow_mods(0.5)
    uplinks = sorted(PLAN.uplinks().values())
    events = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    events.connect(ctl.events_path)
    events.sendall(json.dumps({"ecn": [[leaf.dpid, 1 << 40, 1]]}).encode() + b"\n")
    busy = {str(leaf.dpid): {str(uplinks[0]): 500_000, str(uplinks[1]): 0}}
    events.sendall(json.dumps({"load": busy}).encode() + b"\n")
    assert switch.flow_mods(10) == 2
    with open(ctl.log_path, encoding="utf-8") as f:
        assert "queue_event failed" in f.read()
    with pytest.raises(ControllerError, match="lossless controller's queue_event failed"):
        ctl.programmed()  # what the runner reads while it waits for switches
    events.close()
    switch.sock.close()
