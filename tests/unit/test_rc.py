"""The RC state machines, packet by packet, without sockets."""
import pytest

from traffic import roce
from traffic.rc import (SYNDROME_ACK, SYNDROME_NAK_SEQ, Requester, Responder, RetryExceeded,
                        psn_diff)

MTU = 1024
MS = 1_000_000


def drain(req, now=0):
    out = []
    while True:
        o = req.next(now)
        if o is None:
            return out
        out.append(o)


def deliver(resp, packets, now=0, drop=()):
    """Feed packets to a responder; returns (delivered PSNs, responses)."""
    delivered, responses = [], []
    for o in packets:
        if o.psn in drop:
            continue
        d, r = resp.on_packet(o.psn, o.opcode, o.ackreq, now)
        delivered += d
        if r:
            responses.append(r)
    return delivered, responses


def test_a_message_is_cut_into_first_middle_last_with_ackreq_on_the_last():
    req = Requester(MTU, rto_ns=10 * MS, max_rto_ns=80 * MS, first_psn=100)
    req.post("m1", 3 * MTU + 10, now=0)
    pkts = drain(req)
    assert [p.psn for p in pkts] == [100, 101, 102, 103]
    assert [p.opcode for p in pkts] == [roce.RC_RDMA_WRITE_FIRST, roce.RC_RDMA_WRITE_MIDDLE,
                                        roce.RC_RDMA_WRITE_MIDDLE, roce.RC_RDMA_WRITE_LAST]
    assert [p.ackreq for p in pkts] == [False, False, False, True]
    assert [p.payload for p in pkts] == [MTU, MTU, MTU, 16]  # the 10-byte tail holds the probe


def test_one_lost_packet_one_nak_go_back_n_then_in_order_delivery():
    req = Requester(MTU, rto_ns=10 * MS, max_rto_ns=80 * MS)
    resp = Responder(ack_every=100)
    msg = req.post("m", 8 * MTU, now=0)
    first = drain(req)
    delivered, responses = deliver(resp, first, drop={3})
    assert delivered == [0, 1, 2]
    assert responses == [responses[0]] and responses[0].syndrome == SYNDROME_NAK_SEQ
    assert responses[0].psn == 3  # one NAK for the gap, not one per later packet
    assert resp.counters["out_of_order_dropped"] == 4
    assert req.on_ack(responses[0].psn, responses[0].syndrome, now=1) == []
    resent = drain(req, now=1)
    assert [p.psn for p in resent] == [3, 4, 5, 6, 7] and all(p.retransmit for p in resent)
    delivered, responses = deliver(resp, resent, now=1)
    assert delivered == [3, 4, 5, 6, 7]
    assert [r.syndrome for r in responses] == [SYNDROME_ACK]  # the LAST asked for an ACK
    assert req.on_ack(responses[0].psn, responses[0].syndrome, now=2) == [msg]
    assert req.counters["retransmitted"] == 5 and req.counters["naks"] == 1
    assert not req.outstanding()


def test_acks_are_coalesced_every_n_packets_and_on_ackreq():
    req = Requester(MTU, rto_ns=10 * MS, max_rto_ns=80 * MS)
    resp = Responder(ack_every=4)
    req.post("a", 10 * MTU, now=0)
    delivered, responses = deliver(resp, drain(req))
    assert len(delivered) == 10
    assert [r.psn for r in responses] == [3, 7, 9]  # after 4, after 8, and on the LAST
    assert [r.msn for r in responses] == [0, 0, 1]  # one message completed


def test_duplicates_are_dropped_and_reacknowledged():
    resp = Responder(ack_every=100)
    req = Requester(MTU, rto_ns=MS, max_rto_ns=8 * MS)
    req.post("a", 2 * MTU, now=0)
    pkts = drain(req)
    deliver(resp, pkts)
    delivered, responses = deliver(resp, pkts[:1])
    assert delivered == [] and responses[0].syndrome == SYNDROME_ACK and responses[0].psn == 1
    assert resp.counters["duplicates"] == 1


def test_retransmission_timeout_with_exponential_backoff_and_a_retry_limit():
    req = Requester(MTU, rto_ns=10 * MS, max_rto_ns=25 * MS, retry_limit=3)
    req.post("a", 2 * MTU, now=0)
    drain(req, now=0)
    assert req.deadline() == 10 * MS
    assert not req.check_timeout(9 * MS)
    assert req.check_timeout(10 * MS)  # the LAST was lost: nothing came back
    assert [p.psn for p in drain(req, now=10 * MS)] == [0, 1]
    assert req.deadline() == 10 * MS + 20 * MS  # doubled
    assert req.check_timeout(30 * MS)
    drain(req, now=30 * MS)
    assert req.deadline() == 30 * MS + 25 * MS  # capped
    assert req.check_timeout(55 * MS)
    drain(req, now=55 * MS)
    with pytest.raises(RetryExceeded):
        req.check_timeout(80 * MS)
    assert req.counters["timeouts"] == 3


def test_an_ack_resets_the_timer_and_completes_messages_in_order():
    req = Requester(MTU, rto_ns=10 * MS, max_rto_ns=80 * MS)
    a = req.post("a", MTU, now=0)
    b = req.post("b", MTU, now=0)
    drain(req, now=0)
    assert req.on_ack(0, SYNDROME_ACK, now=5 * MS) == [a]
    assert req.deadline() == 15 * MS
    assert req.on_ack(1, SYNDROME_ACK, now=6 * MS) == [b]
    assert req.deadline() is None
    assert req.on_ack(1, SYNDROME_ACK, now=7 * MS) == []  # stale: nothing new


def test_peek_does_not_advance_until_commit():
    req = Requester(MTU, rto_ns=MS, max_rto_ns=MS)
    req.post("a", 2 * MTU, now=0)
    o = req.peek()
    assert req.peek() == o  # the NIC was busy: the same packet again
    req.commit(o, now=0)
    assert req.peek().psn == 1


def test_psns_wrap_around_24_bits():
    req = Requester(MTU, rto_ns=MS, max_rto_ns=MS, first_psn=(1 << 24) - 2)
    msg = req.post("a", 4 * MTU, now=0)
    psns = [p.psn for p in drain(req)]
    assert psns == [(1 << 24) - 2, (1 << 24) - 1, 0, 1]
    assert psn_diff(1, (1 << 24) - 2) == 3
    assert req.on_ack(1, SYNDROME_ACK, now=1) == [msg]


def test_reordering_responder_places_by_psn_without_spurious_naks():
    resp = Responder(ack_every=100, reorder_ns=5 * MS)
    req = Requester(MTU, rto_ns=50 * MS, max_rto_ns=50 * MS)
    req.post("a", 6 * MTU, now=0)
    pkts = drain(req)
    order = [pkts[i] for i in (0, 2, 1, 4, 5, 3)]  # sprayed over paths of different delay
    delivered, responses = deliver(resp, order, now=1 * MS)
    assert delivered == [0, 1, 2, 3, 4, 5]
    assert all(r.syndrome == SYNDROME_ACK for r in responses)
    assert resp.counters["naks_sent"] == 0 and resp.counters["placed_ahead"] == 3


def test_reordering_responder_naks_a_gap_that_lasts():
    resp = Responder(ack_every=100, reorder_ns=5 * MS)
    req = Requester(MTU, rto_ns=50 * MS, max_rto_ns=50 * MS)
    req.post("a", 4 * MTU, now=0)
    pkts = drain(req)
    _d, responses = deliver(resp, [pkts[0], pkts[2]], now=0)
    assert responses == []
    assert resp.tick(4 * MS) is None
    nak = resp.tick(6 * MS)
    assert nak.syndrome == SYNDROME_NAK_SEQ and nak.psn == 1
    assert resp.tick(7 * MS) is None  # one NAK per gap


def test_a_nak_for_a_psn_already_acknowledged_does_not_rewind():
    """A late NAK (its gap long filled, everything acknowledged since) is a ghost: the
    requester must not go back to PSNs whose messages are complete and gone."""
    req = Requester(MTU, rto_ns=10 * MS, max_rto_ns=80 * MS)
    req.post("m1", MTU, now=0)
    req.post("m2", 3 * MTU, now=0)
    assert [p.psn for p in drain(req)] == [0, 1, 2, 3]
    assert [m.tag for m in req.on_ack(3, SYNDROME_ACK, now=1)] == ["m1", "m2"]
    assert req.on_ack(1, SYNDROME_NAK_SEQ, now=2) == []
    assert not req.pending() and req.peek() is None
    req.post("m3", MTU, now=3)  # and the next message goes out from where it should
    assert [p.psn for p in drain(req)] == [4]
