"""Background and adversarial traffic on the fabric while the collectives run.

* **noisy neighbour**: every neighbour host (``topology.neighbours_per_leaf``: non-GPU hosts, a
  tenant of their own) sends UDP at ``rate_gbit`` (the modelled fabric's rate) to the
  neighbour with the same position on
  the next leaf - with the project's flow tool (kernel receive timestamps, so its loss and
  latency are reported) or with ``iperf3 -u``;
* **incast**: several senders burst ``burst_bytes`` of RoCE frames (the RoCE DSCP, another job's
  queue pair) at one target at the same instants, every ``period_us`` of modelled time.

``testbed.plan.background`` decides who sends what; ``Background`` starts the processes inside
the hosts' namespaces, records every PID in the run's ledger, and stops them when the
collectives end. Every flow is also bounded in time by itself (``background.max_s``). Traffic
goes only between emulated hosts.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from typing import Dict, List, Optional

from traffic.contract import Bursts, FlowConfig, FlowSeen, FlowsReceived, FlowsSent

from ..base.errors import AgentError, CapabilityError
from ..base.ledger import Ledger
from ..base.procutil import read_line, stop_processes
from ..plan.background import Flow
from ..plan.policyrun import PolicyRun

IPERF_PORT = 5201
IPERF_GRACE_S = 0.5  # the server listens before the client starts


class Background:
    """The background processes of one policy's run."""

    def __init__(self, fabric, run: PolicyRun, work_dir: str, ledger: Ledger):
        self.fabric, self.plan, self.scenario = fabric, run.plan, run.scenario
        self.roce_dscp = run.policy.dscp()[0]
        self.work_dir = work_dir
        self.ledger = ledger
        self.bg = run.background
        self.procs: List[dict] = []  # {"role", "flow", "proc", "out", "flows"}
        scenario = run.scenario
        self.duration_s = scenario.background.max_s
        # the neighbours' rate as the emulated links run it
        nn = scenario.background.noisy_neighbour
        self.rate_mbit = round(scenario.emulated_mbit(nn.rate_gbit), 6) if nn.rate_gbit else 0.0

    @property
    def empty(self) -> bool:
        return self.bg.empty

    def describe(self) -> str:
        parts = []
        nn, inc = self.scenario.background.noisy_neighbour, self.scenario.background.incast
        if self.bg.noisy:
            parts.append(f"noisy neighbour: {len(self.bg.noisy)} flows of {nn.rate_gbit:g} "
                         f"Gbit/s modelled, {self.rate_mbit:g} Mbit/s emulated ({nn.tool})")
        if self.bg.incast:
            parts.append(f"incast: {len(self.bg.incast)} senders -> {self.bg.incast_target}, "
                         f"{inc.burst_bytes:,} B each, one burst every {inc.period_us:g} us "
                         f"modelled ({self.scenario.emulated_ns(inc.period_us) / 1e6:g} ms "
                         "emulated)")
        return "; ".join(parts)

    def start_receivers(self) -> None:
        """Sinks that must listen before the traffic starts."""
        os.makedirs(self.work_dir, exist_ok=True)
        nn = self.scenario.background.noisy_neighbour
        if nn.tool == "iperf3" and self.bg.noisy and not shutil.which("iperf3"):
            raise CapabilityError("iperf3 is not installed: run scripts/install.sh")
        for f in self.bg.noisy:
            dst = self.plan.host(f.dst)
            if nn.tool == "iperf3":
                out = self._out("iperf3-server", f.dst)
                self._popen("noisy-receiver", f, f.dst,
                            ["iperf3", "-s", "-1", "-B", dst.ip, "-p", str(IPERF_PORT), "-J"],
                            out, stdout_to_out=True)
            else:
                self._flows("noisy-receiver", f, f.dst, "recv",
                            {"ip": dst.ip, "duration_s": self.scenario.background.max_s + 60})
        target = self.bg.incast_target
        if target and not self.plan.host(target).is_gpu:  # a GPU's agent counts them itself
            self._flows("incast-receiver", Flow("incast", "", target), target, "recv",
                        {"ip": self.plan.host(target).ip,
                         "duration_s": self.scenario.background.max_s + 60})
        for p in self.procs:
            if p["role"].endswith("receiver") and p.get("flows"):
                _expect_ready(p["proc"])

    def start_senders(self, duration_s: float) -> None:
        """Load the flow-tool senders (they wait for ``go``); each stops by itself after
        ``duration_s`` (at most ``background.max_s``)."""
        bg = self.scenario.background
        self.duration_s = min(duration_s, bg.max_s)
        nn = bg.noisy_neighbour
        if nn.tool == "flows":
            for f in self.bg.noisy:
                src, dst = self.plan.host(f.src), self.plan.host(f.dst)
                self._flows("noisy-sender", f, f.src, "send",
                            {"kind": "udp", "src_ip": src.ip, "dst_ip": dst.ip,
                             "payload": nn.packet_bytes, "rate_mbit": self.rate_mbit,
                             "dscp": nn.dscp, "start": "stdin",
                             "duration_s": self.duration_s})
        inc = bg.incast
        mtu = self.scenario.workload.mtu
        for f in self.bg.incast:
            src, dst = self.plan.host(f.src), self.plan.host(f.dst)
            self._flows("incast-sender", f, f.src, "send", {
                "kind": "roce", "intf": src.intf, "src_mac": src.mac, "src_ip": src.ip,
                "dst_mac": dst.mac, "dst_ip": dst.ip, "dscp": self.roce_dscp, "ecn": 2,
                "payload": mtu, "dqpn": 0xFFFF00,  # another job's QP: no agent QP matches
                "start": "stdin",
                "bursts": Bursts(duration_s=self.duration_s,
                                 period_us=self.scenario.emulated_ns(inc.period_us) / 1000,
                                 packets=max(1, math.ceil(inc.burst_bytes / mtu)))})
        for p in self.procs:
            if p["role"].endswith("sender"):
                _expect_ready(p["proc"])

    def go(self, start_ns: int) -> None:
        """Start the background traffic at ``start_ns`` + ``background.start_us`` (modelled)."""
        bg = self.scenario.background
        start_ns += self.scenario.emulated_ns(bg.start_us)
        for p in self.procs:
            if p["role"].endswith("sender"):
                p["proc"].stdin.write(f"go {start_ns}\n".encode())
                p["proc"].stdin.flush()
        nn = bg.noisy_neighbour
        if nn.tool == "iperf3":  # a C program starts at once: launched at the go
            for f in self.bg.noisy:
                src, dst = self.plan.host(f.src), self.plan.host(f.dst)
                delay = max(IPERF_GRACE_S, (start_ns - time.time_ns()) / 1e9)
                cmd = (f"sleep {delay:.3f} && exec iperf3 -c {dst.ip} -B {src.ip} "
                       f"-p {IPERF_PORT} -u -b {self.rate_mbit:g}M -l {nn.packet_bytes} "
                       f"-t {max(1, math.ceil(self.duration_s))} -S {nn.dscp << 2} -J")
                self._popen("noisy-sender", f, f.src, ["sh", "-c", cmd],
                            self._out("iperf3-client", f.src), stdout_to_out=True)

    def stop(self) -> dict:
        """Stop every background process (senders first) and gather what they reported."""
        for role in ("sender", "receiver"):
            stop_processes([p["proc"] for p in self.procs if p["role"].endswith(role)])
        return self.report()

    def report(self) -> dict:
        out: Dict[str, object] = {}
        nn = self.scenario.background.noisy_neighbour
        if self.bg.noisy:
            flows = []
            for f in self.bg.noisy:
                sender = self._read("noisy-sender", f)
                receiver = self._read("noisy-receiver", f)
                flows.append(_iperf3_figures(f, sender, receiver) if nn.tool == "iperf3" else
                             _flow_figures(f, _as(FlowsSent, sender),
                                           _as(FlowsReceived, receiver),
                                           self.plan.host(f.src).ip))
            out["noisy_neighbour"] = {"tool": nn.tool, "rate_gbit": nn.rate_gbit,
                                      "rate_mbit": self.rate_mbit,
                                      "flows": flows}
        if self.bg.incast:
            sent = [_as(FlowsSent, self._read("incast-sender", f)) or FlowsSent()
                    for f in self.bg.incast]
            got = _as(FlowsReceived, self._read("incast-receiver",
                                                Flow("incast", "", self.bg.incast_target)))
            out["incast"] = {"target": self.bg.incast_target,
                             "senders": [f.src for f in self.bg.incast],
                             "packets_sent": sum(s.sent for s in sent),
                             "bursts": max((s.bursts for s in sent), default=0),
                             # a GPU target's agent counts them (filled in by the runner)
                             "packets_received": (sum(f.packets for f in got.flows.values())
                                                  if got else None)}
        return out

    # --- processes --------------------------------------------------------------------------
    def _out(self, what: str, host: str) -> str:
        return os.path.join(self.work_dir, f"{what}-{host}.json")

    def _flows(self, role: str, flow: Flow, host: str, mode: str, fields: dict) -> None:
        """A ``traffic.flows`` process with its contract (``FlowConfig``) of ``fields``."""
        path = os.path.join(self.work_dir, f"{role}-{host}.json")
        cfg = FlowConfig(out=path + ".out", **fields)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(cfg.to_dict(), f)
        self._popen(role, flow, host, [sys.executable, "-m", "traffic.flows", mode, path],
                    cfg.out, flows=True)

    def _popen(self, role: str, flow: Flow, host: str, cmd: List[str], out: str,
               stdout_to_out: bool = False, flows: bool = False) -> None:
        log = open(os.path.join(self.work_dir, f"{role}-{host}.log"), "ab")
        sink = open(out, "wb") if stdout_to_out else None
        try:
            proc = self.fabric.host(host).popen(
                cmd, stdout=sink if sink else subprocess.PIPE, stderr=log, cwd=os.getcwd(),
                stdin=subprocess.PIPE if flows else subprocess.DEVNULL)
        finally:
            log.close()
            if sink:
                sink.close()
        self.ledger.add_pid(proc.pid)
        self.procs.append({"role": role, "flow": flow, "proc": proc, "out": out, "flows": flows})

    def _read(self, role: str, flow: Flow) -> Optional[dict]:
        """What a process of ``role`` for ``flow`` wrote (None: nothing readable)."""
        for p in self.procs:
            if p["role"] == role and p["flow"] == flow:
                try:
                    with open(p["out"], encoding="utf-8") as f:
                        return json.load(f)
                except (OSError, ValueError):
                    return None
        return None


def _as(contract, data: Optional[dict]):
    """A ``traffic.flows`` process's report as its contract (None: it wrote none)."""
    return None if data is None else contract.from_dict(data)


def _iperf3_figures(f: Flow, client: Optional[dict], server: Optional[dict]) -> dict:
    """iperf3's own JSON (``-J``): the client says what it sent, the server what arrived."""
    row = {"src": f.src, "dst": f.dst}
    sent = (client or {}).get("end", {}).get("sum") or {}
    got = (server or {}).get("end", {}).get("sum") or {}
    row.update({"sent": sent.get("packets"),
                "sent_mbit_s": _r(sent["bits_per_second"] / 1e6) if sent else None,
                "received": (got["packets"] - got.get("lost_packets", 0)) if got else None,
                "jitter_ms": _r(got.get("jitter_ms")) if got else None})
    return row


def _flow_figures(f: Flow, sender: Optional[FlowsSent], receiver: Optional[FlowsReceived],
                  src_ip: str) -> dict:
    """The flow tool's: what the sender sent, and the receiver's flow from ``src_ip``."""
    got = receiver.flows.get(f"udp {src_ip}", FlowSeen()) if receiver else None
    lat = sorted(got.latency_us) if got else []
    return {"src": f.src, "dst": f.dst, "sent": sender.sent if sender else None,
            "received": got.packets if got else None,
            "latency_us_p50": _r(lat[len(lat) // 2]) if lat else None,
            "latency_us_p99": _r(lat[min(len(lat) - 1, int(0.99 * len(lat)))]) if lat else None}


def _r(x):
    return None if x is None else round(float(x), 3)


def _expect_ready(proc, timeout: float = 20.0) -> None:
    line = read_line(proc.stdout, timeout)
    if line != "ready":
        raise AgentError(f"a background traffic receiver did not start (said {line!r})")
