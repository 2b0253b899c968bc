"""Plain flows between emulated hosts: for probing mechanisms (incast, priorities, ECMP, AR).

``python -m traffic.flows send CONFIG.json`` sends one flow from the host it runs in:

* ``"kind": "roce"`` - RDMA WRITE MIDDLE packets from the agent's templates on an AF_PACKET
  socket, as fast as the NIC takes them (the socket blocks like a NIC) or paced by
  ``interval_us``; ``sport`` fixed, or ``"per-packet"`` for Ultra-Ethernet-style entropy;
  ``dscp`` and ``ecn`` set the IP TOS;
* ``"kind": "udp"`` - small datagrams from a kernel UDP socket (e.g. interactive traffic),
  with ``dscp`` and a pacing interval.

Each packet carries its send time. ``python -m traffic.flows recv CONFIG.json`` counts what
arrives on UDP ports 4791 (RoCE) and 5001 (udp flows) until it gets SIGTERM or ``duration_s``
passes, with kernel receive timestamps and the ECN bits of every packet, and writes a JSON
summary: packets, CE marks and one-way latencies per sending address and kind.
"""
from __future__ import annotations

import json
import random
import select
import signal
import socket
import struct
import sys
import time
from typing import Dict

from testbed.procutil import die_with_parent

from . import roce
from .rxsocket import ANCILLARY_BYTES, ancillary, open_rx

UDP_PROBE_PORT = 5001
STAMP = struct.Struct("!Q")


def send_roce(cfg: dict) -> dict:
    me = roce.Endpoint(cfg["src_mac"], cfg["src_ip"])
    peer = roce.Endpoint(cfg["dst_mac"], cfg["dst_ip"])
    per_packet = cfg.get("sport") == "per-packet"
    sport = 0xC000 if per_packet else int(cfg.get("sport", 0xC000))
    tos = (cfg.get("dscp", 26) << 2) | cfg.get("ecn", 2)
    tpl = roce.Connection(me, peer, sport, cfg.get("dqpn", 0x10000), tos).template(
        roce.RC_RDMA_WRITE_MIDDLE, cfg.get("payload", 4096))
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1)  # block like a NIC
    tx.bind((cfg["intf"], 0))
    interval = cfg.get("interval_us", 0) / 1e6
    rng = random.Random(cfg.get("seed", 1))
    next_at = time.monotonic()
    for psn in range(cfg["packets"]):
        if per_packet:
            tpl.set_sport(0xC000 | rng.getrandbits(14))
        tx.send(tpl.fill(psn, False, time.time_ns(), 0, 0))
        if interval:
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
    tx.close()
    return {"sent": cfg["packets"]}


def send_udp(cfg: dict) -> dict:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, (cfg.get("dscp", 0) << 2) | cfg.get("ecn", 0))
    if "sport" in cfg:
        s.bind((cfg["src_ip"], int(cfg["sport"])))
    pad = bytes(max(0, cfg.get("payload", 64) - STAMP.size))
    interval = cfg.get("interval_us", 1000) / 1e6
    for _ in range(cfg["packets"]):
        s.sendto(STAMP.pack(time.time_ns()) + pad, (cfg["dst_ip"], UDP_PROBE_PORT))
        time.sleep(interval)
    s.close()
    return {"sent": cfg["packets"]}


def receive(cfg: dict, stop) -> dict:
    socks = {}
    for port in (roce.ROCE_UDP_PORT, UDP_PROBE_PORT):
        s = open_rx(cfg["ip"], port)
        socks[s.fileno()] = (s, "roce" if port == roce.ROCE_UDP_PORT else "udp")
    print("ready", flush=True)
    flows: Dict[str, dict] = {}
    deadline = time.monotonic() + cfg.get("duration_s", 600)
    poller = select.poll()
    for fd in socks:
        poller.register(fd, select.POLLIN)
    while not stop() and time.monotonic() < deadline:
        for fd, _ev in poller.poll(100):
            s, kind = socks[fd]
            while True:
                try:
                    data, anc, _f, addr = s.recvmsg(9216, ANCILLARY_BYTES)
                except BlockingIOError:
                    break
                rx_ns, tos, _dropped = ancillary(anc)
                if kind == "roce":
                    pkt = roce.parse_udp_payload(data)
                    tx_ns = pkt.tx_ns if pkt else 0
                else:
                    tx_ns = STAMP.unpack_from(data)[0] if len(data) >= STAMP.size else 0
                f = flows.setdefault(f"{kind} {addr[0]}", {"packets": 0, "ce": 0,
                                                           "latency_us": []})
                f["packets"] += 1
                f["ce"] += (tos & 3) == 3
                if tx_ns and rx_ns:
                    f["latency_us"].append((rx_ns - tx_ns) / 1000.0)
    for s, _k in socks.values():
        s.close()
    return {"flows": flows}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    die_with_parent()
    if len(argv) != 2 or argv[0] not in ("send", "recv"):
        print("usage: python -m traffic.flows send|recv CONFIG.json", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        cfg = json.load(f)
    if argv[0] == "send":
        result = send_roce(cfg) if cfg.get("kind", "roce") == "roce" else send_udp(cfg)
    else:
        stopping = []
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
        result = receive(cfg, lambda: bool(stopping))
    with open(cfg["out"], "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
