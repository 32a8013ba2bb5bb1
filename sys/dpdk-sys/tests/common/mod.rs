//! Shared by the kernel-facing smoke tests (`tap`, `af_packet`): a private network namespace,
//! and a tiny responder that answers the kernel's ARP requests, ICMP echo requests and UDP
//! datagrams with frames built by hand, sent through `Port::tx_burst`.

#![allow(dead_code)]

use dpdk_sys::{Mbuf, Mempool, Port, PortConfig};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kernel side of the link and our (DPDK) side: a private /30.
/// Kernel side of the tap and our (DPDK) side: a private /30.
pub const KERNEL_IP: Ipv4Addr = Ipv4Addr::new(10, 231, 0, 1);
pub const DPDK_IP: Ipv4Addr = Ipv4Addr::new(10, 231, 0, 2);
pub const UDP_ECHO_PORT: u16 = 7;
pub const UDP_PAYLOAD: &[u8] = b"lavik dpdk-sys smoke";
pub const DEADLINE: Duration = Duration::from_secs(10);
pub const POOL_BUFFERS: u32 = 1023;
pub const POOL_CACHE_BUFFERS: u32 = 32;

pub const ETH_HEADER_BYTES: usize = 14;
pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERTYPE_ARP: u16 = 0x0806;
pub const ARP_PACKET_BYTES: usize = 28;
pub const IP_PROTO_ICMP: u8 = 1;
pub const IP_PROTO_UDP: u8 = 17;

#[derive(Default, Debug)]
pub struct Counters {
    pub frames_received: usize,
    pub arp_replies_sent: usize,
    pub icmp_replies_sent: usize,
    pub udp_replies_sent: usize,
    /// ICMP/UDP frames from the kernel whose checksum does not verify.
    pub bad_l4_checksums: usize,
}

/// Whether the test may create interfaces and namespaces.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Moves this (still single-threaded) process into a new network namespace, so the devices
/// DPDK opens or creates, and every helper command spawned, live there and vanish with it.
pub fn enter_private_network_namespace() {
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

/// EAL arguments for a single-lcore, hugepage-free, PCI-free run with one virtual device.
pub fn eal_args(program: &str, vdev: &str) -> Vec<String> {
    [
        program,
        "-l",
        "0",
        "--no-huge",
        "--no-pci",
        "-m",
        "256",
        "--no-shconf",
        "--log-level=notice",
        &format!("--vdev={vdev}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Configures and starts one RX/TX queue pair on `port_id`.
pub fn start_port<'p>(port_id: u16, pool: &'p Mempool<'_>) -> Port<'p> {
    let config = PortConfig {
        rx_ring_descriptors: 512,
        tx_ring_descriptors: 512,
        ..PortConfig::default()
    };
    let mut port =
        Port::configure(port_id, &config, pool).unwrap_or_else(|e| panic!("port configure: {e}"));
    port.start().unwrap_or_else(|e| panic!("port start: {e}"));
    port
}

/// Turns IPv6 off on `iface` so router solicitations and DAD do not clutter the capture.
pub fn disable_ipv6(iface: &str) {
    let knob = format!("/proc/sys/net/ipv6/conf/{iface}/disable_ipv6");
    if std::path::Path::new(&knob).exists() {
        std::fs::write(&knob, "1").expect("disable IPv6");
    }
}

/// Gives the kernel side `KERNEL_IP/30` and brings it up.
pub fn configure_kernel_side(iface: &str) {
    disable_ipv6(iface);
    run_ip(&["addr", "add", &format!("{KERNEL_IP}/30"), "dev", iface]);
    run_ip(&["link", "set", iface, "up"]);
}

/// Sends a UDP datagram and a ping from the kernel (via `kernel_iface`) to `DPDK_IP`, answers
/// on `port` until both came back or `DEADLINE` passed, then asserts the kernel accepted our
/// ARP, UDP and ICMP replies.
pub fn echo_exchange(
    port: &Port<'_>,
    pool: &Mempool<'_>,
    our_mac: &[u8; 6],
    kernel_iface: &str,
) -> Counters {
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
            if let Some(reply) = answer(&frame, our_mac, pool, &mut counters) {
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

    assert_eq!(
        counters.bad_l4_checksums, 0,
        "the kernel sent frames with unfinished checksums (veth without `ethtool -K tx off`?)"
    );
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
        &["neigh", "show", &DPDK_IP.to_string(), "dev", kernel_iface],
    );
    assert!(
        neigh.contains(&fmt_mac(our_mac)),
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
    counters
}

fn spawn_ping() -> Option<Child> {
    Command::new("ping")
        .args(["-c1", "-W1", "-n", &DPDK_IP.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

pub fn run_ip(args: &[&str]) {
    let status = Command::new("ip")
        .args(args)
        .status()
        .expect("run ip (iproute2)");
    assert!(status.success(), "ip {} failed: {status}", args.join(" "));
}

pub fn output_of(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .expect("run helper command");
    assert!(out.status.success(), "{program} {} failed", args.join(" "));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn fmt_mac(mac: &[u8; 6]) -> String {
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
pub fn answer<'p>(
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
            if l4_checksum_ok(rx) == Some(false) {
                c.bad_l4_checksums += 1;
            }
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

/// Verifies the ICMP or UDP checksum of an IPv4 frame (UDP with the pseudo-header; a zero
/// UDP checksum means none). `None` when the frame is neither or is truncated.
fn l4_checksum_ok(rx: &[u8]) -> Option<bool> {
    let ip = rx.get(ETH_HEADER_BYTES..)?;
    let header_bytes = usize::from(*ip.first()? & 0x0f) * 4;
    let total_bytes = usize::from(be16(ip.get(..4)?, 2));
    let l4 = ip.get(header_bytes..total_bytes)?;
    match ip[9] {
        IP_PROTO_ICMP => Some(internet_checksum(l4) == 0),
        IP_PROTO_UDP if l4.len() >= 8 && be16(l4, 6) != 0 => {
            let mut covered = Vec::with_capacity(12 + l4.len());
            covered.extend_from_slice(&ip[12..20]);
            covered.extend_from_slice(&[0, IP_PROTO_UDP]);
            covered.extend_from_slice(&(l4.len() as u16).to_be_bytes());
            covered.extend_from_slice(l4);
            Some(internet_checksum(&covered) == 0)
        }
        _ => None,
    }
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
