"""Plain flows between emulated hosts: for probing mechanisms (incast, priorities, ECMP, AR).

``python -m traffic.flows send CONFIG.json`` sends one flow from the host it runs in (CONFIG:
a ``traffic.contract.FlowConfig``):

* ``"kind": "roce"`` - RDMA WRITE MIDDLE packets from the agent's templates on an AF_PACKET
  socket, as fast as the NIC takes them (the socket blocks like a NIC) or paced by
  ``interval_us``; ``sport`` fixed, or ``"per-packet"`` for Ultra-Ethernet-style entropy;
  ``dscp`` and ``ecn`` set the IP TOS;
  with ``bursts``, synchronised bursts (incast) until a deadline;
* ``"kind": "udp"`` - datagrams from a kernel UDP socket (interactive or background traffic),
  with ``dscp`` and a pacing interval, or a rate for a duration.

Senders stop early on SIGTERM and still write their summary. With ``"start": "stdin"`` a
sender prints ``ready`` once loaded and waits for ``go <start_ns>`` on stdin.

Each packet carries its send time. ``python -m traffic.flows recv CONFIG.json`` counts what
arrives on UDP ports 4791 (RoCE) and 5001 (udp flows) until it gets SIGTERM or ``duration_s``
passes, with kernel receive timestamps and the ECN bits of every packet (taking what arrived
at most every ``RX_MODERATION_S``), and writes a JSON summary: packets, CE marks and one-way
latencies per sending address and kind.
"""
from __future__ import annotations

import dataclasses
import json
import random
import select
import signal
import socket
import struct
import sys
import time
from typing import Dict

from testbed.base.procutil import die_with_parent

from . import roce
from .contract import FlowConfig, FlowSeen, FlowsReceived, FlowsSent
from .rxsocket import ANCILLARY_BYTES, ancillary, open_rx

UDP_PROBE_PORT = 5001
# A receiver that found packets sleeps this long before it looks again, like a NIC's
# interrupt moderation: kernel receive timestamps date every packet, so only its CPU changes
# (4 noisy-neighbour receivers at 15 Mbit/s: one wake per packet cost about 0.15 CPU)
RX_MODERATION_S = 0.005
STAMP = struct.Struct("!Q")


def _given(value, default):
    return default if value is None else value


def send_roce(cfg: FlowConfig, stop=lambda: False) -> FlowsSent:
    """RoCE frames: ``packets`` of them back to back (or paced by ``interval_us``) from
    ``start_ns`` (default now), or - with ``bursts`` - ``packets`` per burst, bursts every
    ``period_us`` from ``start_ns`` until ``duration_s`` has passed (synchronised incast when
    several senders share a start)."""
    me = roce.Endpoint(cfg.src_mac, cfg.src_ip)
    peer = roce.Endpoint(cfg.dst_mac, cfg.dst_ip)
    per_packet = cfg.sport == "per-packet"
    sport = 0xC000 if per_packet else int(_given(cfg.sport, 0xC000))
    tos = (_given(cfg.dscp, 26) << 2) | _given(cfg.ecn, 2)
    tpl = roce.Connection(me, peer, sport, cfg.dqpn, tos).template(
        roce.RC_RDMA_WRITE_MIDDLE, _given(cfg.payload, 4096))
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1)  # block like a NIC
    tx.bind((cfg.intf, 0))
    tx.setblocking(False)
    rng = random.Random(cfg.seed)
    psn = 0

    def send_one() -> bool:
        nonlocal psn
        if per_packet:
            tpl.set_sport(roce.random_source_port(rng))
        ok = _send_like_a_nic(tx, tpl.fill(psn & 0xFFFFFF, False, time.time_ns(), 0, 0), stop)
        psn += ok
        return ok

    try:
        bursts = cfg.bursts
        if bursts:
            start = bursts.start_ns
            end = start + int(bursts.duration_s * 1e9)
            period = int(bursts.period_us * 1000)
            k = 0
            while not stop():
                at = start + k * period
                if at >= end or not _sleep_until(at, stop):
                    break
                for _ in range(bursts.packets):
                    if not send_one():
                        break
                k += 1
            return FlowsSent(sent=psn, bursts=k)
        if not _sleep_until(cfg.start_ns, stop):
            return FlowsSent()
        interval = _given(cfg.interval_us, 0) / 1e6
        next_at = time.monotonic()
        for _ in range(cfg.packets):
            if not send_one():
                break
            if interval:
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        return FlowsSent(sent=psn)
    finally:
        tx.close()


def _send_like_a_nic(tx: socket.socket, frame: bytes, stop) -> bool:
    """Send one frame, waiting while the NIC queue is full; False if told to stop first."""
    while True:
        try:
            tx.send(frame)
            return True
        except BlockingIOError:
            if stop():
                return False
            select.select([], [tx], [], 0.1)


def _sleep_until(at_ns: int, stop) -> bool:
    while True:
        left = (at_ns - time.time_ns()) / 1e9
        if left <= 0:
            return True
        if stop():
            return False
        time.sleep(min(left, 0.1))


def send_udp(cfg: FlowConfig, stop=lambda: False) -> FlowsSent:
    """UDP datagrams with a send-time stamp: ``packets`` of them every ``interval_us``, or -
    with ``duration_s`` - at ``rate_mbit`` from ``start_ns`` (default now) until it passes."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS,
                 (_given(cfg.dscp, 0) << 2) | _given(cfg.ecn, 0))
    if cfg.sport is not None:
        s.bind((cfg.src_ip, int(cfg.sport)))
    size = _given(cfg.payload, 64)
    pad = bytes(max(0, size - STAMP.size))
    if cfg.duration_s is not None:
        interval_ns = int((size + 28) * 8e9 / (cfg.rate_mbit * 1e6))  # + IP/UDP headers
        count = None
    else:
        interval_ns = int(_given(cfg.interval_us, 1000) * 1000)
        count = cfg.packets
    start = cfg.start_ns or time.time_ns()
    end = start + int(_given(cfg.duration_s, 0) * 1e9)
    sent = errors = 0
    try:
        if not _sleep_until(start, stop):
            return FlowsSent()
        while not stop():
            if count is not None and sent + errors >= count:
                break
            at = start + (sent + errors) * interval_ns
            if count is None and at >= end:
                break
            if not _sleep_until(at, stop):
                break
            try:
                s.sendto(STAMP.pack(time.time_ns()) + pad, (cfg.dst_ip, UDP_PROBE_PORT))
                sent += 1
            except OSError:  # ENOBUFS: the NIC queue was full; the datagram is lost
                errors += 1
    finally:
        s.close()
    return FlowsSent(sent=sent, send_errors=errors)


def receive(cfg: FlowConfig, stop) -> FlowsReceived:
    socks = {}
    for port in (roce.ROCE_UDP_PORT, UDP_PROBE_PORT):
        s = open_rx(cfg.ip, port)
        socks[s.fileno()] = (s, "roce" if port == roce.ROCE_UDP_PORT else "udp")
    print("ready", flush=True)
    flows: Dict[str, list] = {}  # per flow: packets, CE-marked, latencies
    deadline = time.monotonic() + _given(cfg.duration_s, 600)
    poller = select.poll()
    for fd in socks:
        poller.register(fd, select.POLLIN)
    while not stop() and time.monotonic() < deadline:
        ready = poller.poll(100)
        for fd, _ev in ready:
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
                f = flows.setdefault(f"{kind} {addr[0]}", [0, 0, []])
                f[0] += 1
                f[1] += (tos & 3) == 3
                if tx_ns and rx_ns:
                    f[2].append((rx_ns - tx_ns) / 1000.0)
        if ready:
            time.sleep(RX_MODERATION_S)
    for s, _k in socks.values():
        s.close()
    return FlowsReceived({k: FlowSeen(n, ce, tuple(lat)) for k, (n, ce, lat) in flows.items()})


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    die_with_parent()
    if len(argv) != 2 or argv[0] not in ("send", "recv"):
        print("usage: python -m traffic.flows send|recv CONFIG.json", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        cfg = FlowConfig.from_dict(json.load(f))
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    stop = lambda: bool(stopping)  # noqa: E731
    if argv[0] == "send" and cfg.start == "stdin":
        # started ahead of time: say so, then learn the common start time (``go <ns>``)
        print("ready", flush=True)
        line = sys.stdin.readline().split()
        if len(line) != 2 or line[0] != "go":
            print(f"flows: expected 'go <start_ns>', got {line!r}", file=sys.stderr)
            return 1
        start = int(line[1])
        cfg = (dataclasses.replace(cfg, bursts=dataclasses.replace(cfg.bursts, start_ns=start))
               if cfg.bursts else dataclasses.replace(cfg, start_ns=start))
    if argv[0] == "send":
        result = send_roce(cfg, stop) if cfg.kind == "roce" else send_udp(cfg, stop)
    else:
        result = receive(cfg, stop)
    with open(cfg.out, "w", encoding="utf-8") as f:
        json.dump(result.to_dict(), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
