//! Smoke test: DPDK's net_af_packet PMD on one end of a veth pair, the kernel's IPv4 stack on
//! the other; our hand-written ARP/ICMP/UDP replies sent with tx_burst reach the kernel.
//!
//! This is the documented way to test without a NIC when a tap is not wanted. The kernel end
//! gets `ethtool -K <veth> tx off`: with transmit checksum offload on, the kernel leaves the
//! UDP checksum unfinished (only the pseudo-header sum) for a "device" that never completes
//! it, so a userspace stack reading the frame sees a bad checksum. The shared responder
//! verifies every ICMP/UDP checksum it receives, so this test fails without that step
//! (checked: with `tx on` it reports `bad_l4_checksums: 1`). Needs root; skips with a printed
//! reason otherwise. Runs in a private network namespace.
//!
//! Run: `cargo test -p dpdk-sys --test af_packet`

mod common;

use common::{fmt_mac, run_ip, POOL_BUFFERS, POOL_CACHE_BUFFERS};
use dpdk_sys::{Eal, Mempool};
use std::process::Command;
use std::time::Instant;

/// The veth end DPDK opens with an AF_PACKET socket.
const DPDK_IFACE: &str = "lvkveth0";
/// The veth end the kernel stack uses.
const KERNEL_IFACE: &str = "lvkveth1";

fn main() {
    if !common::is_root() {
        println!(
            "SKIP af_packet smoke test: needs root (creates a veth pair and a network namespace)"
        );
        return;
    }
    let started = Instant::now();
    common::enter_private_network_namespace();
    run_ip(&[
        "link",
        "add",
        DPDK_IFACE,
        "type",
        "veth",
        "peer",
        "name",
        KERNEL_IFACE,
    ]);
    let ethtool = Command::new("ethtool")
        .args(["-K", KERNEL_IFACE, "tx", "off"])
        .output()
        .expect("run ethtool (apt-get install ethtool)");
    assert!(
        ethtool.status.success(),
        "ethtool -K {KERNEL_IFACE} tx off failed"
    );
    common::disable_ipv6(DPDK_IFACE);
    run_ip(&["link", "set", DPDK_IFACE, "up"]);

    let args = common::eal_args(
        "af-packet-smoke",
        &format!("net_af_packet0,iface={DPDK_IFACE}"),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let eal = Eal::init(&args).unwrap_or_else(|e| panic!("EAL init: {e}"));
    assert_eq!(
        eal.port_count(),
        1,
        "the net_af_packet vdev did not register"
    );
    let port_id = eal
        .port_by_name("net_af_packet0")
        .unwrap_or_else(|e| panic!("{e}"));
    let pool = Mempool::create(
        &eal,
        "afp_smoke",
        POOL_BUFFERS,
        POOL_CACHE_BUFFERS,
        2048 + 128,
    )
    .unwrap_or_else(|e| panic!("mbuf pool: {e}"));
    let port = common::start_port(port_id, &pool);
    let our_mac = port.mac_addr().unwrap_or_else(|e| panic!("{e}"));
    common::configure_kernel_side(KERNEL_IFACE);
    println!(
        "EAL and af_packet port up after {:.2?}; our MAC {}",
        started.elapsed(),
        fmt_mac(&our_mac)
    );

    common::echo_exchange(&port, &pool, &our_mac, KERNEL_IFACE);
    drop(port);
    drop(pool);
    drop(eal);
    println!("af_packet smoke test passed in {:.2?}", started.elapsed());
}
