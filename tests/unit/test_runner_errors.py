"""What a run keeps of an error it did not expect: the traceback, beside its results."""
from testbed.run.runner import _keep_traceback


def test_an_unexpected_error_leaves_its_traceback_in_the_run_directory(tmp_path):
    try:
        b"\xdf!".decode("utf-8")
    except UnicodeDecodeError as e:
        said = _keep_traceback(str(tmp_path), e)
    assert said.startswith("unexpected UnicodeDecodeError: 'utf-8' codec can't decode byte 0xdf")
    assert said.endswith("(traceback.txt)")
    kept = (tmp_path / "traceback.txt").read_text()
    assert "Traceback (most recent call last)" in kept and "test_runner_errors.py" in kept
    assert kept.rstrip().endswith("invalid continuation byte")


def test_a_run_interrupted_after_a_policy_keeps_that_policys_results(tmp_path, monkeypatch):
    """Ctrl-C during the second policy: results.json says incomplete and still holds the
    first policy's figures (what the attempt kept so far is written, never dropped)."""
    import contextlib
    import json

    import pytest

    from testbed.results.model import CpuWakeup, PolicyResult
    from testbed.run import runner
    from testbed.scenario.config import Scenario

    class Caps:
        red, datapath, bpf_marking, netem, nic_in_c = False, "user", False, False, True

        def require_run(self):
            pass

        def to_dict(self):
            return {}

    class Ledger:
        def __init__(self, run_id):
            pass

        def acquire(self, run_dir=None):
            pass

        def teardown(self):
            return []

        def close(self):
            pass

    def run_policy(run, caps, run_dir, ledger, say, keep):
        if run.name != "enterprise":
            raise KeyboardInterrupt
        keep(run, PolicyResult.from_json({"gpus": 8, "drops": 3}, name=run.title),
             {"link_emulation": {"datapath": "user"}})

    monkeypatch.setattr(runner, "Ledger", Ledger)
    monkeypatch.setattr(runner, "run_policy", run_policy)
    monkeypatch.setattr(runner, "_write_report", lambda run_dir, progress: None)
    monkeypatch.setattr(runner, "cpus_kept_awake", lambda enabled: contextlib.nullcontext(
        CpuWakeup(note="not in a unit test")))
    scenario = Scenario.from_dict({"topology": {"host_rate_mbit": 40}})
    with pytest.raises(KeyboardInterrupt):
        runner.run(scenario, out_root=str(tmp_path), caps=Caps(), calibrated=False)
    (run_dir,) = tmp_path.iterdir()
    on_disk = json.loads((run_dir / "results.json").read_text())
    assert on_disk["status"] == "incomplete" and on_disk["error"] == "interrupted"
    assert list(on_disk["policies"]) == ["enterprise"]
    assert on_disk["policies"]["enterprise"]["drops"] == 3
