"""Process helpers shared by the runner, the controller launcher and the agents."""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import socket
import time

LOG = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1
PR_SET_TIMERSLACK = 29
CLONE_NEWNET = 0x40000000
_libc = None


def libc():
    global _libc
    _libc = _libc or ctypes.CDLL(None, use_errno=True)
    return _libc


@contextlib.contextmanager
def in_netns(pid: int):
    """The calling thread inside the network namespace of process ``pid`` for the ``with``
    block, then back in its own. A socket made inside stays in that namespace."""
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    except OSError:
        os.close(own)
        raise
    try:
        if libc().setns(target, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into the namespace of pid {pid}: {os.strerror(err)}")
        try:
            yield
        finally:
            if libc().setns(own, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "could not return to the own namespace")
    finally:
        os.close(own)
        os.close(target)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent exits (Linux prctl)."""
    libc().prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() == 1:  # the parent already died before prctl took effect
        os.kill(os.getpid(), sig)


def precise_timers(slack_ns: int = 1000) -> None:
    """Let the kernel wake this process at most ``slack_ns`` after a timeout (default slack:
    50 us, more for long timeouts): the agents pace packets and end compute phases on time."""
    libc().prctl(PR_SET_TIMERSLACK, slack_ns, 0, 0, 0)


class SchedAttr(ctypes.Structure):
    """``struct sched_attr`` (sched_setattr(2)); ``sched_runtime`` of a fair-class task is its
    slice (Linux 6.12+)."""
    _fields_ = [("size", ctypes.c_uint32), ("sched_policy", ctypes.c_uint32),
                ("sched_flags", ctypes.c_uint64), ("sched_nice", ctypes.c_int32),
                ("sched_priority", ctypes.c_uint32), ("sched_runtime", ctypes.c_uint64),
                ("sched_deadline", ctypes.c_uint64), ("sched_period", ctypes.c_uint64),
                ("sched_util_min", ctypes.c_uint32), ("sched_util_max", ctypes.c_uint32)]


SYS_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}.get(os.uname().machine)
MIN_SLICE_NS = 100_000  # the kernel's lower bound on a custom slice


def takes_custom_slice(release: str) -> bool:
    """Whether a kernel of ``release`` (``uname -r``) honours a fair-class task's own slice
    (EEVDF's ``sched_runtime``, Linux 6.12+); older kernels accept the call and ignore it."""
    parts = release.split(".")
    try:
        return (int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)) >= (6, 12)
    except (IndexError, ValueError):
        return False


def react_first(nice: int, slice_ns: int = MIN_SLICE_NS) -> str:
    """Schedule this thread to react at once when it wakes: ``nice``, and a short scheduler
    slice, with which EEVDF lets a waking task preempt the running one (without it a waking
    task of equal weight may wait out the other's slice, 3 ms). Kernels before 6.12 take the
    nice value only. Returns what was applied ("" if nothing could be)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:
        return ""
    applied = f"nice {nice}"
    if SYS_SCHED_SETATTR is None or not takes_custom_slice(os.uname().release):
        return applied
    attr = SchedAttr(size=ctypes.sizeof(SchedAttr), sched_policy=0, sched_nice=nice,
                     sched_runtime=max(MIN_SLICE_NS, slice_ns))
    if libc().syscall(SYS_SCHED_SETATTR, 0, ctypes.byref(attr), 0) != 0:
        return applied
    return f"{applied}, slice {attr.sched_runtime // 1000} us"


def read_line(stream, timeout: float) -> str:
    """The next line a child writes to ``stream`` (its stdout pipe), stripped; "" if none
    comes within ``timeout`` seconds - how a child says it is ready."""
    ready, _, _ = select.select([stream], [], [], timeout)
    line = stream.readline() if ready else b""
    return (line.decode(errors="replace") if isinstance(line, bytes) else line).strip()


def log_tail(path: str, lines: int = 1) -> str:
    """The last ``lines`` lines of a child's log, joined by " | ", for an error message."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            last = [line.strip() for line in f.read().strip().splitlines()[-lines:]]
    except OSError:
        return "(no log)"
    return " | ".join(last) or "(empty log)"


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _stat_fields(pid: int) -> list:
    """``/proc/<pid>/stat`` after the command name (state, ppid, ...); [] if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return []


def start_time(pid: int) -> str:
    """When ``pid`` started (clock ticks since boot; '' if it is gone): with the pid, an
    identity that survives exec() and tells a reused pid apart."""
    fields = _stat_fields(pid)
    return fields[19].decode() if len(fields) > 19 else ""


def cpu_ticks(pid: int) -> int:
    """The CPU time ``pid`` has used, user + system (clock ticks; 0 if it is gone)."""
    fields = _stat_fields(pid)
    return int(fields[11]) + int(fields[12]) if len(fields) > 12 else 0


def parent_pid(pid: int) -> int:
    """The parent of ``pid`` (0 if it is gone)."""
    fields = _stat_fields(pid)
    return int(fields[1]) if len(fields) > 1 else 0


def identity(pid: int) -> str:
    """What a ledger records of a process: ``@<start time> <command line>``."""
    start = start_time(pid)
    return f"@{start} {cmdline(pid)}" if start else ""


def same_process(pid: int, recorded: str) -> bool:
    """Whether ``pid`` is still the process recorded (older records hold the command line)."""
    if recorded.startswith("@"):
        return bool(recorded) and start_time(pid) == recorded[1:].split(" ", 1)[0]
    return bool(recorded) and cmdline(pid) == recorded


def reap(proc, timeout: float) -> bool:
    """Wait up to ``timeout`` s for ``proc`` (a Popen) to exit and reap it; True once it has.
    Calls waitpid itself: an interrupt inside Popen's own wait or poll can leave that call's
    lock held, after which Popen never sees its process exit."""
    deadline = time.monotonic() + max(0.0, timeout)
    while proc.returncode is None:
        try:
            pid, status = os.waitpid(proc.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere: its status is lost (Popen says 0 too)
            proc.returncode = 0
            break
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def process_state(pid: int) -> str:
    """The state letter /proc gives ``pid`` (R, S, D, Z, ...; '' if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _send(proc, sig: int) -> None:
    try:
        os.kill(proc.pid, sig)
    except ProcessLookupError:
        pass


def cmdline(pid: int) -> str:
    """The command line of ``pid`` ('' if it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def stop_process(proc, timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` s; returns once the process is reaped."""
    stop_processes([proc], timeout, close=False)


def stop_processes(procs, timeout: float = 5.0, close: bool = True) -> None:
    """SIGTERM to each of ``procs`` still running, SIGKILL to those still there after
    ``timeout`` s (one shared deadline); reaped; their pipes closed (``close``)."""
    procs = [p for p in procs if p is not None]
    for proc in procs:
        if proc.returncode is None:
            _send(proc, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        if not reap(proc, deadline - time.monotonic()):
            _send(proc, signal.SIGKILL)
            if not reap(proc, 5.0):
                LOG.warning("process %d did not exit 5 s after SIGKILL (state %s)", proc.pid,
                            process_state(proc.pid))
        if not close:
            continue
        for stream in (proc.stdin, proc.stdout):
            if stream:
                stream.close()
