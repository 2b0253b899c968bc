"""The Vagrantfile: what it declares, and `vagrant validate` where vagrant is installed."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VAGRANTFILE = os.path.join(ROOT, "Vagrantfile")


def test_vagrantfile_declares_the_documented_vm():
    text = open(VAGRANTFILE).read()
    assert 'node.vm.box = "debian/bookworm64"' in text
    assert 'node.vm.synced_folder ".", "/vagrant"' in text
    for provider in ("virtualbox", "libvirt"):
        assert f'node.vm.provider "{provider}"' in text
    assert text.count("cpus = 2") == 2 and text.count("memory = 4096") == 2
    assert "scripts/install.sh --vm" in text
    # the two-VM option for split fabrics
    assert 'ENV["TESTBED_VMS"]' in text and '"192.168.56.12"' in text
    assert 'private_network", ip: address' in text


@pytest.mark.skipif(not shutil.which("vagrant"), reason="vagrant is not installed "
                    "(Debian package vagrant; .ci/run installs it)")
def test_vagrant_validate(tmp_path):
    shutil.copy(VAGRANTFILE, tmp_path / "Vagrantfile")
    env = dict(os.environ, VAGRANT_HOME=str(tmp_path / "home"), VAGRANT_CHECKPOINT_DISABLE="1")
    run = subprocess.run(["vagrant", "validate"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    if "No usable default provider" in run.stdout + run.stderr:
        # No provider plugin here: validate everything but the provider blocks.
        run = subprocess.run(["vagrant", "validate", "--ignore-provider"], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "validated successfully" in run.stdout


@pytest.mark.skipif(not shutil.which("vagrant"), reason="vagrant is not installed "
                    "(Debian package vagrant; .ci/run installs it)")
def test_vagrant_validate_two_vms(tmp_path):
    """TESTBED_VMS=2: two machines on a private network, a key pair made for them."""
    shutil.copy(VAGRANTFILE, tmp_path / "Vagrantfile")
    env = dict(os.environ, VAGRANT_HOME=str(tmp_path / "home"), VAGRANT_CHECKPOINT_DISABLE="1",
               TESTBED_VMS="2")
    run = subprocess.run(["vagrant", "validate", "--ignore-provider"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / ".cluster" / "id_ed25519.pub").exists()
    status = subprocess.run(["vagrant", "status"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert "testbed " in status.stdout and "testbed2" in status.stdout, status.stdout
