"""The marking program's bytecode and messages (pure; tests/integration/test_bpfmark.py runs
it on a veth)."""
import socket
import struct

from testbed.fabric import bpfmark
from testbed.base.netlink import NLMSGHDR, TCMSG
from testbed.plan.marking import marking_via


def insns(code: bytes):
    return [bpfmark.INSN.unpack_from(code, i) for i in range(0, len(code), bpfmark.INSN.size)]


def test_every_jump_lands_on_the_exit_block():
    code = insns(bpfmark.program(7))
    exit_at = len(code) - 2  # r0 = TC_ACT_UNSPEC (the next filter); exit
    assert code[exit_at][0] == 0xB7 and code[exit_at][3] == bpfmark.TC_ACT_UNSPEC
    assert code[-1][0] == 0x95
    jumps = [(i, off) for i, (op, _r, off, _imm) in enumerate(code) if op in (0x15, 0x55)]
    assert len(jumps) >= 8
    assert all(i + 1 + off == exit_at for i, off in jumps)


def test_the_map_is_referenced_by_its_descriptor():
    code = insns(bpfmark.program(42))
    (at,) = [i for i, (op, *_rest) in enumerate(code) if op == 0x18]
    op, regs, _off, imm = code[at]
    assert regs >> 4 == 1 and imm == 42  # BPF_PSEUDO_MAP_FD
    assert code[at + 1] == (0, 0, 0, 0)  # the second half of ld_imm64


def test_dscp_set_and_checksum():
    assert bpfmark.dscp_set([26, 0]) == (1 << 26) | 1
    frame = bpfmark._probe_frame(26 << 2 | 2)
    assert bpfmark.ip_checksum(frame[14:34]) == 0  # a valid header sums to zero


def test_filter_message_attaches_to_clsact_egress_with_direct_action():
    msg = bpfmark.filter_message(5, 9)
    length, kind, flags, _seq, _pid = NLMSGHDR.unpack_from(msg)
    assert length == len(msg) and kind == bpfmark.RTM_NEWTFILTER
    _fam, ifindex, _handle, parent, info = TCMSG.unpack_from(msg, NLMSGHDR.size)
    assert ifindex == 5 and parent == 0xFFFFFFF3
    assert info & 0xFFFF == socket.htons(bpfmark.ETH_P_ALL)
    assert b"bpf\0" in msg and struct.pack("=I", 9) in msg


def test_sampled_marking_is_applied_by_bpf_where_it_runs():
    assert marking_via("sampled", True) == "bpf"
    assert marking_via("sampled", False) == "openflow"
    assert marking_via("red", True) is None and marking_via(None, True) is None
