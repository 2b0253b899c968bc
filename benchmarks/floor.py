"""The floor: the cheapest way this machine moves a run's frames through its fabric.

``python -m benchmarks.floor CONFIG.json`` serves every GPU host the configuration lists, one
process for all (sockets opened in each host's namespace): each GPU sends its frames - a count
and a size per destination - from one prebuilt RoCEv2 frame per destination, as fast as its
NIC takes them (a send buffer of a few frames; the loop sleeps until the NIC has room), and
counts what arrives on UDP port 4791. No transport, no pacing, no timestamps, no records: what
is left is what the frames themselves cost in Open vSwitch and the kernel, plus a raw send and
receive each. ``benchmarks/cost.py`` runs it beside a real run to put the run's cost in
proportion.

Protocol: ``ready`` once every socket is bound; ``go``; ``done <sent> <received> <data>`` when
every frame was sent and either all arrived or none arrived for ``QUIET_S`` (``data``: the
data frames among those received, ACK-shaped control frames left out).
"""
from __future__ import annotations

import json
import select
import socket
import sys
import time
from typing import Dict, List

from testbed.base.procutil import die_with_parent, in_netns

from traffic import roce

SNDBUF = 32 << 10  # the kernel doubles it: a few frames in the NIC queue, never its limit
QUIET_S = 0.5


class FloorNic:
    """One GPU host's NIC: frames to send per destination, and a counter of arrivals."""

    def __init__(self, cfg: dict):
        with in_netns(cfg["netns_pid"]):
            self.tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
            self.tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
            self.tx.bind((cfg["intf"], 0))
            self.tx.setblocking(False)
            self.rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            self.rx.bind((cfg["ip"], roce.ROCE_UDP_PORT))
            self.rx.setblocking(False)
        me = roce.Endpoint(cfg["mac"], cfg["ip"])
        # (frame, frames left) per destination, sent round-robin
        self.queue: List[list] = []
        for dst in cfg["frames"]:
            payload = max(roce.MIN_PAYLOAD, dst["bytes"] - 58)  # headers and ICRC: 58 B
            conn = roce.Connection(me, roce.Endpoint(dst["mac"], dst["ip"]), 0xC000, 0x100)
            if dst.get("control"):  # an ACK-sized frame (the receiver tells them apart)
                frame = roce.ack_frame(conn.src, conn.dst, 0xC000, 0x100, roce.ROCE_TOS & 0xFC)
            else:
                frame = bytes(conn.template(roce.RC_RDMA_WRITE_MIDDLE, payload).fill(
                    0, False, time.time_ns(), 0, 0))
            self.queue.append([frame, dst["count"]])
        self.sent = self.received = self.data_received = 0
        self.buf = bytearray(9216)

    def send(self) -> bool:
        """Send until the NIC is full; False once everything is sent."""
        tx, queue = self.tx, self.queue
        while queue:
            for entry in list(queue):
                try:
                    tx.send(entry[0])
                except BlockingIOError:
                    return True
                self.sent += 1
                entry[1] -= 1
                if entry[1] == 0:
                    queue.remove(entry)
        return False

    def receive(self) -> None:
        rx, buf = self.rx, self.buf
        while True:
            try:
                rx.recv_into(buf)
            except BlockingIOError:
                return
            self.received += 1
            self.data_received += buf[0] != roce.RC_ACKNOWLEDGE


def run(nics: List[FloorNic], expected: int) -> None:
    epoll = select.epoll()
    by_fd: Dict[int, FloorNic] = {}
    sending: Dict[int, FloorNic] = {}
    for nic in nics:
        by_fd[nic.rx.fileno()] = nic
        epoll.register(nic.rx.fileno(), select.EPOLLIN)
        if nic.queue:
            sending[nic.tx.fileno()] = nic
            epoll.register(nic.tx.fileno(), select.EPOLLOUT)
    last = time.monotonic()
    while True:
        received = sum(n.received for n in nics)
        if not sending and (received >= expected or time.monotonic() - last > QUIET_S):
            return
        for fd, _ev in epoll.poll(QUIET_S / 5):
            nic = by_fd.get(fd)
            if nic is not None:
                nic.receive()
                last = time.monotonic()
            elif fd in sending and not sending[fd].send():
                epoll.unregister(fd)
                del sending[fd]
                last = time.monotonic()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    die_with_parent()
    with open(argv[0], encoding="utf-8") as f:
        cfg = json.load(f)
    nics = [FloorNic(c) for c in cfg["gpus"]]
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    run(nics, sum(c["expect"] for c in cfg["gpus"]))
    print(f"done {sum(n.sent for n in nics)} {sum(n.received for n in nics)} "
          f"{sum(n.data_received for n in nics)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
