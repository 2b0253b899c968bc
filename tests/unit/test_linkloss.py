"""The link-loss program's bytecode and the scenario keys that ask for loss (pure;
tests/integration/test_linkloss.py runs it on a veth)."""
import pytest

from testbed.base.errors import ConfigError
from testbed.fabric import linkloss
from testbed.fabric.bpf import INSN
from testbed.scenario.config import DEFAULT


def insns(code: bytes):
    return [INSN.unpack_from(code, i) for i in range(0, len(code), INSN.size)]


def test_the_threshold_is_the_drop_rate_of_the_32_bit_random_range():
    assert linkloss.threshold(0.01) == round(0.01 * 2**32)
    assert linkloss.threshold(0.0) == 0
    assert linkloss.threshold(0.5) == 2**31 - 1  # a jump's immediate is signed 32-bit


def test_a_packet_passes_when_the_random_value_reaches_the_threshold_else_is_stolen():
    code = insns(linkloss.program(0.25, 7, 3))
    (draw,) = [i for i, (op, *_r, imm) in enumerate(code) if op == 0x85 and imm == 7]
    op, regs, off, imm = code[draw + 1]
    assert (op, regs & 0xF, imm) == (0x35, 0, linkloss.threshold(0.25))  # r0 >= threshold
    assert code[draw + 2 + off][3] == linkloss.TC_ACT_UNSPEC  # ... goes on unharmed
    assert code[-4][3] == linkloss.TC_ACT_STOLEN and code[-3][0] == 0x95
    slots = {imm for op, regs, _off, imm in code if op == 0xB7 and regs == 7}
    assert slots == {6, 7}  # RoCE data and everything else counted apart


def test_lossy_links_are_named_by_their_two_nodes_and_checked():
    s = DEFAULT.override({"topology": {"lossy_links": [{"link": "sp2-lf3",
                                                         "drop_rate": 0.001}]}})
    assert s.topology.lossy_links[0].drop_rate == 0.001
    with pytest.raises(ConfigError, match=r"lossy_links\[0\].link: 'lf1-lf2' is no link"):
        DEFAULT.override({"topology": {"lossy_links": [{"link": "lf1-lf2"}]}})
    with pytest.raises(ConfigError, match="named twice"):
        DEFAULT.override({"topology": {"lossy_links": [{"link": "lf1-sp1"},
                                                        {"link": "sp1-lf1"}]}})
    with pytest.raises(ConfigError, match="drop_rate"):
        DEFAULT.override({"topology": {"lossy_links": [{"link": "lf1-sp1",
                                                        "drop_rate": 0.9}]}})


def test_go_back_0_refuses_sprayed_packets():
    assert DEFAULT.override({"transport": {"retransmission": "go-back-0"}}).transport \
        .retransmission == "go-back-0"
    with pytest.raises(ConfigError, match="go-back-0"):
        DEFAULT.override({"transport": {"retransmission": "go-back-0",
                                        "entropy": "per-packet"}})
