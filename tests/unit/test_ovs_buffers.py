from testbed.fabric import ovs_buffers

SS = """\
Netid State Recv-Q Send-Q Local Address:Port Peer Address:PortProcess
p_raw UNCONN 0 0 [0]:* * users:(("ovs-vswitchd",pid=6062,fd=88))
\tver:0 skmem:(r0,rb212992,t0,tb4194304,f0,w0,o0,bl0,d0)
p_raw UNCONN 0 0 *:lf1-eth1 * users:(("ovs-vswitchd",pid=6062,fd=90))
\tver:0 skmem:(r0,rb5242880,t0,tb212992,f0,w0,o0,bl0,d0)
p_raw UNCONN 0 0 *:eth0 * users:(("dhclient",pid=1,fd=3)) ino:3 sk:3
\tver:0 skmem:(r0,rb1,t0,tb1,f0,w0,o0,bl0,d0)
"""


def test_parse_ss_finds_ovs_sockets_only():
    socks = ovs_buffers.parse_ss(SS)
    assert socks == [{"local": "[0]:*", "rcvbuf": 212992, "sndbuf": 4194304},
                     {"local": "*:lf1-eth1", "rcvbuf": 5242880, "sndbuf": 212992}]


def test_needed_bytes_covers_all_switch_buffers():
    assert ovs_buffers.needed_bytes(1000) == 64 << 20
    assert ovs_buffers.needed_bytes(30 * 1_000_000) == 73 << 20


def test_socket_defaults_are_raised_then_restored(tmp_path, monkeypatch):
    w, r = tmp_path / "wmem", tmp_path / "rmem"
    w.write_text("212992\n")
    r.write_text("9999999\n")
    monkeypatch.setattr(ovs_buffers, "SYSCTLS", (str(w), str(r)))
    with ovs_buffers.raised_socket_defaults(4 << 20):
        assert int(w.read_text()) == 4 << 20
        assert int(r.read_text()) == 9999999  # never lowered
    assert w.read_text() == "212992"


def test_restored_after_an_error(tmp_path, monkeypatch):
    w = tmp_path / "wmem"
    w.write_text("100")
    monkeypatch.setattr(ovs_buffers, "SYSCTLS", (str(w),))
    try:
        with ovs_buffers.raised_socket_defaults(200):
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert w.read_text() == "100"


def test_a_value_changed_by_someone_else_is_not_restored(tmp_path):
    w = tmp_path / "wmem"
    w.write_text("777")
    assert not ovs_buffers.restore_sysctl(str(w), 100, 5000)
    assert w.read_text() == "777"
    w.write_text("5000")
    assert ovs_buffers.restore_sysctl(str(w), 100, 5000)
    assert w.read_text() == "100"


def test_changes_are_recorded_before_they_are_made(tmp_path, monkeypatch):
    w = tmp_path / "wmem"
    w.write_text("100")
    monkeypatch.setattr(ovs_buffers, "SYSCTLS", (str(w),))
    seen = []

    def record(path, old, new):
        seen.append((path, old, new, w.read_text()))

    with ovs_buffers.raised_socket_defaults(200, record=record):
        pass
    assert seen == [(str(w), 100, 200, "100")]
