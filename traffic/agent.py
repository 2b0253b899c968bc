"""The GPU traffic agent: one process per emulated GPU host, inside its network namespace.

``python -m traffic.agent CONFIG.json`` replays a collective as RoCEv2 RDMA WRITEs:

* send path: frame templates built once with Scapy (``traffic.roce``), patched in place (PSN,
  send time, ICRC) and written to an AF_PACKET socket whose send buffer is kept tiny, so the
  socket blocks - like a NIC - when the shaped NIC queue is busy instead of piling up packets;
* receive path: a UDP socket on port 4791 with ``SO_TIMESTAMPNS``: the kernel stamps every
  packet on arrival and the agent records one-way latency = kernel RX time - send time carried
  in the packet (all emulated hosts share one clock);
* the collective's dependency rule: step ``k + 1`` starts when this rank has sent step ``k``
  and received step ``k`` from its predecessor (the ``LAST``/``ONLY`` packet), or the step
  timeout expired (a lost ``LAST``; counted).

Protocol with the runner on stdout/stdin: the agent prints ``ready`` once its sockets are bound,
waits for ``go <start_ns>``, prints ``iter <i>`` after each iteration and ``done`` after its
records are written. Any failure exits non-zero with one line on stderr.
"""
from __future__ import annotations

import csv
import json
import os
import select
import socket
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, List

from testbed.procutil import die_with_parent

from . import roce
from .rxsocket import ANCILLARY_BYTES, ancillary, open_rx
from .schedule import COLLECTIVES

ECN_CE = 0b11

PACKET_FIELDS = ("src", "dst", "psn", "bytes", "tx_ns", "rx_ns", "iteration", "step", "ecn")
STEP_FIELDS = ("rank", "iteration", "step", "peer_to", "peer_from", "start_ns", "sent_ns",
               "received_ns", "end_ns", "tx_packets", "tx_bytes", "rx_packets",
               "rx_expected", "timed_out")


@dataclass(frozen=True)
class Peer:
    rank: int
    host: str
    ip: str
    mac: str
    qpn: int  # this rank's QP towards the peer (its source port derives from it)
    dqpn: int  # the peer's QP for this rank


def qp_number(local_rank: int, remote_rank: int) -> int:
    """QP number that ``local_rank`` uses for its connection to ``remote_rank`` (24 bit)."""
    return 0x10000 | (local_rank << 8) | remote_rank


class Agent:
    def __init__(self, config: dict):
        self.cfg = config
        self.rank = config["rank"]
        self.host = config["host"]
        self.n = config["ranks"]
        self.mtu = config["mtu"]
        self.iterations = config["iterations"]
        self.step_timeout_ns = int(config["step_timeout_s"] * 1e9)
        me = roce.Endpoint(config["mac"], config["ip"])
        self.peers: Dict[int, Peer] = {}
        self.conns: Dict[int, roce.Connection] = {}
        for p in config["peers"]:
            peer = Peer(p["rank"], p["host"], p["ip"], p["mac"], qp_number(self.rank, p["rank"]),
                        qp_number(p["rank"], self.rank))
            self.peers[peer.rank] = peer
            self.conns[peer.rank] = roce.Connection(
                me, roce.Endpoint(peer.mac, peer.ip), roce.udp_source_port(peer.qpn), peer.dqpn)
        self.rank_by_ip = {p.ip: p.rank for p in self.peers.values()}
        self.schedule = COLLECTIVES[config["collective"]](self.rank, self.n, config["size"])
        self.next_psn: Dict[int, int] = defaultdict(int)
        # receive-side state
        self.packets: List[tuple] = []
        self.rx_count: Dict[tuple, int] = defaultdict(int)
        self.rx_done: set = set()
        self.counters = defaultdict(int)
        self.steps: List[tuple] = []
        self.tx = self.rx = None

    # --- sockets ----------------------------------------------------------------------------
    def open(self) -> None:
        tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)  # protocol 0: send only
        tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1)  # kernel minimum: ~2 frames
        tx.bind((self.cfg["intf"], 0))
        tx.setblocking(False)
        self.tx, self.rx = tx, open_rx(self.cfg["ip"], roce.ROCE_UDP_PORT)
        self.poller = select.poll()
        self.poller.register(self.rx, select.POLLIN)

    def close(self) -> None:
        for s in (self.tx, self.rx):
            if s is not None:
                s.close()

    # --- receive ----------------------------------------------------------------------------
    def drain(self) -> None:
        """Read every queued packet, record it and update the per-step counts."""
        rx, record, counters = self.rx, self.packets.append, self.counters
        while True:
            try:
                data, anc, _flags, addr = rx.recvmsg(9216, ANCILLARY_BYTES)
            except BlockingIOError:
                return
            rx_ns, tos, dropped = ancillary(anc)
            ecn = tos & 0b11
            if dropped >= 0:
                counters["rx_socket_drops"] = dropped
            pkt = roce.parse_udp_payload(data)
            src = self.rank_by_ip.get(addr[0])
            if pkt is None or src is None:
                counters["rx_invalid"] += 1
                continue
            if not rx_ns:
                counters["rx_no_timestamp"] += 1
                rx_ns = time.time_ns()
            if ecn == ECN_CE:
                counters["rx_ce"] += 1
            record((src, self.rank, pkt.psn, pkt.payload_len, pkt.tx_ns, rx_ns, pkt.iteration,
                    pkt.step, ecn))
            key = (src, pkt.iteration, pkt.step)
            self.rx_count[key] += 1
            if pkt.opcode in (roce.RC_RDMA_WRITE_LAST, roce.RC_RDMA_WRITE_ONLY):
                self.rx_done.add(key)

    def wait(self, timeout_ms: int, writable: bool = False) -> None:
        """Block until a packet arrives (or, with ``writable``, the NIC takes more)."""
        if writable:
            self.poller.register(self.tx, select.POLLOUT)
        try:
            self.poller.poll(timeout_ms)
        finally:
            if writable:
                self.poller.unregister(self.tx)
        self.drain()

    # --- send -------------------------------------------------------------------------------
    def send_message(self, peer: int, size: int, iteration: int, step: int, va: int) -> int:
        """Send one RDMA WRITE message to ``peer``; returns the number of packets."""
        conn, tx = self.conns[peer], self.tx
        payloads = roce.packet_payloads(size, self.mtu)
        ops = roce.opcodes_for(len(payloads))
        psn = self.next_psn[peer]
        last = len(ops) - 1
        now = time.time_ns
        for i, (op, plen) in enumerate(zip(ops, payloads)):
            tpl = conn.template(op, plen)
            while True:
                frame = tpl.fill(psn, i == last, now(), iteration, step, va, size)
                try:
                    tx.send(frame)
                    break
                except BlockingIOError:
                    # NIC queue full: wait for room, meanwhile keep receiving.
                    self.counters["tx_blocked"] += 1
                    self.wait(50, writable=True)
            psn = (psn + 1) & roce.PSN_MASK
        self.next_psn[peer] = psn
        self.counters["tx_packets"] += len(ops)
        self.counters["tx_bytes"] += size
        return len(ops)

    # --- the collective ---------------------------------------------------------------------
    def run(self, start_ns: int, progress=lambda i: None) -> None:
        delay = (start_ns - time.time_ns()) / 1e9
        if delay > 0:
            time.sleep(delay)
        for it in range(self.iterations):
            for st in self.schedule:
                start = time.time_ns()
                tx_packets = self.send_message(st.send_to, st.send_bytes, it, st.index,
                                               va=st.send_chunk * st.send_bytes)
                sent = time.time_ns()
                key = (st.recv_from, it, st.index)
                deadline = sent + self.step_timeout_ns
                self.drain()
                while key not in self.rx_done:
                    left_ms = (deadline - time.time_ns()) // 1_000_000
                    if left_ms <= 0:
                        break
                    self.wait(min(left_ms, 100))
                timed_out = key not in self.rx_done
                if timed_out:
                    self.counters["step_timeouts"] += 1
                end = time.time_ns()
                expected = len(roce.packet_payloads(st.recv_bytes, self.mtu))
                self.steps.append((self.rank, it, st.index, st.send_to, st.recv_from, start, sent,
                                   0 if timed_out else end, end, tx_packets, st.send_bytes,
                                   self.rx_count.get(key, 0), expected, int(timed_out)))
            progress(it)
        # Late packets of the last steps (e.g. after a timeout) still count as received.
        linger_until = time.time_ns() + 200_000_000
        while time.time_ns() < linger_until:
            self.wait(20)

    # --- records ----------------------------------------------------------------------------
    def write_records(self, out_dir: str) -> None:
        base = os.path.join(out_dir, self.host)
        with open(base + ".packets.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(PACKET_FIELDS)
            w.writerows(self.packets)
        with open(base + ".steps.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(STEP_FIELDS)
            w.writerows(self.steps)
        summary = {"rank": self.rank, "host": self.host, "counters": dict(self.counters),
                   "rx_packets": len(self.packets)}
        tmp = base + ".summary.json.tmp"
        with open(tmp, "w") as f:
            json.dump(summary, f)
        os.replace(tmp, base + ".summary.json")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    die_with_parent()
    if len(argv) != 1:
        print("usage: python -m traffic.agent CONFIG.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        config = json.load(f)
    agent = Agent(config)
    try:
        agent.open()
        print("ready", flush=True)
        line = sys.stdin.readline().split()
        if len(line) != 2 or line[0] != "go":
            print(f"agent {agent.host}: expected 'go <start_ns>', got {line!r}", file=sys.stderr)
            return 1
        agent.run(int(line[1]), progress=lambda i: print(f"iter {i}", flush=True))
        agent.write_records(config["out_dir"])
        print("done", flush=True)
        return 0
    finally:
        agent.close()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
