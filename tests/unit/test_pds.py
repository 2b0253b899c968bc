"""UET's RUD (traffic.pds), NSCC and spraying (traffic.nscc): pure state machines, driven
packet by packet."""
import random

import pytest

from traffic import rc
from traffic.nscc import PENALTY_ROUNDS, Nscc, NsccParams, Spray
from traffic.pds import NACK_TRIMMED, Ack, Nack, RudReceiver, RudSender

MTU = 1024
US = 1_000


def sender(**kw):
    args = dict(mtu=MTU, rto_ns=500 * US, ack_timeout_ns=4_000 * US, retry_limit=3)
    args.update(kw)
    return RudSender(**args)


def drain(s, now=0):
    out = []
    while True:
        o = s.next(now)
        if o is None:
            return out
        out.append(o)


def arrive(r, o, now=0, **kw):
    return r.on_packet(o.psn, o.payload, now, ack_request=o.ack_request,
                       syn_offset=o.psn if o.syn else None, **kw)


def test_packets_are_placed_as_they_arrive_and_acks_coalesce():
    s, r = sender(), RudReceiver(ack_bytes=4 * MTU)
    msg = s.post("m", 10 * MTU, 0)
    sent = drain(s)
    assert [o.psn for o in sent] == list(range(10)) and all(o.syn for o in sent)
    assert [o.ack_request for o in sent] == [False] * 9 + [True]
    acks = []
    for o in sent[:3] + [sent[5], sent[4], sent[3]] + sent[6:]:
        delivered, resp = arrive(r, o)
        assert delivered == [o.psn]  # placed at once, also ahead of a gap
        if resp:
            acks.append(resp)
    # while a gap is open, and when it closes: one ACK per packet; then one per 4 KB or
    # on an ACK request
    assert [a.ack_psn for a in acks] == [5, 4, 3, 9]
    assert acks[0].cack_psn == 2 and acks[0].sack_base == 3 and acks[0].bitmap == 0b100
    assert r.counters["out_of_order"] == 2 and r.counters["delivered"] == 10
    done = []
    for a in acks:
        done += s.on_ack(a, 10 * US)
    assert done == [msg] and not s.outstanding() and s.counters["retransmitted"] == 0
    assert drain(s) == []
    s.post("n", MTU, 20 * US)
    assert s.next(20 * US).syn is False  # an ACK came: the PDC is open


def test_a_pdc_opens_with_its_syn_packet_only():
    r = RudReceiver()
    assert r.on_packet(5, MTU, 0) == ([], None)  # no PDC yet: dropped
    delivered, ack = r.on_packet(7, MTU, 0, syn_offset=2)  # start PSN 5, 7 arrived first
    assert delivered == [7] and ack.cack_psn == 4 and ack.bitmap == 0b100
    assert r.counters["before_syn"] == 1


def test_a_trimmed_packet_is_nacked_and_sent_again_alone():
    spray = Spray(8)
    cc = Nscc(NsccParams(base_rtt_ns=20 * US, bdp_bytes=32 * MTU, mtu=MTU))
    s, r = sender(spray=spray, cc=cc), RudReceiver()
    s.post("m", 6 * MTU, 0)
    sent = drain(s)
    responses = []
    for o in sent:
        _, resp = arrive(r, o, trimmed=o.psn == 2)
        responses.append(resp)
    nack = responses[2]
    assert nack == Nack(2, NACK_TRIMMED, 2)
    s.on_nack(nack, 5 * US)
    assert s.counters["nacks_trimmed"] == 1 and cc.counters["quick_adapts"] == 1
    assert spray.penalty[sent[2].entropy] == PENALTY_ROUNDS  # that path is avoided
    for resp in responses[3:]:  # ACKs of what came after it
        s.on_ack(resp, 7 * US)
    again = s.next(8 * US)
    assert again.psn == 2 and again.retransmit and s.counters["retx_trimmed"] == 1
    assert s.next(8 * US) is None  # nothing else goes again: no go-back-N
    delivered, ack = arrive(r, again, 9 * US)
    assert delivered == [2] and ack.cack_psn == 5
    assert s.on_ack(ack, 10 * US) and not s.outstanding()


def test_a_lost_packet_is_inferred_from_sacks_and_only_it_is_resent():
    s, r = sender(reorder_packets=3), RudReceiver()
    s.post("m", 8 * MTU, 0)
    sent = drain(s)
    for o in sent[1:]:  # PSN 0 lost
        _, ack = arrive(r, o)
        s.on_ack(ack, 10 * US)
    again = drain(s, 11 * US)
    assert [o.psn for o in again] == [0] and s.counters["retx_sack"] == 1
    _, ack = arrive(r, again[0])
    assert s.on_ack(ack, 12 * US) and s.counters["timeouts"] == 0


def test_the_timer_is_the_last_resort_and_the_budget_fails_the_pdc():
    s = sender(rto_ns=100 * US, ack_timeout_ns=400 * US, retry_limit=2)
    s.post("m", 3 * MTU, 0)
    sent = drain(s)  # every packet lost: nothing acknowledges anything
    assert s.deadline() == 100 * US and not s.check_timeout(99 * US)
    assert s.check_timeout(100 * US)
    assert [o.psn for o in drain(s, 100 * US)] == [0, 1, 2] and len(sent) == 3
    assert s.counters["retx_timeout"] == 3 and s.rto == 200 * US
    now = 100 * US
    with pytest.raises(rc.RetryExceeded):
        while True:
            now = s.deadline()
            if s.check_timeout(now):
                drain(s, now)
    assert s.failed and now == 800 * US  # 2 x 400 us without progress


def test_the_window_bounds_the_bytes_in_flight():
    cc = Nscc(NsccParams(base_rtt_ns=20 * US, bdp_bytes=4 * MTU, mtu=MTU))
    s = sender(cc=cc)
    s.post("m", 20 * MTU, 0)
    assert len(drain(s)) == 4 and s.inflight == 4 * MTU


def _transfer(make, receive, packets, loss, seed=1):
    """Rounds of a 32-packet window over a link losing ``loss`` of the data packets: the
    transmissions it took to complete a ``packets``-packet message."""
    rng = random.Random(seed)
    s = make()
    s.post("m", packets * MTU, 0)
    now, done = 0, False
    while not done:
        now += 100 * US
        burst = []
        while len(burst) < 32:
            o = s.next(now)
            if o is None:
                break
            burst.append(o)
        for o in burst:
            if rng.random() >= loss:
                for resp in receive(o, now):
                    done = bool(s.on_ack(resp, now + 10 * US)) if isinstance(resp, Ack) \
                        else done
        if not burst:
            s.check_timeout(now + s.rto)
    return s.counters["tx_packets"] + s.counters["retransmitted"]


def test_with_sack_a_lossy_link_costs_the_lost_packets_only_not_go_back_n():
    packets, loss = 2000, 0.02
    r = RudReceiver(ack_bytes=4 * MTU)

    def rud_receive(o, now):
        _, resp = arrive(r, o, now)
        return [resp] if resp else []

    rud = _transfer(lambda: sender(rto_ns=1_000 * US), rud_receive, packets, loss)
    lost = rud - packets
    assert 0 < lost < 3 * loss * packets  # each loss sent again about once
    # RC's go-back-N on the same link: every loss resends the rest of the window
    q = rc.Requester(MTU, 1_000 * US, 4_000 * US)
    resp_rc = rc.Responder(ack_every=4)
    q.post("m", packets * MTU, 0)
    rng, now, transmissions, done = random.Random(1), 0, 0, False
    while not done:
        now += 100 * US
        burst = []
        while len(burst) < 32 and q.pending():
            burst.append(q.next(now))
        transmissions += len(burst)
        for o in burst:
            if rng.random() >= loss:
                _, a = resp_rc.on_packet(o.psn, o.opcode, o.ackreq, now)
                if a:
                    done = bool(q.on_ack(a.psn, a.syndrome, now + 10 * US)) or done
        if not burst:
            q.check_timeout(now + q.rto)
    assert transmissions - packets > 3 * lost


def test_nscc_increases_below_the_target_and_cuts_when_marked_above_it():
    p = NsccParams(base_rtt_ns=20 * US, bdp_bytes=40 * MTU, mtu=MTU)
    cc = Nscc(p)
    cc.cwnd = 10.0 * MTU
    cc.on_ack(0, MTU, p.base_rtt_ns, ecn=False)  # no queueing: proportional, a whole MTU
    assert cc.cwnd == pytest.approx(11 * MTU)
    cc.on_ack(1, MTU, p.base_rtt_ns + int(p.target_ns), ecn=False)  # above: fair
    assert cc.cwnd == pytest.approx(11 * MTU + MTU / 11)
    w = cc.cwnd
    cc.on_ack(2, MTU, p.base_rtt_ns + int(p.target_ns) // 2, ecn=True)  # marked, below
    assert cc.cwnd == w and cc.counters["decreases"] == 0
    cc.avg_delay = 2 * p.target_ns
    cc.on_ack(3, MTU, p.base_rtt_ns + 2 * int(p.target_ns), ecn=True)
    assert cc.counters["decreases"] == 1 and cc.cwnd < w
    w = cc.cwnd
    cc.on_ack(4, MTU, p.base_rtt_ns + 2 * int(p.target_ns), ecn=True)  # once per base RTT
    assert cc.cwnd == w
    assert Nscc(p).max_cwnd == 60 * MTU  # 1.5 BDP


def test_quick_adapt_drops_the_window_to_what_was_delivered():
    p = NsccParams(base_rtt_ns=20 * US, bdp_bytes=40 * MTU, mtu=MTU)
    cc = Nscc(p)
    for t in range(0, 20 * US, US):  # 20 ACKs of one MTU in a base RTT
        cc.on_ack(t, MTU, None, ecn=False)
    cc.on_nack(21 * US)
    assert cc.cwnd == 20 * MTU and cc.counters["quick_adapts"] == 1
    cc.on_ack(22 * US, 0, p.base_rtt_ns + 5 * int(p.target_ns), ecn=False)
    assert cc.counters["quick_adapts"] == 1  # at most once per base RTT


def test_spraying_explores_reuses_good_paths_and_skips_penalised_ones():
    sp = Spray(4, base=100)
    seen = []
    for _ in range(4):
        ev = sp.peek()
        sp.used(ev)
        seen.append(ev)
    assert seen == [100, 101, 102, 103]
    sp.feedback(102, good=True)
    assert sp.peek() == 102
    sp.used(102)
    sp.penalise(101)
    picks = []
    for _ in range(6):
        ev = sp.peek()
        sp.used(ev)
        picks.append(ev)
    assert 101 not in picks[:3] and picks.count(101) <= 1
    sp.penalise(100)
    assert {sp.peek() for _ in range(5)} == {sp.peek()}  # peeking changes nothing
    one = Spray(1, base=7)
    one.feedback(7, good=False)
    assert {one.peek() for _ in range(3)} == {7}


def test_a_message_is_whole_when_its_last_packet_lands_in_any_order():
    from traffic.ses import Assembly
    a = Assembly(MTU)
    length = 3 * MTU + 1  # four packets, the last a padded tail
    assert [a.on_packet(7, length) for _ in range(3)] == [False, False, False]
    assert a.on_packet(8, MTU)  # another message, one packet, whole at once
    assert a.on_packet(7, length) and not a.missing
