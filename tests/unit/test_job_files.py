"""Jobs from files users already have: Chakra traces, written to the published layout by the
project's own writer, read back as job graphs; malformed ones refused with file, node, field."""
import gzip
import json

import pytest

from testbed.base.errors import ConfigError
from testbed.job import chakra as K
from traffic import jobgraph as J


def _rank_nodes(rank, ranks, size=4096, comm_type=0, pg=""):
    """Forward compute, an all-reduce of its gradients, a send to the next rank and a receive
    from the previous one, then a compute that needs both."""
    extra = {"pg_name": pg} if pg else {}
    nodes = [K.node(10, "fwd", K.COMP, duration_micros=5),
             K.node(11, "allreduce", K.COMM_COLL, data_deps=[10], comm_type=comm_type,
                    comm_size=size, **extra),
             K.node(12, "send", K.COMM_SEND, data_deps=[10], comm_src=rank,
                    comm_dst=(rank + 1) % ranks, comm_tag=7, comm_size=1000),
             K.node(13, "recv", K.COMM_RECV, comm_src=(rank - 1) % ranks, comm_dst=rank,
                    comm_tag=7, comm_size=1000),
             K.node(14, "bwd", K.COMP, data_deps=[11, 13], ctrl_deps=[12], duration_micros=9)]
    return nodes


def _write(tmp_path, ranks=4, gz=False, **kw):
    prefix = str(tmp_path / "job")
    for r in range(ranks):
        K.write_trace(f"{prefix}.{r}.et" + (".gz" if gz else ""), _rank_nodes(r, ranks, **kw))
    return prefix


@pytest.mark.parametrize("gz", [False, True])
def test_a_chakra_trace_becomes_each_rank_s_program(tmp_path, gz):
    g = K.load(_write(tmp_path, gz=gz))
    assert g.ranks == 4 and g.name == "job"
    prog = g.programs[1]
    assert [op.name for op in prog] == ["start", "fwd", "allreduce", "send", "recv", "bwd"]
    assert prog[1].ns == 5000 and prog[5].ns == 9000
    assert prog[5].after == (1, 2, 3, 4)  # data and control dependencies, and the compute before
    coll = g.comms[prog[2].comm]
    assert (coll.collective, coll.group, coll.size) == ("ring", (0, 1, 2, 3), 4096)
    send, recv = g.comms[prog[3].comm], g.comms[prog[4].comm]
    assert send.group == (1, 2) and recv.group == (0, 1) and send.collective == "send_recv"
    J.check(g)
    t = J.replay(g, lambda r, op: op.ns, lambda c: 0)
    assert t.end == 14000  # 5 + 9 us of compute


def test_communicator_groups_and_every_integer_variant_of_an_attribute(tmp_path):
    prefix = str(tmp_path / "job")
    groups = tmp_path / "groups.json"
    groups.write_text(json.dumps({"dp_a": [0, 2], "dp_b": [1, 3]}))
    for r, variant in enumerate(("int32_val", "int64_val", "uint32_val", "uint64_val")):
        n = K.node(1, "ag", K.COMM_COLL, comm_type=2, pg_name="dp_a" if r % 2 == 0 else "dp_b")
        a = n.attr.add(name="comm_size")
        setattr(a, variant, 1024)
        K.write_trace(f"{prefix}.{r}.et", [n])
    g = K.load(prefix, str(groups))
    assert sorted((c.group, c.collective, c.size, c.kind) for c in g.comms) == [
        ((0, 2), "all_gather", 1024, "dp"), ((1, 3), "all_gather", 1024, "dp")]


@pytest.mark.parametrize("break_it,match", [
    (lambda nodes: nodes[4].data_deps.append(99), r"node 14 \(bwd\): data_deps names node 99"),
    (lambda nodes: nodes[1].attr[0].__setattr__("uint64_val", 5),
     r"node 11 \(allreduce\): comm_type BROADCAST is not supported"),
    (lambda nodes: nodes[1].attr[1].__setattr__("string_val", "big"),
     r"node 11 \(allreduce\): attribute comm_size is string_val, not an integer"),
    (lambda nodes: nodes[0].ctrl_deps.append(14), r"in a dependency cycle"),
])
def test_a_malformed_node_is_refused_naming_the_file_node_and_field(tmp_path, break_it, match):
    prefix = _write(tmp_path)
    nodes = _rank_nodes(2, 4)
    break_it(nodes)
    K.write_trace(f"{prefix}.2.et", nodes)
    with pytest.raises(ConfigError, match=match) as e:
        K.load(prefix)
    assert "job.2.et" in str(e.value)


def test_ranks_that_disagree_about_a_collective_are_refused(tmp_path):
    prefix = _write(tmp_path)
    K.write_trace(f"{prefix}.3.et", _rank_nodes(3, 4, size=8192))
    with pytest.raises(ConfigError, match=r"job.3.et: node 11 .*collective 1 of group "
                                          r"\[0, 1, 2, 3\] is ALL_REDUCE of 8192 B here"):
        K.load(prefix)


def test_a_collective_a_member_never_runs_is_refused(tmp_path):
    prefix = str(tmp_path / "job")
    K.write_trace(f"{prefix}.0.et", [K.node(1, "ar", K.COMM_COLL, comm_type=0, comm_size=64)])
    K.write_trace(f"{prefix}.1.et", [K.node(1, "fwd", K.COMP, duration_micros=1)])
    with pytest.raises(ConfigError, match=r"has no node on rank\(s\) \[1\]"):
        K.load(prefix)


def test_a_cut_off_or_foreign_file_is_refused(tmp_path):
    prefix = _write(tmp_path, ranks=2)
    data = open(f"{prefix}.1.et", "rb").read()
    open(f"{prefix}.1.et", "wb").write(data[:-3])
    with pytest.raises(ConfigError, match=r"job.1.et: the message at byte \d+ needs"):
        K.load(prefix)
    open(f"{prefix}.1.et", "wb").write(gzip.compress(b"\x00\x03\xff\xff\xff"))
    with pytest.raises(ConfigError, match=r"job.1.et: message 1 is not a Chakra node"):
        K.load(prefix)
    with pytest.raises(ConfigError, match="no Chakra trace"):
        K.load(str(tmp_path / "missing"))


def test_the_project_s_graph_format_round_trips_a_built_job(tmp_path):
    import yaml
    from testbed.job import graphfile
    from testbed.job.build import Parallelism, build
    from testbed.job.model import Model
    g = build(Model("m", 2, 256, 4, 128, 0), Parallelism(dp=2, tp=2, micro_batches=2))
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(graphfile.dump(g)))
    again = graphfile.load(str(path))
    assert again.comms == g.comms
    assert [[(o.kind, o.after, o.ns, o.comm) for o in p] for p in again.programs] == \
        [[(o.kind, o.after, o.ns, o.comm) for o in p] for p in g.programs]


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d["programs"][1][1].update(after=[5]), r"rank 1: op 1 \(ring\) waits for op 5"),
    (lambda d: d["comms"][0].update(collective="butterfly"), r"comms\[0\]: collective must be"),
    (lambda d: d["programs"][0][0].update(us=-1), r"programs\[0\]\[0\]: us must be a number"),
    (lambda d: d["programs"][0][0].update(colour="red"), r"programs\[0\]\[0\]: unknown key"),
    (lambda d: d["programs"][1].pop(1), r"comm 0 \(ring\) over \(0, 1\): the ranks with an op"),
])
def test_a_malformed_graph_file_is_refused_naming_the_entry(tmp_path, mutate, match):
    import yaml
    from testbed.job import graphfile
    data = {"name": "tiny", "comms": [{"collective": "ring", "group": [0, 1], "bytes": 64}],
            "programs": [[{"compute": "fwd", "us": 1}, {"comm": 0, "after": [0]}]
                         for _ in range(2)]}
    mutate(data)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=match) as e:
        graphfile.load(str(path))
    assert "tiny.yaml" in str(e.value)


def test_a_scenario_file_finds_its_job_files_beside_it(tmp_path, monkeypatch):
    import yaml
    from testbed.scenario.config import load_file
    (tmp_path / "jobs").mkdir()
    graph = {"name": "tiny", "comms": [{"collective": "ring", "group": [0, 1], "bytes": 64}],
             "programs": [[{"comm": 0}], [{"comm": 0}]]}
    (tmp_path / "jobs" / "tiny.yaml").write_text(yaml.safe_dump(graph))
    (tmp_path / "mine.yaml").write_text(
        "topology: {leaves: 2, gpus_per_leaf: 1, host_rate_mbit: 40}\n"
        "workload:\n  jobs:\n    - {file: jobs/tiny.yaml}\n")
    monkeypatch.chdir("/")  # not the scenario's folder
    s = load_file(str(tmp_path / "mine.yaml"))
    assert s.workload.jobs[0].file == str(tmp_path / "jobs" / "tiny.yaml")
    absolute = str(tmp_path / "jobs" / "tiny.yaml")
    (tmp_path / "other.yaml").write_text(f"workload: {{job: {{file: {absolute}}}}}\n"
                                         "topology: {leaves: 2, gpus_per_leaf: 1}\n")
    assert load_file(str(tmp_path / "other.yaml")).workload.job.file == absolute


def test_a_scenario_takes_a_job_file_whose_ranks_fit_the_fabric(tmp_path):
    from testbed.scenario.config import Scenario
    prefix = _write(tmp_path, ranks=8)
    s = Scenario.from_dict({"workload": {"job": {"file": prefix}}})
    assert s.workload.job.enabled
    from testbed.job.plan import plan_job
    small = _write(tmp_path / "..", ranks=4)  # a smaller job: on the first GPUs, the rest idle
    s = Scenario.from_dict({"topology": {"host_rate_mbit": 40},
                            "workload": {"job": {"file": small}}})
    assert plan_job(s).parts[0].ranks == (0, 1, 2, 3)
    big = _write(tmp_path / "big", ranks=16) if (tmp_path / "big").mkdir() is None else None
    with pytest.raises(ConfigError, match="needs 16 GPUs, 8 are free"):
        Scenario.from_dict({"workload": {"job": {"file": big}}})
    with pytest.raises(ConfigError, match="has 8 ranks, the job 4 GPUs"):
        Scenario.from_dict({"workload": {"job": {"file": prefix, "ranks": [0, 1, 2, 3]}}})
    with pytest.raises(ConfigError, match="model or file, not both"):
        Scenario.from_dict({"workload": {"job": {"file": prefix, "model": "dense-7b"}}})


def _aicb(tmp_path, **kw):
    from testbed.job import aicb as A
    rows = (A.Row("embedding", (5000, "ALLREDUCE", 4096), (0, "NONE", 0), (1000, "NONE", 0), 10),
            A.Row("attention", (20000, "ALLREDUCE", 8192), (20000, "ALLREDUCE", 8192),
                  (20000, "ALLREDUCE", 65536), 10),
            A.Row("moe", (1, "ALLTOALL_EP", 16384), (1, "ALLTOALL_EP", 16384),
                  (30000, "ALLREDUCE_DP_EP", 32768), 10),
            A.Row("mlp", (40000, "ALLREDUCE", 8192), (40000, "ALLREDUCE", 8192),
                  (40000, "ALLREDUCE", 131072), 10))
    w = A.Workload(**dict(dict(tp=2, ep=2, pp=2, ga=3, gpus=16, pp_comm=2048, rows=rows), **kw))
    path = str(tmp_path / "workload.txt")
    A.write(w, path)
    return w, path


def test_an_aicb_workload_becomes_a_1f1b_job_with_its_groups(tmp_path):
    from testbed.job.plan import load_file
    w, path = _aicb(tmp_path)
    g = load_file(path)  # found by its first line
    J.check(g)
    assert g.ranks == 16
    kinds = {}
    for c in g.comms:
        kinds.setdefault(c.kind, set()).add(c.group)
    # stage 0 runs rows 0-1 (ranks 0-7), stage 1 rows 2-3 (the MoE row: ranks 8-15)
    assert (0, 1) in kinds["tp"]  # tensor parallel: consecutive ranks
    assert kinds["ep"] == {(8, 10), (12, 14), (9, 11), (13, 15)}  # consecutive dp ranks
    assert (0, 2, 4, 6) in kinds["dp"]  # weight gradients: the data-parallel group
    assert (8, 12) in kinds["dp"]  # _DP_EP: the data-parallel ranks with the same experts
    assert (1, 9) in kinds["pp"]  # stage 0 -> stage 1 of the same tp and dp position
    # rank 0 (stage 0) runs the first two rows, 3 micro-batches: 1F1B with one warm-up pass
    names = [op.name.split()[0] + op.name.split()[-1] for op in g.programs[0]
             if op.kind == J.COMPUTE and op.name.split()[0] in ("fwd", "ig")]
    assert names[:4] == ["fwdmb0", "fwdmb0", "fwdmb1", "fwdmb1"] and names[4] == "igmb0"
    # free communication: stage 1 (the slower) works through its 3 micro-batches once
    # stage 0's first forward pass reached it, and stage 0 ends after one more backward pass
    t = J.replay(g, lambda r, op: op.ns, lambda c: 0)
    slow = (1 + 40000) + (1 + 40000) + (30000 + 40000)  # stage 1: fwd, ig, wg per micro-batch
    fast = 25000 + 20000 + 21000  # stage 0
    assert 3 * slow + 25000 <= t.end <= 3 * slow + 25000 + fast

@pytest.mark.parametrize("edit,match", [
    (lambda t: t.replace("HYBRID_TRANSFORMER_FWD_IN_BCKWD", "SOMETHING"), "line 1: not an AICB"),
    (lambda t: t.replace("\n4\n", "\n5\n"), "line 2 says 5 rows, the file has 4"),
    (lambda t: t.replace("ALLTOALL_EP\t16384\t1\tALLTOALL_EP", "ALLTOALL_XP\t16384\t1\tALLTOALL_EP"),
     r"line 5: fwd_comm_type 'ALLTOALL_XP'"),
    (lambda t: t.replace("mlp\t-1\t40000", "mlp\t-1\tforty"), r"line 6: fwd_compute: must be a number"),
    (lambda t: t.replace("all_gpus: 16", "all_gpus: 15"), "all_gpus 15 is not a multiple"),
    (lambda t: t.replace("\t10\n", "\n", 1), r"line 3: 11 fields, a row has 12"),
])
def test_a_malformed_aicb_file_is_refused_naming_the_line_and_field(tmp_path, edit, match):
    from testbed.job import aicb as A
    _w, path = _aicb(tmp_path)
    text = open(path).read()
    open(path, "w").write(edit(text))
    with pytest.raises(ConfigError, match=match) as e:
        A.load(path)
    assert "workload.txt" in str(e.value)


def test_aicb_headers_without_a_colon_are_read_too(tmp_path):
    from testbed.job import aicb as A
    _w, path = _aicb(tmp_path, pp=1, ga=1, gpus=8)
    text = open(path).read().replace("pp_comm: ", "pp_comm ")
    w = A.parse(text, path)
    assert (w.tp, w.ep, w.pp, w.gpus, w.pp_comm) == (2, 2, 1, 8, 2048)
