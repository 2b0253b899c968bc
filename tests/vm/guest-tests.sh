#!/bin/sh
# What the VM test runs inside the guest (full kernel): a short run on the kernel datapath.
out=$1
cat > /tmp/vm-scenario.yaml <<'YAML'
name: vm-smoke
policies: [hyperscale, lossless]
topology: {spines: 2, leaves: 2, gpus_per_leaf: 1, host_rate_mbit: 10, fabric_rate_mbit: 10}
workload: {size_bytes: 65536, iterations: 2}
YAML
cd /vagrant
timeout 900 python -m testbed run --scenario /tmp/vm-scenario.yaml --out $out/results --json \
  > $out/run.json 2> $out/run.log
echo "run exit $?"
