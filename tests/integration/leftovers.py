"""What a testbed run could leave on the machine: used to prove teardown is complete."""
import os
import subprocess

from testbed.base.ledger import read_record, tagged_bridges, tagged_interfaces
from testbed.base.procutil import cmdline
from testbed.base.topology import FabricPlan

PROCESS_MARKERS = ("traffic.agent", "traffic.flows", "testbed.switchq.emulator",
                   "controllers.launcher", "mininet:", "iperf3 -", "ib_write_lat", "ib_write_bw")


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


def root_routing():
    """What ``--traffic rxe`` changes in the root namespace and must undo (testbed.fabric.rxe): its
    rules, its table, the local table's rule at pref 0, its rxe devices."""
    from testbed.fabric import rxe

    rules = subprocess.run(["ip", "rule", "show"], capture_output=True, text=True).stdout
    left = [f"rule {line.strip()}" for line in rules.splitlines()
            if line.split(":")[0] in {str(rxe.RULE_IIF), str(rxe.RULE_OUT), str(rxe.RULE_LOCAL)}]
    if not any(line.startswith("0:") and "lookup local" in line for line in rules.splitlines()):
        left.append("rule 0: from all lookup local is missing")
    table = subprocess.run(["ip", "route", "show", "table", str(rxe.TABLE)],
                           capture_output=True, text=True).stdout.strip()
    if table:
        left.append(f"routes in table {rxe.TABLE}: {table}")
    if os.path.isdir("/sys/class/infiniband"):
        left += [f"rdma device {d}" for d in os.listdir("/sys/class/infiniband")
                 if d.startswith("rxe-")]
    return left


def leftovers(plan: FabricPlan = None):
    """Everything testbed-made still present (empty list = clean)."""
    plan = plan or FabricPlan(2, 4, 2, neighbours_per_leaf=2)
    names = set(plan.interface_names()) | {s.name for s in plan.switches}
    left = [f"bridge {b}" for b in tagged_bridges()]
    left += [f"interface {i}" for i in sorted(root_interfaces() & names)]
    left += [f"interface {i} (tagged)" for i in sorted(set(tagged_interfaces()) - names)]
    left += [f"process {p}" for p in testbed_processes()]
    left += root_routing()
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
