"""The Vagrantfile: what it declares, and `vagrant validate` where vagrant is installed."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VAGRANTFILE = os.path.join(ROOT, "Vagrantfile")


def test_vagrantfile_declares_the_documented_vm():
    text = open(VAGRANTFILE).read()
    assert 'config.vm.box = "debian/bookworm64"' in text
    assert 'config.vm.synced_folder ".", "/vagrant"' in text
    for provider in ("virtualbox", "libvirt"):
        assert f'config.vm.provider "{provider}"' in text
    assert text.count("cpus = 2") == 2 and text.count("memory = 4096") == 2
    assert "scripts/install.sh --vm" in text


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
