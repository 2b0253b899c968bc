"""Run a benchmark script again inside a private network namespace (``unshare --net``):
whatever it creates there disappears with the process."""
import os
import subprocess
import sys


def reexec_in_private_netns(script: str) -> int:
    """Re-run ``script`` with ``--inner`` under ``unshare --net``; needs root."""
    if os.geteuid() != 0:
        print(f"{os.path.basename(script)}: needs root (a private network namespace)",
              file=sys.stderr)
        return 2
    return subprocess.call(["unshare", "--net", sys.executable, os.path.abspath(script),
                            "--inner"] + sys.argv[1:])
