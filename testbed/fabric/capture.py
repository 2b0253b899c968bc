"""Optional packet capture (``measurement.pcap``): tcpdump on GPU NICs during the traffic.

Each capture runs inside its host's namespace, keeps ``pcap_snaplen`` bytes of every RoCE
frame (UDP 4791: data, ACK/NAK, CNP) and writes ``pcap/<policy>/<host>.pcap``. The processes
are in the run's ledger and stopped with SIGINT (so tcpdump flushes), then SIGKILL.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from typing import Dict, List

from ..base.errors import CapabilityError, FabricError
from ..base.frames import ROCE_UDP_PORT

START_TIMEOUT_S = 10.0


def capture_hosts(plan, measurement) -> List[str]:
    return list(measurement.pcap_hosts) or [h.name for h in plan.gpus]


class PacketCapture:
    def __init__(self, fabric, plan, measurement, out_dir: str, ledger):
        self.fabric, self.plan, self.m = fabric, plan, measurement
        self.out_dir, self.ledger = out_dir, ledger
        self.procs: Dict[str, subprocess.Popen] = {}

    def path(self, host: str) -> str:
        return os.path.join(self.out_dir, f"{host}.pcap")

    def start(self) -> None:
        if not shutil.which("tcpdump"):
            raise CapabilityError("measurement.pcap needs tcpdump: run scripts/install.sh")
        os.makedirs(self.out_dir, exist_ok=True)
        for host in capture_hosts(self.plan, self.m):
            # --immediate-mode: without it the packets of the last, partly filled ring block
            # are lost when tcpdump stops; its own summary goes to <host>.log
            with open(os.path.join(self.out_dir, f"{host}.log"), "wb") as log:
                proc = self.fabric.host(host).popen(
                    ["tcpdump", "-i", self.plan.host(host).intf, "-s", str(self.m.pcap_snaplen),
                     "-U", "--immediate-mode", "-n", "-w", self.path(host),
                     "udp", "port", str(ROCE_UDP_PORT)],
                    stdout=subprocess.DEVNULL, stderr=log)
            self.ledger.add_pid(proc.pid)
            self.procs[host] = proc
        deadline = time.monotonic() + START_TIMEOUT_S
        for host, proc in self.procs.items():  # tcpdump writes the file header once it listens
            while not (os.path.exists(self.path(host)) and os.path.getsize(self.path(host))):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise FabricError(f"tcpdump did not start on {host}")
                time.sleep(0.05)

    def stop(self) -> Dict[str, dict]:
        """Stop every capture; returns {host: {"file", "bytes"}}."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        return {host: {"file": os.path.relpath(self.path(host), os.path.dirname(
                    os.path.dirname(self.out_dir))),
                       "bytes": os.path.getsize(self.path(host))
                       if os.path.exists(self.path(host)) else 0}
                for host in self.procs}
