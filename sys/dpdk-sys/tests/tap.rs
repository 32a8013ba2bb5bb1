//! Smoke test: DPDK's net_tap PMD talks to the kernel's IPv4 stack, and our hand-written
//! ARP/ICMP/UDP replies sent with tx_burst are accepted by the kernel.
//!
//! Proves, in order: the static link registered the tap vdev driver (the port exists), a port
//! configures and starts on a `--no-huge --no-pci` EAL, rx_burst delivers the kernel's frames,
//! frames built in a tx mbuf reach the kernel (it learns our MAC from the ARP reply, gets its
//! UDP datagram echoed back, and `ping` succeeds when iputils-ping is installed), and closing
//! the port removes the tap interface.
//!
//! Needs root (tap device, network namespace); skips with a printed reason otherwise. Runs
//! without the libtest harness because DPDK's EAL initializes once per process and the test
//! moves the process into a fresh network namespace first, so the tap interface, its address
//! and all traffic stay private and vanish with the process.
//!
//! Run: `cargo test -p dpdk-sys --test tap`

mod common;

use common::{fmt_mac, output_of, POOL_BUFFERS, POOL_CACHE_BUFFERS};
use dpdk_sys::{Eal, Mempool};
use std::time::Instant;

const TAP_IFACE: &str = "lvktap0";

fn main() {
    if !common::is_root() {
        println!("SKIP tap smoke test: needs root (creates a tap device and a network namespace)");
        return;
    }
    let started = Instant::now();
    common::enter_private_network_namespace();
    let args = common::eal_args("tap-smoke", &format!("net_tap0,iface={TAP_IFACE}"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let eal = Eal::init(&args).unwrap_or_else(|e| panic!("EAL init: {e}"));
    assert_eq!(
        eal.port_count(),
        1,
        "the net_tap vdev did not register (static link lost the PMD constructor?)"
    );
    let port_id = eal
        .port_by_name("net_tap0")
        .unwrap_or_else(|e| panic!("{e}"));
    let pool = Mempool::create(
        &eal,
        "tap_smoke",
        POOL_BUFFERS,
        POOL_CACHE_BUFFERS,
        2048 + 128,
    )
    .unwrap_or_else(|e| panic!("mbuf pool: {e}"));
    let port = common::start_port(port_id, &pool);
    let our_mac = port.mac_addr().unwrap_or_else(|e| panic!("{e}"));
    common::configure_kernel_side(TAP_IFACE);
    println!(
        "EAL and tap port up after {:.2?}; our MAC {}",
        started.elapsed(),
        fmt_mac(&our_mac)
    );

    common::echo_exchange(&port, &pool, &our_mac, TAP_IFACE);

    drop(port);
    // The tap interface disappears when its port closes.
    let links = output_of("ip", &["-o", "link", "show"]);
    assert!(
        !links.contains(TAP_IFACE),
        "tap interface left behind after port close: {links}"
    );
    drop(pool);
    drop(eal);
    println!("tap smoke test passed in {:.2?}", started.elapsed());
}
