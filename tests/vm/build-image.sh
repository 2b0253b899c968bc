#!/usr/bin/env bash
# Build the VM test's Debian 12 image from Debian's packages only, provisioned exactly as the
# Vagrant VM is: debootstrap into a folder, the project's own scripts/install.sh --vm run in a
# chroot (services not started), the Debian kernel inside, then an ext4 image (mkfs -d).
#   tests/vm/build-image.sh OUT_DIR       -> OUT_DIR/disk.ext4, OUT_DIR/vmlinuz, OUT_DIR/initrd
# REUSE_ROOT=1 keeps OUT_DIR/root from an earlier build (skips debootstrap).
set -euo pipefail
out=${1:?usage: build-image.sh OUT_DIR}
here=$(cd "$(dirname "$0")/../.." && pwd)
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
root="$out/root"
say() { echo "vm-image: $*"; }
[ "$(id -u)" -eq 0 ] || { echo "build-image.sh: run as root" >&2; exit 1; }
mkdir -p "$out"
cleanup() {
  for m in dev/pts dev proc sys run; do
    mountpoint -q "$root/$m" 2>/dev/null && umount -l "$root/$m" || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM  # so that cleanup runs on Ctrl-C and kill too

SECONDS=0
if [ -x "$root/usr/bin/apt-get" ] && [ -n "${REUSE_ROOT:-}" ]; then
  say "reusing $root"
else
rm -rf "$root"
say "debootstrap bookworm from $mirror"
debootstrap --variant=minbase --include=systemd-sysv,linux-image-amd64,ca-certificates,kmod,iproute2,procps \
  bookworm "$root" "$mirror" > "$out/debootstrap.log" 2>&1 \
  || { tail -20 "$out/debootstrap.log"; exit 1; }
say "debootstrap + kernel: ${SECONDS}s"
fi

# the project, as committed (what CI has), at the path the VM provisioning uses; with
# VM_WORKTREE=1 the working tree's files instead (tracked and new, not ignored): to try a change
rm -rf "$root/vagrant" && mkdir -p "$root/vagrant"
if [ -n "${VM_WORKTREE:-}" ]; then
  (cd "$here" && git ls-files -co --exclude-standard -z | tar --null -T - -c) | tar -x -C "$root/vagrant"
else
  git -C "$here" archive HEAD | tar -x -C "$root/vagrant"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
# Provisioned through this machine's package registries: its trusted CAs (a registry proxy may
# sign with its own) and its pip configuration.
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
[ -f /etc/pip.conf ] && cp /etc/pip.conf "$root/etc/pip.conf"
if [ -d /etc/xdg/pip ]; then mkdir -p "$root/etc/xdg" && cp -r /etc/xdg/pip "$root/etc/xdg/"; fi
pipenv=$(env | grep -E '^PIP_' || true)
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"; chmod 755 "$root/usr/sbin/policy-rc.d"
for m in proc sys dev dev/pts run; do mount --bind "/$m" "$root/$m"; done
SECONDS=0
say "scripts/install.sh --vm --no-start in the chroot"
# shellcheck disable=SC2086
chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root DEBIAN_FRONTEND=noninteractive $pipenv \
  bash /vagrant/scripts/install.sh --vm --no-start > "$out/install.log" 2>&1 \
  || { tail -30 "$out/install.log"; exit 1; }
say "install: ${SECONDS}s"
cleanup
rm -f "$root/usr/sbin/policy-rc.d"
echo "testbed-vm" > "$root/etc/hostname"
printf '/dev/vda / ext4 rw 0 1\n' > "$root/etc/fstab"
cp "$root"/boot/vmlinuz-* "$out/vmlinuz"
cp "$root"/boot/initrd.img-* "$out/initrd"
SECONDS=0
size=$(( $(du -sm "$root" | cut -f1) + 1024 ))
rm -f "$out/disk.ext4"
mkfs.ext4 -q -F -L testbed -d "$root" "$out/disk.ext4" "${size}M"
say "mkfs ($size MB): ${SECONDS}s"
