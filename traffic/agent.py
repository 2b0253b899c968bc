"""The GPU traffic agent: one process per emulated GPU host, behaving like a RoCEv2 RNIC.

``python -m traffic.agent CONFIG.json`` replays training iterations - a compute phase, then a
collective (``traffic.collectives``) - as RDMA WRITEs over Reliable Connection queue pairs
(``traffic.rc``), with DCQCN congestion control (``traffic.dcqcn``) when the scenario asks:

* one or more QPs per peer (``qps_per_peer``: a message is split over them, each with its own
  UDP source port derived from its QP number); or, with per-packet entropy, a fresh source port
  on every packet and a responder that tolerates reordering;
* send path: Scapy-built frame templates patched in place (PSN, send time, ICRC) and written to
  a non-blocking AF_PACKET socket whose send buffer is kept tiny, so a full NIC queue (or a PFC
  pause) stops the agent like a NIC; with DCQCN each QP is paced at its current rate;
* receive path: a UDP socket on port 4791 that reports each packet's kernel receive time and
  ECN bits; data goes to the QP's responder (in-order delivery, coalesced ACKs, NAKs on gaps,
  CNPs for CE marks), ACKs/NAKs to its requester (go-back-N), CNPs to its reaction point;
* the iteration (lock-step): the compute phase (``compute_ns`` +- jitter, plus a straggler
  delay on the chosen ranks) while still answering peers; then every transfer of this rank is
  posted as soon as the transfers it depends on were delivered; the iteration ends when all
  its transfers are acknowledged and all transfers to it delivered - so completion times
  include every retransmission - and the next compute phase starts at once.

One-way latency of every data packet = kernel receive time - kernel transmit time (all emulated
hosts share one clock). Protocol with the runner on stdout/stdin: ``ready`` once the sockets are
bound; ``go <start_ns>``; ``iter <i>`` after each iteration; ``finished`` when its collectives
are done - it keeps answering its peers (a lost ACK is re-sent on their retransmission) until
``stop``; then it writes its records and prints ``done``. Any failure exits non-zero with one
line on stderr.
"""
from __future__ import annotations

import csv
import gc
import json
import os
import random
import select
import sys
import time
from collections import defaultdict
from typing import Dict, List, Tuple

from scapy.compat import raw

from testbed.procutil import die_with_parent, precise_timers

from . import roce
from .dcqcn import NotificationPoint, Parameters, ReactionPoint
from .rc import Requester, Responder, RetryExceeded
from .collectives import Collective, Transfer, build, chunk_sizes
from .metrics import LagHistogram
from .rxsocket import ANCILLARY_BYTES, ancillary, open_rx, open_tx, read_tx_timestamps

ECN_CE = 0b11
RETX_FLAG = 0x80000000  # in the probe header's step field: a retransmitted packet
QP_BASE = 0x100  # QPs 0 and 1 are special in InfiniBand
STUCK_S = 120.0  # a step that makes no progress for this long fails the run
RATE_SAMPLE_NS = 10_000_000
AGENT_NICE = -10
SPIN_NS = 500_000  # the end of a compute phase is polled for this long
PROBE_CLOCK_SLACK_NS = 1_000_000_000  # all agents share one clock: a probe "sent" later is forged

# sent_ns: the sender's clock when it handed the packet to its NIC (carried in the packet);
# the kernel transmit time is in the sender's tx file, joined on (src, sent_ns). The tx file
# lists every frame the NIC sent (kind d: data, c: ACK/NAK/CNP) with its length.
PACKET_FIELDS = ("src", "dst", "psn", "bytes", "sent_ns", "rx_ns", "iteration", "step", "ecn",
                 "delivered", "retx")
TX_FIELDS = ("sent_ns", "tx_ns", "bytes", "kind")
OP_FIELDS = ("rank", "iteration", "kind", "peer", "tag", "phase", "bytes", "start_ns", "end_ns")
ITERATION_FIELDS = ("rank", "iteration", "workload", "collective", "size", "compute_start_ns",
                    "start_ns", "end_ns", "compute_ns", "straggle_ns", "bytes_sent",
                    "bytes_received")
QP_FIELDS = ("qpn", "peer", "t_ns", "rate_bps", "bytes_sent")


def qp_number(local_rank: int, remote_rank: int, index: int = 0, per_peer: int = 1) -> int:
    """The QP number ``local_rank`` uses for its ``index``-th connection to ``remote_rank``."""
    return QP_BASE + remote_rank * per_peer + index


class Workload:
    """One collective at one size, replayed for some iterations: this rank's part of it."""

    def __init__(self, spec: dict, index: int, rank: int, n: int, first_iteration: int):
        self.index = index
        self.collective: Collective = build(spec["collective"], n, spec["size"],
                                            spec.get("chunks", 1), spec.get("group", 1))
        self.name = self.collective.name
        self.size = spec["size"]
        self.iterations = range(first_iteration, first_iteration + spec["iterations"])
        self.sends: List[Transfer] = self.collective.sends(rank)
        self.receives: Dict[Tuple[int, int], Transfer] = {
            t.ref: t for t in self.collective.receives(rank)}
        self.bytes_sent = sum(t.nbytes for t in self.sends)
        self.bytes_received = sum(t.nbytes for t in self.receives.values())


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
        self.transport = dict(config["transport"])
        self.transport["mtu"] = config["mtu"]
        t = self.transport
        self.dcqcn = Parameters.emulated(config["link_rate_bps"], t["dcqcn_timer_ns"],
                                         t["dcqcn_byte_counter"], t["cnp_interval_ns"])
        self.peers = {p["rank"]: p for p in config["peers"]}
        self.rank_by_ip = {p["ip"]: p["rank"] for p in config["peers"]}
        self.workloads: List[Workload] = []
        first = 0
        for i, spec in enumerate(config["workloads"]):
            self.workloads.append(Workload(spec, i, self.rank, self.n, first))
            first += spec["iterations"]
        self.iterations = first
        self.workload_of = [w for w in self.workloads for _ in w.iterations]
        self.spray = self.transport["entropy"] == "per-packet"
        self.rng = random.Random(self.rank)
        self.work_rng = random.Random(config.get("seed", 1) * 1_000_003 + self.rank)
        self.qps: Dict[Tuple[int, int], QueuePair] = {}
        self.by_qpn: Dict[int, QueuePair] = {}
        self.active: List[QueuePair] = []  # QPs with data to send, in round-robin order
        self.control: List[bytes] = []  # ACK/NAK/CNP frames waiting for the NIC
        self.packets: List[tuple] = []
        self.iteration_rows: List[tuple] = []
        # the graph of the current iteration: transfers waiting for deliveries
        self.current = -1
        self.waiting: Dict[int, int] = {}  # tag -> deliveries still missing
        self.waiters: Dict[Tuple[int, int], List[Transfer]] = defaultdict(list)
        self.open_sends: Dict[int, int] = {}  # iteration -> transfers not fully acknowledged
        self.open_recvs: Dict[int, int] = {}  # iteration -> transfers not yet delivered
        self.posted_ns: Dict[Tuple[int, int], int] = {}  # (it, tag)
        self.unacked: Dict[Tuple[int, int], int] = defaultdict(int)  # (it, tag) -> messages
        self.acked_ns: Dict[Tuple[int, int], int] = {}
        self.lasts: Dict[Tuple[int, int, int], int] = defaultdict(int)  # (src, it, tag)
        self.delivered_ns: Dict[Tuple[int, int, int], int] = {}  # (src, it, tag)
        self.lag = LagHistogram()  # how late the loop woke for a timer
        self.first_start_lag_ns = 0
        self.counters: Dict[str, int] = defaultdict(int)
        self.tx = self.rx = None
        self.nic_blocked = False
        self.tx_key = 0  # SO_TIMESTAMPING OPT_ID of the next frame sent
        self.tx_pending: Dict[int, tuple] = {}  # key -> (sent_ns, bytes, kind)
        self.tx_log: List[tuple] = []  # (sent_ns, kernel transmit ns, bytes, kind)

    # --- sockets ----------------------------------------------------------------------------
    def open(self) -> None:
        self.tx = open_tx(self.cfg["intf"])
        self.rx = open_rx(self.cfg["ip"], roce.ROCE_UDP_PORT)
        for peer in self.peers.values():  # connect every QP up front, as a job would
            for i in range(self.transport["qps_per_peer"]):
                self.qp(peer["rank"], i)
        self.warm_up()

    def warm_up(self) -> None:
        """Build every frame shape this rank will send now, not on the first send: Scapy
        takes milliseconds per shape, which would make the ranks start out of step."""
        mtu = self.transport["mtu"]
        for w in self.workloads:
            for t in w.sends:
                for i, part in enumerate(self._parts(t.nbytes)):
                    conn = self.qp(t.dst, i).conn
                    payloads = roce.packet_payloads(part, mtu)
                    for opcode, size in set(zip(roce.opcodes_for(len(payloads)), payloads)):
                        conn.template(opcode, size)

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
                log.append((sent[0], ts, sent[1], sent[2]))
        rx, counters, my_ip = self.rx, self.counters, self.cfg["ip"]
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
            if qp is None and bth is not None:
                counters["rx_foreign_qp"] += 1  # another job's traffic (e.g. an incast)
                continue
            if qp is None or self.rank_by_ip.get(addr[0]) != qp.peer:
                counters["rx_invalid"] += 1
                continue
            if not roce.payload_icrc_ok(data, addr[0], my_ip, addr[1]):
                counters["rx_bad_icrc"] += 1  # a NIC drops it before the transport sees it
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
        if pkt is None or not (0 < pkt.tx_ns <= rx_ns + PROBE_CLOCK_SLACK_NS
                               and pkt.iteration < self.iterations):
            self.counters["rx_invalid"] += 1  # not a probe of this run: a forged or foreign
            return                            # packet would corrupt the latency records
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
            self._count_last(qp, pkt.iteration, step, pkt.opcode, rx_ns)
        for psn in delivered[1:]:  # placed earlier, in order now
            it, st, op = qp.placed.pop(psn)
            self._count_last(qp, it, st, op, rx_ns)
        if response is not None:
            self.control.append(bytes(qp.ack.fill(response.psn, response.syndrome,
                                                  response.msn)))

    def _count_last(self, qp: QueuePair, iteration: int, tag: int, opcode: int,
                    rx_ns: int) -> None:
        """A message ended in order; the transfer is delivered when all its parts are."""
        if opcode not in (roce.RC_RDMA_WRITE_LAST, roce.RC_RDMA_WRITE_ONLY):
            return
        key = (qp.peer, iteration, tag)
        self.lasts[key] += 1
        w = self.workload_of[iteration] if 0 <= iteration < self.iterations else None
        t = w.receives.get((qp.peer, tag)) if w else None
        if t is None:
            self.counters["rx_unexpected_messages"] += 1
            return
        if self.lasts[key] == len(self._parts(t.nbytes)):
            self._delivered(t, iteration, rx_ns)

    def _delivered(self, t: Transfer, iteration: int, rx_ns: int) -> None:
        self.delivered_ns[(t.src, iteration, t.tag)] = rx_ns
        w = self.workload_of[iteration]
        self.open_recvs[iteration] = self.open_recvs.get(iteration, len(w.receives)) - 1
        if iteration == self.current:
            for ready in self.waiters.pop(t.ref, ()):
                self.waiting[ready.tag] -= 1
                if self.waiting[ready.tag] == 0:
                    self._post(ready, iteration)

    def _on_ack(self, qp: QueuePair, data, psn: int, rx_ns: int) -> None:
        aeth = roce.parse_aeth(data)
        if aeth is None:
            self.counters["rx_invalid"] += 1
            return
        for msg in qp.req.on_ack(psn, aeth[0], rx_ns):
            self.unacked[msg.tag] -= 1
            if self.unacked[msg.tag] == 0:
                self.acked_ns[msg.tag] = rx_ns
                self.open_sends[msg.tag[0]] -= 1
        if qp.req.pending() and qp not in self.active:
            self.active.append(qp)  # a NAK rewound it

    # --- send ---------------------------------------------------------------------------------
    def flush_control(self) -> None:
        while self.control:
            frame = self.control[0]
            try:
                self.tx.send(frame)
            except BlockingIOError:
                self.nic_blocked = True
                return
            self.tx_pending[self.tx_key] = (time.time_ns(), len(frame), "c")
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
                size = len(frame)
                self.tx_pending[self.tx_key] = (now, size, "d")
                self.tx_key += 1
                qp.req.commit(o, now)
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

    def next_wake(self, now: int, until_ns: int = 0) -> int:
        wake = now + 100_000_000
        if until_ns:
            wake = min(wake, until_ns)
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

    def pump(self, done, what: str, until_ns: int = 0) -> None:
        """Run the NIC until ``done()``: receive, timers, control, data, then sleep (at most
        until ``until_ns``, when ``done`` turns true by the clock; the last ``SPIN_NS``
        before it are polled, not slept: the kernel wakes a sleeper hundreds of
        microseconds late on a busy machine)."""
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
            self._wait(self.next_wake(time.time_ns(), until_ns), until_ns)

    def _wait(self, wake_ns: int, until_ns: int = 0) -> None:
        """Sleep until a packet arrives, the NIC takes more, or ``wake_ns`` (microsecond
        precision: pacing needs it); poll instead when ``until_ns`` is near."""
        now = time.time_ns()
        if until_ns and until_ns - now <= SPIN_NS:
            select.select([self.rx], [self.tx] if self.nic_blocked else [], [], 0)
            self.nic_blocked = False
            os.sched_yield()  # several agents poll at once: take turns, in microseconds
            return
        early = bool(until_ns) and wake_ns >= until_ns - SPIN_NS
        if early:  # wake before the deadline, to poll up to it (lateness here is harmless)
            wake_ns = until_ns - SPIN_NS
        timeout = min(0.1, max(0.0, (wake_ns - now) / 1e9))
        readable, writable, _ = select.select([self.rx], [self.tx] if self.nic_blocked else [],
                                              [], timeout)
        self.nic_blocked = False
        if not readable and not writable and 0 < timeout < 0.1 and not early:
            # woke for a timer (pacing, retransmission): how late?
            self.lag.add(time.time_ns() - wake_ns)

    # --- the training iterations ---------------------------------------------------------------
    def run(self, start_ns: int, progress=lambda i: None) -> None:
        compute_start = start_ns
        for w in self.workloads:
            for it in w.iterations:
                compute_start = self._iteration(w, it, compute_start)
                progress(it)

    def _iteration(self, w: Workload, it: int, compute_start: int) -> int:
        """Compute, then this rank's part of the collective; returns when it ended."""
        compute_ns, straggle_ns = self._compute_time()
        ready_at = compute_start + compute_ns + straggle_ns
        self.pump(lambda: time.time_ns() >= ready_at, f"computing iteration {it}",
                  until_ns=ready_at)
        start = time.time_ns()
        if it == 0:  # all ranks start at once: the first bursts compete for the CPUs
            self.first_start_lag_ns = start - ready_at
        else:
            self.lag.add(start - ready_at)
        self.begin_collective(w, it)
        self.pump(lambda: self.open_sends[it] == 0 and self.open_recvs[it] == 0,
                  f"in iteration {it} ({w.name}, {w.size:,} B)")
        end = time.time_ns()
        self.iteration_rows.append((self.rank, it, w.index, w.name, w.size, compute_start,
                                    start, end, compute_ns, straggle_ns, w.bytes_sent,
                                    w.bytes_received))
        return end

    def op_rows(self) -> List[tuple]:
        """One row per transfer sent or received (built at the end: no work between
        iterations)."""
        rows = []
        for row in self.iteration_rows:
            it, w = row[1], self.workloads[row[2]]
            for t in w.sends:
                rows.append((self.rank, it, "send", t.dst, t.tag, t.phase, t.nbytes,
                             self.posted_ns[(it, t.tag)], self.acked_ns[(it, t.tag)]))
            for t in w.receives.values():
                at = self.delivered_ns[(t.src, it, t.tag)]
                rows.append((self.rank, it, "recv", t.src, t.tag, t.phase, t.nbytes, at, at))
        return rows

    def begin_collective(self, w: Workload, it: int) -> None:
        """Post every transfer whose inputs are here; the others wait for their deliveries
        (``_delivered`` posts them)."""
        self.current = it
        self.waiting.clear()
        self.waiters.clear()
        self.open_sends[it] = len(w.sends)
        self.open_recvs.setdefault(it, len(w.receives))
        for t in w.sends:
            missing = [d for d in t.after if (d[0], it, d[1]) not in self.delivered_ns]
            if missing:
                self.waiting[t.tag] = len(missing)
                for d in missing:
                    self.waiters[d].append(t)
            else:
                self._post(t, it)

    def _compute_time(self) -> Tuple[int, int]:
        """(compute phase, straggler delay) of the next iteration, in ns."""
        c = self.cfg.get("compute") or {}
        rng = self.work_rng
        compute = c.get("ns", 0)
        jitter = c.get("jitter_ns", 0)
        if jitter:
            compute = max(0, int(compute + rng.uniform(-jitter, jitter)))
        st = self.cfg.get("straggler")
        delay = 0
        if st and rng.random() < st["probability"]:
            mean = st["delay_ns"]
            if st["distribution"] == "uniform":
                delay = int(rng.uniform(0, 2 * mean))
            elif st["distribution"] == "exponential":
                delay = int(rng.expovariate(1 / mean)) if mean > 0 else 0
            else:
                delay = int(mean)
        return int(compute), delay

    def _parts(self, nbytes: int) -> List[int]:
        """How a transfer is split over the QPs to its peer."""
        q = self.transport["qps_per_peer"]
        return chunk_sizes(nbytes, q) if nbytes >= q else [nbytes]

    def _post(self, t: Transfer, it: int) -> None:
        now = time.time_ns()
        self.posted_ns[(it, t.tag)] = now
        at = t.dst_offset
        for i, part in enumerate(self._parts(t.nbytes)):
            qp = self.qp(t.dst, i)
            qp.req.post((it, t.tag), part, now, va=at)
            at += part
            self.unacked[(it, t.tag)] += 1
            if qp not in self.active:
                self.active.append(qp)

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
        _write_csv(base + ".ops.csv", OP_FIELDS, self.op_rows())
        _write_csv(base + ".iterations.csv", ITERATION_FIELDS, self.iteration_rows)
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
                   "rx_packets": len(self.packets), "loop_lag": self.lag.to_dict(),
                   "first_start_lag_us": round(self.first_start_lag_ns / 1000.0, 3)}
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
    precise_timers()
    try:  # as Open vSwitch and the queue emulator: wake on time when they hold the CPUs
        os.setpriority(os.PRIO_PROCESS, 0, AGENT_NICE)
    except OSError:
        pass  # not root: the fidelity monitor will show the lag
    if len(argv) != 1:
        print("usage: python -m traffic.agent CONFIG.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        config = json.load(f)
    agent = Agent(config)
    try:
        agent.open()
        # Cyclic garbage collection pauses the loop for milliseconds once the records grow;
        # the loop creates no reference cycles, so collect once now and then not at all.
        gc.collect()
        gc.freeze()
        gc.disable()
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
