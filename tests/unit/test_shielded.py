"""The runner's shielded regions: teardown and a measured policy's figures finish before a
Ctrl-C or SIGTERM stops the run."""
import os
import signal

import pytest

from testbed.run.runner import shielded


def test_a_signal_in_nested_shielded_regions_comes_once_the_outermost_ends():
    """Teardown nests shielded regions inside the one that keeps a measured policy's
    figures: a Ctrl-C waits for the outermost, then stops the run once."""
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with shielded():
            with shielded():
                os.kill(os.getpid(), signal.SIGINT)
                steps.append("inner done")
            steps.append("outer done")
            os.kill(os.getpid(), signal.SIGTERM)
            steps.append("after a second signal")
    assert steps == ["inner done", "outer done", "after a second signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with shielded():  # nothing held over from before
        pass
