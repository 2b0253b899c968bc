"""What a run created, written down before it is created, so that exactly that is removed.

A run holds an exclusive lock (one fabric per machine: the plan's names are fixed) and keeps a
record in ``/run/ai-fabric-testbed/run.json``: the OVS bridges, the interfaces and the processes
it created, the kernel settings it changed, and for changes of other kinds (routing rules of
``--traffic rxe``) the shell command that undoes each. A record left by a run that died is
never overwritten: the next run refuses until ``clean`` used it.

What a run made also carries its tag, so that ``clean`` finds it when the record is gone:
bridges in OVSDB (``external_ids:ai-fabric-testbed=<run id>``, in the transaction that creates
them), the switches' interfaces in their alias (``ai-fabric-testbed=<run id>``, set once the
fabric is built; the record covers them until then). ``present`` is the one definition of
"ours" for a run that finds names of its fabric in use and for ``clean``.

Teardown - at the end of a run, after an error or Ctrl-C, or by ``python -m testbed clean``
after the runner was killed - removes what the record and the tags name, and nothing else:
never ``mn -c``, never a kill by process name.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Dict, List, Optional, Tuple

from .atomic import atomic_file
from .errors import RunBusyError
from .procutil import identity, same_process

LOG = logging.getLogger(__name__)
STATE_DIR = os.environ.get("TESTBED_STATE_DIR", "/run/ai-fabric-testbed")
OVS_TAG = "ai-fabric-testbed"


def restore_sysctl(path: str, old: int, ours: int) -> bool:
    """Put ``old`` back into ``path`` if it still holds the value we wrote (``ours``)."""
    try:
        with open(path) as f:
            if int(f.read()) != ours:
                return False  # someone changed it since: not ours to undo
        with open(path, "w") as f:
            f.write(str(old))
        return True
    except (OSError, ValueError):
        return False


class Ledger:
    """The lock and the resource record of one run."""

    def __init__(self, run_id: str, state_dir: str = STATE_DIR):
        self.run_id = run_id
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, "run.json")
        self._lock_fd: Optional[int] = None
        self.data = {"run_id": run_id, "pid": os.getpid(), "bridges": [], "interfaces": [],
                     "pids": {}, "sysctls": {}, "undo": []}

    # --- lock -------------------------------------------------------------------------------
    def acquire(self, results_dir: str = "") -> None:
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(self.state_dir, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            other = read_record(self.state_dir) or {}
            raise RunBusyError(
                f"another testbed run is active (pid {other.get('pid', '?')}, run "
                f"{other.get('run_id', '?')}); wait for it, or stop it with Ctrl-C")
        dead = read_record(self.state_dir)
        if dead is not None:  # we hold the lock: the run that wrote it is gone
            os.close(fd)
            raise RunBusyError(
                f"an earlier run (run {dead.get('run_id', '?')}, pid {dead.get('pid', '?')}) "
                "ended without tearing down what it made: run 'python -m testbed clean' "
                "(it removes only that)")
        self._lock_fd = fd
        self.data["results_dir"] = results_dir
        # Sockets, policy and config files of the run: private to root, removed at teardown.
        self.data["private_dir"] = tempfile.mkdtemp(prefix=f"{self.run_id}-", dir=self.state_dir)
        self._write()

    @property
    def private_dir(self) -> str:
        return self.data["private_dir"]

    def close(self) -> None:
        """Forget the record (after teardown) and release the lock."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    # --- record -----------------------------------------------------------------------------
    def add(self, bridges=(), interfaces=()) -> None:
        for key, names in (("bridges", bridges), ("interfaces", interfaces)):
            for name in names:
                if name not in self.data[key]:
                    self.data[key].append(name)
        self._write()

    def add_sysctl(self, path: str, old: int, new: int) -> None:
        """A kernel setting the run changes temporarily (restored unless changed since)."""
        self.data["sysctls"][path] = [old, new]
        self._write()

    def restore_sysctl(self, path: str) -> None:
        """Put back a setting recorded by ``add_sysctl`` now, and forget it."""
        old, new = self.data["sysctls"].pop(path, (None, None))
        if old is not None:
            restore_sysctl(path, old, new)
            self._write()

    def add_undo(self, tag: str, command: str) -> None:
        """A shell command that undoes a change about to be made (recorded first, so a
        killed run is undone too); it must be harmless when the change never happened."""
        self.data["undo"].append([tag, command])
        self._write()

    def undo(self, tag: str) -> List[str]:
        """Undo now, newest first, the changes recorded under ``tag``; returns the failures."""
        mine = [c for t, c in self.data["undo"] if t == tag]
        self.data["undo"] = [e for e in self.data["undo"] if e[0] != tag]
        failed = [c for c in reversed(mine) if not _shell(c)]
        self._write()
        return failed

    def add_pid(self, pid: int) -> None:
        self.data["pids"][str(pid)] = identity(pid)
        self._write()

    def _write(self) -> None:
        with atomic_file(self.path, "w", sync=False, encoding="utf-8") as f:
            json.dump(self.data, f)

    # --- teardown ---------------------------------------------------------------------------
    def teardown(self) -> List[str]:
        """Remove everything recorded that still exists; returns what was removed."""
        return remove_resources(self.data)


def read_record(state_dir: str = STATE_DIR) -> Optional[dict]:
    try:
        with open(os.path.join(state_dir, "run.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def remove_resources(record: dict) -> List[str]:
    removed = _kill_recorded(record.get("pids", {}))  # first: they may hold what is undone
    for _tag, command in reversed(record.get("undo", [])):
        if _shell(command):
            removed.append(f"undone: {command}")
    removed += _delete_bridges(record.get("run_id"))
    removed += _delete_interfaces(record.get("interfaces", []) + record.get("bridges", []))
    for path, (old, new) in record.get("sysctls", {}).items():
        if restore_sysctl(path, old, new):
            removed.append(f"setting {path} = {new} (restored {old})")
    private = record.get("private_dir")
    if private and os.path.isdir(private) and os.path.basename(private).startswith(
            str(record.get("run_id"))):
        shutil.rmtree(private, ignore_errors=True)
    return removed


def _shell(command: str) -> bool:
    try:
        return subprocess.run(["sh", "-c", command], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _kill_recorded(pids: Dict[str, str]) -> List[str]:
    """SIGTERM, then SIGKILL, each recorded process that is still the same process (its
    start time; the command line may have changed by exec)."""
    alive = {int(p): rec for p, rec in pids.items() if same_process(int(p), rec)}
    for pid in alive:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and any(same_process(p, r) for p, r in alive.items()):
        time.sleep(0.05)
    for pid, rec in alive.items():
        if same_process(pid, rec):
            _signal(pid, signal.SIGKILL)
    return [f"process {pid} ({rec.split(' ', 1)[-1][:60]})" for pid, rec in alive.items()]


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def interface_tag(run_id: str) -> str:
    """The alias that marks an interface as made by run ``run_id``."""
    return f"{OVS_TAG}={run_id}"


def tag_command(names: List[str], run_id: str) -> str:
    """A shell command that tags those of ``names`` present in its network namespace as run
    ``run_id``'s (one ``ip`` process; absent names are skipped)."""
    lines = "".join(f"link set dev {n} alias {interface_tag(run_id)}\\n" for n in names)
    return f"printf '{lines}' | ip -force -batch - >/dev/null 2>&1; true"


def tagged_interfaces() -> Dict[str, str]:
    """Interfaces of this network namespace that a testbed run made: name -> its run id."""
    from pyroute2 import IPRoute

    prefix = interface_tag("")
    with IPRoute() as ipr:
        links = [(link.get_attr("IFLA_IFNAME"), link.get_attr("IFLA_IFALIAS") or "")
                 for link in ipr.get_links()]
    return {name: alias[len(prefix):] for name, alias in links if alias.startswith(prefix)}


def present(names: List[str]) -> Tuple[List[str], List[str]]:
    """Which of ``names`` exist in this network namespace, as (ours, foreign): ours were made
    by a testbed run (a tagged interface or bridge; ``clean`` removes them), foreign were not
    (``clean`` never touches them)."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        here = {link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
    found = [n for n in names if n in here]
    if not found:
        return [], []
    tagged = set(tagged_interfaces()) | set(tagged_bridges())
    return [n for n in found if n in tagged], [n for n in found if n not in tagged]


def tagged_bridges(run_id: Optional[str] = None) -> List[str]:
    """OVS bridges this project created (for ``run_id``, or for any run)."""
    cond = f"external_ids:{OVS_TAG}={run_id}" if run_id else f"external_ids:{OVS_TAG}!=_none_"
    try:
        out = subprocess.run(["ovs-vsctl", "--timeout=5", "--bare", "--columns=name", "find",
                              "bridge", cond], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    names = out.stdout.split()
    if run_id is None:
        # `!=` matches bridges without the key too on some OVS versions: check each one.
        names = [n for n in names if _bridge_tag(n)]
    return names


def _bridge_tag(name: str) -> Optional[str]:
    out = subprocess.run(["ovs-vsctl", "--timeout=5", "--if-exists", "get", "bridge", name,
                          f"external_ids:{OVS_TAG}"], capture_output=True, text=True)
    value = out.stdout.strip().strip('"')
    return value or None


def _delete_bridges(run_id: Optional[str]) -> List[str]:
    if not run_id:
        return []
    names = tagged_bridges(run_id)
    if names:
        cmd = ["ovs-vsctl", "--timeout=10"]
        for n in names:
            cmd += ["--", "--if-exists", "del-br", n]
        subprocess.run(cmd, capture_output=True, timeout=20)
    return [f"bridge {n}" for n in names]


def _delete_interfaces(names: List[str]) -> List[str]:
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    removed = []
    with IPRoute() as ipr:
        for name in names:
            idx = ipr.link_lookup(ifname=name)
            if not idx:
                continue
            try:
                ipr.link("del", index=idx[0])
                removed.append(f"interface {name}")
            except NetlinkError as e:
                if e.code != 19:  # ENODEV: gone with its peer meanwhile
                    LOG.warning("could not delete interface %s: %s", name, e)
    return removed


def clean(state_dir: str = STATE_DIR) -> List[str]:
    """Remove the leftovers of a run that did not tear down (e.g. the runner was killed)."""
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(state_dir, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = read_record(state_dir) or {}
            raise RunBusyError(f"a testbed run is active (pid {other.get('pid', '?')}); "
                               "clean only removes what a dead run left behind")
        removed = []
        record = read_record(state_dir)
        if record:
            removed += remove_resources(record)
            os.unlink(os.path.join(state_dir, "run.json"))
        # What any earlier run tagged, whether or not its record is left.
        for name in tagged_bridges():
            tag = _bridge_tag(name)
            removed += _delete_bridges(tag)
            removed += _delete_interfaces([name])
        removed += _delete_interfaces(sorted(tagged_interfaces()))
        return removed
    finally:
        os.close(fd)
