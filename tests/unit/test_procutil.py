import pytest

from testbed.base.procutil import takes_custom_slice


def test_only_kernels_that_honour_a_custom_slice_are_said_to_have_one():
    """Before 6.12 sched_setattr accepts a fair-class slice and ignores it: the results must
    not claim one (the Vagrant/VM-test guest runs 6.1)."""
    assert takes_custom_slice("6.18.44-fc-v1098") and takes_custom_slice("6.12.0")
    assert takes_custom_slice("7.0.1-arch1")
    assert not takes_custom_slice("6.1.0-50-amd64") and not takes_custom_slice("5.15.0-91")
    assert not takes_custom_slice("weird")


def test_a_process_is_reaped_even_when_an_interrupt_left_popens_lock_held():
    """An interrupt inside Popen.poll or wait can leave its internal lock held, after which
    Popen.wait never sees the process end; stop_process reaps it all the same."""
    import subprocess
    import time

    from testbed.base.procutil import stop_process

    proc = subprocess.Popen(["sleep", "60"])
    proc._waitpid_lock.acquire()  # what the interrupt left behind
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
        t0 = time.monotonic()
        stop_process(proc, timeout=2)
        assert proc.returncode == -15 and time.monotonic() - t0 < 2
    finally:
        proc._waitpid_lock.release()
        if proc.returncode is None:
            proc.kill()
            proc.wait()


def test_a_process_that_ignores_sigterm_is_killed_after_the_timeout():
    import subprocess

    from testbed.base.procutil import stop_processes

    stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; echo ready; exec sleep 60"],
                                stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout.readline() == "ready\n"
    quick = subprocess.Popen(["sleep", "60"], stdout=subprocess.PIPE)
    stop_processes([stubborn, quick], timeout=0.5)
    assert stubborn.returncode == -9 and quick.returncode == -15 and quick.stdout.closed
