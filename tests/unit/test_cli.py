import json
import os

import testbed.run.runner
from testbed.base.errors import ConfigError


from testbed.cli import build_parser, main


def test_bad_policy_is_one_line_and_exit_code_2(capsys):
    assert main(["run", "--policy", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: policies: unknown policy 'nope' "
                   "(known: enterprise, hyperscale, lossless)"]


def test_empty_policy_list(capsys):
    assert main(["run", "--policy", " , "]) == 2
    assert "at least one policy" in capsys.readouterr().err


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "run" in capsys.readouterr().out


def test_policy_all_and_lists(monkeypatch):
    seen = []

    def fake_run(scenario, **_kw):
        seen.append(scenario.policies)
        raise ConfigError("stop here")

    monkeypatch.setattr(testbed.run.runner, "run", fake_run)
    main(["run"])
    main(["run", "--policy", "all"])
    main(["run", "--policy", "lossless,hyperscale"])
    assert seen == [("enterprise", "hyperscale", "lossless")] * 2 + [("lossless", "hyperscale")]


def test_the_default_run_is_the_job_and_collective_options_start_from_the_ring(
        monkeypatch, capsys):
    seen = []

    def fake_run(scenario, **_kw):
        seen.append(scenario)
        raise ConfigError("stop here")

    monkeypatch.setattr(testbed.run.runner, "run", fake_run)
    main(["run"])
    main(["run", "--collective", "all_to_all"])
    main(["run", "--sizes", "64K,1M"])
    assert seen[0].name == "default" and seen[0].workload.all_jobs
    assert seen[1].name == "ring" and seen[1].workload.collective == "all_to_all"
    assert seen[2].name == "ring" and seen[2].workload.run_sizes == (65536, 1 << 20)
    capsys.readouterr()
    assert main(["run", "--scenario", "3d", "--collective", "ring"]) == 2
    assert "scenario '3d' is a training job" in capsys.readouterr().err


def test_run_options():
    args = build_parser().parse_args(["run", "--policy", "hyperscale", "--out", "x", "--json"])
    assert (args.policy, args.out, args.json) == ("hyperscale", "x", True)


def test_check_json_reports_capabilities(capsys):
    code = main(["check", "--json"])
    caps = json.loads(capsys.readouterr().out)
    assert code in (0, 1)
    for key in ("root", "qdiscs", "ovs_running", "openvswitch_module", "os_ken", "mininet",
                "tshark", "datapath"):
        assert key in caps
    assert caps["datapath"] in ("user", "kernel")
    assert caps["os_ken"] is True


def test_clean_needs_root(capsys, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["clean"]) == 1
    assert capsys.readouterr().err.strip() == "error: clean must run as root (sudo)"


def test_iterations_option_is_validated(capsys):
    assert main(["run", "--iterations", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: workload.iterations: must be >= 1, got 0"


def test_unexpected_errors_are_one_line_too(capsys, monkeypatch):
    import testbed.fabric.capabilities

    def boom():
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(testbed.fabric.capabilities, "detect", boom)
    assert main(["check"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: unexpected OSError: [Errno 5] Input/output error "
                   "(rerun with --debug for details)"]


def test_policies_lists_classes_and_every_parameter(capsys):
    import dataclasses

    from controllers.policy import policy_class, policy_names
    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    for name in policy_names():
        cls = policy_class(name).parameters
        assert f"\n{name}: " in "\n" + out
        for f in dataclasses.fields(cls):
            assert f"  {f.name} = " in out
    assert "class roce (priority 1): DSCP 26" in out and "PFC XOFF 128,000" in out
