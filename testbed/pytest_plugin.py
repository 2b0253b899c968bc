"""pytest plugin for scenario tests: ``testbed_run`` runs a scenario on real fabrics.

Installed with the package (entry point ``pytest11``), so any test in the project's venv can
use it; elsewhere add ``pytest_plugins = ["testbed.pytest_plugin"]`` to a ``conftest.py``::

    def test_lossless_loses_nothing_on_oversubscribed_uplinks(testbed_run):
        result = testbed_run("oversubscribed", policies=["hyperscale", "lossless"],
                             workload={"iterations": 2})
        assert result.policy("lossless").drops == 0
        assert result.policy("hyperscale").drops > 0

A test that uses ``testbed_run`` is skipped, with the reason, where a run cannot happen (not
root, Open vSwitch not running, Mininet or os-ken missing). Runs go to the test's temporary
directory; ``--testbed-keep DIR`` keeps them in DIR instead, and ``-s`` shows their progress.
Deprecation warnings that the run's third-party libraries raise (Mininet's use of distutils:
139 in a two-leaf run) stay out of the test's output; the user's own code is not filtered.
"""
from __future__ import annotations

import os
import warnings

import pytest


# what a run imports and calls in the test's process, besides the testbed itself
THIRD_PARTY = r"(mininet|distutils|setuptools|pkg_resources|scapy|pyroute2|matplotlib)(\..*)?$"


def pytest_addoption(parser):
    group = parser.getgroup("testbed")
    group.addoption("--testbed-keep", metavar="DIR", default=None,
                    help="keep scenario runs (results, records, logs, report) under DIR")


def pytest_configure(config):
    config.addinivalue_line("markers", "scenario: a scenario test on real fabrics "
                                       "(root and Open vSwitch; skipped elsewhere)")


@pytest.fixture
def testbed_run(request, tmp_path):
    """Call it with a scenario (built-in name, YAML file, mapping or Scenario), optional
    ``policies`` and partial overrides; returns a ``testbed.api.RunResult``."""
    from testbed.api import run_scenario
    from testbed.fabric.capabilities import detect

    problems = detect().problems_for_run()
    if problems:
        pytest.skip("cannot run a fabric here: " + "; ".join(problems))
    keep = request.config.getoption("--testbed-keep")
    out_root = os.path.abspath(keep) if keep else str(tmp_path)
    capture = request.config.getoption("capture")

    def run(spec, policies=None, **overrides):
        progress = print if capture == "no" else (lambda message: None)
        with warnings.catch_warnings():
            for category in (DeprecationWarning, PendingDeprecationWarning):
                warnings.filterwarnings("ignore", category=category, module=THIRD_PARTY)
            return run_scenario(spec, policies=policies, out_root=out_root,
                                progress=progress, **overrides)

    return run
