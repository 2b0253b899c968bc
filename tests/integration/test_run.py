"""A real run on a real fabric: every GPU's packets arrive, shaping holds, nothing is left."""
import json
import os

import pytest

from testbed import runner
from testbed.config import DEFAULT
from testbed.results import RESULTS_SCHEMA
from traffic import roce

pytestmark = pytest.mark.integration

SMALL = DEFAULT.override({"topology": {"spines": 2, "leaves": 2, "gpus_per_leaf": 2},
                          "workload": {"iterations": 3, "size_bytes": 256 * 1024}})


def test_ring_all_reduce_on_a_real_fabric(tmp_path):
    messages = []
    results, run_dir = runner.run(SMALL, out_root=str(tmp_path), progress=messages.append)
    assert results["status"] == "complete"
    on_disk = json.load(open(os.path.join(run_dir, "results.json")))
    assert on_disk["schema"] == RESULTS_SCHEMA and on_disk["status"] == "complete"
    assert on_disk["capabilities"]["datapath"] in ("user", "kernel")
    assert on_disk["link_emulation"]["egress_queue"].startswith("htb")

    hs = on_disk["policies"]["hyperscale"]
    n, w = 4, SMALL.workload
    chunk_packets = len(roce.packet_payloads(w.size_bytes // n, w.mtu))
    per_gpu_expected = 2 * (n - 1) * chunk_packets * w.iterations
    assert hs["agents_reporting"] == n
    for host, g in hs["per_gpu"].items():
        assert g["packets_received"] == per_gpu_expected, host
        assert g["packets_sent"] == per_gpu_expected, host
    assert hs["drops"] == 0 and hs["switch_queue_drops"] == 0 and hs["unexplained_drops"] == 0
    assert hs["retransmitted_packets"] == 0 and hs["rx_invalid"] == 0 and hs["rx_no_timestamp"] == 0
    assert hs["latency_app_clock"] == 0  # every latency from two kernel timestamps
    assert hs["warnings"] == []

    # Kernel timestamps give positive one-way latencies, and the shaped links bound the
    # collective: it cannot finish faster than its bytes take at the link rate.
    lat = hs["latency_us"]
    assert 0 < lat["p50"] <= lat["p99"] <= lat["max"] < 1e6
    frame_bits = (w.mtu + 62 + 14) * 8
    ideal_us = 2 * (n - 1) * chunk_packets * frame_bits / SMALL.topology.host_rate_mbit
    assert len(hs["cct_us"]["per_iteration"]) == w.iterations
    assert 0.9 * ideal_us <= hs["cct_us"]["p50"] <= 3 * ideal_us

    # Half the ring's flows cross leaves: both spines together carry at least those packets.
    load = hs["spine_load_packets"]
    assert set(load) == {"sp1", "sp2"}
    assert sum(load.values()) >= 2 * 2 * (n - 1) * chunk_packets * w.iterations // 2

    files = os.listdir(run_dir)
    assert "controller-hyperscale.log" in files
    assert sum(f.startswith("agent-hyperscale-") for f in files) == n
    records = os.listdir(os.path.join(run_dir, "records", "hyperscale"))
    assert sum(f.endswith(".packets.csv") for f in records) == n
    assert any("switches programmed" in m for m in messages)
    assert any(f"iteration {w.iterations}/{w.iterations}" in m for m in messages)
