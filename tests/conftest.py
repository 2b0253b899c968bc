"""Shared test set-up.

Unit tests need neither root nor Open vSwitch. Tests marked ``integration`` build real fabrics:
they need root, a running Open vSwitch and Mininet, and skip with the reason otherwise.
"""
import os
import shutil
import subprocess

import pytest


def _integration_blocker():
    if os.geteuid() != 0:
        return "needs root (run: sudo make test)"
    if not shutil.which("mnexec"):
        return "needs Mininet (run scripts/install.sh)"
    if not shutil.which("ovs-vsctl"):
        return "needs Open vSwitch (run scripts/install.sh)"
    if subprocess.run(["ovs-vsctl", "--timeout=3", "show"], capture_output=True).returncode:
        return "needs a running Open vSwitch (run scripts/install.sh)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _integration_blocker()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "integration" in item.keywords:
            item.add_marker(skip)
