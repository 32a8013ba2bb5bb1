//! Build script for `dpdk-sys`.
//!
//! 1. Asks `pkg-config` for DPDK's compile flags and its `--static` link line.
//! 2. Runs bindgen over `csrc/wrapper.h` (allowlisted, so the bindings stay small).
//! 3. Compiles `csrc/shim.c`, which turns DPDK's `static inline` fast path into real symbols.
//! 4. Links DPDK statically. The DPDK libraries go in with `--whole-archive`: bus and PMD
//!    drivers register themselves from ELF constructors that nothing references, so a plain
//!    static link would silently drop them and `rte_eth_dev_count_avail()` would be 0.
//!
//! By default only a trimmed set of DPDK archives is linked (EAL, mempool/mbuf/ethdev, the vdev
//! and PCI buses, and the net_tap, net_af_packet, net_virtio, net_null, net_ring PMDs), which
//! keeps the system-library list short. `LAVIK_DPDK_LINK=full` links every archive and system
//! library `pkg-config --static --libs libdpdk` names instead.
use std::env;
use std::path::PathBuf;
use std::process::Command;

const INSTALL_HINT: &str = "apt-get install libdpdk-dev libsystemd-dev libclang-dev pkg-config";

/// DPDK archives linked in the default (trimmed) mode; the name inside `librte_<name>.a`.
const TRIMMED_ARCHIVES: &[&str] = &[
    "net_tap",
    "net_af_packet",
    "net_virtio",
    "net_null",
    "net_ring",
    "bus_vdev",
    "bus_pci",
    "mempool_ring",
    "gso",
    "hash",
    "pci",
    "ethdev",
    "meter",
    "net",
    "mbuf",
    "mempool",
    "rcu",
    "ring",
    "eal",
    "telemetry",
    "kvargs",
];

/// System libraries the trimmed archive set needs (EAL: numa, libbsd's strlcpy, dl, rt).
const TRIMMED_SYSTEM_LIBS: &[&str] = &["numa", "bsd", "md", "m", "dl", "pthread", "rt", "atomic"];

/// Stops the build with a message (cargo shows a build script's stderr when it fails).
fn fail(what: &str) -> ! {
    eprintln!("\ndpdk-sys: {what}\nInstall the build dependencies with:\n    {INSTALL_HINT}\n");
    std::process::exit(1);
}

fn pkg_config(args: &[&str]) -> String {
    let out = match Command::new("pkg-config").args(args).output() {
        Ok(out) => out,
        Err(e) => fail(&format!("cannot run pkg-config ({e})")),
    };
    if !out.status.success() {
        fail(&format!(
            "`pkg-config {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Splits pkg-config output into words (DPDK's .pc files hold no quoted arguments).
fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

fn main() {
    println!("cargo:rerun-if-changed=csrc/wrapper.h");
    println!("cargo:rerun-if-changed=csrc/shim.c");
    println!("cargo:rerun-if-env-changed=LAVIK_DPDK_LINK");
    for var in [
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "PKG_CONFIG_SYSROOT_DIR",
        "LIBCLANG_PATH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    let version = pkg_config(&["--modversion", "libdpdk"]);
    if !version.starts_with("22.11") {
        println!(
            "cargo:warning=dpdk-sys is pinned to DPDK 22.11 (vendor/DPDK_VERSION), found {version}"
        );
    }
    let cflags = words(&pkg_config(&["--cflags", "libdpdk"]));
    let libs = words(&pkg_config(&["--static", "--libs", "libdpdk"]));

    generate_bindings(&cflags);
    compile_shim(&cflags);
    let full = env::var("LAVIK_DPDK_LINK").is_ok_and(|v| v == "full");
    emit_link_lines(&libs, full);
}

fn generate_bindings(cflags: &[String]) {
    let builder = bindgen::Builder::default()
        .header("csrc/wrapper.h")
        .clang_args(cflags)
        .allowlist_function("rte_eal_(init|cleanup|process_type)")
        .allowlist_function("rte_strerror")
        .allowlist_function("rte_socket_id")
        .allowlist_function("rte_eth_dev_(count_avail|configure|start|stop|close|info_get|socket_id|get_name_by_port|get_port_by_name|set_link_up|is_valid_port)")
        .allowlist_function("rte_eth_(rx|tx)_queue_setup")
        .allowlist_function("rte_eth_(macaddr_get|promiscuous_enable|link_get_nowait|stats_get|find_next_owned_by)")
        .allowlist_function("rte_pktmbuf_pool_create")
        .allowlist_function("rte_mempool_(free|avail_count|in_use_count)")
        .allowlist_function("lvk_.*")
        .allowlist_type("rte_eth_conf|rte_eth_dev_info|rte_ether_addr|rte_eth_link|rte_eth_stats")
        .allowlist_type("rte_eth_rxconf|rte_eth_txconf|rte_mbuf|rte_mempool")
        .allowlist_var("RTE_ETH_.*|RTE_MAX_ETHPORTS|RTE_MBUF_DEFAULT_BUF_SIZE|RTE_PKTMBUF_HEADROOM|SOCKET_ID_ANY|RTE_ETHER_ADDR_LEN")
        .derive_default(true)
        .layout_tests(true)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    // bindgen panics (rather than returning an error) when libclang cannot be loaded; catch it
    // quietly and report it with the install hint instead of a backtrace.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let generated =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || builder.generate()));
    std::panic::set_hook(default_hook);
    let bindings = match generated {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => fail(&format!("bindgen could not parse the DPDK headers: {e}")),
        Err(payload) => {
            let why = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("unknown reason");
            fail(&format!("bindgen could not load libclang: {why}"))
        }
    };
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings.rs into OUT_DIR");
}

fn compile_shim(cflags: &[String]) {
    let mut build = cc::Build::new();
    build.file("csrc/shim.c").include("csrc").warnings(true);
    for flag in cflags {
        build.flag(flag);
    }
    build.compile("lvk_dpdk_shim");
}

/// Emits `cargo:` link lines for DPDK from the `--static` pkg-config words.
fn emit_link_lines(libs: &[String], full: bool) {
    let mut archives = Vec::new();
    let mut system_libs = Vec::new();
    for w in libs {
        if let Some(dir) = w.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
        } else if let Some(archive) = w.strip_prefix("-l:") {
            archives.push(archive.to_string());
        } else if let Some(lib) = w.strip_prefix("-l") {
            // `-lrte_*` repeat the archives as shared libraries; the archives already cover them.
            if !lib.starts_with("rte_") && !system_libs.iter().any(|l| l == lib) {
                system_libs.push(lib.to_string());
            }
        }
    }
    if archives.is_empty() {
        fail("`pkg-config --static --libs libdpdk` named no static archives (librte_*.a)");
    }
    if !full {
        let available = archives;
        archives = Vec::new();
        for name in TRIMMED_ARCHIVES {
            let archive = format!("librte_{name}.a");
            if !available.contains(&archive) {
                fail(&format!("DPDK static archive {archive} is missing"));
            }
            archives.push(archive);
        }
        system_libs = TRIMMED_SYSTEM_LIBS.iter().map(|s| s.to_string()).collect();
    }
    for archive in &archives {
        // -bundle: do not copy the archive into the rlib; the final link takes it whole.
        println!("cargo:rustc-link-lib=static:+whole-archive,-bundle,+verbatim={archive}");
    }
    // A `+crt-static` build (the static binary the QEMU guest scripts run) takes the
    // system libraries' archives too: one `dylib` entry would make the binary dynamic.
    let crt_static =
        env::var("CARGO_CFG_TARGET_FEATURE").is_ok_and(|f| f.split(',').any(|f| f == "crt-static"));
    let kind = if crt_static {
        "static:-bundle"
    } else {
        "dylib"
    };
    for lib in &system_libs {
        println!("cargo:rustc-link-lib={kind}={lib}");
    }
    // Kept so dependent build scripts (the `lavik` package) can read what was linked.
    println!("cargo:archives={}", archives.join(","));
}
