"""Built-in scenarios, finding a scenario by name or file, and the generated reference."""
import glob
import os

import pytest

from testbed.scenario import catalog, reference
from testbed.cli import main
from testbed.scenario.config import DEFAULT, load_file
from testbed.base.errors import ConfigError
from testbed.plan.checks import check_scenario

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
REQUIRED = {"default", "ring", "incast", "oversubscribed", "straggler", "ecmp-collisions", "sweep"}


def test_the_required_built_in_scenarios_exist_and_say_what_they_are():
    known = catalog.builtins()
    assert REQUIRED <= set(known)
    assert all(b.summary and not b.summary.startswith("sudo") for b in known.values())


@pytest.mark.parametrize("name", sorted(catalog.builtins()))
def test_every_built_in_scenario_validates(name):
    check_scenario(catalog.find(name))


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "examples", "*.yaml"))),
                         ids=os.path.basename)
def test_every_example_file_validates(path):
    check_scenario(load_file(path))


def test_find_takes_a_name_or_a_file_and_names_the_built_ins_otherwise(tmp_path):
    assert catalog.find("ring") == DEFAULT.override({"name": "ring"})  # every key's default
    assert catalog.find("default").workload.job.enabled  # the default run is a training job
    f = tmp_path / "mine.yaml"
    f.write_text("workload: {iterations: 2}\n")
    assert catalog.find(str(f)).workload.iterations == 2
    with pytest.raises(ConfigError, match=r"built-in: 3d-64, 3d, default, dp-buckets, ecmp"):
        catalog.find("nope")
    with pytest.raises(ConfigError, match="cannot read it"):
        catalog.find(str(tmp_path / "missing.yaml"))


def test_scenarios_command_lists_names_and_shows_one(capsys):
    assert main(["scenarios"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in REQUIRED)
    assert main(["scenarios", "--show", "noisy-neighbour"]) == 0
    assert "rate_gbit: 37.5" in capsys.readouterr().out
    assert main(["scenarios", "--show", "nope"]) == 2


def test_the_reference_files_are_what_the_schema_generates():
    # regenerate with: python -m testbed scenarios --reference > docs/scenario-reference.md
    #                  python -m testbed scenarios --template > examples/all-keys.yaml
    with open(os.path.join(ROOT, "docs", "scenario-reference.md"), encoding="utf-8") as f:
        assert f.read() == reference.markdown()
    with open(os.path.join(ROOT, "examples", "all-keys.yaml"), encoding="utf-8") as f:
        assert f.read() == reference.yaml_template()


def test_the_results_reference_is_what_the_api_declares():
    # regenerate with: python -m testbed.scenario.reference results
    with open(os.path.join(ROOT, "docs", "results.md"), encoding="utf-8") as f:
        text = f.read()
    marker = f"<!-- {reference.RESULTS_GENERATED} -->"
    assert marker in text and text[text.index(marker):] == reference.results_markdown()


def test_the_template_is_the_default_scenario_and_the_reference_has_every_key():
    assert load_file(os.path.join(ROOT, "examples", "all-keys.yaml")) == DEFAULT
    md = reference.markdown()
    for k in reference.keys():
        assert f"`{k.path.rsplit('.', 1)[-1]}`" in md
    for section in ("## `topology`", "## `workload.stragglers`", "## `background.incast`",
                    "## `measurement`", "## `policy_params.lossless`"):
        assert section in md


def test_oversubscription_sets_the_uplink_rate():
    from testbed.scenario.config import Scenario
    s = Scenario.from_dict({"topology": {"oversubscription": 2}})
    assert s.topology.fabric_rate_mbit == "auto"  # until the run chooses the host rate
    assert s.with_host_rate(40).topology.fabric_rate_mbit == 20.0  # 40 x 2 / (2 spines x 2)
    s = Scenario.from_dict({"topology": {"oversubscription": 2, "host_rate_mbit": 40}})
    assert s.topology.fabric_rate_mbit == 20.0
    with pytest.raises(ConfigError, match="contradicts oversubscription"):
        Scenario.from_dict({"topology": {"oversubscription": 2, "fabric_rate_mbit": 40,
                                         "host_rate_mbit": 40}})
    with pytest.raises(ConfigError, match="both set the uplink rate"):
        Scenario.from_dict({"topology": {"oversubscription": 2, "fabric_rate_mbit": 40}})
