"""A fabric split over several machines with Mininet Cluster Edition (thin I/O edge).

``testbed.plan.placement`` decides which server holds which node; this module builds the network
with ``mininet.examples.cluster``: remote nodes are shells reached over ssh, cross-server
links are ssh tap tunnels (``RemoteSSHLink``). The controller stays on 127.0.0.1 of this
machine: each remote server reaches it through an ssh reverse tunnel bound to *its* loopback
(``-R 127.0.0.1:PORT:127.0.0.1:PORT``), so no OpenFlow port is opened on any network.
"""
from __future__ import annotations

import os
import subprocess
import time
from typing import Dict, List

from mininet.examples.cluster import (MininetCluster, RemoteLink, RemoteOVSSwitch,
                                      RemoteSSHLink)
from mininet.link import Link
from mininet.net import Mininet

from ..base.errors import FabricError
from ..base.ledger import OVS_TAG
from ..plan.placement import LOCAL

class ClusterNet(MininetCluster):
    """MininetCluster without the controller-address rewrite: Cluster Edition moves a loopback
    controller to this machine's external address (exposing it); the switches here keep
    127.0.0.1, and the remote ones reach it through their reverse tunnel."""

    def addController(self, *args, **kwargs):
        return Mininet.addController(self, *args, **kwargs)


class TaggedRemoteOVSSwitch(RemoteOVSSwitch):
    run_id = "unknown"

    def bridgeOpts(self):
        return super().bridgeOpts() + f" external_ids:{OVS_TAG}={self.run_id}"


def ssh_command(user: str, server: str) -> List[str]:
    return ["ssh", "-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes",
            "-o", "ServerAliveInterval=5", f"{user}@{server}"]


class ReverseTunnel:
    """``ssh -N -R``: the server's 127.0.0.1:port leads to this machine's 127.0.0.1:port."""

    def __init__(self, user: str, server: str, port: int, sockets: Dict[str, str] = None,
                 local_sockets: Dict[str, str] = None):
        self.user, self.server, self.port = user, server, port
        self.sockets = sockets or {}  # remote unix socket -> local one (events, PFC)
        self.local_sockets = local_sockets or {}  # local unix socket -> remote one (PFC)
        self.proc = None

    def start(self, timeout: float = 10.0) -> int:
        forwards = ["-R", f"127.0.0.1:{self.port}:127.0.0.1:{self.port}"]
        for remote, local in self.sockets.items():
            forwards += ["-R", f"{remote}:{local}"]
        for local, remote in self.local_sockets.items():
            forwards += ["-L", f"{local}:{remote}"]
        ssh = ssh_command(self.user, self.server)
        self.proc = subprocess.Popen(
            ssh[:1] + ["-N", "-o", "StreamLocalBindUnlink=yes"] + forwards + ssh[1:],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise FabricError(f"ssh reverse tunnel to {self.server} failed: "
                                  f"{self.proc.stderr.read().decode(errors='replace').strip()}")
            probe = subprocess.run(ssh_command(self.user, self.server) + [
                f"ss -Htln 'sport = :{self.port}'"], capture_output=True, text=True, timeout=15)
            if "127.0.0.1:" in probe.stdout:  # listening there, on its loopback only
                return self.proc.pid
            time.sleep(0.2)
        self.stop()
        raise FabricError(f"ssh reverse tunnel to {self.server}: port {self.port} not "
                          f"reachable there after {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


class Workspace:
    """A private directory per remote server (mode 0700, under /var/tmp, named after the run):
    configurations go there, outputs come back with scp, and it is removed at teardown.
    Nothing is assumed shared between the machines."""

    def __init__(self, user: str, run_id: str):
        self.user, self.run_id = user, run_id
        self.dirs: Dict[str, str] = {}

    def run(self, server: str, command: str) -> str:
        """A shell command on ``server``; its output (FabricError if it fails)."""
        r = subprocess.run(ssh_command(self.user, server) + [command], capture_output=True,
                           text=True, timeout=60)
        if r.returncode:
            raise FabricError(f"{server}: '{command[:60]}' failed: {r.stderr.strip()[:200]}")
        return r.stdout

    def dir(self, server: str) -> str:
        if server not in self.dirs:
            path = f"/var/tmp/ai-fabric-testbed-{self.run_id}-{len(self.dirs) + 1}"
            self.run(server, f"mkdir -m 700 {path}")
            self.dirs[server] = path
        return self.dirs[server]

    def _scp(self, *args: str) -> None:
        # -S ssh: the ssh found on PATH, as every other ssh call here (scp defaults to a
        # compiled-in path)
        r = subprocess.run(["scp", "-q", "-B", "-S", "ssh", *args], capture_output=True,
                           text=True, timeout=300)
        if r.returncode:
            raise FabricError(f"scp {' '.join(args)[:120]} failed: {r.stderr.strip()[:200]}")

    def put(self, server: str, local_path: str) -> str:
        """Copy a file there; returns its path on the server."""
        remote = f"{self.dir(server)}/{os.path.basename(local_path)}"
        self._scp(local_path, f"{self.user}@{server}:{remote}")
        return remote

    def get(self, server: str, pattern: str, local_dir: str) -> None:
        """Copy the files matching ``pattern`` (on the server) into ``local_dir``."""
        self._scp(f"{self.user}@{server}:{pattern}", local_dir)

    def remove_one(self, server: str) -> None:
        """Remove ``server``'s directory, if this run made one."""
        path = self.dirs.pop(server, None)
        if path is None:
            return
        try:
            self.run(server, f"rm -rf {path}")
        except (FabricError, subprocess.TimeoutExpired):
            pass  # the server is gone: clean --servers removes it later


def clock_offset(user: str, server: str, samples: int = 20) -> Dict[str, float]:
    """The server's CLOCK_REALTIME minus this machine's, from timestamps exchanged over one
    ssh session (the sample with the shortest round trip; uncertainty: half of it)."""
    proc = subprocess.Popen(ssh_command(user, server) + [
        "while read -r _; do date +%s%N; done"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    best = None
    try:
        for _ in range(samples):
            t0 = time.time_ns()
            proc.stdin.write("\n")
            proc.stdin.flush()
            line = proc.stdout.readline().strip()
            t1 = time.time_ns()
            if not line.isdigit():
                raise FabricError(f"{server}: cannot read its clock: "
                                  f"{(line or proc.stderr.read()).strip()[:200]}")
            sample = (t1 - t0, int(line) - (t0 + t1) // 2)
            best = sample if best is None or sample[0] < best[0] else best
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
    return {"offset_us": round(best[1] / 1000, 1), "uncertainty_us": round(best[0] / 2000, 1)}


class RemoteVXLANLink(RemoteLink):
    """A cross-server link as a VXLAN tunnel between the two servers (the GRE link of Cluster
    Edition needs gretap, which many kernels lack; VXLAN is widely available). Each link has
    its own VNI; the underlay must carry the link MTU + 50 bytes (or the kernel fragments)."""

    vni = 0

    def stop(self):
        if self.tunnel:
            self.intf1.delete()
            self.intf2.delete()
        else:
            Link.stop(self)
        self.tunnel = None

    def makeIntfPair(self, intfname1, intfname2, addr1=None, addr2=None, node1=None,
                     node2=None, deleteIntfs=True):
        node1 = self.node1 if node1 is None else node1
        node2 = self.node2 if node2 is None else node2
        if getattr(node1, "server", LOCAL) == getattr(node2, "server", LOCAL):
            return Link.makeIntfPair(intfname1, intfname2, addr1, addr2, node1, node2,
                                     deleteIntfs=deleteIntfs)
        self.make_tunnel(node1, node2, intfname1, intfname2, addr1, addr2)
        self.tunnel = 1
        return None

    def make_tunnel(self, node1, node2, intf1, intf2, addr1, addr2):
        if node2.server == LOCAL:  # this machine's end first
            return self.make_tunnel(node2, node1, intf2, intf1, addr2, addr1)
        ip1, ip2 = node1.serverIP, node2.serverIP
        if node1.server == LOCAL:  # this machine's address towards the other server
            route = subprocess.run(["ip", "route", "get", ip2], capture_output=True,
                                   text=True).stdout
            ip1 = route.split(" src ")[1].split()[0]
        type(self).vni += 1
        for node, intf, addr, local, remote in ((node1, intf1, addr1, ip1, ip2),
                                                (node2, intf2, addr2, ip2, ip1)):
            out = node.rcmd(f"ip link add name {intf} type vxlan id {self.vni} local {local} "
                            f"remote {remote} dstport {VXLAN_PORT} ttl 64 nolearning")
            if out:
                raise FabricError(f"VXLAN link {intf} on {node.server}: {out.strip()}")
            if addr:
                node.rcmd(f"ip link set {intf} address {addr}")
            node.rcmd(f"ip link set dev {intf} up")
            if not self.moveIntf(intf, node):
                raise FabricError(f"VXLAN link {intf}: could not move it to {node}")
        return None


VXLAN_PORT = 4789
LINKS = {"ssh": RemoteSSHLink, "vxlan": RemoteVXLANLink}
LINK_TEXT = {"ssh": "ssh tap tunnel (Mininet Cluster RemoteSSHLink)",
             "vxlan": f"VXLAN (UDP {VXLAN_PORT}, a VNI per link)"}


VXLAN_PROBE = ("ip link add tbvxprobe0 type vxlan id 999999 dstport 4789 local 127.0.0.1 "
               "&& ip link del tbvxprobe0 && echo ok")  # a throw-away device


def has_vxlan(run=None) -> bool:
    """Whether a kernel can make VXLAN devices; ``run`` executes a shell command on the
    server in question (default: here)."""
    if run is None:
        out = subprocess.run(["sh", "-c", VXLAN_PROBE], capture_output=True, text=True).stdout
    else:
        out = run(VXLAN_PROBE)
    return out.strip().endswith("ok")


def check_server(user: str, server: str) -> List[tuple]:
    """(what, ok, detail) for each thing a split run needs from ``server``."""
    import sys

    from .. import __version__

    out = []
    r = subprocess.run(ssh_command(user, server) + ["echo ok"], capture_output=True,
                       text=True, timeout=30)
    if r.returncode or r.stdout.strip() != "ok":
        return [("ssh as " + user, False,
                 f"{r.stderr.strip()[:160] or 'no answer'}: install its key, e.g. "
                 f"ssh-copy-id {user}@{server}, and allow root logins by key")]
    out.append(("ssh as " + user, True, "key login works"))
    probes = [
        ("Mininet (mnexec)", "command -v mnexec", "install Mininet: scripts/install.sh there"),
        ("Open vSwitch running", "ovs-vsctl --timeout=3 show >/dev/null && echo ok",
         "start it: scripts/install.sh there"),
        ("same testbed version", f"{sys.executable} -c 'import testbed; "
                                 f"print(testbed.__version__)'",
         f"install this project (version {__version__}) at {sys.executable} there"),
        ("VXLAN", VXLAN_PROBE, "cluster.link ssh will be used"),
    ]
    for what, command, advice in probes:
        r = subprocess.run(ssh_command(user, server) + [command], capture_output=True,
                           text=True, timeout=30)
        text = r.stdout.strip()
        ok = r.returncode == 0 and bool(text) and (
            text == __version__ if what == "same testbed version" else True)
        detail = text.splitlines()[-1][:80] if ok else f"{text[:60] or 'missing'}: {advice}"
        out.append((what, ok, detail))
    try:
        c = clock_offset(user, server)
        out.append(("clock offset", True,
                    f"{c['offset_us']:+.0f} us (+- {c['uncertainty_us']:.0f} us)"))
    except FabricError as e:
        out.append(("clock offset", False, str(e)))
    return out


def clean_server(user: str, server: str, interfaces: List[str]) -> List[str]:
    """Remove from ``server`` what a split run left there: bridges tagged by the testbed, the
    run's interfaces (from this machine's ledger), the workspaces. Returns what went."""
    import shlex
    import sys

    names = " ".join(shlex.quote(i) for i in interfaces)
    links = (f"for i in {names}; do ip link del \"$i\" 2>/dev/null && "
             "echo \"removed interface $i\"; done; ") if names else ""
    script = (f"{sys.executable} -m testbed clean 2>&1 | grep '^removed' ; " + links +
              "for d in /var/tmp/ai-fabric-testbed-*; do [ -d \"$d\" ] && rm -rf \"$d\" && "
              "echo \"removed workspace $d\"; done; true")
    r = subprocess.run(ssh_command(user, server) + [script], capture_output=True, text=True,
                       timeout=120)
    if r.returncode:
        raise FabricError(f"clean on {server} failed: {r.stderr.strip()[:200]}")
    return [f"{server}: {line}" for line in r.stdout.splitlines() if line.strip()]
