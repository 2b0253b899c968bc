"""The emulated fabric: a Mininet leaf-spine network of Open vSwitch switches.

``LeafSpineTopo`` is a pure Mininet graph built from the ``FabricPlan``; ``Fabric`` is the thin
I/O edge that builds it, shapes every egress (``testbed.fabric.shaping``), and tears it down.
Switches use the OVS kernel datapath when the openvswitch module is loaded and the userspace
(netdev) datapath otherwise, speak OpenFlow 1.3 only, and fail secure: without their
controller they forward nothing.

Why one module over 400 lines: building, shaping, splitting over servers and tearing down one
fabric share the Mininet network and the ledger's record of what was made.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from functools import partial
from typing import Dict, List, Optional, Tuple

from mininet.link import Link
from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.node import OVSSwitch, RemoteController
from mininet.topo import Topo

from controllers.classes import TrafficClass

from ..base.capabilities import Capabilities
from ..base.errors import CapabilityError, FabricError
from ..base.hops import MECHANISM_TEXT, PORT_KINDS
from ..base.ledger import OVS_TAG, Ledger, present, tag_command
from ..base.topology import PREFIX_LEN, FabricPlan
from ..plan.placement import LOCAL, remote_servers
from ..plan.policyrun import PolicyRun
from ..scenario.config import TopologyConfig
from .linkloss import LinkLoss
from .servers import Server, servers_for
from .shaping import Shape, has_delay_line, tc_commands

LOG = logging.getLogger(__name__)

# Mininet runs ``pexec(..., shell=True)`` through ``$SHELL``; CI jobs, cron and systemd units
# often start without it, and Mininet then fails with a bare KeyError.
os.environ.setdefault("SHELL", "/bin/sh")


class LeafSpineTopo(Topo):
    """Leaf-spine topology: ``spines`` x ``leaves`` full mesh, hosts under each leaf.

    Names, DPIDs, ports and addresses come from ``FabricPlan`` (see ``testbed.base.topology``).
    """

    def build(self, plan: FabricPlan, where: Optional[Dict[str, str]] = None):
        self.plan = plan
        on = (lambda name: {"server": where[name]}) if where else (lambda name: {})
        for sw in self.plan.switches:
            self.addSwitch(sw.name, dpid=sw.dpid_hex, **on(sw.name))
        for h in self.plan.hosts:
            self.addHost(h.name, ip=f"{h.ip}/{PREFIX_LEN}", mac=h.mac, **on(h.name))
        for link in self.plan.links:
            self.addLink(link.node1, link.node2, port1=link.port1, port2=link.port2)


class TaggedOVSSwitch(OVSSwitch):
    """OVSSwitch whose bridge carries the run's tag from the transaction that creates it."""

    run_id = "unknown"

    def bridgeOpts(self):
        return super().bridgeOpts() + f" external_ids:{OVS_TAG}={self.run_id}"


def egress_shapes(plan: FabricPlan, topo: TopologyConfig, classes: Tuple[TrafficClass, ...],
                  headroom: float = 0.0, delays_us: Optional[dict] = None,
                  red: bool = False, qp_limiters: Optional[int] = None,
                  neighbour_us: float = 0.0) -> Dict[str, Shape]:
    """Interface name -> shaping, for every switch port and GPU NIC (pure).

    Switch ports run ``headroom`` (a fraction) faster than their nominal rate: userspace Open
    vSwitch forwards in batches, so frames reach the next equal-rate shaper in bursts, and on
    a link kept busy that jitter would pile up as queueing no real switch has. ``delays_us``
    is the netem delay of each kind of port (``testbed.base.hops.PathDelay.netem_us``), and
    ``neighbour_us`` that of a neighbour host's NIC; ``red``: switch ports mark ECN with the
    kernel's RED; ``qp_limiters``: the class whose GPU NIC queue holds DCQCN's per-QP rate
    limiters (``testbed.fabric.shaping.limiter_commands``)."""
    d = delays_us or dict.fromkeys(PORT_KINDS, 0.0)
    host = Shape(topo.host_rate_mbit * (1 + headroom), classes, d["switch_to_gpu"], red=red)
    nic = Shape(topo.host_rate_mbit, classes, d["gpu_nic"],
                nic_queue_bytes=topo.nic_queue_bytes, qp_limiters=qp_limiters)
    neighbour = Shape(topo.host_rate_mbit, classes, neighbour_us,
                      nic_queue_bytes=topo.nic_queue_bytes)
    fabric = Shape(topo.fabric_rate_mbit * (1 + headroom), classes, d["switch_to_switch"],
                   red=red)
    shapes = {}
    for link in plan.links:
        if link.kind == "host":
            shapes[link.intf1] = nic if plan.host(link.node1).is_gpu else neighbour
            shapes[link.intf2] = host
        else:
            shapes[link.intf1] = fabric
            shapes[link.intf2] = fabric
    return shapes


class Fabric:
    """Build, shape and stop one Mininet fabric for ``plan``."""

    def __init__(self, run: PolicyRun, caps: Capabilities, controller_port: int, ledger: Ledger,
                 events_path: str = ""):
        plan, topo = run.plan, run.scenario.topology
        self.plan, self.topo, self.caps = plan, topo, caps
        self.hops = run.hops
        self.moved_to_root: set = set()  # hosts whose NIC is in the root namespace (rxe)
        self.where = run.placement  # split over servers (testbed.fabric.cluster)
        self.ssh_user = run.scenario.cluster.ssh_user
        self.tunnels: list = []
        # this machine first, then the other servers of a split fabric (testbed.fabric.servers)
        self.servers = servers_for([LOCAL] + remote_servers(self.where or {}), self.ssh_user,
                                   ledger.private_dir, ledger.run_id)
        self.events_path = events_path  # the controller's event socket (queue emulators)
        self.cluster_link = run.scenario.cluster.link
        self.link_kind = ""
        self.cluster_datapath = caps.datapath
        self.mtu = run.link_mtu  # Ethernet MTU of every link
        self.controller_port = controller_port
        self.ledger = ledger
        self.net: Optional[Mininet] = None
        self.loss: Optional[LinkLoss] = None  # the lossy links' programs, if any
        self.headroom = run.scenario.emulation.switch_rate_headroom
        self.path_delay = run.path_delay
        self.shapes = egress_shapes(plan, topo, run.classes, self.headroom,
                                    run.path_delay.netem_us(), red=run.marking == "red",
                                    qp_limiters=run.qp_limiter.major if run.qp_limiter else None,
                                    neighbour_us=run.path_delay.neighbour_nic_us())

    def start(self) -> None:
        setLogLevel("error")
        plan = self.plan
        switches = [s.name for s in plan.switches]
        ours, foreign = present(plan.interface_names() + switches)
        if ours:
            raise FabricError(f"interfaces of an earlier fabric still exist ({_some(ours)}): run "
                              "'python -m testbed clean'")
        if foreign:
            raise FabricError(f"interfaces with this fabric's names exist that the testbed did "
                              f"not make ({_some(foreign)}); 'clean' leaves them alone: delete "
                              "or rename them")
        # Record every name before creating anything, so teardown finds all of it; tag them
        # once made, so that clean finds them without the record.
        ports = [name for name, _ in plan.switch_interfaces()]
        self.ledger.add(bridges=switches, interfaces=ports)
        common = dict(build=False, autoSetMacs=False, autoStaticArp=False,
                      waitConnected=False, controller=None)
        if self.where:
            self.net = self._cluster_net(common)
        else:
            switch_cls = type("RunOVSSwitch", (TaggedOVSSwitch,),
                              {"run_id": self.ledger.run_id})
            self.net = Mininet(
                topo=LeafSpineTopo(plan),
                switch=partial(switch_cls, datapath=self.caps.datapath,
                               protocols="OpenFlow13", failMode="secure"),
                link=Link, **common)
        self.net.addController(RemoteController("c0", ip="127.0.0.1",
                                                port=self.controller_port))
        try:
            self.net.build()
        finally:
            for pid in self._shell_pids():
                self.ledger.add_pid(pid)
            self._tag(ports + switches)
        self.net.start()
        # The switch ports live in the servers' root namespaces: keep the kernel's IPv6
        # chatter (router solicitations, MLD) off them, so every packet they carry was
        # forwarded by a switch.
        for sw in self._one_switch_per_server():
            mine = [i.name for s in self.net.switches if server_name(s) == server_name(sw)
                    for i in s.intfList() if i.name != "lo"]
            _run(sw, "sysctl -qw " + " ".join(f"net.ipv6.conf.{name}.disable_ipv6=1"
                                              for name in mine))
        self._configure_hosts()
        self._shape()
        self._lose()

    def _tag(self, names: List[str]) -> None:
        """Mark the switches' interfaces on every server as this run's (``ledger.present``)."""
        for server in self.servers:
            try:
                server.shell(tag_command(names, self.ledger.run_id))
            except FabricError as e:  # the record still names them
                LOG.warning("could not tag the interfaces on %s: %s", server.name, e)

    def _cluster_net(self, common: dict):
        """The same fabric over several servers (Mininet Cluster Edition): reverse tunnels
        to the controller first, then the nodes where ``self.where`` puts them."""
        from . import cluster

        here, others = self.servers[0], self.servers[1:]
        self.link_kind = self._link_kind(others)
        # the kernel datapath only where every server has the openvswitch module
        self.cluster_datapath = "kernel" if self.caps.datapath == "kernel" and all(
            s.shell("test -d /sys/module/openvswitch && echo yes || true").strip() == "yes"
            for s in others) else "user"
        main_listen, _ = self.pfc_sockets(here)
        for server in others:
            sockets = ({self.events_socket(server): self.events_path} if self.events_path
                       else {})
            remote_listen, remote_peers = self.pfc_sockets(server)
            sockets[remote_peers["*"]] = main_listen  # there -> the main emulator
            tunnel = cluster.ReverseTunnel(
                self.ssh_user, server.name, self.controller_port, sockets,
                local_sockets={self._pfc_forward(server): remote_listen})
            self.tunnels.append(tunnel)
            self.ledger.add_pid(tunnel.start())
        switch_cls = type("RunRemoteOVSSwitch", (cluster.TaggedRemoteOVSSwitch,),
                          {"run_id": self.ledger.run_id})
        home = os.environ.get("HOME")
        os.environ["HOME"] = self.ledger.private_dir  # Cluster Edition's ssh sockets go here
        try:
            return cluster.ClusterNet(
                topo=LeafSpineTopo(self.plan, self.where),
                servers=[s.name for s in self.servers],
                user=self.ssh_user, precheck=False,
                switch=partial(switch_cls, datapath=self.cluster_datapath,
                               protocols="OpenFlow13", failMode="secure"),
                link=cluster.LINKS[self.link_kind], **common)
        finally:
            if home is None:
                os.environ.pop("HOME", None)
            else:
                os.environ["HOME"] = home

    def _link_kind(self, remotes: List[Server]) -> str:
        """``cluster.link``: vxlan where every server's kernel has it (auto), else ssh."""
        from . import cluster

        if self.cluster_link == "ssh":
            return "ssh"
        everywhere = cluster.has_vxlan() and all(
            cluster.has_vxlan(s.shell) for s in remotes)
        if everywhere:
            return "vxlan"
        if self.cluster_link == "vxlan":
            raise CapabilityError("cluster.link vxlan: a server's kernel cannot make VXLAN "
                                  "devices; use link: ssh (or auto)")
        return "ssh"

    def _one_switch_per_server(self):
        seen = {}
        for sw in self.net.switches:
            seen.setdefault(server_name(sw), sw)
        return list(seen.values())

    def _configure_hosts(self) -> None:
        for host in self.net.hosts:
            # Static ARP for every peer: nothing is flooded, nothing waits for ARP.
            for peer in self.plan.hosts:
                if peer.name != host.name:
                    host.setARP(peer.ip, peer.mac)
            intf = self.plan.host(host.name).intf
            # No IPv6 chatter; software checksums (userspace OVS does not complete offloaded
            # ones, so TCP/UDP from the kernel would arrive corrupt).
            _run(host, "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 "
                       "net.ipv6.conf.default.disable_ipv6=1")
            _run(host, f"ethtool -K {intf} tx off rx off", check=False)

    def _shape(self) -> None:
        for node in self.net.hosts + self.net.switches:
            cmds = [c for intf in node.intfList() if intf.name in self.shapes
                    for c in self.shape_commands(intf.name)]
            if cmds:
                _run(node, " && ".join(cmds))

    def _lose(self) -> None:
        """The loss program on both ends of every lossy link (one server: ``decide`` refuses
        lossy links on a split fabric)."""
        ends = {}
        for lossy in self.topo.lossy_links:
            link = self.plan.link_named(lossy.link)
            for intf, node in ((link.intf1, link.node1), (link.intf2, link.node2)):
                pid = self.netns_pid(node) if self.plan.is_host(node) else None
                ends[intf] = (lossy.drop_rate, pid)
        if not ends:
            return
        self.loss = LinkLoss(ends)
        try:
            self.loss.open()
        except OSError as e:
            raise CapabilityError(f"topology.lossy_links: the kernel refused the loss program "
                                  f"({e.strerror or e}); it needs bpf and the cls_bpf "
                                  "classifier") from None

    def link_losses(self) -> Dict[str, Dict[str, int]]:
        """Packets each end of a lossy link lost: RoCE ``data`` and ``other``."""
        return self.loss.lost() if self.loss is not None else {}

    def shape_commands(self, intf: str) -> List[str]:
        """The commands that shape ``intf`` (MTU, then ``testbed.fabric.shaping``), to run where
        the interface is."""
        mtu = [f"ip link set dev {intf} mtu {self.mtu}"] if self.mtu != 1500 else []
        return mtu + tc_commands(intf, self.shapes[intf], self.caps.netem, self.mtu)

    def netns_pid(self, host: str) -> int:
        """A process in the network namespace that holds ``host``'s NIC: the host's shell,
        or this process for a NIC moved to the root namespace (``testbed.fabric.rxe``)."""
        return os.getpid() if host in self.moved_to_root else self.host(host).pid

    def delayed_interfaces(self) -> List[str]:
        """Interfaces whose classes have a netem delay line (``testbed.fabric.shaping``)."""
        return sorted(name for name, shape in self.shapes.items()
                      if has_delay_line(shape, self.caps.netem))

    def applied(self) -> dict:
        """What link emulation is really in place (recorded with the results)."""
        return {"datapath": self.caps.datapath, "openflow": "OpenFlow13",
                "egress_queue": "htb, a FIFO per traffic class (lossless: bfifo behind a tbf "
                                "PFC gate; lossy: pfifo_head_drop), u32 on the DSCP",
                "switch_rate_headroom": self.headroom,
                "per_hop_delay": MECHANISM_TEXT[self.path_delay.mechanism]}

    def hop_delays(self) -> dict:
        """This policy's per-hop latency model and what applies it (``testbed.base.hops``)."""
        h, p = self.hops, self.path_delay
        return {"forwarding": h.forwarding, "pipeline_ns": h.pipeline_ns, "cable_m": h.cable_m,
                "extra_us": h.extra_us, "time_scale": round(h.time_scale, 3),
                "mechanism": p.mechanism, "delay_us_modelled": p.delays_us,
                "delay_us_netem": p.netem_us(),
                "applied": p.mechanism != "off" or not any(p.delays_us.values()),
                "path_us_applied": {"same_leaf": round(p.expected_us(True), 3),
                                    "cross_leaf": round(p.expected_us(False), 3)},
                "transmission": p.transmission}

    def controller_links(self, names: List[str]) -> str:
        """What Open vSwitch says of each named switch's connection to the controller: why
        a switch was never programmed (refused, backing off, never tried)."""
        out = []
        for sw in (self.net.switches if self.net else []):
            if sw.name not in names:
                continue
            uuid = sw.vsctl("get", "Bridge", sw.name, "controller").strip().strip("[]")
            uuid = uuid.split(",")[0].strip()
            if not uuid:
                out.append(f"{sw.name}: no controller set")
                continue
            state = " ".join(sw.vsctl("get", "Controller", uuid, "is_connected", "status")
                             .split())
            out.append(f"{sw.name}: connected={state}")
        return "; ".join(out)

    def check_connectivity(self, may_reach=lambda a, b: True, timeout_s: float = 3.0) -> None:
        """Each GPU pings the next GPU (in rank order) it may reach, again every 0.2 s until
        one reply comes (a lossy link may lose a probe); fails naming the pairs that cannot
        talk. This also makes the switches forward their first packets (see
        ``ovs_buffers``)."""
        if not shutil.which("ping"):
            raise CapabilityError("ping is not installed (Debian package iputils-ping): "
                                  "run scripts/install.sh")
        hosts = self.plan.hosts
        probes = []
        for i, h in enumerate(hosts):
            later = hosts[i + 1:] + hosts[:i]
            peer = next((p for p in later if may_reach(h.name, p.name)), None)
            if peer is None:
                continue
            proc = self.net.get(h.name).popen(
                ["ping", "-n", "-q", "-c", "1", "-i", "0.2", "-w", str(int(timeout_s)), peer.ip],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            probes.append((h.name, peer.name, proc))
        failed = [f"{a}->{b}" for a, b, proc in probes if proc.wait() != 0]
        if failed:
            raise FabricError(f"no connectivity between {', '.join(failed)} after the "
                              "controller programmed the switches")

    def host(self, name: str):
        return self.net.get(name)

    def nodes_for_stats(self) -> list:
        """Where ``tc`` sees every egress queue: one switch per server (switch ports are in
        the servers' root namespaces) and every host."""
        return self._one_switch_per_server() + list(self.net.hosts)

    @staticmethod
    def run(node, cmd: str, check: bool = True) -> str:
        """A shell command in ``node``'s namespace, on whichever server holds it."""
        return _run(node, cmd, check)

    def cluster_report(self) -> Optional[dict]:
        """Which server held what, the cross-server links, and each server's clock against
        this one's (one-way latency across servers is only as good as that offset)."""
        if not self.where:
            return None
        from . import cluster
        from ..plan.placement import by_server, cross_links

        servers = [s.name for s in self.servers]
        clocks = {s.name: s.clock() for s in self.servers[1:]}
        return {"servers": servers, "placement": by_server(self.where, servers),
                "link": cluster.LINK_TEXT[self.link_kind],
                "datapath": self.cluster_datapath,
                "cross_links": [f"{ln.intf1}-{ln.intf2}" for ln in
                                cross_links(self.plan, self.where)],
                "clock_source": "each server's CLOCK_REALTIME; one-way latency across "
                                "servers = receiver's clock - sender's clock",
                "clock_offsets": clocks}

    def pfc_sockets(self, server: Server):
        """(where ``server``'s queue emulator listens for PFC from the others, {server: path
        it sends to}), paths as seen on ``server``. This machine is the hub: the ssh tunnels
        forward each other server's sockets to and from its own."""
        if server.local:
            return (server.socket(f"pfc-{self.controller_port}-main"),
                    {s.name: self._pfc_forward(s) for s in self.servers[1:]})
        return server.socket("pfc"), {"*": server.socket("pfc-main")}

    def _pfc_forward(self, server: Server) -> str:
        """This machine's end of the forward to ``server``'s emulator."""
        index = self.servers.index(server)
        return self.servers[0].socket(f"pfc-{self.controller_port}-{index}")

    def events_socket(self, server: Server) -> str:
        """Where a queue emulator on ``server`` finds the controller's event socket (on
        another server: the end of the reverse tunnel that forwards it)."""
        return self.events_path if server.local else server.socket("events")

    def server(self, name: str) -> Server:
        """The server named ``name`` (``localhost``: this machine)."""
        return next(s for s in self.servers if s.name == name)

    def _shell_pids(self) -> List[int]:
        nodes = self.net.hosts + self.net.switches + self.net.controllers
        # a remote node's pid is numbered on its server: here only its ssh client counts
        return [n.shell.pid if is_remote(n) else n.pid
                for n in nodes if getattr(n, "shell", None) is not None]

    def stop(self) -> None:
        """Stop Mininet and wait until every node's shell has really exited."""
        if self.net is None:
            return
        pids = self._shell_pids()
        if self.loss is not None:
            self.loss.close()
            self.loss = None
        net, self.net = self.net, None
        try:
            net.stop()
        except Exception as e:  # keep tearing down; the ledger removes the rest
            LOG.warning("mininet stop failed: %s", e)
        for tunnel in self.tunnels:
            tunnel.stop()
        self.tunnels = []
        for server in self.servers:
            server.remove()
        for ctl in net.controllers:  # RemoteController.stop() does nothing: its shell (and
            try:                     # pty) would live on, 2 fds and 5 s of waiting per run
                ctl.terminate()
            except Exception as e:
                LOG.warning("stopping %s's shell failed: %s", ctl.name, e)
        wait_gone(pids, timeout=5.0)


REMOTE_LINE_MAX = 1500  # a remote node's shell reads a terminal line: at most 4095 bytes


def remote_lines(cmd: str, limit: int = REMOTE_LINE_MAX) -> List[str]:
    """``cmd`` as command lines short enough for a terminal: an ``&&`` chain split between
    its commands, a long ``sysctl -w`` split between its settings (pure)."""
    if len(cmd) <= limit:
        return [cmd]
    if " && " in cmd:
        parts, sep = cmd.split(" && "), " && "
    elif cmd.startswith("sysctl -qw "):
        words = cmd[len("sysctl -qw "):].split()
        size = max(1, limit // max(len(w) + 1 for w in words))
        return ["sysctl -qw " + " ".join(words[i:i + size]) for i in range(0, len(words), size)]
    else:
        return [cmd]
    lines, line = [], ""
    for part in parts:
        if line and len(line) + len(sep) + len(part) > limit:
            lines.append(line)
            line = part
        else:
            line = f"{line}{sep}{part}" if line else part
    return lines + [line]


def server_name(node) -> str:
    """The server that holds a Mininet node (Cluster Edition names it on the node)."""
    return getattr(node, "server", None) or LOCAL


def is_remote(node) -> bool:
    """True for a node on another server: its shell is reached over ssh."""
    return server_name(node) != LOCAL


def _run(node, cmd: str, check: bool = True) -> str:
    if is_remote(node):
        # a remote node (Mininet Cluster): its pexec would pass the command through ssh
        # unquoted; its own shell keeps the command whole, in lines a terminal takes
        outs = []
        for line in remote_lines(cmd):
            text = node.cmd(f"{{ {line} ; }} 2>&1; echo __rc=$?")
            text, _, code = text.rpartition("__rc=")
            outs.append(text)
            code, err = int(code.strip() or 1), ""
            if code:
                break
        out = "".join(outs)
    else:
        out, err, code = node.pexec(cmd, shell=True)
    if code and check:
        raise FabricError(f"{node.name}: '{cmd[:80]}...' failed: {(err or out).strip()[:200]}")
    return out


def wait_gone(pids: List[int], timeout: float) -> None:
    """Poll until ``pids`` have exited; SIGKILL whatever is still there at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return
        if time.monotonic() > deadline:
            for p in alive:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _some(names: List[str]) -> str:
    return ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
