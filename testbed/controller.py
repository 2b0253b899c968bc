"""Run the os-ken controller (``controllers.launcher``) as a child process of the runner.

It listens on 127.0.0.1 and a free port, logs to ``controller-<policy>.log`` in the run
directory, and reports each programmed switch in a state file the runner polls.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Iterable, Set

from .errors import ControllerError
from .ledger import Ledger
from .procutil import free_tcp_port
from .topology import FabricPlan


class ControllerProcess:
    def __init__(self, policy: str, plan: FabricPlan, run_dir: str, ledger: Ledger):
        self.policy, self.plan, self.run_dir, self.ledger = policy, plan, run_dir, ledger
        self.log_path = os.path.join(run_dir, f"controller-{policy}.log")
        self.state_path = os.path.join(run_dir, f".controller-{policy}.state")
        self.proc = None
        self.port = None

    def start(self) -> None:
        fabric_path = os.path.join(self.run_dir, "fabric.json")
        with open(fabric_path, "w", encoding="utf-8") as f:
            json.dump(self.plan.to_dict(), f)
        open(self.state_path, "w").close()
        self.port = free_tcp_port()
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "controllers.launcher", "--port", str(self.port),
                 "--policy", self.policy, "--fabric", fabric_path, "--state", self.state_path],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        finally:
            log.close()
        self.ledger.add_pid(self.proc.pid)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            code = self.proc.returncode if self.proc else None
            raise ControllerError(f"the {self.policy} controller died (exit code {code}); "
                                  f"last log lines: {self.tail()}")

    def programmed(self) -> Set[int]:
        done = set()
        with open(self.state_path, encoding="utf-8") as f:
            for line in f:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("event") == "error":
                    raise ControllerError(f"switch {event.get('dpid', 0):016x} rejected a "
                                          f"message of the {self.policy} policy (OpenFlow error "
                                          f"type {event.get('type')} code {event.get('code')})")
                if event.get("event") == "programmed":
                    done.add(event["dpid"])
        return done

    def wait_programmed(self, dpids: Iterable[int], timeout: float = 60.0) -> float:
        """Poll until every switch in ``dpids`` is programmed; returns the time it took."""
        want = set(dpids)
        t0 = time.monotonic()
        while True:
            self.check_alive()
            missing = want - self.programmed()
            if not missing:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                names = sorted(self.plan.switch_by_dpid(d).name for d in missing)
                raise ControllerError(f"switches not programmed after {timeout:.0f} s: "
                                      f"{', '.join(names)} (see {self.log_path})")
            time.sleep(0.05)

    def tail(self, lines: int = 3) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return " | ".join(line.strip() for line in f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
