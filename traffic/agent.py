"""The GPU traffic agent: one process per emulated GPU host, behaving like a RoCEv2 RNIC.

``python -m traffic.agent CONFIG.json`` replays a collective as RDMA WRITEs over Reliable
Connection queue pairs (``traffic.rc``), with DCQCN congestion control (``traffic.dcqcn``)
when the scenario asks for it:

* one or more QPs per peer (``qps_per_peer``: a message is split over them, each with its own
  UDP source port derived from its QP number); or, with per-packet entropy, a fresh source port
  on every packet and a responder that tolerates reordering;
* send path: Scapy-built frame templates patched in place (PSN, send time, ICRC) and written to
  a non-blocking AF_PACKET socket whose send buffer is kept tiny, so a full NIC queue (or a PFC
  pause) stops the agent like a NIC; with DCQCN each QP is paced at its current rate;
* receive path: a UDP socket on port 4791 that reports each packet's kernel receive time and
  ECN bits; data goes to the QP's responder (in-order delivery, coalesced ACKs, NAKs on gaps,
  CNPs for CE marks), ACKs/NAKs to its requester (go-back-N), CNPs to its reaction point;
* the collective's rule: step ``k + 1`` starts when this rank's step-``k`` message is
  acknowledged and its predecessor's step-``k`` message was delivered - so completion times
  include every retransmission.

One-way latency of every data packet = kernel receive time - send time carried in the packet
(all emulated hosts share one clock). Protocol with the runner on stdout/stdin: ``ready`` once
the sockets are bound; ``go <start_ns>``; ``iter <i>`` after each iteration; ``finished`` when
its collective is done - it keeps answering its peers (a lost ACK is re-sent on their
retransmission) until ``stop``; then it writes its records and prints ``done``. Any failure
exits non-zero with one line on stderr.
"""
from __future__ import annotations

import csv
import json
import os
import random
import select
import sys
import time
from collections import defaultdict
from typing import Dict, List, Tuple

from scapy.compat import raw

from testbed.procutil import die_with_parent

from . import roce
from .dcqcn import NotificationPoint, Parameters, ReactionPoint
from .rc import Requester, Responder, RetryExceeded
from .rxsocket import ANCILLARY_BYTES, ancillary, open_rx, open_tx, read_tx_timestamps
from .schedule import COLLECTIVES, chunk_sizes

ECN_CE = 0b11
RETX_FLAG = 0x80000000  # in the probe header's step field: a retransmitted packet
QP_BASE = 0x100  # QPs 0 and 1 are special in InfiniBand
STUCK_S = 120.0  # a step that makes no progress for this long fails the run
RATE_SAMPLE_NS = 10_000_000

# sent_ns: the sender's clock when it handed the packet to its NIC (carried in the packet);
# the kernel transmit time is in the sender's tx file, joined on (src, sent_ns).
PACKET_FIELDS = ("src", "dst", "psn", "bytes", "sent_ns", "rx_ns", "iteration", "step", "ecn",
                 "delivered", "retx")
TX_FIELDS = ("sent_ns", "tx_ns")
STEP_FIELDS = ("rank", "iteration", "step", "peer_to", "peer_from", "start_ns", "acked_ns",
               "received_ns", "end_ns", "tx_bytes", "rx_messages")
QP_FIELDS = ("qpn", "peer", "t_ns", "rate_bps", "bytes_sent")


def qp_number(local_rank: int, remote_rank: int, index: int = 0, per_peer: int = 1) -> int:
    """The QP number ``local_rank`` uses for its ``index``-th connection to ``remote_rank``."""
    return QP_BASE + remote_rank * per_peer + index


class QueuePair:
    """One RC connection of this agent: requester, responder, congestion control, templates."""

    __slots__ = ("qpn", "dqpn", "peer", "conn", "ack", "cnp", "req", "resp", "rp", "np",
                 "next_tx_ns", "bytes_sent", "samples", "next_sample_ns", "placed")

    def __init__(self, agent: "Agent", peer: dict, index: int):
        t = agent.transport
        q = t["qps_per_peer"]
        self.qpn = qp_number(agent.rank, peer["rank"], index, q)
        self.dqpn = qp_number(peer["rank"], agent.rank, index, q)
        self.peer = peer["rank"]
        me = roce.Endpoint(agent.cfg["mac"], agent.cfg["ip"])
        them = roce.Endpoint(peer["mac"], peer["ip"])
        sport = roce.udp_source_port(self.qpn)
        self.conn = roce.Connection(me, them, sport, self.dqpn, tos=t["roce_tos"])
        self.ack = roce.AckTemplate(raw(roce.ack_packet(me, them, sport, self.dqpn, 0, 0, 0,
                                                        tos=t["ack_tos"])))
        self.cnp = raw(roce.cnp_packet(me, them, sport, self.dqpn, t["cnp_tos"]))
        self.req = Requester(t["mtu"], t["rto_ns"], t["max_rto_ns"], t["retry_limit"])
        self.resp = Responder(t["ack_every"], t["reorder_ns"])
        dcqcn = t["congestion_control"] == "dcqcn"
        self.rp = ReactionPoint(agent.dcqcn, now_ns=time.time_ns()) if dcqcn else None
        self.np = NotificationPoint(agent.dcqcn.cnp_interval_ns) if dcqcn else None
        self.next_tx_ns = 0
        self.bytes_sent = 0
        self.samples: List[Tuple[int, float, int]] = []
        self.next_sample_ns = 0
        self.placed: Dict[int, Tuple[int, int, int]] = {}  # psn -> (iteration, step, opcode)


class Agent:
    def __init__(self, config: dict):
        self.cfg = config
        self.rank = config["rank"]
        self.host = config["host"]
        self.n = config["ranks"]
        self.iterations = config["iterations"]
        self.transport = dict(config["transport"])
        self.transport["mtu"] = config["mtu"]
        t = self.transport
        self.dcqcn = Parameters.emulated(config["link_rate_bps"], t["dcqcn_timer_ns"],
                                         t["dcqcn_byte_counter"], t["cnp_interval_ns"])
        self.peers = {p["rank"]: p for p in config["peers"]}
        self.rank_by_ip = {p["ip"]: p["rank"] for p in config["peers"]}
        self.schedule = COLLECTIVES[config["collective"]](self.rank, self.n, config["size"])
        self.spray = self.transport["entropy"] == "per-packet"
        self.rng = random.Random(self.rank)
        self.qps: Dict[Tuple[int, int], QueuePair] = {}
        self.by_qpn: Dict[int, QueuePair] = {}
        self.active: List[QueuePair] = []  # QPs with data to send, in round-robin order
        self.control: List[bytes] = []  # ACK/NAK/CNP frames waiting for the NIC
        self.packets: List[tuple] = []
        self.steps: List[tuple] = []
        self.unacked: Dict[Tuple[int, int], int] = defaultdict(int)  # (it, step) -> messages
        self.acked_ns: Dict[Tuple[int, int], int] = {}
        self.lasts: Dict[Tuple[int, int, int], int] = defaultdict(int)  # (src, it, step)
        self.counters: Dict[str, int] = defaultdict(int)
        self.tx = self.rx = None
        self.nic_blocked = False
        self.tx_key = 0  # SO_TIMESTAMPING OPT_ID of the next frame sent
        self.tx_pending: Dict[int, int] = {}  # key -> sent_ns, waiting for its timestamp
        self.tx_log: List[Tuple[int, int]] = []  # (sent_ns, kernel transmit ns)

    # --- sockets ----------------------------------------------------------------------------
    def open(self) -> None:
        self.tx = open_tx(self.cfg["intf"])
        self.rx = open_rx(self.cfg["ip"], roce.ROCE_UDP_PORT)
        for peer in self.peers.values():  # connect every QP up front, as a job would
            for i in range(self.transport["qps_per_peer"]):
                self.qp(peer["rank"], i)

    def close(self) -> None:
        for s in (self.tx, self.rx):
            if s is not None:
                s.close()

    def qp(self, peer: int, index: int) -> QueuePair:
        key = (peer, index)
        if key not in self.qps:
            qp = QueuePair(self, self.peers[peer], index)
            self.qps[key] = self.by_qpn[qp.qpn] = qp
        return self.qps[key]

    # --- receive ------------------------------------------------------------------------------
    def drain(self) -> None:
        """Collect transmit timestamps; handle every received packet: data, ACK/NAK, CNP."""
        pending, log = self.tx_pending, self.tx_log
        for key, ts in read_tx_timestamps(self.tx):
            sent = pending.pop(key, None)
            if sent is not None:
                log.append((sent, ts))
        rx, counters = self.rx, self.counters
        while True:
            try:
                data, anc, _flags, addr = rx.recvmsg(9216, ANCILLARY_BYTES)
            except BlockingIOError:
                return
            rx_ns, tos, dropped = ancillary(anc)
            if dropped >= 0:
                counters["rx_socket_drops"] = dropped
            if not rx_ns:
                counters["rx_no_timestamp"] += 1
                rx_ns = time.time_ns()
            bth = roce.parse_bth(data)
            qp = self.by_qpn.get(bth[1]) if bth else None
            if qp is None or self.rank_by_ip.get(addr[0]) != qp.peer:
                counters["rx_invalid"] += 1
                continue
            opcode = bth[0]
            if opcode == roce.RC_ACKNOWLEDGE:
                self._on_ack(qp, data, bth[2], rx_ns)
            elif opcode == roce.CNP:
                counters["cnps_received"] += 1
                if qp.rp is not None:
                    qp.rp.on_cnp(rx_ns)
            else:
                self._on_data(qp, data, bth, tos & ECN_CE, rx_ns)

    def _on_data(self, qp: QueuePair, data, bth, ecn: int, rx_ns: int) -> None:
        pkt = roce.parse_udp_payload(data)
        if pkt is None:
            self.counters["rx_invalid"] += 1
            return
        if ecn == ECN_CE:
            self.counters["rx_ce"] += 1
            if qp.np is not None and qp.np.on_ce(rx_ns):
                self.control.append(bytes(qp.cnp))
        placed_before = qp.resp.counters["placed_ahead"]
        delivered, response = qp.resp.on_packet(pkt.psn, pkt.opcode, pkt.ackreq, rx_ns)
        step = pkt.step & ~RETX_FLAG
        self.packets.append((qp.peer, self.rank, pkt.psn, pkt.payload_len, pkt.tx_ns, rx_ns,
                             pkt.iteration, step, ecn, int(bool(delivered)),
                             int(bool(pkt.step & RETX_FLAG))))
        if qp.resp.counters["placed_ahead"] != placed_before:  # held until the gap fills
            qp.placed[pkt.psn] = (pkt.iteration, step, pkt.opcode)
        elif delivered:
            self._count_last(qp, pkt.iteration, step, pkt.opcode)
        for psn in delivered[1:]:  # placed earlier, in order now
            it, st, op = qp.placed.pop(psn)
            self._count_last(qp, it, st, op)
        if response is not None:
            self.control.append(bytes(qp.ack.fill(response.psn, response.syndrome,
                                                  response.msn)))

    def _count_last(self, qp: QueuePair, iteration: int, step: int, opcode: int) -> None:
        if opcode in (roce.RC_RDMA_WRITE_LAST, roce.RC_RDMA_WRITE_ONLY):
            self.lasts[(qp.peer, iteration, step)] += 1

    def _on_ack(self, qp: QueuePair, data, psn: int, rx_ns: int) -> None:
        aeth = roce.parse_aeth(data)
        if aeth is None:
            self.counters["rx_invalid"] += 1
            return
        for msg in qp.req.on_ack(psn, aeth[0], rx_ns):
            self.unacked[msg.tag] -= 1
            if self.unacked[msg.tag] == 0:
                self.acked_ns[msg.tag] = rx_ns
        if qp.req.pending() and qp not in self.active:
            self.active.append(qp)  # a NAK rewound it

    # --- send ---------------------------------------------------------------------------------
    def flush_control(self) -> None:
        while self.control:
            try:
                self.tx.send(self.control[0])
            except BlockingIOError:
                self.nic_blocked = True
                return
            self.tx_key += 1
            self.control.pop(0)

    def send_data(self) -> None:
        """Send packets round-robin over the QPs that may send now, until the NIC is full."""
        tx, spray = self.tx, self.spray
        while self.active and not self.nic_blocked:
            progressed = False
            for qp in list(self.active):
                now = time.time_ns()
                rp = qp.rp
                if rp is not None and rp.congested and qp.next_tx_ns > now:
                    continue
                o = qp.req.peek()
                if o is None:
                    self.active.remove(qp)
                    continue
                tpl = qp.conn.template(o.opcode, o.payload)
                if spray:
                    tpl.set_sport(0xC000 | self.rng.getrandbits(14))
                it, step = o.message.tag
                frame = tpl.fill(o.psn, o.ackreq, now, it, step | (RETX_FLAG if o.retransmit
                                                                   else 0),
                                 o.message.va, o.message.size)
                try:
                    tx.send(frame)
                except BlockingIOError:
                    self.nic_blocked = True
                    self.counters["tx_blocked"] += 1
                    return
                self.tx_pending[self.tx_key] = now
                self.tx_key += 1
                qp.req.commit(o, now)
                size = len(frame)
                qp.bytes_sent += size
                if rp is not None and rp.congested:  # at line rate the NIC paces
                    qp.next_tx_ns = max(now, qp.next_tx_ns) + int(size * 8e9 / rp.rate)
                    rp.on_sent(size, now)
                progressed = True
            if not progressed:
                return

    # --- time ---------------------------------------------------------------------------------
    def timers(self, now: int) -> None:
        for qp in self.qps.values():
            if qp.req.check_timeout(now) and qp not in self.active:
                self.active.append(qp)
            if qp.rp is not None:
                qp.rp.tick(now)
                if now >= qp.next_sample_ns:
                    last = qp.samples[-1] if qp.samples else (0, None, 0)
                    if (qp.rp.rate, qp.bytes_sent) != last[1:]:
                        qp.samples.append((now, qp.rp.rate, qp.bytes_sent))
                    qp.next_sample_ns = now + RATE_SAMPLE_NS
            nak = qp.resp.tick(now)
            if nak is not None:
                self.control.append(bytes(qp.ack.fill(nak.psn, nak.syndrome, nak.msn)))

    def next_wake(self, now: int) -> int:
        wake = now + 100_000_000
        for qp in self.qps.values():
            d = qp.req.deadline()
            if d is not None:
                wake = min(wake, d)
            if qp.rp is not None:
                wake = min(wake, qp.rp.next_event_ns(), qp.next_sample_ns)
                if qp in self.active and not self.nic_blocked and qp.rp.congested:
                    wake = min(wake, qp.next_tx_ns)
            if qp.resp.gap_since is not None and qp.resp.reorder_ns:
                wake = min(wake, qp.resp.gap_since + qp.resp.reorder_ns)
        return wake

    def pump(self, done, what: str) -> None:
        """Run the NIC until ``done()``: receive, timers, control, data, then sleep."""
        last_progress = time.monotonic()
        mark = None
        while not done():
            self.drain()
            now = time.time_ns()
            self.timers(now)
            self.flush_control()
            self.send_data()
            if done():
                return
            progress = (len(self.packets), sum(q.req.counters["acks"] + q.req.counters["tx_packets"]
                                                 for q in self.qps.values()))
            if progress != mark:
                mark, last_progress = progress, time.monotonic()
            elif time.monotonic() - last_progress > STUCK_S:
                raise RuntimeError(f"{self.host}: no progress for {STUCK_S:.0f} s {what}")
            self._wait(self.next_wake(time.time_ns()))

    def _wait(self, wake_ns: int) -> None:
        """Sleep until a packet arrives, the NIC takes more, or ``wake_ns`` (microsecond
        precision: pacing needs it)."""
        timeout = min(0.1, max(0.0, (wake_ns - time.time_ns()) / 1e9))
        select.select([self.rx], [self.tx] if self.nic_blocked else [], [], timeout)
        self.nic_blocked = False

    # --- the collective -----------------------------------------------------------------------
    def run(self, start_ns: int, progress=lambda i: None) -> None:
        delay = (start_ns - time.time_ns()) / 1e9
        if delay > 0:
            time.sleep(delay)
        q = self.transport["qps_per_peer"]
        for it in range(self.iterations):
            for st in self.schedule:
                start = time.time_ns()
                tag = (it, st.index)
                parts = chunk_sizes(st.send_bytes, q) if st.send_bytes >= q else [st.send_bytes]
                for i, part in enumerate(parts):
                    qp = self.qp(st.send_to, i)
                    qp.req.post(tag, part, start, va=st.send_chunk * st.send_bytes)
                    self.unacked[tag] += 1
                    if qp not in self.active:
                        self.active.append(qp)
                key = (st.recv_from, it, st.index)
                expected = q if st.recv_bytes >= q else 1
                self.pump(lambda: self.unacked[tag] == 0 and self.lasts[key] >= expected,
                          f"in iteration {it} step {st.index}")
                end = time.time_ns()
                self.steps.append((self.rank, it, st.index, st.send_to, st.recv_from, start,
                                   self.acked_ns.get(tag, end), end, end, st.send_bytes,
                                   self.lasts[key]))
            progress(it)

    def serve(self, stop) -> None:
        """Keep answering peers (ACKs, retransmissions) until ``stop()``."""
        self.pump(stop, "while serving peers")

    # --- records ------------------------------------------------------------------------------
    def summary(self) -> dict:
        c = dict(self.counters)
        for qp in self.qps.values():
            for k, v in qp.req.counters.items():
                c[f"req_{k}"] = c.get(f"req_{k}", 0) + v
            for k, v in qp.resp.counters.items():
                c[f"resp_{k}"] = c.get(f"resp_{k}", 0) + v
            if qp.np is not None:
                c["cnps_sent"] = c.get("cnps_sent", 0) + qp.np.cnps_sent
        c["tx_packets"] = c.get("req_tx_packets", 0)
        c["retransmitted"] = c.get("req_retransmitted", 0)
        c["naks_received"] = c.get("req_naks", 0)
        c["timeouts"] = c.get("req_timeouts", 0)
        c["naks_sent"] = c.get("resp_naks_sent", 0)
        c["tx_bytes"] = sum(qp.bytes_sent for qp in self.qps.values())
        return c

    def write_records(self, out_dir: str) -> None:
        base = os.path.join(out_dir, self.host)
        _write_csv(base + ".packets.csv", PACKET_FIELDS, self.packets)
        _write_csv(base + ".steps.csv", STEP_FIELDS, self.steps)
        _write_csv(base + ".tx.csv", TX_FIELDS, self.tx_log)
        rows = []
        for qp in self.qps.values():
            if qp.rp is None:
                continue
            for t, rate in qp.rp.history:
                rows.append((qp.qpn, qp.peer, t, round(rate), ""))
            for t, rate, sent in qp.samples:
                rows.append((qp.qpn, qp.peer, t, round(rate), sent))
        rows.sort(key=lambda r: (r[0], r[2]))
        _write_csv(base + ".qps.csv", QP_FIELDS, rows)
        summary = {"rank": self.rank, "host": self.host, "counters": self.summary(),
                   "rx_packets": len(self.packets)}
        tmp = base + ".summary.json.tmp"
        with open(tmp, "w") as f:
            json.dump(summary, f)
        os.replace(tmp, base + ".summary.json")


def _write_csv(path: str, header, rows) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def _stdin_says(word: str):
    """A predicate: has the runner written ``word`` on stdin yet? (non-blocking)"""
    seen = []

    def check() -> bool:
        if not seen:
            ready, _, _ = select.select([sys.stdin], [], [], 0)
            if ready:
                line = sys.stdin.readline()
                seen.append(line.strip() == word or not line)
        return bool(seen)
    return check


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
        print("finished", flush=True)
        agent.serve(_stdin_says("stop"))
        agent.write_records(config["out_dir"])
        print("done", flush=True)
        return 0
    except RetryExceeded as e:
        print(f"agent {agent.host}: a queue pair went to error: {e}", file=sys.stderr)
        return 1
    except RuntimeError as e:
        print(f"agent {agent.host}: {e}", file=sys.stderr)
        return 1
    finally:
        agent.close()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
