"""A real run on a real fabric: every GPU's packets arrive, shaping holds, nothing is left."""
import dataclasses
import json
import os
import re
import shutil
import subprocess

import pytest

from testbed.run import runner
from testbed.run.agent_processes import loops_wanted
from testbed.api import JOB_FIGURES, CollectiveResult, PolicyResult
from testbed.results.collect import RESULTS_SCHEMA
from traffic import roce
from .live import DEFAULT

pytestmark = pytest.mark.integration

SMALL = DEFAULT.override({"topology": {"spines": 2, "leaves": 2, "gpus_per_leaf": 2},
                          "workload": {"iterations": 3, "size_bytes": 256 * 1024}})


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """One run of every policy, shared by the tests of this module: (results, dir, progress)."""
    messages = []
    results, run_dir = runner.run(SMALL, out_root=str(tmp_path_factory.mktemp("run")),
                                  progress=messages.append)
    return results, run_dir, messages


def test_ring_all_reduce_on_a_real_fabric(small_run):
    results, run_dir, messages = small_run
    assert results["status"] == "complete"
    on_disk = json.load(open(os.path.join(run_dir, "results.json")))
    assert on_disk["schema"] == RESULTS_SCHEMA and on_disk["status"] == "complete"
    assert on_disk["capabilities"]["datapath"] in ("user", "kernel")
    assert on_disk["link_emulation"]["egress_queue"].startswith("htb")
    # the PM QoS request was held for the run where the kernel offers it, and said so
    assert on_disk["cpu_wakeup"]["held"] is os.path.exists("/dev/cpu_dma_latency")
    assert any("PM QoS 0 us" in m or "CPU wake-ups" in m for m in messages)
    # as root the agents run at nice -20 with the shortest slice (kernels before 6.12: no
    # slice), and say so
    expected = ("nice -20, slice 100 us", "nice -20") if os.geteuid() == 0 else ("normal",)
    for p in on_disk["policies"].values():
        lag = p["fidelity"]["checks"]["agent_loop_lag"]
        assert lag["scheduling"] in expected, lag

    # every figure a run writes is declared (and documented) by the API, and the reverse
    declared = {f.name for f in dataclasses.fields(PolicyResult)} - {"name", "raw"}
    optional = {"latency_us_by_path"} | JOB_FIGURES  # split fabrics only; jobs only
    per_collective = {f.name for f in dataclasses.fields(CollectiveResult)} - {"raw"}
    for p in on_disk["policies"].values():
        assert set(p) == declared - optional, (set(p) ^ (declared - optional))
        for c in p["collectives"]:
            assert set(c) == per_collective, set(c) ^ per_collective

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
    # one log per agent process, each serving several GPUs (as few as the line rate needs)
    logs = sorted(f for f in files if f.startswith("agent-hyperscale-"))
    assert logs == [f"agent-hyperscale-{k}.log" for k in range(1, loops_wanted(SMALL) + 1)]
    records = os.listdir(os.path.join(run_dir, "records", "hyperscale"))
    assert sum(f.endswith(".packets.csv") for f in records) == n
    assert any("switches programmed" in m for m in messages)
    assert any(f"iteration {w.iterations}/{w.iterations}" in m for m in messages)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium(tmp_path, *args):
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={tmp_path / 'profile'}", "--proxy-server=127.0.0.1:9",
         "--host-resolver-rules=MAP * ~NOTFOUND", *args],
        capture_output=True, text=True, timeout=120, check=True)


@pytest.mark.skipif(not CHROMIUM, reason="needs chromium (make test installs it: "
                    "scripts/install.sh --test-tools)")
def test_the_report_renders_in_headless_chromium(small_run, tmp_path):
    """report.html of a real run, opened offline: the comparison lists every policy and the
    screenshot shows the plots (each policy's colour drawn)."""
    from matplotlib.image import imread

    from testbed.results.plots import POLICY_COLOURS

    results, run_dir, messages = small_run
    url = "file://" + os.path.join(run_dir, "report.html")
    assert any("writing report.html" in m for m in messages)
    dom = _chromium(tmp_path, "--dump-dom", url).stdout
    table = re.search(r'<table id="comparison">(.*?)</table>', dom, re.S)
    assert table, "no comparison table in the rendered page"
    header = re.findall(r"<th>(.*?)</th>", table.group(1).split("</thead>")[0])
    assert header[1:] == list(results["policies"]) == list(SMALL.policies)
    assert len(re.findall(r"<img src=\"data:image/png;base64,", dom)) >= 4

    shot = tmp_path / "report.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,7000", url)
    pixels = (imread(str(shot))[:, :, :3] * 255).round()
    assert pixels.std() > 20, "blank screenshot"
    for name in SMALL.policies:
        rgb = [int(POLICY_COLOURS[name][i:i + 2], 16) for i in (1, 3, 5)]
        drawn = (abs(pixels - rgb).max(axis=2) <= 8).sum()
        assert drawn > 200, f"{name}'s colour is not in the rendered plots ({drawn} pixels)"
