"""The answer does not depend on the time scale: a contended scenario at two GPU NIC rates 2x
apart gives the same modelled CCTs and the same order of policies.

2:1 oversubscribed uplinks and a double binary tree at 20 and 10 Mbit/s: enterprise (one
spanning tree: every inter-leaf flow on one spine) and hyperscale (ECMP), both with buffers deep
enough that queues, not drops, decide. Which of them is faster is not the question: ECMP
hashes this tree's heavy flows onto one uplink of a leaf, as the spanning tree does by design
(docs/time-scale.md has the figures). Left out, each for a measured reason (docs/time-scale.md):
40 Mbit/s (this contended run saturates the 2-core reference machine there, and the
unfaithful run's lossless CCT came out 20% high); tail drops (hyperscale's per-iteration CCTs
spread 530-1,600 us at one rate with 80-105 RTOs a run, so a median of a few iterations moves
10-25% between repeats at the same rate); and lossless, whose DCQCN makes the same run's CCT
p50 wander 274-316 us between repeats at one rate."""
import pytest

from benchmarks.invariance import run_at, spread
from testbed.scenario.config import Scenario

pytestmark = pytest.mark.integration

CONTENDED = Scenario.from_dict({
    "policies": ["enterprise", "hyperscale"],
    "topology": {"oversubscription": 2},
    "workload": {"collective": "double_binary_tree", "size_bytes": 512 * 1024,
                 "iterations": 4},
    "policy_params": {"enterprise": {"buffer_bytes": 4_000_000},
                      "hyperscale": {"buffer_bytes": 4_000_000, "ecn": "off"}}})


def test_a_contended_run_means_the_same_at_two_time_scales(tmp_path):
    by_rate = {f"{r:g}": run_at(CONTENDED, r, str(tmp_path / f"{r:g}")) for r in (20.0, 10.0)}
    s = spread(by_rate)
    for name in CONTENDED.policies:
        assert s["spread"][name] <= 0.10, by_rate
    assert s["same_order"], by_rate
