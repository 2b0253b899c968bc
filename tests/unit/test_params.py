import pytest

from controllers.params import LosslessParams, resolve
from testbed.base.errors import ConfigError


def test_byte_defaults_scale_with_the_modelled_link_rate():
    at100 = resolve("lossless", {}, 100.0, 4096)
    at200 = resolve("lossless", {}, 200.0, 4096)
    assert at100 == LosslessParams()
    assert at200.pfc_xoff_bytes == 2 * at100.pfc_xoff_bytes
    assert at200.ecn_pmax == at100.ecn_pmax  # not a byte quantity


def test_the_emulated_rate_leaves_the_bytes_as_they_are():
    # a byte is a byte at every time scale: the same switch drains it in the same modelled time
    from controllers.policy import make_policy
    from testbed.scenario.config import Scenario
    from testbed.base.topology import FabricPlan

    plan = FabricPlan(2, 4, 2)
    at = {rate: make_policy("lossless", plan, Scenario().with_host_rate(rate)).params
          for rate in (40, 20, 5)}
    assert at[40] == at[20] == at[5] == LosslessParams()
    faster = Scenario.from_dict({"topology": {"modelled_rate_gbit": 400}}).with_host_rate(40)
    assert make_policy("lossless", plan, faster).params.pfc_xoff_bytes == \
        4 * LosslessParams().pfc_xoff_bytes


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
