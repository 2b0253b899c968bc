"""UET's reliable unordered delivery (RUD, UE Spec 1.0 packet delivery sublayer) as pure state
machines: a sender and a receiver per packet delivery context (PDC).

No sockets here: the agent feeds packets and clock readings in and sends what comes out, as
for RC (``traffic.rc``). What differs from RC's go-back-N (docs/REFERENCE.md, "Ultra Ethernet
Transport on the wire"):

* Receiver: the first packet of a PDC carries SYN and opens it (its start PSN is the packet's
  PSN less the offset the SYN header carries). Packets are placed as they arrive, in any
  order (no reordering buffer, no drop of what is ahead of a gap). ACKs are coalesced - one per
  ``ack_bytes`` received, at once on an ACK request, a CE mark, or while a gap is open - and
  carry the cumulative PSN, the PSN that triggered them and a 64-bit SACK bitmap. A trimmed
  packet (its payload cut by a switch) is answered with a NACK TRIMMED at once.
* Sender: a NACK TRIMMED retransmits that one packet (about a round trip after it was sent);
  a packet ``reorder_packets`` transmissions older than the newest one acknowledged is taken
  as lost and retransmitted (loss inferred from SACKs); the retransmission timer fires only
  when nothing else recovers a packet, and then resends what is in flight. The budget is RC's:
  no progress for ``retry_limit`` x ``ack_timeout_ns`` fails the PDC (``rc.RetryExceeded``).
  The window (``traffic.nscc``) bounds the bytes in flight; each packet's entropy value comes
  from ``traffic.nscc.Spray``.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple, Union

from . import roce
from .nscc import Nscc, Spray
from .rc import RetryExceeded, Stalled
from .uet import NACK_TRIMMED

PSN_MOD = 1 << 32
SACK_BITS = 64
WINDOW = 1 << 14  # packets a receiver tracks beyond its cumulative PSN (and a sender sends)


def psn_diff(a: int, b: int) -> int:
    """a - b in 32-bit PSN space, in -2^31 .. 2^31-1."""
    d = (a - b) % PSN_MOD
    return d - PSN_MOD if d >= PSN_MOD // 2 else d


@dataclass
class Message:
    """One posted write: its packets' payload lengths and bookkeeping."""

    tag: object
    size: int
    first_psn: int
    payloads: Sequence[int]
    va: int = 0
    posted_ns: int = 0

    @property
    def last_psn(self) -> int:
        return (self.first_psn + len(self.payloads) - 1) % PSN_MOD


class Outgoing(NamedTuple):
    """A data packet the sender wants on the wire now."""

    psn: int
    payload: int
    message: Message
    index: int  # packet index within the message (SOM: 0, EOM: the last)
    retransmit: bool
    syn: bool  # the PDC is not yet acknowledged: the packet may be the one that opens it
    ack_request: bool
    entropy: int


class Tx(NamedTuple):
    """A transmission in flight: its order among all transmissions, when, on which path."""

    seq: int
    sent_ns: int
    entropy: int
    payload: int
    retransmit: bool


@dataclass(frozen=True)
class Ack:
    """ACK_CC: everything up to ``cack_psn`` received, ``ack_psn`` the packet that triggered
    it, bit k of ``bitmap`` the PSN ``sack_base + k``; ``ecn``: that packet came CE-marked."""

    cack_psn: int
    ack_psn: int
    sack_base: int
    bitmap: int
    ecn: bool
    received_bytes: int


@dataclass(frozen=True)
class Nack:
    psn: int
    code: int
    expected: int  # the largest PSN received plus one


class RudSender:
    def __init__(self, mtu: int, rto_ns: int, ack_timeout_ns: int, retry_limit: int = 7,
                 cc: Optional[Nscc] = None, spray: Optional[Spray] = None, first_psn: int = 0,
                 reorder_packets: int = 3, stall_ns: Optional[int] = None):
        self.mtu, self.max_rto, self.reorder = mtu, ack_timeout_ns, reorder_packets
        self.rto0 = self.rto = min(rto_ns, ack_timeout_ns)
        self.budget_ns = retry_limit * ack_timeout_ns
        self.give_up_ns = min(self.budget_ns, stall_ns or self.budget_ns)
        self.cc, self.spray = cc, spray or Spray(1)
        self.next_psn = self.una = first_psn  # next new PSN; oldest not acknowledged
        self.messages: Deque[Message] = deque()
        self.sent: Dict[int, Tx] = {}  # in flight, oldest transmission first
        self.sacked: Set[int] = set()  # acknowledged beyond una
        self.lost: Deque[int] = deque()  # to send again, in order
        self.lost_set: Set[int] = set()
        self.inflight = 0  # payload bytes in ``sent``
        self.seq = 0  # transmissions so far
        self.acked_seq = -1  # the newest transmission acknowledged
        self.established = False  # an ACK came: the PDC is open at the receiver
        self.new_psn = first_psn  # the next PSN never sent
        self.retries = 0
        self.moved_ns = 0  # last progress (or the first send): the budget runs from it
        self.failed = False
        self._cursor: Optional[Tuple[int, Message, int]] = None
        self._shapes: Dict[int, tuple] = {}
        self.counters = {"tx_packets": 0, "retransmitted": 0, "retx_trimmed": 0,
                         "retx_sack": 0, "retx_timeout": 0, "timeouts": 0, "acks": 0,
                         "nacks": 0, "nacks_trimmed": 0, "stale_acks": 0}

    # --- posting and sending ------------------------------------------------------------------
    def post(self, tag, size: int, now: int, va: int = 0) -> Message:
        payloads = self._shapes.get(size)
        if payloads is None:
            payloads = self._shapes[size] = tuple(roce.packet_payloads(size, self.mtu))
        msg = Message(tag, size, self.next_psn, payloads, va, now)
        self.next_psn = (self.next_psn + len(payloads)) % PSN_MOD
        if not self.messages:
            self.moved_ns = now
        self.messages.append(msg)
        return msg

    def window_open(self) -> bool:
        return self.cc is None or self.inflight == 0 or self.inflight + self.mtu <= self.cc.cwnd

    def pending(self) -> bool:
        """A packet waits to be sent and the window has room for it."""
        if self.failed or not self.window_open():
            return False
        return bool(self.lost) or self._new_allowed()

    def _new_allowed(self) -> bool:
        return self.new_psn != self.next_psn and psn_diff(self.new_psn, self.una) < WINDOW

    def outstanding(self) -> bool:
        return self.una != self.next_psn

    def peek(self) -> Optional[Outgoing]:
        """The next packet to send, without sending it (None: nothing, or the window is
        full)."""
        if not self.pending():
            return None
        while self.lost and self.lost[0] not in self.lost_set:
            self.lost.popleft()  # acknowledged after all
        if self.lost:
            psn, retransmit = self.lost[0], True
            msg, index = self._locate(psn)
        else:
            if not self._new_allowed():
                return None
            psn, retransmit = self.new_psn, False
            cursor = self._cursor
            msg, index = ((cursor[1], cursor[2]) if cursor is not None and cursor[0] == psn
                          else self._locate(psn))
        last = index == len(msg.payloads) - 1
        return Outgoing(psn, msg.payloads[index], msg, index, retransmit, not self.established,
                        last, self.spray.peek())

    def commit(self, o: Outgoing, now: int) -> None:
        """``o`` (from ``peek``) went on the wire."""
        self.spray.used(o.entropy)
        if o.retransmit:
            self.lost.popleft()
            self.lost_set.discard(o.psn)
            self.counters["retransmitted"] += 1
        else:
            self.new_psn = (o.psn + 1) % PSN_MOD
            self._cursor = ((self.new_psn, o.message, o.index + 1)
                            if o.index + 1 < len(o.message.payloads) else None)
            self.counters["tx_packets"] += 1
            if o.psn == self.una and not self.sent:
                self.moved_ns = now
        self.sent[o.psn] = Tx(self.seq, now, o.entropy, o.payload, o.retransmit)
        self.seq += 1
        self.inflight += o.payload

    def next(self, now: int) -> Optional[Outgoing]:
        o = self.peek()
        if o is not None:
            self.commit(o, now)
        return o

    def _locate(self, psn: int) -> Tuple[Message, int]:
        for msg in self.messages:
            offset = psn_diff(psn, msg.first_psn)
            if 0 <= offset < len(msg.payloads):
                return msg, offset
        raise KeyError(f"PSN {psn} belongs to no posted message")

    # --- acknowledgements -------------------------------------------------------------------
    def acked(self, psn: int) -> bool:
        return psn_diff(psn, self.una) < 0 or psn in self.sacked

    def on_ack(self, ack: Ack, now: int) -> List[Message]:
        """An ACK_CC: returns the messages now wholly acknowledged."""
        self.counters["acks"] += 1
        self.established = True
        if psn_diff(ack.cack_psn + 1, self.next_psn) > 0:
            self.counters["stale_acks"] += 1  # acknowledges PSNs never sent
            return []
        trigger = self.sent.get(ack.ack_psn)
        newly = 0
        upto = (ack.cack_psn + 1) % PSN_MOD
        for k in range(max(0, psn_diff(upto, self.una))):
            newly += self._acknowledge((self.una + k) % PSN_MOD)
        bits = ack.bitmap
        k = 0
        while bits:
            if bits & 1:
                newly += self._acknowledge((ack.sack_base + k) % PSN_MOD)
            bits >>= 1
            k += 1
        newly += self._acknowledge(ack.ack_psn)
        before = self.una
        if psn_diff(upto, self.una) > 0:
            self.una = upto
        while self.una in self.sacked:
            self.sacked.discard(self.una)
            self.una = (self.una + 1) % PSN_MOD
        if newly or self.una != before:
            self.moved_ns, self.rto, self.retries = now, self.rto0, 0
        if trigger is not None:
            self.spray.feedback(trigger.entropy, good=not ack.ecn)
        if self.cc is not None:
            rtt = None if trigger is None or trigger.retransmit else now - trigger.sent_ns
            self.cc.on_ack(now, newly, rtt, ack.ecn)
        self._infer_losses()
        done = []
        while self.messages and psn_diff(self.una, self.messages[0].last_psn) > 0:
            done.append(self.messages.popleft())
        return done

    def _acknowledge(self, psn: int) -> int:
        """Mark ``psn`` received; the payload bytes newly acknowledged (0: known already)."""
        if self.acked(psn) or psn_diff(psn, self.new_psn) >= 0:
            return 0
        tx = self.sent.pop(psn, None)
        self.lost_set.discard(psn)
        self.sacked.add(psn)
        if tx is None:  # taken as lost and waiting to go again: the first copy arrived late
            msg, index = self._locate(psn)
            return msg.payloads[index]
        self.inflight -= tx.payload
        self.acked_seq = max(self.acked_seq, tx.seq)
        return tx.payload

    def _infer_losses(self) -> None:
        """Packets sent ``reorder_packets`` transmissions before the newest one acknowledged
        are lost: to the retransmission queue."""
        limit = self.acked_seq - self.reorder
        while self.sent:
            psn, tx = next(iter(self.sent.items()))
            if tx.seq > limit:
                break
            self._to_resend(psn, tx)
            self.counters["retx_sack"] += 1

    def _to_resend(self, psn: int, tx: Tx) -> None:
        del self.sent[psn]
        self.inflight -= tx.payload
        if psn not in self.lost_set:
            self.lost_set.add(psn)
            self.lost.append(psn)

    def on_nack(self, nack: Nack, now: int) -> None:
        """A NACK: TRIMMED (or any other code) sends that packet again."""
        self.counters["nacks"] += 1
        tx = self.sent.get(nack.psn)
        if nack.code == NACK_TRIMMED:
            self.counters["nacks_trimmed"] += 1
            if tx is not None:
                self.spray.penalise(tx.entropy)
            if self.cc is not None:
                self.cc.on_nack(now)
        if tx is not None:
            self._to_resend(nack.psn, tx)
            self.counters["retx_trimmed" if nack.code == NACK_TRIMMED else "retx_sack"] += 1

    # --- timers -------------------------------------------------------------------------------
    def deadline(self) -> Optional[int]:
        """When the retransmission timer fires (None: nothing in flight)."""
        if self.failed or not self.sent:
            return None
        oldest = next(iter(self.sent.values()))
        return min(oldest.sent_ns + self.rto, self.moved_ns + self.give_up_ns)

    def check_timeout(self, now: int) -> bool:
        """Fire the timer if due: everything in flight goes again. Raises
        ``rc.RetryExceeded`` after the whole budget without progress (``rc.Stalled``: as
        long as the run can wait)."""
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
        for psn, tx in sorted(self.sent.items(), key=lambda item: psn_diff(item[0], self.una)):
            self._to_resend(psn, tx)
            self.counters["retx_timeout"] += 1
        self.rto = min(self.rto * 2, self.max_rto)
        if self.cc is not None:
            self.cc.on_timeout(now)
        return True


@dataclass
class RudReceiver:
    ack_bytes: int = 16384  # coalescing: one ACK per this many bytes received in order
    opened: bool = False
    epsn: int = 0  # everything before it received
    ahead: Set[int] = field(default_factory=set)  # received beyond epsn
    largest: int = -1  # the largest PSN received
    received_bytes: int = 0
    unacked_bytes: int = 0
    counters: Dict[str, int] = field(default_factory=lambda: {
        "delivered": 0, "out_of_order": 0, "duplicates": 0, "trimmed": 0, "acks_sent": 0,
        "nacks_sent": 0, "before_syn": 0})

    def on_packet(self, psn: int, payload: int, now: int, ack_request: bool = False,
                  ecn: bool = False, trimmed: bool = False, syn_offset: Optional[int] = None
                  ) -> Tuple[List[int], Optional[Union[Ack, Nack]]]:
        """A request arrived (``syn_offset``: it carries SYN and that PSN offset): (PSNs
        delivered - placed at once, in any order -, the ACK or NACK to send or None)."""
        if not self.opened:
            if syn_offset is None:
                self.counters["before_syn"] += 1  # not for an open PDC: dropped
                return [], None
            self.opened, self.epsn = True, (psn - syn_offset) % PSN_MOD
        d = psn_diff(psn, self.epsn)
        if d < 0 or psn in self.ahead:
            self.counters["duplicates"] += 1
            return [], self._ack(psn, ecn)
        if d >= WINDOW:
            return [], None  # beyond what is tracked: the sender never sends so far ahead
        if trimmed:
            self.counters["trimmed"] += 1
            self.counters["nacks_sent"] += 1
            return [], Nack(psn, NACK_TRIMMED, self._expected())
        self.counters["delivered"] += 1
        self.received_bytes += payload
        self.unacked_bytes += payload
        if self.largest < 0 or psn_diff(psn, self.largest) > 0:
            self.largest = psn
        filled = d == 0 and bool(self.ahead)  # a gap closed: the sender learns at once
        if d == 0:
            self.epsn = (self.epsn + 1) % PSN_MOD
            while self.epsn in self.ahead:
                self.ahead.discard(self.epsn)
                self.epsn = (self.epsn + 1) % PSN_MOD
        else:
            self.ahead.add(psn)
            self.counters["out_of_order"] += 1
        if ack_request or ecn or d or filled or self.ahead \
                or self.unacked_bytes >= self.ack_bytes:
            return [psn], self._ack(psn, ecn)
        return [psn], None

    def _expected(self) -> int:
        return (self.largest + 1) % PSN_MOD if self.largest >= 0 else self.epsn

    def _ack(self, trigger: int, ecn: bool) -> Ack:
        base = self.epsn
        if psn_diff(trigger, base) >= SACK_BITS:  # the bitmap ends at the triggering PSN
            base = (trigger - SACK_BITS + 1) % PSN_MOD
        bitmap = 0
        for psn in self.ahead:
            k = psn_diff(psn, base)
            if 0 <= k < SACK_BITS:
                bitmap |= 1 << k
        self.unacked_bytes = 0
        self.counters["acks_sent"] += 1
        return Ack((self.epsn - 1) % PSN_MOD, trigger, base, bitmap, ecn, self.received_bytes)
