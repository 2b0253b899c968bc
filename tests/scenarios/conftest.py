"""Scenario tests use the testbed's pytest plugin (``testbed_run``); in this repository they
are also checked for leftovers like the integration tests."""
import pytest

from tests.integration.leftovers import leftovers


@pytest.fixture(autouse=True)
def nothing_left_behind():
    before = leftovers()
    assert not before, f"machine not clean before the test: {before}"
    yield
    after = leftovers()
    assert not after, f"left behind: {after}"
