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

WRITER = r"""
import sys
from testbed.results import write_json_atomic
path = sys.argv[1]
print("ready", flush=True)
i = 0
while True:
    write_json_atomic(path, {"version": i, "records": "x" * 8_000_000, "complete": True})
    i += 1
"""


def test_a_writer_killed_mid_write_leaves_a_complete_file(tmp_path):
    path = str(tmp_path / "results.json")
    rng = random.Random(7)
    mid_write = 0
    versions = []
    for trial in range(40):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, path], stdout=subprocess.PIPE,
                                text=True, cwd=os.path.dirname(os.path.dirname(
                                    os.path.dirname(os.path.abspath(__file__)))))
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.01, 0.15))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        temps = glob.glob(path + ".tmp.*")
        mid_write += bool(temps)  # killed while a temporary file was being written
        for t in temps:
            os.unlink(t)
        if os.path.exists(path):
            with open(path) as f:
                data = json.load(f)  # never truncated
            assert data["complete"] is True and len(data["records"]) == 8_000_000
            versions.append(data["version"])
    assert mid_write >= 3, "the kills never landed inside a write: the test proved nothing"
    assert versions, "no write ever completed"
