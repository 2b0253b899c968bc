"""RoCEv2 Reliable Connection as pure state machines: a requester and a responder per QP.

No sockets here: the agent feeds packets and clock readings in and sends what comes out. The
rules follow the InfiniBand RC transport (IBTA vol. 1, ch. 9.7) as RoCE NICs implement them
(docs/REFERENCE.md):

* Requester: RDMA WRITE messages are cut into MTU packets with consecutive 24-bit PSNs
  (FIRST/MIDDLE/LAST or ONLY; AckReq on the last). ACKs are cumulative. A NAK "PSN sequence
  error" rewinds the send pointer to the NAKed PSN (go-back-N). When the oldest packet stays
  unacknowledged for the retransmission timeout, it rewinds to it and doubles the timeout,
  up to the QP's local ACK timeout (adaptive retransmission: short first timeouts). The QP
  goes to error (``RetryExceeded``, IBV_WC_RETRY_EXC_ERR) only when it made no progress for
  its whole retry budget - ``retry_limit`` local ACK timeouts - or for ``stall_ns``, if
  shorter (how long the run can wait: ``Stalled``). A message completes when its last PSN is
  acknowledged.
* Responder: delivers packets in PSN order; acknowledges every ``ack_every`` packets and on
  AckReq (coalesced ACKs carry the MSN, the count of completed messages). On a gap it sends one
  NAK for the expected PSN and drops packets until that PSN arrives. A duplicate is dropped and
  re-acknowledged. With ``reorder_ns`` (for packet spraying) packets ahead of the expected PSN
  are placed instead of dropped, and a gap is NAKed only when it persists that long.
* Go-back-0 (``go_back_0``, a strawman kept to show why NICs moved to go-back-N, SIGCOMM 2016):
  the responder acknowledges whole messages only and, on a gap, discards the partial message
  and NAKs its first PSN, so the requester restarts the message from its first packet; a NAK
  restarts the requester's timer and retry count (the responder answered), so it retries for
  as long as NAKs come, as the NICs of the paper did. A
  message gets through only when all its packets do in one pass; under a small drop rate
  large messages rarely do (livelock). ``delivered`` then lists only PSNs placed for the first
  time: a restarted message's earlier packets are written again, not delivered twice.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, NamedTuple, Optional, Sequence, Tuple

from . import roce

PSN_MOD = 1 << 24
SYNDROME_ACK = 0x1F  # ACK, credit field "invalid" (no end-to-end credits)
SYNDROME_NAK_SEQ = 0x60  # NAK: PSN sequence error
MAX_AHEAD = 1 << 14  # packets a reordering responder places beyond a gap


def psn_diff(a: int, b: int) -> int:
    """a - b in 24-bit PSN space, in -2^23 .. 2^23-1."""
    d = (a - b) % PSN_MOD
    return d - PSN_MOD if d >= PSN_MOD // 2 else d


@dataclass
class Message:
    """One posted RDMA WRITE: its packets (opcode, payload length) and bookkeeping."""

    tag: object  # what the caller wants back on completion
    size: int
    first_psn: int
    opcodes: Sequence[int]
    payloads: Sequence[int]
    va: int = 0
    posted_ns: int = 0

    @property
    def last_psn(self) -> int:
        return (self.first_psn + len(self.opcodes) - 1) % PSN_MOD


class Outgoing(NamedTuple):
    """A data packet the requester wants on the wire now."""

    psn: int
    opcode: int
    payload: int
    ackreq: bool
    message: Message
    index: int  # packet index within the message
    retransmit: bool


class RetryExceeded(Exception):
    """The QP made no progress for its retry budget: it goes to error, as an RNIC's would."""

    def __init__(self, message: str, psn: int, retries: int, no_progress_ns: int):
        super().__init__(message)
        self.psn, self.retries, self.no_progress_ns = psn, retries, no_progress_ns


class Stalled(RetryExceeded):
    """The QP made no progress for as long as the run can wait, its budget not yet spent."""


class Requester:
    def __init__(self, mtu: int, rto_ns: int, ack_timeout_ns: int, retry_limit: int = 7,
                 first_psn: int = 0, go_back_0: bool = False, stall_ns: Optional[int] = None):
        # adaptive: the first timeout short (never longer than the ACK timeout), doubling to it
        self.mtu, self.max_rto, self.retry_limit = mtu, ack_timeout_ns, retry_limit
        self.rto0 = min(rto_ns, ack_timeout_ns)
        self.budget_ns = retry_limit * ack_timeout_ns  # no progress for this long: error
        self.give_up_ns = min(self.budget_ns, stall_ns or self.budget_ns)
        self.go_back_0 = go_back_0  # a NAK restarts the timer (the responder answered)
        self.next_psn = first_psn  # PSN of the next new packet to create
        self.send_psn = first_psn  # PSN of the next packet to put on the wire
        self.una = first_psn  # oldest unacknowledged PSN
        self.messages: Deque[Message] = deque()  # posted, not yet completed
        self.rto = self.rto0
        self.retries = 0
        self.progress_ns = 0  # when the retransmission timer started
        self.moved_ns = 0  # last time una moved (or the first send): the budget runs from it
        self.failed = False  # in the error state: sends nothing, no timer (work flushed)
        self.highest_sent = (first_psn - 1) % PSN_MOD
        self._cursor = None  # (PSN, message, index) of the packet after the last one sent
        self._shapes: Dict[int, Tuple[tuple, tuple]] = {}  # size -> (opcodes, payloads)
        self.counters = {"tx_packets": 0, "retransmitted": 0, "naks": 0, "timeouts": 0,
                         "acks": 0, "stale_acks": 0}

    # --- posting and sending ------------------------------------------------------------------
    def post(self, tag, size: int, now: int, va: int = 0) -> Message:
        shape = self._shapes.get(size)
        if shape is None:  # messages of a collective come in few sizes
            payloads = tuple(roce.packet_payloads(size, self.mtu))
            shape = self._shapes[size] = (tuple(roce.opcodes_for(len(payloads))), payloads)
        msg = Message(tag, size, self.next_psn, shape[0], shape[1], va, now)
        self.next_psn = (self.next_psn + len(shape[1])) % PSN_MOD
        if not self.messages and self.una == self.send_psn:
            self.progress_ns = self.moved_ns = now
        self.messages.append(msg)
        return msg

    def pending(self) -> bool:
        """Packets wait to be sent (new, or rewound for retransmission)."""
        return self.send_psn != self.next_psn and not self.failed

    def outstanding(self) -> bool:
        return self.una != self.next_psn

    def peek(self) -> Optional[Outgoing]:
        """The next packet to send, without sending it (None: nothing to send)."""
        if self.send_psn == self.next_psn or self.failed:
            return None
        psn = self.send_psn
        cursor = self._cursor
        if cursor is not None and cursor[0] == psn:  # the packet after the last one sent
            msg, index = cursor[1], cursor[2]
        else:
            msg, index = self._locate(psn)
        return Outgoing(psn, msg.opcodes[index], msg.payloads[index],
                        index == len(msg.opcodes) - 1, msg, index,
                        psn_diff(psn, self.highest_sent) <= 0)

    def commit(self, o: Outgoing, now: int) -> None:
        """``o`` (from ``peek``) went on the wire."""
        self.send_psn = (o.psn + 1) % PSN_MOD
        self._cursor = ((self.send_psn, o.message, o.index + 1)
                        if o.index + 1 < len(o.message.opcodes) else None)
        if o.retransmit:
            self.counters["retransmitted"] += 1
        else:
            self.highest_sent = o.psn
            self.counters["tx_packets"] += 1
            if self.una == o.psn:  # the timer and the budget run from its first transmission
                self.progress_ns = self.moved_ns = now

    def next(self, now: int) -> Optional[Outgoing]:
        """``peek`` and ``commit`` in one (the packet is assumed sent)."""
        o = self.peek()
        if o is not None:
            self.commit(o, now)
        return o

    def _locate(self, psn: int) -> Tuple[Message, int]:
        for msg in self.messages:
            offset = psn_diff(psn, msg.first_psn)
            if 0 <= offset < len(msg.opcodes):
                return msg, offset
        raise KeyError(f"PSN {psn} belongs to no posted message")

    # --- acknowledgements -------------------------------------------------------------------
    def on_ack(self, psn: int, syndrome: int, now: int) -> List[Message]:
        """An ACK (cumulative up to ``psn``) or a NAK; returns the messages now complete."""
        if syndrome >> 5 == 0b011:  # NAK
            self.counters["naks"] += 1
            if syndrome == SYNDROME_NAK_SEQ:
                done = self._acked_before(psn, now)  # a NAK acks everything before it
                # go back N - unless the NAKed PSN was acknowledged since (a late NAK)
                if 0 <= psn_diff(psn, self.una) and 0 <= psn_diff(self.send_psn, psn):
                    self.send_psn = psn
                    if self.go_back_0:  # the responder answered: timer and retries anew
                        self.progress_ns = self.moved_ns = now
                        self.rto, self.retries = self.rto0, 0
                return done
            return []
        self.counters["acks"] += 1
        return self._acked_before((psn + 1) % PSN_MOD, now)

    def _acked_before(self, psn: int, now: int) -> List[Message]:
        """Everything before ``psn`` is acknowledged."""
        ahead = psn_diff(psn, self.una)
        if ahead <= 0 or psn_diff(self.next_psn, psn) < 0:
            if ahead < 0 or psn_diff(self.next_psn, psn) < 0:
                self.counters["stale_acks"] += 1
            return []
        self.una = psn
        if psn_diff(self.send_psn, psn) < 0:
            self.send_psn = psn
        self.progress_ns = self.moved_ns = now
        self.rto, self.retries = self.rto0, 0
        done = []
        while self.messages and psn_diff(psn, self.messages[0].last_psn) > 0:
            done.append(self.messages.popleft())
        return done

    # --- timers -------------------------------------------------------------------------------
    def deadline(self) -> Optional[int]:
        """When the retransmission timer fires (None: nothing unacknowledged in flight)."""
        if self.failed or (self.una == self.send_psn and self.una == self.next_psn):
            return None
        if self.una == self.send_psn:
            return None  # nothing sent yet beyond what is acked: sending, not waiting
        return min(self.progress_ns + self.rto, self.moved_ns + self.give_up_ns)

    def check_timeout(self, now: int) -> bool:
        """Fire the retransmission timer if due: rewind to the oldest unacked PSN. Raises
        ``RetryExceeded`` once the QP went its whole budget without progress (``Stalled``:
        as long as the run can wait, its budget not spent)."""
        deadline = self.deadline()
        if deadline is None or now < deadline:
            return False
        idle = now - self.moved_ns
        if idle >= self.give_up_ns:
            self.failed = True
            kind = RetryExceeded if self.give_up_ns == self.budget_ns else Stalled
            raise kind(f"PSN {self.una} unacknowledged for {idle / 1e6:,.1f} ms (emulated) "
                       f"after {self.retries} retries", self.una, self.retries, idle)
        self.retries += 1
        self.counters["timeouts"] += 1
        self.send_psn = self.una
        self.progress_ns = now
        self.rto = min(self.rto * 2, self.max_rto)
        return True


@dataclass(frozen=True)
class Response:
    """An ACK or NAK for the requester: AETH syndrome, the PSN it refers to, the MSN."""

    syndrome: int
    psn: int
    msn: int


@dataclass
class Responder:
    ack_every: int = 16
    reorder_ns: int = 0  # > 0: tolerate reordering for this long (sprayed packets)
    go_back_0: bool = False  # restart a message from its first packet on a gap
    epsn: int = 0  # expected PSN
    message_psn: int = 0  # first PSN of the message being received (go-back-0 restarts it)
    fresh_psn: int = 0  # go-back-0: the first PSN never placed before
    msn: int = 0  # messages completed
    unacked: int = 0  # delivered since the last ACK
    nak_sent: bool = False  # one NAK per gap
    gap_since: Optional[int] = None  # when the current gap appeared (reordering mode)
    ahead: Dict[int, Tuple[int, bool]] = field(default_factory=dict)  # psn -> (opcode, ackreq)
    counters: Dict[str, int] = field(default_factory=lambda: {
        "delivered": 0, "out_of_order_dropped": 0, "duplicates": 0, "naks_sent": 0,
        "acks_sent": 0, "placed_ahead": 0})
    # the agents' C receive path may deliver an in-order packet itself while nothing is
    # placed ahead and go-back-0 (PSNs placed before) is off (traffic/_nicio.c)
    in_order_only: bool = field(init=False)

    def __post_init__(self):
        self.in_order_only = not self.go_back_0

    def on_packet(self, psn: int, opcode: int, ackreq: bool, now: int
                  ) -> Tuple[List[int], Optional[Response]]:
        """A data packet arrived: (PSNs delivered in order, ACK/NAK to send or None)."""
        d = psn_diff(psn, self.epsn)
        if d < 0:  # duplicate: drop it, tell the requester where we are - under go-back-0
            # the last whole message (a timeout rewound the requester into this one)
            self.counters["duplicates"] += 1
            return [], self._ack(self.message_psn if self.go_back_0 else self.epsn)
        if d > 0:  # a gap
            if self.reorder_ns and d < MAX_AHEAD:
                if psn not in self.ahead:
                    self.ahead[psn] = (opcode, ackreq)
                    self.counters["placed_ahead"] += 1
                    self.in_order_only = False
                if self.gap_since is None:
                    self.gap_since = now
                return [], self._nak_if_gap_old(now)
            self.counters["out_of_order_dropped"] += 1
            if self.nak_sent:
                return [], None
            self.nak_sent = True
            self.counters["naks_sent"] += 1
            if self.go_back_0:  # the partial message is discarded
                self.epsn = self.message_psn
            return [], Response(SYNDROME_NAK_SEQ, self.epsn, self.msn)
        if self.go_back_0:
            return self._deliver_whole(psn, opcode, ackreq)
        delivered = [psn]
        want_ack = self._deliver(opcode, ackreq)
        while self.ahead and self.epsn in self.ahead:  # placed packets that are now in order
            p = self.epsn
            op, req = self.ahead.pop(p)
            delivered.append(p)
            want_ack = self._deliver(op, req) or want_ack
        self.gap_since = now if self.ahead else None
        self.in_order_only = not self.ahead  # (go-back-0 returned above)
        return delivered, (self._ack() if want_ack else None)

    def _deliver(self, opcode: int, ackreq: bool) -> bool:
        self.epsn = (self.epsn + 1) % PSN_MOD
        self.nak_sent = False
        self.counters["delivered"] += 1
        self.unacked += 1
        if opcode in (roce.RC_RDMA_WRITE_LAST, roce.RC_RDMA_WRITE_ONLY):
            self.msn = (self.msn + 1) % PSN_MOD
        return ackreq or self.unacked >= self.ack_every

    def _deliver_whole(self, psn: int, opcode: int, ackreq: bool
                       ) -> Tuple[List[int], Optional[Response]]:
        """Go-back-0: place the in-order packet; acknowledge only a completed message."""
        self._deliver(opcode, ackreq)
        fresh = psn_diff(psn, self.fresh_psn) >= 0
        if fresh:
            self.fresh_psn = self.epsn
        if opcode in (roce.RC_RDMA_WRITE_LAST, roce.RC_RDMA_WRITE_ONLY):
            self.message_psn = self.epsn
            return [psn], self._ack()
        return ([psn] if fresh else []), None

    def _ack(self, upto: Optional[int] = None) -> Response:
        """An ACK of everything before ``upto`` (default: the expected PSN)."""
        self.unacked = 0
        self.counters["acks_sent"] += 1
        return Response(SYNDROME_ACK, ((self.epsn if upto is None else upto) - 1) % PSN_MOD,
                        self.msn)

    def _nak_if_gap_old(self, now: int) -> Optional[Response]:
        if self.nak_sent or now - self.gap_since < self.reorder_ns:
            return None
        self.nak_sent = True
        self.counters["naks_sent"] += 1
        return Response(SYNDROME_NAK_SEQ, self.epsn, self.msn)

    def tick(self, now: int) -> Optional[Response]:
        """Timer check for a gap that outlived the reorder window (spraying)."""
        if self.reorder_ns and self.ahead and self.gap_since is not None:
            return self._nak_if_gap_old(now)
        return None
