"""Random packet loss on chosen links: a bad cable or optic (``topology.lossy_links``).

This kernel may have neither netem nor the gact action, so the loss is a tc BPF program on
``clsact`` egress of each end of the link (both directions), built with the assembler of
``testbed.fabric.bpf``: an IPv4 packet is taken (TC_ACT_STOLEN) and counted in the link
end's slot of an array map when ``bpf_get_prandom_u32()`` falls below ``drop_rate x 2^32``;
every other packet goes on to the next filter. Stolen, not shot: a shot packet fails the
sender's ``sendmmsg`` with ENOBUFS and userspace Open vSwitch then abandons the rest of the
batch (see ``testbed.fabric.shaping``), turning one loss into a burst; a stolen one reports
success, as a frame lost on the wire does. The program runs first on the port (before the
queue counters of ``testbed.fabric.bpfqueue``), so a lost packet never enters the queue's
count, and its count keeps losses apart from buffer overflows.
"""
from __future__ import annotations

import os
import socket
import struct
from typing import Dict, List, Optional, Tuple

from traffic import roce

from ..base.netlink import socket_in_netns
from . import bpf
from .bpf import (ETH_P_IP_BE, HELPER_MAP_LOOKUP, HELPER_SKB_LOAD_BYTES, OUT, R0, R1, R2, R3,
                  R4, R6, R7, R10, SKB_PROTOCOL, TC_ACT_UNSPEC, Clsact, add_k, call, exit_, jeq,
                  jge, jne, ld_map_fd, ldx_b, ldx_h, ldx_w, mov_k, mov_x, stx_w, xadd_dw)

PROG_NAME = "testbed_loss"
HELPER_GET_PRANDOM_U32 = 7
TC_ACT_STOLEN = 4
LOST, COUNT = "lost", "count"  # labels of the program
UDP_DPORT = roce.SPORT_OFFSET + 2  # in a frame with an IPv4 header of 20 bytes, as RoCE's
ROCE_PORT_AS_READ = socket.htons(roce.ROCE_UDP_PORT)  # as a little-endian 16-bit load reads it
LAST_DATA_OPCODE = roce.RC_RDMA_WRITE_ONLY  # the agents' data: RDMA WRITE FIRST..ONLY
MAX_THRESHOLD = (1 << 31) - 1  # a jump's immediate is a signed 32-bit value


def threshold(drop_rate: float) -> int:
    """The random 32-bit value below which a packet is dropped."""
    return min(MAX_THRESHOLD, round(drop_rate * (1 << 32)))


def program(drop_rate: float, counters_fd: int, slot: int) -> bytes:
    """Lose an IPv4 packet with probability ``drop_rate``, counting it in
    ``counters[2 slot]`` if it carries RoCE data, else in ``counters[2 slot + 1]``; pass
    everything else on."""
    return bpf.link([
        mov_x(R6, R1),  # r6 = skb
        ldx_w(R2, R6, SKB_PROTOCOL),
        jne(R2, ETH_P_IP_BE),  # not IPv4 (spanning tree, LLDP): never lost
        call(HELPER_GET_PRANDOM_U32),
        jge(R0, threshold(drop_rate)),
        mov_k(R7, 2 * slot + 1),  # control (ACK, NAK, CNP) or other traffic, unless...
        mov_x(R1, R6), mov_k(R2, UDP_DPORT), mov_x(R3, R10), add_k(R3, -16), mov_k(R4, 8),
        call(HELPER_SKB_LOAD_BYTES),  # UDP destination port .. BTH opcode
        jne(R0, 0, COUNT),
        ldx_h(R1, R10, -16),
        jne(R1, ROCE_PORT_AS_READ, COUNT),
        ldx_b(R1, R10, -16 + roce.BTH_OFFSET - UDP_DPORT),
        jge(R1, LAST_DATA_OPCODE + 1, COUNT),
        mov_k(R7, 2 * slot),  # ...RoCE data
        bpf.label(COUNT),
        stx_w(R10, R7, -4),
        ld_map_fd(R1, counters_fd),
        mov_x(R2, R10), add_k(R2, -4),
        call(HELPER_MAP_LOOKUP),
        jeq(R0, 0, LOST),
        mov_k(R1, 1),
        xadd_dw(R0, R1, 0),
        bpf.label(LOST),
        mov_k(R0, TC_ACT_STOLEN),
        exit_(),
        bpf.label(OUT),
        mov_k(R0, TC_ACT_UNSPEC),
        exit_(),
    ])


class LinkLoss:
    """The loss program on interfaces of this host: ``ends`` maps each interface to its drop
    rate and the pid of a process in its network namespace (None: this one). ``open``
    raises OSError when the kernel refuses (no bpf, no cls_bpf); ``close`` removes the clsact
    qdiscs it added, and every filter with them."""

    def __init__(self, ends: Dict[str, Tuple[float, Optional[int]]]):
        self.ends = ends
        self.order = sorted(ends)  # interface -> its counter slot, by position
        self.socks: List[socket.socket] = []
        self.clsacts: List[Clsact] = []
        self.counters_fd = -1

    def open(self) -> None:
        self.counters_fd = bpf.create_map(bpf.BPF_MAP_TYPE_ARRAY, 4, 8,
                                          2 * max(1, len(self.order)))
        spaces: Dict[Optional[int], Tuple[Clsact, Dict[str, int]]] = {}
        for slot, intf in enumerate(self.order):
            rate, pid = self.ends[intf]
            if pid not in spaces:
                if pid is None:
                    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
                    sock.bind((0, 0))
                    names = bpf.interface_index()
                else:
                    sock, names = socket_in_netns(pid)
                self.socks.append(sock)
                self.clsacts.append(Clsact(sock))
                spaces[pid] = (self.clsacts[-1], names)
            clsact, names = spaces[pid]
            if intf not in names:
                raise OSError(0, f"no interface {intf} to make lossy")
            fd = bpf.load_program(program(rate, self.counters_fd, slot), PROG_NAME)
            try:  # the filter holds the program: its descriptor is not needed after
                clsact.attach(names[intf], fd, PROG_NAME, bpf.PRIO_LOSS)
            finally:
                os.close(fd)

    def lost(self) -> Dict[str, Dict[str, int]]:
        """Packets each link end lost so far: RoCE ``data`` and ``other``."""
        def count(i: int) -> int:
            return struct.unpack("=Q", bpf.lookup(self.counters_fd, struct.pack("=I", i), 8))[0]
        return {intf: {"data": count(2 * slot), "other": count(2 * slot + 1)}
                for slot, intf in enumerate(self.order)}

    def close(self) -> None:
        for clsact in self.clsacts:
            clsact.close()
        for sock in self.socks:
            sock.close()
        if self.counters_fd >= 0:
            os.close(self.counters_fd)
        self.socks, self.clsacts, self.counters_fd = [], [], -1


def selftest() -> None:
    """In a private network namespace (the caller's ``unshare --net``): a veth pair with half
    its IPv4 frames lost, RDMA WRITEs and ACKs alternating; raises unless about half arrive,
    the sender saw no error and the counters hold the rest, each kind in its own."""
    import subprocess
    from .bpfmark import _probe_frame
    subprocess.run("ip link add tbloss0 type veth peer name tbloss1 && ip link set tbloss0 up "
                   "&& ip link set tbloss1 up", shell=True, check=True)
    rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
    rx.bind(("tbloss1", 0))
    rx.setblocking(False)
    loss = LinkLoss({"tbloss0": (0.5, None)})
    loss.open()
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    tx.bind(("tbloss0", 0))
    frames = {}
    for kind, opcode in (("data", roce.RC_RDMA_WRITE_ONLY), ("other", roce.RC_ACKNOWLEDGE)):
        frame = bytearray(_probe_frame(0))
        frame[roce.BTH_OFFSET] = opcode
        frames[kind] = bytes(frame)
    sent, got = 1000, {"data": 0, "other": 0}

    def receive() -> None:
        while True:
            data = rx.recv(2048)
            if data[30:34] == bytes([10, 0, 2, 1]):
                got["data" if data[roce.BTH_OFFSET] == roce.RC_RDMA_WRITE_ONLY
                    else "other"] += 1
    for i in range(sent):
        tx.send(frames["data" if i % 2 else "other"])
        try:  # read as they come: the receive buffer stays short
            receive()
        except BlockingIOError:
            pass
    rx.settimeout(0.5)
    try:
        receive()
    except socket.timeout:
        pass
    lost = loss.lost()["tbloss0"]
    loss.close()
    for kind in got:
        if not (0.35 * sent / 2 < got[kind] < 0.65 * sent / 2
                and got[kind] + lost[kind] == sent / 2):
            raise OSError(0, f"the loss program passed {got[kind]} of {sent // 2} {kind} "
                             f"frames and counted {lost[kind]} lost")
    print(f"ok: passed {got}, lost {lost}")


if __name__ == "__main__":
    selftest()
