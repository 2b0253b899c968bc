"""Nothing of the testbed is exposed: the controller listens on 127.0.0.1 only, no service is
reachable from an emulated host, and a run's files live in a private directory; nothing stays
open after a run."""
import json
import os
import stat
import subprocess
import sys

import pytest


from .live import DEFAULT, fabric_session

pytestmark = pytest.mark.integration

SCENARIO = DEFAULT.override({"policies": ["hyperscale"],
                             "topology": {"leaves": 2, "gpus_per_leaf": 1}})

PROBE = r"""
import json, socket, sys
targets = json.loads(sys.argv[1])
reached = []
for host, port in targets:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect((host, port))
        reached.append([host, port])
    except OSError:
        pass
    finally:
        s.close()
print(json.dumps(reached))
"""


def open_fds():
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the directory's own fd, closed by now
            pass
    return out


def listeners(port):
    """Local addresses of TCP sockets listening on ``port`` (root namespace, IPv4 and IPv6)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, p = local.split(":")
                if state == "0A" and int(p, 16) == port:
                    found.append(addr)
    return found


def root_addresses():
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True,
                         text=True).stdout
    return sorted({line.split()[3].split("/")[0] for line in out.splitlines()})


def test_nothing_is_reachable_from_a_host_and_the_run_is_private(tmp_path):
    tmp_before = set(os.listdir("/tmp"))
    fds_before = open_fds()
    with fabric_session(SCENARIO, "hyperscale", tmp_path) as (_run, s, ledger):
        port = s.controller.port
        # the controller: loopback only
        assert listeners(port) == ["0100007F"], listeners(port)
        # from a host: the controller's port and OVS's usual ports on every address of
        # the machine, and on the host's own loopback
        targets = [[a, p] for a in root_addresses() + ["127.0.0.1"]
                   for p in (port, 6633, 6653, 6640)]
        probe = s.fabric.host("gpu1").popen([sys.executable, "-c", PROBE,
                                             json.dumps(targets)],
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = probe.communicate(timeout=120)
        assert probe.returncode == 0, err
        assert out.decode().strip() == "[]", f"reachable from gpu1: {out.decode()}"
        # the host itself offers nothing either
        ss = s.fabric.host("gpu1").popen(["ss", "-Htuln"], stdout=subprocess.PIPE)
        assert ss.communicate(timeout=10)[0].decode().strip() == ""
        # the run's files: a private, unpredictable directory; nothing new in /tmp
        private = ledger.private_dir
        mode = os.stat(private).st_mode
        assert stat.S_IMODE(mode) == 0o700 and os.stat(private).st_uid == 0
        assert stat.S_IMODE(os.stat(os.path.dirname(private)).st_mode) == 0o700
        assert not private.startswith("/tmp/")
        assert os.path.basename(private) != ledger.run_id  # a random suffix
        assert set(os.listdir("/tmp")) - tmp_before == set()
    # and a torn-down run keeps nothing open in the runner (the soak found Mininet's
    # controller shell and its pty left open: 2 fds per fabric)
    assert open_fds() == fds_before
