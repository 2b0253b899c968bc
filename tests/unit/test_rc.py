"""The RC state machines, packet by packet, without sockets."""
import pytest

from traffic import roce
from traffic.rc import (SYNDROME_ACK, SYNDROME_NAK_SEQ, Requester, Responder, RetryExceeded,
                        Stalled, psn_diff)

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
    req = Requester(MTU, rto_ns=10 * MS, ack_timeout_ns=80 * MS, first_psn=100)
    req.post("m1", 3 * MTU + 10, now=0)
    pkts = drain(req)
    assert [p.psn for p in pkts] == [100, 101, 102, 103]
    assert [p.opcode for p in pkts] == [roce.RC_RDMA_WRITE_FIRST, roce.RC_RDMA_WRITE_MIDDLE,
                                        roce.RC_RDMA_WRITE_MIDDLE, roce.RC_RDMA_WRITE_LAST]
    assert [p.ackreq for p in pkts] == [False, False, False, True]
    assert [p.payload for p in pkts] == [MTU, MTU, MTU, 16]  # the 10-byte tail holds the probe


def test_one_lost_packet_one_nak_go_back_n_then_in_order_delivery():
    req = Requester(MTU, rto_ns=10 * MS, ack_timeout_ns=80 * MS)
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
    req = Requester(MTU, rto_ns=10 * MS, ack_timeout_ns=80 * MS)
    resp = Responder(ack_every=4)
    req.post("a", 10 * MTU, now=0)
    delivered, responses = deliver(resp, drain(req))
    assert len(delivered) == 10
    assert [r.psn for r in responses] == [3, 7, 9]  # after 4, after 8, and on the LAST
    assert [r.msn for r in responses] == [0, 0, 1]  # one message completed


def test_duplicates_are_dropped_and_reacknowledged():
    resp = Responder(ack_every=100)
    req = Requester(MTU, rto_ns=MS, ack_timeout_ns=8 * MS)
    req.post("a", 2 * MTU, now=0)
    pkts = drain(req)
    deliver(resp, pkts)
    delivered, responses = deliver(resp, pkts[:1])
    assert delivered == [] and responses[0].syndrome == SYNDROME_ACK and responses[0].psn == 1
    assert resp.counters["duplicates"] == 1


def test_the_timeout_doubles_up_to_the_ack_timeout_and_the_qp_errors_after_its_budget():
    # adaptive: 10 ms first, doubling up to the 25 ms local ACK timeout; the QP errors once
    # it went 3 x 25 ms without progress, as an RNIC with retry_cnt 3
    req = Requester(MTU, rto_ns=10 * MS, ack_timeout_ns=25 * MS, retry_limit=3)
    req.post("a", 2 * MTU, now=0)
    drain(req, now=0)
    assert req.deadline() == 10 * MS
    assert not req.check_timeout(9 * MS)
    assert req.check_timeout(10 * MS)  # the LAST was lost: nothing came back
    assert [p.psn for p in drain(req, now=10 * MS)] == [0, 1]
    assert req.deadline() == 10 * MS + 20 * MS  # doubled
    assert req.check_timeout(30 * MS)
    drain(req, now=30 * MS)
    assert req.deadline() == 30 * MS + 25 * MS  # capped at the ACK timeout
    assert req.check_timeout(55 * MS)
    drain(req, now=55 * MS)
    assert req.deadline() == 75 * MS  # the budget ends before the next timeout would
    with pytest.raises(RetryExceeded) as error:
        req.check_timeout(75 * MS)
    assert not isinstance(error.value, Stalled)
    assert (error.value.psn, error.value.retries, error.value.no_progress_ns) == (0, 3, 75 * MS)
    assert req.counters["timeouts"] == 3
    # in the error state: nothing more to send, no timer (its work requests are flushed)
    assert req.deadline() is None and req.peek() is None and not req.pending()


def test_progress_restarts_the_budget_and_a_run_that_cannot_wait_reports_a_stall():
    req = Requester(MTU, rto_ns=10 * MS, ack_timeout_ns=25 * MS, retry_limit=3)
    req.post("a", 3 * MTU, now=0)
    drain(req, now=0)
    for t in (10, 30, 55):
        assert req.check_timeout(t * MS)
        drain(req, now=t * MS)
    assert req.on_ack(0, SYNDROME_ACK, now=70 * MS) == []  # progress: a budget anew
    assert req.deadline() == 80 * MS and req.retries == 0
    assert req.check_timeout(80 * MS)
    # the same QP in a run that can wait only 40 ms: past that it is stalled, not in error
    short = Requester(MTU, rto_ns=10 * MS, ack_timeout_ns=25 * MS, retry_limit=3,
                      stall_ns=40 * MS)
    short.post("a", MTU, now=0)
    drain(short, now=0)
    for t in (10, 30):
        assert short.check_timeout(t * MS)
        drain(short, now=t * MS)
    assert short.deadline() == 40 * MS
    with pytest.raises(Stalled):
        short.check_timeout(40 * MS)


def test_an_ack_resets_the_timer_and_completes_messages_in_order():
    req = Requester(MTU, rto_ns=10 * MS, ack_timeout_ns=80 * MS)
    a = req.post("a", MTU, now=0)
    b = req.post("b", MTU, now=0)
    drain(req, now=0)
    assert req.on_ack(0, SYNDROME_ACK, now=5 * MS) == [a]
    assert req.deadline() == 15 * MS
    assert req.on_ack(1, SYNDROME_ACK, now=6 * MS) == [b]
    assert req.deadline() is None
    assert req.on_ack(1, SYNDROME_ACK, now=7 * MS) == []  # stale: nothing new


def test_peek_does_not_advance_until_commit():
    req = Requester(MTU, rto_ns=MS, ack_timeout_ns=MS)
    req.post("a", 2 * MTU, now=0)
    o = req.peek()
    assert req.peek() == o  # the NIC was busy: the same packet again
    req.commit(o, now=0)
    assert req.peek().psn == 1


def test_psns_wrap_around_24_bits():
    req = Requester(MTU, rto_ns=MS, ack_timeout_ns=MS, first_psn=(1 << 24) - 2)
    msg = req.post("a", 4 * MTU, now=0)
    psns = [p.psn for p in drain(req)]
    assert psns == [(1 << 24) - 2, (1 << 24) - 1, 0, 1]
    assert psn_diff(1, (1 << 24) - 2) == 3
    assert req.on_ack(1, SYNDROME_ACK, now=1) == [msg]


def test_reordering_responder_places_by_psn_without_spurious_naks():
    resp = Responder(ack_every=100, reorder_ns=5 * MS)
    req = Requester(MTU, rto_ns=50 * MS, ack_timeout_ns=50 * MS)
    req.post("a", 6 * MTU, now=0)
    pkts = drain(req)
    order = [pkts[i] for i in (0, 2, 1, 4, 5, 3)]  # sprayed over paths of different delay
    delivered, responses = deliver(resp, order, now=1 * MS)
    assert delivered == [0, 1, 2, 3, 4, 5]
    assert all(r.syndrome == SYNDROME_ACK for r in responses)
    assert resp.counters["naks_sent"] == 0 and resp.counters["placed_ahead"] == 3


def test_reordering_responder_naks_a_gap_that_lasts():
    resp = Responder(ack_every=100, reorder_ns=5 * MS)
    req = Requester(MTU, rto_ns=50 * MS, ack_timeout_ns=50 * MS)
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
    req = Requester(MTU, rto_ns=10 * MS, ack_timeout_ns=80 * MS)
    req.post("m1", MTU, now=0)
    req.post("m2", 3 * MTU, now=0)
    assert [p.psn for p in drain(req)] == [0, 1, 2, 3]
    assert [m.tag for m in req.on_ack(3, SYNDROME_ACK, now=1)] == ["m1", "m2"]
    assert req.on_ack(1, SYNDROME_NAK_SEQ, now=2) == []
    assert not req.pending() and req.peek() is None
    req.post("m3", MTU, now=3)  # and the next message goes out from where it should
    assert [p.psn for p in drain(req)] == [4]


def test_go_back_0_discards_the_partial_message_and_restarts_it_from_its_first_packet():
    req = Requester(MTU, rto_ns=10 * MS, ack_timeout_ns=80 * MS)
    resp = Responder(ack_every=2, go_back_0=True)
    done = req.post("done", 2 * MTU, now=0)
    msg = req.post("m", 6 * MTU, now=0)  # PSNs 2..7
    delivered, responses = deliver(resp, drain(req), drop={5})
    assert delivered == [0, 1, 2, 3, 4]
    # whole messages only are acknowledged (no ACK after two packets), then one NAK for
    # the first PSN of the message the gap is in
    assert [(r.syndrome, r.psn) for r in responses] == [(SYNDROME_ACK, 1),
                                                         (SYNDROME_NAK_SEQ, 2)]
    assert resp.epsn == 2 and resp.counters["out_of_order_dropped"] == 2  # 6 and 7
    for r in responses:
        req.on_ack(r.psn, r.syndrome, now=1)
    resent = drain(req, now=1)
    assert [p.psn for p in resent] == [2, 3, 4, 5, 6, 7]  # from the message's start
    delivered, responses = deliver(resp, resent, now=1)
    assert delivered == [5, 6, 7]  # 2-4 are written again, not delivered twice
    assert [(r.syndrome, r.psn) for r in responses] == [(SYNDROME_ACK, 7)]
    assert req.on_ack(7, SYNDROME_ACK, now=2) == [msg] and done not in req.messages


def test_go_back_0_never_completes_a_message_that_loses_a_packet_every_pass():
    req = Requester(MTU, rto_ns=10 * MS, ack_timeout_ns=80 * MS)
    resp = Responder(ack_every=16, go_back_0=True)
    req.post("m", 8 * MTU, now=0)
    for attempt in range(1, 5):  # a drop rate of 1 in 8: one packet lost in every pass
        delivered, responses = deliver(resp, drain(req, now=attempt), now=attempt,
                                       drop={attempt + 2})
        assert all(r.syndrome == SYNDROME_NAK_SEQ and r.psn == 0 for r in responses)
        for r in responses:
            assert req.on_ack(r.psn, r.syndrome, now=attempt) == []
    assert resp.msn == 0 and req.outstanding()
    gbn_req, gbn = Requester(MTU, 10 * MS, 80 * MS), Responder(ack_every=16)
    gbn_req.post("m", 8 * MTU, now=0)
    for attempt in range(1, 4):  # the first two passes' losses: go-back-N gets through
        for r in deliver(gbn, drain(gbn_req, now=attempt), now=attempt,
                         drop={attempt + 2} if attempt < 3 else set())[1]:
            gbn_req.on_ack(r.psn, r.syndrome, now=attempt)
    assert gbn.msn == 1 and not gbn_req.outstanding()


def test_go_back_0_retries_for_as_long_as_naks_come():
    req = Requester(MTU, rto_ns=10 * MS, ack_timeout_ns=80 * MS, retry_limit=1, go_back_0=True)
    resp = Responder(ack_every=16, go_back_0=True)
    req.post("m", 8 * MTU, now=0)
    for attempt in range(1, 6):  # five passes, 10 ms apart, each NAKed
        now = attempt * 10 * MS
        assert not req.check_timeout(now)  # the last NAK restarted the timer
        for r in deliver(resp, drain(req, now=now), now=now, drop={3})[1]:
            req.on_ack(r.psn, r.syndrome, now=now)
    assert req.counters["timeouts"] == 0 and req.counters["naks"] == 5
    # a timeout between NAKs (a pass's last packet lost) never adds up to the retry limit
    for attempt in range(6, 12):
        now = attempt * 10 * MS
        drain(req, now=now)  # all lost
        assert req.check_timeout(now + 10 * MS)
        for r in deliver(resp, drain(req, now=now + 10 * MS), now=now, drop={3})[1]:
            req.on_ack(r.psn, r.syndrome, now=now + 10 * MS)
    assert req.counters["timeouts"] == 6 and req.retries == 0


def test_go_back_0_never_acknowledges_part_of_a_message_when_a_timeout_rewinds_into_it():
    # the requester's timer fired while the message was still arriving (it shares a link):
    # it rewinds to the message's start; the responder, half way through, sees duplicates
    req = Requester(MTU, rto_ns=10 * MS, ack_timeout_ns=80 * MS, go_back_0=True)
    resp = Responder(ack_every=2, go_back_0=True)
    req.post("m", 8 * MTU, now=0)
    first = drain(req)
    deliver(resp, first[:5])  # PSNs 0-4 placed
    assert req.check_timeout(10 * MS)
    again = drain(req, now=10 * MS)
    _, responses = deliver(resp, again[:2], now=10 * MS)  # duplicates 0 and 1
    # whole messages only: nothing of the message is acknowledged yet
    assert all(r.psn == (0 - 1) % (1 << 24) for r in responses if r.syndrome == SYNDROME_ACK)
    for r in responses:
        req.on_ack(r.psn, r.syndrome, now=10 * MS)
    assert req.una == 0
    # the rest of the first pass loses PSN 6: the NAK for the message's start is obeyed
    _, responses = deliver(resp, first[5:], now=10 * MS, drop={6})
    assert [(r.syndrome, r.psn) for r in responses] == [(SYNDROME_NAK_SEQ, 0)]
    req.on_ack(0, SYNDROME_NAK_SEQ, now=11 * MS)
    assert [p.psn for p in drain(req, now=11 * MS)] == list(range(8))
