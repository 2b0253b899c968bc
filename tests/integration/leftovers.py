"""What a testbed run could leave on the machine: used to prove teardown is complete."""
import os
import subprocess

from testbed.ledger import read_record, tagged_bridges
from testbed.procutil import cmdline
from testbed.topology import FabricPlan

PROCESS_MARKERS = ("traffic.agent", "traffic.flows", "testbed.switchq", "controllers.launcher",
                   "mininet:", "iperf3 -")


def processes():
    """(pid, command line) of every process but this one."""
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            cmd = cmdline(int(pid))
            if cmd:
                yield int(pid), cmd


def testbed_processes(exclude=()):
    return [f"{pid}: {cmd[:80]}" for pid, cmd in processes()
            if pid not in exclude and any(m in cmd for m in PROCESS_MARKERS)]


def root_interfaces():
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def leftovers(plan: FabricPlan = None):
    """Everything testbed-made still present (empty list = clean)."""
    plan = plan or FabricPlan(2, 4, 2, neighbours_per_leaf=2)
    names = set(plan.interface_names()) | {s.name for s in plan.switches}
    left = [f"bridge {b}" for b in tagged_bridges()]
    left += [f"interface {i}" for i in sorted(root_interfaces() & names)]
    left += [f"process {p}" for p in testbed_processes()]
    if read_record():
        left.append("ledger record /run/ai-fabric-testbed/run.json")
    return left


def wait_clean(plan=None, timeout=10.0):
    import time
    deadline = time.monotonic() + timeout
    while True:
        left = leftovers(plan)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
