"""The time scale chosen from the machine: calibrate, then a run at ``auto`` uses the rate the
calibration fits, and a run far above it is warned before it starts."""
import json
import os
import re
import subprocess
import sys

import pytest

from testbed.scenario.timescale import (AUTO, CALIBRATION_VERSION, RATE_STEPS, TARGET_BUSY,
                                        Calibration, choose)

from .runs import results_of

pytestmark = pytest.mark.integration


def cli(cache, *args, timeout=600):
    env = dict(os.environ, TESTBED_CACHE_DIR=str(cache))
    return subprocess.run([sys.executable, "-m", "testbed", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_calibrate_then_auto_runs_at_the_rate_that_fits(tmp_path):
    cache = tmp_path / "cache"
    cal = cli(cache, "calibrate", "--quiet")
    assert cal.returncode == 0, cal.stderr
    with open(cache / "calibration.json") as f:
        kept = json.load(f)
    assert set(kept["busy"]) == {"enterprise", "hyperscale", "lossless"}
    assert all(0 < v <= 1 for v in kept["busy"].values()) and kept["allowed_us"] > 0
    chosen = re.search(r"ring: 8 GPUs at auto run at ([\d.]+) Mbit/s", cal.stdout)
    assert chosen and float(chosen.group(1)) in RATE_STEPS, cal.stdout
    # the ring's three policies fit that rate; hyperscale alone, the rate the same
    # calibration gives that policy (as fast or faster)
    alone = choose(AUTO, ("hyperscale",), 8, Calibration.from_dict(kept)).host_rate_mbit
    assert alone >= float(chosen.group(1))

    run = cli(cache, "run", "--scenario", "ring", "--policy", "hyperscale", "--iterations", "2",
              "--out", str(tmp_path / "auto"))
    assert run.returncode == 0, run.stderr
    assert f"time scale: GPU NICs at {alone:g} Mbit/s" in run.stderr
    assert "calibrating" not in run.stderr  # the kept calibration, not a new one
    results = results_of(tmp_path / "auto")
    choice = results["time_scale_choice"]
    # a run the monitor rejected went again slower (test below); it started at that rate
    started = (choice.get("attempts") or [choice])[0]["host_rate_mbit"]
    assert choice["chosen_by"] == "auto" and started == alone
    assert choice["predicted_busy"] <= TARGET_BUSY
    topo = results["scenario"]["topology"]
    assert topo["host_rate_mbit"] == topo["fabric_rate_mbit"] == choice["host_rate_mbit"]
    assert results["time_scale"] == pytest.approx(100_000 / choice["host_rate_mbit"], rel=1e-3)

    fast = tmp_path / "fast.yaml"
    fast.write_text("policies: [hyperscale]\ntopology: {leaves: 2, host_rate_mbit: 1000}\n"
                    "workload: {iterations: 1, size_bytes: 65536}\n")
    run = cli(cache, "run", "--scenario", str(fast), "--out", str(tmp_path / "fast"))
    assert run.returncode == 0, run.stderr
    warned = re.search(r"warning: topology.host_rate_mbit 1000 .* ([\d.]+) Mbit/s would fit",
                       run.stderr)
    assert warned and float(warned.group(1)) < 1000, run.stderr
    assert run.stderr.index("warning: topology.host_rate_mbit") < run.stderr.index("[hyperscale")
    assert results_of(tmp_path / "fast")["time_scale_choice"]["warning"].startswith(
        "topology.host_rate_mbit 1000")


def test_a_run_at_auto_that_the_monitor_rejects_goes_again_slower_and_is_remembered(tmp_path):
    """A calibration that overrates this machine (as if its delays were a fifth of what they
    are) makes auto choose a rate the fidelity monitor rejects: the run goes again slower and
    keeps the rejected attempt; once rejected in two runs, the scenario starts slower."""
    from testbed.run import calibrate

    cache = tmp_path / "cache"
    cache.mkdir()
    optimistic = {"machine": calibrate.machine_key(), "cpus": os.cpu_count(),
                  "measured": "2026-12-03 09:00", "gpus": 8, "host_rate_mbit": 40.0,
                  "busy": {"hyperscale": 0.1}, "noise_us": {"hyperscale": 21.0},
                  "allowed_us": 208.6, "version": CALIBRATION_VERSION}
    (cache / "calibration.json").write_text(json.dumps(optimistic))
    small = tmp_path / "small.yaml"
    small.write_text("policies: [hyperscale]\ntopology: {leaves: 2, gpus_per_leaf: 2}\n"
                     "workload: {iterations: 2, size_bytes: 262144}\n")
    run = cli(cache, "run", "--scenario", str(small), "--out", str(tmp_path / "first"))
    assert run.returncode == 0, run.stderr
    first = re.search(r"time scale: GPU NICs at ([\d.]+) Mbit/s", run.stderr)
    assert first and float(first.group(1)) >= 160, run.stderr  # 40 x 208.6 / (21 x 1.5)
    assert f"rejected the run at {first.group(1)} Mbit/s" in run.stderr, run.stderr
    [run_dir] = (tmp_path / "first").iterdir()
    results = results_of_dir(run_dir)
    choice = results["time_scale_choice"]
    final = choice["host_rate_mbit"]
    assert final < float(first.group(1)) and results["scenario"]["topology"][
        "host_rate_mbit"] == final
    attempts = choice["attempts"]
    assert attempts[0]["host_rate_mbit"] == float(first.group(1))
    assert attempts[0]["problems"]["hyperscale"]  # what the monitor said, kept
    for a in attempts:
        rejected = results_of_dir(run_dir / a["kept_in"])
        assert rejected["policies"]["hyperscale"]["fidelity"]["verdict"] == "outside tolerance"
        assert "ran again at" in rejected["superseded"]
        assert (run_dir / a["kept_in"] / "records" / "hyperscale").is_dir()
    assert (run_dir / "records" / "hyperscale").is_dir() and (run_dir / "report.html").exists()

    def kept():
        with open(cache / "scenarios.json") as f:
            [entry] = json.load(f)["caps"].values()
        return entry

    once = kept()
    assert once["policy"] == "hyperscale" and once["rejected_runs"] == 1
    assert once["cap_mbit"] <= final

    # rejected once may be a passing load: the next run starts at the calibration's rate again
    second = cli(cache, "run", "--scenario", str(small), "--out", str(tmp_path / "second"))
    assert second.returncode == 0, second.stderr
    assert f"time scale: GPU NICs at {first.group(1)} Mbit/s" in second.stderr
    assert kept()["rejected_runs"] == 2
    # rejected in two runs: the next one starts at the rate the rejections asked for (read
    # before it runs: if the monitor rejects it too, it lowers the cap again)
    cap = kept()["cap_mbit"]
    third = cli(cache, "run", "--scenario", str(small), "--iterations", "1", "--out",
                str(tmp_path / "third"))
    assert third.returncode == 0, third.stderr
    assert (f"time scale: GPU NICs at {cap:g} Mbit/s" in third.stderr
            and "as earlier runs of this scenario here asked for" in third.stderr), third.stderr


def results_of_dir(run_dir):
    with open(os.path.join(run_dir, "results.json")) as f:
        return json.load(f)
