"""Link shaping with tc: an HTB rate limit and a byte-limited FIFO per egress interface.

Every switch egress port and every GPU NIC gets::

    htb root 1:  ->  class 1:1 (rate = ceil = link rate)  ->  [netem delay]  ->  bfifo limit B

The bfifo is the port's buffer: a tail-drop byte FIFO whose drops the kernel counts. netem is
added only when the kernel has it and a delay is asked for (Mininet's own ``max_queue_size``
needs netem, so the queue limit is set here instead). Open vSwitch resets the qdisc of a port
when the port is added to a bridge, so shaping is applied after the switches have started.

These commands run once per interface at set-up, so they use the ``tc`` tool; anything that
runs per sample reads the kernel over netlink instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

HTB_QUANTUM = 1600  # bytes; >= one frame, avoids HTB's "quantum is big" at low rates
NETEM_LIMIT = 100_000  # packets in flight on a delayed link; the bfifo below is the buffer


@dataclass(frozen=True)
class Shape:
    """Egress shaping of one interface."""

    rate_mbit: float
    buffer_bytes: int
    delay_us: float = 0.0

    def burst_bytes(self) -> int:
        """HTB burst: two full frames or 1 ms at the link rate, whichever is larger."""
        return max(2 * HTB_QUANTUM, int(self.rate_mbit * 1e6 / 8 / 1000))


def tc_commands(intf: str, shape: Shape, netem: bool, mtu: int = 1500) -> List[str]:
    """The tc commands that shape ``intf`` (pure; the caller runs them in the right netns)."""
    rate_kbit = max(1, int(round(shape.rate_mbit * 1000)))
    frame = mtu + 14
    quantum = max(HTB_QUANTUM, frame)
    burst = max(shape.burst_bytes(), 2 * frame)
    cmds = [
        f"tc qdisc replace dev {intf} root handle 1: htb default 1",
        f"tc class replace dev {intf} parent 1: classid 1:1 htb rate {rate_kbit}kbit "
        f"ceil {rate_kbit}kbit burst {burst} cburst {burst} quantum {quantum}",
    ]
    if shape.delay_us > 0 and netem:
        cmds += [f"tc qdisc replace dev {intf} parent 1:1 handle 10: netem "
                 f"delay {shape.delay_us:.0f}us limit {NETEM_LIMIT}",
                 f"tc qdisc replace dev {intf} parent 10:1 handle 20: bfifo "
                 f"limit {shape.buffer_bytes}"]
    else:
        cmds.append(f"tc qdisc replace dev {intf} parent 1:1 handle 10: bfifo "
                    f"limit {shape.buffer_bytes}")
    return cmds


def buffer_handle(shape: Shape, netem: bool) -> str:
    """tc handle of the bfifo that is the port's buffer."""
    return "20:" if shape.delay_us > 0 and netem else "10:"


def delay_applied(shape: Shape, netem: bool) -> Optional[float]:
    """The delay really configured on the link (None: asked for but impossible here)."""
    if shape.delay_us <= 0:
        return 0.0
    return shape.delay_us if netem else None
