//! One TCP connection's state machine (RFC 9293 §3.10), sans IO.
//!
//! A [`TcpSocket`] owns a send ring and a receive ring, sized at creation. The interface
//! feeds it parsed segments (`TcpSocket::process`) and asks it for the next segment to
//! send (`TcpSocket::dispatch`), always passing `now`. Invariants:
//!
//! - `snd_una <= snd_nxt <= snd_max`; the send ring holds exactly the bytes from
//!   `data_start()` (= `snd_una`, plus one while our SYN is unacknowledged) onwards.
//! - The receive ring's allocated bytes are in-order data the application has not read;
//!   out-of-order data sits in its free space, tracked by the assembler, so the right
//!   edge of the advertised window never moves left.
//! - One retransmission timer serves SYN, data, FIN and zero-window probes.
//!
//! Deliberately missing: full RFC 6675 (we use SACK only to pick which hole fast
//! recovery retransmits next), RACK/TLP, PAWS (timestamps are used for RTT only), urgent data, delayed ACKs (every
//! data segment is ACKed at once — lavik's request/response pattern gains little from
//! delaying), Nagle (lavik writes whole replies; it behaves like `TCP_NODELAY`).

use std::net::Ipv4Addr;

use crate::limits::*;
use crate::storage::{Assembler, RingBuffer, Scoreboard};
use crate::time::{Duration, Instant};
use crate::wire::tcp::{self, SeqNumber, TcpRepr, MAX_WINDOW_SCALE_SHIFT};

/// Connection states of RFC 9293 §3.3.2 (LISTEN is a separate listener object).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// No connection: never opened, reset, timed out, or finished.
    Closed,
    /// Active open: SYN sent, waiting for SYN-ACK.
    SynSent,
    /// Passive open: SYN received, SYN-ACK sent.
    SynReceived,
    /// Data flows both ways.
    Established,
    /// We closed first; our FIN is not acknowledged yet.
    FinWait1,
    /// Our FIN is acknowledged; waiting for the peer's.
    FinWait2,
    /// The peer closed; we may still send.
    CloseWait,
    /// Both closed at once; waiting for the ACK of our FIN.
    Closing,
    /// The peer closed, then we did; waiting for the ACK of our FIN.
    LastAck,
    /// Both FINs done; lingering 2 × MSL to absorb stray segments.
    TimeWait,
}

/// Per-socket settings.
#[derive(Debug, Clone, Copy)]
pub struct TcpConfig {
    /// Receive ring size; also the largest window we advertise.
    pub rx_buffer_bytes: usize,
    /// Send ring size.
    pub tx_buffer_bytes: usize,
    /// TIME-WAIT duration (2 × MSL).
    pub time_wait: Duration,
    /// Idle time before keepalive probing starts; `None` disables keepalive.
    pub keepalive_idle: Option<Duration>,
    /// Time between unanswered keepalive probes.
    pub keepalive_interval: Duration,
    /// Offer and accept RFC 7323 timestamps.
    pub timestamps: bool,
    /// Offer and accept RFC 7323 window scaling.
    pub window_scaling: bool,
    /// Offer and accept SACK-permitted (RFC 2018). We then report out-of-order data in
    /// SACK blocks, which lets a SACK-capable peer (Linux) repair losses faster; our own
    /// sending side ignores SACK blocks and recovers with NewReno.
    pub sack: bool,
}

impl Default for TcpConfig {
    fn default() -> TcpConfig {
        TcpConfig {
            rx_buffer_bytes: RX_BUFFER_DEFAULT_BYTES,
            tx_buffer_bytes: TX_BUFFER_DEFAULT_BYTES,
            time_wait: TIME_WAIT_DEFAULT,
            keepalive_idle: None,
            keepalive_interval: KEEPALIVE_INTERVAL_DEFAULT,
            timestamps: true,
            window_scaling: true,
            sack: true,
        }
    }
}

impl TcpConfig {
    fn validate(&self) {
        assert!(
            self.rx_buffer_bytes > 0 && self.rx_buffer_bytes <= BUFFER_MAX_BYTES,
            "bad rx_buffer_bytes"
        );
        assert!(self.tx_buffer_bytes > 0, "bad tx_buffer_bytes");
    }
}

/// Both ends of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FourTuple {
    /// Our address.
    pub local_addr: Ipv4Addr,
    /// Our port.
    pub local_port: u16,
    /// Peer's address.
    pub remote_addr: Ipv4Addr,
    /// Peer's port.
    pub remote_port: u16,
}

/// What the interface must do after a segment was processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing beyond what the socket will dispatch itself.
    Done,
    /// Answer the segment with a RST built from it (RFC 9293 §3.10.7.1 rules).
    SendReset,
}

/// Why a connection ended, for counters and for the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// Still open, or closed before it ever opened.
    None,
    /// Orderly close (FINs both ways).
    Graceful,
    /// The peer sent an acceptable RST.
    ResetByPeer,
    /// The application called abort.
    Aborted,
    /// Retransmissions or keepalive probes went unanswered.
    TimedOut,
    /// Active open refused by the peer.
    Refused,
}

/// Counters a socket reports to the interface as it goes.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SocketEvents {
    pub(crate) retransmits: u64,
    pub(crate) rto_expirations: u64,
    pub(crate) fast_retransmits: u64,
    pub(crate) timeouts: u64,
    pub(crate) reassembly_drops: u64,
    pub(crate) challenge_acks: u64,
    pub(crate) tx_payload_bytes: u64,
}

/// A TCP connection.
#[derive(Debug)]
pub struct TcpSocket {
    config: TcpConfig,
    state: State,
    tuple: FourTuple,
    close_reason: CloseReason,
    events: SocketEvents,

    // Send side.
    iss: SeqNumber,
    snd_una: SeqNumber,
    snd_nxt: SeqNumber,
    snd_max: SeqNumber,
    snd_wnd_bytes: usize,
    snd_wl1: SeqNumber,
    snd_wl2: SeqNumber,
    snd_shift: u8,
    remote_mss_bytes: usize,
    syn_outstanding: bool,
    fin_queued: bool,
    fin_acked: bool,
    scaling_enabled: bool,
    sack_enabled: bool,
    tx: RingBuffer,

    // Receive side.
    irs: SeqNumber,
    rcv_nxt: SeqNumber,
    rcv_shift: u8,
    rx: RingBuffer,
    assembler: Assembler,
    fin_received: bool,
    ack_pending: bool,
    rst_pending: bool,
    last_invalid_ack_at: Option<Instant>,
    window_sent_bytes: usize,
    /// Direct receive is on for this socket (`Interface::set_direct_receive`).
    direct_rx: bool,
    /// Set by the interface for the one segment it processes in `receive_direct`.
    direct_allowed: bool,
    /// The in-order payload of that segment that was not buffered: its address and length
    /// (the address only locates it inside the caller's frame; it is never dereferenced).
    direct_taken: Option<(usize, usize)>,

    // Timestamps (RFC 7323).
    ts_enabled: bool,
    ts_recent: u32,

    // Timers and RTT (RFC 6298).
    rto: Duration,
    srtt: Option<Duration>,
    rttvar: Duration,
    rtt_probe: Option<(SeqNumber, Instant)>,
    retransmit_at: Option<Instant>,
    retransmit_count: u32,
    probe_due: bool,
    timewait_until: Option<Instant>,
    finwait2_until: Option<Instant>,
    keepalive_at: Option<Instant>,
    keepalive_probes_sent: u32,
    keepalive_probe_due: bool,

    // Congestion control (RFC 5681, NewReno RFC 6582).
    cwnd_bytes: usize,
    ssthresh_bytes: usize,
    dup_acks: u32,
    recover: Option<SeqNumber>,
    retransmit_front: bool,
    scoreboard: Scoreboard,
    /// In SACK recovery: everything below this was already retransmitted once.
    rexmit_next: SeqNumber,
}

fn window_shift_for(buffer_bytes: usize) -> u8 {
    let mut shift = 0;
    while (buffer_bytes >> shift) > usize::from(u16::MAX) && shift < MAX_WINDOW_SCALE_SHIFT {
        shift += 1;
    }
    shift
}

fn ts_clock(now: Instant) -> u32 {
    // The timestamp clock ticks in milliseconds and wraps (RFC 7323 §5.4).
    now.total_millis() as u32
}

impl TcpSocket {
    fn new(config: TcpConfig, tuple: FourTuple, iss: SeqNumber, state: State) -> TcpSocket {
        config.validate();
        TcpSocket {
            config,
            state,
            tuple,
            close_reason: CloseReason::None,
            events: SocketEvents::default(),
            iss,
            snd_una: iss,
            snd_nxt: iss,
            snd_max: iss,
            snd_wnd_bytes: 0,
            snd_wl1: SeqNumber(0),
            snd_wl2: iss,
            snd_shift: 0,
            remote_mss_bytes: DEFAULT_REMOTE_MSS_BYTES,
            syn_outstanding: true,
            fin_queued: false,
            fin_acked: false,
            scaling_enabled: false,
            sack_enabled: false,
            tx: RingBuffer::new(config.tx_buffer_bytes),
            irs: SeqNumber(0),
            rcv_nxt: SeqNumber(0),
            rcv_shift: 0,
            rx: RingBuffer::new(config.rx_buffer_bytes),
            assembler: Assembler::default(),
            fin_received: false,
            ack_pending: false,
            rst_pending: false,
            last_invalid_ack_at: None,
            window_sent_bytes: 0,
            direct_rx: false,
            direct_allowed: false,
            direct_taken: None,
            ts_enabled: false,
            ts_recent: 0,
            rto: RTO_INITIAL,
            srtt: None,
            rttvar: Duration::ZERO,
            rtt_probe: None,
            retransmit_at: None,
            retransmit_count: 0,
            probe_due: false,
            timewait_until: None,
            finwait2_until: None,
            keepalive_at: None,
            keepalive_probes_sent: 0,
            keepalive_probe_due: false,
            cwnd_bytes: INITIAL_CWND_SEGMENTS * DEFAULT_REMOTE_MSS_BYTES,
            ssthresh_bytes: usize::MAX,
            dup_acks: 0,
            recover: None,
            retransmit_front: false,
            scoreboard: Scoreboard::default(),
            rexmit_next: iss,
        }
    }

    /// A socket for an active open; its first dispatch sends the SYN.
    pub(crate) fn connect(config: TcpConfig, tuple: FourTuple, iss: SeqNumber) -> TcpSocket {
        let mut socket = TcpSocket::new(config, tuple, iss, State::SynSent);
        socket.ts_enabled = config.timestamps;
        socket.scaling_enabled = config.window_scaling;
        socket.rcv_shift = if config.window_scaling {
            window_shift_for(config.rx_buffer_bytes)
        } else {
            0
        };
        socket
    }

    /// A socket for a passive open from the peer's SYN; its first dispatch sends SYN-ACK.
    pub(crate) fn accept_syn(
        config: TcpConfig,
        tuple: FourTuple,
        iss: SeqNumber,
        syn: &TcpRepr,
        now: Instant,
    ) -> TcpSocket {
        debug_assert!(syn.syn && syn.ack_number.is_none());
        let mut socket = TcpSocket::new(config, tuple, iss, State::SynReceived);
        socket.negotiate(syn);
        socket.irs = syn.seq_number;
        socket.rcv_nxt = syn.seq_number + 1;
        socket.snd_wnd_bytes = usize::from(syn.window_len);
        socket.snd_wl1 = syn.seq_number;
        socket.touch(now);
        socket
    }

    /// Applies the options of the peer's SYN: MSS, window scale, timestamps.
    fn negotiate(&mut self, syn: &TcpRepr) {
        let mss = syn
            .max_seg_size
            .map_or(DEFAULT_REMOTE_MSS_BYTES, usize::from);
        self.remote_mss_bytes = mss.clamp(MIN_REMOTE_MSS_BYTES, LOCAL_MSS_BYTES);
        match (self.config.window_scaling, syn.window_scale) {
            (true, Some(shift)) => {
                self.scaling_enabled = true;
                self.snd_shift = shift;
                self.rcv_shift = window_shift_for(self.config.rx_buffer_bytes);
            }
            _ => {
                self.scaling_enabled = false;
                self.snd_shift = 0;
                self.rcv_shift = 0;
            }
        }
        self.ts_enabled = self.config.timestamps && syn.timestamp.is_some();
        self.sack_enabled = self.config.sack && syn.sack_permitted;
        if let Some((value, _)) = syn.timestamp {
            self.ts_recent = value;
        }
        self.cwnd_bytes = INITIAL_CWND_SEGMENTS * self.mss();
    }

    /// Bytes of data per segment, after timestamp option overhead.
    fn mss(&self) -> usize {
        self.remote_mss_bytes - if self.ts_enabled { 12 } else { 0 }
    }

    /// Connection state.
    pub fn state(&self) -> State {
        self.state
    }

    /// Why the connection closed.
    pub fn close_reason(&self) -> CloseReason {
        self.close_reason
    }

    /// Both ends of the connection.
    pub fn tuple(&self) -> FourTuple {
        self.tuple
    }

    /// Current retransmission timeout.
    pub fn rto(&self) -> Duration {
        self.rto
    }

    /// Sequence number of the next new byte this side will send (SND.NXT).
    pub fn next_seq(&self) -> SeqNumber {
        self.snd_nxt
    }

    /// Current congestion window in bytes.
    pub fn cwnd_bytes(&self) -> usize {
        self.cwnd_bytes
    }

    /// True when the connection is closed and has nothing left to send (a pending RST).
    pub(crate) fn is_finished(&self) -> bool {
        self.state == State::Closed && !self.rst_pending
    }

    pub(crate) fn take_events(&mut self) -> SocketEvents {
        core::mem::take(&mut self.events)
    }

    /// True when in-order data is waiting to be read.
    pub fn can_recv(&self) -> bool {
        !self.rx.is_empty()
    }

    /// True while more data may still arrive or is buffered (the peer has not finished,
    /// or unread data remains).
    pub fn may_recv(&self) -> bool {
        !self.rx.is_empty()
            || matches!(
                self.state,
                State::SynSent
                    | State::SynReceived
                    | State::Established
                    | State::FinWait1
                    | State::FinWait2
            )
    }

    /// True when the application may queue data and there is room for it.
    pub fn can_send(&self) -> bool {
        self.may_send() && self.tx.free() > 0
    }

    fn may_send(&self) -> bool {
        matches!(
            self.state,
            State::SynSent | State::SynReceived | State::Established | State::CloseWait
        ) && !self.fin_queued
    }

    /// Bytes buffered for the application to read.
    pub fn recv_queue_bytes(&self) -> usize {
        self.rx.len()
    }

    /// Bytes queued for sending or awaiting acknowledgment.
    pub fn send_queue_bytes(&self) -> usize {
        self.tx.len()
    }

    /// True when the peer has finished sending and all its data has been read.
    pub fn peer_finished(&self) -> bool {
        self.fin_received && self.rx.is_empty()
    }

    /// Zero-copy read: `reader` sees the contiguous in-order bytes at the front of the
    /// receive ring (possibly only part of them if the ring wraps) and returns how many it
    /// consumed.
    pub fn recv<F: FnOnce(&[u8]) -> usize>(&mut self, reader: F) -> usize {
        let consumed = reader(self.rx.readable_at(0));
        self.rx.consume(consumed);
        if consumed > 0 && self.window_update_worthwhile() {
            self.ack_pending = true;
        }
        consumed
    }

    /// Turns direct receive on: in `Interface::receive_direct`, an in-order segment that
    /// finds nothing buffered is handed to the caller instead of the receive ring.
    pub(crate) fn set_direct_receive(&mut self, on: bool) {
        self.direct_rx = on;
    }

    /// Allows (or stops allowing) direct delivery of the segment about to be processed.
    pub(crate) fn allow_direct(&mut self, allowed: bool) {
        self.direct_allowed = allowed;
    }

    /// The payload the last processed segment delivered directly, if any.
    pub(crate) fn take_direct(&mut self) -> Option<(usize, usize)> {
        self.direct_taken.take()
    }

    /// True when the window grew enough since we last advertised it that the peer should
    /// hear about it (RFC 9293 §3.8.6.2.2 receiver-side silly window avoidance).
    fn window_update_worthwhile(&self) -> bool {
        let window = self.rx.free();
        let threshold = (self.rx.capacity() / 2).min(2 * LOCAL_MSS_BYTES);
        window >= self.window_sent_bytes + threshold
    }

    /// Zero-copy write: `writer` fills the contiguous free space of the send ring and
    /// returns how many bytes it wrote. Returns 0 when sending is not allowed.
    pub fn send<F: FnOnce(&mut [u8]) -> usize>(&mut self, writer: F) -> usize {
        if !self.may_send() {
            return 0;
        }
        let space = self.tx.writable();
        let space_len = space.len();
        let written = writer(space);
        assert!(
            written <= space_len,
            "send writer claimed more bytes than it was given"
        );
        self.tx.commit(written);
        written
    }

    /// Graceful close: queue a FIN after the buffered data.
    pub fn close(&mut self) {
        match self.state {
            State::SynSent => self.set_closed(CloseReason::None),
            // In SYN-RECEIVED the FIN waits until the handshake completes.
            State::SynReceived => self.fin_queued = true,
            State::Established => {
                self.fin_queued = true;
                self.state = State::FinWait1;
            }
            State::CloseWait => {
                self.fin_queued = true;
                self.state = State::LastAck;
            }
            _ => {}
        }
    }

    /// Abortive close: send a RST (if synchronized) and drop everything.
    pub fn abort(&mut self) {
        let synchronized = !matches!(self.state, State::Closed | State::SynSent | State::TimeWait);
        if synchronized {
            self.rst_pending = true;
        }
        self.set_closed(CloseReason::Aborted);
    }

    fn set_closed(&mut self, reason: CloseReason) {
        if self.state != State::Closed && self.close_reason == CloseReason::None {
            self.close_reason = reason;
        }
        self.state = State::Closed;
        self.retransmit_at = None;
        self.keepalive_at = None;
        self.timewait_until = None;
        self.finwait2_until = None;
    }

    fn enter_time_wait(&mut self, now: Instant) {
        self.state = State::TimeWait;
        self.finwait2_until = None;
        self.retransmit_at = None;
        self.keepalive_at = None;
        self.timewait_until = Some(now + self.config.time_wait);
    }

    /// Records activity from the peer: restarts the keepalive idle timer.
    fn touch(&mut self, now: Instant) {
        self.keepalive_probes_sent = 0;
        self.keepalive_probe_due = false;
        self.keepalive_at = self.config.keepalive_idle.map(|idle| now + idle);
    }

    fn data_start(&self) -> SeqNumber {
        self.snd_una + usize::from(self.syn_outstanding)
    }

    fn fin_seq(&self) -> Option<SeqNumber> {
        (self.fin_queued && !self.fin_acked).then(|| self.data_start() + self.tx.len())
    }

    fn rcv_window_bytes(&self) -> usize {
        self.rx.free()
    }
}

// Receiving.
impl TcpSocket {
    /// Processes a segment addressed to this connection.
    pub(crate) fn process(&mut self, now: Instant, repr: &TcpRepr) -> Verdict {
        match self.state {
            State::Closed => {
                return if repr.rst {
                    Verdict::Done
                } else {
                    Verdict::SendReset
                }
            }
            State::SynSent => return self.process_syn_sent(now, repr),
            _ => {}
        }
        if !self.segment_acceptable(repr) {
            if repr.rst {
                return Verdict::Done;
            }
            if self.state == State::SynReceived && repr.syn && repr.seq_number == self.irs {
                // Our SYN-ACK was lost: the peer retransmitted its SYN. Resend.
                self.snd_nxt = self.iss;
                return Verdict::Done;
            }
            if repr.segment_len() > 0 {
                // Old or out-of-window data: the sender needs to hear where we are.
                self.ack_pending = true;
            } else {
                self.ack_unacceptable_rate_limited(now);
            }
            return Verdict::Done;
        }
        self.touch(now);
        if repr.rst && self.state == State::TimeWait {
            // RFC 1337: a RST must not cut TIME-WAIT short (it is typically the answer to
            // our re-ACK of a duplicate FIN from a peer that already closed).
            return Verdict::Done;
        }
        if repr.rst {
            return self.process_rst(now, repr);
        }
        if repr.syn {
            // RFC 5961 §4: a SYN in a synchronized state gets a challenge ACK.
            self.challenge_ack(now);
            return Verdict::Done;
        }
        if self.ts_enabled {
            if let Some((value, _)) = repr.timestamp {
                if repr.seq_number <= self.rcv_nxt {
                    self.ts_recent = value;
                }
            }
        }
        let Some(ack) = repr.ack_number else {
            return Verdict::Done;
        };
        if self.process_ack(now, ack, repr) == Verdict::SendReset {
            return Verdict::SendReset;
        }
        if self.state == State::Closed {
            return Verdict::Done;
        }
        self.process_data(repr);
        self.process_fin(now, repr);
        Verdict::Done
    }

    /// RFC 9293 §3.10.7.4 first check: does any part of the segment fall in the window?
    fn segment_acceptable(&self, repr: &TcpRepr) -> bool {
        let seq = repr.seq_number;
        let len = repr.segment_len();
        let window = self.rcv_window_bytes();
        let in_window = |s: SeqNumber| s >= self.rcv_nxt && s < self.rcv_nxt + window;
        match (len, window) {
            (0, 0) => seq == self.rcv_nxt,
            // Inclusive right edge for empty segments (as Linux's tcp_sequence): a peer
            // that filled our window acknowledges from exactly that edge.
            (0, _) => seq >= self.rcv_nxt && seq <= self.rcv_nxt + window,
            (_, 0) => false,
            _ => in_window(seq) || in_window(seq + (len - 1)),
        }
    }

    /// RFC 5961 §3: only an exactly in-sequence RST resets; others get a challenge ACK.
    fn process_rst(&mut self, now: Instant, repr: &TcpRepr) -> Verdict {
        if repr.seq_number == self.rcv_nxt {
            self.set_closed(CloseReason::ResetByPeer);
        } else {
            self.challenge_ack(now);
        }
        Verdict::Done
    }

    fn challenge_ack(&mut self, now: Instant) {
        if self.ack_unacceptable_rate_limited(now) {
            self.events.challenge_acks += 1;
        }
    }

    /// Schedules an ACK unless one of this kind went out less than
    /// `INVALID_ACK_INTERVAL` ago (RFC 5961 §7). Returns whether it was scheduled.
    fn ack_unacceptable_rate_limited(&mut self, now: Instant) -> bool {
        if self
            .last_invalid_ack_at
            .is_some_and(|at| now.saturating_since(at) < INVALID_ACK_INTERVAL)
        {
            return false;
        }
        self.last_invalid_ack_at = Some(now);
        self.ack_pending = true;
        true
    }

    fn process_syn_sent(&mut self, now: Instant, repr: &TcpRepr) -> Verdict {
        if let Some(ack) = repr.ack_number {
            if ack <= self.iss || ack > self.snd_max {
                return if repr.rst {
                    Verdict::Done
                } else {
                    Verdict::SendReset
                };
            }
        }
        if repr.rst {
            if repr.ack_number.is_some() {
                self.set_closed(CloseReason::Refused);
            }
            return Verdict::Done;
        }
        if !repr.syn {
            return Verdict::Done;
        }
        self.negotiate(repr);
        self.irs = repr.seq_number;
        self.rcv_nxt = repr.seq_number + 1;
        self.touch(now);
        match repr.ack_number {
            Some(ack) => {
                self.sample_rtt(now, ack, repr);
                self.snd_una = ack;
                self.snd_nxt = self.snd_nxt.max(ack);
                self.syn_outstanding = false;
                self.snd_wnd_bytes = usize::from(repr.window_len);
                self.snd_wl1 = repr.seq_number;
                self.snd_wl2 = ack;
                self.retransmit_at = None;
                self.retransmit_count = 0;
                self.state = State::Established;
                self.ack_pending = true;
            }
            None => {
                // Simultaneous open (RFC 9293 §3.5): answer with SYN-ACK.
                self.state = State::SynReceived;
                self.snd_nxt = self.iss;
                self.snd_wnd_bytes = usize::from(repr.window_len);
                self.snd_wl1 = repr.seq_number;
            }
        }
        Verdict::Done
    }

    fn process_ack(&mut self, now: Instant, ack: SeqNumber, repr: &TcpRepr) -> Verdict {
        if self.state == State::SynReceived {
            if ack <= self.snd_una || ack > self.snd_max {
                return Verdict::SendReset;
            }
            self.state = if self.fin_queued {
                State::FinWait1
            } else {
                State::Established
            };
        }
        if ack > self.snd_max {
            // Acknowledges something never sent (RFC 9293 §3.10.7.4): ACK and drop.
            self.ack_pending = true;
            return Verdict::Done;
        }
        let window_bytes = usize::from(repr.window_len) << self.snd_shift;
        self.record_sack_blocks(ack, repr);
        if ack > self.snd_una {
            self.process_new_ack(now, ack, repr);
        } else if ack == self.snd_una
            && repr.payload.is_empty()
            && !repr.fin
            && window_bytes == self.snd_wnd_bytes
            && self.snd_max > self.snd_una
        {
            self.process_dup_ack();
        }
        if self.snd_wl1 < repr.seq_number
            || (self.snd_wl1 == repr.seq_number && self.snd_wl2 <= ack)
        {
            self.snd_wnd_bytes = window_bytes;
            self.snd_wl1 = repr.seq_number;
            self.snd_wl2 = ack;
        }
        if self.snd_wnd_bytes == 0 {
            // The peer is alive and answering; persist probing never gives up on it.
            self.retransmit_count = 0;
        }
        self.arm_persist_timer(now);
        self.after_fin_acked(now);
        Verdict::Done
    }

    fn process_new_ack(&mut self, now: Instant, ack: SeqNumber, repr: &TcpRepr) {
        let acked = ack - self.snd_una;
        self.sample_rtt(now, ack, repr);
        let mut data_acked = acked;
        if let Some(fin_seq) = self.fin_seq() {
            if ack > fin_seq {
                self.fin_acked = true;
                data_acked -= 1;
            }
        }
        if self.syn_outstanding {
            self.syn_outstanding = false;
            data_acked -= 1;
        }
        self.tx.consume(data_acked.min(self.tx.len()));
        self.snd_una = ack;
        self.snd_nxt = self.snd_nxt.max(ack);
        self.scoreboard.trim(ack);
        self.retransmit_count = 0;
        self.on_ack_congestion(acked, ack);
        self.retransmit_at = (self.snd_max > self.snd_una).then(|| now + self.rto);
    }

    fn on_ack_congestion(&mut self, acked: usize, ack: SeqNumber) {
        let mss = self.mss();
        match self.recover {
            Some(recover) if ack >= recover => {
                // Full acknowledgment: leave fast recovery (RFC 6582 §3.2 step 3).
                let flight = self.snd_max - self.snd_una;
                self.cwnd_bytes = self.ssthresh_bytes.min(flight + mss).max(mss);
                self.recover = None;
                self.dup_acks = 0;
            }
            Some(_) => {
                // Partial acknowledgment: retransmit the next hole, deflate the window.
                self.retransmit_front = true;
                self.cwnd_bytes = self.cwnd_bytes.saturating_sub(acked).max(mss) + mss;
            }
            None => {
                self.dup_acks = 0;
                if self.cwnd_bytes < self.ssthresh_bytes {
                    self.cwnd_bytes += acked.min(mss);
                } else {
                    self.cwnd_bytes += (mss * mss / self.cwnd_bytes).max(1);
                }
            }
        }
        self.cwnd_bytes = self
            .cwnd_bytes
            .min(self.config.tx_buffer_bytes.max(mss) * 2);
    }

    fn process_dup_ack(&mut self) {
        self.dup_acks += 1;
        let mss = self.mss();
        if self.recover.is_none() && self.dup_acks == DUP_ACK_THRESHOLD {
            let flight = self.snd_max - self.snd_una;
            self.ssthresh_bytes = (flight / 2).max(2 * mss);
            self.cwnd_bytes = self.ssthresh_bytes + 3 * mss;
            self.recover = Some(self.snd_max);
            self.rexmit_next = self.snd_una;
            self.retransmit_front = true;
            self.events.fast_retransmits += 1;
        } else if self.recover.is_some() {
            if self.sack_hole_pending() {
                // One segment left the network: use it to fill the next reported hole
                // instead of inflating the window for new data (RFC 6675 in spirit).
                self.retransmit_front = true;
            } else {
                self.cwnd_bytes += mss;
            }
        }
    }

    /// Merges the segment's SACK blocks that lie within `[ack, SND.MAX]`.
    fn record_sack_blocks(&mut self, ack: SeqNumber, repr: &TcpRepr) {
        if !self.sack_enabled {
            return;
        }
        for &(left, right) in repr.sack_ranges.iter().flatten() {
            let (left, right) = (SeqNumber(left), SeqNumber(right));
            if left >= ack && left < right && right <= self.snd_max {
                self.scoreboard.add(left, right);
            }
        }
    }

    /// The next hole to retransmit in SACK recovery, if the peer reported one.
    fn next_sack_hole(&self) -> Option<(SeqNumber, SeqNumber)> {
        if !self.sack_enabled || self.recover.is_none() {
            return None;
        }
        self.scoreboard
            .next_hole(self.rexmit_next.max(self.snd_una))
    }

    fn sack_hole_pending(&self) -> bool {
        self.next_sack_hole().is_some()
    }

    /// Takes an RTT sample: from the echoed timestamp when negotiated, otherwise from
    /// the one timed segment (Karn's rule: retransmissions cancel the timing).
    fn sample_rtt(&mut self, now: Instant, ack: SeqNumber, repr: &TcpRepr) {
        let sample = match (self.ts_enabled, repr.timestamp, self.rtt_probe) {
            (true, Some((_, echo)), _) if echo != 0 => Some(Duration::from_millis(u64::from(
                ts_clock(now).wrapping_sub(echo),
            ))),
            (_, _, Some((seq, sent_at))) if ack > seq => Some(now.saturating_since(sent_at)),
            _ => None,
        };
        if self.rtt_probe.is_some_and(|(seq, _)| ack > seq) {
            self.rtt_probe = None;
        }
        if let Some(sample) = sample {
            self.update_rto(sample);
        }
    }

    /// RFC 6298 §2.2–2.4 with alpha = 1/8, beta = 1/4, K = 4.
    fn update_rto(&mut self, sample: Duration) {
        let (srtt, rttvar) = match self.srtt {
            None => (sample, Duration::from_micros(sample.total_micros() / 2)),
            Some(srtt) => {
                let error = srtt.total_micros().abs_diff(sample.total_micros());
                let rttvar = (self.rttvar.total_micros() * 3 + error) / 4;
                let srtt = (srtt.total_micros() * 7 + sample.total_micros()) / 8;
                (Duration::from_micros(srtt), Duration::from_micros(rttvar))
            }
        };
        self.srtt = Some(srtt);
        self.rttvar = rttvar;
        let rto = srtt + rttvar.saturating_mul(4).max(Duration::from_millis(1));
        self.rto = rto.clamp(RTO_MIN, RTO_MAX);
    }

    /// Arms the persist timer when the peer's window is closed and data is waiting.
    fn arm_persist_timer(&mut self, now: Instant) {
        if self.persist_needs_arming() {
            self.retransmit_at = Some(now + self.rto);
        }
    }

    /// The peer's window is closed, data waits, and no timer would ever wake us: the
    /// data may have been queued after the zero-window ACK arrived, so this is checked
    /// both on ACKs and before sending.
    fn persist_needs_arming(&self) -> bool {
        let synchronized =
            !self.syn_outstanding && !matches!(self.state, State::Closed | State::TimeWait);
        let unsent =
            synchronized && self.tx.len() > (self.snd_nxt - self.data_start()).min(self.tx.len());
        self.snd_wnd_bytes == 0 && unsent && self.retransmit_at.is_none()
    }

    fn after_fin_acked(&mut self, now: Instant) {
        if !self.fin_acked {
            return;
        }
        match self.state {
            State::FinWait1 => {
                self.state = State::FinWait2;
                self.finwait2_until = Some(now + FIN_WAIT_2_TIMEOUT);
            }
            State::Closing => self.enter_time_wait(now),
            State::LastAck => self.set_closed(CloseReason::Graceful),
            _ => {}
        }
    }

    fn process_data(&mut self, repr: &TcpRepr) {
        if repr.payload.is_empty()
            || !matches!(
                self.state,
                State::Established | State::FinWait1 | State::FinWait2
            )
        {
            return;
        }
        let (offset, data) = if repr.seq_number < self.rcv_nxt {
            let skip = (self.rcv_nxt - repr.seq_number).min(repr.payload.len());
            (0, &repr.payload[skip..])
        } else {
            (repr.seq_number - self.rcv_nxt, repr.payload)
        };
        self.ack_pending = true;
        if offset == 0
            && self.direct_rx
            && self.direct_allowed
            && self.rx.is_empty()
            && self.assembler.is_empty()
        {
            // Nothing buffered (no unread bytes, nothing out of order held in the ring's
            // free space): the application takes these bytes from the frame now, as if it
            // read them at once. Like the ring path, only what fits the window is taken.
            let taken = data.len().min(self.rx.free());
            if taken > 0 {
                self.direct_taken = Some((data.as_ptr() as usize, taken));
                self.rcv_nxt = self.rcv_nxt + taken;
                return;
            }
        }
        let written = self.rx.write_unallocated(offset, data);
        if written == 0 {
            return;
        }
        if self.assembler.add(offset, offset + written).is_err() {
            self.events.reassembly_drops += 1;
            return;
        }
        let contiguous = self.assembler.take_front();
        self.rx.commit(contiguous);
        self.rcv_nxt = self.rcv_nxt + contiguous;
    }

    fn process_fin(&mut self, now: Instant, repr: &TcpRepr) {
        if !repr.fin || repr.seq_number + repr.payload.len() != self.rcv_nxt {
            // An out-of-order FIN is dropped; the peer retransmits it.
            return;
        }
        self.rcv_nxt = self.rcv_nxt + 1;
        self.fin_received = true;
        self.ack_pending = true;
        match self.state {
            State::SynReceived | State::Established => self.state = State::CloseWait,
            State::FinWait1 if self.fin_acked => self.enter_time_wait(now),
            State::FinWait1 => self.state = State::Closing,
            State::FinWait2 | State::TimeWait => self.enter_time_wait(now),
            _ => {}
        }
    }
}

// Timers and sending.
impl TcpSocket {
    /// Fires due timers: TIME-WAIT expiry, retransmission/persist, keepalive.
    pub(crate) fn handle_timers(&mut self, now: Instant) {
        if let Some(until) = self.timewait_until {
            if now >= until {
                self.set_closed(CloseReason::Graceful);
            }
            return;
        }
        if self.finwait2_until.is_some_and(|until| now >= until) {
            self.events.timeouts += 1;
            self.set_closed(CloseReason::TimedOut);
            return;
        }
        if self.retransmit_at.is_some_and(|at| now >= at) {
            self.on_retransmit_timeout();
        }
        if self.keepalive_at.is_some_and(|at| now >= at) {
            self.on_keepalive_timer(now);
        }
    }

    fn on_retransmit_timeout(&mut self) {
        self.retransmit_at = None;
        self.retransmit_count += 1;
        let limit = if self.syn_outstanding {
            SYN_RETRANSMISSIONS_MAX
        } else {
            RETRANSMISSIONS_MAX
        };
        if self.retransmit_count > limit {
            self.events.timeouts += 1;
            self.rst_pending = !matches!(self.state, State::SynSent);
            self.set_closed(CloseReason::TimedOut);
            return;
        }
        self.rto = self.rto.saturating_mul(2).min(RTO_MAX);
        self.rtt_probe = None;
        if !self.syn_outstanding && self.snd_wnd_bytes == 0 {
            // Persist timer (RFC 9293 §3.8.6.1): probe the closed window with one byte;
            // a lost or refused probe is resent, not treated as congestion.
            self.snd_nxt = self.snd_una;
            self.probe_due = true;
        } else if self.snd_max > self.snd_una {
            // Go back N (RFC 5681 §3.1 eq. 4 for ssthresh, cwnd to one segment).
            let mss = self.mss();
            let flight = self.snd_max - self.snd_una;
            self.ssthresh_bytes = (flight / 2).max(2 * mss);
            self.cwnd_bytes = mss;
            self.recover = None;
            self.dup_acks = 0;
            self.snd_nxt = self.snd_una;
            // RFC 2018 §8: after a timeout, SACK information may be stale (reneging).
            self.scoreboard.clear();
            self.events.retransmits += 1;
            self.events.rto_expirations += 1;
        } else {
            self.probe_due = true;
        }
    }

    fn on_keepalive_timer(&mut self, now: Instant) {
        if !matches!(
            self.state,
            State::Established | State::CloseWait | State::FinWait2
        ) || self.snd_max > self.snd_una
        {
            // Retransmission already probes the peer; look again after an interval.
            self.keepalive_at = Some(now + self.config.keepalive_interval);
            return;
        }
        if self.keepalive_probes_sent >= KEEPALIVE_PROBES_MAX {
            self.events.timeouts += 1;
            self.rst_pending = true;
            self.set_closed(CloseReason::TimedOut);
            return;
        }
        self.keepalive_probes_sent += 1;
        self.keepalive_probe_due = true;
        self.keepalive_at = Some(now + self.config.keepalive_interval);
    }

    /// True when `dispatch` would produce a segment now.
    pub(crate) fn wants_dispatch(&self) -> bool {
        self.rst_pending
            || (self.state != State::Closed
                && (self.ack_pending || self.keepalive_probe_due || self.has_segment_to_send()))
    }

    /// The earliest armed timer, if any.
    pub(crate) fn next_timer(&self) -> Option<Instant> {
        [
            self.timewait_until,
            self.finwait2_until,
            self.retransmit_at,
            self.keepalive_at,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn has_segment_to_send(&self) -> bool {
        match self.state {
            State::Closed | State::TimeWait => false,
            State::SynSent | State::SynReceived => self.snd_nxt == self.iss,
            _ => {
                self.retransmit_front
                    || self.next_data_len() > 0
                    || self.fin_due(self.next_data_len())
                    || self.persist_needs_arming()
            }
        }
    }

    /// Data bytes the next regular segment would carry.
    fn next_data_len(&self) -> usize {
        let sent = (self.snd_nxt - self.data_start()).min(self.tx.len());
        let unsent = self.tx.len() - sent;
        // Limited transmit (RFC 3042): each of the first two duplicate ACKs lets one more
        // new segment out, so small windows still produce the third duplicate ACK.
        let limited_bytes = if self.recover.is_none() && self.dup_acks < DUP_ACK_THRESHOLD {
            self.dup_acks as usize * self.mss()
        } else {
            0
        };
        let window_end = self.snd_una + self.snd_wnd_bytes.min(self.cwnd_bytes + limited_bytes);
        let room = if window_end > self.snd_nxt {
            window_end - self.snd_nxt
        } else {
            0
        };
        let len = unsent.min(room).min(self.mss());
        if len == 0 && unsent > 0 && self.probe_due {
            return 1;
        }
        len
    }

    fn fin_due(&self, data_len: usize) -> bool {
        matches!(
            self.state,
            State::FinWait1 | State::Closing | State::LastAck
        ) && self
            .fin_seq()
            .is_some_and(|fin| self.snd_nxt + data_len == fin)
    }

    /// Writes the next segment (TCP header and data, checksummed) into `buffer`, which
    /// must hold `MAX_FRAME_BYTES - 34` bytes. Returns its length, or `None` when there is
    /// nothing to send.
    pub(crate) fn dispatch(&mut self, now: Instant, buffer: &mut [u8]) -> Option<usize> {
        if self.rst_pending {
            self.rst_pending = false;
            let mut repr =
                TcpRepr::new(self.tuple.local_port, self.tuple.remote_port, self.snd_max);
            repr.rst = true;
            return Some(self.emit(now, repr, 0, buffer));
        }
        match self.state {
            State::Closed => None,
            State::SynSent | State::SynReceived => self.dispatch_syn(now, buffer),
            State::TimeWait => self.dispatch_ack_only(now, buffer),
            _ => self.dispatch_data(now, buffer),
        }
    }

    fn base_repr(&self, seq: SeqNumber) -> TcpRepr<'static> {
        let mut repr = TcpRepr::new(self.tuple.local_port, self.tuple.remote_port, seq);
        repr.ack_number = Some(self.rcv_nxt);
        repr
    }

    fn dispatch_syn(&mut self, now: Instant, buffer: &mut [u8]) -> Option<usize> {
        if self.snd_nxt != self.iss {
            return self.dispatch_ack_only(now, buffer);
        }
        let mut repr = self.base_repr(self.iss);
        repr.syn = true;
        if self.state == State::SynSent {
            repr.ack_number = None;
        }
        repr.max_seg_size = Some(LOCAL_MSS_BYTES as u16);
        // A SYN offers scaling if configured; a SYN-ACK only answers an offer.
        repr.window_scale = self.scaling_enabled.then_some(self.rcv_shift);
        Some(self.emit(now, repr, 0, buffer))
    }

    fn dispatch_ack_only(&mut self, now: Instant, buffer: &mut [u8]) -> Option<usize> {
        if !self.ack_pending {
            return None;
        }
        // SND.MAX, not SND.NXT: after a go-back-N rewind the peer's RCV.NXT may be past
        // SND.NXT, and an ACK numbered below it would be dropped as an old duplicate —
        // both sides rewound would then ignore each other's ACKs forever.
        let repr = self.base_repr(self.snd_max);
        Some(self.emit(now, repr, 0, buffer))
    }

    fn dispatch_data(&mut self, now: Instant, buffer: &mut [u8]) -> Option<usize> {
        self.arm_persist_timer(now);
        if self.retransmit_front {
            self.retransmit_front = false;
            return Some(self.dispatch_front(now, buffer));
        }
        let len = self.next_data_len();
        let fin = self.fin_due(len);
        if len == 0 && !fin {
            if self.keepalive_probe_due {
                self.keepalive_probe_due = false;
                // A keepalive probe: one sequence number below what the peer expects,
                // so it must answer with an ACK (RFC 1122 §4.2.3.6).
                let repr = self.base_repr(self.snd_una - 1);
                return Some(self.emit(now, repr, 0, buffer));
            }
            return self.dispatch_ack_only(now, buffer);
        }
        self.probe_due = false;
        let mut repr = self.base_repr(self.snd_nxt);
        repr.fin = fin;
        repr.psh = len > 0;
        Some(self.emit(now, repr, len, buffer))
    }

    /// Retransmits one segment from `snd_una` (fast retransmit / partial ACK).
    fn dispatch_front(&mut self, now: Instant, buffer: &mut [u8]) -> usize {
        self.events.retransmits += 1;
        self.rtt_probe = None;
        // The next SACK hole if the peer reported one, otherwise the front (NewReno).
        let (start, hole_len) = match self.next_sack_hole() {
            Some((start, end)) => (start, end - start),
            None => (self.snd_una, usize::MAX),
        };
        let offset = start - self.data_start();
        let len = self
            .tx
            .len()
            .saturating_sub(offset)
            .min(self.mss())
            .min(hole_len);
        self.rexmit_next = self.rexmit_next.max(start + len);
        let mut repr = self.base_repr(start);
        repr.fin = self
            .fin_seq()
            .is_some_and(|fin| start + len == fin && self.snd_max > fin);
        repr.psh = len > 0;
        let saved_nxt = self.snd_nxt;
        let length = self.emit(now, repr, len, buffer);
        self.snd_nxt = saved_nxt.max(self.snd_nxt);
        length
    }

    /// Finishes `repr` (window, timestamps, data from the send ring at its sequence
    /// number), writes it, and advances send state.
    fn emit(
        &mut self,
        now: Instant,
        mut repr: TcpRepr<'static>,
        data_len: usize,
        buffer: &mut [u8],
    ) -> usize {
        let window = self.rcv_window_bytes();
        repr.window_len = if repr.syn {
            window.min(usize::from(u16::MAX)) as u16
        } else {
            (window >> self.rcv_shift).min(usize::from(u16::MAX)) as u16
        };
        let active_syn = repr.syn && repr.ack_number.is_none();
        if self.ts_enabled || (active_syn && self.config.timestamps) {
            repr.timestamp = Some((ts_clock(now), self.ts_recent));
        }
        if repr.syn {
            repr.sack_permitted = if active_syn {
                self.config.sack
            } else {
                self.sack_enabled
            };
        } else if self.sack_enabled && repr.ack_number.is_some() {
            self.add_sack_blocks(&mut repr, data_len);
        }
        let header_len = repr.header_len();
        assert!(
            buffer.len() >= header_len + data_len,
            "tcp dispatch buffer too short"
        );
        repr.emit_header(buffer);
        if data_len > 0 {
            let offset = repr.seq_number - self.data_start();
            let copied = self
                .tx
                .copy_out(offset, &mut buffer[header_len..header_len + data_len]);
            debug_assert_eq!(copied, data_len);
            self.events.tx_payload_bytes += data_len as u64;
        }
        let segment_len = header_len + data_len;
        tcp::fill_checksum(
            &mut buffer[..segment_len],
            self.tuple.local_addr,
            self.tuple.remote_addr,
        );
        self.after_emit(now, &repr, data_len);
        segment_len
    }

    /// Reports out-of-order ranges as SACK blocks, as many as fit in the option space and
    /// in the MTU next to `data_len` bytes of data.
    fn add_sack_blocks(&self, repr: &mut TcpRepr, data_len: usize) {
        let segment_max = MTU_BYTES - crate::wire::ipv4::HEADER_LEN_BYTES;
        let room = segment_max.saturating_sub(repr.header_len() + data_len);
        let option_room = tcp::MAX_HEADER_LEN_BYTES.saturating_sub(repr.header_len());
        let fit = (room.min(option_room).saturating_sub(4) / 8).min(tcp::MAX_SACK_BLOCKS);
        for (slot, &(start, end)) in repr
            .sack_ranges
            .iter_mut()
            .zip(self.assembler.ranges())
            .take(fit)
        {
            *slot = Some(((self.rcv_nxt + start).0, (self.rcv_nxt + end).0));
        }
    }

    fn after_emit(&mut self, now: Instant, repr: &TcpRepr, data_len: usize) {
        if repr.ack_number.is_some() {
            self.ack_pending = false;
            self.window_sent_bytes =
                usize::from(repr.window_len) << if repr.syn { 0 } else { self.rcv_shift };
        }
        if repr.rst {
            return;
        }
        let seq_len = data_len + usize::from(repr.syn) + usize::from(repr.fin);
        if seq_len == 0 {
            return;
        }
        let end = repr.seq_number + seq_len;
        if repr.seq_number < self.snd_nxt && end <= self.snd_nxt {
            // A hole retransmission below SND.NXT: only make sure the timer runs.
            if self.retransmit_at.is_none() {
                self.retransmit_at = Some(now + self.rto);
            }
            return;
        }
        if self.rtt_probe.is_none() && repr.seq_number >= self.snd_max {
            // Time only never-sent data (Karn): a retransmission's ACK is ambiguous.
            self.rtt_probe = Some((repr.seq_number, now));
        }
        self.snd_nxt = end;
        self.snd_max = self.snd_max.max(end);
        if self.retransmit_at.is_none() {
            self.retransmit_at = Some(now + self.rto);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tcp::Packet;

    const CLIENT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const SERVER_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    fn client_tuple() -> FourTuple {
        FourTuple {
            local_addr: CLIENT_ADDR,
            local_port: 50000,
            remote_addr: SERVER_ADDR,
            remote_port: 6379,
        }
    }

    fn server_tuple() -> FourTuple {
        FourTuple {
            local_addr: SERVER_ADDR,
            local_port: 6379,
            remote_addr: CLIENT_ADDR,
            remote_port: 50000,
        }
    }

    /// Everything `socket` wants to send now, as raw segments.
    fn drain(socket: &mut TcpSocket, now: Instant) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut buffer = vec![0u8; MAX_FRAME_BYTES];
        socket.handle_timers(now);
        while let Some(len) = socket.dispatch(now, &mut buffer) {
            out.push(buffer[..len].to_vec());
            assert!(out.len() < 10_000, "dispatch never stops");
        }
        out
    }

    fn parse(segment: &[u8], from: FourTuple) -> TcpRepr<'_> {
        TcpRepr::parse(
            &Packet::new_checked(segment).unwrap(),
            from.local_addr,
            from.remote_addr,
        )
        .unwrap()
    }

    fn deliver(to: &mut TcpSocket, now: Instant, segment: &[u8]) -> Verdict {
        let from = FourTuple {
            local_addr: to.tuple.remote_addr,
            local_port: to.tuple.remote_port,
            remote_addr: to.tuple.local_addr,
            remote_port: to.tuple.local_port,
        };
        to.process(now, &parse(segment, from))
    }

    fn handshake(config: TcpConfig, client_iss: u32, server_iss: u32) -> (TcpSocket, TcpSocket) {
        let now = Instant::from_millis(10);
        let mut client = TcpSocket::connect(config, client_tuple(), SeqNumber(client_iss));
        let syn = drain(&mut client, now).remove(0);
        let syn_repr = parse(&syn, client_tuple());
        let mut server = TcpSocket::accept_syn(
            config,
            server_tuple(),
            SeqNumber(server_iss),
            &syn_repr,
            now,
        );
        let syn_ack = drain(&mut server, now).remove(0);
        assert_eq!(deliver(&mut client, now, &syn_ack), Verdict::Done);
        for segment in drain(&mut client, now) {
            deliver(&mut server, now, &segment);
        }
        assert_eq!(
            (client.state(), server.state()),
            (State::Established, State::Established)
        );
        (client, server)
    }

    fn queue(socket: &mut TcpSocket, data: &[u8]) {
        let mut written = 0;
        while written < data.len() {
            let count = socket.send(|buf| {
                let count = buf.len().min(data.len() - written);
                buf[..count].copy_from_slice(&data[written..written + count]);
                count
            });
            assert!(count > 0, "send buffer full");
            written += count;
        }
    }

    fn read_all(socket: &mut TcpSocket) -> Vec<u8> {
        let mut out = Vec::new();
        while socket.recv(|data| {
            out.extend_from_slice(data);
            data.len()
        }) > 0
        {}
        out
    }

    // Proves data crosses the 2^32 sequence wrap intact in both sequence spaces.
    #[test]
    fn transfer_across_sequence_wrap() {
        let (mut client, mut server) =
            handshake(TcpConfig::default(), u32::MAX - 1000, u32::MAX - 10);
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7) as u8).collect();
        queue(&mut client, &data);
        let now = Instant::from_millis(20);
        for _ in 0..20 {
            for segment in drain(&mut client, now) {
                deliver(&mut server, now, &segment);
            }
            for segment in drain(&mut server, now) {
                deliver(&mut client, now, &segment);
            }
        }
        assert_eq!(read_all(&mut server), data);
        assert!(client.snd_una.0 < 100_000, "sequence space wrapped");
        assert_eq!(client.send_queue_bytes(), 0, "everything acknowledged");
    }

    // Proves out-of-order segments are held and delivered in order once the hole fills.
    #[test]
    fn out_of_order_segments_reassemble() {
        let (mut client, mut server) = handshake(TcpConfig::default(), 1000, 2000);
        let data: Vec<u8> = (0..4000u32).map(|i| (i % 251) as u8).collect();
        queue(&mut client, &data);
        let now = Instant::from_millis(20);
        let segments = drain(&mut client, now);
        assert!(segments.len() >= 3);
        for segment in segments.iter().rev() {
            deliver(&mut server, now, segment);
        }
        assert_eq!(read_all(&mut server), data);
    }

    // Proves RFC 5961: an in-window RST with the wrong sequence number only draws a
    // challenge ACK, an out-of-window one is ignored, and an exact one resets.
    #[test]
    fn reset_acceptance_follows_rfc5961() {
        let (mut client, mut server) = handshake(TcpConfig::default(), 1000, 2000);
        let now = Instant::from_millis(20);
        let mut reset = TcpRepr::new(6379, 50000, server.snd_nxt + 100);
        reset.rst = true;
        let mut buffer = vec![0u8; 64];
        reset.emit(&mut buffer, SERVER_ADDR, CLIENT_ADDR);
        let len = reset.buffer_len();
        deliver(&mut client, now, &buffer[..len]);
        assert_eq!(client.state(), State::Established);
        let challenge = drain(&mut client, now);
        assert_eq!(challenge.len(), 1, "one challenge ACK");
        assert_eq!(
            parse(&challenge[0], client_tuple()).ack_number,
            Some(client.rcv_nxt)
        );
        assert_eq!(client.take_events().challenge_acks, 1);
        deliver(&mut client, now, &buffer[..len]);
        assert!(
            drain(&mut client, now).is_empty(),
            "a second challenge within 500 ms is suppressed"
        );
        let now = now + INVALID_ACK_INTERVAL;

        reset.seq_number = server.snd_nxt + 10_000_000;
        reset.emit(&mut buffer, SERVER_ADDR, CLIENT_ADDR);
        deliver(&mut client, now, &buffer[..len]);
        assert!(
            drain(&mut client, now).is_empty(),
            "out-of-window RST is silently dropped"
        );

        reset.seq_number = server.snd_nxt;
        reset.emit(&mut buffer, SERVER_ADDR, CLIENT_ADDR);
        deliver(&mut client, now, &buffer[..len]);
        assert_eq!(client.state(), State::Closed);
        assert_eq!(client.close_reason(), CloseReason::ResetByPeer);
        server.abort();
    }

    // Proves a SYN on an established connection draws a challenge ACK, not a reset.
    #[test]
    fn syn_on_established_gets_challenge_ack() {
        let (mut client, _server) = handshake(TcpConfig::default(), 1000, 2000);
        let now = Instant::from_millis(20);
        let mut syn = TcpRepr::new(6379, 50000, client.rcv_nxt);
        syn.syn = true;
        let mut buffer = vec![0u8; 64];
        syn.emit(&mut buffer, SERVER_ADDR, CLIENT_ADDR);
        assert_eq!(
            deliver(&mut client, now, &buffer[..syn.buffer_len()]),
            Verdict::Done
        );
        assert_eq!(client.state(), State::Established);
        assert_eq!(drain(&mut client, now).len(), 1);
    }

    // Proves three duplicate ACKs retransmit the missing segment before any timeout and
    // halve the congestion window (NewReno).
    #[test]
    fn three_dup_acks_trigger_fast_retransmit() {
        let (mut client, mut server) = handshake(TcpConfig::default(), 1000, 2000);
        let now = Instant::from_millis(20);
        queue(&mut client, &vec![7u8; 6 * 1400]);
        let segments = drain(&mut client, now);
        assert!(segments.len() >= 5);
        let lost_seq = parse(&segments[0], client_tuple()).seq_number;
        let cwnd_before = client.cwnd_bytes();
        let mut dup_acks = Vec::new();
        for segment in &segments[1..] {
            deliver(&mut server, now, segment);
            dup_acks.extend(drain(&mut server, now));
        }
        assert!(dup_acks.len() >= 3);
        for ack in &dup_acks {
            deliver(&mut client, now, ack);
        }
        let resent = drain(&mut client, now);
        assert_eq!(parse(&resent[0], client_tuple()).seq_number, lost_seq);
        assert_eq!(client.take_events().fast_retransmits, 1);
        assert!(client.cwnd_bytes() < cwnd_before);
        deliver(&mut server, now, &resent[0]);
        assert_eq!(read_all(&mut server).len(), 6 * 1400);
    }

    // Proves SACK-based recovery: with two segments lost in one window, the second
    // hole is retransmitted on the next duplicate ACK, before any partial ACK or timeout.
    #[test]
    fn sack_recovery_fills_second_hole_early() {
        let (mut client, mut server) = handshake(TcpConfig::default(), 1000, 2000);
        let now = Instant::from_millis(20);
        queue(&mut client, &[3u8; 8 * 1400]);
        let segments = drain(&mut client, now);
        assert!(segments.len() >= 7);
        let seq_of = |segment: &Vec<u8>| parse(segment, client_tuple()).seq_number;
        let (lost_first, lost_second) = (seq_of(&segments[0]), seq_of(&segments[2]));
        let mut acks = Vec::new();
        for (index, segment) in segments.iter().enumerate() {
            if index != 0 && index != 2 {
                deliver(&mut server, now, segment);
                acks.extend(drain(&mut server, now));
            }
        }
        let mut resent = Vec::new();
        for ack in &acks {
            deliver(&mut client, now, ack);
            resent.extend(drain(&mut client, now).iter().map(seq_of));
        }
        assert_eq!(
            &resent[..2],
            &[lost_first, lost_second],
            "both holes, in order"
        );
        assert_eq!(client.take_events().rto_expirations, 0);
    }

    // Proves the RTO estimator follows RFC 6298: first sample R gives RTO = 3R, later
    // samples smooth with alpha 1/8 and beta 1/4, and the result is clamped to RTO_MIN.
    #[test]
    fn rto_estimator_follows_rfc6298() {
        let mut socket = TcpSocket::connect(TcpConfig::default(), client_tuple(), SeqNumber(1));
        socket.update_rto(Duration::from_millis(100));
        assert_eq!(socket.rto(), Duration::from_millis(300));
        socket.update_rto(Duration::from_millis(200));
        // srtt = 7/8·100 + 1/8·200 = 112.5 ms; rttvar = 3/4·50 + 1/4·100 = 62.5 ms.
        assert_eq!(socket.rto(), Duration::from_micros(112_500 + 4 * 62_500));
        for _ in 0..100 {
            socket.update_rto(Duration::from_millis(1));
        }
        assert_eq!(socket.rto(), RTO_MIN);
    }

    // Proves window scaling is negotiated from the buffer size and applied to windows.
    #[test]
    fn window_scale_negotiated_and_applied() {
        let config = TcpConfig {
            rx_buffer_bytes: 1 << 20,
            ..TcpConfig::default()
        };
        let (mut client, server) = handshake(config, 1000, 2000);
        assert_eq!((client.rcv_shift, server.snd_shift), (5, 5));
        assert_eq!(server.snd_wnd_bytes, 1 << 20);
        client.ack_pending = true;
        let ack = drain(&mut client, Instant::from_millis(30)).remove(0);
        assert_eq!(
            parse(&ack, client_tuple()).window_len,
            ((1 << 20) >> 5) as u16
        );
        let plain = TcpConfig {
            window_scaling: false,
            ..config
        };
        let (client, _) = handshake(plain, 1000, 2000);
        assert_eq!((client.rcv_shift, client.snd_shift), (0, 0));
    }

    // Proves two sides that both rewound after a timeout still accept each other's
    // ACKs (ACKs carry SND.MAX), instead of dropping them as old duplicates forever.
    #[test]
    fn both_sides_rewound_still_make_progress() {
        let (mut client, mut server) = handshake(TcpConfig::default(), 1000, 2000);
        let mut now = Instant::from_millis(20);
        queue(&mut client, &[1u8; 3000]);
        queue(&mut server, &[2u8; 3000]);
        let from_client = drain(&mut client, now);
        let from_server = drain(&mut server, now);
        for segment in &from_client {
            deliver(&mut server, now, segment);
        }
        for segment in &from_server {
            deliver(&mut client, now, segment);
        }
        // Every ACK the two sides would send now is lost.
        drain(&mut client, now);
        drain(&mut server, now);
        now += Duration::from_secs(2);
        for _ in 0..3 {
            let resent_by_client = drain(&mut client, now);
            let resent_by_server = drain(&mut server, now);
            for segment in &resent_by_client {
                deliver(&mut server, now, segment);
            }
            for segment in &resent_by_server {
                deliver(&mut client, now, segment);
            }
        }
        assert_eq!(
            (client.send_queue_bytes(), server.send_queue_bytes()),
            (0, 0)
        );
        assert_eq!(
            (read_all(&mut client).len(), read_all(&mut server).len()),
            (3000, 3000)
        );
    }

    // Proves data queued after the peer closed its window still gets a persist timer,
    // so a lost window update cannot deadlock the connection.
    #[test]
    fn persist_timer_armed_for_data_queued_after_zero_window() {
        let config = TcpConfig {
            rx_buffer_bytes: 2048,
            ..TcpConfig::default()
        };
        let (mut client, mut server) = handshake(config, 1000, 2000);
        let mut now = Instant::from_millis(20);
        queue(&mut client, &[5u8; 2048]);
        for segment in drain(&mut client, now) {
            deliver(&mut server, now, &segment);
        }
        for segment in drain(&mut server, now) {
            deliver(&mut client, now, &segment);
        }
        assert_eq!((client.send_queue_bytes(), client.snd_wnd_bytes), (0, 0));
        queue(&mut client, &[6u8; 100]);
        assert!(
            drain(&mut client, now).is_empty(),
            "window closed: nothing may go out"
        );
        assert_eq!(read_all(&mut server).len(), 2048);
        drain(&mut server, now); // the window update is lost
        now += Duration::from_secs(2);
        let probe = drain(&mut client, now);
        assert_eq!(probe.len(), 1);
        assert_eq!(parse(&probe[0], client_tuple()).payload.len(), 1);
        deliver(&mut server, now, &probe[0]);
        for _ in 0..3 {
            for segment in drain(&mut client, now) {
                deliver(&mut server, now, &segment);
            }
            for segment in drain(&mut server, now) {
                deliver(&mut client, now, &segment);
            }
        }
        assert_eq!(read_all(&mut server), vec![6u8; 100]);
    }

    // Proves out-of-order data is reported in SACK blocks (sequence numbers of the held
    // ranges) once SACK is negotiated, and never when either side disables it.
    #[test]
    fn out_of_order_data_is_sacked() {
        let (mut client, mut server) = handshake(TcpConfig::default(), 1000, 2000);
        assert!(client.sack_enabled && server.sack_enabled);
        let now = Instant::from_millis(20);
        queue(&mut client, &[9u8; 5000]);
        let segments = drain(&mut client, now);
        let ranges: Vec<(u32, u32)> = segments
            .iter()
            .map(|segment| {
                let repr = parse(segment, client_tuple());
                (repr.seq_number.0, (repr.seq_number + repr.payload.len()).0)
            })
            .collect();
        deliver(&mut server, now, &segments[1]);
        deliver(&mut server, now, &segments[3]);
        let acks = drain(&mut server, now);
        let last = parse(acks.last().unwrap(), server_tuple());
        assert_eq!(last.sack_ranges, [Some(ranges[1]), Some(ranges[3]), None]);
        assert_eq!(last.ack_number, Some(SeqNumber(ranges[0].0)));

        let no_sack = TcpConfig {
            sack: false,
            ..TcpConfig::default()
        };
        let mut client = TcpSocket::connect(no_sack, client_tuple(), SeqNumber(1000));
        let syn = drain(&mut client, now).remove(0);
        assert!(!parse(&syn, client_tuple()).sack_permitted);
        let server = TcpSocket::accept_syn(
            TcpConfig::default(),
            server_tuple(),
            SeqNumber(7),
            &parse(&syn, client_tuple()),
            now,
        );
        assert!(!server.sack_enabled);
    }

    // Proves a simultaneous close passes through CLOSING to TIME-WAIT on both sides, and
    // that TIME-WAIT ignores RSTs (RFC 1337).
    #[test]
    fn simultaneous_close_reaches_time_wait() {
        let (mut client, mut server) = handshake(TcpConfig::default(), 1000, 2000);
        let now = Instant::from_millis(20);
        client.close();
        server.close();
        let client_fin = drain(&mut client, now);
        let server_fin = drain(&mut server, now);
        for segment in &server_fin {
            deliver(&mut client, now, segment);
        }
        for segment in &client_fin {
            deliver(&mut server, now, segment);
        }
        assert_eq!(
            (client.state(), server.state()),
            (State::Closing, State::Closing)
        );
        let client_ack = drain(&mut client, now);
        let server_ack = drain(&mut server, now);
        for segment in &client_ack {
            deliver(&mut server, now, segment);
        }
        for segment in &server_ack {
            deliver(&mut client, now, segment);
        }
        assert_eq!(
            (client.state(), server.state()),
            (State::TimeWait, State::TimeWait)
        );
        // RFC 1337: even an exactly in-sequence RST leaves TIME-WAIT alone.
        let mut reset = TcpRepr::new(6379, 50000, client.rcv_nxt);
        reset.rst = true;
        let mut buffer = vec![0u8; 64];
        reset.emit(&mut buffer, SERVER_ADDR, CLIENT_ADDR);
        deliver(&mut client, now, &buffer[..reset.buffer_len()]);
        assert_eq!(client.state(), State::TimeWait);
    }
}
