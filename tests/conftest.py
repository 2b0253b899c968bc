"""Shared test set-up.

Unit tests need neither root nor Open vSwitch. Tests marked ``integration`` build real fabrics:
they need root, a running Open vSwitch and Mininet, and skip with the reason otherwise.
"""
import os
import shutil
import subprocess
import tempfile

import pytest

from testbed.run.calibrate import cache_path

# Runs at ``auto`` keep per scenario the rate their rejections asked for (calibrate.learned).
# A test session must neither start from what earlier sessions taught nor teach the user's
# machine: it runs on a copy of the machine's calibration in a directory of its own, for its
# processes and the runs they start alike.
SESSION_CACHE = tempfile.mkdtemp(prefix="testbed-tests-cache-")
if os.path.exists(cache_path()):
    shutil.copy(cache_path(), SESSION_CACHE)
os.environ["TESTBED_CACHE_DIR"] = SESSION_CACHE


def pytest_unconfigure(config):
    shutil.rmtree(SESSION_CACHE, ignore_errors=True)


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
