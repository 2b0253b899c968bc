"""``python -m testbed validate --quick`` on real fabrics: every case passes faithfully, the
table and the suite's report are written, and the report renders in headless Chromium."""
import json
import os
import re
import subprocess
import sys

import pytest

from testbed.validate import cases, suite
from .test_run import CHROMIUM, _chromium

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    out = tmp_path_factory.mktemp("validate")
    proc = subprocess.run([sys.executable, "-m", "testbed", "validate", "--quick", "--out",
                           str(out)], capture_output=True, text=True, timeout=1200)
    (where,) = os.listdir(out)
    return proc, os.path.join(out, where)


def test_every_case_passes_faithfully_and_the_table_says_so(validated):
    proc, where = validated
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(os.path.join(where, "validation.json")) as f:
        data = json.load(f)
    assert [c["name"] for c in data["cases"]] == [c.name for c in cases.CASES]
    assert all(c["status"] == suite.PASS for c in data["cases"]), data
    for c in data["cases"]:  # every run kept beside the table, each with its results
        for run in c["runs"].values():
            assert os.path.exists(os.path.join(where, run, "results.json"))
    table = open(os.path.join(where, "validation.md")).read()
    assert table.count("| pass (tolerance:") == len(cases.CASES)
    for case in cases.CASES:  # a progress line per case and run
        assert f"[{case.name} run 1/" in proc.stderr and case.name in proc.stdout


@pytest.mark.skipif(not CHROMIUM, reason="needs chromium (make test installs it: "
                    "scripts/install.sh --test-tools)")
def test_the_suites_report_renders_in_headless_chromium(validated, tmp_path):
    from matplotlib.image import imread

    from testbed.results.plots import PASS_COLOUR

    _proc, where = validated
    url = "file://" + os.path.join(where, "report.html")
    dom = _chromium(tmp_path, "--dump-dom", url).stdout
    table = re.search(r'<table id="validation">(.*?)</table>', dom, re.S).group(1)
    assert len(re.findall(r"<tr>", table)) == len(cases.CASES) + 1
    shot = tmp_path / "validation.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,3000", url)
    pixels = (imread(str(shot))[:, :, :3] * 255).round()
    green = [int(PASS_COLOUR[i:i + 2], 16) for i in (1, 3, 5)]  # a passing case's bars
    assert (abs(pixels - green).max(axis=2) <= 8).sum() > 1000
