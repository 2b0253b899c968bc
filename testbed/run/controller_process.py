"""Run the os-ken controller (``controllers.launcher``) as a child process of the runner.

It listens on 127.0.0.1 and a free port, logs to ``controller-<policy>.log`` in the run
directory, reports each programmed switch in a state file the runner polls, and takes
switch-queue events on a UNIX socket in the run's private directory.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Callable, Iterable, List, Set

from controllers.contract import ControllerConfig, ControllerEvent

from ..base.errors import ControllerError
from ..base.ledger import Ledger
from ..base.procutil import free_tcp_port, log_tail, stop_process


class ControllerProcess:
    def __init__(self, policy, run_dir: str, private_dir: str, ledger: Ledger,
                 label: str = ""):
        """``policy``: the configured policy core (its name, plan, parameters, context);
        ``label``: what names its files (a variant's label; default the policy's name)."""
        self.policy, self.plan = policy, policy.plan
        self.run_dir, self.ledger = run_dir, ledger
        name = label or policy.name
        self.log_path = os.path.join(run_dir, f"controller-{name}.log")
        self.state_path = os.path.join(private_dir, f"controller-{name}.state")
        self.policy_path = os.path.join(private_dir, f"policy-{name}.json")
        self.events_path = os.path.join(private_dir, f"events-{name}.sock")
        self.proc = None
        self.port = None

    def start(self) -> None:
        with open(self.policy_path, "w", encoding="utf-8") as f:
            json.dump(ControllerConfig.of(self.policy).to_dict(), f)
        open(self.state_path, "w").close()
        self.port = free_tcp_port()
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "controllers.launcher", "--port", str(self.port),
                 "--policy-file", self.policy_path, "--state", self.state_path,
                 "--events", self.events_path],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        finally:
            log.close()
        self.ledger.add_pid(self.proc.pid)

    def pids(self) -> list:
        return [self.proc.pid] if self.proc is not None else []

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            code = self.proc.returncode if self.proc else None
            raise ControllerError(f"the {self.policy.name} controller died (exit code {code}); "
                                  f"last log lines: {self.tail()}")

    def programmed(self) -> Set[int]:
        done = set()
        with open(self.state_path, encoding="utf-8") as f:
            for line in f:
                try:
                    e = ControllerEvent.from_dict(json.loads(line))
                except ValueError:  # a line the controller is still writing
                    continue
                name = self.policy.name
                if e.event == "error":
                    raise ControllerError(
                        f"switch {e.dpid or 0:016x} rejected a message of the {name} policy "
                        f"(OpenFlow error type {e.type} code {e.code}; see {self.log_path})")
                if e.event == "failed":
                    raise ControllerError(f"the {name} controller could not program switch "
                                          f"{e.dpid or 0:016x}: {e.error}")
                if e.event == "handler_failed":
                    raise ControllerError(f"the {name} controller's {e.handler} failed: "
                                          f"{e.error} (see {self.log_path})")
                if e.event == "programmed":
                    done.add(e.dpid)
        return done

    def wait_programmed(self, dpids: Iterable[int], timeout: float = 60.0,
                        explain: Callable[[List[str]], str] = lambda names: "") -> float:
        """Poll until every switch in ``dpids`` is programmed; returns the time it took.
        ``explain``: what the switches themselves say, for the error."""
        want = set(dpids)
        t0 = time.monotonic()
        while True:
            self.check_alive()
            missing = want - self.programmed()
            if not missing:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                names = sorted(self.plan.switch_by_dpid(d).name for d in missing)
                try:
                    said = explain(names)
                except Exception as e:  # the diagnosis must not hide the error itself
                    said = f"(could not ask: {e})"
                raise ControllerError(f"switches not programmed after {timeout:.0f} s: "
                                      f"{', '.join(names)} (see {self.log_path}: "
                                      f"{self.tail()})"
                                      + (f"; Open vSwitch: {said}" if said else ""))
            time.sleep(0.05)

    def tail(self, lines: int = 3) -> str:
        return log_tail(self.log_path, lines)

    def stop(self) -> None:
        stop_process(self.proc)
