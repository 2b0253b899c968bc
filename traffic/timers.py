"""One timer structure for an event loop that serves many emulated NICs.

``TimerHeap`` keeps every pending deadline (ns, CLOCK_REALTIME as the agents' clock) in one
heap. An owner re-arms by pushing its new deadline; a deadline that moved since it was pushed
is recognised when it comes up (``is_current``) and skipped, so nothing is ever searched or
removed. ``TimerFd`` is the kernel side: a timerfd armed at the heap's earliest deadline, with
nanosecond resolution and no timer slack, that an epoll set waits on (``epoll``'s own timeout
is in milliseconds).
"""
from __future__ import annotations

import ctypes
import heapq
import itertools
import os
from typing import Any, List, Optional, Tuple

CLOCK_REALTIME = 0
TFD_NONBLOCK = 0o4000
TFD_CLOEXEC = 0o2000000
TFD_TIMER_ABSTIME = 1


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
