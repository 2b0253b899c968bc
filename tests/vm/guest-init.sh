#!/bin/sh
# PID 1 of the VM test's guest: mount what a system needs, start Open vSwitch the way the
# project does, run what the full kernel enables, write everything to the second disk, power
# off. Output also goes to the serial console.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm && mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -o remount,rw /
ip link set lo up
hostname testbed-vm
out=/mnt/out
mkdir -p $out && mount /dev/vdb $out
log=$out/guest.log
step() { echo "guest: $*" | tee -a $log > /dev/ttyS0; }
step "kernel $(uname -r), $(nproc) CPUs"
for m in openvswitch sch_netem sch_red sch_htb sch_tbf; do
  modprobe $m 2>>$log && step "module $m loaded" || step "module $m missing"
done
# rdma_rxe is left to the run, as on a user's VM (it loads it, and unloads it afterwards)
modprobe -n rdma_rxe 2>>$log && step "module rdma_rxe available" || step "module rdma_rxe missing"
bash /vagrant/scripts/install.sh --vm >> $log 2>&1 && step "install.sh: Open vSwitch up" \
  || step "install.sh failed"
cd /vagrant
python -m testbed check --json > $out/check.json 2>>$log; step "check: exit $?"
if [ -f /vagrant/tests/vm/guest-tests.sh ]; then
  bash /vagrant/tests/vm/guest-tests.sh $out >> $log 2>&1; step "guest tests: exit $?"
fi
echo done > $out/status
sync
umount $out
step "power off"
echo o > /proc/sysrq-trigger
sleep 30
