//! Smoke test: DPDK's net_tap PMD talks to the kernel's IPv4 stack, and our hand-written
//! ARP/ICMP/UDP replies sent with tx_burst are accepted by the kernel.
//!
//! Proves, in order: the static link registered the tap vdev driver (the port exists), a port
//! configures and starts on a `--no-huge --no-pci` EAL, rx_burst delivers the kernel's frames,
//! and frames built in a tx mbuf reach the kernel (it learns our MAC from the ARP reply, gets
//! its UDP datagram echoed back, and `ping` succeeds when iputils-ping is installed).
//!
//! Needs root (tap device, network namespace); skips with a printed reason otherwise. Runs
//! without the libtest harness because DPDK's EAL initializes once per process and the test
//! moves the process into a fresh network namespace first, so the tap interface, its address
//! and all traffic stay private and vanish with the process.
//!
//! Run: `cargo test -p dpdk-sys --test tap`

use dpdk_sys::{Eal, Mbuf, Mempool, Port, PortConfig};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TAP_IFACE: &str = "lvktap0";
/// Kernel side of the tap and our (DPDK) side: a private /30.
const KERNEL_IP: Ipv4Addr = Ipv4Addr::new(10, 231, 0, 1);
const DPDK_IP: Ipv4Addr = Ipv4Addr::new(10, 231, 0, 2);
const UDP_ECHO_PORT: u16 = 7;
const UDP_PAYLOAD: &[u8] = b"lavik dpdk-sys tap smoke";
const DEADLINE: Duration = Duration::from_secs(10);
const POOL_BUFFERS: u32 = 1023;
const POOL_CACHE_BUFFERS: u32 = 32;

const ETH_HEADER_BYTES: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_ARP: u16 = 0x0806;
const ARP_PACKET_BYTES: usize = 28;
const IP_PROTO_ICMP: u8 = 1;
const IP_PROTO_UDP: u8 = 17;

#[derive(Default, Debug)]
struct Counters {
    frames_received: usize,
    arp_replies_sent: usize,
    icmp_replies_sent: usize,
    udp_replies_sent: usize,
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP tap smoke test: needs root (creates a tap device and a network namespace)");
        return;
    }
    let started = Instant::now();
    enter_private_network_namespace();
    run(started);
    println!("tap smoke test passed in {:.2?}", started.elapsed());
}

/// Moves this (still single-threaded) process into a new network namespace, so the tap device
/// DPDK creates, and every helper command we spawn, live there.
fn enter_private_network_namespace() {
    // SAFETY: unshare only changes this thread's namespace; no other thread exists yet, so the
    // EAL threads created later inherit the new namespace.
    let ret = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(
        ret,
        0,
        "unshare(CLONE_NEWNET) failed: {}",
        std::io::Error::last_os_error()
    );
    run_ip(&["link", "set", "lo", "up"]);
}

fn run(started: Instant) {
    let eal = Eal::init(&[
        "tap-smoke",
        "-l",
        "0",
        "--no-huge",
        "--no-pci",
        "-m",
        "256",
        "--no-shconf",
        "--log-level=notice",
        &format!("--vdev=net_tap0,iface={TAP_IFACE}"),
    ])
    .expect("EAL init");
    assert_eq!(
        eal.port_count(),
        1,
        "the net_tap vdev did not register (static link lost the PMD constructor?)"
    );
    let port_id = eal.port_by_name("net_tap0").expect("port net_tap0");
    let pool = Mempool::create(
        &eal,
        "tap_smoke",
        POOL_BUFFERS,
        POOL_CACHE_BUFFERS,
        2048 + 128,
    )
    .expect("mbuf pool");
    let config = PortConfig {
        rx_ring_descriptors: 512,
        tx_ring_descriptors: 512,
        ..PortConfig::default()
    };
    let mut port = Port::configure(port_id, &config, &pool).expect("port configure");
    port.start().expect("port start");
    let our_mac = port.mac_addr().expect("port MAC");
    configure_kernel_side();
    println!(
        "EAL and tap port up after {:.2?}; our MAC {}",
        started.elapsed(),
        fmt_mac(&our_mac)
    );

    let kernel_udp =
        UdpSocket::bind(SocketAddrV4::new(KERNEL_IP, 0)).expect("bind UDP on the tap address");
    kernel_udp
        .set_nonblocking(true)
        .expect("non-blocking UDP socket");
    kernel_udp
        .send_to(UDP_PAYLOAD, SocketAddrV4::new(DPDK_IP, UDP_ECHO_PORT))
        .expect("send UDP to the DPDK side");
    let mut ping = spawn_ping();

    let mut counters = Counters::default();
    let mut udp_echo: Option<Vec<u8>> = None;
    let mut ping_status = None;
    let deadline = Instant::now() + DEADLINE;
    let mut rx = Vec::new();
    let mut tx = Vec::new();
    while Instant::now() < deadline {
        port.rx_burst(0, &mut rx);
        for frame in rx.drain(..) {
            counters.frames_received += 1;
            if let Some(reply) = answer(&frame, &our_mac, &pool, &mut counters) {
                tx.push(reply);
            }
        }
        while !tx.is_empty() {
            port.tx_burst(0, &mut tx);
        }
        let mut buf = [0u8; 256];
        if let Ok((n, from)) = kernel_udp.recv_from(&mut buf) {
            assert_eq!(
                from,
                SocketAddrV4::new(DPDK_IP, UDP_ECHO_PORT).into(),
                "UDP reply source"
            );
            udp_echo = Some(buf[..n].to_vec());
        }
        if let (Some(child), None) = (ping.as_mut(), ping_status) {
            ping_status = child.try_wait().expect("wait for ping");
        }
        if udp_echo.is_some() && (ping.is_none() || ping_status.is_some()) {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    println!("{counters:?}");
    if let (Some(child), None) = (ping.as_mut(), ping_status) {
        let _ = child.kill();
    }

    assert!(
        counters.arp_replies_sent >= 1,
        "no ARP request for {DPDK_IP} was answered"
    );
    assert_eq!(
        udp_echo.as_deref(),
        Some(UDP_PAYLOAD),
        "the kernel did not receive our UDP echo"
    );
    let neigh = output_of(
        "ip",
        &["neigh", "show", &DPDK_IP.to_string(), "dev", TAP_IFACE],
    );
    assert!(
        neigh.contains(&fmt_mac(&our_mac)),
        "kernel neighbour table does not hold our MAC from the ARP reply: {neigh:?}"
    );
    match (ping, ping_status) {
        (None, _) => println!("note: `ping` not installed (iputils-ping); ICMP echo not exercised"),
        (Some(_), status) => {
            let ok = status.is_some_and(|s| s.success());
            assert!(ok, "ping {DPDK_IP} failed: {status:?}");
            assert!(
                counters.icmp_replies_sent >= 1,
                "ping succeeded without our ICMP reply?"
            );
        }
    }
    drop((rx, tx));
    drop(port);
    // The tap interface disappears when its port closes.
    let links = output_of("ip", &["-o", "link", "show"]);
    assert!(
        !links.contains(TAP_IFACE),
        "tap interface left behind after port close: {links}"
    );
    drop(pool);
    drop(eal);
}

/// Gives the kernel side of the tap the /30 address and brings it up; turns IPv6 off on it so
/// router solicitations do not clutter the capture.
fn configure_kernel_side() {
    let ipv6_off = format!("/proc/sys/net/ipv6/conf/{TAP_IFACE}/disable_ipv6");
    if std::path::Path::new(&ipv6_off).exists() {
        std::fs::write(&ipv6_off, "1").expect("disable IPv6 on the tap");
    }
    run_ip(&["addr", "add", &format!("{KERNEL_IP}/30"), "dev", TAP_IFACE]);
    run_ip(&["link", "set", TAP_IFACE, "up"]);
}

fn spawn_ping() -> Option<Child> {
    Command::new("ping")
        .args(["-c1", "-W1", "-n", &DPDK_IP.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

fn run_ip(args: &[&str]) {
    let status = Command::new("ip")
        .args(args)
        .status()
        .expect("run ip (iproute2)");
    assert!(status.success(), "ip {} failed: {status}", args.join(" "));
}

fn output_of(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .expect("run helper command");
    assert!(out.status.success(), "{program} {} failed", args.join(" "));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn fmt_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Builds the reply to one received frame, if it is an ARP request for our address, an ICMP
/// echo request to us, or a UDP datagram to our echo port.
fn answer<'p>(
    frame: &Mbuf<'_>,
    our_mac: &[u8; 6],
    pool: &'p Mempool<'_>,
    c: &mut Counters,
) -> Option<Mbuf<'p>> {
    let rx = frame.data();
    if rx.len() < ETH_HEADER_BYTES {
        return None;
    }
    match be16(rx, 12) {
        ETHERTYPE_ARP => {
            let reply = arp_reply(rx, our_mac)?;
            c.arp_replies_sent += 1;
            Some(to_mbuf(pool, &reply))
        }
        ETHERTYPE_IPV4 => {
            let (reply, proto) = ipv4_echo(rx, our_mac)?;
            match proto {
                IP_PROTO_ICMP => c.icmp_replies_sent += 1,
                _ => c.udp_replies_sent += 1,
            }
            Some(to_mbuf(pool, &reply))
        }
        _ => None,
    }
}

fn to_mbuf<'p>(pool: &'p Mempool<'_>, bytes: &[u8]) -> Mbuf<'p> {
    let mut m = pool.alloc().expect("tx mbuf");
    let len = u16::try_from(bytes.len()).expect("frame fits an mbuf");
    m.append(len)
        .expect("tailroom for the reply")
        .copy_from_slice(bytes);
    assert_eq!(m.data(), bytes);
    m
}

/// RFC 826 reply to a request for `DPDK_IP`.
fn arp_reply(rx: &[u8], our_mac: &[u8; 6]) -> Option<Vec<u8>> {
    let arp = rx.get(ETH_HEADER_BYTES..ETH_HEADER_BYTES + ARP_PACKET_BYTES)?;
    let is_ipv4_over_ethernet =
        be16(arp, 0) == 1 && be16(arp, 2) == ETHERTYPE_IPV4 && arp[4] == 6 && arp[5] == 4;
    if !is_ipv4_over_ethernet || be16(arp, 6) != 1 || arp[24..28] != DPDK_IP.octets() {
        return None;
    }
    let (sender_mac, sender_ip) = (&arp[8..14], &arp[14..18]);
    let mut out = Vec::with_capacity(ETH_HEADER_BYTES + ARP_PACKET_BYTES);
    out.extend_from_slice(sender_mac);
    out.extend_from_slice(our_mac);
    out.extend_from_slice(&ETHERTYPE_ARP.to_be_bytes());
    out.extend_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 2]);
    out.extend_from_slice(our_mac);
    out.extend_from_slice(&DPDK_IP.octets());
    out.extend_from_slice(sender_mac);
    out.extend_from_slice(sender_ip);
    Some(out)
}

/// Echo reply for an ICMP echo request or a UDP datagram to our echo port: same payload,
/// addresses and ports swapped, checksums recomputed.
fn ipv4_echo(rx: &[u8], our_mac: &[u8; 6]) -> Option<(Vec<u8>, u8)> {
    let ip = rx.get(ETH_HEADER_BYTES..)?;
    if ip.len() < 20 || ip[0] >> 4 != 4 || ip[16..20] != DPDK_IP.octets() {
        return None;
    }
    let header_bytes = usize::from(ip[0] & 0x0f) * 4;
    let total_bytes = usize::from(be16(ip, 2));
    if header_bytes < 20 || total_bytes < header_bytes || total_bytes > ip.len() {
        return None;
    }
    let proto = ip[9];
    let mut out = Vec::with_capacity(ETH_HEADER_BYTES + total_bytes);
    out.extend_from_slice(&rx[6..12]);
    out.extend_from_slice(our_mac);
    out.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    out.extend_from_slice(&ip[..total_bytes]);
    let reply_ip = &mut out[ETH_HEADER_BYTES..];
    let (src, dst) = (reply_ip[12..16].to_vec(), reply_ip[16..20].to_vec());
    reply_ip[12..16].copy_from_slice(&dst);
    reply_ip[16..20].copy_from_slice(&src);
    reply_ip[8] = 64;
    let (header, l4) = reply_ip.split_at_mut(header_bytes);
    match proto {
        IP_PROTO_ICMP if l4.len() >= 8 && l4[0] == 8 => {
            l4[0] = 0;
            l4[2..4].copy_from_slice(&[0, 0]);
            let sum = internet_checksum(l4);
            l4[2..4].copy_from_slice(&sum.to_be_bytes());
        }
        IP_PROTO_UDP if l4.len() >= 8 && be16(l4, 2) == UDP_ECHO_PORT => {
            let (sport, dport) = (be16(l4, 0), be16(l4, 2));
            l4[0..2].copy_from_slice(&dport.to_be_bytes());
            l4[2..4].copy_from_slice(&sport.to_be_bytes());
            // Zero means "no checksum" for UDP over IPv4 (RFC 768).
            l4[6..8].copy_from_slice(&[0, 0]);
        }
        _ => return None,
    }
    header[10..12].copy_from_slice(&[0, 0]);
    let sum = internet_checksum(header);
    header[10..12].copy_from_slice(&sum.to_be_bytes());
    Some((out, proto))
}

/// RFC 1071 ones'-complement checksum.
fn internet_checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for chunk in bytes.chunks(2) {
        let word = u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}
