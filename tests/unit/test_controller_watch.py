"""The real os-ken controller against a switch that connects but never finishes the
handshake: the runner's 'not programmed' error quotes what the controller saw of it."""
import socket
import struct
import time

import pytest

from controllers.app import WATCH_S
from controllers.policy import make_policy
from os_ken.ofproto import ofproto_v1_3 as ofp
from testbed.scenario.config import Scenario
from testbed.run.controller_process import ControllerProcess
from testbed.base.errors import ControllerError
from testbed.base.topology import FabricPlan

PLAN = FabricPlan(1, 2, 1)


class NoLedger:
    def add_pid(self, pid):
        pass


def connect(port: int) -> socket.socket:
    deadline = time.monotonic() + 60  # the controller imports os-ken first
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=1)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_switch_that_never_answers_features_is_named_with_its_handshake_state(tmp_path):
    scenario = Scenario.from_dict({}).for_checks()
    ctl = ControllerProcess(make_policy("hyperscale", PLAN, scenario), str(tmp_path),
                            str(tmp_path), NoLedger())
    ctl.start()
    try:
        switch = connect(ctl.port)
        # OpenFlow 1.3 hello, then silence: the features request is never answered
        switch.sendall(struct.pack("!BBHI", ofp.OFP_VERSION, ofp.OFPT_HELLO, 8, 1))
        with pytest.raises(ControllerError) as e:
            ctl.wait_programmed([s.dpid for s in PLAN.switches], timeout=WATCH_S + 5)
        said = str(e.value)
        assert "not programmed after" in said and "waiting to program lf1, lf2, sp1" in said
        # one connection, past the hello (os-ken's CONFIG state), its datapath id unknown
        assert f"{switch.getsockname()[1]}:config:None" in said, said
        switch.close()
    finally:
        ctl.stop()
