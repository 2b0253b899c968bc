"""A real run on a real fabric: every GPU's packets arrive, shaping holds, nothing is left."""
import csv
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

import pytest

from testbed.base.frames import full_frame_bytes
from testbed.run import runner
from testbed.run.agent_processes import loops_wanted
from testbed.api import CollectiveResult, PolicyResult, RunResult
from testbed.results.report import fmt, sig, summary_table
from testbed.results.collect import RESULTS_SCHEMA
from traffic import roce
from tests.keytree import keys_before, lost
from tests.tracecheck import check as check_trace
from .live import DEFAULT

pytestmark = pytest.mark.integration

SMALL = DEFAULT.override({"topology": {"spines": 2, "leaves": 2, "gpus_per_leaf": 2},
                          "workload": {"iterations": 3, "size_bytes": 256 * 1024}})


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """One run of every policy, shared by the tests of this module: (run, dir, progress)."""
    messages = []
    run = runner.run(SMALL, out_root=str(tmp_path_factory.mktemp("run")),
                     progress=messages.append)
    return run, run.run_dir, messages


def test_ring_all_reduce_on_a_real_fabric(small_run):
    run, run_dir, messages = small_run
    assert run.status == "complete"
    on_disk = json.load(open(os.path.join(run_dir, "results.json")))
    assert on_disk["schema"] == RESULTS_SCHEMA and on_disk["status"] == "complete"
    # every run-level key is declared by the API, and the run returned is the file's
    declared = set(RunResult.TOP) | {"scenario", "status", "time_scale", "policies",
                                     "repeats", "spread"}
    assert set(on_disk) <= declared, set(on_disk) - declared
    read = RunResult.from_json(run_dir, on_disk)
    assert (run.run_id, run.status, run.finished, run.capabilities, run.link_emulation) == (
        read.run_id, read.status, read.finished, read.capabilities, read.link_emulation)
    assert json.loads(json.dumps({n: p.to_json() for n, p in run.policies.items()})) == \
        on_disk["policies"]
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

    # key by key, the file holds every key a run of this scenario wrote before the results
    # were typed end to end, where results/3 keeps it (tests/keytree.py)
    before = keys_before("collective")
    assert lost(before["policy"], on_disk) == set() and lost(before["top"], on_disk, "top") == set()

    # every figure a run writes is declared (and documented) by the API, and the reverse
    declared = PolicyResult.json_keys()
    optional = {"latency_us_by_path", "jobs"}  # split fabrics only; jobs only
    per_collective = CollectiveResult.json_keys()
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
    frame_bits = full_frame_bytes(w.mtu) * 8
    ideal_us = 2 * (n - 1) * chunk_packets * frame_bits / run.scenario.topology.host_rate_mbit
    cct = hs["collectives"][0]["cct_us"]
    assert "cct_us" not in hs and len(cct["per_iteration"]) == w.iterations
    assert 0.9 * ideal_us <= cct["p50"] <= 3 * ideal_us

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


def test_every_policy_writes_a_trace_perfetto_loads_in_modelled_time(small_run):
    """timeline-<policy>.json: loadable (tracecheck), a process per GPU with its compute and
    stream tracks, every op of every iteration, switch counters, and modelled time."""
    run, run_dir, _messages = small_run
    n, w = 4, SMALL.workload
    for name in SMALL.policies:
        with open(os.path.join(run_dir, f"timeline-{name}.json")) as f:
            t = json.load(f)
        phases = check_trace(t)
        gpus = {e["args"]["name"] for e in t["traceEvents"]
                if e["ph"] == "M" and e["name"] == "process_name" and e["pid"] <= n}
        assert gpus == {f"gpu{r + 1} (rank {r})" for r in range(n)}
        ops = [e for e in t["traceEvents"] if e["ph"] == "X" and e["cat"] == "coll"]
        assert len(ops) == n * w.iterations  # the all-reduce, once per rank and iteration
        assert {e["args"]["collective"] for e in ops} == {"ring"}
        assert {e["args"]["bytes"] for e in ops} == {w.size_bytes}
        assert phases["C"] > 0, "no switch queue counters"
        # modelled time: the trace's span of the run, times the time scale, is the emulated one
        scale = run.time_scale
        assert t["otherData"]["time_scale"] == pytest.approx(scale, rel=1e-3)
        rows = [r for path in glob.glob(os.path.join(run_dir, "records", name,
                                                     "*.iterations.csv"))
                for r in csv.DictReader(open(path))]
        emulated_us = (max(int(r["end_ns"]) for r in rows)
                       - min(int(r["compute_start_ns"]) for r in rows)) / 1000
        its = [e for e in t["traceEvents"] if e["ph"] == "X" and e["cat"] == "iteration"]
        assert max(e["ts"] + e["dur"] for e in its) * scale == pytest.approx(emulated_us,
                                                                            rel=1e-3)
        # each iteration's all-reduce, first rank's start to last rank's end, is its CCT: both
        # from the compute phase's end to the last op's packet, whenever the agent served it
        cct = run.policy(name).cct_us.per_iteration  # modelled
        spans = [[e for e in ops if e["args"]["iteration"] == i] for i in range(w.iterations)]
        assert [max(e["ts"] + e["dur"] for e in s) - min(e["ts"] for e in s)
                for s in spans] == pytest.approx(cct, rel=1e-3)


def test_the_apis_times_are_the_printed_tables(small_run):
    """A scenario test written against the printed table reads the same numbers from the API:
    modelled time by default, emulated one step away."""
    run, _run_dir, _messages = small_run
    text, emulated = summary_table(run), summary_table(run, emulated=True)
    for k, name in enumerate(SMALL.policies, 1):
        p = run.policy(name)
        cct = next(line for line in text.splitlines() if line.startswith("CCT p50 (ms)"))
        assert cct.split()[-len(SMALL.policies) - 1 + k] == sig(p.cct_us.p50 / 1000)
        lat = next(line for line in text.splitlines() if line.startswith("latency p99 (us)"))
        assert lat.split()[-len(SMALL.policies) - 1 + k] == sig(p.latency_us.p99)
        cct = next(line for line in emulated.splitlines() if line.startswith("CCT p50 (ms)"))
        assert cct.split()[-len(SMALL.policies) - 1 + k] == fmt(p.emulated.cct_us.p50 / 1000)
        assert p.cct_us.p50 == pytest.approx(p.emulated.cct_us.p50 / run.time_scale,
                                             rel=1e-6)


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

    from testbed.results.plots import KIND_COLOURS, POLICY_COLOURS

    run, run_dir, messages = small_run
    url = "file://" + os.path.join(run_dir, "report.html")
    assert any("writing report.html" in m for m in messages)
    dom = _chromium(tmp_path, "--dump-dom", url).stdout
    table = re.search(r'<table id="comparison">(.*?)</table>', dom, re.S)
    assert table, "no comparison table in the rendered page"
    header = re.findall(r"<th>(.*?)</th>", table.group(1).split("</thead>")[0])
    assert header[1:] == list(run.policies) == list(SMALL.policies)
    assert len(re.findall(r"<img src=\"data:image/png;base64,", dom)) >= 4
    for name in SMALL.policies:  # each policy's Gantt, and the trace it links to
        assert f'href="plots/gantt-{name}.png"' in dom and f'href="timeline-{name}.json"' in dom

    shot = tmp_path / "report.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,9000", url)
    pixels = (imread(str(shot))[:, :, :3] * 255).round()
    assert pixels.std() > 20, "blank screenshot"
    for name in SMALL.policies:
        rgb = [int(POLICY_COLOURS[name][i:i + 2], 16) for i in (1, 3, 5)]
        drawn = (abs(pixels - rgb).max(axis=2) <= 8).sum()
        assert drawn > 200, f"{name}'s colour is not in the rendered plots ({drawn} pixels)"
    for kind in ("compute", "coll"):  # the Gantts' bars
        rgb = [int(KIND_COLOURS[kind][i:i + 2], 16) for i in (1, 3, 5)]
        drawn = (abs(pixels - rgb).max(axis=2) <= 8).sum()
        assert drawn > 200, f"no {kind} bars in the rendered Gantts ({drawn} pixels)"


def test_repeat_runs_each_policy_on_fresh_fabrics_and_shows_the_spread(tmp_path):
    from testbed.api import load_result

    scenario = tmp_path / "repeat.yaml"
    scenario.write_text("name: repeat\npolicies: [hyperscale, lossless]\n"
                        "topology: {spines: 2, leaves: 2, gpus_per_leaf: 2, host_rate_mbit: 20}\n"
                        "workload: {size_bytes: 262144, iterations: 2}\n")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "testbed", "run", "--scenario", str(scenario),
                           "--repeat", "3", "--out", str(out)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # rounds over the policies, each run on its own fabric, with its own files
    starts = [line.split("]")[0] + "]" for line in proc.stderr.splitlines()
              if line.endswith("starting the controller")]
    assert starts == [f"[{p} {i}/2, run {k}/3]" for k in (1, 2, 3)
                      for i, p in enumerate(("hyperscale", "lossless"), 1)]
    table = proc.stdout.splitlines()
    assert "3 runs: median [min-max]" in table[0]
    cct = next(line for line in table if line.startswith("CCT p50 (ms)"))
    (run_id,) = os.listdir(out)
    run_dir = out / run_id
    result = load_result(str(run_dir))
    # each policy's cell is its runs' median [min-max] (one number where all three agree to
    # the four digits shown: a fabric without contention may repeat its CCT exactly)
    cells = []
    for name in ("hyperscale", "lossless"):
        low, mid, high = (sig(f(r.cct_us.p50 for r in result.runs(name)) / 1e3)
                          for f in (min, statistics.median, max))
        cells += [mid] if low == high else [mid, f"[{low}-{high}]"]
    assert cct.split()[3:] == cells, cct
    for name in ("hyperscale", "lossless"):
        runs = result.runs(name)
        assert len(runs) == 3 and all(r.cct_us.p50 > 0 for r in runs)
        s = result.spread[name]["cct_p50_us"]
        assert s["values"] == [r.cct_us.p50 for r in runs]
        assert s["min"] <= s["median"] <= s["max"]
        for k in (2, 3):
            assert (run_dir / "records" / f"{name}.{k}").is_dir()
            assert (run_dir / f"timeline-{name}.{k}.json").exists()
    assert "Every run of each policy (repeat): CCT p50" in (run_dir / "report.html").read_text()
    assert (run_dir / "plots" / "spread.png").exists()
