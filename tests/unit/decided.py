"""A policy's run as the runner decides it (``testbed.plan.policyrun.decide``) on a machine whose
capabilities are fixed here, for unit tests of what is built from it."""
from testbed.base.capabilities import Capabilities
from testbed.plan.policyrun import decide

CAPS = Capabilities(root=True, qdiscs={"red": False}, ovs_running=True, ovs_version="3.1.0",
                    openvswitch_module=False, os_ken=True, mininet=True, tshark=True,
                    bpf_marking=True)


def decided(name, plan, scenario, caps=CAPS):
    return decide(name, plan, scenario, caps)
