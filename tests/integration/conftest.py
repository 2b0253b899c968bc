import pytest

from .leftovers import leftovers


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
