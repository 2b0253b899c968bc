"""Socket buffers of the userspace Open vSwitch datapath, sized so that OVS itself drops nothing.

With the userspace (netdev) datapath, ovs-vswitchd sends every packet to every port through
ONE shared AF_PACKET socket (``af_packet_sock()`` in lib/netdev-linux.c), created the first time
it forwards a packet, with the kernel's default send buffer (``net.core.wmem_default``, usually
208 KiB). Packets waiting in the shaped egress queues of all switch ports are charged to that one
buffer; once it is full, OVS gets EAGAIN and silently drops the packet - outside any emulated
switch buffer (measured here: 1,177 of 143,360 packets lost in a 10-iteration run of 8 GPUs at
20 Mbit/s with 1 KiB packets; none with a large enough buffer). Each port's receive socket has
the same problem with ``rmem_default``.

So, while the fabric is built and its first packet forwarded, the runner raises the two defaults
to what the scenario's buffers need, then restores them. A socket created earlier (by a run of
an older version, or any other user of this OVS) keeps its size: that is detected with ``ss``
and reported, never assumed away.
"""
from __future__ import annotations

import contextlib
import re
import subprocess
from typing import Dict, List, Optional

from ..base.ledger import restore_sysctl

SYSCTLS = ("/proc/sys/net/core/wmem_default", "/proc/sys/net/core/rmem_default")
TRUESIZE_FACTOR = 2.5  # kernel memory charged per byte of frame (skb overhead, slab rounding)
MARGIN = 1 << 20


# OVS keeps its socket for its lifetime: size it for later scenarios too (the default
# scenario's lossless fabric needs 37 MiB: its RoCE buffers hold 15 ms of PFC headroom)
MINIMUM = 64 << 20


def needed_bytes(total_switch_buffer_bytes: int) -> int:
    """Send buffer that holds every switch egress queue full at once, rounded up to 1 MiB,
    and at least ``MINIMUM`` (a limit, not an allocation)."""
    need = int(total_switch_buffer_bytes * TRUESIZE_FACTOR) + MARGIN
    return max(MINIMUM, (need + (1 << 20) - 1) // (1 << 20) * (1 << 20))


@contextlib.contextmanager
def raised_socket_defaults(nbytes: int, record=lambda path, old, new: None):
    """Raise wmem_default and rmem_default to at least ``nbytes``; restore them on exit.

    ``record(path, old, new)`` is called before each change, so that a runner killed inside
    the block leaves a note for ``testbed clean`` to restore the value.
    """
    saved = {}
    try:
        for path in SYSCTLS:
            with open(path) as f:
                old = int(f.read())
            if old < nbytes:
                record(path, old, nbytes)
                saved[path] = old
                with open(path, "w") as f:
                    f.write(str(nbytes))
        yield
    finally:
        for path, old in saved.items():
            restore_sysctl(path, old, nbytes)


_SKMEM = re.compile(r"skmem:\(r\d+,rb(\d+),t\d+,tb(\d+)")


def parse_ss(text: str) -> List[Dict[str, object]]:
    """``ss -0 -a -e -m -p`` output -> ovs-vswitchd packet sockets with their buffer sizes."""
    sockets = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if '"ovs-vswitchd"' not in line:
            continue
        fields = line.split()
        local = fields[4] if len(fields) > 4 else ""
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        m = _SKMEM.search(line) or _SKMEM.search(nxt)
        if m:
            sockets.append({"local": local, "rcvbuf": int(m.group(1)), "sndbuf": int(m.group(2))})
    return sockets


def ovs_socket_buffers() -> Optional[Dict[str, object]]:
    """The shared send socket's buffer and the smallest receive buffer of ovs-vswitchd."""
    try:
        out = subprocess.run(["ss", "-0", "-a", "-e", "-m", "-p"], capture_output=True,
                             text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    sockets = parse_ss(out)
    if not sockets:
        return None
    tx = [s["sndbuf"] for s in sockets if str(s["local"]).startswith("[0]")]
    rx = [s["rcvbuf"] for s in sockets if not str(s["local"]).startswith("[0]")]
    return {"tx_sndbuf": max(tx) if tx else None, "rx_rcvbuf_min": min(rx) if rx else None,
            "sockets": len(sockets)}
