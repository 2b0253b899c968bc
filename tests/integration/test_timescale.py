"""The time scale chosen from the machine: calibrate, then a run at ``auto`` uses the rate the
calibration fits, and a run far above it is warned before it starts."""
import json
import os
import re
import subprocess
import sys

import pytest

from testbed.timescale import RATE_STEPS, TARGET_BUSY

pytestmark = pytest.mark.integration


def cli(cache, *args, timeout=600):
    env = dict(os.environ, TESTBED_CACHE_DIR=str(cache))
    return subprocess.run([sys.executable, "-m", "testbed", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def results_of(out):
    [path] = [os.path.join(d, "results.json") for d, _, files in os.walk(out)
              if "results.json" in files]
    with open(path) as f:
        return json.load(f)


def test_calibrate_then_auto_runs_at_the_rate_that_fits(tmp_path):
    cache = tmp_path / "cache"
    cal = cli(cache, "calibrate", "--quiet")
    assert cal.returncode == 0, cal.stderr
    with open(cache / "calibration.json") as f:
        kept = json.load(f)
    assert set(kept["busy"]) == {"enterprise", "hyperscale", "lossless"}
    assert all(0 < v <= 1 for v in kept["busy"].values()) and kept["allowed_us"] > 0
    chosen = re.search(r"default: 8 GPUs at auto run at ([\d.]+) Mbit/s", cal.stdout)
    assert chosen and float(chosen.group(1)) in RATE_STEPS, cal.stdout

    run = cli(cache, "run", "--policy", "hyperscale", "--iterations", "2", "--out",
                  str(tmp_path / "auto"))
    assert run.returncode == 0, run.stderr
    assert f"time scale: GPU NICs at {chosen.group(1)} Mbit/s" in run.stderr
    assert "calibrating" not in run.stderr  # the kept calibration, not a new one
    results = results_of(tmp_path / "auto")
    choice = results["time_scale_choice"]
    assert choice["chosen_by"] == "auto" and choice["host_rate_mbit"] == float(chosen.group(1))
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
