#!/usr/bin/env bash
# Runs the userspace NVMe driver check (tests/nvme_guest.rs) inside a QEMU guest:
# q35 + intel-iommu, emulated NVMe controllers on raw disk images, bound to vfio-pci.
# In the same boot the check then starts the real `lavik` binary (release, static) with
# --storage=spdk on a fourth, blank 512 MiB controller and drives it over TCP on
# 127.0.0.1 (load, SIGTERM, restart, SIGKILL under appendfsync always, exact read-back).
#
#   tools/vm/run-nvme-test.sh        # exit 0 = every in-guest check passed, 1 = not
#
# Steps: install qemu-system-x86 / busybox-static / cpio if missing; fetch Debian's
# linux-image-amd64 dependency (the versioned linux-image-6.x-amd64 package) with
# `apt-get download` and unpack it with `dpkg-deb -x` (never installed); build the check
# and the server as statically linked glibc binaries; pack them with busybox and the
# vfio modules into an initramfs; boot it under software emulation (TCG) with a timeout;
# grep the serial console for PASS/FAIL lines (the server's own log is copied there too,
# as `lavik-runN| ...` lines).
#
# Environment: LAVIK_VM_DIR (work dir, default target/nvme-vm), LAVIK_VM_TIMEOUT_S
# (default 240), LAVIK_VM_ACCEL (default tcg; "kvm" where KVM works), LAVIK_VM_KEEP=1
# keeps the disk image between runs, LAVIK_VM_KERNEL_DIR (the unpacked kernel, default
# target/vm-kernel, shared with run-appliance-test.sh). Shared steps: tools/vm/lib.sh.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
work=${LAVIK_VM_DIR:-$repo/target/nvme-vm}
timeout_s=${LAVIK_VM_TIMEOUT_S:-240}
accel=${LAVIK_VM_ACCEL:-tcg}
mkdir -p "$work"
log() { echo "run-nvme-test: $*" >&2; }

. "$repo/tools/vm/lib.sh"

# --- 1. host tools, 2. guest kernel (tools/vm/lib.sh) ------------------------------------
vm_host_tools
vm_kernel

# --- 3. the statically linked check binary -------------------------------------------------
log "building tests/nvme_guest.rs (static)"
bin=$(cd "$repo" && RUSTFLAGS='-C target-feature=+crt-static' cargo test --test nvme_guest --no-run \
    --target "$host_target" --message-format=json 2>"$work/build.log" |
    grep '"name":"nvme_guest"' | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
if [ -z "$bin" ] || [ ! -x "$bin" ] || [[ "$(basename "$bin")" != nvme_guest-* ]]; then
    log "build failed:"; tail -30 "$work/build.log" >&2; exit 1
fi
if ldd "$bin" 2>&1 | grep -q '=>'; then
    log "warning: $bin does not look statically linked"
fi
# `dpdk` (which brings `nvme`): the same binary run-appliance-test.sh runs, built once.
vm_build_lavik dpdk

# --- 4. initramfs: busybox, vfio modules in dependency order, the binary, /init ------------
vm_initramfs_root
cp "$bin" "$root/nvme_guest"
# Debug info is not needed in the guest and would triple the initramfs.
objcopy --strip-debug "$server_bin" "$root/lavik" 2>/dev/null || cp "$server_bin" "$root/lavik"
vm_modules vfio_iommu_type1 vfio_pci

cat > "$root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /tmp
ifconfig lo 127.0.0.1 up
echo "guest: kernel $(uname -r)"
for m in $(cat /lib/modules/order); do
    insmod /lib/modules/$m.ko || echo "guest: insmod $m failed"
done
echo 64 > /proc/sys/vm/nr_hugepages
echo "guest: hugepages $(cat /proc/sys/vm/nr_hugepages)"
n=0
for d in /sys/bus/pci/devices/*; do
    [ "$(cat $d/class)" = "0x010802" ] || continue
    bdf=$(basename $d)
    echo vfio-pci > $d/driver_override
    echo $bdf > /sys/bus/pci/drivers_probe
    echo "guest: NVMe $bdf (IOMMU group $(basename $(readlink $d/iommu_group))) bound to $(basename $(readlink $d/driver))"
    n=$((n + 1))
done
if [ $n -ne 4 ]; then
    echo "FAIL setup: found $n NVMe controllers, want 4"
else
    # Slots are pinned by the host script: 04 healthy, 05 media errors, 06 throttled,
    # 07 blank, for the lavik server.
    LAVIK_NVME_URI=spdk://0000:00:04.0/1 \
    LAVIK_NVME_FAULTY_URI=spdk://0000:00:05.0/1 \
    LAVIK_NVME_SLOW_URI=spdk://0000:00:06.0/1 \
    LAVIK_SERVER_BIN=/lavik \
    LAVIK_SERVER_URI=spdk://0000:00:07.0/1 \
    RUST_BACKTRACE=1 /nvme_guest
    echo "guest: nvme_guest exit $?"
fi
echo "guest: done"
poweroff -f
EOF
chmod +x "$root/init"
vm_pack_initramfs

# --- 5. boot -------------------------------------------------------------------------------
img="$work/nvme.img"
if [ "${LAVIK_VM_KEEP:-0}" != 1 ] || [ ! -f "$img" ]; then
    rm -f "$img"
    truncate -s 256M "$img"
fi
# A second controller whose medium fails reads of sector 4096 and writes of sector 8192
# with EIO (QEMU's blkdebug), which the emulated controller reports as Unrecovered Read
# Error / Write Fault, and fails the first read of sector 12288 only (a transient error
# a retry gets past); a third one throttled to 1 I/O per second, to provoke timeouts.
faulty_img="$work/faulty.img"
slow_img="$work/slow.img"
# The server's namespace: blank every run (lavik formats it), large enough that the test's
# ~25 MiB of records in 1 MiB blocks (8 shards, 2 reserved blocks each) never fill it.
server_img="$work/lavik.img"
rm -f "$faulty_img" "$slow_img" "$server_img"
truncate -s 512M "$server_img"
truncate -s 64M "$faulty_img"
truncate -s 64M "$slow_img"
cat > "$work/blkdebug.conf" <<'EOF'
[inject-error]
event = "read_aio"
errno = "5"
sector = "4096"
once = "off"

[inject-error]
event = "write_aio"
errno = "5"
sector = "8192"
once = "off"

[inject-error]
event = "read_aio"
errno = "5"
sector = "12288"
once = "on"
EOF
console="$work/console.log"
log "booting $kver under $accel (timeout ${timeout_s}s); console in $console"
set +e
timeout --foreground -k 5 "$timeout_s" qemu-system-x86_64 \
    -machine q35 -accel "$accel" -cpu max -smp 2 -m 1G \
    -device intel-iommu \
    -nographic -no-reboot \
    -kernel "$vmlinuz" -initrd "$work/initramfs.gz" \
    -append "console=ttyS0 intel_iommu=on panic=-1 quiet loglevel=4" \
    -drive file="$img",if=none,id=n0,format=raw \
    -device nvme,drive=n0,serial=lavik,addr=0x4 \
    -drive file="blkdebug:$work/blkdebug.conf:$faulty_img",if=none,id=n1,format=raw \
    -device nvme,drive=n1,serial=lavik-faulty,addr=0x5 \
    -drive file="$slow_img",if=none,id=n2,format=raw,throttling.iops-total=1 \
    -device nvme,drive=n2,serial=lavik-slow,addr=0x6 \
    -drive file="$server_img",if=none,id=n3,format=raw \
    -device nvme,drive=n3,serial=lavik-server,addr=0x7 \
    </dev/null >"$console" 2>&1
qemu_rc=$?
set -e

grep -E '^(PASS|FAIL|guest:|NVME-GUEST-RESULT)' "$console" | tr -d '\r' >&2 || true
if [ $qemu_rc -eq 124 ]; then log "timed out after ${timeout_s}s"; fi
if grep -q '^NVME-GUEST-RESULT: PASS' "$console" && ! grep -q '^FAIL' "$console"; then
    # The writes must have reached the emulated medium, not just guest memory.
    if cmp -s -n 16384 "$img" /dev/zero; then
        log "FAIL: guest reported PASS but the first 16 KiB of $img are still zero"
        exit 1
    fi
    if cmp -s -n 4096 "$server_img" /dev/zero; then
        log "FAIL: guest reported PASS but $server_img has no store label"
        exit 1
    fi
    log "PASS (disk images hold the written data)"
    exit 0
fi
log "FAIL (qemu exit $qemu_rc; last console lines follow)"
tail -25 "$console" | tr -d '\r' >&2
exit 1
