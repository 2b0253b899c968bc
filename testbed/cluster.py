"""A fabric split over several machines with Mininet Cluster Edition (thin I/O edge).

``testbed.placement`` decides which server holds which node; this module builds the network
with ``mininet.examples.cluster``: remote nodes are shells reached over ssh, cross-server
links are ssh tap tunnels (``RemoteSSHLink``). The controller stays on 127.0.0.1 of this
machine: each remote server reaches it through an ssh reverse tunnel bound to *its* loopback
(``-R 127.0.0.1:PORT:127.0.0.1:PORT``), so no OpenFlow port is opened on any network.
"""
from __future__ import annotations

import subprocess
import time
from typing import Dict, List

from mininet.examples.cluster import MininetCluster, RemoteOVSSwitch, RemoteSSHLink
from mininet.net import Mininet

from .errors import FabricError
from .ledger import OVS_TAG

LOCAL = "localhost"


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

    def __init__(self, user: str, server: str, port: int):
        self.user, self.server, self.port = user, server, port
        self.proc = None

    def start(self, timeout: float = 10.0) -> int:
        self.proc = subprocess.Popen(
            ssh_command(self.user, self.server)[:1] + ["-N", "-R",
                                                       f"127.0.0.1:{self.port}:127.0.0.1:"
                                                       f"{self.port}"]
            + ssh_command(self.user, self.server)[1:],
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


def remote_servers(where: Dict[str, str]) -> List[str]:
    return sorted({s for s in where.values() if s != LOCAL})


LINKS = {"ssh": RemoteSSHLink}
