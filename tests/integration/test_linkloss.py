"""The link-loss program on a real veth, inside a throw-away network namespace: about half
the frames lost at a drop rate of 0.5, the sender never told, each kind counted apart."""
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_the_loss_program_loses_its_share_silently_and_counts_each_kind():
    done = subprocess.run(["unshare", "--net", sys.executable, "-m", "testbed.fabric.linkloss"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok: passed")
