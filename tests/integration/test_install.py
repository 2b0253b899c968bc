"""scripts/install.sh: idempotent, quick the second time, and its VM mode's `python` wrapper."""
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTALL = os.path.join(ROOT, "scripts", "install.sh")
VENV = os.path.dirname(os.path.dirname(sys.executable))


def test_second_install_is_quick_and_changes_nothing():
    t0 = time.monotonic()
    run = subprocess.run(["bash", INSTALL], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, TESTBED_VENV=VENV))
    assert run.returncode == 0, run.stderr
    assert "distribution packages present" in run.stdout
    assert "venv up to date" in run.stdout and "Open vSwitch running" in run.stdout
    assert time.monotonic() - t0 < 60


def test_vm_mode_makes_python_run_the_testbed_from_any_directory(tmp_path):
    bindir = tmp_path / "bin"
    run = subprocess.run(["bash", INSTALL, "--vm", "--no-start"], capture_output=True,
                         text=True, timeout=600,
                         env=dict(os.environ, TESTBED_VENV=VENV, TESTBED_BIN_DIR=str(bindir)))
    assert run.returncode == 0, run.stderr
    wrapper = bindir / "python"
    assert os.access(wrapper, os.X_OK)
    check = subprocess.run([str(wrapper), "-m", "testbed", "check", "--json"], cwd="/",
                           capture_output=True, text=True, timeout=120)
    assert '"os_ken": true' in check.stdout, check.stderr


def test_unknown_option_is_refused():
    run = subprocess.run(["bash", INSTALL, "--frobnicate"], capture_output=True, text=True)
    assert run.returncode == 2 and "unknown option" in run.stderr


def test_check_reports_what_a_run_needs():
    run = subprocess.run([sys.executable, "-m", "testbed", "check"], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stdout
    assert "Open vSwitch running         yes" in run.stdout
    assert "qdisc htb                    yes" in run.stdout
    assert "ready to run" in run.stdout
