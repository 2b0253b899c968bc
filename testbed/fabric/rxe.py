"""Real RoCE verbs traffic across the fabric: soft-RoCE (rdma_rxe) endpoints and perftest.

``run --traffic rxe`` (scenario section ``rxe``) adds, after the collective of each policy,
the two standard perftest measurements between real verbs endpoints - ib_write_lat (RDMA
WRITE ping-pong) and ib_write_bw - so traffic with a real RoCE stack's semantics (the
kernel's RC transport, its retransmissions and timers) crosses the same switches, queues and
policy as the emulated GPUs. The collective's figures are not touched; the tests run on the
fabric the collective left idle.

Where the endpoints live. rdma_rxe sends from a UDP socket of the initial network namespace:
measured on Debian 12's 6.1 kernel and on bookworm-backports' 6.12, rxe devices made in two
namespaces come up, perftest exchanges its keys over TCP, and every RDMA WRITE fails (status 5,
no UDP 4791 frame leaves). So the endpoints are attached in the root namespace ("root-namespace"
mode): the NICs of the neighbour hosts on the first and the last leaf are moved there (their
switch ports and the policy's flows for them stay as they were), each gets its host's address
(/32), its shaping again (a move drops qdiscs) and an rxe device. Both addresses are then local
to one namespace, and the kernel would hand A's packets to B over loopback; policy routing sends
them through the fabric instead::

    pref 90   iif <NIC of A or B> lookup local     what arrives on an endpoint NIC is delivered
    pref 91   from A to B iif lo lookup 4791       (table 4791: B via A's NIC), and back
    pref 99   lookup local                         the local table, moved here from pref 0

plus accept_local=1 and rp_filter=0 on the two NICs (their packets come from an address local
to this namespace). perftest's own key exchange (TCP) goes over loopback. Every change is
recorded in the run's ledger with its undo before it is made, and undone after the tests, or
by ``python -m testbed clean`` after a killed run.

The pure parts (what to change, perftest's command lines and output) are separate from the
thin I/O class at the end.

Why one module over 400 lines: every change of the root-namespace mode is paired with its
undo, and the pure plan of them is read beside the thin class that applies it.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import time
from typing import Dict, List, Optional, Tuple

from ..base.errors import CapabilityError
from ..base.procutil import free_tcp_port
from ..base.topology import Host
from ..plan.policyrun import PolicyRun

MODE = "root-namespace"
RULE_IIF, RULE_OUT, RULE_LOCAL = 90, 91, 99
TABLE = 4791
ECT0 = 0b10
QP_TIMEOUT = 18  # 4 us x 2^18 = 1 s: above the deepest emulated queue's drain time
ATTEMPTS = 3
CALIBRATION_FAILED = "Correlation coefficient"  # perftest's clock calibration gave up
_CALIBRATION_NOTE = re.compile(re.escape(CALIBRATION_FAILED) + r" r\^2: \S+ < \S+")
# Latency in CPU cycles (-C), converted here with the clock the kernel measured at boot: no
# run-time calibration to fail (perftest's own gave up now and then under qemu TCG).
CYCLES_TESTS = ("ib_write_lat",)


# --- pure -------------------------------------------------------------------------------------
def device(host: Host) -> str:
    return f"rxe-{host.name}"


def traffic_class(dscp: int) -> int:
    """The GRH traffic class (= the IP TOS byte of RoCEv2): the policy's RoCE DSCP, ECT(0)."""
    return dscp << 2 | ECT0


def root_changes(a: Host, b: Host, mtu: int) -> List[Tuple[str, str]]:
    """(command, undo) pairs, in order, that attach the moved NICs of ``a`` and ``b`` to the
    root namespace's routing (see the module docstring). Each undo is harmless when its
    command never ran."""
    steps = []
    for h, peer in ((a, b), (b, a)):
        i = h.intf
        steps += [
            (f"ip link set dev {i} mtu {mtu} up", "true"),
            (f"ip addr add {h.ip}/32 dev {i}", f"ip addr del {h.ip}/32 dev {i}"),
            (f"ip neigh replace {peer.ip} lladdr {peer.mac} dev {i} nud permanent",
             f"ip neigh del {peer.ip} dev {i}"),
            (f"ip route replace {peer.ip}/32 dev {i} src {h.ip} table {TABLE}",
             f"ip route del {peer.ip}/32 table {TABLE}"),
            (f"ip rule add pref {RULE_IIF} iif {i} lookup local",
             f"ip rule del pref {RULE_IIF} iif {i} lookup local"),
            (f"ip rule add pref {RULE_OUT} from {h.ip} to {peer.ip} iif lo lookup {TABLE}",
             f"ip rule del pref {RULE_OUT} from {h.ip} to {peer.ip} iif lo lookup {TABLE}"),
        ]
    steps += [
        (f"ip rule add pref {RULE_LOCAL} lookup local",
         f"ip rule del pref {RULE_LOCAL} lookup local"),
        ("ip rule del pref 0 lookup local",
         "ip rule show pref 0 | grep -q 'lookup local' || ip rule add pref 0 lookup local"),
    ]
    return steps


def sysctls(a: Host, b: Host) -> Dict[str, int]:
    """Kernel settings the endpoints need: no IPv6 chatter into the fabric, and packets from
    an address local to this namespace accepted on the endpoint NICs."""
    out = {}
    for h in (a, b):
        out[f"/proc/sys/net/ipv6/conf/{h.intf}/disable_ipv6"] = 1
        out[f"/proc/sys/net/ipv4/conf/{h.intf}/accept_local"] = 1
        out[f"/proc/sys/net/ipv4/conf/{h.intf}/rp_filter"] = 0
    out["/proc/sys/net/ipv4/conf/all/rp_filter"] = 0  # the larger of all/<nic> applies
    return out


def route_clashes(routes: List[dict], ips: List[str]) -> List[str]:
    """Root-namespace routes (``ip -j route show table all``) that already cover an endpoint
    address (other than a default route): attaching it here would take that address from the
    machine's own network."""
    out = []
    for r in routes:
        dst = r.get("dst", "")
        if dst in ("default", "") or dst.startswith("127."):
            continue
        try:
            net = ipaddress.ip_network(dst if "/" in dst else dst + "/32", strict=False)
        except ValueError:
            continue
        for ip in ips:
            if ipaddress.ip_address(ip) in net:
                out.append(f"{ip} is in {dst} ({r.get('dev', '?')}, table "
                           f"{r.get('table', 'main')})")
    return out


def roce_v2_ipv4_gid(gids: List[Tuple[str, str]], ip: str) -> Optional[int]:
    """Index of the RoCE v2 GID that carries ``ip`` (an IPv4-mapped ::ffff:a.b.c.d), from
    the device's (gid, type) table."""
    want = ipaddress.IPv6Address("::ffff:" + ip)
    for index, (gid, kind) in enumerate(gids):
        try:
            if ipaddress.IPv6Address(gid) == want and kind.strip().lower() == "roce v2":
                return index
        except ValueError:
            continue
    return None


def perftest_command(test: str, dev: str, gid: int, size: int, iterations: int, port: int,
                     tclass: int, server_ip: Optional[str] = None,
                     cycles: bool = False) -> List[str]:
    cmd = [test, "-d", dev, "-x", str(gid), "-s", str(size), "-n", str(iterations),
           "-p", str(port), "-u", str(QP_TIMEOUT), f"--tclass={tclass}", "-F"]
    return cmd + (["-C"] if cycles else []) + ([server_ip] if server_ip else [])


def cpu_mhz(cpuinfo: str) -> Optional[float]:
    """The first ``cpu MHz`` of /proc/cpuinfo (x86: the TSC rate the kernel calibrated)."""
    m = re.search(r"^cpu MHz\s*:\s*([0-9.]+)", cpuinfo, re.MULTILINE)
    return float(m.group(1)) if m and float(m.group(1)) > 0 else None


def cycles_to_usec(figures: Dict[str, float], mhz: float) -> Dict[str, float]:
    """A latency table perftest printed in cycles (-C keeps the [usec] headers) in usec."""
    return {k: round(v / mhz, 2) if k.endswith("_usec") and v is not None else v
            for k, v in figures.items()}


_NUMBER = re.compile(r"^-?(\d+(\.\d+)?|nan)$")  # inf is no figure (no clock); nan may be one


def parse_perftest(text: str) -> Optional[Dict[str, Optional[float]]]:
    """perftest's result table -> {column: value}: the header line that starts with
    ``#bytes`` and the line of numbers after it (units as in the header: usec, MB/sec, Mpps).
    A ``nan`` figure is None (perftest's stdev in cycles); None when no result line is there
    (the test failed, or every figure is inf: no clock)."""
    lines = [_CALIBRATION_NOTE.sub("", line).strip() for line in text.splitlines()]
    for i, line in enumerate(lines):
        if not line.startswith("#bytes"):
            continue
        header = _split_header(line)
        for row in lines[i + 1:]:
            values = row.split()
            if values and all(_NUMBER.match(v) for v in values) and len(values) >= 3:
                names = [_column(h) for h in header][:len(values)]
                return {n: None if v.endswith("nan") else float(v)
                        for n, v in zip(names, values)}
            if "[" in row:  # the header went on (a calibration note broke its line)
                header += _split_header(row)
    return None


def _split_header(line: str) -> List[str]:
    return [h.strip("#") for h in re.split(r"\s{2,}|\t+|\s(?=#)", line.strip()) if h.strip()]


def _column(header: str) -> str:
    """``t_typical[usec]`` -> ``t_typical_usec``; ``BW average[MB/sec]`` ->
    ``bw_average_mb_per_sec``; ``99% percentile[usec]`` -> ``p99_usec``."""
    h = header.strip().lower().replace("99.9% percentile", "p99_9").replace(
        "99% percentile", "p99").replace("/sec", "_per_sec")
    return re.sub(r"[^a-z0-9]+", "_", h).strip("_")


# --- I/O --------------------------------------------------------------------------------------
def _tsc_mhz() -> Optional[float]:
    """The cycle rate perftest's x86 timer (rdtsc) runs at, as the kernel reports it: the
    ``cpu MHz`` of a machine without frequency scaling (a VM) is the TSC rate calibrated at
    boot; with a cpufreq driver it is the current clock, so perftest calibrates there."""
    if os.uname().machine != "x86_64" or os.path.exists("/sys/devices/system/cpu/cpu0/cpufreq"):
        return None
    try:
        return cpu_mhz(_read("/proc/cpuinfo"))
    except OSError:
        return None


def require(caps) -> None:
    """CapabilityError unless real verbs traffic can run on this machine."""
    if not caps.rxe:
        raise CapabilityError(
            f"--traffic rxe needs the rdma_rxe module (here: {caps.rxe_module}) and perftest "
            "(ib_write_lat, ib_write_bw, rdma): the Vagrant VM has them (scripts/install.sh "
            "--vm)")


class RxeTraffic:
    """The rxe endpoints of one policy's fabric: attached by ``start``, measured by ``run``,
    detached by ``stop`` (which also runs after errors)."""

    def __init__(self, fabric, run: PolicyRun, ledger, caps, out_dir: str):
        scenario, policy = run.scenario, run.policy
        self.fabric, self.cfg = fabric, scenario.rxe
        self.ledger, self.caps = ledger, caps
        self.out_dir = out_dir
        self.mhz = _tsc_mhz()  # None: perftest converts cycles itself
        self.a, self.b = run.rxe_endpoints
        self.tag = f"rxe-{policy.name}"
        self.mtu = fabric.mtu
        self.tclass = traffic_class(policy.dscp()[0])
        self.changed: List[str] = []  # kernel settings set (restored by stop)

    def start(self) -> None:
        require(self.caps)
        clashes = route_clashes(_json(["ip", "-j", "route", "show", "table", "all"]),
                                [self.a.ip, self.b.ip])
        rules = subprocess.run(["ip", "rule", "show", "pref", "0"], capture_output=True,
                               text=True, timeout=20).stdout
        if "lookup local" not in rules:  # moved already (VRF set-ups do): not ours to touch
            clashes.append("the local table's rule is not at pref 0")
        if clashes:
            raise CapabilityError("rxe endpoints cannot join the root namespace here: "
                                  + "; ".join(clashes))
        if not os.path.exists("/sys/module/rdma_rxe"):
            self.ledger.add_undo(self.tag, "modprobe -r rdma_rxe")
            _check(["modprobe", "rdma_rxe"])
        me = os.getpid()
        for h in (self.a, self.b):
            # the switch side is in the ledger already: deleting it removes this end too
            self.fabric.run(self.fabric.host(h.name), f"ip link set dev {h.intf} netns {me}")
            self.fabric.moved_to_root.add(h.name)
        for path, value in sysctls(self.a, self.b).items():
            _set_sysctl(self.ledger, path, value)
            self.changed.append(path)
        for command, undo in root_changes(self.a, self.b, self.mtu):
            self.ledger.add_undo(self.tag, undo)
            _check(["sh", "-c", command])
        for h in (self.a, self.b):
            for command in self.fabric.shape_commands(h.intf):
                _check(["sh", "-c", command])
            self.ledger.add_undo(self.tag, f"rdma link delete {device(h)}")
            _check(["rdma", "link", "add", device(h), "type", "rxe", "netdev", h.intf])

    def run(self, say=lambda s: None) -> dict:
        """Both tests, one after the other; what they measured (or why not)."""
        os.makedirs(self.out_dir, exist_ok=True)
        gids = {h.name: self._gid(h) for h in (self.a, self.b)}
        report = {"mode": MODE, "kernel": os.uname().release,
                  "endpoints": [self.a.name, self.b.name], "path": "cross-leaf",
                  "devices": [device(self.a), device(self.b)], "gid_index": gids,
                  "traffic_class": self.tclass, "size_bytes": self.cfg.size_bytes, "tests": {}}
        for test, n in (("ib_write_lat", self.cfg.lat_iterations),
                        ("ib_write_bw", self.cfg.bw_iterations)):
            say(f"rxe: {test} {self.a.name} -> {self.b.name}, {n} x {self.cfg.size_bytes} B")
            before = self._counters()
            result = self._one(test, n, gids)
            after = self._counters()
            result["nic_packets"] = {k: after[k] - before[k] for k in after}
            report["tests"][test] = result
        return report

    def stop(self) -> List[str]:
        """Undo every change (newest first); the failures, for a warning."""
        for h in (self.a, self.b):
            self.fabric.moved_to_root.discard(h.name)
        failed = self.ledger.undo(self.tag)
        for path in self.changed:
            self.ledger.restore_sysctl(path)
        return failed

    # --- helpers ----------------------------------------------------------------------------
    def _gid(self, host: Host) -> int:
        base = f"/sys/class/infiniband/{device(host)}/ports/1"
        gids = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            gids = []
            for i in range(len(os.listdir(f"{base}/gids"))):
                try:
                    gids.append((_read(f"{base}/gids/{i}"), _read(f"{base}/gid_attrs/types/{i}")))
                except OSError:  # an unused entry has no type
                    gids.append(("", ""))
            index = roce_v2_ipv4_gid(gids, host.ip)
            if index is not None:
                return index
            time.sleep(0.2)
        raise CapabilityError(f"rxe device {device(host)} has no RoCE v2 GID for {host.ip}")

    def _one(self, test: str, iterations: int, gids: Dict[str, int]) -> dict:
        """One test; again (up to ATTEMPTS in all) when perftest could not calibrate the CPU
        clock it converts cycles with - its figures are then inf (seen under qemu TCG)."""
        for attempt in range(1, ATTEMPTS + 1):
            result = self._attempt(test, iterations, gids)
            result["attempts"] = attempt
            if not result.get("uncalibrated"):
                return result
        return result

    def _attempt(self, test: str, iterations: int, gids: Dict[str, int]) -> dict:
        port = free_tcp_port()
        cycles = test in CYCLES_TESTS and self.mhz is not None
        common = dict(size=self.cfg.size_bytes, iterations=iterations, port=port,
                      tclass=self.tclass, cycles=cycles)
        server_cmd = perftest_command(test, device(self.b), gids[self.b.name], **common)
        client_cmd = perftest_command(test, device(self.a), gids[self.a.name],
                                      server_ip=self.b.ip, **common)
        logs = {role: os.path.join(self.out_dir, f"{test}-{role}.txt")
                for role in ("server", "client")}
        with open(logs["server"], "w") as out:
            server = subprocess.Popen(server_cmd, stdout=out, stderr=subprocess.STDOUT)
        self.ledger.add_pid(server.pid)
        try:
            client = self._client(client_cmd, logs["client"], port)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
        with open(logs["client"]) as f:
            text = f.read()
        figures = parse_perftest(text)
        result = {"command": " ".join(client_cmd), "exit_code": client, "results": figures,
                  "log": os.path.relpath(logs["client"], os.path.dirname(self.out_dir))}
        if cycles and figures:
            result["results"] = cycles_to_usec(figures, self.mhz)
            result["clock"] = {"cycles_per_usec": self.mhz, "source": "/proc/cpuinfo cpu MHz"}
        if client != 0 or figures is None:
            tail = " / ".join(line.strip() for line in text.strip().splitlines()[-3:])
            result["error"] = f"{test} failed (exit {client}): {tail}"
            result["uncalibrated"] = client == 0 and CALIBRATION_FAILED in text
        return result

    def _client(self, cmd: List[str], log: str, port: int) -> int:
        """Run the client once the server listens; its exit code (124: timed out)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not _listening(port):
            time.sleep(0.1)
        with open(log, "w") as out:
            client = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
            self.ledger.add_pid(client.pid)
            try:
                return client.wait(timeout=self.cfg.timeout_s)
            except subprocess.TimeoutExpired:
                return 124
            finally:  # also on Ctrl-C
                if client.poll() is None:
                    client.kill()
                    client.wait()

    def _counters(self) -> Dict[str, int]:
        def read(intf, what):
            return int(_read(f"/sys/class/net/{intf}/statistics/{what}"))
        return {"a_tx": read(self.a.intf, "tx_packets"), "b_rx": read(self.b.intf, "rx_packets"),
                "b_tx": read(self.b.intf, "tx_packets"), "a_rx": read(self.a.intf, "rx_packets")}


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def _json(cmd: List[str]) -> list:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    try:
        return json.loads(out.stdout or "[]")
    except ValueError:
        return []


def _check(cmd: List[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise CapabilityError(f"rxe set-up: '{' '.join(cmd)}' failed: "
                              f"{(done.stderr or done.stdout).strip()}")


def _set_sysctl(ledger, path: str, value: int) -> None:
    try:
        old = int(_read(path))
    except (OSError, ValueError):
        raise CapabilityError(f"rxe set-up: cannot read {path}")
    if old == value:
        return
    ledger.add_sysctl(path, old, value)
    with open(path, "w") as f:
        f.write(str(value))


def _listening(port: int) -> bool:
    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True,
                         timeout=10).stdout
    return bool(out.strip())
