"""Helpers for tests that drive `python -m testbed run` as a process."""
import json
import os
import select
import time


def wait_for_line(proc, needle, timeout=60.0):
    """Read stderr until a line contains ``needle``; returns everything read."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready:
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            if needle in line:
                return seen
    proc.kill()
    raise AssertionError(f"never saw {needle!r}; got: {''.join(seen)[-2000:]}")


def results_of(out_dir):
    (run_id,) = os.listdir(out_dir)
    with open(os.path.join(out_dir, run_id, "results.json")) as f:
        return json.load(f)
