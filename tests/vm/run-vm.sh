#!/usr/bin/env bash
# Boot the VM test's image (tests/vm/build-image.sh) under qemu and collect what the guest
# wrote to its second disk:   tests/vm/run-vm.sh IMAGE_DIR OUT_DIR [TIMEOUT_S]
# KVM where /dev/kvm works (users' machines), TCG otherwise (nested KVM hangs here).
# CPU model Nehalem: numpy 2 needs x86-64-v2 (SSE4.2, POPCNT), which the default qemu64 lacks
# ("Illegal instruction"); -cpu max works too but emulates slower.
set -euo pipefail
img=${1:?usage: run-vm.sh IMAGE_DIR OUT_DIR [TIMEOUT_S]}
out=${2:?usage: run-vm.sh IMAGE_DIR OUT_DIR [TIMEOUT_S]}
limit=${3:-1200}
mkdir -p "$out"
disk="$out/out.ext4"
rm -f "$disk"
mkfs.ext4 -q -F -L out "$disk" 256M
accel="tcg,thread=multi"
# KVM only where it really boots: a quick probe (nested KVM can hang here), else TCG
if [ -w /dev/kvm ] && [ -z "${VM_NO_KVM:-}" ] && timeout 20 qemu-system-x86_64 -accel kvm \
     -nographic -no-reboot -net none -m 64 -kernel "$img/vmlinuz" \
     -append "console=ttyS0 panic=-1" 2>/dev/null | grep -q "Linux version"; then
  accel=kvm
fi
echo "run-vm: qemu with $accel (limit ${limit}s)"
SECONDS=0
timeout -k 10 "$limit" qemu-system-x86_64 -accel "$accel" -smp 2 -m 2048 -nographic \
  -cpu "${VM_CPU:-Nehalem}" \
  -no-reboot -net none \
  -kernel "$img/vmlinuz" -initrd "$img/initrd" \
  -append "root=/dev/vda rw console=ttyS0 init=/vagrant/tests/vm/guest-init.sh panic=-1 quiet" \
  -drive "file=$img/disk.ext4,format=raw,if=virtio,snapshot=on" \
  -drive "file=$disk,format=raw,if=virtio" > "$out/serial.log" 2>&1 || true
echo "run-vm: guest ran ${SECONDS}s"
mkdir -p "$out/files"
debugfs -R "rdump / $out/files" "$disk" > /dev/null 2>&1 || true
cat "$out/files/status" 2>/dev/null || { echo "run-vm: the guest did not finish"; tail -20 "$out/serial.log"; exit 1; }
