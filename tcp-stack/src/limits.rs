//! Every limit of the stack, in one place, with units in the name. Values that a
//! deployment may want to change per socket live in [`crate::socket::TcpConfig`] and
//! [`crate::iface::InterfaceConfig`]; their defaults are here.

use crate::time::Duration;

/// IP MTU of the link (bytes of IPv4 header and payload per frame).
pub const MTU_BYTES: usize = 1500;
/// Ethernet II header length.
pub const ETHERNET_HEADER_BYTES: usize = 14;
/// Smallest frame on the wire without FCS (IEEE 802.3: 64 bytes with FCS). Shorter
/// frames (ARP, pure ACKs) are zero-padded by `poll_transmit`.
pub const MIN_FRAME_BYTES: usize = 60;
/// Largest frame the stack emits or accepts for TCP, without FCS. Transmit buffers
/// handed to `poll_transmit` must be at least this long.
pub const MAX_FRAME_BYTES: usize = ETHERNET_HEADER_BYTES + MTU_BYTES;
/// Our maximum segment size: MTU less a 20-byte IPv4 and a 20-byte TCP header.
pub const LOCAL_MSS_BYTES: usize = MTU_BYTES - 40;
/// MSS assumed when the peer's SYN carries no MSS option (RFC 9293 §3.7.1).
pub const DEFAULT_REMOTE_MSS_BYTES: usize = 536;
/// Smallest MSS we accept from a peer; smaller advertisements are raised to it so a
/// hostile peer cannot make us send one-byte segments.
pub const MIN_REMOTE_MSS_BYTES: usize = 64;

/// Initial retransmission timeout (RFC 6298 §2.1).
pub const RTO_INITIAL: Duration = Duration::from_secs(1);
/// Lower bound of the RTO. RFC 6298 says 1 s; we follow Linux's 200 ms because lavik
/// runs in data centres where RTTs are microseconds and 1 s stalls are visible to clients.
pub const RTO_MIN: Duration = Duration::from_millis(200);
/// Upper bound of the RTO after backoff (RFC 6298 §2.5 allows ≥ 60 s).
pub const RTO_MAX: Duration = Duration::from_secs(60);
/// Consecutive retransmission timeouts after which a connection is aborted.
pub const RETRANSMISSIONS_MAX: u32 = 12;
/// Retransmissions of a SYN or SYN-ACK before the open fails (Linux: tcp_syn_retries 6,
/// tcp_synack_retries 5). Lower than for data so half-open connections free their
/// backlog place within about two minutes.
pub const SYN_RETRANSMISSIONS_MAX: u32 = 6;
/// How long a connection may sit in FIN-WAIT-2 after our FIN was acknowledged, waiting
/// for the peer's FIN (Linux: tcp_fin_timeout). Bounds the resources a peer that never
/// closes can hold; it also bounds half-close reads.
pub const FIN_WAIT_2_TIMEOUT: Duration = Duration::from_secs(60);
/// Minimum time between ACKs a connection sends in answer to unacceptable empty
/// segments or as RFC 5961 challenge ACKs (Linux: tcp_invalid_ratelimit). Stops two
/// confused peers from bouncing ACKs at line rate and caps what a blind attacker gets.
pub const INVALID_ACK_INTERVAL: Duration = Duration::from_millis(500);
/// Duplicate ACKs that trigger fast retransmit (RFC 5681 §3.2).
pub const DUP_ACK_THRESHOLD: u32 = 3;
/// Initial congestion window in segments (RFC 5681 §3.1 allows up to 4 for small MSS;
/// RFC 6928 allows 10).
pub const INITIAL_CWND_SEGMENTS: usize = 10;

/// Default TIME-WAIT duration: 2 × MSL with MSL = 30 s (Linux uses 60 s total too).
pub const TIME_WAIT_DEFAULT: Duration = Duration::from_secs(60);
/// Default idle time before the first keepalive probe (RFC 1122 §4.2.3.6: ≥ 2 h).
pub const KEEPALIVE_IDLE_DEFAULT: Duration = Duration::from_secs(7200);
/// Default time between unanswered keepalive probes.
pub const KEEPALIVE_INTERVAL_DEFAULT: Duration = Duration::from_secs(75);
/// Unanswered keepalive probes after which the connection is aborted.
pub const KEEPALIVE_PROBES_MAX: u32 = 9;

/// Out-of-order byte ranges a receiver remembers; segments that would need more are
/// dropped (the sender retransmits them).
pub const REASSEMBLY_RANGES_MAX: usize = 8;
/// SACKed ranges a sender remembers; beyond it the highest are forgotten.
pub const SCOREBOARD_RANGES_MAX: usize = 4;
/// Default receive buffer per connection.
pub const RX_BUFFER_DEFAULT_BYTES: usize = 64 * 1024;
/// Default send buffer per connection.
pub const TX_BUFFER_DEFAULT_BYTES: usize = 64 * 1024;
/// Largest buffer we can advertise with the maximum window-scale shift.
pub const BUFFER_MAX_BYTES: usize = (u16::MAX as usize) << 14;

/// ARP cache entries (resolved and resolving) per interface.
pub const ARP_CACHE_ENTRIES: usize = 64;
/// Lifetime of a resolved ARP entry.
pub const ARP_ENTRY_LIFETIME: Duration = Duration::from_secs(60);
/// A resolved entry used within this margin of its expiry is refreshed with a unicast
/// request while it stays usable, so busy next hops never stall on re-resolution.
pub const ARP_REFRESH_MARGIN: Duration = Duration::from_secs(10);
/// Time between ARP requests for an unresolved address.
pub const ARP_RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// ARP requests sent for one address before its queued packets are dropped.
pub const ARP_REQUESTS_MAX: u32 = 3;
/// Outgoing frames held by the interface: ARP replies, ICMP replies, RSTs, and IP
/// packets waiting for address resolution. When full, new ones are dropped and counted.
pub const PENDING_FRAMES_MAX: usize = 32;

/// Default cap on sockets (listeners and connections) per interface.
pub const SOCKETS_DEFAULT_MAX: usize = 1024;

const _: () = assert!(LOCAL_MSS_BYTES + 40 + ETHERNET_HEADER_BYTES == MAX_FRAME_BYTES);
const _: () = assert!(ARP_REFRESH_MARGIN.total_micros() < ARP_ENTRY_LIFETIME.total_micros());
const _: () = assert!(ARP_RETRY_INTERVAL.total_micros() < ARP_REFRESH_MARGIN.total_micros());
const _: () = assert!(SYN_RETRANSMISSIONS_MAX <= RETRANSMISSIONS_MAX);
const _: () = assert!(RTO_MIN.total_micros() <= RTO_INITIAL.total_micros());
const _: () = assert!(RTO_INITIAL.total_micros() <= RTO_MAX.total_micros());
const _: () = assert!(RX_BUFFER_DEFAULT_BYTES <= BUFFER_MAX_BYTES);
const _: () = assert!(TX_BUFFER_DEFAULT_BYTES >= LOCAL_MSS_BYTES);
const _: () = assert!(MIN_REMOTE_MSS_BYTES <= DEFAULT_REMOTE_MSS_BYTES);
