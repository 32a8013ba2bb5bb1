#!/usr/bin/env bash
# Builds a trimmed, static-only DPDK from Debian 12's source package and installs it under
# $PREFIX (default /opt/lavik-dpdk). Use it when the distribution's libdpdk-dev is unsuitable
# (another release, or a smaller link); dpdk-sys picks it up through PKG_CONFIG_PATH:
#
#   vendor/build-dpdk.sh
#   PKG_CONFIG_PATH=/opt/lavik-dpdk/lib/x86_64-linux-gnu/pkgconfig cargo build --features dpdk
#
# Needs deb-src entries for bookworm (see vendor/README.md) and root for apt-get.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
pin="$(tr -d '[:space:]' < "$here/DPDK_VERSION")"
prefix="${PREFIX:-/opt/lavik-dpdk}"
work="${WORK:-$(mktemp -d /tmp/lavik-dpdk.XXXXXX)}"
jobs="${JOBS:-2}"

# Drivers lavik uses: the vdev/PCI buses, the default ring mempool, and the PMDs for tests
# (tap, af_packet, null, ring) and for the VM appliance test (virtio).
drivers="bus/pci,bus/vdev,mempool/ring,net/tap,net/af_packet,net/virtio,net/null,net/ring"
# Libraries nothing above needs. DPDK 22.11 lets only its "optional" libraries be disabled
# (the core ones are always built, and cost only archive size since we link selectively).
disabled_libs="bitratestats,cfgfile,flow_classify,gpudev,gro,jobstats,kni,latencystats,metrics"
disabled_libs+=",node,pdump,pipeline,port,power,table,vhost"

if ! apt-cache showsrc dpdk >/dev/null 2>&1; then
    echo "build-dpdk.sh: no deb-src for dpdk; add 'Types: deb deb-src' to /etc/apt/sources.list.d/debian.sources and run apt-get update" >&2
    exit 1
fi
apt-get install -y --no-install-recommends dpkg-dev meson ninja-build python3-pyelftools \
    libnuma-dev libbsd-dev pkg-config gcc

cd "$work"
apt-get source --download-only dpdk
dpkg-source -x dpdk_*.dsc src
cd src
version="$(sed -n '1p' VERSION)"
case "$version" in
    "$pin"*) ;;
    *) echo "build-dpdk.sh: source is DPDK $version, vendor/DPDK_VERSION pins $pin" >&2; exit 1 ;;
esac

opts=(
    --prefix="$prefix"
    --buildtype=release
    -Ddefault_library=static
    -Dplatform=generic
    -Dtests=false
    -Dexamples=
    -Denable_docs=false
    -Denable_kmods=false
    -Denable_drivers="$drivers"
    -Ddisable_libs="$disabled_libs"
)
# Options that only some 22.11 point releases know; pass them only when present.
has_option() { grep -q "option('$1'" meson_options.txt; }
if has_option disable_apps; then opts+=(-Ddisable_apps='*'); fi

meson setup build "${opts[@]}"
ninja -C build -j "$jobs"
ninja -C build install
echo "DPDK $version installed in $prefix; pkg-config file:"
find "$prefix" -name libdpdk.pc
