"""Commands for a remote node's shell are cut into lines a terminal takes
(testbed.fabric.network)."""
from testbed.fabric.network import remote_lines


def test_an_and_chain_splits_between_commands_and_keeps_them_all():
    cmd = " && ".join(f"tc qdisc replace dev lf1-eth{i} root handle 1: htb default 30"
                      for i in range(80))
    lines = remote_lines(cmd, 500)
    assert len(lines) > 1 and all(len(line) <= 500 for line in lines)
    assert " && ".join(lines) == cmd


def test_a_long_sysctl_splits_between_settings():
    names = [f"net.ipv6.conf.lf{i}-eth{j}.disable_ipv6=1" for i in range(10) for j in range(8)]
    lines = remote_lines("sysctl -qw " + " ".join(names), 400)
    assert all(line.startswith("sysctl -qw ") and len(line) <= 400 for line in lines)
    assert [w for line in lines for w in line.split()[2:]] == names


def test_short_commands_stay_whole():
    assert remote_lines("ip link set lf1 up") == ["ip link set lf1 up"]
