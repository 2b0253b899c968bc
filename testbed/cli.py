"""Command line: ``python -m testbed run | check | scenarios | policies | report | compare |
clean``.

This is the one place where errors meet the user: a ``TestbedError`` becomes one line on stderr
and its exit code (2 for bad input, 1 for a failed run); Ctrl-C exits with 130 after teardown.
``--debug`` shows tracebacks.

Exit codes: 0 success, 1 run failure or missing capability, 2 bad input, 130 interrupted. A
job that failed under a policy is a result (``job_failed``): the run still exits 0.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys


from .base.errors import ConfigError, TestbedError
from .results.term import paint
from .scenario.config import ALGORITHM_NAMES, ALL_POLICIES


def _progress(quiet: bool):
    if quiet:
        return lambda msg: None
    return lambda msg: print(msg, file=sys.stderr, flush=True)


def cmd_calibrate(args) -> int:
    from .run import calibrate
    from .scenario import timescale
    from .scenario.catalog import find

    from .job.plan import switch_hops
    from .results.report import table

    cal = (args.if_missing and calibrate.load()) or calibrate.measure(_progress(args.quiet))
    rows = [[name, f"{share:.0%}"] for name, share in cal.busy.items()]
    print(table(["policy", f"CPUs busy ({cal.gpus} GPUs at {cal.host_rate_mbit:g} Mbit/s)"],
                rows))
    for scenario in (find("default"), find("ring"), find("large")):
        t = scenario.topology
        choice = timescale.choose(timescale.AUTO, scenario.policies, t.gpus, cal,
                                  hops=switch_hops(scenario))
        print(f"{scenario.name}: {t.gpus} GPUs at auto run at {choice.host_rate_mbit:g} Mbit/s "
              f"(predicted CPUs {choice.predicted_busy:.0%} busy of "
              f"{timescale.TARGET_BUSY:.0%} allowed)")
    print(f"kept in {calibrate.cache_path()} for this machine")
    return 0


def cmd_run(args) -> int:
    from .plan.checks import check_output
    from .run import runner
    from .scenario.catalog import find
    from .scenario.config import parse_sizes
    from .results import nccltests
    from .results.report import summary_table

    # without a scenario, options that shape one collective start from the ring
    one_collective = args.sizes or args.collective
    scenario = find(args.scenario or ("ring" if one_collective else "default"))
    check_output(scenario, args.format, bool(one_collective))
    if args.iterations is not None:
        scenario = scenario.override({"workload": {"iterations": args.iterations}})
    if args.repeat is not None:
        scenario = scenario.override({"repeat": args.repeat})
    if args.sizes:
        scenario = scenario.override({"workload": {"sizes": list(parse_sizes(args.sizes))}})
    if args.collective:
        scenario = scenario.override({"workload": {"collective": args.collective}})
    if args.servers:
        scenario = scenario.override({"cluster": {"servers": _names(args.servers)}})
    if args.traffic:
        scenario = scenario.override({"rxe": {"enabled": args.traffic == "rxe"}})
    if args.policy:
        names = _names(args.policy)
        if not names:
            raise ConfigError("--policy: give at least one policy name, or all")
        scenario = scenario.with_policies(ALL_POLICIES if names == ["all"] else names)
    run = runner.run(scenario, out_root=args.out, progress=_progress(args.quiet or args.json))
    run_dir = run.run_dir
    if args.json:  # results.json as written
        with open(os.path.join(run_dir, "results.json")) as f:
            json.dump(json.load(f), sys.stdout, indent=2)
        print()
    elif args.format == "nccl-tests-json":
        json.dump(nccltests.as_json(run), sys.stdout, indent=2)
        print()
    else:
        table = args.format == "table"
        print(summary_table(run, emulated=args.emulated) if table else
              "\n\n".join(nccltests.text(name, p) for name, p in run.policies.items()))
        where = sys.stdout if table else sys.stderr  # an nccl-tests log holds nothing else
        print(f"\nresults: {os.path.join(run_dir, 'results.json')}", file=where)
        report = os.path.join(run_dir, "report.html")
        if os.path.exists(report):
            print(f"report:  {report}", file=where)
    _print_verdicts(run)
    return 0


def _print_verdicts(results) -> None:
    from .results.verdicts import fidelity_warnings, job_failures

    for line in job_failures(results) + fidelity_warnings(results):
        print(paint(line, "warn", sys.stderr), file=sys.stderr)


def cmd_report(args) -> int:
    """Redraw the plots and report.html of a saved run."""
    from .results.htmlreport import write

    path = write(args.run_dir, _progress(args.quiet), emulated=args.emulated)
    print(path)
    return 0


def cmd_validate(args) -> int:
    """Run the validation cases; non-zero unless every case passed, faithfully."""
    from .validate import cases, suite

    chosen = cases.by_name(args.case)
    outcomes, out_dir = suite.run_suite(chosen, args.quick, args.out, _progress(args.quiet))
    print(suite.summary(outcomes))
    print(f"\nvalidation: {os.path.join(out_dir, 'validation.md')}\n"
          f"report:     {os.path.join(out_dir, 'report.html')}")
    failed = [o for o in outcomes if o.status != suite.PASS]
    for o in failed:
        print(paint(f"{o.case.name}: {o.status}: {o.note}", "error", sys.stderr),
              file=sys.stderr)
    return 1 if failed else 0


def cmd_compare(args) -> int:
    from .results.compare import compare
    from .results.rundata import load_run

    a, b = load_run(args.run_a), load_run(args.run_b)
    print(compare(a, b, args.run_a, args.run_b))
    return 0


def _names(text: str):
    """``a, b,,c`` -> [a, b, c]: a comma-separated option."""
    return [s.strip() for s in (text or "").split(",") if s.strip()]


def _servers(text: str):
    """The other servers of a --servers list (this machine left out)."""
    from .plan.placement import LOCAL

    return [s for s in _names(text) if s not in (LOCAL, "127.0.0.1")]


def cmd_check_servers(args) -> int:
    from .fabric.cluster import check_server
    from .results.term import paint

    failed = False
    for server in _servers(args.servers):
        print(f"{server}:")
        for what, ok, detail in check_server(args.user, server):
            mark = paint("ok", "ok", sys.stdout) if ok else paint("FAILED", "error", sys.stdout)
            print(f"  {what:24} {mark:6} {detail}")
            failed |= not ok and what != "VXLAN"  # without VXLAN, ssh tunnels still work
    print("\n" + ("a server is not ready: see above" if failed else "every server is ready"))
    return 1 if failed else 0


def cmd_check(args) -> int:
    from .fabric.capabilities import detect

    if args.servers:
        return cmd_check_servers(args)

    caps = detect()
    if args.json:
        json.dump(caps.to_dict(), sys.stdout, indent=2)
        print()
        return 0 if not caps.problems_for_run() else 1

    def mark(ok):
        return {True: "yes", False: "no", None: "unknown (needs root)"}[ok]

    rows = [("running as root", caps.root),
            ("Open vSwitch running", caps.ovs_running),
            ("openvswitch kernel module", caps.openvswitch_module),
            ("os-ken importable", caps.os_ken),
            ("Mininet (with mnexec)", caps.mininet),
            ("tshark", caps.tshark)]
    rows += [(f"qdisc {q}", ok) for q, ok in caps.qdiscs.items()]
    for label, ok in rows:
        print(f"{label:28} {mark(ok)}")
    print(f"{'OVS datapath to use':28} {caps.datapath}"
          + (f" (OVS {caps.ovs_version})" if caps.ovs_version else ""))
    delay = ("available" if caps.netem else
             "not available: no per-hop switch latency or cable delay is added")
    print(f"{'per-hop delay (netem)':28} {delay}")
    applied = {True: "applied by a tc BPF program",
               None: "applied by a tc BPF program or OpenFlow groups (root can tell)",
               False: "applied by OpenFlow groups (no tc BPF here: marked packets may overtake "
                      "unmarked ones under load)"}[caps.bpf_marking]
    marking = "kernel RED" if caps.red else f"sampled by the switch-queue emulator, {applied}"
    print(f"{'ECN marking':28} {marking}")
    rxe = (f"available (rdma_rxe {caps.rxe_module}, perftest)" if caps.rxe else
           f"not available (rdma_rxe {caps.rxe_module}, perftest "
           f"{'present' if caps.perftest else 'missing'})")
    print(f"{'--traffic rxe (verbs)':28} {rxe}")
    nic = ("in C (traffic/_nicio.c)" if caps.nic_in_c else
           "in Python: the C extension is not built (run scripts/install.sh); runs cost "
           "more CPU per packet")
    print(f"{'GPU agents NIC path':28} {nic}")
    problems = caps.problems_for_run()
    if problems:
        print("\ncannot run: " + "; ".join(problems))
        return 1
    print("\nready to run")
    return 0


def cmd_policies(args) -> int:
    """Each policy, its traffic classes and its parameters with defaults (at the default
    scenario's link rate), as ``policy_params`` in a scenario can set them."""
    from .scenario.reference import policies_text

    print(policies_text())
    return 0


def cmd_scenarios(args) -> int:
    """The built-in scenarios, or the reference of every scenario key."""
    from .scenario import catalog, reference

    if args.reference:
        print(reference.markdown(), end="")
    elif args.template:
        print(reference.yaml_template(), end="")
    elif args.show:
        known = catalog.builtins()
        if args.show not in known:
            raise ConfigError(f"--show: no built-in scenario named {args.show!r} "
                              f"(built-in: {', '.join(known)})")
        with open(known[args.show].path, encoding="utf-8") as f:
            print(f.read(), end="")
    else:
        print(catalog.describe())
        print("\nrun one: sudo python -m testbed run --scenario NAME (or a YAML file); "
              "show one: scenarios --show NAME; every key: scenarios --reference")
    return 0


def cmd_clean(args) -> int:
    from .base.ledger import clean

    if os.geteuid() != 0:
        raise TestbedError("clean must run as root (sudo)")
    removed = []
    if args.servers:  # first the other servers, with this machine's record of the run
        from .fabric.cluster import clean_server
        from .base.ledger import read_record

        interfaces = (read_record() or {}).get("interfaces", [])
        for server in _servers(args.servers):
            removed += clean_server(args.user, server, interfaces)
    removed += clean()
    if removed:
        for item in removed:
            print(f"removed {item}")
    else:
        print("nothing to clean")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m testbed",
                                description="AI-training fabric testbed: Mininet leaf-spine, "
                                            "os-ken policies, RoCEv2 all-reduce.")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    r = sub.add_parser("run", help="run the scenario and print the comparison")
    r.add_argument("--scenario", metavar="NAME|FILE",
                   help="a built-in scenario (python -m testbed scenarios) or a YAML file "
                        "(keys: scenarios --reference); default: the default scenario, a "
                        "training job (the ring with --collective or --sizes)")
    r.add_argument("--policy", help=f"comma-separated policies or the scenario's variant "
                                    f"labels, or all ({', '.join(ALL_POLICIES)}); default: "
                                    f"the scenario's")
    r.add_argument("--iterations", type=int,
                   help="training iterations to replay (at each size; default: the "
                        "scenario's)")
    r.add_argument("--repeat", type=int, metavar="N",
                   help="run each policy N times on fresh fabrics: the table shows the "
                        "headline figures' median [min-max] (default: the scenario's repeat)")
    r.add_argument("--collective", help=f"{', '.join(ALGORITHM_NAMES)}: replay this "
                                        f"collective (default: the scenario's)")
    r.add_argument("--sizes", metavar="FROM:TO|LIST",
                   help="message-size sweep like nccl-tests: 64K:4M doubles from 64 KiB to "
                        "4 MiB; 64K,1M runs exactly those")
    r.add_argument("--servers", metavar="HERE,B,...",
                   help="split the fabric over these machines, this one first (e.g. "
                        "localhost,10.0.0.2; ssh as root with a key; docs/guide.md, "
                        "Several machines)")
    r.add_argument("--traffic", choices=("agents", "rxe"),
                   help="agents: the collective from the emulated GPUs (default); rxe: also "
                        "real RoCE verbs traffic - rdma_rxe endpoints run perftest "
                        "(ib_write_lat, ib_write_bw) across the same fabric and policy after "
                        "the collective (scenario key rxe; needs rdma_rxe and perftest)")
    r.add_argument("--out", default="results",
                   help="directory that receives the run directory (default: ./results)")
    r.add_argument("--format", choices=("table", "nccl-tests", "nccl-tests-json"),
                   default="table",
                   help="what to print: the comparison table, or per policy the collectives "
                        "as nccl-tests 2.x prints them (modelled time, GB/s), or that as JSON")
    r.add_argument("--json", action="store_true", help="print results.json to stdout")
    r.add_argument("--quiet", action="store_true", help="no progress lines")
    r.add_argument("--emulated", action="store_true",
                   help="print latencies and CCTs in emulated time (default: the modelled "
                        "fabric's time)")
    r.set_defaults(func=cmd_run)
    cal = sub.add_parser("calibrate", help="measure how fast this machine can run the fabric "
                                           "faithfully (topology.host_rate_mbit: auto uses it)")
    cal.add_argument("--quiet", action="store_true", help="no progress lines")
    cal.add_argument("--if-missing", action="store_true",
                     help="keep this machine's calibration if it has one")
    cal.set_defaults(func=cmd_calibrate)
    c = sub.add_parser("check", help="what this kernel and machine support")
    c.add_argument("--json", action="store_true")
    c.add_argument("--servers", metavar="HERE,B,...",
                   help="check the other servers of a split fabric instead (ssh, Mininet, "
                        "Open vSwitch, project version, VXLAN, clock)")
    c.add_argument("--user", default="root", help="ssh user for --servers (default root)")
    c.set_defaults(func=cmd_check)
    sc = sub.add_parser("scenarios", help="the built-in scenarios, and every scenario key")
    group = sc.add_mutually_exclusive_group()
    group.add_argument("--show", metavar="NAME", help="print a built-in scenario's file")
    group.add_argument("--reference", action="store_true",
                       help="every key with its default, unit and meaning (Markdown)")
    group.add_argument("--template", action="store_true",
                       help="a scenario file with every key at its default (YAML)")
    sc.set_defaults(func=cmd_scenarios)
    pol = sub.add_parser("policies", help="the policies, their classes and parameters")
    pol.set_defaults(func=cmd_policies)
    rp = sub.add_parser("report", help="redraw the plots and report.html of a saved run")
    rp.add_argument("run_dir", metavar="DIR", help="a run directory (results/<run id>)")
    rp.add_argument("--quiet", action="store_true", help="no progress lines")
    rp.add_argument("--emulated", action="store_true",
                    help="plots and tables in emulated time (default: the modelled fabric's)")
    rp.set_defaults(func=cmd_report)
    v = sub.add_parser("validate", help="reproduce published results about AI fabrics on "
                                        "real packets, each judged against its citation")
    v.add_argument("--quick", action="store_true",
                   help="fewer iterations (what the test suite runs)")
    v.add_argument("--case", action="append", metavar="NAME",
                   help="run only this case (repeatable; default: every case)")
    v.add_argument("--out", default="results", help="where the suite's directory goes "
                                                   "(default: results)")
    v.add_argument("--quiet", action="store_true", help="no progress lines")
    v.set_defaults(func=cmd_validate)
    cp = sub.add_parser("compare", help="what changed between two saved runs")
    cp.add_argument("run_a", metavar="DIR_A")
    cp.add_argument("run_b", metavar="DIR_B")
    cp.set_defaults(func=cmd_compare)
    k = sub.add_parser("clean", help="remove what a crashed run left behind (only that)")
    k.add_argument("--servers", metavar="HERE,B,...",
                   help="also clean the other servers of a split run")
    k.add_argument("--user", default="root", help="ssh user for --servers (default root)")
    k.set_defaults(func=cmd_clean)
    return p


def _interrupted(_sig, _frame):
    raise KeyboardInterrupt


# SIGINT and SIGTERM both stop a command the same way: teardown, then exit 130. Set explicitly
# for both: a process started in the background by a non-interactive shell (a script's `&`, a
# test harness) inherits SIGINT ignored, and Python then leaves it ignored.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    before = {sig: signal.signal(sig, _interrupted) for sig in STOP_SIGNALS}
    try:
        return args.func(args)
    except TestbedError as e:
        if args.debug:
            raise
        print(paint(f"error: {e}", "error", sys.stderr), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted: the fabric was torn down; partial results were kept",
              file=sys.stderr)
        return 130
    except Exception as e:  # a bug or an unexpected failure below us: still one line
        if args.debug:
            raise
        print(paint(f"error: unexpected {type(e).__name__}: {e} (rerun with --debug for "
                    "details)", "error", sys.stderr), file=sys.stderr)
        return 1
    finally:  # as it was for a caller that runs main() in its own process (tests)
        for sig, handler in before.items():
            signal.signal(sig, handler)
