#!/usr/bin/env bash
# One-command, idempotent set-up of the testbed on Debian 12 or Ubuntu 22.04/24.04, as root.
#
#   scripts/install.sh          apt packages, the project venv (.venv), Open vSwitch started
#   scripts/install.sh --vm     the same, for the Vagrant VM: venv outside the synced folder and
#                               /usr/local/bin/python pointing at it, so that
#                               `sudo python -m testbed run` works from any directory
#   scripts/install.sh --no-start   do not start Open vSwitch (image builds, chroots)
#   scripts/install.sh --test-tools also what the test suite needs beyond a run: chromium
#                               (headless, renders report.html); `make test` passes it
#
# Environment: TESTBED_VENV (venv path), TESTBED_BIN_DIR (where --vm puts `python`).
#
# Quick when nothing is missing: apt runs only for absent packages, pip only when setup.py or
# the C extension's source (traffic/_nicio.c) changed since the last install.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
vm=0
start_ovs=1
test_tools=0
for arg in "$@"; do
  case "$arg" in
    --vm) vm=1 ;;
    --no-start) start_ovs=0 ;;
    --test-tools) test_tools=1 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

say() { echo "install: $*"; }
die() { echo "install: error: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (sudo $0)"
command -v apt-get >/dev/null || die "needs a Debian or Ubuntu system with apt-get"
if [ -r /etc/os-release ]; then
  . /etc/os-release
  case "${ID:-}:${VERSION_ID:-}" in
    debian:12|ubuntu:22.04|ubuntu:24.04) ;;
    *) say "warning: tested on Debian 12 and Ubuntu 22.04/24.04, this is ${PRETTY_NAME:-unknown}" ;;
  esac
fi

# --- distribution packages -------------------------------------------------------------------
packages=(mininet openvswitch-switch tshark iperf3 ethtool tcpdump iproute2 iputils-ping python3-venv
          python-is-python3 python3-pip
          libtcmalloc-minimal4  # ovs-vswitchd's allocator when this script starts it (below)
          gcc libc6-dev python3-dev zlib1g-dev  # the GPU agents' C extension (traffic/_nicio.c)
          rdma-core ibverbs-providers perftest)  # run --traffic rxe: soft-RoCE verbs + perftest
if [ "$test_tools" -eq 1 ]; then
  if grep -qi ubuntu /etc/os-release 2>/dev/null; then
    say "note: Ubuntu ships chromium as a snap only; the report's browser test skips without it"
  else
    packages+=(chromium)
  fi
  # the cluster tests emulate a second server with its own sshd (never started as a service)
  packages+=(openssh-server openssh-client)
  # the VM test builds a Debian image and boots it (tests/vm)
  packages+=(debootstrap qemu-system-x86 e2fsprogs)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # tshark asks whether non-root users may capture; answer no, without a prompt.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
  apt-get update -q
  # Installing a service package must not start it (sshd would listen on every address):
  # a policy-rc.d that forbids starts, only for the duration of this install.
  guard=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    guard=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' > "$guard" && chmod 755 "$guard"
  fi
  apt-get install -y -q --no-install-recommends "${missing[@]}" || { [ -n "$guard" ] && rm -f "$guard"; exit 1; }
  [ -n "$guard" ] && rm -f "$guard"
  # and not at the next boot either, if this install brought it
  if [[ " ${missing[*]} " == *" openssh-server "* ]] && command -v systemctl >/dev/null; then
    systemctl disable ssh.service ssh.socket >/dev/null 2>&1 || true
  fi
else
  say "distribution packages present"
fi

# --- the project's venv ----------------------------------------------------------------------
# Made from the distribution's python with its site-packages visible: Debian's Mininet lives
# in /usr/lib/python3/dist-packages (the PyPI mininet has no mnexec).
if [ "$vm" -eq 1 ]; then
  venv=${TESTBED_VENV:-/opt/ai-fabric-testbed/venv}   # not on the (slow) synced folder
else
  venv=${TESTBED_VENV:-$here/.venv}
fi
if [ ! -x "$venv/bin/python" ]; then
  say "creating venv $venv"
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
stamp="$venv/.testbed-installed"
want=$(cat "$here/setup.py" "$here/traffic/_nicio.c" | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want:$here" ]; then
  say "installing the project into $venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -e "$here[test]"
  echo "$want:$here" > "$stamp"
else
  say "venv up to date ($venv)"
fi

if [ "$vm" -eq 1 ]; then
  # A wrapper rather than a symlink: the venv must be found from its own path.
  bindir=${TESTBED_BIN_DIR:-/usr/local/bin}
  mkdir -p "$bindir"
  cat > "$bindir/python" <<EOF
#!/bin/sh
# Installed by $here/scripts/install.sh --vm: the testbed's venv python.
exec "$venv/bin/python" "\$@"
EOF
  chmod 755 "$bindir/python"
  say "$bindir/python runs $venv/bin/python"
fi

# --- Open vSwitch ----------------------------------------------------------------------------
ovs_up() { ovs-vsctl --timeout=3 show >/dev/null 2>&1; }
if [ "$start_ovs" -eq 1 ]; then
  if ovs_up; then
    say "Open vSwitch running"
  else
    say "starting Open vSwitch"
    if [ -d /run/systemd/system ] && systemctl start openvswitch-switch 2>/dev/null && ovs_up; then
      :
    else
      # No systemd (containers, CI sandboxes): ovs-ctl skips modprobe where the kernel has no
      # module support; ovs-vswitchd then serves the userspace (netdev) datapath only. That
      # datapath allocates and frees 32 packet buffers per port on every pass of its main
      # loop: with tcmalloc a pass is shorter, so a frame waits less for the next bridge
      # (docs/emulation-cost.md, "Open vSwitch's allocator").
      tcmalloc=$(ls /usr/lib/*/libtcmalloc_minimal.so.4 2>/dev/null | head -1)
      LD_PRELOAD=${tcmalloc:-} /usr/share/openvswitch/scripts/ovs-ctl start --system-id=random \
        >/dev/null 2>&1 || true
    fi
    ovs_up || die "Open vSwitch did not start; see /var/log/openvswitch/*.log"
    say "Open vSwitch running"
  fi
fi
say "done"
