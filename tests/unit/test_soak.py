"""The soak benchmark's verdict (benchmarks/soak.py): growth between runs is a leak."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("soak", os.path.join(ROOT, "benchmarks",
                                                                   "soak.py"))
soak = importlib.util.module_from_spec(spec)
spec.loader.exec_module(soak)


def row(run, rss=100_000, fds=10, ovs=50_000, ifaces=3, procs=0):
    return {"run": run, "runner_rss_kb": rss, "runner_fds": fds, "runner_threads": 2,
            "ovs_vswitchd_rss_kb": ovs, "net_namespaces": 1, "interfaces": ifaces,
            "testbed_bridges": 0, "ovs_ports": 0, "testbed_processes": procs}


def test_steady_runs_pass_and_the_first_runs_memory_warm_up_is_ignored():
    rows = [row(1, rss=60_000), row(2), row(3, rss=100_500), row(4, rss=100_800)]
    assert soak.verdict(rows) == []


def test_growth_in_any_resource_is_named():
    rows = [row(1), row(2), row(3, fds=11, rss=110_000), row(4, fds=12, rss=120_000,
                                                            ifaces=5, procs=1)]
    problems = soak.verdict(rows)
    assert "runner_fds grew from 10 to 12" in problems
    assert "interfaces grew from 3 to 5" in problems
    assert "testbed_processes grew from 0 to 1" in problems
    assert any(p.startswith("runner memory grew 10,000 kB per run") for p in problems)
    assert soak.verdict(rows[:2]) == ["too few runs to judge (need 3; give more --minutes)"]
