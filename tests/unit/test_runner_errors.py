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
