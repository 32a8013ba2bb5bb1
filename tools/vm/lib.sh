# Shared steps of the QEMU guest scripts (run-nvme-test.sh, run-appliance-test.sh).
# Sourced, not run. The caller sets `repo`, `work` and a `log` function first.
#
#   vm_host_tools           install qemu-system-x86 / busybox-static / cpio if missing;
#                           sets busybox_bin (a static busybox)
#   vm_kernel               Debian's kernel (linux-image-amd64's versioned dependency),
#                           fetched with `apt-get download`, unpacked with `dpkg-deb -x`,
#                           never installed; sets vmlinuz, kver, moddir.
#                           Kept in LAVIK_VM_KERNEL_DIR (default target/vm-kernel).
#   vm_build_lavik FEATURES release static `lavik` with those cargo features; sets server_bin
#                           (LAVIK_VM_SERVER_BIN: use that prebuilt static binary instead)
#   vm_initramfs_root       fresh $work/initramfs with busybox; sets root
#   vm_modules NAME...      copies the modules and their dependencies (depth-first on the
#                           .ko's depends= field) into $root/lib/modules, load order in
#                           $root/lib/modules/order
#   vm_pack_initramfs       $root -> $work/initramfs.gz

host_target=x86_64-unknown-linux-gnu

vm_host_tools() {
    local need_pkgs=()
    command -v qemu-system-x86_64 >/dev/null || need_pkgs+=(qemu-system-x86)
    [ -e /usr/share/doc/busybox-static ] || need_pkgs+=(busybox-static)
    command -v cpio >/dev/null || need_pkgs+=(cpio)
    if [ ${#need_pkgs[@]} -gt 0 ]; then
        log "installing ${need_pkgs[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
    fi
    busybox_bin=/bin/busybox
    [ -x "$busybox_bin" ] || busybox_bin=/usr/bin/busybox
    if ldd "$busybox_bin" 2>&1 | grep -q '=>'; then
        log "$busybox_bin is dynamically linked; install busybox-static"; exit 1
    fi
}

vm_kernel() {
    local kdir=${LAVIK_VM_KERNEL_DIR:-$repo/target/vm-kernel} pkg
    if ! ls "$kdir"/boot/vmlinuz-* >/dev/null 2>&1; then
        pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
        if [ -z "$pkg" ]; then
            apt-get update -qq
            pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
        fi
        [ -n "$pkg" ] || { log "cannot resolve linux-image-amd64 to a versioned package"; exit 1; }
        log "downloading $pkg"
        rm -rf "$kdir.deb" "$kdir"
        mkdir -p "$kdir.deb" "$kdir"
        (cd "$kdir.deb" && apt-get download "$pkg" >/dev/null 2>&1) || { log "apt-get download $pkg failed"; exit 1; }
        dpkg-deb -x "$kdir.deb"/"$pkg"_*.deb "$kdir"
        rm -rf "$kdir.deb"
    fi
    vmlinuz=$(ls "$kdir"/boot/vmlinuz-* | head -1)
    kver=${vmlinuz##*/vmlinuz-}
    moddir="$kdir/lib/modules/$kver"
}

vm_build_lavik() {
    local features=$1
    # LAVIK_VM_SERVER_BIN: a static binary built before (e.g. by an earlier run at another
    # commit; a new commit rebuilds the whole crate, build.rs embeds the commit).
    if [ -n "${LAVIK_VM_SERVER_BIN:-}" ]; then
        server_bin=$LAVIK_VM_SERVER_BIN
        log "using the prebuilt $server_bin (LAVIK_VM_SERVER_BIN)"
        [ -x "$server_bin" ] || { log "$server_bin is not executable"; exit 1; }
        if ldd "$server_bin" 2>&1 | grep -q '=>'; then
            log "$server_bin is dynamically linked; the guest has no libc"; exit 1
        fi
        return
    fi
    # A minimal build refuses --storage=spdk / --network=dpdk (src/config/build.rs).
    log "building lavik (release, static, --features $features)"
    server_bin=$repo/target/$host_target/release/lavik
    if ! (cd "$repo" && RUSTFLAGS='-C target-feature=+crt-static' cargo build --release \
            --target "$host_target" --features "$features" --bin lavik) >"$work/build-lavik.log" 2>&1 ||
            [ ! -x "$server_bin" ]; then
        log "lavik build failed:"; tail -30 "$work/build-lavik.log" >&2; exit 1
    fi
    if ldd "$server_bin" 2>&1 | grep -q '=>'; then
        log "$server_bin is dynamically linked; the guest has no libc"; exit 1
    fi
}

vm_initramfs_root() {
    root="$work/initramfs"
    rm -rf "$root"
    mkdir -p "$root"/{bin,dev,proc,sys,mnt,tmp,lib/modules}
    cp "$busybox_bin" "$root/bin/busybox"
}

vm_modules() {
    local -A mod_path=() loaded=()
    local order=() f n m
    while IFS= read -r f; do
        n=$(basename "$f" .ko); mod_path[${n//-/_}]=$f
    done < <(find "$moddir/kernel" -name '*.ko')
    _vm_add_module() {
        local name=${1//-/_} dep
        [ -n "${loaded[$name]:-}" ] && return 0
        if [ -z "${mod_path[$name]:-}" ]; then
            # Built into the kernel: nothing to load.
            grep -q "/${name}.ko\$\|/${1}.ko\$" "$moddir/modules.builtin" 2>/dev/null && return 0
            log "module $name not in $moddir"; exit 1
        fi
        for dep in $(grep -a -o 'depends=[A-Za-z0-9_,-]*' "${mod_path[$name]}" | head -1 | cut -d= -f2 | tr ',' ' '); do
            _vm_add_module "$dep"
        done
        loaded[$name]=1
        order+=("$name")
    }
    for m in "$@"; do _vm_add_module "$m"; done
    for m in "${order[@]}"; do cp "${mod_path[$m]}" "$root/lib/modules/$m.ko"; done
    printf '%s\n' "${order[@]}" > "$root/lib/modules/order"
}

vm_pack_initramfs() {
    (cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$work/initramfs.gz"
}
