"""A user's scenario test prints what the user's code warns about, not the run's libraries'."""
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.scenario, pytest.mark.integration]

USER_TEST = textwrap.dedent('''
    import warnings


    def test_a_small_ring(testbed_run):
        warnings.warn("the user's own deprecation", DeprecationWarning)
        result = testbed_run({"topology": {"leaves": 2, "gpus_per_leaf": 1},
                              "workload": {"iterations": 1, "size_bytes": 65536}},
                             policies=["hyperscale"])
        assert result.policy("hyperscale").drops == 0
''')


def test_a_scenario_test_shows_its_own_warnings_and_not_mininets(tmp_path):
    (tmp_path / "test_mine.py").write_text(USER_TEST)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "test_mine.py"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "1 passed, 1 warning" in out.stdout, out.stdout[-3000:]
    assert "the user's own deprecation" in out.stdout
    assert "distutils" not in out.stdout and "mininet" not in out.stdout, out.stdout[-3000:]
