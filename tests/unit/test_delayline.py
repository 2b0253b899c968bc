"""The RNIC's delay line (traffic.delayline) and the agent delivering what it releases."""
import pytest

from traffic.delayline import DelayLine
from traffic.roce import BTH_OFFSET as WIRE_OVERHEAD  # Ethernet, IPv4, UDP

A, B = 0x0A000101, 0x0A000201  # two peers' addresses, as the datagram tuple carries them


def dgram(rx_ns, addr, size, tag=0):
    """A datagram tuple as traffic.nicio gives it (only rx_ns, addr, size and a tag matter)."""
    return (0, rx_ns, 0, -1, addr, 49152, 0x07, 0x100, tag, 0, 0, 0, 0, size)


def test_a_frame_waits_its_paths_delay_and_its_own_transmission():
    line = DelayLine({A: 5000, B: 1000}, rate_bps=8e9)  # 1 ns per byte
    line.hold([dgram(100, A, 958)], now_ns=200)
    assert line.next_ns() == 100 + 5000 + 958 + WIRE_OVERHEAD
    assert line.due(6099) == []
    (out,) = line.due(6100)
    assert out[1] == 6100 and out[4] == A and out[13] == 958  # the release time stands in
    assert len(line) == 0 and line.next_ns() is None


def test_peers_interleave_by_release_and_one_peer_keeps_its_order():
    line = DelayLine({A: 5000, B: 1000}, rate_bps=8e9)
    # A's big frame, then A's small one 10 ns later: the small one may not overtake it
    line.hold([dgram(1, A, 4000, tag=1), dgram(11, A, 20, tag=2), dgram(21, B, 100, tag=3)],
              now_ns=30)
    released = line.due(10**9)
    assert [d[8] for d in released] == [3, 1, 2]
    assert released[1][1] == released[2][1] == 1 + 5000 + 4000 + WIRE_OVERHEAD


def test_an_unknown_sender_gets_only_the_transmission_and_a_missing_stamp_counts_from_now():
    line = DelayLine({A: 5000}, rate_bps=8e9)
    assert line.hold([dgram(0, 0x0A0000FE, 58)], now_ns=1000) == 1
    assert line.next_ns() == 1000 + 58 + WIRE_OVERHEAD


def test_the_agent_acts_on_a_held_frame_only_at_its_release(monkeypatch):
    """An RNIC with a delay line: a frame read now is delivered to the transport at its
    release time, with that time as its arrival, and the loop is woken for it."""
    from traffic import rnic as G

    delivered, armed = [], []

    class Receiver:
        def __init__(self, batch):
            self.batch = batch

        def read(self):
            out, self.batch = self.batch, []
            return out

        def deliver_parsed(self, datagrams, fast, handler):
            for d in datagrams:
                handler(*d)

    class Loop:
        def arm_release(self, held):
            armed.append(held.next_ns())

    g = G.Rnic.__new__(G.Rnic)
    g.held = DelayLine({A: 10_000}, rate_bps=8e9, owner=g)
    g.receiver, g.loop, g.fast, g.counters = Receiver([dgram(1_000, A, 100)]), Loop(), None, {}
    g.on_datagram = lambda *d: delivered.append(d)
    now = [2_000]
    monkeypatch.setattr(G.time, "time_ns", lambda: now[0])
    g.receive()
    release = 1_000 + 10_000 + 100 + WIRE_OVERHEAD
    assert delivered == [] and armed == [release]
    g.release(release - 1)
    assert delivered == []
    g.release(release)
    assert len(delivered) == 1 and delivered[0][1] == release and armed[-1] is None


@pytest.mark.parametrize("use_c", [True, False])
def test_parsed_datagrams_take_the_same_path_as_received_ones(use_c):
    """nicio.Receiver.deliver_parsed hands every datagram to the handler (the C fast path
    takes only the agent's in-order data packets, none here: no QP is known)."""
    import socket

    from traffic import nicio

    if use_c and not nicio.accelerated():
        pytest.skip("the C extension is not built")
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        r = nicio.Receiver(s, "10.0.0.1", use_c=use_c)
        got = []
        fast = ({}, {}, [], 0, 1, 10**9)
        items = [dgram(5, A, 100, tag=7), dgram(6, B, 62, tag=8)]
        r.deliver_parsed(items, fast, lambda *d: got.append(d))
        assert got == items
    finally:
        s.close()
