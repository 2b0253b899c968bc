"""The real os-ken controller against a scripted OpenFlow 1.3 switch on loopback.

os-ken moves a datapath to MAIN_DISPATCHER only when the port-description reply has been
processed, in its own handler's green thread; the app sends the policy's messages and its
barrier in another. A switch may answer the barrier before that reply has been processed (a
slow machine: seen in the VM test's TCG guest). The switch must count as programmed anyway.
"""
import socket
import struct
import time

import pytest

from controllers.policy import make_policy
from os_ken.ofproto import ofproto_v1_3 as ofp
from testbed.config import Scenario
from testbed.controller import ControllerProcess
from testbed.topology import FabricPlan

PLAN = FabricPlan(1, 2, 1)


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

    def run_barrier_first(self) -> None:
        """Answer everything, but the port description only after the barrier's reply."""
        held = None
        while True:
            kind, xid = self.next_message()
            if kind == ofp.OFPT_FEATURES_REQUEST:
                # datapath_id, n_buffers, n_tables, auxiliary_id, pad, capabilities, reserved
                self.send(ofp.OFPT_FEATURES_REPLY, xid,
                          struct.pack("!QIBB2xII", self.dpid, 0, 254, 0, 0, 0))
            elif kind == ofp.OFPT_ECHO_REQUEST:
                self.send(ofp.OFPT_ECHO_REPLY, xid)
            elif kind == ofp.OFPT_MULTIPART_REQUEST:
                held = xid  # os-ken's port-description request
            elif kind == ofp.OFPT_BARRIER_REQUEST:
                self.send(ofp.OFPT_BARRIER_REPLY, xid)
                time.sleep(0.5)  # the controller reads the barrier reply on its own
                if held is not None:
                    # multipart type, flags, pad: a port description with no ports
                    self.send(ofp.OFPT_MULTIPART_REPLY, held,
                              struct.pack("!HH4x", ofp.OFPMP_PORT_DESC, 0))
                return


class NoLedger:
    def add_pid(self, pid):
        pass


@pytest.mark.parametrize("name", ["enterprise", "hyperscale", "lossless"])
def test_a_barrier_answered_before_the_port_description_still_programs_the_switch(
        tmp_path, name):
    scenario = Scenario.from_dict({}).for_checks()
    ctl = ControllerProcess(make_policy(name, PLAN, scenario), str(tmp_path), str(tmp_path),
                            NoLedger())
    ctl.start()
    try:
        dpid = PLAN.switches[0].dpid
        switch = ScriptedSwitch(ctl.port, dpid)
        switch.run_barrier_first()
        ctl.wait_programmed([dpid], timeout=20)  # ControllerError otherwise
        switch.sock.close()
    finally:
        ctl.stop()
