
import pytest

from testbed.scenario.config import DEFAULT, Scenario
from testbed.base.errors import ConfigError
from testbed.plan.checks import check_scenario
from tests.unit.decided import decided


def test_defaults_are_the_documented_default_scenario():
    s = Scenario.from_dict({})
    assert s == DEFAULT
    assert (s.topology.spines, s.topology.leaves, s.topology.gpus_per_leaf) == (2, 4, 2)
    assert s.topology.gpus == 8
    assert s.policies == ("enterprise", "hyperscale", "lossless")
    assert s.emulation.sample_interval_us == "auto" and s.policy_params == {}
    assert s.for_checks().sample_interval_us == 1000  # 0.4 us modelled at 2,500x
    assert s.with_host_rate(5).sample_interval_us == 8000
    assert s.with_host_rate(1000).sample_interval_us == 200  # the emulator's floor
    assert (s.workload.size_bytes, s.workload.iterations) == (1 << 20, 10)
    assert s.topology.host_rate_mbit == s.topology.fabric_rate_mbit == "auto"
    with pytest.raises(ConfigError, match="auto"):
        s.time_scale  # chosen by the runner, from this machine's calibration
    assert s.for_checks().time_scale == pytest.approx(100e3 / 40)
    assert s.with_host_rate(20).topology.fabric_rate_mbit == 20.0  # auto: equal to the host


def test_values_override_defaults_and_round_trip():
    s = Scenario.from_dict({"topology": {"leaves": 2, "host_rate_mbit": 25},
                            "workload": {"iterations": 3}, "policies": "hyperscale"})
    assert s.topology.leaves == 2 and s.topology.host_rate_mbit == 25.0
    assert s.workload.iterations == 3 and s.policies == ("hyperscale",)
    assert Scenario.from_dict(s.to_dict()) == s


@pytest.mark.parametrize("data,message", [
    ({"topology": {"leaves": 0}}, "topology.leaves: must be >= 1, got 0"),
    ({"topology": {"leafs": 2}}, "topology.leafs: unknown key (allowed:"),
    ({"colour": 1}, "colour: unknown key"),
    ({"topology": {"spines": "two"}}, "topology.spines: must be an integer, got 'two'"),
    ({"topology": {"spines": True}}, "topology.spines: must be an integer"),
    ({"topology": {"host_rate_mbit": float("nan")}}, "topology.host_rate_mbit: must be a number"),
    ({"topology": {"host_rate_mbit": 5000}}, "topology.host_rate_mbit: must be <= 1000.0"),
    ({"workload": {"mtu": 1500}}, "workload.mtu: must be one of 256, 512, 1024, 2048, 4096"),
    ({"workload": {"collective": "tree"}}, "workload.collective: must be one of ring, halving_doubling"),
    ({"workload": []}, "workload: must be a mapping, got list"),
    ({"policies": []}, "policies: must be a non-empty list"),
    ([], "scenario: must be a mapping"),
])
def test_bad_values_name_the_path(data, message):
    with pytest.raises(ConfigError) as e:
        Scenario.from_dict(data)
    assert message in str(e.value)


def test_policy_params_are_checked_against_each_policy():
    s = Scenario.from_dict({"policy_params": {"lossless": {"pfc_xoff_bytes": 60000}}})
    assert s.policy_params == {"lossless": {"pfc_xoff_bytes": 60000}}
    assert Scenario.from_dict(s.to_dict()) == s
    with pytest.raises(ConfigError, match="policy_params.lossless.pfc_xof: unknown key"):
        Scenario.from_dict({"policy_params": {"lossless": {"pfc_xof": 1}}})
    with pytest.raises(ConfigError, match="policy_params: unknown policy 'ib'"):
        Scenario.from_dict({"policy_params": {"ib": {}}})
    with pytest.raises(ConfigError, match="tenants.0.: no GPU named 'gpu9'"):
        check_scenario(Scenario.from_dict(
            {"policy_params": {"enterprise": {"tenants": [["gpu9"]]}}}))
    with pytest.raises(ConfigError, match="gpu4 may not reach gpu5 .tenants."):
        check_scenario(Scenario.from_dict({"policy_params": {"enterprise": {
            "tenants": [["gpu1", "gpu2", "gpu3", "gpu4"]]}}}))
    with pytest.raises(ConfigError, match="hyperscale is not among the policies run"):
        check_scenario(Scenario.from_dict({"policies": ["lossless"],
                                     "policy_params": {"hyperscale": {"ecn": "step"}}}))


def test_cross_checks_before_anything_starts():
    with pytest.raises(ConfigError, match="unknown policy 'fast'"):
        check_scenario(DEFAULT.with_policies(["fast"]))
    with pytest.raises(ConfigError, match="at least 2 GPUs"):
        check_scenario(Scenario.from_dict({"topology": {"leaves": 1, "gpus_per_leaf": 1}}))
    with pytest.raises(ConfigError, match="size_bytes"):
        check_scenario(Scenario.from_dict({"workload": {"size_bytes": 4}}))
    with pytest.raises(ConfigError, match="once"):
        check_scenario(DEFAULT.with_policies(["hyperscale", "hyperscale"]))
    assert len(check_scenario(DEFAULT).hosts) == 8


def test_override_is_validated_and_keeps_the_rest():
    s = DEFAULT.override({"workload": {"iterations": 3}})
    assert s.workload.iterations == 3 and s.workload.size_bytes == DEFAULT.workload.size_bytes
    with pytest.raises(ConfigError, match="workload.iterations: must be >= 1"):
        DEFAULT.override({"workload": {"iterations": 0}})


def test_scenario_files_load_safely_and_report_the_file(tmp_path):
    from testbed.scenario.config import load_file
    good = tmp_path / "s.yaml"
    good.write_text("policies: [lossless]\npolicy_params:\n  lossless: {pfc_xoff_bytes: 60000}\n"
                    "workload: {iterations: 2}\n")
    s = load_file(str(good))
    assert s.policies == ("lossless",) and s.workload.iterations == 2
    assert s.policy_params["lossless"]["pfc_xoff_bytes"] == 60000
    bad = tmp_path / "bad.yaml"
    bad.write_text("topology: {leaves: 0}\n")
    with pytest.raises(ConfigError, match="bad.yaml: topology.leaves: must be >= 1, got 0"):
        load_file(str(bad))
    evil = tmp_path / "evil.yaml"
    evil.write_text("!!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError, match="evil.yaml: not valid YAML"):
        load_file(str(evil))
    broken = tmp_path / "broken.yaml"
    broken.write_text("topology: {leaves: [\n")
    with pytest.raises(ConfigError, match=r"broken.yaml: not valid YAML \(line 2"):
        load_file(str(broken))
    with pytest.raises(ConfigError, match="cannot read it"):
        load_file(str(tmp_path / "missing.yaml"))


def test_sizes_parse_like_nccl_tests():
    from testbed.scenario.config import parse_size, parse_sizes
    assert parse_size("64K") == 65536 and parse_size("4m") == 4 << 20 and parse_size("100") == 100
    assert parse_sizes("64K:1M") == (65536, 131072, 262144, 524288, 1 << 20)
    assert parse_sizes("64K,1M") == (65536, 1 << 20)
    for bad in ("abc", "1M:64K", "0.5", ","):
        with pytest.raises(ConfigError, match="--sizes"):
            parse_sizes(bad)


def test_workload_sections_validate_and_round_trip():
    s = Scenario.from_dict({"workload": {
        "collective": "double_binary_tree", "sizes": [65536, 131072], "chunks": 8,
        "compute_us": 1, "stragglers": {"ranks": [1, 3], "delay_us": 2,
                                          "distribution": "exponential"}},
        "background": {"noisy_neighbour": {"rate_gbit": 25, "tool": "iperf3"},
                       "incast": {"period_us": 80, "senders": ["nb1"], "target": "gpu8"}},
        "topology": {"neighbours_per_leaf": 1}})
    assert s.workload.run_sizes == (65536, 131072)
    assert s.workload.stragglers.ranks == (1, 3)
    assert s.background.enabled and s.background.incast.senders == ("nb1",)
    assert Scenario.from_dict(s.to_dict()) == s
    with pytest.raises(ConfigError, match="workload.stragglers.distribution"):
        Scenario.from_dict({"workload": {"stragglers": {"distribution": "pareto"}}})
    with pytest.raises(ConfigError, match=r"workload.sizes\[1\]: must be an integer"):
        Scenario.from_dict({"workload": {"sizes": [1024, "big"]}})


def test_narrowing_the_policies_drops_the_others_parameters():
    s = Scenario.from_dict({"policy_params": {"enterprise": {"spanning_tree_root": 2},
                                              "lossless": {"adaptive_routing": False}}})
    narrowed = s.with_policies(["lossless"])
    assert narrowed.policies == ("lossless",) and list(narrowed.policy_params) == ["lossless"]


def test_path_delay_reads_an_unquoted_off_as_off():
    import yaml
    data = yaml.safe_load("emulation: {path_delay: off}")
    assert data["emulation"]["path_delay"] is False  # YAML 1.1
    assert Scenario.from_dict(data).emulation.path_delay == "off"
    assert Scenario.from_dict({}).emulation.path_delay == "auto"
    with pytest.raises(ConfigError, match="path_delay"):
        Scenario.from_dict({"emulation": {"path_delay": True}})


VARIANTS = {"policies": ["lossless", "ib", "roce-pfc"],
            "policy_params": {"lossless": {"pfc_xoff_bytes": 60000}},
            "variants": {"ib": {"policy": "lossless", "congestion_control": "none",
                                "policy_params": {"flow_control": "credit"}},
                         "roce-pfc": {"congestion_control": "none"}}}


def test_a_variant_runs_its_policy_with_its_parameters_over_the_scenarios():
    s = Scenario.from_dict(VARIANTS)
    assert Scenario.from_dict(s.to_dict()) == s
    assert s.base_policies == ("lossless",)
    name, ib = s.policy_run("ib")
    assert name == "lossless" and ib.transport.congestion_control == "none"
    assert ib.policy_params["lossless"] == {"pfc_xoff_bytes": 60000, "flow_control": "credit"}
    assert s.policy_run("lossless") == ("lossless", s)  # a plain policy runs the scenario
    assert s.policy_run("roce-pfc")[1].policy_params == s.policy_params
    plan = check_scenario(s)
    runs = {label: decided(label, plan, s.for_checks()) for label in s.policies}
    assert {label: r.name for label, r in runs.items()} == {
        "lossless": "lossless", "ib": "ib", "roce-pfc": "roce-pfc"}
    assert [r.congestion_control for r in runs.values()] == ["dcqcn", "none", "none"]
    roce = {label: next(c for c in r.classes if c.name == "roce") for label, r in runs.items()}
    assert roce["ib"].credit and not roce["ib"].pfc and roce["lossless"].pfc.xoff == 60000
    # dropping a variant drops it and parameters nothing runs any longer
    assert Scenario.from_dict(VARIANTS).with_policies(["hyperscale"]).variants == {}


@pytest.mark.parametrize("variants, error", [
    ({"lossless": {}}, "variants.lossless: lossless is a policy's name"),
    ({"IB credits": {}}, "variants: a label is 1-40 lowercase"),
    ({"ib": {"policy": "infiniband"}}, "variants.ib.policy: must be one of"),
    ({"ib": {"policy_params": {"flow_contrl": "credit"}}},
     "variants.ib.policy_params.flow_contrl: unknown key"),
    ({"ib": {"policy_params": {"flow_control": "credits"}}},
     "variants.ib.policy_params.flow_control: must be one of pfc, credit"),
    ({"ib": {"mtu": 4096}}, "variants.ib.mtu: unknown key"),
])
def test_a_variant_is_refused_with_the_key_named(variants, error):
    with pytest.raises(ConfigError, match=error):
        Scenario.from_dict({"policies": ["ib"], "variants": variants})


def test_a_variant_must_be_run_and_a_run_label_must_be_known():
    with pytest.raises(ConfigError, match="variants.ib: ib is not among the policies run"):
        check_scenario(Scenario.from_dict({"policies": ["lossless"], "variants": {"ib": {}}}))
    with pytest.raises(ConfigError, match="unknown policy 'ib'.*variants: roce"):
        check_scenario(Scenario.from_dict({"policies": ["ib", "roce"], "variants": {"roce": {}}}))
