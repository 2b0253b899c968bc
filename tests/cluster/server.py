"""A second server emulated on this machine, for Mininet Cluster tests.

A process holding its own network and mount namespaces (``unshare --net --mount
--propagation private``) with a private tmpfs on /run, its own ovsdb-server and ovs-vswitchd
(userspace datapath) and its own sshd listening on its end of a veth pair. Root logs in with a
key made for this server only. Where the machine has no ``sudo`` (Mininet Cluster calls it on
both ends), a shim that runs the command as is (we are root) stands in: on this side through
``PATH``, on the server bind-mounted over /usr/local/bin inside its mount namespace only.

Every packet stays on the veth pair; the address range is one no interface or route of the
machine uses. ``stop()`` removes exactly what ``start()`` made.
"""
from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import List, Optional

CANDIDATES = ("10.213.77.0/30", "172.30.213.0/30", "192.168.213.0/30", "10.254.213.0/30")

SUDO_SHIM = """#!/bin/sh
# sudo shim for Mininet Cluster tests on machines without sudo: we already are root.
while [ $# -gt 0 ]; do
  case "$1" in
    -E|-n|-H|-S) shift ;;
    -u) shift 2 ;;
    --) shift; break ;;
    -*) shift ;;
    *) break ;;
  esac
done
exec "$@"
"""

SSH_WRAPPER = """#!/bin/sh
exec /usr/bin/ssh -F {config} "$@"
"""

SSH_CONFIG = """Host *
  User root
  IdentityFile {key}
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  ConnectTimeout 5
"""

SSHD_CONFIG = """ListenAddress {address}
Port 22
HostKey {dir}/host_key
PidFile /run/tb-sshd.pid
PermitRootLogin prohibit-password
AuthorizedKeysFile {dir}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
StrictModes no
PermitTunnel yes
AllowTcpForwarding yes
MaxSessions 100
MaxStartups 100
Subsystem sftp internal-sftp
"""


def used_networks() -> List[ipaddress.IPv4Network]:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True,
                         text=True).stdout.split()
    nets = [ipaddress.ip_interface(w).network for w in out if "/" in w and w[0].isdigit()]
    routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True,
                            text=True).stdout.splitlines()
    for line in routes:
        first = line.split()[0] if line.split() else ""
        try:
            nets.append(ipaddress.ip_network(first, strict=False))
        except ValueError:
            pass
    return nets


def free_subnet() -> ipaddress.IPv4Network:
    used = used_networks()
    for cand in CANDIDATES:
        net = ipaddress.ip_network(cand)
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise RuntimeError(f"no free address range among {CANDIDATES}")


def _run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


class EmulatedServer:
    def __init__(self, name: str = "tbsrv2"):
        self.name = name
        self.holder: Optional[subprocess.Popen] = None
        self.dir = ""
        self.local_intf, self.remote_intf = f"{name}a", f"{name}b"
        self.address = self.local_address = ""
        self.old_path = os.environ.get("PATH", "")

    # --- life cycle ---------------------------------------------------------------------------
    def start(self) -> "EmulatedServer":
        net = free_subnet()
        a, b = list(net.hosts())[:2]
        self.local_address, self.address = str(a), str(b)
        # not under /run: the server mounts its own tmpfs there
        self.dir = tempfile.mkdtemp(prefix=f"{self.name}-", dir="/var/tmp")
        os.chmod(self.dir, 0o700)
        try:
            self._keys()
            self.holder = subprocess.Popen(
                ["unshare", "--net", "--mount", "--propagation", "private", "--",
                 "sleep", "infinity"], start_new_session=True)
            time.sleep(0.2)
            _run(["ip", "link", "add", self.local_intf, "type", "veth", "peer", "name",
                  self.remote_intf])
            _run(["ip", "link", "set", self.remote_intf, "netns", str(self.holder.pid)])
            _run(["ip", "addr", "add", f"{a}/{net.prefixlen}", "dev", self.local_intf])
            _run(["ip", "link", "set", self.local_intf, "mtu", "9000", "up"])
            self.sh(f"""
                set -e
                ip link set lo up
                ip addr add {b}/{net.prefixlen} dev {self.remote_intf}
                ip link set {self.remote_intf} mtu 9000 up
                mount -t tmpfs -o mode=755 tmpfs /run
                mkdir -p /run/openvswitch /run/sshd /run/lock
                mount --bind {self.dir}/bin-remote /usr/local/bin
                ovsdb-tool create /run/openvswitch/conf.db \\
                    /usr/share/openvswitch/vswitch.ovsschema
                ovsdb-server /run/openvswitch/conf.db \\
                    --remote=punix:/run/openvswitch/db.sock --pidfile --detach \\
                    --log-file=/run/openvswitch/ovsdb-server.log
                ovs-vsctl --no-wait init
                ovs-vswitchd --pidfile --detach --log-file=/run/openvswitch/ovs-vswitchd.log
                /usr/sbin/sshd -f {self.dir}/sshd_config
            """)
            os.environ["PATH"] = f"{self.dir}/bin-local:{self.old_path}"
            self._wait_ssh()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        os.environ["PATH"] = self.old_path
        if self.holder is not None and self.holder.poll() is None:
            for pid in self._daemon_pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            os.killpg(self.holder.pid, signal.SIGKILL)
            self.holder.wait(timeout=10)
        self.holder = None
        subprocess.run(["ip", "link", "del", self.local_intf], capture_output=True)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = ""

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # --- helpers ------------------------------------------------------------------------------
    def sh(self, script: str) -> str:
        """Run a shell script inside the server's namespaces."""
        return _run(["nsenter", "-t", str(self.holder.pid), "-n", "-m", "sh", "-c",
                     script]).stdout

    def ssh(self, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", "-o", "BatchMode=yes", self.address, command],
                              capture_output=True, text=True, timeout=timeout)

    def _daemon_pids(self) -> List[int]:
        """Every process in the server's network namespace (its daemons and sessions)."""
        mine = os.readlink(f"/proc/{self.holder.pid}/ns/net")
        pids = []
        for pid in os.listdir("/proc"):
            if pid.isdigit() and int(pid) != self.holder.pid:
                try:
                    if os.readlink(f"/proc/{pid}/ns/net") == mine:
                        pids.append(int(pid))
                except OSError:
                    pass
        return pids

    def _keys(self) -> None:
        d = self.dir
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{d}/id"])
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{d}/host_key"])
        shutil.copy(f"{d}/id.pub", f"{d}/authorized_keys")
        with open(f"{d}/ssh_config", "w") as f:
            f.write(SSH_CONFIG.format(key=f"{d}/id"))
        with open(f"{d}/sshd_config", "w") as f:
            f.write(SSHD_CONFIG.format(address=self.address or "0.0.0.0", dir=d))
        for side in ("bin-local", "bin-remote"):
            os.makedirs(f"{d}/{side}")
            if not shutil.which("sudo"):
                _write_exec(f"{d}/{side}/sudo", SUDO_SHIM)
        _write_exec(f"{d}/bin-local/ssh", SSH_WRAPPER.format(config=f"{d}/ssh_config"))
        # the server's own tools stay reachable under /usr/local/bin's replacement
        for tool in ("mn",):
            path = shutil.which(tool)
            if path and path.startswith("/usr/local/bin/"):
                shutil.copy(path, f"{d}/bin-remote/{tool}")

    def _wait_ssh(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            r = self.ssh("true", timeout=10)
            if r.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"ssh to {self.address} failed: {r.stderr.strip()}")
            time.sleep(0.2)


def _write_exec(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
