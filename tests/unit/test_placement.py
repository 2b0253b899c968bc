"""Where the nodes of a split fabric go (testbed.plan.placement)."""
import pytest

from testbed.base.errors import ConfigError
from testbed.plan.placement import by_server, cross_links, place
from testbed.base.topology import FabricPlan

PLAN = FabricPlan(2, 4, 2)  # the default: 2 spines, 4 leaves, 8 GPUs


def test_by_leaf_keeps_each_leaf_with_its_gpus_and_spines_where_links_are_fewest():
    where = place(PLAN, ["a", "b"])
    assert [where[f"lf{i}"] for i in range(1, 5)] == ["a", "a", "b", "b"]
    assert all(where[h.name] == where[f"lf{h.leaf}"] for h in PLAN.hosts)
    assert where["sp1"] == where["sp2"] == "a"  # a tie: the first server
    cross = cross_links(PLAN, where)
    assert all(link.kind == "fabric" for link in cross)  # host links never cross
    assert len(cross) == 2 * 2  # two spines x the two leaves on b
    assert by_server(where, ["a", "b"])["b"] == ["lf3", "lf4", "gpu5", "gpu6", "gpu7", "gpu8"]


def test_spines_go_to_the_server_with_the_most_leaves():
    plan = FabricPlan(3, 5, 1)
    where = place(plan, ["a", "b"])
    assert [where[f"lf{i}"] for i in range(1, 6)] == ["a", "a", "a", "b", "b"]
    assert {where[s.name] for s in plan.spines} == {"a"}
    # any other spine position would cross more: 3 spines x 2 leaves vs 3 x 3
    assert len(cross_links(plan, where)) == 6
    where_b = dict(where, sp1="b", sp2="b", sp3="b")
    assert len(cross_links(plan, where_b)) == 9


def test_spread_deals_leaves_and_spines_out_round_robin():
    where = place(PLAN, ["a", "b"], "spread")
    assert [where[f"lf{i}"] for i in range(1, 5)] == ["a", "b", "a", "b"]
    assert (where["sp1"], where["sp2"]) == ("a", "b")
    assert len(cross_links(PLAN, where)) == 4 and all(
        link.kind == "fabric" for link in cross_links(PLAN, where))


def test_one_server_crosses_nothing():
    assert cross_links(PLAN, place(PLAN, ["localhost"])) == []


@pytest.mark.parametrize("servers, placement, message", [
    ([], "by-leaf", "at least one server"),
    (["a", "a"], "by-leaf", "each server may appear once"),
    (["a", "b", "c", "d", "e"], "by-leaf", "5 servers for 4 leaves"),
    (["a", "b"], "random", "must be one of by-leaf, spread"),
])
def test_impossible_placements_are_refused(servers, placement, message):
    with pytest.raises(ConfigError, match=message):
        place(PLAN, servers, placement)
