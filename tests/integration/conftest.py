import pytest

from .leftovers import leftovers
from .runs import start_run, stop


@pytest.fixture(autouse=True)
def nothing_left_behind(request):
    """Every integration test starts clean and must leave the machine clean."""
    if "integration" not in request.keywords:
        yield
        return
    before = leftovers()
    assert not before, f"machine not clean before the test: {before}"
    yield
    after = leftovers()
    assert not after, f"left behind: {after}"


@pytest.fixture
def run_process():
    """Starts `python -m testbed run` processes; any still going when the test ends (a failed
    assertion on the way) is stopped with Ctrl-C, so one failure does not leave a fabric
    behind for every test after it."""
    started = []

    def start(out_dir, *args):
        started.append(start_run(out_dir, *args))
        return started[-1]

    yield start
    for proc in started:
        stop(proc)
