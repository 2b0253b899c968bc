"""The emulation cost: CPU per component between two snapshots (pure)."""
from testbed.results.model import EmulationCost
from testbed.results.verdicts import cost_text
from testbed.run.cost import COMPONENTS, Snapshot, breakdown, cost_report

MACHINE0 = dict(user=100.0, nice=0.0, system=50.0, idle=500.0, iowait=0.0, irq=1.0,
                softirq=4.0, steal=0.0)


def _snap(wall, procs, **machine):
    return Snapshot(wall, procs, dict(MACHINE0, **machine))


def test_processes_keep_their_own_time_and_the_kernel_gets_what_nobody_was_charged():
    before = _snap(0.0, {"agents": (1.0, 0.5), "open_vswitch": (2.0, 1.0)})
    after = _snap(10.0, {"agents": (4.0, 1.5), "open_vswitch": (3.0, 2.0)},
                  user=106.0, system=55.0, softirq=6.0)
    cpu = breakdown(before, after)
    assert cpu["agents"] == 4.0 and cpu["open_vswitch"] == 2.0
    # machine kernel time 5 + 2 (softirq) = 7, of which the processes were charged 2
    assert cpu["kernel"] == 5.0
    assert cpu["other"] == 2.0  # user time of no listed process
    assert sum(cpu.values()) == 6.0 + 5.0 + 2.0  # the machine's busy time


def test_a_process_that_started_inside_the_window_counts_from_zero():
    before = _snap(0.0, {"agents": (0.0, 0.0)})
    after = _snap(2.0, {"agents": (1.5, 0.5)}, user=101.5, system=50.5)
    assert breakdown(before, after)["agents"] == 2.0


def test_report_per_frame_and_busy_share():
    before = _snap(0.0, {"agents": (0.0, 0.0), "runner": (0.0, 0.0)})
    after = _snap(2.0, {"agents": (1.0, 0.0), "runner": (0.2, 0.0)}, user=101.2, system=51.0)
    r = cost_report(before, after, frames=1000, cpus=2)
    assert list(r["cpu_s"]) == list(COMPONENTS)
    assert r["us_per_frame"]["agents"] == 1000.0 and r["total_cpu_s"] == 2.2
    assert r["busy_share"] == 0.55 and r["total_us_per_frame"] == 2200.0
    text = cost_text(EmulationCost.from_json(r, strict=True))  # as results.json is read
    assert "2,200 us CPU per frame" in text and "agents 1,000" in text
    none = cost_report(before, after, frames=0, cpus=2)
    assert none["total_us_per_frame"] is None
    assert cost_text(EmulationCost.from_json(none, strict=True)) == "no frames delivered"
