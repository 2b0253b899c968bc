import pytest

from controllers.params import LosslessParams, resolve
from testbed.errors import ConfigError


def test_byte_defaults_scale_with_the_link_rate():
    at40 = resolve("lossless", {}, 40.0, 4096)
    at80 = resolve("lossless", {}, 80.0, 4096)
    assert at40 == LosslessParams()
    assert at80.pfc_xoff_bytes == 2 * at40.pfc_xoff_bytes
    assert at80.ecn_pmax == at40.ecn_pmax  # not a byte quantity


def test_never_below_two_frames_and_overrides_are_taken_as_given():
    slow = resolve("hyperscale", {}, 1.0, 4096)
    assert slow.buffer_bytes == 2 * (4096 + 100)
    given = resolve("hyperscale", {"buffer_bytes": 5000}, 1.0, 4096)
    assert given.buffer_bytes == 5000


def test_unknown_parameters_and_policies_are_refused():
    with pytest.raises(ConfigError, match="policy_params.lossless.pfc_xof: unknown key"):
        resolve("lossless", {"pfc_xof": 1}, 40, 4096)
    with pytest.raises(ConfigError, match="unknown policy 'infiniband'"):
        resolve("infiniband", {}, 40, 4096)
    with pytest.raises(ConfigError, match="must be one of off, step"):
        resolve("hyperscale", {"ecn": "red"}, 40, 4096)
