#!/bin/bash
# What the VM test runs inside the guest (full kernel), results to $1 (the second disk):
#  - a run from the command line, two policies with real verbs traffic (--traffic rxe), on the
#    kernel datapath with netem per-hop latency and RED marking (all chosen automatically);
#    then the same collective with the RNICs' delay line instead of netem (path_delay: nic);
#    a compute phase before each of 8 iterations, so several frames cross an idle fabric and
#    the measured latency floor (a minimum) does not hang on two or three of them;
#  - the integration tests that need the full kernel (tests/integration/test_full_kernel.py);
#  - the root namespace's routing rules and rp_filter before and after: rxe left nothing behind.
out=$1
cat > /tmp/vm-main.yaml <<'YAML'
name: vm-main
policies: [hyperscale, lossless]
topology: {spines: 2, leaves: 2, gpus_per_leaf: 1, host_rate_mbit: 10, fabric_rate_mbit: 10}
workload: {size_bytes: 65536, iterations: 8, compute_us: 2}
rxe: {size_bytes: 1024, lat_iterations: 50, bw_iterations: 50}
YAML
cd /vagrant
# as systemd's sysctl defaults set it on the Vagrant VM: the rxe run changes it and must restore it
sysctl -qw net.ipv4.conf.all.rp_filter=2
root_state() { ip rule show; echo "all.rp_filter $(sysctl -n net.ipv4.conf.all.rp_filter)"; }
root_state > $out/rules-before.txt
SECONDS=0
timeout 1200 python -m testbed run --scenario /tmp/vm-main.yaml --traffic rxe --out $out/results \
  --json > $out/run.json 2> $out/run.log
echo "run exit $? (${SECONDS}s)"
cp /var/log/openvswitch/ovs-vswitchd.log $out/ 2>/dev/null || true  # why, if it failed
# the same collective with the RNICs' delay line in place of netem: the floors must agree
sed -e 's/^name: vm-main/name: vm-nic/' -e '/^rxe:/d' /tmp/vm-main.yaml > /tmp/vm-nic.yaml
echo "emulation: {path_delay: nic}" >> /tmp/vm-nic.yaml
SECONDS=0
timeout 900 python -m testbed run --scenario /tmp/vm-nic.yaml --out $out/results-nic \
  --json > $out/run-nic.json 2> $out/run-nic.log
echo "nic run exit $? (${SECONDS}s)"
root_state > $out/rules-after.txt
{ [ -d /sys/module/rdma_rxe ] && echo loaded || echo unloaded; } > $out/rxe-module-after.txt
SECONDS=0
timeout 1200 python -m pytest -p no:cacheprovider -rsP -v tests/integration/test_full_kernel.py \
  --junitxml=$out/full-kernel.xml > $out/full-kernel.log 2>&1
echo "full-kernel tests exit $? (${SECONDS}s)"
