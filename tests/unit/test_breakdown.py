"""operations.csv: per layer and kind, compute, exposed and total communication per GPU and
iteration in modelled time, from the records' spans."""
import csv
import io

from testbed.results import breakdown
from traffic import collectives
from traffic.jobgraph import COMM, COMPUTE, Op
from tests.unit.test_trace import SCALE, _records

PROGRAM = (Op(COMPUTE, "fwd L0"), Op(COMM, "dp bucket 0", "dp", after=(0,), comm=0),
           Op(COMM, "dp bucket 1", "dp", after=(0,), comm=1),
           Op(COMPUTE, "step", after=(1, 2)))


def test_the_wait_before_the_step_is_exposed_communication_of_the_bucket_it_waited_for():
    spans, its, _waits = _records(iterations=1)
    rows = breakdown.rows("job", spans, its, lambda rank, workload: PROGRAM, SCALE)
    by = {(r["layer"], r["kind"]): r for r in rows}
    assert set(by) == {("L0", "compute"), ("", "compute"), ("", "dp")}
    assert by[("L0", "compute")]["compute_us"] == 0.1  # 100 us emulated / 1000
    assert by[("", "compute")]["compute_us"] == 0.02
    dp = by[("", "dp")]
    assert dp["count"] == 4 and dp["comm_us"] == 0.6  # two 300 us ops per GPU
    assert dp["exposed_us"] == 0.4  # compute waited 100 -> 500 us for bucket 1
    assert dp["time_us_p50"] == 0.3
    factor = collectives.bus_bandwidth_factor(collectives.KINDS["ring"], 2)
    assert dp["busbw_gbps"] == round(dp["algbw_gbps"] * factor, 3)
    assert by[("L0", "compute")]["exposed_us"] == 0


def test_the_csv_has_one_header_and_every_policys_rows():
    spans, its, _waits = _records(iterations=1)
    rows = breakdown.rows("job", spans, its, lambda rank, workload: PROGRAM, SCALE)
    text = breakdown.csv_text({"hyperscale": rows, "lossless": rows})
    read = list(csv.DictReader(io.StringIO(text)))
    assert tuple(read[0]) == breakdown.COLUMNS
    assert [r["policy"] for r in read] == ["hyperscale"] * 3 + ["lossless"] * 3
    assert read[0]["time_us_p50"] == ""  # a compute row has no communication time
