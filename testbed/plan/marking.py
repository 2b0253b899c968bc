"""Who sets CE on this machine, decided once per policy (pure): the kernel's RED qdisc, or the
switch-queue emulator from sampled backlogs - applied by a tc BPF program where it runs, else by
the controller's OpenFlow marking groups (docs/fabric.md, "RED marking")."""
from __future__ import annotations

from typing import Optional

from ..base.errors import ConfigError


def marking_method(setting: str, red_available: bool, classes, datapath: str) -> Optional[str]:
    """How the switches set CE for these classes: "red", "sampled", or None (no ECN class).

    RED tail-drops at its limit, which the userspace datapath cannot take on a lossy class
    (``testbed.fabric.shaping``: a lossy class drops the oldest frame instead), so there it is
    used only for lossless classes. ``setting`` "red" where RED cannot be used is an error,
    "auto" falls back to "sampled"."""
    ecn = [c for c in classes if c.ecn]
    if not ecn:
        return None
    usable = red_available and (datapath == "kernel" or all(c.lossless for c in ecn))
    if setting == "sampled" or (setting == "auto" and not usable):
        return "sampled"
    if not usable:
        why = ("the kernel has no RED qdisc (sch_red with nodrop)" if not red_available else
               "RED tail-drops a lossy class, which the userspace datapath cannot take; "
               "load the openvswitch module for the kernel datapath")
        raise ConfigError(f"emulation.ecn_marking: red is not possible here: {why}")
    return "red"


def marking_via(marking: Optional[str], bpf_available: bool) -> Optional[str]:
    """What applies sampled marking: "bpf" (the kernel program of ``testbed.fabric.bpfmark``, where
    it runs) or "openflow" (the controller's marking groups, which reorder a flow's marked
    and unmarked packets on a loaded machine - see bpfmark); None for RED or no ECN."""
    if marking != "sampled":
        return None
    return "bpf" if bpf_available else "openflow"
