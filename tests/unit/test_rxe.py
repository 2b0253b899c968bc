"""The pure parts of testbed.fabric.rxe: endpoints, routing changes, perftest command and output."""
import os

import pytest

from testbed.fabric import rxe
from testbed.plan.background import rxe_endpoints
from testbed.scenario.config import Scenario
from testbed.base.errors import ConfigError
from testbed.base.topology import FabricPlan

# perftest 4.5's tables, as ib_write_lat and ib_write_bw print them (column widths shortened)
LAT = """
-----------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]  """ \
    """  t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]
 4096    200   10491.18   52081.36   11203.45   11987.02   3321.20   25012.11   52081.36
-----------------------------------------------------------------------------
"""
BW = """
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 4096       200              1.19               1.18                 0.000302
---------------------------------------------------------------------------------------
"""
FAILED = """
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    """ \
    """t_avg[usec]     Completion with error at client
 Failed status 5: wr_id 0 syndrom 0x0
scnt=1, ccnt=0
"""


def test_perftest_tables_parse_to_named_figures():
    lat = rxe.parse_perftest(LAT)
    assert lat["bytes"] == 4096 and lat["iterations"] == 200
    assert lat["t_typical_usec"] == 11203.45 and lat["p99_usec"] == 25012.11
    assert lat["p99_9_usec"] == 52081.36
    bw = rxe.parse_perftest(BW)
    assert bw["bw_average_mb_per_sec"] == 1.18 and bw["msgrate_mpps"] == 0.000302
    assert rxe.parse_perftest(FAILED) is None and rxe.parse_perftest("") is None


def test_endpoints_are_neighbours_on_the_first_and_last_leaf():
    plan = FabricPlan(2, 3, 2, 1)
    a, b = rxe_endpoints(plan)
    assert (a.leaf, b.leaf) == (1, 3) and a.role == b.role == "neighbour"
    with pytest.raises(ConfigError, match="neighbour"):
        rxe_endpoints(FabricPlan(2, 2, 2, 0))


def test_traffic_rxe_adds_a_neighbour_per_leaf():
    s = Scenario.from_dict({"rxe": {"enabled": True}})
    assert s.topology.neighbours_per_leaf == 1
    assert Scenario.from_dict({}).topology.neighbours_per_leaf == 0


def test_traffic_class_is_the_dscp_with_ect0():
    assert rxe.traffic_class(26) == 106 and rxe.traffic_class(0) == 2


def test_root_changes_route_each_way_and_move_the_local_table_last():
    a, b = rxe_endpoints(FabricPlan(1, 2, 1, 1))
    steps = rxe.root_changes(a, b, 4110)
    commands = [c for c, _ in steps]
    assert commands[-2:] == ["ip rule add pref 99 lookup local", "ip rule del pref 0 lookup local"]
    assert f"ip rule add pref 91 from {a.ip} to {b.ip} iif lo lookup 4791" in commands
    assert f"ip rule add pref 91 from {b.ip} to {a.ip} iif lo lookup 4791" in commands
    assert f"ip route replace {b.ip}/32 dev {a.intf} src {a.ip} table 4791" in commands
    assert f"ip rule add pref 90 iif {b.intf} lookup local" in commands
    # every rule added is deleted by its undo, with the same selector
    for command, undo in steps:
        if command.startswith("ip rule add"):
            assert undo == command.replace("ip rule add", "ip rule del")
    # the local rule comes back only if it is missing
    assert "grep -q 'lookup local' ||" in steps[-1][1]


def test_route_clashes_name_a_network_that_holds_an_endpoint():
    routes = [{"dst": "default", "dev": "eth0"}, {"dst": "10.0.2.0/24", "dev": "eth0"},
              {"dst": "127.0.0.0/8", "table": "local", "dev": "lo"},
              {"dst": "192.0.2.5", "table": "local", "dev": "eth0"}]
    assert rxe.route_clashes(routes, ["10.0.1.3", "10.0.3.3"]) == []
    clash = rxe.route_clashes(routes, ["10.0.2.15"])
    assert clash == ["10.0.2.15 is in 10.0.2.0/24 (eth0, table main)"]


def test_the_roce_v2_gid_of_the_address_is_chosen():
    gids = [("fe80:0000:0000:0000:0000:00ff:fe00:0001", "IB/RoCE v1"),
            ("fe80:0000:0000:0000:0000:00ff:fe00:0001", "RoCE v2"),
            ("0000:0000:0000:0000:0000:ffff:0a00:0103", "IB/RoCE v1"),
            ("0000:0000:0000:0000:0000:ffff:0a00:0103", "RoCE v2"), ("", "")]
    assert rxe.roce_v2_ipv4_gid(gids, "10.0.1.3") == 3
    assert rxe.roce_v2_ipv4_gid(gids, "10.0.1.4") is None


def test_perftest_command_lines():
    server = rxe.perftest_command("ib_write_lat", "rxe-nb1", 3, 4096, 200, 18515, 106)
    client = rxe.perftest_command("ib_write_lat", "rxe-nb2", 1, 4096, 200, 18515, 106,
                                  server_ip="10.0.2.3")
    assert server[:5] == ["ib_write_lat", "-d", "rxe-nb1", "-x", "3"]
    assert "--tclass=106" in server and client[-1] == "10.0.2.3" and server[-1] == "-F"


def test_real_perftest_output_from_the_vm_parses():
    """Client logs of a --traffic rxe run in the VM test's guest (perftest 4.5, rxe, 6.1)."""
    data = os.path.join(os.path.dirname(__file__), "data")
    with open(os.path.join(data, "perftest-ib_write_lat.txt")) as f:
        lat = rxe.parse_perftest(f.read())
    with open(os.path.join(data, "perftest-ib_write_bw.txt")) as f:
        bw = rxe.parse_perftest(f.read())
    assert lat["bytes"] == 1024 and lat["iterations"] == 50
    assert 0 < lat["t_min_usec"] <= lat["t_typical_usec"] <= lat["t_max_usec"]
    assert bw["iterations"] == 50 and bw["bw_average_mb_per_sec"] > 0


def test_an_uncalibrated_clock_is_no_result():
    """perftest under qemu TCG: its CPU clock calibration gave up, every figure is inf (a
    client log from the VM guest); the run tries again (testbed.fabric.rxe.ATTEMPTS)."""
    with open(os.path.join(os.path.dirname(__file__), "data", "perftest-uncalibrated.txt")) as f:
        text = f.read()
    assert rxe.CALIBRATION_FAILED in text and rxe.parse_perftest(text) is None


def test_a_calibration_note_inside_the_header_is_skipped():
    """A real client log (VM guest): perftest's note broke the header line in two."""
    with open(os.path.join(os.path.dirname(__file__), "data",
                           "perftest-calibration-note.txt")) as f:
        lat = rxe.parse_perftest(f.read())
    assert lat["t_typical_usec"] == 24681.87 and lat["t_avg_usec"] == 25405.04
    assert lat["t_stdev_usec"] == 3477.93 and lat["p99_9_usec"] == 37459.86


def test_latency_in_cycles_is_converted_with_the_kernels_clock():
    cmd = rxe.perftest_command("ib_write_lat", "rxe-nb2", 1, 1024, 50, 18515, 106,
                               server_ip="10.0.2.3", cycles=True)
    assert cmd[-2:] == ["-C", "10.0.2.3"]
    assert "-C" not in rxe.perftest_command("ib_write_lat", "rxe-nb1", 1, 1024, 50, 1, 106)
    cpuinfo = "processor\t: 0\nmodel name\t: QEMU Virtual CPU\ncpu MHz\t\t: 2495.998\n"
    assert rxe.cpu_mhz(cpuinfo) == 2495.998 and rxe.cpu_mhz("processor\t: 0\n") is None
    # -C keeps perftest's [usec] headers: the values are cycles
    cycles = {"bytes": 1024.0, "iterations": 50.0, "t_min_usec": 2_496_000.0,
              "t_typical_usec": 4_992_000.0, "p99_usec": 7_488_000.0}
    usec = rxe.cycles_to_usec(cycles, 2496.0)
    assert usec == {"bytes": 1024.0, "iterations": 50.0, "t_min_usec": 1000.0,
                    "t_typical_usec": 2000.0, "p99_usec": 3000.0}


def test_a_real_cycles_report_parses_and_converts():
    """ib_write_lat -C in the VM guest: cycles under [usec] headers, stdev -nan."""
    with open(os.path.join(os.path.dirname(__file__), "data",
                           "perftest-ib_write_lat-cycles.txt")) as f:
        cycles = rxe.parse_perftest(f.read())
    assert cycles["t_typical_usec"] == 62038366.0 and cycles["t_stdev_usec"] is None
    usec = rxe.cycles_to_usec(cycles, 2496.0)
    assert round(usec["t_typical_usec"]) == 24855 and usec["t_stdev_usec"] is None


def test_what_a_run_reports_is_the_typed_record_results_json_declares(tmp_path):
    """RxeTraffic.run's report, perftest's runs stubbed (one uncalibrated then measured, one
    failed), loads strictly as the policy's ``rxe``: every key the run adds is declared."""
    from types import SimpleNamespace
    from testbed.results.model import PolicyResult, Rxe

    t = object.__new__(rxe.RxeTraffic)
    t.a, t.b = SimpleNamespace(name="gpu1", intf="a"), SimpleNamespace(name="gpu3", intf="b")
    t.cfg = SimpleNamespace(size_bytes=1024, lat_iterations=5, bw_iterations=5)
    t.out_dir, t.tclass, t.mhz = str(tmp_path / "rxe"), 106, 2000.0
    t._gid = lambda host: 1
    t._counters = lambda: {"a_tx": 0, "b_rx": 0, "b_tx": 0, "a_rx": 0}
    runs = iter([
        {"command": "ib_write_lat", "exit_code": 0, "results": {"t_typical_usec": float("inf")},
         "log": "x", "error": "ib_write_lat failed", "uncalibrated": True},
        {"command": "ib_write_lat", "exit_code": 0, "results": {"t_typical_usec": 41.2},
         "log": "x", "clock": {"cycles_per_usec": 2000.0, "source": "cpuinfo"}},
        {"command": "ib_write_bw", "exit_code": 1, "results": None, "log": "y",
         "error": "ib_write_bw failed (exit 1)", "uncalibrated": False}])
    t._attempt = lambda test, n, gids: next(runs)
    report = t.run()
    p = PolicyResult.from_json({"rxe": report}, strict=True)
    assert p.rxe.tests["ib_write_lat"].attempts == 2
    assert p.rxe.figure("ib_write_lat", "t_typical_usec") == 41.2
    assert p.rxe.figure("ib_write_bw", "bw_average_mb_per_sec") == "failed"
    assert p.rxe.endpoints == ("gpu1", "gpu3") and p.to_json()["rxe"]["tests"] == \
        report["tests"]
    # the runner's warnings read the same record: one line per failed test
    from testbed.run.runner import rxe_warnings
    assert rxe_warnings(Rxe.from_json(report, "rxe", strict=True)) == [
        "rxe: ib_write_bw failed (exit 1)"]
    assert rxe_warnings(None) == []
    # the record the runner hands over stands in the figures as the report would
    assert PolicyResult.from_json({"rxe": p.rxe}, strict=True).to_json()["rxe"] == \
        p.to_json()["rxe"]
