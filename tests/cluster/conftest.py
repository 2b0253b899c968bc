"""The cluster tests' second server, emulated on this machine (tests/cluster/server.py)."""
import os
import shutil

import pytest

from .server import EmulatedServer

NEEDS_SSHD = pytest.mark.skipif(
    not shutil.which("sshd") and not os.path.exists("/usr/sbin/sshd"),
    reason="needs openssh-server (make test installs it: scripts/install.sh --test-tools)")


@pytest.fixture
def server():
    """A started emulated server; afterwards its veth must be gone."""
    with EmulatedServer() as s:
        yield s
    assert not os.path.exists(f"/sys/class/net/{s.local_intf}")
