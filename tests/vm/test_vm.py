"""The VM test: a Debian 12 image with the full kernel, built from Debian's packages and
provisioned by scripts/install.sh, booted under qemu; inside it the testbed must use what
the kernel offers - the kernel datapath, netem, RED, rdma_rxe - and never fall back silently.
"""
import json
import os
import shutil
import subprocess

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.vm, pytest.mark.skipif(
    not (shutil.which("debootstrap") and shutil.which("qemu-system-x86_64")),
    reason="needs debootstrap and qemu-system-x86 (make test installs them: "
           "scripts/install.sh --test-tools)")]

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    """Build the image, boot it once; the files the guest wrote."""
    work = tmp_path_factory.mktemp("vm")
    build = subprocess.run(["bash", os.path.join(HERE, "build-image.sh"), str(work / "image")],
                           capture_output=True, text=True, timeout=1500)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    run = subprocess.run(["bash", os.path.join(HERE, "run-vm.sh"), str(work / "image"),
                          str(work / "out"), "1200"], capture_output=True, text=True,
                         timeout=1300)
    shutil.rmtree(work / "image", ignore_errors=True)  # 2.6 GB: only the results stay
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return work / "out" / "files"


def test_the_guest_uses_the_full_kernel(guest):
    log = (guest / "guest.log").read_text()
    for module in ("openvswitch", "sch_netem", "sch_red", "rdma_rxe"):
        assert f"module {module} loaded" in log, log[-2000:]
    check = json.loads((guest / "check.json").read_text())
    assert check["datapath"] == "kernel" and check["openvswitch_module"] is True
    assert check["qdiscs"]["netem"] is True and check["qdiscs"]["red"] is True


def test_a_run_in_the_guest_uses_the_kernel_datapath_and_delivers_everything(guest):
    run = json.loads((guest / "run.json").read_text())
    assert run["status"] == "complete"
    assert run["capabilities"]["datapath"] == "kernel"
    assert run["link_emulation"]["datapath"] == "kernel"
    for name, p in run["policies"].items():
        assert p["packets_received"] == p["packets_sent"] > 0, name
