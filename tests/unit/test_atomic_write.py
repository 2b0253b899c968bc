"""results.json is written atomically: a writer killed (SIGKILL) in the middle of a write
leaves the previous complete file, or none - never a truncated JSON."""
import glob
import json
import os
import random
import signal
import subprocess
import sys
import time

# The writer says when a write's data is in its temporary file and holds there a moment
# (before the fsync), so that a kill can be aimed inside a write instead of hoping for one.
WRITER = r"""
import os, sys, time
from testbed.results import write_json_atomic
fsync = os.fsync
def announced_fsync(fd):
    print("in-write", flush=True)
    time.sleep(0.05)
    fsync(fd)
os.fsync = announced_fsync
path = sys.argv[1]
print("ready", flush=True)
i = 0
while True:
    write_json_atomic(path, {"version": i, "records": "x" * 8_000_000, "complete": True})
    i += 1
"""
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _kill_and_check(proc, path, versions) -> bool:
    """SIGKILL the writer; True if it left a temporary file (it died inside a write)."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    proc.stdout.close()
    temps = glob.glob(path + ".tmp.*")
    for t in temps:
        os.unlink(t)
    if os.path.exists(path):
        with open(path) as f:
            data = json.load(f)  # never truncated
        assert data["complete"] is True and len(data["records"]) == 8_000_000
        versions.append(data["version"])
    return bool(temps)


def _writer(path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, path], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_writer_killed_inside_a_write_leaves_the_previous_complete_file(tmp_path):
    for trial in range(6):
        path = str(tmp_path / f"results-{trial}.json")
        proc = _writer(path)
        inside = trial % 3 + 1  # killed inside its first, second or third write
        for _ in range(inside):
            assert proc.stdout.readline().strip() == "in-write"
        versions = []
        assert _kill_and_check(proc, path, versions), "killed inside a write: a temporary file"
        # the writes before it completed: the last of them is there, whole (none after 1)
        assert versions == ([] if inside == 1 else [inside - 2])


def test_a_writer_killed_at_random_times_leaves_a_complete_file(tmp_path):
    path = str(tmp_path / "results.json")
    rng = random.Random(7)
    versions = []
    for _trial in range(20):
        proc = _writer(path)
        time.sleep(rng.uniform(0.01, 0.15))
        _kill_and_check(proc, path, versions)
    assert versions, "no write ever completed"
