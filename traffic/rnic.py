"""One emulated RoCEv2 RNIC: its sockets, Reliable Connection queue pairs, send and receive
paths, transmit timestamps, rate limiters and delay line, served by the agent's event loop
(``traffic.agent``) for the host it belongs to (``traffic.gpu``).

The host posts messages (RDMA WRITEs) on a QP (``post``); the RNIC tells it when a message to
it was delivered and when one of its own was acknowledged (``Host``). In between:

* one or more QPs per peer (a message is split over them, each with its own UDP source port
  derived from its QP number); or, with per-packet entropy, a fresh source port on every
  packet and a responder that tolerates reordering; with a flowlet gap, a new port after an
  idle gap;
* send path: frame templates patched in place (PSN, send time, ICRC) and written to a
  non-blocking AF_PACKET socket. The NIC holds ``NIC_QUEUE_FRAMES`` frames, counted by their
  kernel transmit timestamps, so the shaped link stays busy however late the loop wakes
  within its moderation interval, and a PFC pause stops the GPU like a NIC; the loop then
  waits for the next frame to leave. With DCQCN each QP that sends data has a rate limiter
  in the NIC's qdisc (``traffic.ratelimit``), set to its current rate: the RNIC hands it
  frames a few gaps ahead and the kernel paces them, so a late wake costs nothing on the wire
  unless the limiter ran dry (the tx file records when each held frame left its limiter);
* receive path: a UDP socket on port 4791 that reports each packet's kernel receive time and
  ECN bits; data goes to the QP's responder (in-order delivery, coalesced ACKs, NAKs on gaps,
  CNPs for CE marks), ACKs/NAKs to its requester (go-back-N), CNPs to its reaction point;
  with a delay line, frames are held until the modelled path delivers them.

One-way latency of every data packet = kernel receive time - kernel transmit time (all
emulated hosts share one clock).

Why one module over 400 lines: the send path, the receive path and the timers share the
NIC's and the QPs' state and run per packet; apart, they would trade that state through
attribute lookups on the hot path. What is pure lives beside it (rc, dcqcn, roce, ratelimit).
"""
from __future__ import annotations

import fcntl
import random
import socket
import sys
import termios
import time
from collections import defaultdict, deque
from typing import TYPE_CHECKING, Dict, FrozenSet, Iterable, List, Optional, Protocol, Tuple

from testbed.base.frames import full_frame_bytes
from testbed.base.procutil import in_netns

from . import nicio, ratelimit, roce
from .contract import GpuConfig, Peer, QpFailure, QpSeen
from .dcqcn import NotificationPoint, Parameters, ReactionPoint
from .delayline import DelayLine
from .rc import SYNDROME_ACK, Requester, Responder, RetryExceeded, Stalled
from .records import PACKET_FIELDS
from .rxsocket import open_rx, open_tx

if TYPE_CHECKING:
    from .agent import Loop


class Host(Protocol):
    """What an RNIC tells the host it belongs to (``traffic.gpu.Gpu``)."""

    def message_delivered(self, peer: int, iteration: int, tag: int, rx_ns: int) -> bool:
        """A message from ``peer`` arrived whole and in order; False: none was expected."""

    def message_acked(self, tag: Tuple[int, int], rx_ns: int) -> None:
        """A message this host posted (``tag``: iteration, transfer) was acknowledged."""

    def fail(self, reason: str, now: int, qp: Optional["QueuePair"] = None, detail: str = "",
             no_progress_ns: int = 0) -> None:
        """A QP is in error: the host's job fails."""

    def late(self, kind: str, lag_ns: int) -> None:
        """The loop acted ``lag_ns`` after one of this RNIC's timers of ``kind``."""


ECN_CE = 0b11
RETX_FLAG = 0x80000000  # in the probe header's step field: a retransmitted packet
QP_BASE = 0x100  # QPs 0 and 1 are special in InfiniBand
# Each DCQCN QP's rate and bytes are sampled for the records every this many full frames'
# times at the NIC's line rate (10 ms at 40 Mbit/s), the queue timeline's resolution: the
# same modelled time at every time scale
RATE_SAMPLE_FRAMES = 12
PROBE_CLOCK_SLACK_NS = 1_000_000_000  # all agents share one clock: a probe "sent" later is forged
DELIVERED = PACKET_FIELDS.index("delivered")  # in a packet record
STAMPS_BATCH = 32  # transmit timestamps are collected once this many wait (and at the end)
# Frames a NIC holds: the one on the wire and two more, so that the link stays busy through a
# wake-up delayed by a moderation interval plus a frame time
NIC_QUEUE_FRAMES = 3
# A QP paced by its NIC rate limiter (traffic.ratelimit) gets frames up to this many frame
# gaps ahead at its rate, and the loop comes back when one gap is left: a wake late by less
# than a gap changes nothing on the wire
LIMITER_FILL_GAPS = 4
LIMITER_LEAD_GAPS = 1
RETRY_EXC_ERR = "IBV_WC_RETRY_EXC_ERR (12)"  # the work completion a QP out of retries gives
MESSAGE_ENDS = frozenset((roce.RC_RDMA_WRITE_LAST, roce.RC_RDMA_WRITE_ONLY))
WRITES = frozenset((roce.RC_RDMA_WRITE_FIRST, roce.RC_RDMA_WRITE_MIDDLE,
                    roce.RC_RDMA_WRITE_LAST, roce.RC_RDMA_WRITE_ONLY))
PSN_MASK = roce.PSN_MASK


def qp_number(local_rank: int, remote_rank: int, index: int = 0, per_peer: int = 1) -> int:
    """The QP number ``local_rank`` uses for its ``index``-th connection to ``remote_rank``."""
    return QP_BASE + remote_rank * per_peer + index


def _first(active: List["QueuePair"], k: int) -> None:
    """Rotate the round-robin so that ``active[k]`` is served first next time."""
    if k > 0:
        active[:] = active[k:] + active[:k]


class QueuePair:
    """One RC connection of an RNIC: requester, responder, congestion control, templates."""

    __slots__ = ("nic", "qpn", "dqpn", "peer", "conn", "ack", "cnp", "req", "resp", "rp", "np",
                 "next_tx_ns", "bytes_sent", "samples", "next_sample_ns", "placed", "queued",
                 "armed", "control_frames", "control_bytes", "limit", "limit_bps", "held",
                 "limit_log", "sent_log", "last_tx_ns")

    def __init__(self, nic: "Rnic", peer: Peer, index: int, now_ns: int):
        t = nic.transport
        q = nic.qps_per_peer
        self.nic = nic
        self.qpn = qp_number(nic.rank, peer.rank, index, q)
        self.dqpn = qp_number(peer.rank, nic.rank, index, q)
        self.peer = peer.rank
        me = roce.Endpoint(nic.cfg.mac, nic.cfg.ip)
        them = roce.Endpoint(peer.mac, peer.ip)
        sport = roce.udp_source_port(self.qpn)
        self.conn = roce.Connection(me, them, sport, self.dqpn, tos=t.roce_tos)
        self.ack = roce.AckTemplate(roce.ack_frame(me, them, sport, self.dqpn, t.ack_tos))
        self.cnp = roce.cnp_frame(me, them, sport, self.dqpn, t.cnp_tos)
        self.req = Requester(nic.cfg.mtu, t.rto_ns, t.ack_timeout_ns, t.retry_limit,
                             go_back_0=t.go_back_0, stall_ns=t.stall_ns)
        self.resp = Responder(t.ack_every, t.reorder_ns, t.go_back_0)
        dcqcn = t.congestion_control == "dcqcn"
        self.rp = ReactionPoint(nic.dcqcn, now_ns=now_ns) if dcqcn else None
        self.np = NotificationPoint(nic.dcqcn.cnp_interval_ns) if dcqcn else None
        self.next_tx_ns = 0
        self.bytes_sent = 0
        self.samples: List[Tuple[int, float, int]] = []
        self.next_sample_ns = 0
        # psn -> (iteration, step, opcode, its row in the NIC's packet records)
        self.placed: Dict[int, Tuple[int, int, int, int]] = {}
        self.queued = False  # in the NIC's round-robin of QPs with data to send
        self.armed: Optional[int] = None  # the deadline this QP has in the loop's heap
        self.control_frames = self.control_bytes = 0  # ACKs, NAKs, CNPs it sent
        self.limit: Optional[int] = None  # its rate limiter's index on the NIC, if it has one
        self.limit_bps = 0.0  # the rate the limiter has (0: open)
        self.held: deque = deque()  # [sent ns, bytes, ready ns] of frames its limiter holds
        self.limit_log: List[Tuple[int, float]] = []  # (ns, bit/s) its limiter was set to
        self.sent_log: List[int] = []  # sent ns of each data frame (QPs with a limiter)
        self.last_tx_ns = 0  # when its last data frame left (0: none yet)

    def new_flowlet(self, rng: random.Random) -> None:
        """Start a new flowlet: a UDP source port other than the current one."""
        sport = self.conn.sport
        while sport == self.conn.sport:
            sport = roce.random_source_port(rng)
        self.conn.set_sport(sport)

    def next_timer_ns(self, nic_blocked: bool) -> Optional[int]:
        """The earliest time one of this QP's timers needs the loop (None: no timer)."""
        when = self.req.deadline()
        rp = self.rp
        if rp is not None:
            candidates = []
            if rp.congested:
                candidates.append(rp.next_event_ns())
                if self.queued and not nic_blocked:
                    candidates.append(self.next_tx_ns - (0 if self.limit is None else
                                                         self.nic.limiter_lead_ns(rp)))
            if rp.congested or self.queued or self._unsampled():
                candidates.append(self.next_sample_ns)
            for c in candidates:
                when = c if when is None or c < when else when
        resp = self.resp
        if resp.reorder_ns and resp.gap_since is not None:
            gap = resp.gap_since + resp.reorder_ns
            when = gap if when is None or gap < when else when
        return when

    def _unsampled(self) -> bool:
        last = self.samples[-1] if self.samples else (0, None, 0)
        return (self.rp.rate, self.bytes_sent) != last[1:]


class Rnic:
    """One GPU host's RoCEv2 RNIC: sockets, QPs, the send and receive paths, their timers."""

    def __init__(self, config: GpuConfig, loop: "Loop", host: Host, qps_per_peer: int,
                 iterations: int, local: FrozenSet[int] = frozenset()):
        """``qps_per_peer``: QPs connected to each peer; ``iterations``: how many the job has
        (a probe of a later one is forged); ``local``: peer ranks reached over the server's
        scale-up domain, never through this NIC."""
        self.cfg = config
        self.loop = loop
        self.host = host
        self.rank = config.rank
        self.transport = t = config.transport
        self.dcqcn = Parameters.emulated(config.link_rate_bps, t.dcqcn_timer_ns,
                                         t.dcqcn_byte_counter, t.cnp_interval_ns,
                                         t.dcqcn_clamp_target)
        self.peers = {p.rank: p for p in config.peers}
        self.rank_by_addr = {int.from_bytes(socket.inet_aton(p.ip), "big"): p.rank
                             for p in config.peers}
        self.qps_per_peer = qps_per_peer
        self.iterations = iterations
        self.local = local
        self.spray = t.entropy == "per-packet"
        self.rng = random.Random(self.rank)
        self.qps: Dict[Tuple[int, int], QueuePair] = {}
        self.by_qpn: Dict[int, QueuePair] = {}
        self.active: List[QueuePair] = []  # QPs with data to send, in round-robin order
        self.control: List[Tuple[QueuePair, bytes]] = []  # ACK/NAK/CNP frames for the NIC
        self.dirty: set = set()  # QPs whose timers may have moved earlier
        self.packets: List[tuple] = []
        self.counters: Dict[str, int] = defaultdict(int)
        self.tx = self.rx = self.receiver = self.sender = self.stamps = None
        self.fast: Optional[tuple] = None  # ``nicio.Receiver.read``'s fast path, once open
        self.held: Optional[DelayLine] = None  # the path delay's frames in flight, if any
        self.nic_blocked = False  # the NIC takes no more now: the loop waits for it
        self.kernel_full = False  # ... because the kernel refused a frame
        self.armed = False  # the loop waits for this NIC's socket
        self.tx_key = 0  # SO_TIMESTAMPING OPT_ID of the next frame sent
        self.stamped = 0  # frames whose transmit timestamp came back: they left the NIC
        self.stamp_mark = 0  # ``stamped`` at the last housekeeping
        self.next_departure_ns = 0  # no frame leaves the NIC before this
        self.ns_per_byte = 8e9 / config.link_rate_bps
        self.tx_pending: Dict[int, tuple] = {}  # key -> (sent_ns, bytes, kind)
        self.tx_log: List[tuple] = []  # (sent_ns, kernel transmit ns, bytes, kind)
        self.events: List[tuple] = []  # (ns, "rto" | "nak", peer rank): the timeline's instants
        self.limiters: Optional[ratelimit.Limiters] = None  # DCQCN's rate limiters in the NIC
        self.holding: set = set()  # QPs whose limiter holds frames
        self.full_frame = full_frame_bytes(config.mtu)
        self.rate_sample_ns = int(RATE_SAMPLE_FRAMES * self.full_frame * self.ns_per_byte)

    # --- sockets ----------------------------------------------------------------------------
    def open(self, sends: Iterable[Tuple[int, int, int]]) -> None:
        """Both sockets inside the host's namespace; every QP connected up front, as a job
        would, with the frame shape of every message part the host will post (``sends``:
        peer rank, QP index, bytes) built now (ranks start in step), and a rate limiter for
        each QP that sends data."""
        limiter = self.transport.qp_limiter
        with in_netns(self.cfg.netns_pid):
            self.tx = open_tx(self.cfg.intf)
            self.rx = open_rx(self.cfg.ip, roce.ROCE_UDP_PORT)
            if limiter:
                nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)  # NETLINK_ROUTE
                nl.bind((0, 0))
                self.limiters = ratelimit.Limiters(
                    nl, socket.if_nametoindex(self.cfg.intf), limiter.major,
                    limiter.open_bytes, limiter.burst, limiter.quantum)
        self.receiver = nicio.Receiver(self.rx, self.cfg.ip)
        # the receive path's common case, delivered where the packets are parsed
        self.fast = (self.by_qpn, self.rank_by_addr, self.packets, self.rank, self.iterations,
                     PROBE_CLOCK_SLACK_NS)
        self.sender = nicio.Sender(self.tx)
        self.stamps = nicio.Stamps(self.tx)
        if self.cfg.delay_line:
            self.held = DelayLine({int.from_bytes(socket.inet_aton(p.ip), "big"): p.delay_ns
                                   for p in self.cfg.peers}, self.cfg.link_rate_bps, self)
        now = time.time_ns()
        for peer in self.peers.values():
            if peer.rank not in self.local:
                for i in range(self.qps_per_peer):
                    self.qp(peer.rank, i, now)
        sends = sorted(set(sends))
        for peer, index, nbytes in sends:
            conn = self.qp(peer, index).conn
            payloads = roce.packet_payloads(nbytes, self.cfg.mtu)
            for opcode, size in set(zip(roce.opcodes_for(len(payloads)), payloads)):
                conn.template(opcode, size)
        if self.limiters is not None:
            self._open_limiters(sorted({(peer, index) for peer, index, _ in sends}))

    def _open_limiters(self, senders: List[Tuple[int, int]]) -> None:
        """A rate limiter for every QP that sends data (ACKs of the others are not paced)."""
        entries = []
        for n, key in enumerate(senders):
            qp = self.qp(*key)
            qp.limit = n
            entries.append((n, self.peers[qp.peer].ip, qp.dqpn))
        self.limiters.create(entries, self.transport.roce_tos)

    def close(self) -> None:
        for s in (self.tx, self.rx, self.limiters):
            if s is not None:
                s.close()

    def qp(self, peer: int, index: int, now_ns: int = 0) -> QueuePair:
        key = (peer, index)
        if key not in self.qps:
            qp = QueuePair(self, self.peers[peer], index, now_ns or time.time_ns())
            self.qps[key] = self.by_qpn[qp.qpn] = qp
        return self.qps[key]

    # --- receive ------------------------------------------------------------------------------

    def post(self, peer: int, index: int, tag: Tuple[int, int], nbytes: int, now: int,
             va: int = 0) -> None:
        """Post an RDMA WRITE of ``nbytes`` (``tag``: iteration, transfer) on QP ``index`` to
        ``peer``, at remote address ``va``."""
        qp = self.qp(peer, index)
        qp.req.post(tag, nbytes, now, va=va)
        self._queue(qp)

    def activity(self) -> Tuple[int, int, int]:
        """Packets received, frames sent, ACKs received: equal twice, nothing moved."""
        return (len(self.packets), self.tx_key,
                sum(q.req.counters["acks"] for q in self.qps.values()))

    def qp_failure(self, qp: QueuePair, start_ns: int) -> QpFailure:
        """What NCCL's warning would name of a QP in error, and what it saw last (ns since
        ``start_ns``)."""
        req, c = qp.req, qp.req.counters
        return QpFailure(qp.peer, self.peers[qp.peer].host, qp.qpn, req.una, req.retries,
                         req.moved_ns - start_ns,
                         QpSeen(c["acks"], c["naks"], c["timeouts"], c["retransmitted"]))

    def receive(self) -> None:
        """Handle every packet waiting on the receive socket, in arrival order - or, with a
        delay line, hold them until the modelled path delivers them."""
        held = self.held
        if held is None:
            self.receiver.deliver(self.fast, self.on_datagram)
            return
        got = self.receiver.read()
        if got:
            now = time.time_ns()
            unstamped = held.hold(got, now)
            if unstamped:
                self.counters["rx_no_timestamp"] += unstamped
            self.release(now)

    def release(self, now: int) -> None:
        """Hand the transport every held frame whose time has come; the loop wakes again for
        the next one. A frame read after its time (interrupt moderation) goes at once."""
        due = self.held.due(now)
        if due:
            self.receiver.deliver_parsed(due, self.fast, self.on_datagram)
        self.loop.arm_release(self.held)

    def on_datagram(self, status: int, rx_ns: int, tos: int, dropped: int, addr: int,
                    _sport: int, opcode: int, dqpn: int, word: int, a: int, b: int, c: int,
                    d: int, _size: int) -> None:
        """One received datagram (``nicio.Receiver``'s fields): data, ACK/NAK or CNP."""
        counters = self.counters
        if dropped >= 0:
            counters["rx_socket_drops"] = dropped
        if not rx_ns:
            counters["rx_no_timestamp"] += 1
            rx_ns = time.time_ns()
        if status == nicio.SHORT:
            counters["rx_invalid"] += 1
            return
        qp = self.by_qpn.get(dqpn)
        if qp is None:
            counters["rx_foreign_qp"] += 1  # another job's traffic (e.g. an incast)
            return
        if self.rank_by_addr.get(addr) != qp.peer:
            counters["rx_invalid"] += 1
            return
        if status == nicio.BAD_ICRC:
            counters["rx_bad_icrc"] += 1  # a NIC drops it before the transport sees it
            return
        if opcode == roce.RC_ACKNOWLEDGE:
            if a < 0:
                counters["rx_invalid"] += 1
            else:
                self._on_ack(qp, a, word & PSN_MASK, rx_ns)
        elif opcode == roce.CNP:
            counters["cnps_received"] += 1
            if qp.rp is not None:
                qp.rp.on_cnp(rx_ns)
                self.dirty.add(qp)
        elif opcode in WRITES:
            self._on_data(qp, opcode, word, a, b, c, d, tos & ECN_CE, rx_ns)
        else:
            counters["rx_invalid"] += 1

    def _on_data(self, qp: QueuePair, opcode: int, word: int, tx_ns: int, iteration: int,
                 step: int, payload_len: int, ecn: int, rx_ns: int) -> None:
        if payload_len < roce.PROBE.size:
            self.counters["rx_invalid"] += 1
            return
        if not (0 < tx_ns <= rx_ns + PROBE_CLOCK_SLACK_NS and iteration < self.iterations):
            self.counters["rx_invalid"] += 1  # not a probe of this run: a forged or foreign
            return                            # packet would corrupt the latency records
        psn, ackreq = word & PSN_MASK, word >> 31
        if ecn == ECN_CE:
            self.counters["rx_ce"] += 1
            if qp.np is not None and qp.np.on_ce(rx_ns):
                self.control.append((qp, qp.cnp))
        resp = qp.resp
        placed_before = resp.counters["placed_ahead"]
        delivered, response = resp.on_packet(psn, opcode, ackreq, rx_ns)
        retx = step & RETX_FLAG
        step &= ~RETX_FLAG
        self.packets.append((qp.peer, self.rank, psn, payload_len, tx_ns, rx_ns, iteration,
                             step, ecn, 1 if delivered else 0, 1 if retx else 0))
        if resp.counters["placed_ahead"] != placed_before:  # held until the gap fills
            qp.placed[psn] = (iteration, step, opcode, len(self.packets) - 1)
        elif delivered and opcode in MESSAGE_ENDS:
            self._message_end(qp, iteration, step, rx_ns)
        if len(delivered) > 1:
            for p in delivered[1:]:  # placed earlier, in order now: its record says delivered
                it, st, op, row = qp.placed.pop(p)
                r = self.packets[row]
                self.packets[row] = r[:DELIVERED] + (1,) + r[DELIVERED + 1:]
                if op in MESSAGE_ENDS:
                    self._message_end(qp, it, st, rx_ns)
        if response is not None:
            if response.syndrome != SYNDROME_ACK:
                self.events.append((rx_ns, "nak", qp.peer))
            self.control.append((qp, bytes(qp.ack.fill(response.psn, response.syndrome,
                                                       response.msn))))
        if resp.reorder_ns:
            self.dirty.add(qp)

    def _message_end(self, qp: QueuePair, iteration: int, tag: int, rx_ns: int) -> None:
        """The last packet of a message arrived in order."""
        if not self.host.message_delivered(qp.peer, iteration, tag, rx_ns):
            self.counters["rx_unexpected_messages"] += 1

    def _on_ack(self, qp: QueuePair, syndrome: int, psn: int, rx_ns: int) -> None:
        for msg in qp.req.on_ack(psn, syndrome, rx_ns):
            self.host.message_acked(msg.tag, rx_ns)
        if qp.req.pending():
            self._queue(qp)  # a NAK rewound it
        self.dirty.add(qp)

    # --- send ---------------------------------------------------------------------------------
    def _queue(self, qp: QueuePair) -> None:
        if not qp.queued:
            qp.queued = True
            self.active.append(qp)
            self.dirty.add(qp)

    def nic_full(self) -> bool:
        """Whether the NIC holds ``NIC_QUEUE_FRAMES`` frames (then it is blocked until the
        next transmit timestamp: the loop collects them when one arrives). Frames a rate
        limiter still holds have not reached the NIC's queue."""
        if self.tx_key - self.stamped < NIC_QUEUE_FRAMES:
            return False
        now = time.time_ns()
        if now >= self.next_departure_ns:  # a frame may have left since
            self.collect_stamps()
        if self.tx_key - self.stamped - self.held_frames(now) < NIC_QUEUE_FRAMES:
            return False
        self.nic_blocked = True
        self.counters["tx_blocked"] += 1
        return True

    def reconcile_stamps(self) -> None:
        """A NIC blocked although the kernel holds none of its frames (SIOCOUTQ): their
        timestamps were lost (a frame dropped before the driver gets none); count them."""
        if self.nic_blocked and not self.kernel_full and self.stamp_mark == self.stamped:
            queued = fcntl.ioctl(self.tx.fileno(), termios.TIOCOUTQ, b"\0" * 4)
            if int.from_bytes(queued, sys.byteorder) == 0:
                self.counters["tx_stamps_lost"] += self.tx_key - self.stamped
                self.stamped = self.tx_key
                self.loop.unblock(self)
        self.stamp_mark = self.stamped

    def flush_control(self) -> None:
        control = self.control
        sent = 0
        for qp, frame in control:
            if self.nic_full():
                break
            try:
                self.tx.send(frame)
            except BlockingIOError:
                self.nic_blocked = self.kernel_full = True
                break
            self.tx_pending[self.tx_key] = (time.time_ns(), len(frame), "c")
            self.tx_key += 1
            qp.control_frames += 1
            qp.control_bytes += len(frame)
            sent += 1
        del control[:sent]

    def held_frames(self, now: int) -> int:
        """Frames the QPs' rate limiters still hold at ``now``."""
        n = 0
        for qp in list(self.holding):
            held = qp.held
            while held and held[0][2] <= now:
                held.popleft()
            if held:
                n += len(held)
            else:
                self.holding.discard(qp)
        return n

    def limiter_lead_ns(self, rp: ReactionPoint) -> int:
        return int(LIMITER_LEAD_GAPS * self.full_frame * 8e9 / rp.rate)

    def sync_limit(self, qp: QueuePair, now: int) -> None:
        """Give the QP's rate limiter DCQCN's rate (open at line rate). HTB charges a frame at
        the rate it leaves with, so the frames the limiter holds after the first leave at the
        new rate: their times (and the QP's next) are moved accordingly."""
        rp = qp.rp
        want = rp.rate if rp.congested else 0.0
        if want == qp.limit_bps:
            return
        qp.limit_bps = want
        self.limiters.set_rate(qp.limit, want)
        qp.limit_log.append((now, want))
        held = qp.held
        while held and held[0][2] <= now:
            held.popleft()
        after = ratelimit.reschedule(held, 8e9 / (want or self.limiters.open_bps))
        if after is not None:
            qp.next_tx_ns = after

    def send_data(self) -> None:
        """Send packets round-robin over the QPs that may send now, until the NIC is full.
        The next call resumes with the QP the NIC had no room for: with room for one frame
        at a time, a restart from the first QP would serve only that one."""
        send, spray, active, pending = self.sender.send, self.spray, self.active, self.tx_pending
        flowlet_gap = self.transport.flowlet_gap_ns  # 0 where the policy sprays or keeps paths
        dirty, counters = self.dirty, self.counters
        while active and not self.nic_blocked:
            progressed = False
            i = 0
            while i < len(active):
                qp = active[i]
                i += 1
                now = time.time_ns()
                rp = qp.rp
                congested = rp is not None and rp.congested
                limited = congested and qp.limit is not None
                if limited:  # the limiter paces: hand it frames a few gaps ahead
                    if qp.next_tx_ns > now + LIMITER_FILL_GAPS * self.full_frame * 8e9 / rp.rate:
                        continue
                elif congested and qp.next_tx_ns > now:
                    continue
                req = qp.req
                o = req.peek()
                if o is None:
                    i -= 1
                    del active[i]
                    qp.queued = False
                    continue
                if self.tx_key - self.stamped >= NIC_QUEUE_FRAMES and self.nic_full():
                    _first(active, i - 1)
                    return
                if flowlet_gap and qp.last_tx_ns:  # idle longer than the gap: a new flowlet
                    leaves = max(now, qp.next_tx_ns) if limited else now
                    if leaves - qp.last_tx_ns > flowlet_gap:
                        qp.new_flowlet(self.rng)
                        qp.last_tx_ns = leaves  # one new port, also if the NIC refuses it
                        counters["flowlets"] += 1
                tpl = qp.conn.template(o.opcode, o.payload)
                if spray:
                    tpl.set_sport(roce.random_source_port(self.rng))
                msg = o.message
                it, step = msg.tag
                size = send(tpl, o.psn, o.ackreq, now, it,
                            step | RETX_FLAG if o.retransmit else step, msg.va, msg.size)
                if not size:
                    self.nic_blocked = self.kernel_full = True
                    counters["tx_blocked"] += 1
                    _first(active, i - 1)
                    return
                pending[self.tx_key] = (now, size, "d")
                self.tx_key += 1
                qp.bytes_sent += size
                if limited:  # the frame leaves the limiter one gap after the last
                    self.sync_limit(qp, now)
                    ready = max(now, qp.next_tx_ns)
                    qp.next_tx_ns = ready + int(size * 8e9 / qp.limit_bps)
                    if ready > now:
                        qp.held.append([now, size, ready])
                        self.holding.add(qp)
                    req.commit(o, ready)  # its retransmission timer runs from then
                    qp.last_tx_ns = ready
                    qp.sent_log.append(now)
                    rp.on_sent(size, now)
                    self.sync_limit(qp, now)
                else:
                    req.commit(o, now)
                    qp.last_tx_ns = now
                    if qp.limit is not None:
                        qp.sent_log.append(now)
                    if congested:  # the loop paces (at line rate the NIC does)
                        # a rate limiter with one frame of credit: a send the loop made late
                        # by less than a gap keeps the schedule, so late wakes keep the rate
                        gap = int(size * 8e9 / rp.rate)
                        qp.next_tx_ns = max(now - gap, qp.next_tx_ns) + gap
                        rp.on_sent(size, now)
                dirty.add(qp)
                progressed = True
            if not progressed:
                return

    def collect_stamps(self) -> None:
        """Join the kernel transmit timestamps waiting on the NIC socket to their frames."""
        n, last, size = self.stamps.join(self.tx_pending, self.tx_log)
        self.stamped += n
        if last >= 0:  # the next frame leaves the shaper one serialization time later
            self.next_departure_ns = last + size * self.ns_per_byte

    def service(self, now: int) -> None:
        """After this NIC's events and its host's: answer, send, re-arm its timers."""
        if self.limiters is not None:
            for qp in self.dirty:
                if qp.limit is not None:
                    self.sync_limit(qp, now)
        if self.control and not self.nic_blocked:
            self.flush_control()
        if self.active and not self.nic_blocked:
            self.send_data()
        if len(self.tx_pending) >= STAMPS_BATCH:
            self.collect_stamps()
        for qp in self.dirty:
            self.loop.rearm(qp, now)
        self.dirty.clear()
        if self.nic_blocked:
            self.loop.wait_for_nic(self)

    def qp_timers(self, qp: QueuePair, now: int, when: int) -> None:
        """Run the timers of ``qp`` due at ``now`` (armed for ``when``) and record how late the
        loop acted if one of them acted (a retransmission timeout, a paced packet's turn, a
        DCQCN rate or alpha update, a reordering NAK); nothing for a deadline that moved on
        meanwhile or the rate samples kept for the records. A QP whose limiter paces is late
        only by what its limiter ran dry for. One wake is one sample, under the kind of the
        last timer that acted."""
        late = kind = None
        try:
            fired = qp.req.check_timeout(now)
        except RetryExceeded as e:  # the QP is in error: its job fails, as NCCL's would
            self.host.fail("stalled" if isinstance(e, Stalled) else "retry-exceeded", now,
                      qp=qp, no_progress_ns=e.no_progress_ns)
            fired = False
        if fired:
            self.events.append((now, "rto", qp.peer))
            self._queue(qp)
            late, kind = now - when, "rto"
        rp = qp.rp
        if rp is not None:
            if rp.congested:
                if now >= rp.next_event_ns():
                    late, kind = now - when, "dcqcn"
                elif qp.queued and late is None:
                    if qp.limit is None:
                        if qp.next_tx_ns <= now:
                            late, kind = now - when, "pacing"
                    elif now >= qp.next_tx_ns - self.limiter_lead_ns(rp):
                        late, kind = max(0, now - max(qp.next_tx_ns, when)), "pacing"
            rp.tick(now)
            if now >= qp.next_sample_ns:
                if qp._unsampled():
                    qp.samples.append((now, rp.rate, qp.bytes_sent))
                qp.next_sample_ns = now + self.rate_sample_ns
        nak = qp.resp.tick(now)
        if nak is not None:
            self.events.append((now, "nak", qp.peer))
            self.control.append((qp, bytes(qp.ack.fill(nak.psn, nak.syndrome, nak.msn))))
            late, kind = now - when, "nak"
        self.dirty.add(qp)
        if late is not None:
            self.host.late(kind, late)

