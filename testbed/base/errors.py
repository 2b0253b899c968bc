"""The one exception root of the project.

Library code raises these; only the CLI (`testbed.cli`) turns them into one line for the user
and an exit code. Each subclass names the part that failed.
"""


class TestbedError(Exception):
    """Root of every error the testbed raises on purpose."""

    exit_code = 1
    __test__ = False  # not a pytest test class, despite the name


class ConfigError(TestbedError):
    """A scenario or command-line value is invalid; nothing has been started."""

    exit_code = 2


class CapabilityError(TestbedError):
    """The machine lacks something the run needs (root, Open vSwitch, a qdisc)."""


class FabricError(TestbedError):
    """Building, shaping or tearing down the emulated fabric failed."""


class ControllerError(TestbedError):
    """The OpenFlow controller failed to start, died, or did not program the switches."""


class AgentError(TestbedError):
    """A traffic agent failed to start, died, or did not finish in time."""


class RunBusyError(TestbedError):
    """Another testbed run, or what a dead one left behind, holds the machine's fabric names."""


class ResultsError(TestbedError):
    """Results (a results.json, or a producer's figures) do not match their declarations in
    testbed/results/model.py."""

    exit_code = 2
