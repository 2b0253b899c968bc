"""Training jobs as graphs: the model's schedule, proven by replay without packets."""
from dataclasses import replace

import pytest

from testbed.base.errors import ConfigError
from testbed.job.build import Parallelism, Placement, build
from testbed.job.model import PRESETS, GpuModel, Model
from traffic import collectives as C
from traffic import jobgraph as J

SMALL = Model("small", layers=4, hidden=256, heads=4, seq_len=128, vocab=0)
MOE = Model("moe", layers=2, hidden=256, heads=4, seq_len=128, vocab=0, experts=4, top_k=2)
GPU = GpuModel(100.0, 0.5)


def _free(graph):
    """Replay with free communication: the compute model's iteration."""
    return J.replay(graph, lambda r, op: op.ns, lambda comm: 0)


def _per_mb(model, par, passes="fb"):
    """One stage's compute per micro-batch (forward, backward or both), modelled ns."""
    tokens = par.micro_batch_size * model.seq_len
    fwd = (model.attention_flops(tokens) + model.mlp_flops(tokens)) * model.layers / par.pp
    return sum(GPU.ns((1 if p == "f" else 2) * fwd / par.tp) for p in passes)


@pytest.mark.parametrize("par", [Parallelism(dp=4), Parallelism(dp=2, tp=2),
                                 Parallelism(dp=2, tp=2, pp=2, micro_batches=4),
                                 Parallelism(pp=4, micro_batches=6)])
def test_with_free_communication_the_iteration_takes_the_compute_model_s_time(par):
    """Data and tensor parallelism: every rank's compute back to back. 1F1B on p stages and m
    micro-batches: (m + p - 1) forward-and-backward times of one stage."""
    g = build(SMALL, par, GPU)
    expected = (par.micro_batches + par.pp - 1) * _per_mb(SMALL, par)
    assert _free(g).end == pytest.approx(expected, rel=1e-3, abs=200)


def test_every_rank_runs_the_1f1b_order_of_its_stage():
    par = Parallelism(pp=4, micro_batches=6)
    g = build(SMALL, par, GPU)
    for r, stage in ((0, 0), (3, 3)):
        passes = [op.name.split()[0] + op.name.split()[-1] for op in g.programs[r]
                  if op.kind == J.COMPUTE and "attn" in op.name and "L%d " % (stage * 1) in
                  op.name + " "]
        warm = 4 - stage - 1
        assert passes[:warm] == [f"fwdmb{i}" for i in range(warm)]
        assert passes[warm:warm + 2] == [f"fwdmb{warm}", "bwdmb0"]
        assert passes[-1] == "bwdmb5"


def test_gradient_buckets_overlap_the_rest_of_the_backward_pass():
    """With communication costing something, the first bucket's all-reduce runs while earlier
    layers still compute: the iteration is shorter than compute plus every all-reduce."""
    par = Parallelism(dp=4, bucket_bytes=1)  # a bucket per layer
    g = build(SMALL, par, GPU)
    comm_ns = 50_000
    t = J.replay(g, lambda r, op: op.ns, lambda comm: comm_ns)
    dp = [c for c in g.comms if c.kind == "dp"]
    assert len(dp) == SMALL.layers
    compute = _per_mb(SMALL, par)
    assert compute + comm_ns <= t.end < compute + len(dp) * comm_ns


def test_the_job_s_communication_is_placed_as_megatron_places_it():
    par = Parallelism(dp=2, tp=4, pp=2, micro_batches=2)
    g = build(SMALL, par, GPU)
    place = Placement(par)
    assert place.tp_group(5) == (4, 5, 6, 7)  # a server of 4
    assert place.dp_group(5) == (1, 5)  # the same GPU of the next server: along the rail
    assert place.stage_peer(5, 1) == 13
    kinds = {c.kind: c for c in g.comms}
    assert set(kinds) == {"tp", "pp", "dp"}
    assert all(len(c.group) == 4 for c in g.comms if c.kind == "tp")
    assert {c.collective for c in g.comms if c.kind == "pp"} == {"send_recv"}


def test_moe_layers_all_to_all_twice_each_way_in_the_expert_group():
    par = Parallelism(dp=4, ep=2, micro_batches=1)
    g = build(MOE, par, GPU)
    ep = [c for c in g.comms if c.kind == "ep"]
    assert len(ep) == MOE.layers * 4 * 2  # dispatch and combine, both ways, 2 EP groups
    assert {c.group for c in ep} == {(0, 1), (2, 3)}
    assert {c.collective for c in ep} == {"all_to_all"}


@pytest.mark.parametrize("par,model", [(Parallelism(dp=2, tp=2, pp=2, micro_batches=2), SMALL),
                                       (Parallelism(dp=2, ep=2), MOE)])
def test_removing_any_dependency_is_detected(par, model):
    g = build(replace(model, layers=2), par, GPU)
    edges = 0
    for r in (0, len(g.programs) - 1):
        for i, op in enumerate(g.programs[r]):
            for j in op.after:
                broken = list(g.programs)
                prog = list(broken[r])
                prog[i] = replace(op, after=tuple(k for k in op.after if k != j))
                broken[r] = tuple(prog)
                with pytest.raises(C.ScheduleError):
                    J.check(replace(g, programs=tuple(broken)))
                edges += 1
    assert edges > 20


def test_every_communication_of_a_job_leaves_the_right_data():
    g = build(MOE, Parallelism(dp=4, tp=2, ep=2, micro_batches=1, chunks=2), GPU)
    shapes = {(c.collective, len(c.group), min(c.size, 64), c.chunks) for c in g.comms}
    assert {s[0] for s in shapes} >= {"ring", "all_to_all"}
    for name, n, size, chunks in shapes:
        c = C.build(name, n, max(size, 2 * n), chunks)
        out = C.simulate(c, 1)
        assert all(C.result_ok(c, r, out[r]) for r in range(n))


def test_a_deadlock_across_ranks_is_caught():
    a = J.Op(J.COMM, "a", "x", comm=0)
    b = J.Op(J.COMM, "b", "y", comm=1)
    graph = J.JobGraph(((a, replace(b, after=(0,))), (b, replace(a, after=(0,)))),
                       (J.Comm("ring", (0, 1), 8), J.Comm("ring", (0, 1), 8)))
    with pytest.raises(C.ScheduleError, match="deadlock"):
        J.check(graph)


def test_byte_scale_divides_sizes_and_compute_alike():
    par = Parallelism(dp=2, tp=2, pp=2, micro_batches=2)
    full, scaled = build(SMALL, par, GPU), build(SMALL, par, GPU, byte_scale=10)
    assert _free(scaled).end == pytest.approx(_free(full).end / 10, rel=1e-3)
    assert [c.size for c in scaled.comms] == [max(len(c.group), c.size // 10)
                                              for c in full.comms]


@pytest.mark.parametrize("par,match", [(Parallelism(dp=3), "the job has 4 GPUs"),
                                       (Parallelism(pp=4, tp=1, dp=1), None),
                                       (Parallelism(dp=4, ep=2), "needs a MoE model")])
def test_a_parallelism_that_does_not_fit_is_refused(par, match):
    model = replace(SMALL, layers=3) if match is None else SMALL
    with pytest.raises(ConfigError, match=match or "cannot split 3 layers"):
        from testbed.job.build import check_parallelism
        check_parallelism(model, par, 4)


def test_presets_are_their_class():
    assert 6e9 < PRESETS["dense-7b"].params() < 8e9
    assert 60e9 < PRESETS["dense-70b"].params() < 75e9
    assert PRESETS["moe-8x2"].experts == 8 and PRESETS["moe-8x2"].top_k == 2


def _scenario(**job):
    from testbed.scenario.config import Scenario
    return Scenario.from_dict({"topology": {"host_rate_mbit": 40},
                               "workload": {"job": {"model": "dense-7b", **job}}})


def test_auto_byte_scale_fits_the_target_but_keeps_messages_bandwidth_dominated():
    from testbed.job.bytescale import (HONEST_LATENCY_SHARE, buffer_regime, latency_share,
                                       recovery_bytes, roce_ports)
    from testbed.job.plan import fabric_messages, plan_job
    # DCQCN's senders only: the recovery regime (enterprise's) has a test of its own
    s = _scenario(bucket_mb=1000, micro_batches=8).override(
        {"policies": ["hyperscale", "lossless"]})
    job = plan_job(s)
    assert job.latency_share <= HONEST_LATENCY_SHARE and not job.warning and job.regime.kept
    sizes = fabric_messages(build(job.model, job.parallelism, GpuModel()), s)
    per_qp = [size / s.transport.qps_per_peer for size in sizes]
    ports = roce_ports(s)
    up = job.byte_scale * 2.5  # the next 1-2-5 step breaks one of the two
    assert (latency_share(sizes, up, 100) > HONEST_LATENCY_SHARE
            or not buffer_regime(per_qp, up, min(p.buffer_bytes for p in ports)).kept)
    assert recovery_bytes(s, ports) is None
    target = plan_job(_scenario(bucket_mb=1000, micro_batches=8, iteration_s=1000).override(
        {"policies": ["hyperscale", "lossless"]}))
    assert target.byte_scale < job.byte_scale  # a longer target needs less scaling


def test_a_byte_scale_that_makes_messages_latency_bound_is_warned_about():
    from testbed.job.plan import plan_job
    job = plan_job(_scenario(byte_scale=5000))
    assert job.byte_scale == 5000 and job.latency_share > 0.5
    assert "latency-bound" in job.warning and "byte_scale" in job.warning


def test_a_lossy_fabric_keeps_messages_several_timeouts_of_sending_long():
    """Go-back-N resends the rest of a message until a NAK or the timer rewinds it: auto keeps
    a QP's median message RECOVERY_REGIME times what it sends in one timeout at its share of
    the line, on the longest timeout of the lossy policies without congestion control; a
    lossless fabric, or DCQCN's senders, are not held to it."""
    from testbed.base.topology import FabricPlan
    from testbed.job.bytescale import RECOVERY_REGIME, RecoveryRegime, roce_ports
    from testbed.job.plan import plan_job
    from testbed.plan.policyrun import roce_class
    from testbed.scenario.catalog import find

    from .decided import decided

    s = find("default").override({"topology": {"host_rate_mbit": 32}})
    job = plan_job(s)
    rec = job.recovery
    assert rec.kept and RECOVERY_REGIME <= rec.ratio < 2.5 * RECOVERY_REGIME
    # the timeout is the one the run's NICs get: enterprise's 100 us, at a quarter of the
    # 100 Gbit/s line (4 QPs per peer)
    enterprise = decided("enterprise", FabricPlan.for_topology(s.topology), s)
    assert not roce_class(enterprise.policy, enterprise.classes).lossless
    assert enterprise.congestion_control == "none"
    assert rec.recovery_bytes == round(enterprise.rto_us * 25e3 / 8) == 312500
    assert [(p.lossless, p.congestion_control) for p in roce_ports(s)] == [
        (False, "none"), (False, "dcqcn"), (True, "dcqcn")]

    coarse = plan_job(s.override({"workload": {"job": {"byte_scale": 100}}}))
    assert not coarse.recovery.kept and coarse.recovery.ratio < 1
    assert "go-back-N resends less per loss" in coarse.warning

    for policies in (["lossless"], ["hyperscale", "lossless"]):
        assert plan_job(s.override({"policies": policies})).recovery == RecoveryRegime(), policies
    longer = plan_job(s.override({"transport": {"rto_us": 200}}))  # a longer timer, less scaling
    assert longer.byte_scale < job.byte_scale and longer.recovery.kept

    # where the regime would need more than RECOVERY_STRETCH times more bytes, auto stops there
    # and says so: moe's all-to-alls on 1 QP per peer
    from testbed.job.bytescale import RECOVERY_STRETCH
    moe = find("moe").for_checks()
    faster = plan_job(moe.override({"policies": ["hyperscale", "lossless"]})).byte_scale
    capped = plan_job(moe)
    assert faster / RECOVERY_STRETCH <= capped.byte_scale < faster
    assert not capped.recovery.kept and "go-back-N resends less per loss" in capped.warning
    assert f"auto stopped at {capped.byte_scale:g}" in capped.warning
    keeps = float(capped.warning.split("workload.job.byte_scale: ")[1].split()[0])
    held = plan_job(moe.override({"workload": {"job": {"byte_scale": keeps}}}))
    assert keeps < capped.byte_scale and held.recovery.kept and not held.warning


def test_a_job_latency_bound_at_full_size_is_not_warned_about():
    from testbed.job.bytescale import HONEST_LATENCY_SHARE
    from testbed.job.plan import plan_job
    from testbed.scenario.catalog import find
    job = plan_job(find("incast").override({"topology": {"host_rate_mbit": 20}}))
    assert job.byte_scale == 1 and job.latency_share > HONEST_LATENCY_SHARE
    assert not job.warning  # its bursts are small by design, not by scaling


def test_pxn_puts_a_job_s_expert_all_to_alls_on_the_rails():
    from testbed.base.errors import ConfigError
    from testbed.job.plan import plan_job
    from testbed.scenario.config import Scenario
    from traffic.jobgraph import check, collective_of, comm_transfers, same_server
    data = {"topology": {"host_rate_mbit": 40, "gpus_per_server": 2,
                         "layout": "rail-optimized"},
            "workload": {"pxn": True, "job": {"model": "moe-8x2", "layers": 1, "ep": 4}}}
    job = plan_job(Scenario.from_dict(data))
    a2a = [c for c in job.graph.comms if c.collective == "all_to_all"]
    assert a2a and all(c.pxn == tuple(divmod(g, 2) for g in c.group) for c in a2a)
    check(job.graph)  # still every value made before it is read
    assert any(t.phase == "pxn to rail" for c in a2a for t in collective_of(c).transfers)
    for c in a2a:  # over the fabric only along a rail
        assert all(same_server(a, b, 2) or a % 2 == b % 2 for a, b, _ in comm_transfers(c))
    with pytest.raises(ConfigError, match="workload.pxn: PXN relays over a server"):
        Scenario.from_dict({"workload": {"pxn": True}})


def test_byte_scale_steps():
    from testbed.job.bytescale import auto_byte_scale, step_down
    assert [auto_byte_scale(x, 1) for x in (0.5, 1.5, 3, 7, 11)] == [1, 2, 5, 10, 20]
    assert [step_down(x) for x in (1000, 500, 200, 100, 2)] == [500, 200, 100, 50, 1]


def _two_jobs(**second):
    from testbed.scenario.config import Scenario
    small = {"model": "custom", "layers": 2, "hidden": 1024, "heads": 8, "seq_len": 1024,
             "vocab": 0}
    return Scenario.from_dict({"topology": {"host_rate_mbit": 40}, "workload": {"jobs": [
        dict(small, ranks=[0, 1, 4, 5]), dict(small, dp=2, tp=2, **second)]}})


def test_several_jobs_share_the_fabric_on_their_own_gpus():
    from testbed.job.plan import plan_job
    s = _two_jobs()
    job = plan_job(s)
    assert [p.ranks for p in job.parts] == [(0, 1, 4, 5), (2, 3, 6, 7)]  # then the free ones
    g = job.graph
    J.check(g)
    first = {c.group for c in g.comms if set(c.group) <= {0, 1, 4, 5}}
    second = {c.group for c in g.comms if set(c.group) <= {2, 3, 6, 7}}
    assert len(first) + len(second) == len({c.group for c in g.comms})  # nothing crosses jobs
    assert (2, 3) in second  # job 2's tensor-parallel pair: its local ranks 0 and 1


@pytest.mark.parametrize("data,match", [
    ({"jobs": [{"model": "dense-7b", "ranks": [0, 1]}, {"model": "dense-7b", "ranks": [1, 2]}]},
     r"workload.jobs\[1\].ranks: GPU 1 is already job 0's"),
    ({"jobs": [{"model": "dense-7b", "ranks": [0, 9]}]}, "not distinct GPUs of the fabric's 8"),
    ({"jobs": [{"model": "dense-7b"}, {"model": "dense-7b", "dp": 2}]},
     "with several jobs, give each its ranks or dp"),
    ({"job": {"model": "dense-7b"}, "jobs": [{"model": "dense-7b", "dp": 2}]},
     "give job or jobs, not both"),
    ({"jobs": [{"layers": 2}]}, r"workload.jobs\[0\]: give a model or a file"),
    ({"jobs": [{"model": "dense-7b", "dp": 3, "ranks": [0, 1]}]}, "dp x tp x pp = 3"),
    ({"jobs": [{"model": "dense-7b", "dp": 6}, {"model": "dense-7b", "dp": 4}]},
     r"workload.jobs\[1\]: needs 4 GPUs, 2 are free"),
])
def test_jobs_that_do_not_fit_are_refused(data, match):
    from testbed.scenario.config import Scenario
    with pytest.raises(ConfigError, match=match):
        Scenario.from_dict({"workload": data})
