"""report.html, its plots, ``report DIR`` and ``compare A B`` on a run directory made from
synthetic agent records (the headless-browser test renders a real run's page)."""
import base64
import csv
import io
import json
import os
import re
import sys

import pytest

from testbed.base.contract import dump
from testbed.results import compare, htmlreport, rundata, term
from testbed.cli import main
from testbed.scenario.config import DEFAULT
from testbed.results.collect import RunContext, collect
from tests.unit.test_results import RING, _two_gpus

PNG = b"\x89PNG\r\n\x1a\n"
PORTS = ["lf1-eth3", "lf2-eth3", "sp1-eth1"]


def _timeline(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["time_ns"] + PORTS + ["paused"])
        w.writerows(rows)


def make_run(root, status="complete", policies=("hyperscale", "lossless"), scenario=None):
    run = os.path.join(str(root), f"run-{status}")
    results = {"schema": "ai-fabric-testbed/results/2", "run_id": "20261130-000000-abcd",
               "status": status, "started": "a", "finished": "b", "version": "0.1.0",
               "scenario": (scenario or DEFAULT.for_checks()).to_dict(), "time_scale": 2500.0,
               "capabilities": {"datapath": "netdev", "netem": False}, "policies": {}}
    for i, name in enumerate(policies):
        records = os.path.join(run, "records", name)
        os.makedirs(records)
        _two_gpus(records)
        figures, _ = collect(records, RunContext(ranks=2, workloads=[RING]))
        figures.update(spine_load_packets={"sp1": 10 + i, "sp2": 12},
                       fidelity={"verdict": "ok" if i == 0 else "outside tolerance",
                                 "problems": [] if i == 0 else ["CPU saturated"],
                                 "advice": "lower the rates"})
        results["policies"][name] = dump(figures)
        t0 = 1_000_000_000
        _timeline(os.path.join(run, f"switchq-{name}.timeline.csv"),
                  [[t0 + k * 5_000_000, k * 1000, 0, 500 * (k % 2),
                    "sp1-eth1 lf1-eth3" if 2 <= k < 4 else ""] for k in range(8)])
    os.makedirs(run, exist_ok=True)
    with open(os.path.join(run, "results.json"), "w") as f:
        json.dump(results, f)
    return run


def test_the_report_holds_the_table_the_plots_the_scenario_and_the_verdicts(tmp_path):
    run = make_run(tmp_path)
    path = htmlreport.write(run)
    page = open(path, encoding="utf-8").read()
    table = re.search(r'<table id="comparison">(.*?)</table>', page, re.S).group(1)
    assert "<th>hyperscale</th>" in table and "<th>lossless</th>" in table
    assert "latency p99 (us)" in table
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    # latency CDF, CCT, one queue timeline per policy, spine load
    assert len(images) == 5
    assert all(base64.b64decode(i).startswith(PNG) for i in images)
    assert sorted(os.listdir(os.path.join(run, "plots"))) == [
        "cct.png", "latency-cdf.png", "queues-hyperscale.png", "queues-lossless.png",
        "spine-load.png"]
    assert "http://" not in page and "https://" not in page and "<script" not in page
    assert "outside tolerance" in page and "CPU saturated" in page
    assert "collective: ring" in page  # the scenario, as YAML
    assert 'id="status" class="ok">complete' in page


def test_a_job_s_report_plots_its_iterations_and_lists_its_operations(tmp_path):
    run = make_run(tmp_path)
    with open(os.path.join(run, "results.json")) as f:
        results = json.load(f)
    from testbed.results.model import PolicyResult, with_modelled
    scale = results["time_scale"]
    for k, (name, p) in enumerate(results["policies"].items()):
        iteration = {"p50": 3e6 + k, "per_iteration": [3e6, 3.1e6 + k]}
        job = {"name": "dense-7b", "byte_scale": 100.0, "operations": [
            {"kind": "dp", "collective": "ring", "group": 4, "bytes": 2_013_265, "count": 48,
             "time_us_p50": 402.6, "algbw_gbps": 40.0, "busbw_gbps": 60.0}]}
        p.update(iteration_us=iteration, job=job, job_compute_us=373.5 * scale,
                 exposed_comm_us={"dp": 770.0 * scale, "tp": 37.0 * scale,
                                  "total": 807.0 * scale},
                 ideal_iteration_us=373.3 * scale)
        results["policies"][name] = dump(with_modelled(PolicyResult.from_json(p), scale))
    with open(os.path.join(run, "results.json"), "w") as f:
        json.dump(results, f)
    page = open(htmlreport.write(run), encoding="utf-8").read()
    plotted = sorted(os.listdir(os.path.join(run, "plots")))
    assert "iterations.png" in plotted and "iteration-parts.png" in plotted
    assert "cct.png" not in plotted  # a job has iterations, not one collective's CCT
    section = page[page.index("<h2>Training job operations</h2>"):page.index("<h2>Per GPU")]
    assert section.count("<table") == 2 and "hyperscale: dense-7b operations" in section
    assert "402.6" in section and "busbw (Gb/s)" in section
    parts = rundata.iteration_parts(rundata.load_run(run))
    assert parts["hyperscale"] == {"compute": 0.3735, "dp": 0.77, "tp": 0.037,
                                   "ideal": 0.3733}


def test_an_incomplete_run_says_so_and_plots_what_it_has(tmp_path):
    run = make_run(tmp_path, status="incomplete", policies=("enterprise",))
    os.remove(os.path.join(run, "switchq-enterprise.timeline.csv"))
    page = open(htmlreport.write(run), encoding="utf-8").read()
    assert "This run is <b>incomplete</b>" in page
    assert len(re.findall(r"data:image/png", page)) == 3  # no queue timeline to draw


def test_a_failed_run_without_a_finished_policy_still_gets_its_page(tmp_path):
    run = make_run(tmp_path, status="failed", policies=())
    page = open(htmlreport.write(run), encoding="utf-8").read()
    assert "This run is <b>failed</b>" in page and page.endswith("</html>\n")


def test_without_matplotlib_the_page_is_still_written(tmp_path, monkeypatch):
    run = make_run(tmp_path)
    import importlib

    import testbed.results
    importlib.import_module("testbed.results.plots")  # loaded: there is a module to take away
    monkeypatch.delattr(testbed.results, "plots")
    monkeypatch.delitem(sys.modules, "testbed.results.plots")
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    page = open(htmlreport.write(run), encoding="utf-8").read()
    assert "matplotlib is missing" in page and "<table id=\"comparison\">" in page


def test_pfc_pauses_become_intervals_per_queue(tmp_path):
    run = make_run(tmp_path)
    tl = rundata.timeline(run, "lossless")
    assert tl.t_s[:3] == [0.0, 0.005, 0.01]
    assert tl.paused == {"lf1-eth3": [(0.01, 0.02)], "sp1-eth1": [(0.01, 0.02)]}
    assert tl.backlogs["lf1-eth3"][-1] == 7000.0
    from testbed.results.plots import busiest
    assert list(busiest(tl.backlogs, 2)) == ["lf1-eth3", "sp1-eth1"]  # lf2-eth3 never queued


def test_a_pause_still_open_at_the_end_lasts_to_the_last_window(tmp_path):
    path = tmp_path / "switchq-x.timeline.csv"
    _timeline(path, [[0, 0, 0, 0, ""], [5_000_000, 0, 0, 0, "sp1-eth1"]])
    assert rundata.timeline(str(tmp_path), "x").paused == {"sp1-eth1": [(0.005, 0.01)]}


def test_report_command_redraws_a_saved_run_and_refuses_a_folder_without_results(
        tmp_path, capsys):
    run = make_run(tmp_path)
    assert main(["report", run, "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == os.path.join(run, "report.html")
    assert main(["report", str(tmp_path)]) == 2
    assert "no results.json" in capsys.readouterr().err


def test_compare_shows_changed_figures_and_scenario_keys(tmp_path, capsys):
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", policies=("hyperscale",),
                 scenario=DEFAULT.for_checks().override({"topology": {"fabric_rate_mbit": 20}}))
    with open(os.path.join(b, "results.json")) as f:
        rb = json.load(f)
    rb["policies"]["hyperscale"]["drops"] = 5
    with open(os.path.join(b, "results.json"), "w") as f:
        json.dump(rb, f)
    assert main(["compare", a, b]) == 0
    out = capsys.readouterr().out
    assert "lossless only in A" in out
    drops = next(line for line in out.splitlines() if line.startswith("drops"))
    assert drops.split()[-4:] == ["1", "5", "+4", "(+400%)"]
    assert re.search(r"topology\.fabric_rate_mbit\s+40\s+20", out)


def test_scenario_diff_names_absent_keys():
    diff = compare.scenario_diff({"a": {"b": 1, "c": 2}}, {"a": {"b": 1}, "d": [1]})
    assert diff == [("a.c", 2, compare.ABSENT), ("d", compare.ABSENT, [1])]


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_colour_only_on_a_tty_and_never_with_no_color(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert term.paint("x", "warn", Tty()) == "\033[33mx\033[0m"
    assert term.paint("x", "warn", io.StringIO()) == "x"
    monkeypatch.setenv("NO_COLOR", "1")
    assert term.paint("x", "warn", Tty()) == "x"


@pytest.mark.parametrize("values", [{}, {"p": []}])
def test_plots_of_nothing_are_still_images(values):
    from testbed.results import plots
    assert plots.latency_cdf(values).startswith(PNG)
    assert plots.cct_per_iteration(values).startswith(PNG)
    assert plots.iteration_parts({}).startswith(PNG)
    assert plots.spine_load({}).startswith(PNG)


def test_the_plots_and_tables_are_in_modelled_time_and_emulated_on_request(tmp_path):
    from testbed.results.model import PolicyResult, with_modelled
    run = make_run(tmp_path)
    with open(os.path.join(run, "results.json")) as f:
        results = json.load(f)
    for name, p in results["policies"].items():  # as a run at this time scale writes them
        results["policies"][name] = dump(with_modelled(PolicyResult.from_json(p),
                                                       results["time_scale"]))
    with open(os.path.join(run, "results.json"), "w") as f:
        json.dump(results, f)
    typed = rundata.load_run(run)
    assert rundata.ccts(typed)["hyperscale"] == [49.0 / 2500]  # what cct.png draws
    assert rundata.ccts(typed, emulated=True)["hyperscale"] == [49.0]
    assert list(rundata.latencies(run, "hyperscale", 2500.0)) == [
        v / 2500 for v in rundata.latencies(run, "hyperscale")]
    page = open(htmlreport.write(run), encoding="utf-8").read()
    assert "per policy (ring, 1M), modelled time" in page
    page = open(htmlreport.write(run, emulated=True), encoding="utf-8").read()
    assert "per policy (ring, 1M), emulated time" in page
