"""Servers (testbed.fabric.servers): this machine works in place, a remote server through its
workspace; the pid line a remote start reads leaves the process's output whole."""
import os
import subprocess
import sys

import pytest

from testbed.base.errors import FabricError
from testbed.fabric import servers
from testbed.plan.placement import LOCAL, remote_servers


class FakeWorkspace:
    """Records what a Remote asks of its workspace (no ssh)."""

    def __init__(self):
        self.calls = []

    def dir(self, server):
        return f"/var/tmp/ws-{server}"

    def run(self, server, command):
        self.calls.append(("run", server, command))
        return ""

    def put(self, server, path):
        self.calls.append(("put", server, path))
        return f"{self.dir(server)}/{os.path.basename(path)}"

    def get(self, server, pattern, local):
        self.calls.append(("get", server, pattern, local))

    def remove_one(self, server):
        self.calls.append(("remove", server))


def test_this_machine_works_in_place(tmp_path):
    here = servers.Server(str(tmp_path))
    assert here.local and here.name == LOCAL and here.tag == ""
    path = str(tmp_path / "switchq.json")
    assert here.place(path) == path and here.send(path) == path
    here.fetch(path, path)  # nothing to copy
    assert here.socket("pfc-6653-main") == str(tmp_path / "pfc-6653-main.sock")
    assert here.shell("echo hi") == "hi\n"
    with pytest.raises(FabricError, match="'exit 3' failed"):
        here.shell("exit 3")


def test_a_process_here_gets_a_session_of_its_own(tmp_path):
    proc = servers.Server(str(tmp_path)).spawn(
        [sys.executable, "-c", "import os; print(os.getsid(0))"], stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=10)
    assert int(out) == proc.pid != os.getsid(0)


def test_a_remote_server_keeps_files_in_its_workspace():
    ws = FakeWorkspace()
    there = servers.Remote("10.9.0.2", "root", ws)
    assert not there.local and there.tag == "@10.9.0.2"
    assert there.place("/runs/x/switchq-lossless@10.9.0.2.json") == \
        "/var/tmp/ws-10.9.0.2/switchq-lossless@10.9.0.2.json"
    assert there.place("/runs/x/records/lossless/", directory=True) == \
        "/var/tmp/ws-10.9.0.2/lossless"
    assert ws.calls[-1] == ("run", "10.9.0.2", "mkdir -p -m 700 /var/tmp/ws-10.9.0.2/lossless")
    assert there.send("/private/agent-1.json") == "/var/tmp/ws-10.9.0.2/agent-1.json"
    there.fetch("/var/tmp/ws-10.9.0.2/lossless/gpu5.*", "/runs/x/records/lossless")
    assert ws.calls[-1] == ("get", "10.9.0.2", "/var/tmp/ws-10.9.0.2/lossless/gpu5.*",
                            "/runs/x/records/lossless")
    assert there.socket("events") == "/var/tmp/ws-10.9.0.2/events.sock"
    there.remove()
    assert ws.calls[-1] == ("remove", "10.9.0.2")


def test_the_servers_of_a_run_are_this_machine_first(tmp_path):
    where = {"lf1": LOCAL, "lf2": "b", "lf3": "a", "gpu1": "b"}
    assert remote_servers(where) == ["a", "b"]
    one = servers.servers_for([LOCAL], "root", str(tmp_path), "run1")
    assert [s.name for s in one] == [LOCAL] and one[0].local
    split = servers.servers_for([LOCAL] + remote_servers(where), "root", str(tmp_path), "r")
    assert [(s.name, s.local) for s in split] == [(LOCAL, True), ("a", False), ("b", False)]
    assert split[1].workspace is split[2].workspace  # one workspace per run


def test_the_pid_line_leaves_the_rest_of_the_output_in_the_pipe():
    proc = subprocess.Popen([sys.executable, "-c", "print(4242); print('ready'); print('x')"],
                            stdout=subprocess.PIPE)
    try:
        assert servers._first_line(proc.stdout.fileno(), 10.0) == "4242"
        rest = b""
        while True:  # what a raw reader (the agents' select loop) sees next
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            rest += chunk
        assert rest == b"ready\nx\n"
    finally:
        proc.wait(timeout=10)


def test_no_pid_line_is_an_empty_answer_not_a_hang():
    proc = subprocess.Popen(["sleep", "5"], stdout=subprocess.PIPE)
    try:
        assert servers._first_line(proc.stdout.fileno(), 0.2) == ""
    finally:
        proc.kill()
        proc.wait(timeout=5)
