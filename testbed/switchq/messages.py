"""What the switch-queue emulator (``testbed.switchq.emulator``) tells others, never blocking its
sampling loop: the controller (ECN marking changes, adaptive routing's load) and, in a fabric
split over servers, the other servers' emulators (PFC for queues they hold)."""
from __future__ import annotations

import json
import os
import socket
from typing import Dict, List, Optional, Tuple

from ..base.errors import FabricError
from .contract import EmulatorConfig
from .pfc import Queue


class Outbox:
    """Events for the controller, never blocking the sampling loop.

    Only the latest state matters (marking on or off per port, the latest load), so pending
    changes are merged and written when the socket takes them; a slow controller delays
    marking changes instead of stopping PFC.
    """

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.setblocking(False)
        self.ecn: Dict[Tuple[int, int], bool] = {}
        self.load: Optional[Dict[int, Dict[int, int]]] = None
        self.pending = b""

    def flush(self) -> bool:
        """Send what is pending; False if some of it must wait for the next sample."""
        if not self.pending and (self.ecn or self.load):
            event = {}
            if self.ecn:
                event["ecn"] = [[d, p, m] for (d, p), m in sorted(self.ecn.items())]
            if self.load:
                event["load"] = {str(d): {str(p): b for p, b in ports.items()}
                                 for d, ports in self.load.items()}
            self.pending = (json.dumps(event) + "\n").encode()
            self.ecn, self.load = {}, None
        while self.pending:
            try:
                sent = self.sock.send(self.pending)
            except BlockingIOError:
                return False
            self.pending = self.pending[sent:]
        return True


class PfcRelay:
    """PFC between the queue emulators of a split fabric: a switch on one server pauses the
    queues that feed it, and some of those are on another server. Each emulator listens on a
    unix socket; messages (``{"c": lane's minor, "q": [node, intf], "a": PAUSE|RESUME}`` of
    ``testbed.switchq.emulator``, one JSON line each) go to the emulator of the server that
    holds the queue - reached through the socket forwards of the servers' ssh tunnel; remote
    emulators reach only the main one, which passes on what is not its own. Nothing here
    blocks the sampling loop."""

    def __init__(self, cfg: EmulatorConfig):
        self.me = cfg.server
        self.owner: Dict[str, str] = cfg.owner  # node -> server
        self.peers: Dict[str, str] = cfg.pfc_peers  # server (or "*") -> socket path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            os.unlink(cfg.pfc_listen)
        except FileNotFoundError:
            pass
        self.listener.bind(cfg.pfc_listen)
        self.listener.listen(16)
        self.listener.setblocking(False)
        self.inbound: List[Tuple[socket.socket, bytearray]] = []
        self.outbound: Dict[str, Tuple[Optional[socket.socket], bytearray]] = {}
        self.counters = {"relayed_out": 0, "relayed_in": 0, "passed_on": 0}

    def local(self, q: Queue) -> bool:
        return self.owner.get(q.node, self.me) == self.me

    def send(self, minor: int, q: Queue, action: int, counted: str = "relayed_out") -> None:
        dest = self.owner[q.node]
        if not (self.peers.get(dest) or self.peers.get("*")):
            raise FabricError(f"PFC relay: no way to reach the emulator of {dest}")
        sock, buf = self.outbound.get(dest, (None, bytearray()))
        buf += (json.dumps({"c": minor, "q": [q.node, q.intf], "a": action}) + "\n").encode()
        self.outbound[dest] = (sock, buf)
        if sock is None:  # connect now; if the peer is not up, the next flush tries again
            self._reconnect(dest)
        self.counters[counted] += 1

    def flush(self) -> None:
        for dest, (sock, buf) in list(self.outbound.items()):
            while sock is not None and buf:
                try:
                    sent = sock.send(buf)
                except BlockingIOError:
                    break
                except OSError:  # the forward closed (peer not up yet): reconnect later
                    sock.close()
                    sock = None
                    self.outbound[dest] = (None, buf)
                    self.counters["reconnects"] = self.counters.get("reconnects", 0) + 1
                    break
                del buf[:sent]
            if sock is None and buf:
                self._reconnect(dest)

    def _reconnect(self, dest: str) -> None:
        path = self.peers.get(dest) or self.peers.get("*")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            sock.setblocking(False)
        except OSError:
            sock.close()
            return
        self.outbound[dest] = (sock, self.outbound[dest][1])

    def receive(self) -> List[Tuple[int, Queue, int]]:
        """Messages from peers for this server's queues (and passes on the others')."""
        while True:
            try:
                conn, _ = self.listener.accept()
            except BlockingIOError:
                break
            conn.setblocking(False)
            self.inbound.append((conn, bytearray()))
        mine = []
        for conn, buf in self.inbound:
            try:
                chunk = conn.recv(65536)
            except BlockingIOError:
                continue
            buf += chunk
            *lines, rest = buf.split(b"\n")
            buf[:] = rest
            for line in lines:
                m = json.loads(line)
                q = Queue(m["q"][0], m["q"][1])
                if self.local(q):
                    mine.append((int(m["c"]), q, int(m["a"])))
                    self.counters["relayed_in"] += 1
                else:
                    self.send(int(m["c"]), q, int(m["a"]), "passed_on")
        return mine

    def close(self) -> None:
        for conn, _ in self.inbound:
            conn.close()
        for sock, _ in self.outbound.values():
            if sock is not None:
                sock.close()
        self.listener.close()
