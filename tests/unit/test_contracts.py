"""The typed contracts between the runner and its child processes survive the wire (JSON)
unchanged, and a config that does not match the contract is refused, not half-read."""
import dataclasses
import json

import pytest

from controllers.contract import ControllerConfig
from controllers.policy import make_policy, policy_names
from testbed.base.contract import ContractError, dump, load
from testbed.run.agent_processes import agent_configs
from testbed.scenario.config import Scenario
from testbed.base.topology import FabricPlan
from traffic.contract import AgentConfig, GpuConfig

from .decided import CAPS, decided

PLAN = FabricPlan(2, 4, 2)


def over_the_wire(data: dict) -> dict:
    return json.loads(json.dumps(data))


@pytest.mark.parametrize("bpf_marking", [True, False])
@pytest.mark.parametrize("name", policy_names())
def test_the_controller_rebuilds_the_policy_the_runner_configured(name, bpf_marking):
    s = Scenario.from_dict({"workload": {"mtu": 1024},
                            "topology": {"oversubscription": 2}}).for_checks()
    policy = decided(name, PLAN, s, dataclasses.replace(CAPS, bpf_marking=bpf_marking)).policy
    again = ControllerConfig.from_dict(over_the_wire(ControllerConfig.of(policy).to_dict()))
    rebuilt = again.build()
    assert rebuilt.params == policy.params and rebuilt.context == policy.context
    assert rebuilt.plan.to_dict() == policy.plan.to_dict()
    for sw in PLAN.switches:
        assert rebuilt.switch_connected(sw.dpid) == policy.switch_connected(sw.dpid)


@pytest.mark.parametrize("name", ["hyperscale", "lossless"])
def test_an_agent_reads_back_the_configs_the_runner_wrote(name):
    s = Scenario.from_dict({"workload": {"sizes": [65536, 131072], "compute_us": 1,
                                         "stragglers": {"ranks": [3], "delay_us": 2}}}
                           ).for_checks()
    gpus = tuple(dataclasses.replace(c, netns_pid=1000 + c.rank)
                 for c in agent_configs(decided(name, PLAN, s), "/tmp/x"))
    config = AgentConfig(gpus, "/tmp/records")
    assert AgentConfig.from_dict(over_the_wire(config.to_dict())) == config
    # lossless and hyperscale run DCQCN: the rate limiters' settings travel as a nested contract
    assert (config.gpus[0].transport.qp_limiter is not None) == (name != "enterprise")


def test_a_config_with_a_key_the_contract_does_not_have_is_refused():
    s = Scenario.from_dict({}).for_checks()
    wire = over_the_wire(agent_configs(decided("hyperscale", PLAN, s), "/x")[0]
                         .to_dict())
    GpuConfig.from_dict(wire)
    with pytest.raises(ContractError, match="GpuConfig: colour: not declared in traffic/contract.py"):
        GpuConfig.from_dict(dict(wire, colour="red"))
    with pytest.raises(ContractError, match="transport"):
        GpuConfig.from_dict({k: v for k, v in wire.items() if k != "transport"})


def test_the_emulator_reads_back_its_config():
    from testbed.switchq.contract import EmulatorConfig

    s = Scenario.from_dict({}).for_checks()
    policy = make_policy("lossless", PLAN, s)  # adaptive routing: watched ports
    cfg = EmulatorConfig(plan=PLAN, classes=tuple(policy.traffic_classes()),
                         interval_us=1000.0, mtu=4196, host_rate_mbit=40.0,
                         fabric_rate_mbit=40.0, nic_queue_bytes=96000, out="/x/q.json",
                         host_pids={h.name: 100 + i for i, h in enumerate(PLAN.hosts)},
                         delayed=("lf1-eth1",), ecn_marking=None,
                         watch={d: tuple(p) for d, p in policy.watched_ports().items()},
                         nodes=("lf1", "sp1"), server="b", owner={"lf1": "b"})
    again = EmulatorConfig.from_dict(over_the_wire(cfg.to_dict()))
    assert again.plan.to_dict() == cfg.plan.to_dict()
    assert dataclasses.replace(again, plan=cfg.plan) == cfg
    with pytest.raises(ContractError, match="EmulatorConfig: interval_ms: not declared"):
        EmulatorConfig.from_dict(dict(cfg.to_dict(), interval_ms=1))


def test_every_process_contract_refuses_a_key_it_does_not_declare_by_its_path():
    """One mechanism (testbed.base.contract): the controller's config refuses an unknown key
    too (it used to drop it), down to nested sections."""
    policy = make_policy("lossless", PLAN, Scenario.from_dict({}).for_checks())
    wire = over_the_wire(ControllerConfig.of(policy).to_dict())
    with pytest.raises(ContractError, match="ControllerConfig: colour: not declared"):
        ControllerConfig.from_dict(dict(wire, colour="red"))
    with pytest.raises(ContractError, match=r"ControllerConfig.context: mtus: not declared"):
        ControllerConfig.from_dict(dict(wire, context=dict(wire["context"], mtus=1)))
    with pytest.raises(ContractError, match=r"ControllerConfig.context: must be a mapping"):
        ControllerConfig.from_dict(dict(wire, context=[1]))


def test_the_contract_loader_turns_json_back_into_types():
    from typing import Dict, Optional, Tuple

    @dataclasses.dataclass(frozen=True)
    class Inner:
        n: int
        tags: Tuple[str, ...] = ()

    @dataclasses.dataclass(frozen=True)
    class Outer:
        by_dpid: Dict[int, Tuple[int, ...]]
        inner: Optional[Inner] = None
        plan: Optional[FabricPlan] = None

    value = Outer({3: (1, 2)}, Inner(1, ("a",)), PLAN)
    again = load(Outer, json.loads(json.dumps(dump(value))))
    assert again.by_dpid == {3: (1, 2)} and again.inner == value.inner
    assert again.plan.to_dict() == PLAN.to_dict()
    assert load(Outer, {"by_dpid": {}}).inner is None
    with pytest.raises(ContractError, match=r"Outer.inner: m: not declared"):
        load(Outer, {"by_dpid": {}, "inner": {"n": 1, "m": 2}})
    with pytest.raises(ContractError, match=r"Outer.by_dpid.3: must be a list"):
        load(Outer, {"by_dpid": {"3": 4}})
    # lenient (results.json of another version): the key is left out, raw keeps it all

    @dataclasses.dataclass(frozen=True)
    class Read:
        n: int = 0
        own: str = dataclasses.field(default="x", metadata={"json": False})
        raw: Dict[str, int] = dataclasses.field(default_factory=dict,
                                                metadata={"json": False})

    read = load(Read, {"n": 1, "later": 2}, strict=False)
    assert (read.n, read.own, read.raw) == (1, "x", {"n": 1, "later": 2})
    with pytest.raises(ContractError, match=r"Read: later: not declared"):
        load(Read, {"n": 1, "later": 2})
    with pytest.raises(ContractError, match=r"Read: own: not declared"):
        load(Read, {"own": "y"})  # the object's own field is never read from JSON


def test_the_runner_reads_the_controllers_state_file_as_events(tmp_path):
    from testbed.base.errors import ControllerError
    from testbed.run.controller_process import ControllerProcess
    from controllers.contract import ControllerEvent

    class Policy:
        name, plan = "hyperscale", None
    proc = ControllerProcess(Policy(), str(tmp_path), str(tmp_path), ledger=None)
    lines = [ControllerEvent("programmed", 1.0, dpid=1, switch="lf1").to_dict(),
             ControllerEvent("programmed", 2.0, dpid=2, switch="lf2").to_dict()]
    with open(proc.state_path, "w") as f:
        f.write("".join(json.dumps(e) + "\n" for e in lines) + '{"event": "progr')
    assert proc.programmed() == {1, 2}  # a line still being written is skipped
    with open(proc.state_path, "a") as f:
        f.write("\n" + json.dumps(ControllerEvent("error", 3.0, dpid=3, type=5, code=2)
                                  .to_dict()) + "\n")
    with pytest.raises(ControllerError, match="switch 0000000000000003 rejected.*type 5 code 2"):
        proc.programmed()
    with open(proc.state_path, "w") as f:
        f.write(json.dumps({"event": "programmed", "time": 1.0, "dpid": 1, "port": 4}) + "\n")
    with pytest.raises(ContractError, match="port"):  # a key the contract lacks: a bug, loud
        proc.programmed()
