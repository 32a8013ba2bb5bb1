//! `--network=dpdk`: one worker serves clients through a DPDK port and `tcp-stack`.
//!
//! What this owns: the EAL, the mbuf pool, the port's single RX/TX queue pair, the
//! userspace TCP/IP interface with its listener, and the map from stack sockets to the
//! worker's connection slots. Worker 0 drives it from its loop with four hooks:
//!
//! - `dpdk_receive` (after `reap`): one monotonic clock read for the round, one
//!   `rx_burst`, every frame through `Interface::receive_direct`: an in-order segment
//!   on a connection whose stack ring is empty is copied once, from the mbuf straight
//!   into `Conn::inbuf`; then the stack's events: the listener's queue is accepted
//!   (maxclients and protected mode as in kernel mode), bytes buffered in a socket's
//!   ring are copied into `Conn::inbuf`, the connection is marked ready, a finished or
//!   reset peer closes the connection — exactly what a kernel socket's receive
//!   completion does, so `process_conn` and everything under it are unchanged.
//! - `dpdk_send` (at the end of `submit_sends`, after its group-commit gate has held back
//!   replies whose epoch is not durable yet, so durability rules hold): each
//!   connection's `out` moves into its socket's send ring as far as the ring
//!   has room; the rest waits in `Conn` for a later round. `OUTPUT_HIGH_WATER_BYTES`
//!   stops parsing for a client that does not read, as in kernel mode. Then every frame
//!   the stack wants to send (data, ACKs, retransmissions, ARP) goes out in `tx_burst`s.
//! - `dpdk_wait` (in place of parking): does not block while there is work or device
//!   I/O outstanding. It enters the ring without waiting when entries are queued
//!   (storage reads, fsyncs) or deferred task work is pending (so completions get
//!   posted); they are reaped at the top of the next round. After `--busy-poll-us` of
//!   idle rounds it backs off: waits in the ring, 10 µs doubling to 1 ms (bounded by the
//!   stack's next timer). Timers fire in `poll_transmit` with the round's clock.
//! - the close in `begin_close`: a graceful close of the stack socket (FIN after the
//!   replies already in its send ring); the `Conn` is freed at once (no ring operation
//!   is in flight for it).
//!
//! Invariants: a socket is in `conns` exactly while its `Conn` lives; the EAL and the
//! pool live for the rest of the process (DPDK cannot initialise twice); mbufs are
//! single-segment (frames are at most `MAX_FRAME_BYTES`).
//!
//! Copies are counted in `Stats::copies` (`runtime::copies`, INFO `lavik_dpdk_*`).
//!
//! Deliberately missing: more than one queue (RSS across workers), checksum and
//! segmentation offloads, parsing commands in place from the mbuf (received bytes are
//! copied once, mbuf → `inbuf`, or twice through the stack's ring when it holds data),
//! zero-copy send (`out` → stack ring → frame), and a per-socket buffer pool (the stack
//! allocates each connection's rings when it opens).

use super::{Transport, Worker};
use crate::config::{DpdkPort, DpdkSettings};
use crate::server::faults::{FaultLayer, Verdict};
use crate::server::ConnToken;
use dpdk_sys::{Eal, Mbuf, Mempool, Port, PortConfig, BURST_MAX_PACKETS};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::Ordering;
use tcp_stack::limits::MAX_FRAME_BYTES;
use tcp_stack::{Interface, InterfaceConfig, MacAddr, SocketHandle, State};

/// Mbufs in the pool: both descriptor rings full, plus bursts being built and held.
const POOL_BUFFERS: u32 = 8191;
/// Per-lcore cache of the pool (the worker is the EAL's main lcore).
const POOL_CACHE_BUFFERS: u32 = 256;
/// Buffer size: DPDK's default 2048-byte data room plus its 128-byte headroom.
const MBUF_DATA_ROOM_BYTES: u16 = 2048 + 128;
/// Descriptors per RX and TX ring.
const RING_DESCRIPTORS: u16 = 1024;
/// Frames built but not yet taken by the driver; beyond it the stack keeps data in its
/// rings until the next round (back-pressure from a full TX ring).
const TX_QUEUED_MAX_FRAMES: usize = 4 * BURST_MAX_PACKETS;
/// Connections half-open or waiting for `accept` (SYNs beyond it are dropped; the client
/// retries).
const LISTEN_BACKLOG: usize = 1024;
/// How long the port stays open after the last frames at shutdown (see `Drop`).
const SHUTDOWN_DRAIN: std::time::Duration = std::time::Duration::from_millis(50);
/// The DPDK loop's idle back-off (`dpdk_wait`): first wait, and the cap it doubles to.
/// The cap bounds the latency the first frame after an idle spell can see.
const IDLE_WAIT_MIN_US: u64 = 10;
const IDLE_WAIT_MAX_US: u64 = 1000;
/// Stack socket slots beyond `maxclients`: the listener, connections we closed that are
/// still finishing (FIN-WAIT, TIME-WAIT), refused connections.
const SOCKET_SLOTS_EXTRA: usize = 4096;

const _: () = assert!(MAX_FRAME_BYTES + 128 <= MBUF_DATA_ROOM_BYTES as usize);
const _: () = assert!(
    (RING_DESCRIPTORS as u32) * 2 + TX_QUEUED_MAX_FRAMES as u32 + POOL_CACHE_BUFFERS < POOL_BUFFERS
);

/// The DPDK port and the TCP/IP stack on it. Created on the worker thread that drives it
/// (the EAL binds to that thread), so it is deliberately not `Send`.
pub struct DpdkNet {
    // Dropped first: stops and closes the port (a tap device disappears).
    port: Port<'static>,
    pool: &'static Mempool<'static>,
    iface: Interface,
    listener: SocketHandle,
    /// Which connection each open stack socket belongs to.
    conns: HashMap<SocketHandle, ConnToken>,
    rx: Vec<Mbuf<'static>>,
    /// Payload the stack delivered directly from this round's `rx` frames: the socket,
    /// the frame's index in `rx` and the payload's range in it (`dpdk_receive` copies it
    /// into the connection's `inbuf`, then the frames are freed).
    direct: Vec<(SocketHandle, usize, std::ops::Range<usize>)>,
    /// `Interface::stats().tcp_tx_payload_bytes` already counted in INFO.
    tx_payload_counted: u64,
    /// Frames received and transmitted since the last `dpdk_wait`.
    round_frames: usize,
    /// Since when rounds have been idle, and the last idle wait (`dpdk_wait`).
    idle_since: Option<std::time::Instant>,
    idle_wait_us: u64,
    tx: Vec<Mbuf<'static>>,
    /// A frame-sized mbuf kept from a round with nothing to send.
    spare: Option<Mbuf<'static>>,
    events: Vec<SocketHandle>,
    faults: Option<FaultLayer>,
    epoch: std::time::Instant,
    now: tcp_stack::Instant,
    laddr_ip: std::net::Ipv4Addr,
}

impl DpdkNet {
    /// Initialises the EAL, opens and starts the port, and listens on the stack.
    /// Errors are complete sentences for the operator.
    pub fn open(settings: &DpdkSettings, maxclients: usize) -> Result<DpdkNet, String> {
        let faults = FaultLayer::from_env()?;
        let mut argv: Vec<&str> = vec!["lavik"];
        argv.extend(settings.eal_args.iter().map(String::as_str));
        let eal = Eal::init(&argv).map_err(|e| format!("DPDK EAL init ({argv:?}): {e}"))?;
        // Lives for the process: DPDK cannot be initialised again after cleanup.
        let eal: &'static Eal = Box::leak(Box::new(eal));
        let port_count = eal.port_count();
        let port_id = match &settings.port {
            None | Some(DpdkPort::Id(_)) if port_count == 0 => {
                return Err("DPDK found no Ethernet port (check --dpdk-eal-args)".into())
            }
            None => 0,
            Some(DpdkPort::Id(id)) if *id >= port_count => {
                return Err(format!(
                    "--dpdk-port {id}: DPDK has {port_count} port(s), ids 0-{}",
                    port_count - 1
                ))
            }
            Some(DpdkPort::Id(id)) => *id,
            Some(DpdkPort::Name(name)) => eal
                .port_by_name(name)
                .map_err(|e| format!("--dpdk-port {name}: {e}"))?,
        };
        let pool = Mempool::create(
            eal,
            "lavik_frames",
            POOL_BUFFERS,
            POOL_CACHE_BUFFERS,
            MBUF_DATA_ROOM_BYTES,
        )
        .map_err(|e| format!("DPDK mbuf pool: {e}"))?;
        let pool: &'static Mempool<'static> = Box::leak(Box::new(pool));
        let config = PortConfig {
            rx_queues: 1,
            tx_queues: 1,
            rx_ring_descriptors: RING_DESCRIPTORS,
            tx_ring_descriptors: RING_DESCRIPTORS,
        };
        let mut port = Port::configure(port_id, &config, pool)
            .map_err(|e| format!("DPDK port {port_id}: {e}"))?;
        port.start()
            .map_err(|e| format!("DPDK port {port_id}: {e}"))?;
        let mac = match settings.mac {
            Some(mac) => {
                // Frames to an address the port does not own need promiscuous mode.
                port.enable_promiscuous()
                    .map_err(|e| format!("DPDK port {port_id}: {e}"))?;
                mac
            }
            None => port
                .mac_addr()
                .map_err(|e| format!("DPDK port {port_id}: {e}"))?,
        };
        let mut if_config = InterfaceConfig::new(MacAddr(mac), settings.ip, settings.prefix_len);
        if_config.gateway = settings.gateway;
        if_config.max_sockets = maxclients.min(1 << 20) + SOCKET_SLOTS_EXTRA;
        // RFC 6528 wants a secret the peer cannot guess; RandomState is seeded by the OS.
        if_config.iss_secret = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let mut iface = Interface::new(if_config);
        let listener = iface
            .listen(settings.listen_port, LISTEN_BACKLOG)
            .map_err(|e| format!("userspace TCP listen on {}: {e}", settings.listen_port))?;
        tracing::info!(
            "DPDK port {port_id} ({}) up: serving {}/{} port {}{}{}",
            MacAddr(mac),
            settings.ip,
            settings.prefix_len,
            settings.listen_port,
            settings
                .gateway
                .map(|g| format!(", gateway {g}"))
                .unwrap_or_default(),
            if faults.is_some() {
                ", FAULT INJECTION ON"
            } else {
                ""
            }
        );
        Ok(DpdkNet {
            port,
            pool,
            iface,
            listener,
            conns: HashMap::new(),
            rx: Vec::with_capacity(BURST_MAX_PACKETS),
            direct: Vec::with_capacity(BURST_MAX_PACKETS),
            tx_payload_counted: 0,
            round_frames: 0,
            idle_since: None,
            idle_wait_us: 0,
            tx: Vec::with_capacity(TX_QUEUED_MAX_FRAMES + BURST_MAX_PACKETS),
            spare: None,
            events: Vec::new(),
            faults,
            epoch: std::time::Instant::now(),
            now: tcp_stack::Instant::ZERO,
            laddr_ip: settings.ip,
        })
    }

    /// The round's time for the stack (microseconds since the port opened).
    fn clock(&self) -> tcp_stack::Instant {
        tcp_stack::Instant::from_micros(self.epoch.elapsed().as_micros() as u64)
    }

    /// One `rx_burst` into the stack, through the fault layer when it is on. The frames
    /// stay in `rx` (freed by the caller) so that payload the stack delivers directly
    /// (`direct`) can be copied out of them; held frames released by the fault layer go
    /// through the stack's receive ring.
    fn receive_frames(&mut self) {
        let now = self.now;
        let now_us = now.total_micros();
        self.rx.clear();
        self.direct.clear();
        self.port.rx_burst(0, &mut self.rx);
        self.round_frames += self.rx.len();
        for (index, m) in self.rx.iter().enumerate() {
            let verdict = match self.faults.as_mut() {
                None => Verdict::Pass,
                Some(faults) => faults.rx.judge(),
            };
            match verdict {
                Verdict::Pass | Verdict::Duplicate => {
                    if let Some((handle, range)) = self.iface.receive_direct(now, m.data()) {
                        self.direct.push((handle, index, range));
                    }
                    if verdict == Verdict::Duplicate {
                        self.iface.receive(now, m.data());
                    }
                }
                Verdict::Drop => {}
                Verdict::Hold => {
                    if let Some(faults) = self.faults.as_mut() {
                        faults.rx.hold(now_us, m.data());
                    }
                }
            }
        }
        if let Some(faults) = self.faults.as_mut() {
            while let Some(frame) = faults.rx.release_due(now_us) {
                self.iface.receive(now, &frame);
            }
        }
    }

    /// An empty frame-sized mbuf, `None` when the pool is exhausted.
    fn frame_buffer(&mut self) -> Option<Mbuf<'static>> {
        if let Some(m) = self.spare.take() {
            return Some(m);
        }
        let mut m = self.pool.alloc()?;
        m.append(MAX_FRAME_BYTES as u16)?;
        Some(m)
    }

    /// Queues a copy of `frame` for transmission (duplicates and released held frames).
    fn queue_copy(&mut self, frame: &[u8]) {
        let Some(mut m) = self.pool.alloc() else {
            return; // pool exhausted: like a loss on the wire; TCP repairs it
        };
        if let Some(space) = m.append(frame.len() as u16) {
            space.copy_from_slice(frame);
            self.tx.push(m);
        }
    }

    /// Everything the stack wants to send now (data, ACKs, timers' retransmissions, ARP),
    /// handed to the driver in bursts.
    fn transmit(&mut self) {
        let now = self.now;
        let now_us = now.total_micros();
        if let Some(mut faults) = self.faults.take() {
            while let Some(frame) = faults.tx.release_due(now_us) {
                self.queue_copy(&frame);
            }
            self.faults = Some(faults);
        }
        while self.tx.len() < TX_QUEUED_MAX_FRAMES {
            let Some(mut m) = self.frame_buffer() else {
                break;
            };
            let Some(len) = self.iface.poll_transmit(now, m.data_mut()) else {
                self.spare = Some(m);
                break;
            };
            self.round_frames += 1;
            let trimmed = m.trim((MAX_FRAME_BYTES - len) as u16);
            debug_assert!(trimmed);
            match self.faults.as_mut().map(|f| f.tx.judge()) {
                None | Some(Verdict::Pass) => self.tx.push(m),
                Some(Verdict::Drop) => {}
                Some(Verdict::Duplicate) => {
                    let frame = m.data().to_vec();
                    self.tx.push(m);
                    self.queue_copy(&frame);
                }
                Some(Verdict::Hold) => {
                    if let Some(f) = self.faults.as_mut() {
                        f.tx.hold(now_us, m.data());
                    }
                }
            }
            if self.tx.len() >= BURST_MAX_PACKETS {
                self.port.tx_burst(0, &mut self.tx);
            }
        }
        while !self.tx.is_empty() {
            if self.port.tx_burst(0, &mut self.tx) == 0 {
                break; // ring full: the rest stays queued for the next round
            }
        }
    }
}

impl Drop for DpdkNet {
    fn drop(&mut self) {
        // The process is stopping: reset open connections so clients notice at once (a
        // kernel socket gets the same from the kernel when the process exits).
        let open: Vec<SocketHandle> = self.conns.drain().map(|(handle, _)| handle).collect();
        for handle in open {
            let _ = self.iface.abort(handle);
        }
        self.now = self.clock();
        self.transmit();
        if !self.tx.is_empty() || self.iface.stats().tx_frames > 0 {
            // Frames handed to the driver may still sit in its TX ring (a NIC) or in the
            // kernel's receive backlog (tap, af_packet); stopping the port at once can drop
            // them, RSTs included. One bounded pause at shutdown lets them out.
            std::thread::sleep(SHUTDOWN_DRAIN);
            self.transmit();
        }
        tracing::info!("userspace TCP stack: {:?}", self.iface.stats());
        if let Some(f) = &self.faults {
            tracing::info!("fault layer: rx {:?}, tx {:?}", f.rx.stats, f.tx.stats);
        }
    }
}

/// The stack side of `begin_close`: forget the socket and close it gracefully (FIN after
/// what is already in its send ring). Bytes that still arrive on it are discarded.
pub(super) fn close_stack_socket(net: &mut Option<DpdkNet>, handle: SocketHandle) {
    if let Some(net) = net.as_mut() {
        net.conns.remove(&handle);
        // An error means the stack already dropped the socket (reset, timed out).
        let _ = net.iface.close(handle);
    }
}

impl Worker {
    /// Gives this worker the DPDK port; from now on its loop busy-polls.
    pub fn attach_dpdk(&mut self, net: DpdkNet) {
        self.dpdk = Some(net);
    }

    /// Round start: frames in, then every socket event (accepts, data, closes).
    pub(super) fn dpdk_receive(&mut self, now_ms: u64) {
        let Some(net) = self.dpdk.as_mut() else {
            return;
        };
        net.now = net.clock();
        net.receive_frames();
        // Payload delivered straight from the frames: one copy, mbuf → `inbuf`.
        let mut ready = Vec::new();
        let mut direct_bytes = 0u64;
        for (handle, index, range) in net.direct.drain(..) {
            let conn = net.conns.get(&handle).and_then(|t| {
                self.conns
                    .get_mut(t.slot as usize)
                    .and_then(Option::as_mut)
                    .filter(|c| c.gen == t.gen && !c.closing)
                    .map(|c| (t.slot, c))
            });
            // A socket we closed: the bytes are discarded, as `dpdk_serve` does.
            let Some((slot, conn)) = conn else {
                continue;
            };
            conn.inbuf
                .extend_from_slice(&net.rx[index].data()[range.clone()]);
            direct_bytes += range.len() as u64;
            ready.push(slot);
        }
        // The frames go back to the pool now.
        net.rx.clear();
        if direct_bytes > 0 {
            let stats = &self.shared.stats;
            stats
                .net_input_bytes
                .fetch_add(direct_bytes, Ordering::Relaxed);
            stats.copies.dpdk.received(direct_bytes, 1);
            stats
                .copies
                .dpdk_rx_direct_bytes
                .fetch_add(direct_bytes, Ordering::Relaxed);
        }
        for slot in ready {
            self.mark_ready(slot);
        }
        let Some(net) = self.dpdk.as_mut() else {
            return;
        };
        let mut events = std::mem::take(&mut net.events);
        while let Some(handle) = net.iface.poll_event() {
            events.push(handle);
        }
        let listener = net.listener;
        for &handle in &events {
            if handle == listener {
                self.dpdk_accept(now_ms);
            } else {
                self.dpdk_serve(handle);
            }
        }
        events.clear();
        if let Some(net) = self.dpdk.as_mut() {
            net.events = events;
        }
    }

    /// Accepts every queued connection, admitting it as kernel mode does.
    fn dpdk_accept(&mut self, now_ms: u64) {
        loop {
            let Some(net) = self.dpdk.as_mut() else {
                return;
            };
            let handle = match net.iface.accept(net.listener) {
                Ok(Some(handle)) => handle,
                Ok(None) => return,
                Err(e) => {
                    tracing::error!("userspace TCP accept failed: {e}");
                    return;
                }
            };
            let Ok(tuple) = net.iface.socket(handle).map(|s| s.tuple()) else {
                continue;
            };
            let addr = format!("{}:{}", tuple.remote_addr, tuple.remote_port);
            let laddr = format!("{}:{}", net.laddr_ip, tuple.local_port);
            let authenticated = match self.admit(tuple.remote_addr.is_loopback()) {
                Ok(authenticated) => authenticated,
                Err(refusal) => {
                    if let Some(net) = self.dpdk.as_mut() {
                        // The refusal (under 1 KiB) fits a fresh socket's send ring.
                        let _ = net.iface.send_slice(handle, refusal);
                        let _ = net.iface.close(handle);
                    }
                    continue;
                }
            };
            let slot =
                self.install_conn(Transport::Stack(handle), addr, laddr, authenticated, now_ms);
            let gen = self.conns[slot as usize]
                .as_ref()
                .expect("connection just installed")
                .gen;
            if let Some(net) = self.dpdk.as_mut() {
                net.conns.insert(handle, ConnToken { slot, gen });
                // From now on, in-order segments that find the socket's ring empty skip
                // it (what arrived with the handshake is read from the ring below).
                let _ = net.iface.set_direct_receive(handle, true);
            }
            // Data may have arrived with the handshake's last ACK.
            self.dpdk_serve(handle);
        }
    }

    /// Moves a socket's received bytes into its connection and notices the peer leaving.
    fn dpdk_serve(&mut self, handle: SocketHandle) {
        let Some(net) = self.dpdk.as_mut() else {
            return;
        };
        let token = net.conns.get(&handle).copied();
        let conn = token.and_then(|t| {
            self.conns
                .get_mut(t.slot as usize)
                .and_then(Option::as_mut)
                .filter(|c| c.gen == t.gen)
        });
        let (Some(token), Some(conn)) = (token, conn) else {
            // A socket we closed: discard what still arrives so its window stays open.
            net.conns.remove(&handle);
            while matches!(net.iface.recv(handle, |bytes| bytes.len()), Ok(n) if n > 0) {}
            return;
        };
        let mut received = 0u64;
        while let Ok(n) = net.iface.recv(handle, |bytes| {
            conn.inbuf.extend_from_slice(bytes);
            bytes.len()
        }) {
            if n == 0 {
                break;
            }
            received += n as u64;
        }
        let gone = match net.iface.socket(handle) {
            Ok(socket) => socket.peer_finished() || socket.state() == State::Closed,
            Err(_) => true,
        };
        if received > 0 {
            self.shared
                .stats
                .net_input_bytes
                .fetch_add(received, Ordering::Relaxed);
            // Frame → the stack's receive ring → `inbuf`.
            self.shared.stats.copies.dpdk.received(received, 2);
            self.mark_ready(token.slot);
        }
        if gone {
            // As a kernel socket's EOF: the client is gone, unsent replies are dropped.
            self.begin_close(token.slot);
            self.maybe_free(token.slot);
        }
    }

    /// Moves pending replies into the stack's send rings, then transmits.
    pub(super) fn dpdk_send(&mut self) {
        let Some(net) = self.dpdk.as_mut() else {
            return;
        };
        let mut resume = Vec::new();
        let mut finished = Vec::new();
        let mut sent_bytes = 0u64;
        for slot in 0..self.conns.len() {
            let Some(conn) = self.conns[slot].as_mut() else {
                continue;
            };
            let Transport::Stack(handle) = conn.fd else {
                continue;
            };
            if conn.closing {
                continue;
            }
            let mut progressed = false;
            let mut failed = false;
            loop {
                if conn.sending.is_empty() {
                    if conn.out.is_empty() {
                        break;
                    }
                    // Group commit: `gate_replies` left only replies that may leave in
                    // `out` (when nothing is held it skips the pass and leaves
                    // `out_cleared` as it was, so that field is no bound here).
                    std::mem::swap(&mut conn.sending, &mut conn.out);
                    conn.out_cleared = 0;
                    conn.send_off = 0;
                }
                let written = match net.iface.send_slice(handle, &conn.sending[conn.send_off..]) {
                    Ok(n) => n,
                    Err(_) => {
                        failed = true;
                        break;
                    }
                };
                if written == 0 {
                    break; // send ring full: the rest waits for the peer's ACKs
                }
                progressed = true;
                sent_bytes += written as u64;
                conn.send_off += written;
                if conn.send_off == conn.sending.len() {
                    conn.sending.clear();
                    conn.send_off = 0;
                }
            }
            if progressed && conn.unparsed() > 0 {
                resume.push(slot as u32);
            }
            let drained = conn.sending.is_empty() && conn.out.is_empty();
            let quit = conn.close_after_reply && conn.pending.is_empty() && conn.held.is_empty();
            if failed || (drained && quit) {
                finished.push(slot as u32);
            }
        }
        net.transmit();
        // Send ring → frames (retransmissions copy again).
        let framed = net.iface.stats().tcp_tx_payload_bytes;
        let framed_new = framed - net.tx_payload_counted;
        net.tx_payload_counted = framed;
        let copies = &self.shared.stats.copies.dpdk;
        if framed_new > 0 {
            copies.tx_copied(framed_new);
        }
        if sent_bytes > 0 {
            self.shared
                .stats
                .net_output_bytes
                .fetch_add(sent_bytes, Ordering::Relaxed);
            // `sending` → the socket's send ring.
            copies.sent(sent_bytes);
            copies.tx_copied(sent_bytes);
        }
        for slot in resume {
            self.mark_ready(slot);
        }
        for slot in finished {
            self.begin_close(slot);
            self.maybe_free(slot);
        }
    }

    /// The DPDK worker's "wait". While anything is going on it never blocks: it enters
    /// the ring only when there is something to hand over (queued storage reads, fsyncs)
    /// or deferred task work to run (the ring defers completion work,
    /// `setup_defer_taskrun`, so completions of device reads, fsyncs and the mailbox
    /// eventfd are posted only by an enter with GETEVENTS, which `submit` adds when the
    /// kernel sets the task-run flag), and spins.
    ///
    /// Idle back-off: once a round found nothing to do (no frame in or out, no ready
    /// connection, no device I/O or fsync outstanding, no completion waiting) and rounds
    /// have stayed idle for `--busy-poll-us`, the loop waits in the ring instead of
    /// spinning, for `IDLE_WAIT_MIN_US` at first, doubling while it stays idle, at most
    /// `IDLE_WAIT_MAX_US` (and never past the stack's next timer). A completion (the
    /// mailbox eventfd of another worker, say) ends the wait at once; a frame is seen at
    /// the latest when the wait ends. It never waits while device I/O is outstanding.
    pub(super) fn dpdk_wait(&mut self) {
        let queued = {
            let sq = self.ring.submission();
            !sq.is_empty() || sq.taskrun()
        };
        let io_outstanding = self.reads.inflight() > 0
            || self.reads.has_delayed()
            || self.commit.writes_inflight > 0
            || !self.commit.inflight.is_empty()
            || !self.delayed_syncs.is_empty();
        let busy = queued
            || io_outstanding
            || !self.ready.is_empty()
            || self.retry_pending
            || self.expiry_backlog
            || crate::runtime::tracking::pending()
            || !self.ring.completion().is_empty();
        let busy_poll_us = self.shared.settings.cli.busy_poll_us;
        let Some(net) = self.dpdk.as_mut() else {
            return;
        };
        let active = busy || net.round_frames > 0 || !net.tx.is_empty();
        net.round_frames = 0;
        if queued {
            let _ = self.ring.submit();
        }
        if active {
            net.idle_since = None;
            net.idle_wait_us = 0;
            std::hint::spin_loop();
            return;
        }
        let now = std::time::Instant::now();
        let since = *net.idle_since.get_or_insert(now);
        if now.duration_since(since) < std::time::Duration::from_micros(busy_poll_us) {
            std::hint::spin_loop();
            return;
        }
        let mut wait_us = (net.idle_wait_us * 2).clamp(IDLE_WAIT_MIN_US, IDLE_WAIT_MAX_US);
        net.idle_wait_us = wait_us;
        let stack_now = net.clock();
        if let Some(at) = net.iface.poll_at(stack_now) {
            let until_timer = at.total_micros().saturating_sub(stack_now.total_micros());
            wait_us = wait_us.min(until_timer.max(1));
        }
        let copies = &self.shared.stats.copies;
        copies.dpdk_idle_waits.fetch_add(1, Ordering::Relaxed);
        copies
            .dpdk_idle_wait_us
            .fetch_add(wait_us, Ordering::Relaxed);
        self.wait_ring_us(wait_us);
    }
}
