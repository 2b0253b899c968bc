"""Start the os-ken controller with one policy: ``python -m controllers.launcher ...``.

os-ken 4 has no manager CLI, so this is ours: parse our arguments, hand os-ken its
configuration (listening on 127.0.0.1 only), then ``AppManager.run_apps``. The process
asks the kernel to kill it when its parent (the runner) dies, so it cannot outlive a run.
"""
from __future__ import annotations

import argparse
import logging
import sys

from testbed.base.procutil import die_with_parent


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m controllers.launcher")
    p.add_argument("--port", type=int, required=True, help="OpenFlow TCP port on 127.0.0.1")
    p.add_argument("--policy-file", required=True,
                   help="JSON: policy name, fabric plan, parameters, context")
    p.add_argument("--state", required=True, help="file the app appends its events to")
    p.add_argument("--events", default="", help="UNIX socket for switch-queue events")
    p.add_argument("--verbose", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    die_with_parent()
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from os_ken.lib import hub
    hub.patch(thread=False)  # a no-op on os-ken's default native hub; needed on eventlet's
    from os_ken import cfg
    from os_ken.base.app_manager import AppManager
    import os_ken.controller.controller  # noqa: F401  (registers the ofp-* options)

    cfg.CONF.register_cli_opts([cfg.StrOpt("testbed-policy-file"), cfg.StrOpt("testbed-state"),
                                cfg.StrOpt("testbed-events", default="")])
    cfg.CONF(args=["--ofp-listen-host", "127.0.0.1", "--ofp-tcp-listen-port", str(args.port),
                   "--testbed-policy-file", args.policy_file, "--testbed-state", args.state,
                   "--testbed-events", args.events],
             project="os_ken", default_config_files=[])
    logging.getLogger(__name__).info("OpenFlow controller on 127.0.0.1:%d, policy file %s",
                                     args.port, args.policy_file)
    AppManager.run_apps(["controllers.app"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
