//! The interface: one Ethernet port's worth of ARP, IPv4, ICMP echo and TCP sockets.
//!
//! It owns our MAC/IP/netmask/gateway, an ARP cache with expiry, a bounded queue of
//! outgoing frames (ARP and ICMP replies, RSTs, packets waiting for address resolution),
//! and a fixed table of socket slots addressed by generation-checked handles.
//!
//! The worker drives it with three calls: [`Interface::receive`] for each received
//! frame, [`Interface::poll_transmit`] until it returns `None` to collect frames to send,
//! and [`Interface::poll_at`] to learn when to come back if nothing arrives. All take
//! `now`; none does I/O. Memory is allocated when the interface is created and when a
//! connection is opened (its two rings); the per-packet path does not allocate.
//!
//! Deliberately missing: IP forwarding, IP options on transmit, fragmentation and
//! reassembly (fragments are counted and dropped), ICMP errors (we send none; received
//! ones are ignored, so no path-MTU discovery), multicast, VLANs, IPv6.

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::Ipv4Addr;

use crate::limits::*;
use crate::schedule::Scheduler;
use crate::socket::{CloseReason, FourTuple, State, TcpConfig, TcpSocket, Verdict};
use crate::time::Instant;
use crate::wire::arp::{self, ArpOperation, ArpRepr};
use crate::wire::ethernet::{self, EtherType, EthernetRepr};
use crate::wire::icmp::{self, IcmpRepr};
use crate::wire::ipv4::{self, Ipv4Repr};
use crate::wire::tcp::{self, SeqNumber, TcpRepr};
use crate::wire::{MacAddr, WireError};

const IP_OFFSET: usize = ETHERNET_HEADER_BYTES;
const TCP_OFFSET: usize = ETHERNET_HEADER_BYTES + ipv4::HEADER_LEN_BYTES;
const EPHEMERAL_PORT_FIRST: u16 = 49152;

/// Addresses and limits of an interface.
#[derive(Debug, Clone, Copy)]
pub struct InterfaceConfig {
    /// Our MAC address (unicast).
    pub mac: MacAddr,
    /// Our IPv4 address.
    pub ip: Ipv4Addr,
    /// Length of the subnet prefix (24 for a /24).
    pub prefix_len: u8,
    /// Next hop for destinations outside the subnet.
    pub gateway: Option<Ipv4Addr>,
    /// Socket slots (listeners and connections).
    pub max_sockets: usize,
    /// Settings of every TCP connection.
    pub tcp: TcpConfig,
    /// Secret mixed into initial sequence numbers (RFC 6528); pick it at random at start.
    pub iss_secret: u64,
}

impl InterfaceConfig {
    /// A config with default limits for the given addresses.
    pub fn new(mac: MacAddr, ip: Ipv4Addr, prefix_len: u8) -> InterfaceConfig {
        InterfaceConfig {
            mac,
            ip,
            prefix_len,
            gateway: None,
            max_sockets: SOCKETS_DEFAULT_MAX,
            tcp: TcpConfig::default(),
            iss_secret: 0,
        }
    }
}

/// Handle of a listener or connection. Stale handles (slot reused) are rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SocketHandle {
    index: u32,
    generation: u32,
}

/// Misuse of the socket API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketError {
    /// The handle does not name a live socket of the right kind.
    InvalidHandle,
    /// Every socket slot is in use.
    Exhausted,
    /// The port already has a listener, or no ephemeral port is free.
    AddrInUse,
    /// No route to the destination (outside the subnet and no gateway).
    NoRoute,
}

impl core::fmt::Display for SocketError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let text = match self {
            SocketError::InvalidHandle => "invalid socket handle",
            SocketError::Exhausted => "no free socket slot",
            SocketError::AddrInUse => "address in use",
            SocketError::NoRoute => "no route to host",
        };
        f.write_str(text)
    }
}

impl std::error::Error for SocketError {}

/// Counters of everything the interface dropped, sent or saw.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Frames handed to `receive`.
    pub rx_frames: u64,
    /// Frames addressed to another MAC or IP.
    pub rx_not_for_us: u64,
    /// Frames dropped as truncated or malformed at any layer.
    pub rx_malformed: u64,
    /// IPv4, ICMP or TCP checksum failures.
    pub rx_checksum_errors: u64,
    /// IPv4 fragments dropped (no reassembly).
    pub ipv4_fragments_dropped: u64,
    /// Frames of protocols we do not handle.
    pub rx_unsupported: u64,
    /// Frames returned by `poll_transmit`.
    pub tx_frames: u64,
    /// Outgoing packets dropped because the pending-frame queue was full.
    pub tx_queue_full_drops: u64,
    /// Outgoing packets dropped for lack of a route.
    pub tx_no_route: u64,
    /// Packets dropped because ARP never resolved their next hop.
    pub arp_failed_drops: u64,
    /// ARP requests sent.
    pub arp_requests_sent: u64,
    /// ARP replies sent.
    pub arp_replies_sent: u64,
    /// ICMP echo replies sent.
    pub icmp_echo_replies_sent: u64,
    /// RSTs sent in answer to segments (not counting aborts).
    pub tcp_resets_sent: u64,
    /// SYNs dropped because a listener's backlog or the socket table was full.
    pub tcp_syn_dropped: u64,
    /// Connections that reached ESTABLISHED.
    pub tcp_established: u64,
    /// Established connections that ended, for any reason.
    pub tcp_closed: u64,
    /// … of which reset by the peer.
    pub tcp_reset_by_peer: u64,
    /// … of which timed out (retransmission or keepalive).
    pub tcp_timed_out: u64,
    /// Retransmitted segments (timeouts and fast retransmits).
    pub tcp_retransmits: u64,
    /// Retransmission timer expirations with data or SYN/FIN outstanding.
    pub tcp_rto_expirations: u64,
    /// Fast retransmits triggered by duplicate ACKs.
    pub tcp_fast_retransmits: u64,
    /// Out-of-order segments dropped because reassembly was full.
    pub tcp_reassembly_drops: u64,
    /// Challenge ACKs sent (RFC 5961).
    pub tcp_challenge_acks: u64,
    /// Payload bytes copied from send rings into frames (retransmissions included).
    pub tcp_tx_payload_bytes: u64,
}

#[derive(Debug, Clone, Copy)]
enum ArpState {
    Resolved {
        mac: MacAddr,
        expires_at: Instant,
        /// When to send a refresh request, once the entry is in use near its expiry.
        refresh_at: Option<Instant>,
    },
    Resolving {
        next_request_at: Instant,
        requests_sent: u32,
    },
}

#[derive(Debug, Clone, Copy)]
struct ArpEntry {
    ip: Ipv4Addr,
    state: ArpState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FrameState {
    Free,
    Ready,
    AwaitingArp(Ipv4Addr),
}

#[derive(Debug)]
struct PendingFrame {
    bytes: Box<[u8]>,
    len: usize,
    state: FrameState,
}

#[derive(Debug)]
struct Listener {
    port: u16,
    backlog: usize,
    half_open: usize,
    accept_queue: VecDeque<SocketHandle>,
}

#[derive(Debug)]
struct Connection {
    socket: Box<TcpSocket>,
    listener: Option<SocketHandle>,
    half_open: bool,
    owned_by_app: bool,
    released: bool,
    counted_established: bool,
    /// What the application last had a chance to see: state, readable and queued bytes.
    seen: (State, usize, usize),
}

/// What prompted bookkeeping on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// A segment arrived.
    Network,
    /// `poll_transmit` fired its timers and asked it for a segment.
    Transmit { emitted: bool },
    /// The application called the socket API.
    App,
}

#[derive(Debug)]
enum Entry {
    Free,
    Listener(Listener),
    Tcp(Connection),
}

#[derive(Debug)]
struct Slot {
    generation: u32,
    entry: Entry,
}

/// A sans-IO network interface. See the module documentation.
#[derive(Debug)]
pub struct Interface {
    config: InterfaceConfig,
    arp_cache: Vec<Option<ArpEntry>>,
    pending: Vec<PendingFrame>,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    by_tuple: HashMap<FourTuple, u32>,
    listeners: HashMap<u16, u32>,
    scheduler: Scheduler,
    app_events: VecDeque<SocketHandle>,
    app_event_queued: Vec<bool>,
    next_ephemeral_port: u16,
    stats: Stats,
    /// True only inside `receive_direct`.
    direct_allowed: bool,
    /// What the segment processed in `receive_direct` delivered: socket, address, length.
    direct_out: Option<(SocketHandle, usize, usize)>,
}

fn synchronized(state: State) -> bool {
    !matches!(state, State::Closed | State::SynSent | State::SynReceived)
}

impl Interface {
    /// Creates an interface, allocating its tables up front.
    pub fn new(config: InterfaceConfig) -> Interface {
        assert!(config.mac.is_unicast(), "interface MAC must be unicast");
        assert!(config.prefix_len <= 32, "prefix length above 32");
        assert!(
            config.max_sockets > 0 && config.max_sockets <= u32::MAX as usize,
            "bad max_sockets"
        );
        let pending = (0..PENDING_FRAMES_MAX)
            .map(|_| PendingFrame {
                bytes: vec![0; MAX_FRAME_BYTES].into_boxed_slice(),
                len: 0,
                state: FrameState::Free,
            })
            .collect();
        let slots = (0..config.max_sockets)
            .map(|_| Slot {
                generation: 0,
                entry: Entry::Free,
            })
            .collect();
        Interface {
            config,
            arp_cache: vec![None; ARP_CACHE_ENTRIES],
            pending,
            slots,
            free_slots: (0..config.max_sockets as u32).rev().collect(),
            by_tuple: HashMap::with_capacity(config.max_sockets),
            listeners: HashMap::with_capacity(config.max_sockets),
            scheduler: Scheduler::new(config.max_sockets),
            app_events: VecDeque::with_capacity(config.max_sockets),
            app_event_queued: vec![false; config.max_sockets],
            next_ephemeral_port: EPHEMERAL_PORT_FIRST,
            stats: Stats::default(),
            direct_allowed: false,
            direct_out: None,
        }
    }

    /// Our configuration.
    pub fn config(&self) -> &InterfaceConfig {
        &self.config
    }

    /// Counters so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Number of socket slots in use (listeners and connections, TIME-WAIT included).
    pub fn sockets_in_use(&self) -> usize {
        self.slots.len() - self.free_slots.len()
    }

    fn in_subnet(&self, addr: Ipv4Addr) -> bool {
        let mask = u32::MAX
            .checked_shl(32 - u32::from(self.config.prefix_len))
            .unwrap_or(0);
        u32::from(addr) & mask == u32::from(self.config.ip) & mask
    }

    fn route(&self, dst: Ipv4Addr) -> Option<Ipv4Addr> {
        if self.in_subnet(dst) {
            Some(dst)
        } else {
            self.config.gateway
        }
    }
}

// ARP cache.
impl Interface {
    fn arp_lookup(&self, ip: Ipv4Addr, now: Instant) -> Option<MacAddr> {
        self.arp_cache
            .iter()
            .flatten()
            .find(|entry| entry.ip == ip)
            .and_then(|entry| match entry.state {
                ArpState::Resolved {
                    mac, expires_at, ..
                } if now < expires_at => Some(mac),
                _ => None,
            })
    }

    fn arp_find(&self, ip: Ipv4Addr) -> Option<usize> {
        self.arp_cache
            .iter()
            .position(|entry| entry.is_some_and(|entry| entry.ip == ip))
    }

    /// A slot for a new entry: a free one, else an expired one, else the resolved entry
    /// closest to expiry. Entries still resolving are never evicted.
    fn arp_victim(&self, now: Instant) -> Option<usize> {
        if let Some(free) = self.arp_cache.iter().position(Option::is_none) {
            return Some(free);
        }
        self.arp_cache
            .iter()
            .enumerate()
            .filter_map(|(index, entry)| match entry.map(|entry| entry.state) {
                Some(ArpState::Resolved { expires_at, .. }) => Some((expires_at.max(now), index)),
                _ => None,
            })
            .min()
            .map(|(_, index)| index)
    }

    fn arp_store(&mut self, ip: Ipv4Addr, mac: MacAddr, now: Instant, create: bool) {
        let index = match self.arp_find(ip) {
            Some(index) => index,
            None if create => match self.arp_victim(now) {
                Some(index) => index,
                None => return,
            },
            None => return,
        };
        let state = ArpState::Resolved {
            mac,
            expires_at: now + ARP_ENTRY_LIFETIME,
            refresh_at: None,
        };
        self.arp_cache[index] = Some(ArpEntry { ip, state });
    }

    /// Starts resolving `ip` unless it is resolved or already resolving. Returns false if
    /// the cache has no room (every entry is resolving).
    fn arp_start_resolving(&mut self, ip: Ipv4Addr, now: Instant) -> bool {
        if let Some(index) = self.arp_find(ip) {
            let resolving = matches!(
                self.arp_cache[index].map(|e| e.state),
                Some(ArpState::Resolving { .. })
            );
            if resolving || self.arp_lookup(ip, now).is_some() {
                return true;
            }
            self.arp_cache[index] = None;
        }
        let Some(index) = self.arp_victim(now) else {
            return false;
        };
        let state = ArpState::Resolving {
            next_request_at: now,
            requests_sent: 0,
        };
        self.arp_cache[index] = Some(ArpEntry { ip, state });
        true
    }

    fn receive_arp(&mut self, now: Instant, payload: &[u8]) {
        let repr =
            match arp::Packet::new_checked(payload).and_then(|packet| ArpRepr::parse(&packet)) {
                Ok(repr) => repr,
                Err(WireError::Unsupported) => return self.stats.rx_unsupported += 1,
                Err(_) => return self.stats.rx_malformed += 1,
            };
        if !repr.source_mac.is_unicast() || repr.source_ip.is_unspecified() {
            return;
        }
        let for_us = repr.target_ip == self.config.ip;
        // RFC 826 "merge": update an existing entry; create one only if the packet is for us.
        self.arp_store(repr.source_ip, repr.source_mac, now, for_us);
        if for_us && repr.operation == ArpOperation::Request {
            let reply = ArpRepr {
                operation: ArpOperation::Reply,
                source_mac: self.config.mac,
                source_ip: self.config.ip,
                target_mac: repr.source_mac,
                target_ip: repr.source_ip,
            };
            if self.queue_arp(reply, repr.source_mac) {
                self.stats.arp_replies_sent += 1;
            }
        }
    }

    fn queue_arp(&mut self, repr: ArpRepr, dst_mac: MacAddr) -> bool {
        let Some(slot) = self
            .pending
            .iter_mut()
            .find(|frame| frame.state == FrameState::Free)
        else {
            self.stats.tx_queue_full_drops += 1;
            return false;
        };
        let eth = EthernetRepr {
            src_addr: self.config.mac,
            dst_addr: dst_mac,
            ethertype: EtherType::Arp,
        };
        eth.emit(&mut slot.bytes);
        repr.emit(&mut slot.bytes[ETHERNET_HEADER_BYTES..]);
        slot.len = ETHERNET_HEADER_BYTES + arp::PACKET_LEN_BYTES;
        slot.state = FrameState::Ready;
        true
    }

    /// Writes an ARP request that is due into `buffer`, or gives up on an address that
    /// did not answer `ARP_REQUESTS_MAX` requests (dropping its queued packets).
    fn emit_due_arp_request(&mut self, now: Instant, buffer: &mut [u8]) -> Option<usize> {
        for index in 0..self.arp_cache.len() {
            let Some(ArpEntry { ip, state }) = self.arp_cache[index] else {
                continue;
            };
            match state {
                ArpState::Resolving {
                    next_request_at,
                    requests_sent,
                } if now >= next_request_at => {
                    if requests_sent >= ARP_REQUESTS_MAX {
                        self.arp_give_up(index, ip);
                        continue;
                    }
                    let state = ArpState::Resolving {
                        next_request_at: now + ARP_RETRY_INTERVAL,
                        requests_sent: requests_sent + 1,
                    };
                    self.arp_cache[index] = Some(ArpEntry { ip, state });
                    return Some(self.emit_arp_request(ip, MacAddr::BROADCAST, buffer));
                }
                ArpState::Resolved {
                    mac,
                    expires_at,
                    refresh_at: Some(refresh_at),
                } if now >= refresh_at && now < expires_at => {
                    let state = ArpState::Resolved {
                        mac,
                        expires_at,
                        refresh_at: Some(now + ARP_RETRY_INTERVAL),
                    };
                    self.arp_cache[index] = Some(ArpEntry { ip, state });
                    return Some(self.emit_arp_request(ip, mac, buffer));
                }
                _ => {}
            }
        }
        None
    }

    fn arp_give_up(&mut self, index: usize, ip: Ipv4Addr) {
        self.arp_cache[index] = None;
        for frame in self
            .pending
            .iter_mut()
            .filter(|frame| frame.state == FrameState::AwaitingArp(ip))
        {
            frame.state = FrameState::Free;
            self.stats.arp_failed_drops += 1;
        }
    }

    fn emit_arp_request(&mut self, ip: Ipv4Addr, dst_mac: MacAddr, buffer: &mut [u8]) -> usize {
        let eth = EthernetRepr {
            src_addr: self.config.mac,
            dst_addr: dst_mac,
            ethertype: EtherType::Arp,
        };
        eth.emit(buffer);
        let request = ArpRepr {
            operation: ArpOperation::Request,
            source_mac: self.config.mac,
            source_ip: self.config.ip,
            target_mac: MacAddr([0; 6]),
            target_ip: ip,
        };
        request.emit(&mut buffer[ETHERNET_HEADER_BYTES..]);
        self.stats.arp_requests_sent += 1;
        ETHERNET_HEADER_BYTES + arp::PACKET_LEN_BYTES
    }

    /// Notes that `ip` was just used as a next hop: near expiry, schedule a refresh.
    fn arp_note_use(&mut self, ip: Ipv4Addr, now: Instant) {
        let Some(index) = self.arp_find(ip) else {
            return;
        };
        if let Some(ArpEntry {
            state:
                ArpState::Resolved {
                    expires_at,
                    refresh_at: refresh_at @ None,
                    ..
                },
            ..
        }) = &mut self.arp_cache[index]
        {
            if now < *expires_at && expires_at.saturating_since(now) <= ARP_REFRESH_MARGIN {
                *refresh_at = Some(now);
            }
        }
    }
}

// Receiving.
impl Interface {
    /// Processes one received Ethernet frame (without FCS). Never panics on any input.
    pub fn receive(&mut self, now: Instant, frame: &[u8]) {
        self.stats.rx_frames += 1;
        let Ok(frame) = ethernet::Frame::new_checked(frame) else {
            return self.stats.rx_malformed += 1;
        };
        let Ok(eth) = EthernetRepr::parse(&frame) else {
            return self.stats.rx_malformed += 1;
        };
        if eth.dst_addr != self.config.mac && eth.dst_addr != MacAddr::BROADCAST {
            return self.stats.rx_not_for_us += 1;
        }
        match eth.ethertype {
            EtherType::Arp => self.receive_arp(now, frame.payload()),
            EtherType::Ipv4 => self.receive_ipv4(now, frame.payload()),
            EtherType::Unknown(_) => self.stats.rx_unsupported += 1,
        }
    }

    /// `receive`, with direct delivery for sockets that asked for it
    /// ([`Interface::set_direct_receive`]): when the frame carries in-order payload for
    /// such a socket and the socket has nothing buffered (no unread bytes, nothing out of
    /// order), that payload is not copied into the receive ring. It is returned instead,
    /// as the socket and the byte range of `frame` it occupies, and counts as already
    /// read: the caller must consume it now (it is acknowledged, and the window is not
    /// reduced). Everything else (the rest of a segment beyond the window, other
    /// segments, FIN, state changes) happens exactly as in `receive`.
    pub fn receive_direct(
        &mut self,
        now: Instant,
        frame: &[u8],
    ) -> Option<(SocketHandle, core::ops::Range<usize>)> {
        self.direct_allowed = true;
        self.direct_out = None;
        self.receive(now, frame);
        self.direct_allowed = false;
        let (handle, addr, len) = self.direct_out.take()?;
        let start = addr.checked_sub(frame.as_ptr() as usize)?;
        debug_assert!(start + len <= frame.len());
        (start + len <= frame.len()).then_some((handle, start..start + len))
    }

    /// Turns direct delivery on or off for a connection (see
    /// [`Interface::receive_direct`]); off by default. Bytes already in the receive ring
    /// stay there for `recv`, and later segments are delivered directly only once the
    /// ring is empty, so the byte order the application sees is the stream's.
    pub fn set_direct_receive(
        &mut self,
        handle: SocketHandle,
        on: bool,
    ) -> Result<(), SocketError> {
        self.connection_mut(handle)?.socket.set_direct_receive(on);
        Ok(())
    }

    fn count_wire_error(&mut self, error: WireError) {
        match error {
            WireError::Truncated | WireError::Malformed => self.stats.rx_malformed += 1,
            WireError::Checksum => self.stats.rx_checksum_errors += 1,
            WireError::Unsupported => self.stats.rx_unsupported += 1,
            WireError::Fragment => self.stats.ipv4_fragments_dropped += 1,
        }
    }

    fn receive_ipv4(&mut self, now: Instant, payload: &[u8]) {
        let packet = match ipv4::Packet::new_checked(payload) {
            Ok(packet) => packet,
            Err(error) => return self.count_wire_error(error),
        };
        let ip = match Ipv4Repr::parse(&packet) {
            Ok(ip) => ip,
            Err(error) => return self.count_wire_error(error),
        };
        if ip.dst_addr != self.config.ip {
            return self.stats.rx_not_for_us += 1;
        }
        match ip.protocol {
            ipv4::PROTOCOL_ICMP => self.receive_icmp(now, &ip, packet.payload()),
            ipv4::PROTOCOL_TCP => self.receive_tcp(now, &ip, packet.payload()),
            _ => self.stats.rx_unsupported += 1,
        }
    }

    fn receive_icmp(&mut self, now: Instant, ip: &Ipv4Repr, payload: &[u8]) {
        let repr =
            match icmp::Packet::new_checked(payload).and_then(|packet| IcmpRepr::parse(&packet)) {
                Ok(repr) => repr,
                Err(error) => return self.count_wire_error(error),
            };
        if let IcmpRepr::EchoRequest {
            ident,
            seq_no,
            data,
        } = repr
        {
            let reply = IcmpRepr::EchoReply {
                ident,
                seq_no,
                data,
            };
            let len = reply.buffer_len();
            if len > MTU_BYTES - ipv4::HEADER_LEN_BYTES {
                return self.stats.rx_unsupported += 1;
            }
            if self.queue_ip(now, ip.src_addr, ipv4::PROTOCOL_ICMP, len, |buffer| {
                reply.emit(buffer)
            }) {
                self.stats.icmp_echo_replies_sent += 1;
            }
        }
    }

    fn receive_tcp(&mut self, now: Instant, ip: &Ipv4Repr, payload: &[u8]) {
        let repr = match tcp::Packet::new_checked(payload)
            .and_then(|p| TcpRepr::parse(&p, ip.src_addr, ip.dst_addr))
        {
            Ok(repr) => repr,
            Err(error) => return self.count_wire_error(error),
        };
        let tuple = FourTuple {
            local_addr: ip.dst_addr,
            local_port: repr.dst_port,
            remote_addr: ip.src_addr,
            remote_port: repr.src_port,
        };
        if let Some(&index) = self.by_tuple.get(&tuple) {
            let allowed = self.direct_allowed;
            let generation = self.slots[index as usize].generation;
            let verdict = match &mut self.slots[index as usize].entry {
                Entry::Tcp(connection) => {
                    connection.socket.allow_direct(allowed);
                    let verdict = connection.socket.process(now, &repr);
                    connection.socket.allow_direct(false);
                    if let Some((addr, len)) = connection.socket.take_direct() {
                        let handle = SocketHandle { index, generation };
                        self.direct_out = Some((handle, addr, len));
                    }
                    verdict
                }
                _ => unreachable!("tuple map points at a non-connection slot"),
            };
            self.after_socket_event(index as usize, Cause::Network);
            if verdict == Verdict::SendReset {
                self.queue_reset(now, &tuple, &repr);
            }
            return;
        }
        if let Some(&listener) = self.listeners.get(&repr.dst_port) {
            if repr.rst {
                return;
            }
            if repr.ack_number.is_some() {
                return self.queue_reset(now, &tuple, &repr);
            }
            if repr.syn {
                self.accept_syn(now, listener, tuple, &repr);
            }
            return;
        }
        if !repr.rst {
            self.queue_reset(now, &tuple, &repr);
        }
    }

    /// Answers `repr` with a RST per RFC 9293 §3.10.7.1.
    fn queue_reset(&mut self, now: Instant, tuple: &FourTuple, repr: &TcpRepr) {
        let mut reset = match repr.ack_number {
            Some(ack) => TcpRepr::new(tuple.local_port, tuple.remote_port, ack),
            None => {
                let mut reset = TcpRepr::new(tuple.local_port, tuple.remote_port, SeqNumber(0));
                reset.ack_number = Some(repr.seq_number + repr.segment_len());
                reset
            }
        };
        reset.rst = true;
        let (src, dst) = (tuple.local_addr, tuple.remote_addr);
        let len = reset.buffer_len();
        if self.queue_ip(now, dst, ipv4::PROTOCOL_TCP, len, |buffer| {
            reset.emit(buffer, src, dst)
        }) {
            self.stats.tcp_resets_sent += 1;
        }
    }

    /// Builds an IPv4 packet into a free pending frame; `fill` writes the payload.
    fn queue_ip<F: FnOnce(&mut [u8])>(
        &mut self,
        now: Instant,
        dst: Ipv4Addr,
        protocol: u8,
        len: usize,
        fill: F,
    ) -> bool {
        let Some(next_hop) = self.route(dst) else {
            self.stats.tx_no_route += 1;
            return false;
        };
        let mac = self.arp_lookup(next_hop, now);
        if mac.is_some() {
            self.arp_note_use(next_hop, now);
        }
        if mac.is_none() && !self.arp_start_resolving(next_hop, now) {
            self.stats.tx_queue_full_drops += 1;
            return false;
        }
        let Some(slot) = self
            .pending
            .iter_mut()
            .find(|frame| frame.state == FrameState::Free)
        else {
            self.stats.tx_queue_full_drops += 1;
            return false;
        };
        let ip = Ipv4Repr {
            src_addr: self.config.ip,
            dst_addr: dst,
            protocol,
            payload_len: len,
            ttl: ipv4::DEFAULT_TTL,
        };
        ip.emit(&mut slot.bytes[IP_OFFSET..]);
        fill(&mut slot.bytes[TCP_OFFSET..TCP_OFFSET + len]);
        let eth = EthernetRepr {
            src_addr: self.config.mac,
            dst_addr: mac.unwrap_or(MacAddr([0; 6])),
            ethertype: EtherType::Ipv4,
        };
        eth.emit(&mut slot.bytes);
        slot.len = TCP_OFFSET + len;
        slot.state = if mac.is_some() {
            FrameState::Ready
        } else {
            FrameState::AwaitingArp(next_hop)
        };
        true
    }
}

// Transmitting.
impl Interface {
    /// Writes the next frame to send into `buffer` (at least `MAX_FRAME_BYTES` long) and
    /// returns its length; `None` when nothing is due. Call until it returns `None`.
    pub fn poll_transmit(&mut self, now: Instant, buffer: &mut [u8]) -> Option<usize> {
        assert!(
            buffer.len() >= MAX_FRAME_BYTES,
            "transmit buffer shorter than MAX_FRAME_BYTES"
        );
        let len = self
            .transmit_pending(now, buffer)
            .or_else(|| self.emit_due_arp_request(now, buffer))
            .or_else(|| self.transmit_sockets(now, buffer));
        let len = len?;
        self.stats.tx_frames += 1;
        // IEEE 802.3 minimum frame (without FCS): pad with zeros; not every PMD pads
        // short frames itself, and receivers ignore the padding (lengths come from
        // the IPv4 header and the fixed ARP size).
        if len < MIN_FRAME_BYTES {
            buffer[len..MIN_FRAME_BYTES].fill(0);
            return Some(MIN_FRAME_BYTES);
        }
        Some(len)
    }

    fn transmit_pending(&mut self, now: Instant, buffer: &mut [u8]) -> Option<usize> {
        for index in 0..self.pending.len() {
            let mac = match self.pending[index].state {
                FrameState::Free => continue,
                FrameState::Ready => None,
                FrameState::AwaitingArp(next_hop) => match self.arp_lookup(next_hop, now) {
                    Some(mac) => Some(mac),
                    None => continue,
                },
            };
            let frame = &mut self.pending[index];
            if let Some(mac) = mac {
                frame.bytes[0..6].copy_from_slice(&mac.0);
            }
            buffer[..frame.len].copy_from_slice(&frame.bytes[..frame.len]);
            frame.state = FrameState::Free;
            return Some(frame.len);
        }
        None
    }

    fn transmit_sockets(&mut self, now: Instant, buffer: &mut [u8]) -> Option<usize> {
        // Each slot leaves the ready queue once per call unless it emitted a frame, so
        // this loop ends even if a socket claims readiness it cannot act on.
        while let Some(index) = self.scheduler.next_ready(now) {
            let index = index as usize;
            let Entry::Tcp(connection) = &self.slots[index].entry else {
                continue;
            };
            let remote = connection.socket.tuple().remote_addr;
            let next_hop = self.route(remote);
            let mac = next_hop.and_then(|hop| self.arp_lookup(hop, now));
            let Entry::Tcp(connection) = &mut self.slots[index].entry else {
                continue;
            };
            connection.socket.handle_timers(now);
            let segment = connection.socket.dispatch(now, &mut buffer[TCP_OFFSET..]);
            self.after_socket_event(
                index,
                Cause::Transmit {
                    emitted: segment.is_some(),
                },
            );
            let Some(segment_len) = segment else { continue };
            let Some(next_hop) = next_hop else {
                self.stats.tx_no_route += 1;
                continue;
            };
            let ip = Ipv4Repr {
                src_addr: self.config.ip,
                dst_addr: remote,
                protocol: ipv4::PROTOCOL_TCP,
                payload_len: segment_len,
                ttl: ipv4::DEFAULT_TTL,
            };
            ip.emit(&mut buffer[IP_OFFSET..]);
            let eth = EthernetRepr {
                src_addr: self.config.mac,
                dst_addr: mac.unwrap_or(MacAddr([0; 6])),
                ethertype: EtherType::Ipv4,
            };
            eth.emit(buffer);
            if mac.is_some() {
                self.arp_note_use(next_hop, now);
                return Some(TCP_OFFSET + segment_len);
            }
            self.hold_for_arp(now, next_hop, &buffer[..TCP_OFFSET + segment_len]);
            if let Some(len) = self.emit_due_arp_request(now, buffer) {
                return Some(len);
            }
        }
        None
    }

    /// Parks a socket's frame until its next hop resolves (dropped if the queue is full:
    /// TCP retransmits it).
    fn hold_for_arp(&mut self, now: Instant, next_hop: Ipv4Addr, frame: &[u8]) {
        if !self.arp_start_resolving(next_hop, now) {
            self.stats.tx_queue_full_drops += 1;
            return;
        }
        let Some(slot) = self
            .pending
            .iter_mut()
            .find(|frame| frame.state == FrameState::Free)
        else {
            self.stats.tx_queue_full_drops += 1;
            return;
        };
        slot.bytes[..frame.len()].copy_from_slice(frame);
        slot.len = frame.len();
        slot.state = FrameState::AwaitingArp(next_hop);
    }

    /// The earliest time the interface needs `poll_transmit` again if no frame arrives;
    /// a value `<= now` means "now". `None` means "only when a frame arrives".
    pub fn poll_at(&self, now: Instant) -> Option<Instant> {
        let pending = self.pending.iter().any(|frame| match frame.state {
            FrameState::Free => false,
            FrameState::Ready => true,
            FrameState::AwaitingArp(next_hop) => self.arp_lookup(next_hop, now).is_some(),
        });
        if pending {
            return Some(now);
        }
        let arp = self
            .arp_cache
            .iter()
            .flatten()
            .filter_map(|entry| match entry.state {
                ArpState::Resolving {
                    next_request_at, ..
                } => Some(next_request_at),
                ArpState::Resolved {
                    expires_at,
                    refresh_at,
                    ..
                } => refresh_at.filter(|_| now < expires_at),
            });
        arp.chain(self.scheduler.next_wake(now)).min()
    }
}

// Sockets.
impl Interface {
    fn allocate_slot(&mut self, entry: Entry) -> Result<SocketHandle, SocketError> {
        let index = self.free_slots.pop().ok_or(SocketError::Exhausted)?;
        let slot = &mut self.slots[index as usize];
        debug_assert!(matches!(slot.entry, Entry::Free));
        slot.entry = entry;
        Ok(SocketHandle {
            index,
            generation: slot.generation,
        })
    }

    fn free_slot(&mut self, index: usize) {
        let slot = &mut self.slots[index];
        if let Entry::Tcp(connection) = &slot.entry {
            self.by_tuple.remove(&connection.socket.tuple());
        }
        slot.entry = Entry::Free;
        slot.generation = slot.generation.wrapping_add(1);
        self.scheduler.forget(index as u32);
        self.free_slots.push(index as u32);
    }

    fn slot_index(&self, handle: SocketHandle) -> Result<usize, SocketError> {
        let slot = self
            .slots
            .get(handle.index as usize)
            .ok_or(SocketError::InvalidHandle)?;
        if slot.generation != handle.generation || matches!(slot.entry, Entry::Free) {
            return Err(SocketError::InvalidHandle);
        }
        Ok(handle.index as usize)
    }

    fn connection(&self, handle: SocketHandle) -> Result<&Connection, SocketError> {
        match &self.slots[self.slot_index(handle)?].entry {
            Entry::Tcp(connection) if connection.owned_by_app => Ok(connection),
            _ => Err(SocketError::InvalidHandle),
        }
    }

    fn connection_mut(&mut self, handle: SocketHandle) -> Result<&mut Connection, SocketError> {
        let index = self.slot_index(handle)?;
        match &mut self.slots[index].entry {
            Entry::Tcp(connection) if connection.owned_by_app => Ok(connection),
            _ => Err(SocketError::InvalidHandle),
        }
    }

    fn listener_mut(&mut self, handle: SocketHandle) -> Result<&mut Listener, SocketError> {
        let index = self.slot_index(handle)?;
        match &mut self.slots[index].entry {
            Entry::Listener(listener) => Ok(listener),
            _ => Err(SocketError::InvalidHandle),
        }
    }

    fn iss(&self, tuple: &FourTuple, now: Instant) -> SeqNumber {
        // RFC 6528: a keyed hash of the connection plus a 4 µs clock. DefaultHasher with
        // no random keys is deterministic, which the simulation relies on; the secret
        // supplies the unpredictability.
        let mut hasher = DefaultHasher::new();
        self.config.iss_secret.hash(&mut hasher);
        tuple.hash(&mut hasher);
        let clock = (now.total_micros() / 4) as u32;
        SeqNumber((hasher.finish() as u32).wrapping_add(clock))
    }

    /// Listens on `port` with room for `backlog` connections that are half-open or
    /// established but not yet accepted. Further SYNs are dropped (the client retries).
    pub fn listen(&mut self, port: u16, backlog: usize) -> Result<SocketHandle, SocketError> {
        assert!(backlog > 0, "listen backlog must be positive");
        if port == 0 || self.listeners.contains_key(&port) {
            return Err(SocketError::AddrInUse);
        }
        let listener = Listener {
            port,
            backlog,
            half_open: 0,
            accept_queue: VecDeque::with_capacity(backlog),
        };
        let handle = self.allocate_slot(Entry::Listener(listener))?;
        self.listeners.insert(port, handle.index);
        Ok(handle)
    }

    /// Stops listening. Connections not yet accepted are aborted.
    pub fn unlisten(&mut self, listener: SocketHandle) -> Result<(), SocketError> {
        let index = self.slot_index(listener)?;
        let Entry::Listener(state) = &mut self.slots[index].entry else {
            return Err(SocketError::InvalidHandle);
        };
        let port = state.port;
        self.listeners.remove(&port);
        self.free_slot(index);
        for other in 0..self.slots.len() {
            if let Entry::Tcp(connection) = &mut self.slots[other].entry {
                if connection.listener == Some(listener) {
                    connection.listener = None;
                    connection.half_open = false;
                    if !connection.owned_by_app {
                        connection.socket.abort();
                    }
                }
            }
            self.after_socket_event(other, Cause::App);
        }
        Ok(())
    }

    fn accept_syn(&mut self, now: Instant, listener_index: u32, tuple: FourTuple, syn: &TcpRepr) {
        let generation = self.slots[listener_index as usize].generation;
        let listener_handle = SocketHandle {
            index: listener_index,
            generation,
        };
        let room = match &self.slots[listener_index as usize].entry {
            Entry::Listener(listener) => {
                listener.half_open + listener.accept_queue.len() < listener.backlog
            }
            _ => false,
        };
        if !room || self.free_slots.is_empty() {
            self.stats.tcp_syn_dropped += 1;
            return;
        }
        let iss = self.iss(&tuple, now);
        let socket = TcpSocket::accept_syn(self.config.tcp, tuple, iss, syn, now);
        let connection = Connection {
            socket: Box::new(socket),
            listener: Some(listener_handle),
            half_open: true,
            owned_by_app: false,
            released: false,
            counted_established: false,
            seen: (State::Closed, 0, 0),
        };
        let Ok(handle) = self.allocate_slot(Entry::Tcp(connection)) else {
            return;
        };
        self.by_tuple.insert(tuple, handle.index);
        if let Ok(listener) = self.listener_mut(listener_handle) {
            listener.half_open += 1;
        }
        self.after_socket_event(handle.index as usize, Cause::App);
    }

    /// Takes the oldest established connection from a listener's accept queue.
    pub fn accept(&mut self, listener: SocketHandle) -> Result<Option<SocketHandle>, SocketError> {
        let Some(handle) = self.listener_mut(listener)?.accept_queue.pop_front() else {
            return Ok(None);
        };
        let index = self
            .slot_index(handle)
            .expect("accept queue holds live handles");
        if let Entry::Tcp(connection) = &mut self.slots[index].entry {
            connection.owned_by_app = true;
        }
        Ok(Some(handle))
    }

    /// Opens a connection to `remote_addr:remote_port` from an ephemeral port.
    pub fn connect(
        &mut self,
        now: Instant,
        remote_addr: Ipv4Addr,
        remote_port: u16,
    ) -> Result<SocketHandle, SocketError> {
        if self.route(remote_addr).is_none() {
            return Err(SocketError::NoRoute);
        }
        let span = u32::from(u16::MAX - EPHEMERAL_PORT_FIRST) + 1;
        let tuple = (0..span)
            .map(|step| {
                let offset =
                    (u32::from(self.next_ephemeral_port - EPHEMERAL_PORT_FIRST) + step) % span;
                FourTuple {
                    local_addr: self.config.ip,
                    local_port: EPHEMERAL_PORT_FIRST + offset as u16,
                    remote_addr,
                    remote_port,
                }
            })
            .find(|tuple| {
                !self.by_tuple.contains_key(tuple)
                    && !self.listeners.contains_key(&tuple.local_port)
            })
            .ok_or(SocketError::AddrInUse)?;
        self.next_ephemeral_port = if tuple.local_port == u16::MAX {
            EPHEMERAL_PORT_FIRST
        } else {
            tuple.local_port + 1
        };
        let socket = TcpSocket::connect(self.config.tcp, tuple, self.iss(&tuple, now));
        let connection = Connection {
            socket: Box::new(socket),
            listener: None,
            half_open: false,
            owned_by_app: true,
            released: false,
            counted_established: false,
            seen: (State::Closed, 0, 0),
        };
        let handle = self.allocate_slot(Entry::Tcp(connection))?;
        self.by_tuple.insert(tuple, handle.index);
        self.after_socket_event(handle.index as usize, Cause::App);
        Ok(handle)
    }

    /// Read-only view of a connection (state, queues, RTO, ...).
    pub fn socket(&self, handle: SocketHandle) -> Result<&TcpSocket, SocketError> {
        Ok(&self.connection(handle)?.socket)
    }

    /// Connection state.
    pub fn state(&self, handle: SocketHandle) -> Result<State, SocketError> {
        Ok(self.socket(handle)?.state())
    }

    /// Zero-copy read from the receive ring; see [`TcpSocket::recv`].
    pub fn recv<F: FnOnce(&[u8]) -> usize>(
        &mut self,
        handle: SocketHandle,
        reader: F,
    ) -> Result<usize, SocketError> {
        let read = self.connection_mut(handle)?.socket.recv(reader);
        self.after_socket_event(handle.index as usize, Cause::App);
        Ok(read)
    }

    /// Copies up to `out.len()` received bytes (both halves of a wrapped ring).
    pub fn recv_slice(
        &mut self,
        handle: SocketHandle,
        out: &mut [u8],
    ) -> Result<usize, SocketError> {
        let mut total = 0;
        while total < out.len() {
            let count = self.recv(handle, |data| {
                let count = data.len().min(out.len() - total);
                out[total..total + count].copy_from_slice(&data[..count]);
                count
            })?;
            if count == 0 {
                break;
            }
            total += count;
        }
        Ok(total)
    }

    /// Zero-copy write into the send ring; see [`TcpSocket::send`].
    pub fn send<F: FnOnce(&mut [u8]) -> usize>(
        &mut self,
        handle: SocketHandle,
        writer: F,
    ) -> Result<usize, SocketError> {
        let written = self.connection_mut(handle)?.socket.send(writer);
        self.after_socket_event(handle.index as usize, Cause::App);
        Ok(written)
    }

    /// Queues as much of `data` as fits; returns how much did.
    pub fn send_slice(&mut self, handle: SocketHandle, data: &[u8]) -> Result<usize, SocketError> {
        let mut total = 0;
        while total < data.len() {
            let count = self.send(handle, |space| {
                let count = space.len().min(data.len() - total);
                space[..count].copy_from_slice(&data[total..total + count]);
                count
            })?;
            if count == 0 {
                break;
            }
            total += count;
        }
        Ok(total)
    }

    /// Graceful close. The handle stays valid (to drain received data) until the
    /// connection has fully closed; after that it becomes invalid.
    pub fn close(&mut self, handle: SocketHandle) -> Result<(), SocketError> {
        let connection = self.connection_mut(handle)?;
        connection.released = true;
        connection.socket.close();
        self.after_socket_event(handle.index as usize, Cause::App);
        Ok(())
    }

    /// Abortive close: a RST goes out and the handle becomes invalid.
    pub fn abort(&mut self, handle: SocketHandle) -> Result<(), SocketError> {
        let connection = self.connection_mut(handle)?;
        connection.released = true;
        connection.owned_by_app = false;
        connection.socket.abort();
        self.after_socket_event(handle.index as usize, Cause::App);
        Ok(())
    }

    /// Bookkeeping after anything happened to a connection: counters, moving a new
    /// connection to its listener's accept queue, and freeing finished slots.
    fn after_socket_event(&mut self, index: usize, cause: Cause) {
        let Entry::Tcp(connection) = &mut self.slots[index].entry else {
            return;
        };
        let events = connection.socket.take_events();
        self.stats.tcp_retransmits += events.retransmits;
        self.stats.tcp_fast_retransmits += events.fast_retransmits;
        self.stats.tcp_rto_expirations += events.rto_expirations;
        self.stats.tcp_reassembly_drops += events.reassembly_drops;
        self.stats.tcp_challenge_acks += events.challenge_acks;
        self.stats.tcp_tx_payload_bytes += events.tx_payload_bytes;
        let state = connection.socket.state();
        let handle = SocketHandle {
            index: index as u32,
            generation: self.slots[index].generation,
        };
        let Entry::Tcp(connection) = &mut self.slots[index].entry else {
            return;
        };
        let mut leave_half_open = false;
        let mut newly_established = false;
        if connection.half_open && (synchronized(state) || state == State::Closed) {
            connection.half_open = false;
            leave_half_open = true;
        }
        if synchronized(state) && !connection.counted_established {
            connection.counted_established = true;
            newly_established = true;
        }
        let listener = connection.listener;
        let finished = connection.socket.is_finished();
        let counted = connection.counted_established;
        let reason = connection.socket.close_reason();
        let free = finished && (connection.released || !connection.owned_by_app);
        if newly_established {
            self.stats.tcp_established += 1;
        }
        if let Some(listener) = listener.and_then(|listener| self.listener_mut(listener).ok()) {
            if leave_half_open {
                listener.half_open -= 1;
            }
            if newly_established {
                debug_assert!(listener.accept_queue.len() < listener.backlog);
                listener.accept_queue.push_back(handle);
            }
        }
        if let Some(listener) = listener.filter(|_| newly_established) {
            self.queue_app_event(listener);
        }
        if let Some(listener) = listener.and_then(|listener| self.listener_mut(listener).ok()) {
            if free {
                listener.accept_queue.retain(|queued| *queued != handle);
            }
        }
        if finished && counted {
            if let Entry::Tcp(connection) = &mut self.slots[index].entry {
                connection.counted_established = false;
            }
            self.stats.tcp_closed += 1;
            match reason {
                CloseReason::ResetByPeer => self.stats.tcp_reset_by_peer += 1,
                CloseReason::TimedOut => self.stats.tcp_timed_out += 1,
                _ => {}
            }
        }
        if free {
            self.free_slot(index);
        } else {
            self.reschedule(index, cause, handle);
        }
    }

    fn reschedule(&mut self, index: usize, cause: Cause, handle: SocketHandle) {
        let Entry::Tcp(connection) = &mut self.slots[index].entry else {
            return;
        };
        let may_be_ready = !matches!(cause, Cause::Transmit { emitted: false });
        let ready = may_be_ready && connection.socket.wants_dispatch();
        self.scheduler
            .update(index as u32, ready, connection.socket.next_timer());
        let socket = &connection.socket;
        let now_seen = (
            socket.state(),
            socket.recv_queue_bytes(),
            socket.send_queue_bytes(),
        );
        let news = now_seen != connection.seen && connection.owned_by_app;
        connection.seen = now_seen;
        if news && cause != Cause::App {
            self.queue_app_event(handle);
        }
    }

    fn queue_app_event(&mut self, handle: SocketHandle) {
        let queued = &mut self.app_event_queued[handle.index as usize];
        if !*queued {
            *queued = true;
            self.app_events.push_back(handle);
        }
    }

    /// The next socket whose state, readable bytes or send-buffer space changed because
    /// of the network or a timer since the application last acted on it; for a listener,
    /// a connection waiting in its accept queue. Each socket is queued at most once, so
    /// the application should drain what it can (recv until 0, accept until `None`)
    /// when it gets one. Newly accepted connections should be checked once directly.
    pub fn poll_event(&mut self) -> Option<SocketHandle> {
        while let Some(queued) = self.app_events.pop_front() {
            let index = queued.index as usize;
            self.app_event_queued[index] = false;
            // If the slot changed hands since, the news (if any) is its new occupant's.
            let slot = &self.slots[index];
            let live = match &slot.entry {
                Entry::Listener(_) => true,
                Entry::Tcp(connection) => connection.owned_by_app,
                Entry::Free => false,
            };
            if live {
                return Some(SocketHandle {
                    index: queued.index,
                    generation: slot.generation,
                });
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Duration;

    const OUR_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const OUR_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const PEER_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
    const PEER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    fn interface() -> Interface {
        let mut config = InterfaceConfig::new(OUR_MAC, OUR_IP, 24);
        config.max_sockets = 4;
        config.gateway = Some(Ipv4Addr::new(10, 0, 0, 254));
        Interface::new(config)
    }

    fn arp_frame(operation: ArpOperation, target_ip: Ipv4Addr) -> Vec<u8> {
        let mut frame = vec![0u8; 42];
        EthernetRepr {
            src_addr: PEER_MAC,
            dst_addr: MacAddr::BROADCAST,
            ethertype: EtherType::Arp,
        }
        .emit(&mut frame);
        let repr = ArpRepr {
            operation,
            source_mac: PEER_MAC,
            source_ip: PEER_IP,
            target_mac: MacAddr([0; 6]),
            target_ip,
        };
        repr.emit(&mut frame[14..]);
        frame
    }

    fn ip_frame(protocol: u8, payload: &[u8]) -> Vec<u8> {
        let mut frame = vec![0u8; TCP_OFFSET + payload.len()];
        EthernetRepr {
            src_addr: PEER_MAC,
            dst_addr: OUR_MAC,
            ethertype: EtherType::Ipv4,
        }
        .emit(&mut frame);
        let ip = Ipv4Repr {
            src_addr: PEER_IP,
            dst_addr: OUR_IP,
            protocol,
            payload_len: payload.len(),
            ttl: 64,
        };
        ip.emit(&mut frame[IP_OFFSET..]);
        frame[TCP_OFFSET..].copy_from_slice(payload);
        frame
    }

    fn echo_request_frame() -> Vec<u8> {
        let echo = IcmpRepr::EchoRequest {
            ident: 7,
            seq_no: 9,
            data: b"ping",
        };
        let mut payload = vec![0u8; echo.buffer_len()];
        echo.emit(&mut payload);
        ip_frame(ipv4::PROTOCOL_ICMP, &payload)
    }

    fn transmit_all(iface: &mut Interface, now: Instant) -> Vec<Vec<u8>> {
        let mut buffer = vec![0u8; MAX_FRAME_BYTES];
        let mut frames = Vec::new();
        while let Some(len) = iface.poll_transmit(now, &mut buffer) {
            frames.push(buffer[..len].to_vec());
        }
        frames
    }

    fn payload_of(frame: &[u8]) -> &[u8] {
        let ip = ipv4::Packet::new_checked(&frame[IP_OFFSET..]).unwrap();
        &frame[TCP_OFFSET..IP_OFFSET + ip.total_len()]
    }

    // Proves an ARP request for our address is answered with our MAC, and one for
    // another address is not.
    #[test]
    fn answers_arp_for_our_address_only() {
        let mut iface = interface();
        let now = Instant::from_millis(1);
        iface.receive(
            now,
            &arp_frame(ArpOperation::Request, Ipv4Addr::new(10, 0, 0, 3)),
        );
        assert!(transmit_all(&mut iface, now).is_empty());
        iface.receive(now, &arp_frame(ArpOperation::Request, OUR_IP));
        let frames = transmit_all(&mut iface, now);
        assert_eq!(frames.len(), 1);
        assert_eq!(
            frames[0].len(),
            MIN_FRAME_BYTES,
            "padded to the Ethernet minimum"
        );
        assert!(frames[0][42..].iter().all(|&b| b == 0));
        let eth =
            EthernetRepr::parse(&ethernet::Frame::new_checked(&frames[0][..]).unwrap()).unwrap();
        assert_eq!(eth.dst_addr, PEER_MAC);
        let reply = ArpRepr::parse(&arp::Packet::new_checked(&frames[0][14..]).unwrap()).unwrap();
        assert_eq!(reply.operation, ArpOperation::Reply);
        assert_eq!(
            (reply.source_mac, reply.source_ip, reply.target_ip),
            (OUR_MAC, OUR_IP, PEER_IP)
        );
        assert_eq!(iface.stats().arp_replies_sent, 1);
    }

    // Proves an echo request from a resolved neighbour is answered at once with the same
    // identifier, sequence number and data.
    #[test]
    fn answers_ping() {
        let mut iface = interface();
        let now = Instant::from_millis(1);
        iface.receive(now, &arp_frame(ArpOperation::Request, OUR_IP));
        transmit_all(&mut iface, now);
        iface.receive(now, &echo_request_frame());
        let frames = transmit_all(&mut iface, now);
        assert_eq!(frames.len(), 1);
        assert_eq!(&frames[0][0..6], &PEER_MAC.0);
        let reply =
            IcmpRepr::parse(&icmp::Packet::new_checked(payload_of(&frames[0])).unwrap()).unwrap();
        assert_eq!(
            reply,
            IcmpRepr::EchoReply {
                ident: 7,
                seq_no: 9,
                data: b"ping"
            }
        );
    }

    // Proves a reply to an unknown neighbour waits for ARP, goes out once resolved, and
    // is dropped (and counted) when ARP_REQUESTS_MAX requests go unanswered.
    #[test]
    fn queues_while_resolving_and_gives_up() {
        let mut iface = interface();
        let mut now = Instant::from_millis(1);
        iface.receive(now, &echo_request_frame());
        let frames = transmit_all(&mut iface, now);
        assert_eq!(frames.len(), 1, "only the ARP request goes out");
        assert_eq!(&frames[0][12..14], &[0x08, 0x06]);
        let mut reply = arp_frame(ArpOperation::Reply, OUR_IP);
        reply[0..6].copy_from_slice(&OUR_MAC.0);
        iface.receive(now, &reply);
        let frames = transmit_all(&mut iface, now);
        assert_eq!(frames.len(), 1);
        assert_eq!(&frames[0][12..14], &[0x08, 0x00], "the queued echo reply");

        now += ARP_ENTRY_LIFETIME;
        iface.receive(now, &echo_request_frame());
        for _ in 0..=ARP_REQUESTS_MAX {
            assert_eq!(iface.poll_at(now).map(|at| at <= now), Some(true));
            transmit_all(&mut iface, now);
            now += ARP_RETRY_INTERVAL;
        }
        transmit_all(&mut iface, now);
        assert_eq!(
            iface.stats().arp_requests_sent,
            1 + u64::from(ARP_REQUESTS_MAX)
        );
        assert_eq!(iface.stats().arp_failed_drops, 1);
        assert_eq!(iface.poll_at(now), None);
    }

    // Proves a next hop in use near its expiry is refreshed by a unicast request while
    // the old entry keeps working, so traffic never waits for re-resolution.
    #[test]
    fn refreshes_arp_entry_in_use() {
        let mut iface = interface();
        let start = Instant::from_millis(1);
        iface.receive(start, &arp_frame(ArpOperation::Request, OUR_IP));
        transmit_all(&mut iface, start);
        let late = start + (ARP_ENTRY_LIFETIME - ARP_REFRESH_MARGIN) + Duration::from_secs(1);
        iface.receive(late, &echo_request_frame());
        let frames = transmit_all(&mut iface, late);
        assert_eq!(
            frames.len(),
            2,
            "echo reply at once, then the refresh request"
        );
        assert_eq!(&frames[0][12..14], &[0x08, 0x00]);
        assert_eq!(&frames[1][12..14], &[0x08, 0x06]);
        assert_eq!(&frames[1][0..6], &PEER_MAC.0, "refresh is unicast");
        let mut reply = arp_frame(ArpOperation::Reply, OUR_IP);
        reply[0..6].copy_from_slice(&OUR_MAC.0);
        iface.receive(late, &reply);
        let after_old_expiry = start + ARP_ENTRY_LIFETIME + Duration::from_secs(1);
        iface.receive(after_old_expiry, &echo_request_frame());
        let frames = transmit_all(&mut iface, after_old_expiry);
        assert_eq!(frames.len(), 1, "no re-resolution needed");
        assert_eq!(&frames[0][12..14], &[0x08, 0x00]);
    }

    // Proves fragments are counted and dropped, and corrupted headers counted.
    #[test]
    fn counts_fragments_and_bad_checksums() {
        let mut iface = interface();
        let now = Instant::from_millis(1);
        let mut frame = echo_request_frame();
        frame[IP_OFFSET + 6] = 0x20; // More Fragments
        frame[IP_OFFSET + 10] = 0;
        frame[IP_OFFSET + 11] = 0;
        let sum = !crate::wire::checksum::sum(&frame[IP_OFFSET..TCP_OFFSET]);
        frame[IP_OFFSET + 10..IP_OFFSET + 12].copy_from_slice(&sum.to_be_bytes());
        iface.receive(now, &frame);
        assert_eq!(iface.stats().ipv4_fragments_dropped, 1);
        let mut frame = echo_request_frame();
        frame[IP_OFFSET + 8] ^= 1; // TTL changed, checksum not updated
        iface.receive(now, &frame);
        assert_eq!(iface.stats().rx_checksum_errors, 1);
        assert!(transmit_all(&mut iface, now)
            .iter()
            .all(|f| f[12..14] == [0x08, 0x06]));
    }

    // Proves a SYN to a closed port is answered with RST+ACK acknowledging the SYN.
    #[test]
    fn resets_syn_to_closed_port() {
        let mut iface = interface();
        let now = Instant::from_millis(1);
        iface.receive(now, &arp_frame(ArpOperation::Request, OUR_IP));
        transmit_all(&mut iface, now);
        let mut syn = TcpRepr::new(40000, 80, SeqNumber(12345));
        syn.syn = true;
        let mut segment = vec![0u8; syn.buffer_len()];
        syn.emit(&mut segment, PEER_IP, OUR_IP);
        iface.receive(now, &ip_frame(ipv4::PROTOCOL_TCP, &segment));
        let frames = transmit_all(&mut iface, now);
        assert_eq!(frames.len(), 1);
        let reset = TcpRepr::parse(
            &tcp::Packet::new_checked(payload_of(&frames[0])).unwrap(),
            OUR_IP,
            PEER_IP,
        )
        .unwrap();
        assert!(reset.rst);
        assert_eq!(reset.ack_number, Some(SeqNumber(12346)));
        assert_eq!((reset.src_port, reset.dst_port), (80, 40000));
    }

    // Proves handles are generation-checked: a freed slot's old handle stays invalid
    // after the slot is reused, and the table size bounds sockets.
    #[test]
    fn stale_handles_are_rejected() {
        let mut iface = interface();
        let now = Instant::from_millis(1);
        let first = iface.connect(now, PEER_IP, 80).unwrap();
        iface.abort(first).unwrap();
        assert_eq!(
            iface.sockets_in_use(),
            0,
            "an unsynchronized abort frees at once"
        );
        let handles: Vec<_> = (0..4)
            .map(|_| iface.connect(now, PEER_IP, 80).unwrap())
            .collect();
        assert_eq!(iface.connect(now, PEER_IP, 80), Err(SocketError::Exhausted));
        assert_eq!(iface.state(first), Err(SocketError::InvalidHandle));
        assert_eq!(iface.state(handles[3]), Ok(State::SynSent));
        assert_eq!(iface.listen(80, 1), Err(SocketError::Exhausted));
    }

    // Proves off-subnet destinations need a gateway.
    #[test]
    fn connect_without_route_fails() {
        let mut iface = Interface::new(InterfaceConfig::new(OUR_MAC, OUR_IP, 24));
        let now = Instant::from_millis(1);
        assert_eq!(
            iface.connect(now, Ipv4Addr::new(192, 168, 1, 1), 80),
            Err(SocketError::NoRoute)
        );
        assert!(iface.connect(now, PEER_IP, 80).is_ok());
    }
}
