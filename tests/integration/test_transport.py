"""The RoCE transport on live fabrics: go-back-N under drops, DCQCN, QP scaling, spraying."""
import csv
import glob
import json
import os
import subprocess
import sys

import pytest

from testbed.run import runner
from traffic.collectives import build
from .live import DEFAULT

pytestmark = pytest.mark.integration

OVERSUBSCRIBED = {"topology": {"host_rate_mbit": 40, "fabric_rate_mbit": 20}}


def run(tmp_path, policies, **changes):
    scenario = DEFAULT.override(dict(changes, policies=policies))
    result = runner.run(scenario, out_root=str(tmp_path))
    assert result.status == "complete"
    return scenario, result, result.run_dir


def delivered_bytes(run_dir, policy):
    """{(receiver rank, sender rank, iteration, transfer tag): payload bytes delivered in
    order}."""
    got = {}
    for path in glob.glob(os.path.join(run_dir, "records", policy, "*.packets.csv")):
        with open(path) as f:
            for r in csv.DictReader(f):
                if r["delivered"] == "1":
                    key = (int(r["dst"]), int(r["src"]), int(r["iteration"]), int(r["step"]))
                    got[key] = got.get(key, 0) + int(r["bytes"])
    return got


def expected_bytes(scenario):
    n, w = scenario.topology.gpus, scenario.workload
    coll = build(w.collective, n, w.size_bytes, w.chunks, scenario.topology.gpus_per_leaf)
    return {(t.dst, t.src, it, t.tag): t.nbytes
            for it in range(w.iterations) for t in coll.transfers}


def test_drops_cost_go_back_n_retransmissions_and_lossless_has_none(tmp_path):
    common = dict(workload={"iterations": 1}, **OVERSUBSCRIBED)
    scenario, hs_run, hs_dir = run(
        tmp_path / "hyperscale", ["hyperscale"],
        policy_params={"hyperscale": {"buffer_bytes": 48000, "ecn": "off"}}, **common)
    # Adaptive routing off: this test is about drops, not routing. A long retransmission
    # timeout: on a loaded machine a PFC stall once outlasted the default 250 ms and the
    # lossless run retransmitted without a single drop. (NAKs without a drop also came from
    # OpenFlow ECN marking reordering a flow: testbed.fabric.bpfmark, docs/fidelity.md.)
    _, ll_run, ll_dir = run(
        tmp_path / "lossless", ["lossless"], policy_params={"lossless": {
            "adaptive_routing": False}}, transport={"rto_us": 400}, **common)
    hs, ll = hs_run.policy("hyperscale").emulated, ll_run.policy("lossless").emulated
    # Every byte of every transfer arrived, in order, despite the drops.
    assert delivered_bytes(hs_dir, "hyperscale") == expected_bytes(scenario)
    assert delivered_bytes(ll_dir, "lossless") == expected_bytes(scenario)
    assert hs.switch_queue_drops > 0 and hs.retransmitted_packets > 0
    assert hs.naks > 0  # gaps were NAKed ...
    assert hs.drops == hs.packets_sent - hs.packets_received > 0
    recovery = {k: getattr(ll, k) for k in ("drops", "retransmitted_packets", "naks",
                                            "rto_timeouts", "pfc_paused_ms")}
    assert ll.drops == 0 and ll.retransmitted_packets == 0, recovery
    assert ll.naks == 0 and ll.rto_timeouts == 0, recovery
    # Recovery is part of the collective: the lossy fabric's CCT pays for it (modelled: a
    # rejected run goes again slower).
    assert hs_run.policy("hyperscale").cct_us.p50 > ll_run.policy("lossless").cct_us.p50


@pytest.mark.parametrize("retransmission", ["go-back-n", "go-back-0"])
def test_a_lossy_link_loses_packets_that_the_transport_recovers(tmp_path, retransmission):
    scenario, res, run_dir = run(
        tmp_path, ["hyperscale"],
        topology={"spines": 1, "leaves": 2, "gpus_per_leaf": 2,
                  "lossy_links": [{"link": "lf1-sp1", "drop_rate": 0.02}]},
        transport={"congestion_control": "none", "retransmission": retransmission},
        policy_params={"hyperscale": {"ecn": "off"}},
        workload={"collective": "ring", "size_bytes": 262144, "chunks": 1, "iterations": 2})
    p = res.policy("hyperscale")
    # every byte arrived, once: a restarted message's packets are not delivered twice
    assert delivered_bytes(run_dir, "hyperscale") == expected_bytes(scenario)
    lost = p.link_losses_by_port
    assert set(lost) == {"lf1-eth3", "sp1-eth1"}  # both ends of the link
    data = sum(v["data"] for v in lost.values())
    # the link, not a buffer, lost them, and the monitor accounts for each one
    assert data > 0 and p.switch_queue_drops == 0
    assert p.drops == data + p.queued_at_end + p.rx_socket_drops
    assert p.unexplained_drops == 0 and p.fidelity.verdict == "ok", p.fidelity
    assert p.retransmitted_packets > 0 and p.naks > 0


def test_a_link_losing_a_third_of_its_packets_still_passes_the_connectivity_check(tmp_path):
    # one ping each way would fail one run in two; the check pings again until a reply
    _, res, _ = run(
        tmp_path, ["hyperscale"],
        topology={"spines": 1, "leaves": 2, "gpus_per_leaf": 1,
                  "lossy_links": [{"link": "lf1-sp1", "drop_rate": 0.3}]},
        workload={"collective": "ring", "size_bytes": 4096, "chunks": 1, "iterations": 1})
    assert res.policy("hyperscale").link_losses > 0


def backlog_mean(run_dir, policy, ports):
    with open(os.path.join(run_dir, f"switchq-{policy}.timeline.csv")) as f:
        rows = list(csv.DictReader(f))
    values = [int(r[p]) for r in rows for p in ports]
    return sum(values) / len(values)


def test_dcqcn_cuts_rates_on_cnps_and_keeps_queues_shorter(tmp_path):
    common = dict(workload={"iterations": 1, "size_bytes": 4 << 20}, **OVERSUBSCRIBED)
    _s, with_cc, dir_cc = run(tmp_path / "dcqcn", ["lossless"],
                              transport={"congestion_control": "dcqcn"}, **common)
    _s, without, dir_none = run(tmp_path / "none", ["lossless"],
                                transport={"congestion_control": "none"}, **common)
    cc, none = with_cc.policy("lossless"), without.policy("lossless")
    assert cc.ecn_marked_packets > 0 and cc.cnps_sent > 0 and cc.cnps_received > 0
    assert none.cnps_sent is None  # no DCQCN: no notification point, so null, not 0
    rates = []
    for path in glob.glob(os.path.join(dir_cc, "records", "lossless", "*.qps.csv")):
        with open(path) as f:
            rates += [float(r["rate_bps"]) for r in csv.DictReader(f)]
    assert min(rates) < 0.6 * 40e6  # senders slowed down on CNPs
    uplinks = [f"lf{leaf}-eth{p}" for leaf in (1, 2, 3, 4) for p in (3, 4)]
    assert backlog_mean(dir_cc, "lossless", uplinks) < backlog_mean(dir_none, "lossless",
                                                                      uplinks)
    assert cc.drops == none.drops == 0


def test_qps_per_peer_spread_one_message_over_the_spines(tmp_path):
    _s, results, _d = run(tmp_path, ["hyperscale"], workload={"iterations": 2},
                          transport={"qps_per_peer": 8})
    load = results.policy("hyperscale").spine_load_packets
    assert min(load.values()) >= 0.3 * sum(load.values()), load


def test_sprayed_packets_are_reordered_without_spurious_naks(tmp_path):
    _s, results, run_dir = run(tmp_path, ["lossless"], workload={"iterations": 2},
                               transport={"entropy": "per-packet"})
    ll = results.policy("lossless")
    load = ll.spine_load_packets
    # even within 30% (within 20% in most runs; 1.23 once in a CI-like run on a loaded
    # machine, where adaptive routing re-points slots as the queues wander)
    assert max(load.values()) <= 1.3 * min(load.values()), load
    assert ll.naks == 0 and ll.retransmitted_packets == 0 and ll.drops == 0
    # every byte counted as delivered, also those placed ahead of a gap and delivered later
    sent = ll.collectives[0].bytes_sent_per_rank
    assert sent.measured == sent.expected, sent


PACING = """
import json, sys, time
from dataclasses import replace
sys.path.insert(0, {root!r})
from benchmarks.send_rate import make_agent
from traffic.dcqcn import ReactionPoint
import subprocess
for cmd in ("ip link add bench0 type veth peer name bench1", "ip link set bench0 up",
            "ip link set bench1 up", "ip addr add 10.0.1.1/16 dev bench0"):
    subprocess.run(cmd.split(), check=True)
agent = make_agent(1024)
agent.transport = replace(agent.transport, congestion_control="dcqcn")
qp = agent.qp(1, 0)
# the NIC is an unshaped veth; DCQCN runs as on a 40 Mb/s link
qp.rp = ReactionPoint(replace(agent.dcqcn, line_rate_bps=40e6), now_ns=time.time_ns())
qp.rp.on_cnp(time.time_ns())  # 40 -> 20 Mb/s
qp.rp.on_cnp(time.time_ns())  # -> about 10 Mb/s
rate = qp.rp.rate
qp.req.post((0, 0), 400 * 1024, time.time_ns())
agent._queue(qp)
while qp.req.pending():  # what the agent's loop does: send, collect stamps, sleep till due
    agent.send_data(); agent.collect_stamps(); agent.nic_blocked = False
    time.sleep(max(0, qp.next_tx_ns - time.time_ns()) / 1e9)
deadline = time.time() + 2
while agent.tx_pending and time.time() < deadline:
    agent.collect_stamps(); time.sleep(0.001)
ts = sorted(row[1] for row in agent.tx_log if row[3] == "d")
frame_bits = len(qp.conn.template(7, 1024).buf) * 8
print(json.dumps({{"dcqcn_rate": rate, "achieved": (len(ts) - 1) * frame_bits * 1e9 /
                   (ts[-1] - ts[0]), "packets": len(ts)}}))
"""


def test_pacing_holds_the_dcqcn_rate():
    """On an unshaped veth only the agent's pacing limits the rate: the kernel's transmit
    timestamps must show the DCQCN rate, not the wire's."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(["unshare", "--net", sys.executable, "-c", PACING.format(root=root)],
                         capture_output=True, text=True, timeout=120, cwd=root)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["packets"] == 400
    assert 0.85 * r["dcqcn_rate"] <= r["achieved"] <= 1.05 * r["dcqcn_rate"], r


def test_a_qp_out_of_its_retry_budget_fails_the_job_as_a_result_and_the_run_goes_on(tmp_path):
    """Every link of spine 2 loses 30%; enterprise's spanning tree never uses it, hyperscale
    hashes QPs over it. With a budget of one 32.8 us local ACK timeout (ib_timeout 3,
    retry_limit 1) a hyperscale QP that loses a message's tail errors as an RNIC would: that
    policy's job failed, named in results.json, the table and the API; enterprise's ran."""
    from testbed.api import load_result
    from testbed.results.verdicts import job_failures

    lossy = [{"link": f"lf{leaf}-sp2", "drop_rate": 0.3} for leaf in (1, 2, 3, 4)]
    _s, results, run_dir = run(
        tmp_path, ["enterprise", "hyperscale"], topology={"lossy_links": lossy},
        transport={"ib_timeout": 3, "retry_limit": 1, "qps_per_peer": 4},
        workload={"iterations": 3},
        emulation={"attempts": 1})  # the failed job is the outcome here, not its fidelity
    ok, failed = results.policy("enterprise"), results.policy("hyperscale")
    assert ok.job_failed is None and ok.cct_us.p50 > 0
    f = failed.job_failed
    assert f.reason == "retry-exceeded" and f.status == "IBV_WC_RETRY_EXC_ERR (12)"
    assert f.rank != f.peer_rank and f.qpn >= 0x100 and f.iteration >= 0
    assert f.no_progress_us == pytest.approx(4.096 * 2**3, rel=0.05)  # the whole budget
    assert f.retries == 0 and f.seen.timeouts == 0  # its first timeout was its last
    assert f.at_us > 0 and "IBV_WC_RETRY_EXC_ERR" in f.text
    budget = failed.retry_budget
    assert budget["budget_us"] == pytest.approx(32.768) and budget["reachable"]
    api = load_result(run_dir)
    assert api.policy("hyperscale").job_failed.qpn == f.qpn
    assert api.policy("enterprise").job_failed is None
    cli = subprocess.run([sys.executable, "-m", "testbed", "report", run_dir],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    with open(os.path.join(run_dir, "report.html"), encoding="utf-8") as fh:
        assert f.text in fh.read()
    assert job_failures(api) == [f"hyperscale: the job failed: QP error: {f.text}"]
