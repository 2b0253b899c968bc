"""Each policy's mechanisms, measured on a live fabric with real packets."""
import subprocess
import time

import pytest

from testbed.fabric.capabilities import detect
from testbed.fabric.queues import egress_stats

from .live import live, percentile, summary

pytestmark = pytest.mark.integration

CAPS = detect()
SENDERS = ["gpu1", "gpu2", "gpu3", "gpu4", "gpu5", "gpu6", "gpu7"]


def incast(fabric, packets=150, victim="gpu8"):
    """7-to-1 RoCE incast at line rate; returns what the victim received, with the switch
    queues' drops (by port and class) in ``drops``."""
    rx = fabric.recv(victim)
    senders = [fabric.send(s, victim, packets=packets, sport=0xC000 + i, held=True)
               for i, s in enumerate(SENDERS)]
    fabric.go(*senders)
    for s in senders:
        s.wait(timeout=120)
    time.sleep(1.0)  # let the queues drain
    got = summary(rx.stop())
    got["drops"] = {port: {h: c["drops"] for h, c in v["classes"].items() if c["drops"]}
                    for port, v in egress_stats(fabric.session.fabric).items() if v["drops"]}
    return got


def test_hyperscale_incast_overflows_the_shallow_buffer(tmp_path):
    with live("hyperscale", tmp_path) as fabric:
        got = incast(fabric)
        drops = fabric.port_packets()
        report = fabric.stop_queues()
    sent = 7 * 150
    assert got["packets"] < sent, "an incast into a 64 KB tail-drop buffer must lose packets"
    # the default marks above K (DCQCN senders would slow down); these raw senders do not
    assert got["ce"] > 0
    assert report.pfc_pause_events == 0
    assert max(report.max_backlog["lf4-eth2"].values()) > 50_000  # the buffer filled
    assert drops  # counters were readable


def test_lossless_incast_loses_nothing_pauses_and_marks(tmp_path):
    with live("lossless", tmp_path) as fabric:
        flows = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", "sp1"],
                               capture_output=True, text=True, check=True).stdout
        quiet = fabric.recv("gpu8")
        fabric.send("gpu7", "gpu8", packets=100).wait()  # one flow: the queue stays short
        time.sleep(0.5)
        alone = summary(quiet.stop())
        got = incast(fabric)
        report = fabric.stop_queues()
    assert alone["packets"] == 100 and alone["ce"] == 0  # below Kmin: no marks
    assert got["packets"] == 7 * 150, f"lossless class dropped packets: {got['drops']}"
    assert got["ce"] > 0, "ECN marks appear once Kmin is crossed"
    # marked by the kernel program where it runs: then no flow looks at the ECN bits
    # (testbed.fabric.bpfmark: a flow's marked packets could otherwise overtake its unmarked ones)
    openflow = fabric.policy.context.openflow_marking
    assert openflow == (not CAPS.bpf_marking and not CAPS.red)
    assert ("nw_ecn" in flows) == openflow
    assert report.pfc_pause_events > 0 and report.pfc_paused_ms > 0
    paused = report.pfc
    assert any(q.startswith("gpu") for q in paused)  # backpressure reached the GPU NICs
    assert any(not q.startswith("gpu") for q in paused)  # ... hop by hop, via switch queues
    # the queues feeding the victim's leaf grew: the spines' ports towards lf4
    assert max(max(report.max_backlog.get(p, {"roce": 0}).values())
               for p in ("sp1-eth4", "sp2-eth4")) > 10_000
    victim = report.max_backlog["lf4-eth2"]["roce"]
    roce_buffer = fabric.policy.traffic_classes()[1].buffer_bytes
    assert victim <= roce_buffer


def test_enterprise_isolates_tenants_uses_one_spine_and_prioritises_interactive(tmp_path):
    tenant_a = ["gpu1", "gpu2", "gpu3", "gpu4"]
    with live("enterprise", tmp_path,
              policy_params={"enterprise": {"tenants": [tenant_a]}}) as fabric:
        before = fabric.port_packets()
        # Tenant isolation: A -> B never arrives (not even flooded), A -> A does.
        b_rx, a_rx = fabric.recv("gpu5"), fabric.recv("gpu3")
        fabric.send("gpu1", "gpu5", packets=50).wait()
        fabric.send("gpu1", "gpu3", packets=50).wait()
        time.sleep(0.3)
        to_b, to_a = summary(b_rx.stop()), summary(a_rx.stop())
        # Strict priority: RoCE from gpu1 and gpu2 saturates lf1's uplink; interactive
        # probes (DSCP 46) from gpu2 share that queue and gpu2's NIC.
        rx3, rx4 = fabric.recv("gpu3"), fabric.recv("gpu4")
        bulk = [fabric.send(s, "gpu3", packets=200, held=True) for s in ("gpu1", "gpu2")]
        probe = fabric.send("gpu2", "gpu4", kind="udp", dscp=46, packets=100, interval_us=5000,
                            held=True)
        fabric.go(*bulk, probe)
        for f in bulk + [probe]:
            f.wait()
        time.sleep(0.5)
        roce, interactive = summary(rx3.stop()), summary(rx4.stop(), kind="udp")
        after = fabric.port_packets()
        report = fabric.stop_queues()
    assert to_b["packets"] == 0, "a packet of tenant A reached tenant B"
    assert to_a["packets"] == 50
    # Inter-leaf traffic crossed exactly one spine: sp2 is blocked by the spanning tree.
    carried = {s: sum(after[p] - before.get(p, 0) for p in after if p.startswith(s + "-"))
               for s in ("sp1", "sp2")}
    crossed = to_a["packets"] + roce["packets"] + interactive["packets"]  # all inter-leaf
    assert carried["sp2"] == 0 and carried["sp1"] >= crossed
    assert report.max_backlog["lf1-eth3"]["best-effort"] > 50_000  # RoCE did queue
    assert interactive["packets"] == 100
    roce_p50 = percentile(roce["latency_us"], 0.5)
    # p90: of 100 probes the p99 is the slowest one, which a scheduling hiccup of a loaded
    # 2-core machine decides (measured 2.5-4.6 ms, at any position; p90 0.6-0.7 ms)
    inter_p90 = percentile(interactive["latency_us"], 0.9)
    assert inter_p90 < roce_p50 / 4, (inter_p90, roce_p50)


def test_hyperscale_sixteen_flows_use_every_spine(tmp_path):
    with live("hyperscale", tmp_path, topology={"spines": 4, "leaves": 2,
                                                "gpus_per_leaf": 1}) as fabric:
        before = fabric.port_packets()
        rx = fabric.recv("gpu2")
        for i in range(16):
            fabric.send("gpu1", "gpu2", packets=20, sport=0xC000 + 97 * i).wait()
        time.sleep(0.3)
        got = summary(rx.stop())
        after = fabric.port_packets()
    per_spine = {s: after[f"{s}-eth2"] - before.get(f"{s}-eth2", 0)
                 for s in ("sp1", "sp2", "sp3", "sp4")}
    assert got["packets"] == 16 * 20
    assert all(n >= 20 for n in per_spine.values()), per_spine  # every spine, whole flows


def test_lossless_adaptive_routing_moves_a_new_flow_off_a_congested_uplink(tmp_path):
    # Uplinks at half the host rate: one flow congests whichever uplink it takes.
    with live("lossless", tmp_path,
              topology={"spines": 2, "leaves": 3, "gpus_per_leaf": 2, "host_rate_mbit": 40,
                        "fabric_rate_mbit": 20}) as fabric:
        rx3, rx5 = fabric.recv("gpu3"), fabric.recv("gpu5")
        # the first flow keeps its uplink congested for about 1.6 s; the second starts in it
        first = fabric.send("gpu1", "gpu3", packets=1000, held=True)  # to lf2
        second = fabric.send("gpu2", "gpu5", packets=60, held=True)  # to lf3, a new flow
        started = fabric.go(first)
        time.sleep(max(0.0, started / 1e9 + 0.4 - time.time()))
        mid = fabric.port_packets()
        fabric.go(second)
        second.wait()
        first.wait()
        time.sleep(0.5)
        after = fabric.port_packets()
        a, b = summary(rx3.stop()), summary(rx5.stop())
    first_spine = max(("sp1", "sp2"), key=lambda s: mid.get(f"{s}-eth2", 0))
    second_on = {s: after[f"{s}-eth3"] - mid.get(f"{s}-eth3", 0) for s in ("sp1", "sp2")}
    assert a["packets"] == 1000 and b["packets"] == 60
    assert second_on[first_spine] == 0, (first_spine, second_on)
    assert max(second_on.values()) >= 60


def test_lossless_spraying_balances_one_flow_over_all_spines(tmp_path):
    with live("lossless", tmp_path, topology={"spines": 4, "leaves": 2,
                                              "gpus_per_leaf": 1}) as fabric:
        before = fabric.port_packets()
        rx = fabric.recv("gpu2")
        fabric.send("gpu1", "gpu2", packets=2000, sport="per-packet").wait(timeout=300)
        time.sleep(0.5)
        got = summary(rx.stop())
        after = fabric.port_packets()
    per_spine = [after[f"{s}-eth2"] - before.get(f"{s}-eth2", 0)
                 for s in ("sp1", "sp2", "sp3", "sp4")]
    assert got["packets"] == 2000
    assert min(per_spine) > 0 and max(per_spine) <= 1.2 * min(per_spine), per_spine
