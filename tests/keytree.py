"""The key tree of a results.json: every path to a value, so that two runs' files compare key by
key whatever their values (``python -m tests.keytree results.json`` prints it).

List items share one path (``[]``); mappings keyed by names the run chose - hosts, ports,
ranks, timer kinds, components - share one (``*``), since which names appear varies from run
to run (a port that never marked is not listed)."""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, Set

from testbed.results.model import COLLECTIVE_FIGURES, JOB_FIGURES

BEFORE = os.path.join(os.path.dirname(__file__), "integration", "data",
                      "results-keys-77a3626.json")

# paths (below a policy, or at the top) whose mapping is keyed by names, not by figures
NAME_KEYED = {
    "per_gpu", "drops_by_port", "link_losses_by_port", "spine_load_packets",
    "red_marked_by_port", "pcap", "fan_in", "exposed_comm_us", "path_delay_us",
    "latency_floor_us", "bytes_per_iteration", "bytes_per_iteration.*",
    "bytes_sent_per_rank.expected", "bytes_sent_per_rank.measured",
    "by_timer", "forwarding_histogram", "max_backlog", "max_backlog.*", "ecn", "pfc",
    "credit", "lanes", "counters", "cpu_s", "in_kernel_s", "us_per_frame",
    "delay_us_modelled", "delay_us_netem", "path_us_applied", "measured_min_us",
    "params", "spread", "repeats", "background", "tests", "attempts", "policies",
}


def key_tree(data: Any, path: str = "") -> Set[str]:
    """Every path to a value in ``data`` (module docstring)."""
    out: Set[str] = set()
    if isinstance(data, dict):
        last = ".".join(path.split(".")[-2:]) if path else ""
        named = path.split(".")[-1] in NAME_KEYED or last in NAME_KEYED
        for key, value in data.items():
            child = f"{path}.{'*' if named else key}" if path else ("*" if named else key)
            out |= {child} | key_tree(value, child)
    elif isinstance(data, list):
        for value in data:
            out |= key_tree(value, f"{path}[]")
    return out


def policy_tree(results: dict) -> Set[str]:
    """The key tree of every policy of a results.json, the policies' names folded into one."""
    return set().union(*(key_tree(p) for p in results["policies"].values()))


def empty_named(data: Any, path: str = "") -> Set[str]:
    """The paths of name-keyed mappings that are empty in ``data`` (a run where no port
    marked has an empty ``switch_queues.ecn``: its entries' keys are absent, not lost)."""
    out: Set[str] = set()
    if isinstance(data, dict):
        last = ".".join(path.split(".")[-2:]) if path else ""
        named = path.split(".")[-1] in NAME_KEYED or last in NAME_KEYED
        if named and not data:
            out.add(path)
        for key, value in data.items():
            child = f"{path}.{'*' if named else key}" if path else ("*" if named else key)
            out |= empty_named(value, child)
    elif isinstance(data, list):
        for value in data:
            out |= empty_named(value, f"{path}[]")
    return out


# results/3 keeps the one collective's and the first job's figures only in collectives[] and
# jobs[] (results/2 also wrote them at the policy's level, their modelled twins under
# modelled): a key moved there is not lost
MOVED = {**{k: "collectives[]" for k in COLLECTIVE_FIGURES},
         **{k: "jobs[]" for k in JOB_FIGURES}}


def moved(path: str) -> str:
    """Where results/3 keeps a policy's key path of results/2 (the path itself if there)."""
    head, _, rest = path.partition(".")
    if head == "modelled" and rest.split(".")[0] in MOVED:
        return f"{MOVED[rest.split('.')[0]]}.modelled.{rest}"
    return f"{MOVED[head]}.{path}" if head in MOVED else path


def lost(before: Set[str], results: dict, part: str = "policy") -> Set[str]:
    """The paths of ``before`` (a key tree of an earlier version's run) that ``results`` does
    not have (where results/3 keeps them: ``moved``): of its policies (``part="policy"``) or at
    its top (``"top"``), apart from entries of a name-keyed mapping empty this time."""
    if part == "policy":
        now = policy_tree(results)
        empty = set().union(*(empty_named(p) for p in results["policies"].values()))
        before = {moved(p) for p in before}
    else:
        top = {k: v for k, v in results.items() if k != "policies"}
        now, empty = key_tree(top), empty_named(top)
    return {p for p in before - now if not any(p.startswith(e + ".*") for e in empty)}


def keys_before(scenario: str) -> Dict[str, Set[str]]:
    """The key trees ({top, policy}) of an earlier version's run of ``scenario`` (BEFORE)."""
    with open(BEFORE, encoding="utf-8") as f:
        return {part: set(paths) for part, paths in json.load(f)[scenario].items()}


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        print("\n".join(sorted(policy_tree(json.load(f)))))
