"""Fuzzing the scenario loader (hypothesis): random YAML text, random YAML data and mutated
built-in scenarios. Every input either loads and passes ``check_scenario`` (everything checked
before a run starts anything) or raises ``ConfigError`` with a one-line message naming where;
nothing else - no other exception, no traceback."""
import copy
import os

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.scenario.catalog import builtins, find
from testbed.scenario.config import Scenario
from testbed.base.errors import ConfigError
from testbed.plan.checks import check_scenario

FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
MACHINE_MB = 24 * 1024  # a run passes the machine's available memory; the fuzz, a fixed one
BUILTIN = {name: entry.load().to_dict() for name, entry in builtins().items()}


def outcome(path) -> str:
    """'ok' or 'refused'; any other exception fails the test."""
    try:
        check_scenario(find(str(path)), available_mb=MACHINE_MB)
        return "ok"
    except ConfigError as e:
        message = str(e)
        assert message and "\n" not in message and "Traceback" not in message, message
        assert len(message) < 600, message
        assert ": " in message, f"no path in {message!r}"
        return "refused"


def write(tmp_path, text: str):
    path = tmp_path / "fuzz.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@FUZZ
@given(st.text(max_size=400))
def test_random_text(tmp_path, text):
    outcome(write(tmp_path, text))


scalars = (st.none() | st.booleans() | st.integers(-10**12, 10**12)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
KEYS = sorted({k for d in BUILTIN.values() for k in d} | {"topology", "workload", "spines"})
data = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), inner,
                                      max_size=4), max_leaves=20)


@FUZZ
@given(data)
def test_random_yaml_data(tmp_path, value):
    outcome(write(tmp_path, yaml.safe_dump(value)))


def _paths(d, prefix=()):
    for k, v in d.items():
        yield prefix + (k,)
        if isinstance(v, dict):
            yield from _paths(v, prefix + (k,))


@st.composite
def mutated(draw):
    """A built-in scenario with one to three keys replaced, removed or added."""
    name = draw(st.sampled_from(sorted(BUILTIN)))
    d = copy.deepcopy(BUILTIN[name])
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(d))
        path = draw(st.sampled_from(paths))
        parent = d
        for k in path[:-1]:
            parent = parent[k]
        if not isinstance(parent, dict):
            continue
        how = draw(st.sampled_from(["replace", "remove", "add", "scale"]))
        old = parent.get(path[-1])
        if how == "replace":
            parent[path[-1]] = draw(scalars | st.lists(scalars, max_size=3))
        elif how == "remove":
            parent.pop(path[-1], None)
        elif how == "add":
            parent[draw(st.text(min_size=1, max_size=10))] = draw(scalars)
        elif isinstance(old, (int, float)) and not isinstance(old, bool):
            parent[path[-1]] = old * draw(st.sampled_from([-1, 0, 2, 1000, 10**9]))
    return d


@FUZZ
@given(mutated())
def test_mutated_builtin_scenarios(tmp_path, d):
    outcome(write(tmp_path, yaml.safe_dump(d)))


def test_every_builtin_still_loads():
    for name in BUILTIN:
        check_scenario(Scenario.from_dict(BUILTIN[name]))


@pytest.mark.parametrize("text, where", [
    ("topology: {spines: 0}", "topology.spines"),
    ("topology: {leaves: 256}", "topology.leaves"),
    ("topology: {gpus_per_leaf: 200, neighbours_per_leaf: 60}", "neighbours_per_leaf"),
    ("topology: {host_rate_mbit: 100000}", "topology.host_rate_mbit"),
    ("topology: {leaves: 1, gpus_per_leaf: 1}", "at least 2 GPUs"),
])
def test_impossible_topologies_are_refused_up_front(tmp_path, text, where):
    with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
        check_scenario(find(str(write(tmp_path, text))))


def test_yaml_is_loaded_safely_no_object_is_constructed(tmp_path):
    marker = tmp_path / "constructed"
    text = f"name: !!python/object/apply:os.system ['touch {marker}']\n"
    with pytest.raises(ConfigError, match="not valid YAML"):
        find(str(write(tmp_path, text)))
    assert not os.path.exists(marker)


def test_a_fabric_this_machine_cannot_hold_is_refused_before_it_starts(tmp_path, monkeypatch):
    from testbed.scenario import capacity
    from testbed.run import runner

    big = find(str(write(tmp_path, "topology: {leaves: 64, gpus_per_leaf: 64}")))
    with pytest.raises(ConfigError, match=r"topology: 4096 GPUs need about 36\d\.\d GiB"):
        check_scenario(big, available_mb=24 * 1024)  # addresses are fine, 4096 agents are not
    check_scenario(Scenario(), available_mb=24 * 1024)  # the default fits easily
    monkeypatch.setattr(capacity, "mem_available_mb", lambda: 1024)
    monkeypatch.setattr(runner, "detect", lambda: pytest.fail("started checking the machine"))
    with pytest.raises(ConfigError, match="8 GPUs need about 1.2 GiB"):
        runner.run(Scenario(), out_root=str(tmp_path / "results"))
    assert not (tmp_path / "results").exists()


def test_a_whole_tree_where_a_value_belongs_is_quoted_short(tmp_path):
    """Found by test_random_yaml_data: a mapping of long strings given as the policies made a
    message of 600+ characters (every value quoted in full)."""
    value = {"policies": {f"k{i}": "x" * 60 for i in range(20)}}
    assert outcome(write(tmp_path, yaml.safe_dump(value))) == "refused"
