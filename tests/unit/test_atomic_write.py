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

# The writer says when a write's data is in its temporary file (before the fsync) and, in the
# write given as its second argument, holds there until it is killed: a kill aimed inside a
# write lands there however late the test gets the CPU. Without it, it holds a moment.
WRITER = r"""
import os, sys, time
from testbed.base.atomic import write_json_atomic
fsync = os.fsync
hold = int(sys.argv[2]) if len(sys.argv) > 2 else 0
writes = 0
def announced_fsync(fd):
    global writes
    writes += 1
    print("in-write", flush=True)
    time.sleep(3600 if writes == hold else 0.05)
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


def _writer(path, hold: int = 0):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, path, str(hold)],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_writer_killed_inside_a_write_leaves_the_previous_complete_file(tmp_path):
    for trial in range(6):
        path = str(tmp_path / f"results-{trial}.json")
        inside = trial % 3 + 1  # killed inside its first, second or third write
        proc = _writer(path, hold=inside)
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
        # once it announced its second write, its first is complete, however slow the machine
        for _ in range(2):
            assert proc.stdout.readline().strip() == "in-write"
        time.sleep(rng.uniform(0.0, 0.15))
        _kill_and_check(proc, path, versions)
    assert len(versions) == 20 and min(versions) >= 0
