"""Helpers for tests that drive `python -m testbed run` as a process."""
import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from testbed.base.procutil import cmdline, parent_pid


def in_private_netns(test_file):
    """Run ``test_file`` as a script in a throw-away network namespace (``unshare --net``: it
    vanishes with the process), from the project's root; the JSON its last line printed."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(test_file))))
    proc = subprocess.run(["unshare", "--net", sys.executable, test_file], capture_output=True,
                          text=True, timeout=60, cwd=root)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def start_run(out_dir, *args):
    """`python -m testbed run --out out_dir ...` as a process, its output piped; the ring
    scenario unless ``args`` name one (the tests count its iterations)."""
    scenario = [] if "--scenario" in args else ["--scenario", "ring"]
    return subprocess.Popen([sys.executable, "-m", "testbed", "run", "--out", str(out_dir),
                             *scenario, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def stop(proc, timeout=60.0):
    """End a run that is still going the way a user would, with Ctrl-C, so it tears down
    what it built; kill it only if it hangs."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def process_tree(pid):
    """(pid, command line) of ``pid``'s descendants, read from /proc: what a run was doing."""
    parent = {int(p): parent_pid(int(p)) for p in os.listdir("/proc") if p.isdigit()}
    tree, todo = [], [pid]
    while todo:
        here = todo.pop()
        kids = [p for p, pp in parent.items() if pp == here]
        todo += kids
        tree += kids
    return [f"{p}: {cmdline(p)[:120]}" for p in sorted(tree) if cmdline(p)]


def log_tails(proc, lines=5):
    """The last lines of every log in the run directory of ``proc`` (``--out DIR``)."""
    args = list(proc.args)
    if "--out" not in args:
        return ""
    out_dir = args[args.index("--out") + 1]
    tails = []
    for root, _dirs, files in os.walk(out_dir):
        for name in sorted(files):
            if name.endswith(".log"):
                with open(os.path.join(root, name), encoding="utf-8", errors="replace") as f:
                    tails.append(f"--- {name}\n" + "".join(f.readlines()[-lines:]))
    return "\n".join(tails)


def wait_for_line(proc, needle, timeout=60.0):
    """Read stderr until a line contains ``needle``; returns everything read. On a timeout the
    error shows what the run was doing: its processes and the tails of its logs."""
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
    doing = "\n".join(process_tree(proc.pid)) or "(no child processes)"
    logs = log_tails(proc)
    stop(proc)
    raise AssertionError(f"never saw {needle!r} in {timeout:.0f} s; got: {''.join(seen)[-2000:]}"
                         f"\nthe run's processes then:\n{doing}\nits logs:\n{logs[-3000:]}")


def results_of(out_dir):
    """The results.json of the one run under ``out_dir`` (a rejected attempt's, kept in
    rejected/ below it, are not)."""
    (run_id,) = os.listdir(out_dir)
    with open(os.path.join(out_dir, run_id, "results.json")) as f:
        return json.load(f)
