"""Training jobs on live fabrics: gradient buckets overlapping the backward pass, servers
whose GPUs talk over the scale-up domain and never over the fabric, and figures that hold
over a factor of 4 in byte scale."""
import csv
import glob
import json
import math
import os
from statistics import median

import pytest

from testbed.api import JobResult, PolicyResult
from testbed.job.bytescale import BUFFER_REGIME
from testbed.job.plan import plan_job
from testbed.run import runner
from testbed.scenario import config
from tests.keytree import keys_before, lost
from tests.tracecheck import check as check_trace
from .live import DEFAULT

pytestmark = pytest.mark.integration

# a small dense model: four layers, a gradient bucket per layer, two micro-batches
DP_JOB = {"model": "custom", "layers": 4, "hidden": 2048, "heads": 16, "seq_len": 2048,
          "vocab": 32000, "micro_batches": 2, "bucket_mb": 50}


def run(tmp_path, policies, **changes):
    scenario = DEFAULT.override(dict(changes, policies=policies))
    result = runner.run(scenario, out_root=str(tmp_path))
    assert result.status == "complete"
    return scenario, result, result.run_dir


def _rows(run_dir, policy, kind):
    out = []
    for path in sorted(glob.glob(os.path.join(run_dir, "records", policy, f"*.{kind}.csv"))):
        with open(path, newline="") as f:
            out += list(csv.DictReader(f))
    return out


def _faithful(p):
    """The monitor accepted the run; a rejection names the checks that failed, with values."""
    assert p.fidelity.verdict == "ok", p.fidelity.problems


def _delivered_every_byte(p):
    moved = p.job.bytes_sent_per_rank
    assert moved.measured == moved.expected
    assert p.rx_unexpected_messages == 0 and p.rx_invalid == 0


def test_a_data_parallel_job_overlaps_its_buckets_with_the_backward_pass(tmp_path):
    scenario, results, run_dir = run(tmp_path, ["hyperscale"],
                                     workload={"iterations": 2, "job": DP_JOB})
    p = results.policy("hyperscale")  # modelled time
    _faithful(p)
    _delivered_every_byte(p)
    # every job figure is written and declared by the API, in jobs[] only
    declared = PolicyResult.json_keys()
    expected = declared - {"latency_us_by_path"}
    assert set(p.to_json()) == expected, set(p.to_json()) ^ expected
    assert [set(j.to_json()) for j in p.jobs] == [JobResult.json_keys()]
    # key by key, what a run of this job wrote before the results were typed end to end
    on_disk = json.load(open(os.path.join(run_dir, "results.json")))
    before = keys_before("job")
    assert lost(before["policy"], on_disk) == set() and lost(before["top"], on_disk, "top") == set()
    assert p.collectives == ()
    assert 0 < p.ideal_iteration_us < p.iteration_us.p50
    assert p.exposed_comm_us["dp"] > 0 and 0 < p.job.exposed_share < 1
    assert p.pipeline_bubble_us == 0
    # on the wire: rank 0's first bucket all-reduce began before its backward pass ended
    spans = [s for s in _rows(run_dir, "hyperscale", "spans")
             if s["rank"] == "0" and s["iteration"] == "0"]
    first_bucket = min(int(s["start_ns"]) for s in spans if s["comm_kind"] == "dp")
    last_backward = max(int(s["end_ns"]) for s in spans if s["name"].startswith("bwd"))
    assert first_bucket < last_backward
    buckets = [s for s in spans if s["comm_kind"] == "dp"]
    assert len(buckets) == DP_JOB["layers"]
    # the trace shows the same: its compute-stream waits and operations.csv's exposed time
    # add up to the exposed communication in the results
    with open(os.path.join(run_dir, "timeline-hyperscale.json")) as f:
        t = json.load(f)
    check_trace(t)
    samples = scenario.workload.iterations * scenario.topology.gpus
    waits = [e for e in t["traceEvents"] if e["ph"] == "X" and e["cat"] == "wait"]
    assert {e["args"]["kind"] for e in waits} >= {"dp"}
    total = p.exposed_comm_us["total"]
    assert sum(e["dur"] for e in waits) / samples == pytest.approx(total, rel=0.01)
    with open(os.path.join(run_dir, "operations.csv")) as f:
        ops = list(csv.DictReader(f))
    assert {r["policy"] for r in ops} == {"hyperscale"}
    assert {r["layer"] for r in ops} >= {f"L{i}" for i in range(DP_JOB["layers"])}
    assert sum(float(r["exposed_us"]) for r in ops) == pytest.approx(total, rel=0.01)
    assert sum(float(r["compute_us"]) for r in ops) == pytest.approx(p.job_compute_us,
                                                                     rel=0.01)


def test_a_server_s_gpus_talk_over_scale_up_and_never_over_the_fabric(tmp_path):
    job = dict(DP_JOB, tp=2, pp=2, micro_batches=4, bucket_mb=100)
    scenario, results, run_dir = run(tmp_path, ["lossless"], workload={
        "iterations": 2, "job": job}, topology={"gpus_per_server": 2,
                                                "layout": "rail-optimized"})
    p = results.policy("lossless")
    _faithful(p)
    _delivered_every_byte(p)
    split = p.job.bytes_per_iteration
    assert set(split["scale_up"]) == {"tp"} and set(split["fabric"]) == {"dp", "pp"}
    server = {r: r // 2 for r in range(8)}
    packets = _rows(run_dir, "lossless", "packets")
    assert packets and all(server[int(r["src"])] != server[int(r["dst"])] for r in packets)
    assert p.pipeline_bubble_us > 0 and p.exposed_comm_us["pp"] > 0


# one 2,048-wide layer, tensor parallel 2, data parallel 4 over the fabric in one bucket on 4
# QPs per peer, as the default job: a QP's message is 3.1 MB at full size, 33 x a shallow
# port buffer
ONE_LAYER = {"model": "custom", "layers": 1, "hidden": 2048, "heads": 16, "seq_len": 2048,
             "vocab": 0, "tp": 2, "micro_batches": 1, "bucket_mb": 100}


def test_a_job_s_full_size_iteration_holds_over_a_factor_of_4_in_byte_scale(tmp_path):
    """At the largest byte scale that keeps a QP's messages BUFFER_REGIME times the buffers
    (8 here) and at a quarter of it (four times the bytes), hyperscale's full-size first
    iteration agrees within 15% and its exposed share within 10%. The smaller run is the
    noisier (at byte scales 5 and 1.25 one run of it spread about +-3% and sat 5-6% above the
    larger one), so it runs three times and its median counts. The GPU NICs run at auto's rate, as a user's run, so a run the monitor rejects goes
    again slower (at 40 Mbit/s, auto's choice here, one run of this job kept the CPUs 95% busy
    at p90: rejected). Lossless holds on average but one run of it spread 13.7-16.7 ms at byte
    scale 5, and enterprise's go-back-N does not hold at this job's scale (68 ms at byte scale
    5, 110 at 1.25): docs/time-scale.md, "Byte scale"; benchmarks/byte_scale.py."""
    # from the built-in itself, at auto: the checks' copy (DEFAULT) fixes the uplinks at 40
    job = config.DEFAULT.override({"policies": ["hyperscale"], "transport": {"qps_per_peer": 4},
                                   "workload": {"iterations": 1, "job": ONE_LAYER}})
    largest = math.floor(plan_job(job.for_checks()).regime.full_size_ratio / BUFFER_REGIME)
    full, share = [], []
    for scale, repeat in ((largest, 3), (largest / 4, 1)):
        result = runner.run(job.override({"repeat": repeat, "workload": {
            "job": dict(ONE_LAYER, byte_scale=scale)}}), out_root=str(tmp_path / str(scale)))
        assert result.status == "complete"
        runs = result.runs("hyperscale")
        assert len(runs) == repeat
        for p in runs:
            assert not p.job_failed, p.job_failed
            _faithful(p)
            assert p.job.buffer_regime.kept, p.job.buffer_regime
        full.append(median(p.job.full_size_iteration_ms_modelled for p in runs))
        share.append(median(p.job.exposed_share for p in runs))
    assert full[1] == pytest.approx(full[0], rel=0.15), full
    assert share[1] == pytest.approx(share[0], rel=0.10), share


def test_a_chakra_trace_written_to_the_published_layout_runs_on_the_fabric(tmp_path):
    from testbed.job import chakra as K
    prefix = str(tmp_path / "trace")
    for r in range(8):
        K.write_trace(f"{prefix}.{r}.et", [
            K.node(1, "fwd", K.COMP, duration_micros=20),
            K.node(2, "grads", K.COMM_COLL, data_deps=[1], comm_type=0, comm_size=2 << 20),
            K.node(3, "act", K.COMM_SEND, data_deps=[1], comm_src=r, comm_dst=(r + 1) % 8,
                   comm_tag=1, comm_size=512 << 10),
            K.node(4, "act in", K.COMM_RECV, comm_src=(r - 1) % 8, comm_dst=r, comm_tag=1,
                   comm_size=512 << 10),
            K.node(5, "bwd", K.COMP, data_deps=[4], duration_micros=40)])
    _, results, _ = run(tmp_path, ["hyperscale"], workload={
        "iterations": 2, "job": {"file": prefix, "byte_scale": 1}})
    p = results.policy("hyperscale")  # modelled time
    _faithful(p)
    _delivered_every_byte(p)
    assert {(o.collective, o.bytes) for o in p.job.operations} == {
        ("ring", 2 << 20), ("send_recv", 512 << 10)}
    assert p.ideal_iteration_us == pytest.approx(60, abs=0.5)
    assert p.iteration_us.p50 > 60


def test_an_aicb_workload_written_to_the_published_layout_runs_on_the_fabric(tmp_path):
    from testbed.job import aicb as A
    # sizes whose messages stay bandwidth-dominated at byte scale 1 (no latency warning)
    rows = (A.Row("attention", (30000, "ALLREDUCE", 1 << 20), (30000, "ALLREDUCE", 1 << 20),
                  (30000, "ALLREDUCE", 4 << 20), 100),
            A.Row("moe", (10000, "ALLTOALL_EP", 1 << 20), (10000, "ALLTOALL_EP", 1 << 20),
                  (30000, "ALLREDUCE_DP_EP", 4 << 20), 100))
    path = str(tmp_path / "workload.txt")
    A.write(A.Workload(tp=2, ep=2, pp=1, ga=2, gpus=8, pp_comm=0, rows=rows), path)
    # the default scenario's rate: 8 lock-step ranks in 4 agents, every frame held by the
    # delay line, woke their timers p95 115-209 us late at 40 Mbit/s (208 allowed)
    _, results, _ = run(tmp_path, ["lossless"], topology={"gpus_per_server": 2,
                                                          "host_rate_mbit": 32},
                        workload={"iterations": 2, "job": {"file": path, "byte_scale": 1}})
    p = results.policy("lossless")  # modelled time
    _faithful(p)
    assert not p.job.byte_scale_warning
    _delivered_every_byte(p)
    split = p.job.bytes_per_iteration
    assert set(split["scale_up"]) == {"tp"} and set(split["fabric"]) == {"dp", "ep"}
    assert p.exposed_comm_us["ep"] > 0


def test_two_jobs_share_the_fabric_each_on_its_own_gpus(tmp_path):
    jobs = [dict(DP_JOB, ranks=[0, 1, 4, 5]), dict(DP_JOB, ranks=[2, 3, 6, 7])]
    _, results, run_dir = run(tmp_path, ["hyperscale"], workload={"iterations": 2,
                                                                 "jobs": jobs})
    p = results.policy("hyperscale").emulated  # as run
    _faithful(p)
    assert [j.job.gpus for j in p.jobs] == [(0, 1, 4, 5), (2, 3, 6, 7)]
    for j in p.jobs:
        moved = j.job.bytes_sent_per_rank
        assert moved.measured == moved.expected and sum(moved.expected.values()) > 0
        assert j.modelled.iteration_us.p50 > j.modelled.ideal_iteration_us > 0
    # the first job's at the top
    assert p.iteration_us == p.jobs[0].iteration_us
    # each job's packets stay among its own GPUs
    first = {0, 1, 4, 5}
    packets = _rows(run_dir, "hyperscale", "packets")
    assert packets and all((int(r["src"]) in first) == (int(r["dst"]) in first)
                           for r in packets)


def _on_rail_servers(tmp_path, **workload):
    """A collective on 4 rail-optimized servers of 2 under hyperscale: its figures (checked
    faithful, every byte delivered) and every packet that crossed the fabric. At 20 Mbit/s:
    what is checked (bytes, rails) does not depend on the rate, and at the reference 40 the
    PXN all-to-all keeps the CPUs 68-79% busy here (three 100 ms samples of traffic), over
    90% on a loaded CI machine."""
    _, results, run_dir = run(tmp_path, ["hyperscale"], workload=dict(workload, iterations=2),
                              topology={"gpus_per_server": 2, "layout": "rail-optimized",
                                        "host_rate_mbit": 20})
    p = results.policy("hyperscale")
    (c,) = p.collectives
    _faithful(p)
    moved = c.bytes_sent_per_rank
    assert moved.measured == moved.expected
    return c, _rows(run_dir, "hyperscale", "packets")


def test_the_hierarchical_all_reduce_reduces_inside_each_server_first(tmp_path):
    """A collective on servers: the hierarchical all-reduce's intra-server phases go over
    scale-up, its per-rail ring over the fabric (GPU j of every server on one leaf). 1 MiB:
    smaller collectives meet the agents' known delay-timer lag."""
    size = 1 << 20
    c, packets = _on_rail_servers(tmp_path, collective="hierarchical", size_bytes=size)
    moved = c.bytes_sent_per_rank
    n = 8  # per rail (4 servers), a ring all-reduce of S/2: 2 x 3/4 x S/2 over the fabric
    assert set(moved.expected.values()) == {2 * 3 * (size // 2) // 4}
    # inside each server: reduce-scatter and all-gather, S/2 from each rank in each
    assert c.scale_up_bytes_per_iteration == n * size
    assert all(int(r["src"]) // 2 != int(r["dst"]) // 2 for r in packets)
    assert all(int(r["src"]) % 2 == int(r["dst"]) % 2 for r in packets)  # one rail each


def test_pxn_keeps_an_all_to_all_on_the_rails(tmp_path):
    """All-to-all over PXN on rail-optimized servers of 2: a block for the other rail of
    another server hops to the sender's server-mate on that rail first, so nothing crosses
    rails over the fabric, and every block still arrives."""
    size = 1 << 20
    c, packets = _on_rail_servers(tmp_path, collective="all_to_all", size_bytes=size, pxn=True)
    moved = c.bytes_sent_per_rank
    block = size // 8
    # per GPU over the fabric: its own block to its rail-mate on each of 3 other servers,
    # and the 3 blocks its server-mate relays to those
    assert set(moved.expected.values()) == {6 * block}
    # over scale-up: the block for its server-mate, and one to relay per other server
    assert c.scale_up_bytes_per_iteration == 8 * 4 * block
    assert packets and all(int(r["src"]) % 2 == int(r["dst"]) % 2 for r in packets)
