"""Scenario checks that need more than the schema: the fabric plan, the policies, the
collectives, the machine (pure). The schema (``testbed.scenario.config``) checks each key and
the keys of one scenario against each other; everything here raises ``ConfigError`` before
anything starts. Not to be confused with ``testbed.validate``, the suite of published results.
"""
from __future__ import annotations

from typing import Optional

from controllers.policy import make_policy, policy_names
from traffic.collectives import ScheduleError
from traffic.collectives import build as build_collective

from ..base.capabilities import Capabilities
from ..base.errors import ConfigError
from ..base.hops import mechanism
from ..base.topology import FabricPlan
from ..scenario import capacity
from ..scenario.config import Scenario
from .background import background_plan, rxe_endpoints
from .marking import marking_method
from .policyrun import cluster_placement, workload_specs


def check_scenario(scenario: Scenario, available_mb: Optional[int] = None) -> FabricPlan:
    """Checks that need more than one key; raises ConfigError before anything starts. With
    ``available_mb`` (the machine's available memory) a fabric too large for it is refused
    first, before its schedules are built (they grow with the square of the GPUs). A rate
    still ``auto`` is checked at the reference rate (``Scenario.for_checks``)."""
    scenario = scenario.for_checks()
    known = policy_names()
    for p in scenario.policies:
        if p not in known and p not in scenario.variants:
            variants = f"; variants: {', '.join(scenario.variants)}" if scenario.variants else ""
            raise ConfigError(f"policies: unknown policy {p!r} (known: {', '.join(known)}"
                              f"{variants})")
    if len(set(scenario.policies)) != len(scenario.policies):
        raise ConfigError("policies: each policy may appear once")
    for label in scenario.variants:
        if label not in scenario.policies:
            raise ConfigError(f"variants.{label}: {label} is not among the policies run "
                              f"({', '.join(scenario.policies)}); name it there")
    plan = FabricPlan.for_topology(scenario.topology)
    if available_mb is not None:
        capacity.check(plan, available_mb)
    n = len(plan.gpus)
    if n < 2:
        raise ConfigError("topology: a collective needs at least 2 GPUs "
                          f"(leaves x gpus_per_leaf = {n})")
    _check_workload(scenario, plan)
    background = background_plan(plan, scenario)  # ConfigError for impossible traffic
    for name in scenario.policy_params:
        if name not in scenario.base_policies:
            raise ConfigError(f"policy_params.{name}: {name} is not among the policies run "
                              f"({', '.join(scenario.policies)})")
    if cluster_placement(scenario, plan):  # ConfigError for an impossible placement
        if scenario.measurement.pcap or not background.empty:
            raise ConfigError("cluster: packet capture and background traffic run on one "
                              "server only for now; drop measurement.pcap and background "
                              "from a split scenario")
        if scenario.topology.lossy_links:
            raise ConfigError("topology.lossy_links: a fabric split over servers cannot have "
                              "lossy links yet; run it on one server")
    if scenario.rxe.enabled:
        ends = rxe_endpoints(plan)  # ConfigError without two leaves
        if scenario.cluster.servers and len(scenario.cluster.servers) > 1:
            raise ConfigError("rxe: real verbs traffic runs on one server only for now; drop "
                              "cluster.servers or rxe")
        if not background.empty:
            raise ConfigError("rxe: the rxe endpoints are neighbour hosts, which background "
                              "traffic also uses; drop one of them")
    for label in scenario.policies:
        name, runs_with = scenario.policy_run(label)
        policy = make_policy(name, plan, runs_with)  # parameters that need the plan
        if scenario.rxe.enabled and not policy.may_reach(ends[0].name, ends[1].name):
            raise ConfigError(f"policy_params.{name}: the rxe endpoints {ends[0].name} and "
                              f"{ends[1].name} are in different tenants")
        ring = [h.name for h in plan.gpus]
        apart = [(a, b) for a, b in zip(ring, ring[1:] + ring[:1]) if not policy.may_reach(a, b)]
        if apart:
            raise ConfigError(f"policy_params.{name}: {apart[0][0]} may not reach {apart[0][1]} "
                              "(tenants), but the collective runs over all GPUs; put them in "
                              "one tenant")
    return plan


def _check_workload(scenario: Scenario, plan: FabricPlan) -> None:
    w, n = scenario.workload, len(plan.gpus)
    where = "workload.sizes" if w.sizes else "workload.size_bytes"
    for size in w.run_sizes:
        if size < n:
            raise ConfigError(f"{where}: must be >= the number of GPUs ({n}), got {size}")
    if len(set(w.sizes)) != len(w.sizes):
        raise ConfigError("workload.sizes: each size may appear once")
    for spec in workload_specs(scenario, plan):
        try:
            build_collective(spec.collective, n, spec.size, spec.chunks, spec.group)
        except ScheduleError as e:
            raise ConfigError(f"workload.collective: {e}")
    names = {h.name for h in plan.hosts}
    for host in scenario.measurement.pcap_hosts:
        if host not in names:
            raise ConfigError(f"measurement.pcap_hosts: no host named {host!r}")
    for r in w.stragglers.ranks:
        if not 0 <= r < n:
            raise ConfigError(f"workload.stragglers.ranks: rank {r} does not exist "
                              f"(ranks 0..{n - 1})")


def check_machine(scenario: Scenario, plan: FabricPlan, caps: Capabilities) -> None:
    """What each policy asks of this machine beyond running at all (``caps.require_run``): an
    ECN marking and a path-delay mechanism it has. A rate still ``auto`` is checked at the
    reference rate."""
    scenario = scenario.for_checks()
    for label in scenario.policies:
        name, runs_with = scenario.policy_run(label)
        policy = make_policy(name, plan, runs_with)
        marking_method(runs_with.emulation.ecn_marking, caps.red, policy.traffic_classes(),
                       caps.datapath)
    mechanism(scenario.emulation.path_delay, caps.netem)


def check_output(scenario: Scenario, fmt: str, one_collective: bool) -> None:
    """The command line's ``--format`` and ``--sizes``/``--collective`` against the scenario:
    they report and replay collectives, not a training job."""
    if fmt != "table" and scenario.workload.all_jobs:
        raise ConfigError(f"--format {fmt}: reports collectives; scenario "
                          f"{scenario.name!r} is a training job (name a collective scenario, "
                          "e.g. --scenario sweep; a job's operations are in the table)")
    if one_collective and scenario.workload.all_jobs:
        raise ConfigError(f"--sizes and --collective replay one collective; scenario "
                          f"{scenario.name!r} is a training job (leave --scenario out for the "
                          "ring, or name a collective scenario)")
