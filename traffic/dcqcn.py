"""DCQCN (Zhu et al., SIGCOMM 2015; docs/REFERENCE.md) as pure state machines.

* ``ReactionPoint`` (sender, per QP): on a CNP, ``target = rate``, ``rate *= 1 - alpha/2``,
  ``alpha = (1 - g) alpha + g``; as ConnectX does by default (``clamp_tgt_rate`` 0), the target
  follows the rate down only if a rate-increase timer event came since the previous cut, so
  CNPs in a row (a queue held above Kmax, for instance by PFC) cut the rate but not the rate
  it recovers to (``clamp_target`` True: the paper's rule, every CNP). Every ``alpha_timer``
  without a CNP, ``alpha *= 1 - g``. Rate increase events come from a timer (every
  ``rate_timer``) and a byte counter (every ``byte_counter`` bytes sent); with ``T`` and
  ``BC`` the events of each kind since the last decrease: fast recovery
  (``rate = (target + rate) / 2``) while ``max(T, BC) < F``, additive increase
  (``target += R_AI``) once one of them reaches ``F``, hyper increase
  (``target += i * R_HAI``, ``i = min(T, BC) - F + 1``) once both have.
* ``NotificationPoint`` (receiver, per QP): one CNP per ``interval`` at most when CE-marked
  packets arrive.

Rates follow the line rate (R_AI = line / 1000 as in the paper's 40 Mb/s at 40 Gb/s, R_HAI
= 10 R_AI); the timers, the byte counter and the CNP interval are given in the emulation's
units by the scenario (``transport``), chosen relative to the emulated RTT and thresholds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple


@dataclass(frozen=True)
class Parameters:
    line_rate_bps: float
    g: float = 1 / 256
    alpha_timer_ns: int = 55_000  # K (paper: 55 us)
    rate_timer_ns: int = 55_000  # T (paper: 55 us)
    byte_counter: int = 10 * 1024 * 1024  # B (paper: 10 MB)
    fast_recovery_steps: int = 5  # F
    rai_bps: float = 0.0  # additive increase; 0: line rate / 1000 (paper: 40 Mb/s at 40G)
    rhai_bps: float = 0.0  # hyper increase; 0: 10 x R_AI
    min_rate_bps: float = 0.0  # 0: line rate / 1000
    cnp_interval_ns: int = 50_000  # NP: at most one CNP per QP per interval (about 50 us)
    clamp_target: bool = False  # True: every CNP sets target = rate (False: ConnectX's default)

    @classmethod
    def emulated(cls, line_bps: float, timer_ns: int, byte_counter: int,
                 cnp_interval_ns: int, clamp_target: bool = False) -> "Parameters":
        return cls(line_rate_bps=line_bps, alpha_timer_ns=timer_ns, rate_timer_ns=timer_ns,
                   byte_counter=byte_counter, cnp_interval_ns=cnp_interval_ns,
                   clamp_target=clamp_target)

    @property
    def rai(self) -> float:
        return self.rai_bps or self.line_rate_bps / 1000

    @property
    def rhai(self) -> float:
        return self.rhai_bps or 10 * self.rai

    @property
    def min_rate(self) -> float:
        return self.min_rate_bps or self.line_rate_bps / 1000


@dataclass
class ReactionPoint:
    p: Parameters
    now_ns: int = 0
    rate: float = 0.0
    target: float = 0.0
    alpha: float = 1.0
    timer_events: int = 0  # T
    byte_events: int = 0  # BC
    bytes_since: int = 0
    next_alpha_ns: int = 0
    next_rate_ns: int = 0
    cnps: int = 0
    history: List[Tuple[int, float]] = field(default_factory=list)  # (ns, rate) at changes
    congested: bool = False  # a CNP has arrived: the rate machinery runs

    def __post_init__(self):
        if not self.rate:
            self.rate = self.target = self.p.line_rate_bps
        self.history.append((self.now_ns, self.rate))

    def _set(self, rate: float, now: int) -> None:
        rate = max(self.p.min_rate, min(self.p.line_rate_bps, rate))
        if rate != self.rate:
            self.rate = rate
            self.history.append((now, rate))

    def on_cnp(self, now: int) -> None:
        self.cnps += 1
        if self.p.clamp_target or not self.congested or self.timer_events:
            self.target = self.rate
        self.congested = True
        self.alpha = (1 - self.p.g) * self.alpha + self.p.g
        self._set(self.rate * (1 - self.alpha / 2), now)
        self.timer_events = self.byte_events = self.bytes_since = 0
        self.next_alpha_ns = now + self.p.alpha_timer_ns
        self.next_rate_ns = now + self.p.rate_timer_ns

    def on_sent(self, nbytes: int, now: int) -> None:
        if not self.congested:
            return
        self.bytes_since += nbytes
        while self.bytes_since >= self.p.byte_counter:
            self.bytes_since -= self.p.byte_counter
            self.byte_events += 1
            self._increase(now)

    def tick(self, now: int) -> None:
        """Run the timers that are due at ``now``."""
        if not self.congested:
            return
        while now >= self.next_alpha_ns:
            self.alpha *= 1 - self.p.g
            self.next_alpha_ns += self.p.alpha_timer_ns
        while now >= self.next_rate_ns:
            self.timer_events += 1
            self.next_rate_ns += self.p.rate_timer_ns
            self._increase(self.next_rate_ns - self.p.rate_timer_ns)

    def next_event_ns(self) -> int:
        return min(self.next_alpha_ns, self.next_rate_ns) if self.congested else 1 << 62

    def _increase(self, now: int) -> None:
        f = self.p.fast_recovery_steps
        t, b = self.timer_events, self.byte_events
        if max(t, b) < f:
            pass  # fast recovery: the target stays
        elif min(t, b) < f:
            self.target += self.p.rai
        else:
            self.target += (min(t, b) - f + 1) * self.p.rhai
        self.target = min(self.target, self.p.line_rate_bps)
        self._set((self.target + self.rate) / 2, now)
        if self.rate >= self.p.line_rate_bps:
            self.congested = False  # back at line rate: nothing left to recover


@dataclass
class NotificationPoint:
    interval_ns: int
    last_cnp_ns: int = -(1 << 62)
    cnps_sent: int = 0
    ce_seen: int = 0

    def on_ce(self, now: int) -> bool:
        """A CE-marked packet arrived; True if a CNP should go out now."""
        self.ce_seen += 1
        if now - self.last_cnp_ns < self.interval_ns:
            return False
        self.last_cnp_ns = now
        self.cnps_sent += 1
        return True
