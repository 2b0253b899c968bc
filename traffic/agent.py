"""The GPU traffic agent: emulated RoCEv2 RNICs, many GPU hosts served by one event loop.

``python -m traffic.agent CONFIG.json`` serves every GPU host the configuration lists (the
runner starts one such process per CPU). Each GPU's sockets are opened inside its host's
network namespace (``setns`` per socket), so one process can be many NICs; one ``epoll`` set
waits on all of them and on one timer (``traffic.timers``). What a GPU does with its
iterations is ``traffic.gpu``, with its NIC ``traffic.rnic``; what it writes at the end,
``traffic.records``. This module is the loop that serves them and the process around it.

Protocol with the runner on stdout/stdin: ``ready`` once every socket is bound;
``go <start_ns>``; ``iter <host> <i>`` after each iteration; ``finished <host>`` when a GPU's
collectives are done - it keeps answering its peers (a lost ACK is re-sent on their
retransmission) until ``stop``; then the records are written and it prints ``done``.
``failed <host> <JSON>`` says a GPU's job failed (a QP out of its retry budget, or no progress
for as long as the run waits: ``Gpu.fail``); ``abort`` ends the loop at once, records written
as after ``stop``. Any other failure exits non-zero with one line on stderr.
"""
from __future__ import annotations

import gc
import json
import os
import select
import sys
import time
from typing import Dict, List, NamedTuple, Optional, Sequence

from testbed.base.frames import full_frame_bytes
from testbed.base.procutil import die_with_parent, precise_timers, react_first

from . import records
from .collectives import Transfer
from .contract import AgentConfig, GpuConfig, Job
from .delayline import DelayLine
from .gpu import Gpu
from .progress import Phase
from .rnic import QueuePair, Rnic
from .timers import Sleeper, TimerHeap

AGENT_NICE = -20
HOUSEKEEPING_NS = 1_000_000_000
# Packets wait at most this share of a full frame's time at the line rate before the loop
# takes them (interrupt moderation); timers are not moderated.
MODERATION_SHARE = 1.0


class ScaleUpArrival(NamedTuple):
    """A scale-up transfer reaching its receiver: a timer of the loop serving both GPUs."""
    sender: Gpu
    receiver: Gpu
    transfer: Transfer
    iteration: int


class Loop:
    """One epoll set and one timer for every GPU of this process."""

    def __init__(self, configs: Sequence[GpuConfig], out=sys.stdout, commands: int = 0,
                 scheduling: str = "normal", job: Optional[Job] = None):
        self.out, self.commands = out, commands
        self.scheduling = scheduling  # how the process got the CPU (on_time), for the records
        self.epoll = select.epoll()
        self.quiet = select.epoll()  # the runner only: polling mode's sleep
        self.sleeper = Sleeper(self.epoll, self.quiet)
        self.heap = TimerHeap()
        phases = [Phase(job.graph.name, 0, job.graph, job.iterations)] if job else None
        self.gpus = [Gpu(c, self, phases) for c in configs]
        self.gpu_of_rank = {g.rank: g for g in self.gpus}
        for g in self.gpus:
            strangers = sorted(g.server - set(self.gpu_of_rank))
            if strangers:
                raise RuntimeError(f"{g.host}: the GPUs of its server with ranks {strangers} "
                                   "are not served by this process")
        # a full frame's time at the fastest GPU NIC
        self.frame_ns = min(int(full_frame_bytes(c.mtu) * 8e9 / c.link_rate_bps)
                            for c in configs)
        self.moderation_ns = int(MODERATION_SHARE * self.frame_ns)
        self.by_fd: Dict[int, Rnic] = {}  # receive socket -> its RNIC
        self.nics: Dict[int, Rnic] = {}  # NIC socket -> its RNIC
        self.lines: List[str] = []
        self.finished = 0  # GPUs whose collectives are done
        self.wakes = 0
        self.stopping = False
        self.aborting = False  # the runner ends the job: a GPU's failed
        self.command_buf = b""

    def open(self) -> None:
        for gpu in self.gpus:
            gpu.open()
            nic = gpu.nic
            self.by_fd[nic.rx.fileno()] = nic
            self.epoll.register(nic.rx.fileno(), select.EPOLLIN)
            self.nics[nic.tx.fileno()] = nic  # a transmit timestamp: one frame left
            self.epoll.register(nic.tx.fileno(), select.EPOLLET)

    def close(self) -> None:
        for gpu in self.gpus:
            gpu.close()
        self.sleeper.close()
        self.epoll.close()
        self.quiet.close()

    # --- what the GPUs ask of the loop --------------------------------------------------------
    def at(self, when: int, gpu: Gpu) -> None:
        """Wake ``gpu`` at ``when`` (the end of compute ops it runs)."""
        self.heap.push(when, gpu)

    def scale_up(self, when: int, sender: Gpu, t: Transfer, it: int) -> None:
        """Deliver scale-up transfer ``t`` at ``when`` (both GPUs are this loop's)."""
        self.heap.push(when, ScaleUpArrival(sender, self.gpu_of_rank[t.dst], t, it))

    def rearm(self, qp: QueuePair, now: int) -> None:
        when = qp.next_timer_ns(qp.nic.nic_blocked)
        if when is not None and (qp.armed is None or when < qp.armed):
            when = max(when, now)  # due already: the loop learns of it only now
            qp.armed = when
            self.heap.push(when, qp)

    def arm_release(self, held: DelayLine) -> None:
        """Wake the delay line's owner when its next held frame is due."""
        when = held.next_ns()
        if when is not None and (held.armed is None or when < held.armed):
            held.armed = when
            self.heap.push(when, held)

    def wait_for_nic(self, nic: Rnic) -> None:
        """Wake ``nic``'s GPU when the NIC has room. Each transmit timestamp on the socket's
        error queue (reported by epoll, edge-triggered) says a frame left; only after the
        kernel refused a frame does the loop also wait for EPOLLOUT."""
        if nic.kernel_full and not nic.armed:
            nic.armed = True
            self.epoll.modify(nic.tx.fileno(), select.EPOLLET | select.EPOLLOUT)

    def unblock(self, nic: Rnic) -> None:
        if nic.armed:
            self.epoll.modify(nic.tx.fileno(), select.EPOLLET)
        nic.nic_blocked = nic.kernel_full = nic.armed = False

    def say(self, line: str) -> None:
        self.lines.append(line)

    # --- the loop -----------------------------------------------------------------------------
    def run(self, start_ns: int) -> None:
        """From ``start_ns`` until every GPU finished and the runner said ``stop``.

        Like a NIC's interrupt moderation: a wake that found packets puts the loop in
        polling mode, where it sleeps until its next timer or ``moderation_ns`` after that
        wake, whichever comes first, and then takes everything that arrived meanwhile in one
        go; a wake that found none puts it back to waiting for packets. Timers always run
        on time (kernel timestamps date every packet, whenever it is handled)."""
        for gpu in self.gpus:
            gpu.go(start_ns)
        self.heap.push(start_ns + HOUSEKEEPING_NS, None)
        if self.commands is not None:
            self.epoll.register(self.commands, select.EPOLLIN)
            self.quiet.register(self.commands, select.EPOLLIN)
        epoll, by_fd, nics = self.epoll, self.by_fd, self.nics
        heap, quiet, moderation, sleep = self.heap, self.quiet, self.moderation_ns, \
            self.sleeper.wait
        polling, woke = False, 0
        while not self.aborting and not (self.stopping and self.finished == len(self.gpus)):
            when = heap.next_ns()
            if polling:
                for fd, _ev in sleep(quiet, min(when, woke + moderation)):
                    if fd == self.commands:
                        self._read_commands()
                events = sleep(epoll, 0)
            else:
                events = sleep(epoll, when)
            self.wakes += 1
            woke = time.time_ns()
            touched: set = set()
            self.run_timers(touched)  # they are due now: packets wait, their times are kept
            for fd, _ev in events:
                nic = by_fd.get(fd)
                if nic is not None:
                    nic.receive()
                    touched.add(nic.host)
                elif fd in nics:  # the NIC took a frame out: room again
                    nic = nics[fd]
                    self.unblock(nic)
                    nic.collect_stamps()
                    touched.add(nic.host)
                elif fd == self.commands:
                    self._read_commands()
                if heap.next_ns() <= time.time_ns():
                    self.run_timers(touched)
            polling = bool(touched)
            self.run_timers(touched)
            self.serve(touched)
            if self.lines:
                self.out.write("\n".join(self.lines) + "\n")
                self.out.flush()
                self.lines.clear()

    def serve(self, touched: set) -> None:
        """Service every GPU in ``touched``. A timer that falls due meanwhile runs between two
        GPUs (and its GPU is served too): one GPU's busy service (a congested NIC, a batch of
        marked packets) does not make every other GPU's timers late."""
        while touched:
            touched.pop().service(time.time_ns())
            self.run_timers(touched)

    def run_timers(self, touched: set) -> None:
        """Run every timer that is due; the GPUs they belong to go into ``touched``."""
        heap = self.heap
        now = time.time_ns()
        while True:
            due = heap.pop_due(now)
            if due is None:
                return
            when, what = due
            if isinstance(what, QueuePair):
                if what.armed != when:
                    continue  # superseded by an earlier deadline
                what.armed = None
                nic = what.nic
                nic.qp_timers(what, now, when)
                gpu = nic.host
            elif isinstance(what, DelayLine):
                if what.armed != when:
                    continue  # superseded by an earlier release
                what.armed = None
                nic = what.owner
                gpu = nic.host
                gpu.late("delay", now - when)
                nic.release(now)
            elif isinstance(what, ScaleUpArrival):
                what.receiver.late("scale-up", now - when)
                what.receiver.scale_up_arrived(what.transfer, what.iteration, when)
                what.sender.scale_up_sent(what.transfer, what.iteration, when)
                touched.add(what.receiver)
                gpu = what.sender
            elif what is None:
                for g in self.gpus:
                    g.check_stuck(now)
                    g.nic.reconcile_stamps()
                    if g.nic.limiters is not None:
                        g.nic.limiters.check()  # a rate change the kernel refused fails the run
                    touched.add(g)
                heap.push(now + HOUSEKEEPING_NS, None)
                continue
            else:
                gpu = what
                gpu.compute_done(when, now)
            touched.add(gpu)

    def _read_commands(self) -> None:
        chunk = os.read(self.commands, 4096)
        if not chunk:  # the runner went away
            raise RuntimeError("the runner closed the agents' stdin")
        self.command_buf += chunk
        *lines, self.command_buf = self.command_buf.split(b"\n")
        for line in lines:
            if line.strip() == b"stop":
                self.stopping = True
            elif line.strip() == b"abort":
                self.aborting = True

    def write_records(self, out_dir: str) -> None:
        for gpu in self.gpus:
            gpu.counters["loop_wakes"] = self.wakes
            records.write(gpu, out_dir)


def read_line(fd: int) -> str:
    """One line from ``fd``, unbuffered: what follows it stays for the loop's epoll."""
    out = bytearray()
    while True:
        b = os.read(fd, 1)
        if not b or b == b"\n":
            return out.decode(errors="replace")
        out += b


def on_time() -> str:
    """Take the CPU soon when a timer or a packet wakes the loop: nice -20, as Open vSwitch and
    the switch-queue emulator get theirs, and the shortest scheduler slice, without which
    EEVDF may let the running task finish its own (oversubscribed, two interleaved runs:
    timer lag p95 316 -> 126-251 us). Not real-time: the agents as SCHED_FIFO woke on time
    but starved the forwarding when the CPUs were saturated (docs/emulation-cost.md,
    "Scheduling and the host's own noise"). Returns what it got, for the results; without
    it the fidelity monitor shows the lag."""
    return react_first(AGENT_NICE) or "normal"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    die_with_parent()
    scheduling = on_time()
    if len(argv) != 1:
        print("usage: python -m traffic.agent CONFIG.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        config = AgentConfig.from_dict(json.load(f))
    loop = Loop(config.gpus, commands=sys.stdin.fileno(), scheduling=scheduling, job=config.job)
    # the kernel may merge a wake-up with other timers this much later: an eighth of what
    # the fidelity monitor allows timers to be late (a quarter of a frame time)
    precise_timers(max(1000, loop.frame_ns // 32))
    hosts = ", ".join(g.host for g in config.gpus)
    try:
        loop.open()
        # Cyclic garbage collection pauses the loop for milliseconds once the records grow;
        # the loop creates no reference cycles that matter, so collect once now, then never.
        gc.collect()
        gc.freeze()
        gc.disable()
        print("ready", flush=True)
        line = read_line(sys.stdin.fileno()).split()
        if len(line) != 2 or line[0] != "go":
            print(f"agent of {hosts}: expected 'go <start_ns>', got {line!r}", file=sys.stderr)
            return 1
        loop.run(int(line[1]))
        loop.write_records(config.out_dir)
        print("done", flush=True)
        return 0
    except (RuntimeError, OSError) as e:
        print(f"agent of {hosts}: {e}", file=sys.stderr)
        return 1
    finally:
        loop.close()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
