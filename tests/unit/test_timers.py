"""The agents' timer structure and sleep, with the C extension's epoll_pwait2 and without it
(a timerfd in the epoll set)."""
import os
import select
import time

import pytest

from traffic import timers


def test_the_heap_gives_deadlines_earliest_first_and_only_when_due():
    heap = timers.TimerHeap()
    for when, what in ((30, "c"), (10, "a"), (20, "b"), (10, "a2")):
        heap.push(when, what)
    assert heap.next_ns() == 10 and len(heap) == 4
    assert heap.pop_due(5) is None
    assert [heap.pop_due(25) for _ in range(3)] == [(10, "a"), (10, "a2"), (20, "b")]
    assert heap.pop_due(25) is None and heap.pop_due(30) == (30, "c")
    assert heap.next_ns() is None


@pytest.fixture(params=["c", "timerfd"])
def sleeper_kind(request, monkeypatch):
    if request.param == "c":
        if timers._nicio is None:
            pytest.skip("the C extension is not built")
    else:
        monkeypatch.setattr(timers, "_nicio", None)
    return request.param


def test_a_sleep_lasts_until_its_deadline(sleeper_kind):
    ep = select.epoll()
    sleeper = timers.Sleeper(ep)
    try:
        for wait_ms in (2, 5):
            start = time.time_ns()
            assert sleeper.wait(ep, start + wait_ms * 1_000_000) == []
            took = time.time_ns() - start
            assert took >= wait_ms * 1_000_000 - 100_000  # not early (the clock's grain)
        assert sleeper.wait(ep, time.time_ns() - 1000) == []  # a deadline passed: at once
    finally:
        sleeper.close()
        ep.close()


def test_a_ready_descriptor_ends_the_sleep_and_the_timer_never_shows(sleeper_kind):
    ep = select.epoll()
    sleeper = timers.Sleeper(ep)
    r, w = os.pipe()
    try:
        ep.register(r, select.EPOLLIN)
        os.write(w, b"x")
        start = time.time_ns()
        got = sleeper.wait(ep, start + 5_000_000_000)
        assert [fd for fd, _ev in got] == [r]
        assert time.time_ns() - start < 1_000_000_000
        os.read(r, 1)
        assert sleeper.wait(ep, time.time_ns() + 1_000_000) == []  # the timer's own fd hidden
    finally:
        sleeper.close()
        ep.close()
        os.close(r)
        os.close(w)


def test_no_single_epoll_wait_is_long_enough_for_the_kernel_to_add_slack():
    """epoll_pwait2 may add a thousandth of its timeout: a far deadline takes several waits."""
    now = 10**18
    assert timers.wait_ns(now + 5_000_000, now) == 5_000_000
    assert timers.wait_ns(now + 215_000_000, now) == timers.MAX_WAIT_NS
    assert timers.MAX_WAIT_NS // 1000 <= 20_000
    assert timers.wait_ns(now - 1, now) == 0
    assert timers.wait_ns(None, now) == timers.MAX_WAIT_NS
