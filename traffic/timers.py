"""One timer structure for an event loop that serves many emulated NICs, and its sleep.

``TimerHeap`` keeps every pending deadline (ns, CLOCK_REALTIME as the agents' clock) in one
heap. An owner re-arms by pushing its new deadline; a deadline that moved since it was pushed
is recognised by its owner when it comes up and skipped, so nothing is ever searched or
removed. ``Sleeper`` waits on an epoll set until a deadline: with ``epoll_pwait2``'s
nanosecond timeout where the C extension (``traffic/_nicio.c``) is built - one system call,
and the task's timer slack lets the kernel merge the wake-up with other timers - else with a
``TimerFd`` (a timerfd armed at the deadline, in the epoll sets; ``epoll``'s own timeout is in
milliseconds).

``epoll_pwait2`` may wake a fair-class task as late as a thousandth of its timeout, when that
is more than the task's timer slack (the kernel's ``select_estimate_accuracy``): an RTO after
a 215 ms stall came 215-330 us late, past the fidelity monitor's 209 us at 40 Mbit/s. No
single wait is therefore longer than ``MAX_WAIT_NS``; a later deadline takes several.
"""
from __future__ import annotations

import ctypes
import heapq
import itertools
import os
import time
from typing import Any, List, Optional, Tuple

try:
    from . import _nicio
except ImportError:
    _nicio = None

CLOCK_REALTIME = 0
TFD_NONBLOCK = 0o4000
TFD_CLOEXEC = 0o2000000
TFD_TIMER_ABSTIME = 1
MAX_WAIT_NS = 20_000_000  # 20 us of epoll's own slack at most


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class TimerHeap:
    """Deadlines with a payload; the earliest first."""

    def __init__(self):
        self._heap: List[Tuple[int, int, Any]] = []
        self._seq = itertools.count()

    def push(self, when_ns: int, what: Any) -> None:
        heapq.heappush(self._heap, (when_ns, next(self._seq), what))

    def next_ns(self) -> Optional[int]:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ns: int) -> Optional[Tuple[int, Any]]:
        """The earliest (deadline, payload) if it is due at ``now_ns``, else None."""
        if self._heap and self._heap[0][0] <= now_ns:
            when, _seq, what = heapq.heappop(self._heap)
            return when, what
        return None

    def __len__(self) -> int:
        return len(self._heap)


class TimerFd:
    """A CLOCK_REALTIME timerfd, armed at absolute times (ns since the epoch)."""

    def __init__(self):
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.timerfd_create(CLOCK_REALTIME, TFD_NONBLOCK | TFD_CLOEXEC)
        if self.fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_create: {os.strerror(err)}")
        self._spec = _Itimerspec()
        self._ref = ctypes.byref(self._spec)
        self.armed_ns: Optional[int] = None

    def arm(self, when_ns: Optional[int]) -> None:
        """Fire at ``when_ns`` (None: disarm); a time in the past fires at once."""
        if when_ns == self.armed_ns:
            return
        if _nicio is not None:  # the same call, without ctypes' argument handling
            _nicio.timer_arm(self.fd, 0 if when_ns is None else max(1, when_ns))
            self.armed_ns = when_ns
            return
        value = self._spec.it_value
        if when_ns is None:
            value.tv_sec = value.tv_nsec = 0
        else:
            value.tv_sec, value.tv_nsec = divmod(max(1, when_ns), 1_000_000_000)
        if self._libc.timerfd_settime(self.fd, TFD_TIMER_ABSTIME, self._ref, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")
        self.armed_ns = when_ns

    def fired(self) -> None:
        """Acknowledge an expiry (the fd was readable)."""
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            pass
        self.armed_ns = None

    def close(self) -> None:
        os.close(self.fd)


def wait_ns(deadline_ns: Optional[int], now_ns: int) -> int:
    """The timeout of one ``epoll_pwait2`` towards ``deadline_ns`` (None: no deadline)."""
    if deadline_ns is None:
        return MAX_WAIT_NS
    return min(MAX_WAIT_NS, max(0, deadline_ns - now_ns))


class Sleeper:
    """Waits on ``epoll`` sets until a deadline (ns since the epoch, CLOCK_REALTIME)."""

    def __init__(self, *sets):
        self.timer = None if _nicio is not None else TimerFd()
        if self.timer is not None:
            for ep in sets:
                ep.register(self.timer.fd, 1)  # EPOLLIN

    def wait(self, ep, deadline_ns: Optional[int]) -> List[Tuple[int, int]]:
        """The ready (fd, events) of ``ep``, once one is ready, ``deadline_ns`` passed (None:
        no deadline) or, with ``epoll_pwait2``, ``MAX_WAIT_NS`` passed: then it returns none
        and the caller waits again. The timer's own fd never appears."""
        if self.timer is None:
            return _nicio.wait(ep.fileno(), wait_ns(deadline_ns, time.time_ns()), 64)
        self.timer.arm(deadline_ns)
        events = ep.poll()
        fd = self.timer.fd
        out = [e for e in events if e[0] != fd]
        if len(out) != len(events):
            self.timer.fired()
        return out

    def close(self) -> None:
        if self.timer is not None:
            self.timer.close()
