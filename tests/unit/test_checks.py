"""Checks across keys that ``testbed.plan.checks`` makes before anything starts."""
import os

import pytest

from testbed.scenario.config import Scenario
from testbed.base.errors import ConfigError
from testbed.plan.checks import check_scenario


def _check(**changes):
    return check_scenario(Scenario.from_dict(changes))


def test_halving_doubling_needs_a_power_of_two_gpus():
    _check(workload={"collective": "halving_doubling"})  # 8 GPUs
    with pytest.raises(ConfigError, match="workload.collective: .*power-of-two"):
        _check(workload={"collective": "halving_doubling"}, topology={"leaves": 3})


def test_straggler_ranks_must_exist():
    with pytest.raises(ConfigError, match="stragglers.ranks: rank 8 does not exist"):
        _check(workload={"stragglers": {"ranks": [8]}})


def test_every_size_of_a_sweep_must_cover_the_gpus():
    with pytest.raises(ConfigError, match=r"workload.sizes: must be >= the number of GPUs \(8\)"):
        _check(workload={"sizes": [4, 65536]})


def test_background_traffic_needs_the_hosts_it_names():
    with pytest.raises(ConfigError, match="neighbour hosts"):
        _check(background={"noisy_neighbour": {"rate_gbit": 12.5}})
    with pytest.raises(ConfigError, match="incast.target: no host named 'gpu99'"):
        _check(background={"incast": {"period_us": 80, "target": "gpu99"}})
    plan = _check(topology={"neighbours_per_leaf": 1},
                  background={"noisy_neighbour": {"rate_gbit": 12.5}})
    assert len(plan.neighbours) == 4 and len(plan.gpus) == 8


def test_pcap_hosts_must_exist_and_default_to_every_gpu():
    from testbed.fabric.capture import capture_hosts

    with pytest.raises(ConfigError, match="measurement.pcap_hosts: no host named 'gpu99'"):
        _check(measurement={"pcap": True, "pcap_hosts": ["gpu99"]})
    scenario = Scenario.from_dict({"measurement": {"pcap": True}})
    assert capture_hosts(check_scenario(scenario), scenario.measurement) == [
        f"gpu{i}" for i in range(1, 9)]
    scenario = Scenario.from_dict({"measurement": {"pcap_hosts": ["gpu3"]}})
    assert capture_hosts(check_scenario(scenario), scenario.measurement) == ["gpu3"]


def test_a_refused_run_leaves_no_results_directory(tmp_path, monkeypatch):
    from testbed.run import runner
    from testbed.base.errors import RunBusyError

    class Busy:
        def __init__(self, run_id):
            pass

        def acquire(self, run_dir=None):
            raise RunBusyError("another testbed run is active (pid 1)")

    class Caps:
        red, datapath, bpf_marking, netem = False, "user", False, False

        def require_run(self):
            pass

        def to_dict(self):
            return {}

    monkeypatch.setattr(runner, "Ledger", Busy)
    with pytest.raises(RunBusyError):
        runner.run(Scenario.from_dict({}), out_root=str(tmp_path), caps=Caps())
    assert list(tmp_path.iterdir()) == []


def test_rxe_traffic_is_refused_where_it_cannot_run():
    one_leaf = Scenario.from_dict({"rxe": {"enabled": True}, "topology": {"leaves": 1,
                                                                          "gpus_per_leaf": 2}})
    with pytest.raises(ConfigError, match="at least 2 leaves"):
        check_scenario(one_leaf)
    split = Scenario.from_dict({"rxe": {"enabled": True},
                                "cluster": {"servers": ["localhost", "10.9.0.2"]}})
    with pytest.raises(ConfigError, match="one server only"):
        check_scenario(split)
    apart = Scenario.from_dict({"rxe": {"enabled": True}, "policies": ["enterprise"],
                                "policy_params": {"enterprise": {"tenants": [["nb1"]]}}})
    with pytest.raises(ConfigError, match="different tenants"):
        check_scenario(apart)


def test_rxe_traffic_without_rdma_rxe_is_refused_before_anything_starts(tmp_path):
    from testbed.run import runner
    from testbed.base.capabilities import Capabilities
    from testbed.base.errors import CapabilityError

    caps = Capabilities(root=True, qdiscs={}, ovs_running=True, ovs_version="3.1.0",
                        openvswitch_module=False, os_ken=True, mininet=True, tshark=True,
                        rxe_module="missing", perftest=True)
    with pytest.raises(CapabilityError, match="rdma_rxe module .here: missing"):
        runner.run(Scenario.from_dict({"rxe": {"enabled": True}}), out_root=str(tmp_path),
                   caps=caps)
    assert list(tmp_path.iterdir()) == []


def test_a_mechanism_this_machine_lacks_is_refused_before_anything_starts(tmp_path):
    from testbed.run import runner
    from testbed.base.capabilities import Capabilities
    from testbed.base.topology import FabricPlan
    from testbed.plan.checks import check_machine

    caps = Capabilities(root=True, qdiscs={"red": False, "netem": False}, ovs_running=True,
                        ovs_version="3.1.0", openvswitch_module=False, os_ken=True,
                        mininet=True, tshark=True)
    red = Scenario.from_dict({"policies": ["lossless"], "emulation": {"ecn_marking": "red"}})
    with pytest.raises(ConfigError, match="ecn_marking: red is not possible here"):
        check_machine(red, FabricPlan(2, 4, 2), caps)
    check_machine(red.with_policies(["enterprise"]), FabricPlan(2, 4, 2), caps)  # no ECN class
    netem = Scenario.from_dict({"emulation": {"path_delay": "netem"}})
    with pytest.raises(ConfigError, match="path_delay: netem is not possible here"):
        runner.run(netem, out_root=str(tmp_path), caps=caps)
    assert list(tmp_path.iterdir()) == []


def test_the_controller_marks_ecn_only_where_the_kernel_cannot():
    """Sampled marking: by the BPF program where it runs (no ip_ecn in the pipeline), by
    OpenFlow groups elsewhere; RED marks in the kernel whatever the program can do."""
    from testbed.base.capabilities import Capabilities
    from testbed.plan.policyrun import decide
    from testbed.base.topology import FabricPlan

    plan = FabricPlan(2, 4, 2)
    scenario = Scenario.from_dict({}).for_checks()

    def caps(bpf, red=False):
        return Capabilities(root=True, qdiscs={"red": red}, ovs_running=True,
                            ovs_version="3.1.0", openvswitch_module=False, os_ken=True,
                            mininet=True, tshark=True, bpf_marking=bpf)

    def openflow_marking(name, caps):
        run = decide(name, plan, scenario, caps)
        assert run.policy.context.openflow_marking == (run.marking_via == "openflow")
        return run.policy.context.openflow_marking

    assert not openflow_marking("lossless", caps(True))
    assert openflow_marking("lossless", caps(False))
    assert not openflow_marking("lossless", caps(False, red=True))
    assert not openflow_marking("enterprise", caps(False))


def test_the_allocator_open_vswitch_runs_with_is_read_from_its_memory_map(tmp_path):
    from testbed.fabric.capabilities import allocator_in, ovs_allocator
    lib = "7f01-7f02 r-xp 00000000 fe:01 123 /usr/lib/x86_64-linux-gnu/{}\n"
    assert allocator_in(lib.format("libtcmalloc_minimal.so.4.5.9")) == "tcmalloc"
    assert allocator_in(lib.format("libjemalloc.so.2")) == "jemalloc"
    assert allocator_in(lib.format("libc.so.6")) == "glibc"
    assert ovs_allocator(str(tmp_path / "no.pid")) is None
    pidfile = tmp_path / "self.pid"
    pidfile.write_text(f"{os.getpid()}\n")
    assert ovs_allocator(str(pidfile)) in ("glibc", "tcmalloc", "jemalloc")
