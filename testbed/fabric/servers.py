"""Where a run's nodes, processes and files live: this machine, or a remote server of a split
fabric reached over ssh (thin I/O edge).

The fabric, the queue emulators' handles and the agent processes ask a ``Server`` to start a
process, hand it a file, bring its outputs back or run a shell command; none of them tests
which kind of server it holds. ``Local`` works in place (files are already where they
belong); ``Remote`` keeps a private workspace on its server (``testbed.fabric.cluster``) and
copies files there and back.
"""
from __future__ import annotations

import os
import select
import shlex
import subprocess
import time
from typing import Dict, List

from ..base.errors import FabricError
from ..plan.placement import LOCAL


class Server:
    """This machine."""

    local = True
    name = LOCAL
    tag = ""  # in the names of the files that come from it

    def __init__(self, private_dir: str):
        self.private_dir = private_dir

    def place(self, local_path: str, directory: bool = False) -> str:
        """Where a process on this server writes what belongs at ``local_path``."""
        return local_path

    def send(self, local_path: str) -> str:
        """A file of this machine, readable there: its path there."""
        return local_path

    def fetch(self, there: str, local_path: str) -> None:
        """Copy ``there`` (a path or glob ``place`` gave) to ``local_path`` here."""

    def socket(self, name: str) -> str:
        """A unix socket path private to this run, on this server."""
        return os.path.join(self.private_dir, f"{name}.sock")

    def spawn(self, argv: List[str], timeout: float = 20.0, **popen) -> subprocess.Popen:
        """``argv`` as a process of its own session (Ctrl-C reaches the runner only)."""
        return subprocess.Popen(argv, start_new_session=True, **popen)

    def terminate(self, proc: subprocess.Popen, timeout: float = 15.0) -> None:
        """Ask a process ``spawn`` started to finish (it writes its files on SIGTERM); the
        caller's ``stop_process`` then makes sure it is gone."""

    def shell(self, command: str) -> str:
        """A shell command in this server's root namespace; its output (FabricError if it
        fails)."""
        r = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
        if r.returncode:
            raise FabricError(f"'{command[:60]}' failed: {r.stderr.strip()[:200]}")
        return r.stdout

    def clock(self) -> Dict[str, float]:
        """This server's CLOCK_REALTIME against this machine's."""
        return {"offset_us": 0.0, "uncertainty_us": 0.0}

    def remove(self) -> None:
        """Remove what this run left on the server (``Local``: the ledger does)."""


class Remote(Server):
    """A server of a split fabric: ssh as ``user``, files in the run's workspace there."""

    local = False

    def __init__(self, name: str, user: str, workspace):
        from .cluster import ssh_command

        self.name, self.user, self.workspace = name, user, workspace
        self.tag = f"@{name}"
        self.ssh = ssh_command(user, name)
        self.pids: Dict[int, int] = {}  # ssh client's pid -> the process's pid there

    def place(self, local_path: str, directory: bool = False) -> str:
        path = f"{self.workspace.dir(self.name)}/{os.path.basename(local_path.rstrip('/'))}"
        if directory:
            self.shell(f"mkdir -p -m 700 {shlex.quote(path)}")
        return path

    def send(self, local_path: str) -> str:
        return self.workspace.put(self.name, local_path)

    def fetch(self, there: str, local_path: str) -> None:
        self.workspace.get(self.name, there, local_path)

    def socket(self, name: str) -> str:
        return f"{self.workspace.dir(self.name)}/{name}.sock"

    def spawn(self, argv: List[str], timeout: float = 20.0, **popen) -> subprocess.Popen:
        """Through ssh (no terminal: the process there reads the ssh client's stdin, and a
        closed stdin ends it); its pid there is read first, for ``terminate``."""
        stdout = popen.pop("stdout", None)
        proc = subprocess.Popen(
            self.ssh + ["echo $$; exec " + " ".join(shlex.quote(a) for a in argv)],
            start_new_session=True, stdout=subprocess.PIPE, **popen)
        first = _first_line(proc.stdout.fileno(), timeout)
        if not first.isdigit():
            proc.kill()
            proc.wait(timeout=5)
            raise FabricError(f"{self.name}: could not start {' '.join(argv[:4])}: "
                              f"{first or 'no answer over ssh'}")
        self.pids[proc.pid] = int(first)
        if stdout is None:
            proc.stdout.close()  # nobody reads it: never let a full pipe block the process
        return proc

    def terminate(self, proc: subprocess.Popen, timeout: float = 15.0) -> None:
        pid = self.pids.get(proc.pid)
        if pid and proc.poll() is None:
            subprocess.run(self.ssh + [f"kill -TERM {pid}"], capture_output=True, timeout=30)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass

    def shell(self, command: str) -> str:
        return self.workspace.run(self.name, command)

    def clock(self) -> Dict[str, float]:
        from .cluster import clock_offset

        return clock_offset(self.user, self.name)

    def remove(self) -> None:
        self.workspace.remove_one(self.name)


def _first_line(fd: int, timeout: float) -> str:
    """One line from ``fd``, a byte at a time: nothing after it is taken from the pipe, so
    whoever reads the process's output next (a buffered or a raw reader) sees all of it."""
    deadline = time.monotonic() + timeout
    out = b""
    while not out.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        byte = os.read(fd, 1)
        if not byte:
            break
        out += byte
    return out.decode(errors="replace").strip()


def servers_for(names: List[str], user: str, private_dir: str, run_id: str) -> List[Server]:
    """This machine first, then a ``Remote`` for each other server named (one workspace)."""
    here = Server(private_dir)
    others = [n for n in names if n != LOCAL]
    if not others:
        return [here]
    from .cluster import Workspace

    workspace = Workspace(user, run_id)
    return [here] + [Remote(n, user, workspace) for n in others]
