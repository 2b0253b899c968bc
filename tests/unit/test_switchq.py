import dataclasses
import json

import pytest

from testbed.base.contract import ContractError
from testbed.switchq.contract import EmulatorReport
from testbed.switchq.handle import merge_reports


def report(scheduling, gap, late, pauses, **more):
    return EmulatorReport(interval_us=1000.0, scheduling=scheduling,
                          counters={"samples": 100, "late": late},
                          sample_ms={"mean": 0.2, "p99": 0.4, "max": 0.6, "max_gap": gap},
                          pfc_pause_events=pauses, pfc_paused_ms=1.5, **more)


def test_split_fabric_reports_merge_with_the_worst_gap_and_every_scheduling():
    merged = merge_reports([report("nice -10", 2.1, 1, 3, gpu_pauses_ns={"gpu1": ((1, 2),)}),
                            report("normal", 9.5, 4, 2, gpu_pauses_ns={"gpu3": ((5, 9),)})])
    assert merged.scheduling == "nice -10, normal"
    assert merged.sample_ms["max_gap"] == 9.5
    assert merged.counters == {"samples": 200, "late": 5}
    assert merged.pfc_pause_events == 5 and merged.pfc_paused_ms == 3.0
    assert merged.gpu_pauses_ns == {"gpu1": ((1, 2),), "gpu3": ((5, 9),)}
    assert merged.servers == 2
    waits = [report("normal", 1.0, 0, 0, credit={"lf1-eth1": {"waits": 2}},
                    credit_waits=2, credit_wait_ms=0.5) for _ in range(2)]
    merged = merge_reports(waits)
    assert merged.credit_waits == 4 and merged.credit_wait_ms == 1.0
    lanes = [report("normal", 1.0, 0, 0, lanes={
        "cnp": {"flow_control": "credit", "holds_above_bytes": 96_000, "buffer_bytes": 500_000,
                "holds": n, "held_ms": 0.25 * n},
        "roce": {"flow_control": "credit", "holds_above_bytes": 128_000,
                 "buffer_bytes": 532_000, "holds": 10 * n, "held_ms": 2.0}}) for n in (1, 2)]
    merged = merge_reports(lanes).lanes  # each lane adds up on its own
    assert (merged["cnp"]["holds"], merged["cnp"]["held_ms"]) == (3, 0.75)
    assert (merged["roce"]["holds"], merged["roce"]["held_ms"]) == (30, 4.0)
    assert merged["roce"]["buffer_bytes"] == 532_000


def test_one_report_is_kept_as_it_is_and_none_is_an_empty_one():
    one = report("nice -10", 2.1, 1, 3)
    assert merge_reports([one, None]) is one
    assert merge_reports([None]).servers == 0


def test_the_emulators_report_is_a_contract():
    """Written by the emulator, read by the runner: JSON round trip, and an undeclared key
    (a writer's bug) refused with its name."""
    one = report("nice -10", 2.1, 1, 3, gpu_pauses_ns={"gpu1": ((1, 2), (4, 8))})
    assert EmulatorReport.from_dict(json.loads(json.dumps(one.to_dict()))) == one
    with pytest.raises(ContractError, match="queue_depth: not declared"):
        EmulatorReport.from_dict(dict(one.to_dict(), queue_depth=1))
    assert dataclasses.replace(one, servers=3).to_dict()["servers"] == 3


def test_the_timeline_keeps_each_windows_largest_backlogs():
    from testbed.switchq.record import Timeline
    timeline = Timeline(["a", "b"], window_ns=10)  # the recorder alone: no fabric
    for now, backlog in [(100, [1, 5]), (105, [3, 2]), (110, [0, 0]), (115, [7, 1]),
                         (121, [0, 0])]:
        timeline.add(backlog, (), now)
    assert [(t, v) for t, v, _paused in timeline.windows] == [(100, [3, 5]), (110, [7, 1])]
