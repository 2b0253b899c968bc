"""Ctrl-C, SIGTERM and kill -9 of a run in the middle of its traffic."""
import os
import signal
import subprocess
import sys
import time

import pytest

from .leftovers import leftovers, wait_clean
from .runs import results_of, wait_for_line

pytestmark = pytest.mark.integration
STOPPED_WITHIN_S = 10.0  # a signal in any phase ends the run within this


def start_run(run_process, out_dir, iterations=200):
    return run_process(out_dir, "--iterations", str(iterations))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_mid_traffic_stops_quickly_and_leaves_nothing(run_process, tmp_path, sig):
    proc = start_run(run_process, tmp_path)
    wait_for_line(proc, "iteration 2/")
    t0 = time.monotonic()
    proc.send_signal(sig)
    _out, err = proc.communicate(timeout=30)
    stopped_in = time.monotonic() - t0
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert stopped_in < STOPPED_WITHIN_S, f"took {stopped_in:.1f} s to stop"
    res = results_of(tmp_path)
    assert res["status"] == "incomplete" and res["finished"]
    assert leftovers() == []


def test_interrupting_two_jobs_mid_iteration_stops_both(run_process, tmp_path):
    proc = run_process(tmp_path, "--scenario", "two-jobs", "--policy", "lossless",
                       "--iterations", "20")
    wait_for_line(proc, "iteration 1/20")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    stopped_in = time.monotonic() - t0
    assert proc.returncode == 130 and "interrupted" in err, err
    assert stopped_in < STOPPED_WITHIN_S, f"took {stopped_in:.1f} s to stop"
    assert results_of(tmp_path)["status"] == "incomplete"
    assert leftovers() == []


def test_interrupt_while_the_fabric_is_being_built(run_process, tmp_path):
    proc = start_run(run_process, tmp_path)
    wait_for_line(proc, "building fabric")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert time.monotonic() - t0 < STOPPED_WITHIN_S
    assert results_of(tmp_path)["status"] == "incomplete"
    assert wait_clean() == []


def test_clean_after_kill_9_removes_the_run_and_only_the_run(run_process, tmp_path):
    # Things the testbed did not make, named like things it does.
    subprocess.run(["ovs-vsctl", "add-br", "lf9"], check=True)
    subprocess.run(["ip", "netns", "add", "tbforeign"], check=True)
    try:
        proc = start_run(run_process, tmp_path)
        wait_for_line(proc, "iteration 2/")
        proc.kill()
        proc.wait(timeout=10)
        time.sleep(0.5)
        assert leftovers() != []  # the killed runner could not tear down
        clean = subprocess.run([sys.executable, "-m", "testbed", "clean"], capture_output=True,
                               text=True, timeout=60)
        assert clean.returncode == 0, clean.stderr
        assert "removed bridge lf1" in clean.stdout
        assert wait_clean() == []
        bridges = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True,
                                 text=True).stdout.split()
        assert "lf9" in bridges
        assert "tbforeign" in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                             text=True).stdout
        again = subprocess.run([sys.executable, "-m", "testbed", "clean"], capture_output=True,
                               text=True, timeout=60)
        assert again.stdout.strip() == "nothing to clean"
    finally:
        subprocess.run(["ovs-vsctl", "--if-exists", "del-br", "lf9"])
        subprocess.run(["ip", "netns", "del", "tbforeign"])


# --- the default training job ---------------------------------------------------------------
POLICIES = ("enterprise", "hyperscale", "lossless")

# (the progress line after which the signal comes, how long after it (s), the signal, sent to
# the whole process group as a terminal's Ctrl-C is): inside the job's iterations of the
# first and third policy, the second's controller start and teardown (the build and the
# report of a run are interrupted above and in test_faults.py)
MOMENTS = [
    ("[enterprise 1/3] replaying", 1.0, signal.SIGINT, True),
    ("[hyperscale 2/3] starting the controller", 0.0, signal.SIGTERM, False),
    ("[hyperscale 2/3] tearing down the fabric", 0.0, signal.SIGINT, False),
    ("[lossless 3/3] replaying", 1.0, signal.SIGTERM, True),
]


def job_scenario(where):
    """The default job at byte scale 100, its one iteration replayed in a few seconds: what
    is interrupted here is the run, whatever the job's messages weigh."""
    import yaml

    from testbed.scenario.catalog import SCENARIO_DIR

    path = where / "default-job.yaml"
    if not path.exists():
        with open(os.path.join(SCENARIO_DIR, "default.yaml")) as f:
            data = yaml.safe_load(f)
        data["workload"]["job"]["byte_scale"] = 100
        path.write_text(yaml.safe_dump(data))
    return str(path)


def start_job(out_dir, *args):
    """The default job, one iteration (every phase in about 40 s), as its own process group,
    SIGINT ignored as a script's `&` leaves it: the run must stop on it all the same."""
    return subprocess.Popen([sys.executable, "-m", "testbed", "run", "--out", str(out_dir),
                             "--scenario", job_scenario(out_dir.parent), "--iterations", "1",
                             *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))


def measured_before(printed):
    """The policies whose traffic was replayed before the signal: a run says "tearing down
    the fabric" only once its replay ended, and from then on holds a signal until the
    policy's figures are kept."""
    return {p for i, p in enumerate(POLICIES, 1)
            if any(line.startswith(f"[{p} {i}/3] tearing down the fabric") for line in printed)}


@pytest.mark.parametrize("needle,after,sig,group", MOMENTS,
                         ids=[f"{m[0]} +{m[1]:g}s" for m in MOMENTS])
def test_the_default_job_stops_at_any_moment_and_keeps_what_it_measured(tmp_path, needle, after,
                                                                        sig, group):
    from testbed.api import load_result

    proc = start_job(tmp_path)
    try:
        seen = wait_for_line(proc, needle, timeout=180)
        time.sleep(after)
        t0 = time.monotonic()
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
        stopped_in = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err, err[-2000:]
    print(f"stopped {stopped_in:.1f} s after {sig.name} at {needle!r} +{after:g} s")
    assert stopped_in < STOPPED_WITHIN_S, f"took {stopped_in:.1f} s to stop after {needle!r}"
    assert wait_clean() == []
    (run_id,) = os.listdir(tmp_path)
    result = load_result(os.path.join(tmp_path, run_id))
    assert result.status == "incomplete" and result.finished, result.error
    assert set(result.policies) == measured_before(seen + err.splitlines()), result.error
    for name, p in result.policies.items():
        assert p.iteration_us.p50 > 0 and p.packets_received > 0, name


def refused(out_dir):
    """A run started over a dead run's leftovers: (exit code, stderr)."""
    r = subprocess.run([sys.executable, "-m", "testbed", "run", "--out", str(out_dir),
                        "--scenario", job_scenario(out_dir.parent), "--iterations", "1"],
                       capture_output=True,
                       text=True, timeout=120)
    return r.returncode, r.stderr


def test_kill_9_at_random_moments_then_clean_leaves_the_machine_as_it_was(tmp_path):
    """Three kills at random moments of a whole default run (one iteration); after
    each a next run and a test fixture are refused without losing the dead run's record,
    `clean` removes everything the testbed made and nothing else, and a run after all that
    completes."""
    import random

    from testbed.base.errors import RunBusyError
    from testbed.base.ledger import read_record

    from .live import held_ledger

    seed = int(os.environ.get("KILL_SEED", time.time()))
    moments = sorted(random.Random(seed).uniform(0.5, 40.0) for _ in range(3))
    foreign = ("lf7-eth9", "sp7-eth9")  # named like fabric ports, made by someone else
    subprocess.run(["ip", "link", "add", foreign[0], "type", "veth", "peer", "name",
                    foreign[1]], check=True)
    try:
        for k, at in enumerate(moments):
            why = f"seed {seed}, kill {k + 1} at {at:.1f} s"
            proc = start_job(tmp_path / f"killed-{k}")
            time.sleep(at)
            proc.kill()
            proc.communicate(timeout=10)
            record = read_record()
            if record is not None:  # what the cluster tests met: both refused, record kept
                code, err = refused(tmp_path / f"refused-{k}")
                assert code == 1 and "testbed clean" in err, f"{why}: {err}"
                with pytest.raises(RunBusyError, match="testbed clean"):
                    with held_ledger(tmp_path):
                        pass
                assert read_record() == record, why
            clean = subprocess.run([sys.executable, "-m", "testbed", "clean"],
                                   capture_output=True, text=True, timeout=60)
            assert clean.returncode == 0, f"{why}: {clean.stderr}"
            assert wait_clean() == [], f"{why}: {clean.stdout}"
            assert os.path.exists(f"/sys/class/net/{foreign[0]}"), why
        proc = start_job(tmp_path / "next", "--policy", "hyperscale")
        _out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"seed {seed}: {err[-2000:]}"
    finally:
        subprocess.run(["ip", "link", "del", foreign[0]], capture_output=True)


def test_a_run_refuses_interfaces_it_did_not_make_and_clean_leaves_them(tmp_path):
    subprocess.run(["ip", "link", "add", "lf1-eth3", "type", "veth", "peer", "name",
                    "sp1-eth1"], check=True)
    try:
        code, err = refused(tmp_path)
        assert code == 1 and "the testbed did not make (lf1-eth3, sp1-eth1)" in err, err
        clean = subprocess.run([sys.executable, "-m", "testbed", "clean"],
                               capture_output=True, text=True, timeout=60)
        assert clean.stdout.strip() == "nothing to clean"
        assert os.path.exists("/sys/class/net/lf1-eth3")
    finally:
        subprocess.run(["ip", "link", "del", "lf1-eth3"], capture_output=True)
