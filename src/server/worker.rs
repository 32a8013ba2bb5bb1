//! The worker loop. See the module essay in `mod.rs`.

use super::conn::{Conn, Slot, Transport};
use super::reads::{plan, restartable, with_lent_in, BatchReads, Parked, ReadDest, ReadIo, Reads};
use super::{now_ms, ClientEntry, ConnToken, Msg, Shared};
use crate::commands::table::key_positions;
use crate::commands::{lookup, CommandSpec, Ctx, Kind, ShardSet};
use crate::resp::{parse_command, ParsedCommand, Proto, ReplyBuf};
use crate::runtime::bufring::{BufRing, RECV_GROUP_ID};
use crate::runtime::ring::push_sqe;
use crate::runtime::{split_user_data, user_data, OpKind};
use crate::storage::prefetch::RecordRead;
use crate::storage::{FsyncPolicy, Shard, StorageError};
use io_uring::{cqueue, opcode, types, IoUring};
use std::collections::HashMap;
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

// Appliance networking: the DPDK port and the userspace TCP stack, driven from this loop
// through small hooks (`dpdk_receive`, `dpdk_send`, `dpdk_wait`, the close in `begin_close`).
// A child module so it can use the worker's connection table and helpers directly.
#[cfg(feature = "dpdk")]
#[path = "dpdk.rs"]
mod dpdk;

// Group commit: flush epochs on the worker's ring, held replies. A child module so it can
// use the worker's fields directly.
#[path = "commit.rs"]
mod commit;
use commit::GroupCommit;

// Transactions (MULTI/EXEC/WATCH): a child module for the same reason as `commit`.
#[path = "txn.rs"]
pub(crate) mod txn;

// Pub/Sub and keyspace-notification delivery. A child module so it can reach the
// worker's connections and outbox directly.
#[path = "pubsub.rs"]
pub mod pubsub;
// Client-side caching (CLIENT TRACKING): a child module for the same reason.
#[path = "tracking.rs"]
pub mod tracking;
#[cfg(feature = "dpdk")]
pub use dpdk::DpdkNet;

/// Ring size: submissions per round before we must submit early.
const RING_ENTRIES: u32 = 4096;
/// Provided receive buffers per worker and their size (8 MiB in all).
const RECV_BUFFERS: u16 = 512;
const RECV_BUFFER_BYTES: usize = 16 * 1024;
/// Commands a connection may have waiting on other workers before we stop
/// reading its pipeline (back-pressure instead of unbounded queues).
const PENDING_REPLIES_MAX: usize = 1024;
/// Unsent reply bytes above which a connection's input is not parsed until
/// the client reads (a slow reader cannot make us buffer without bound).
const OUTPUT_HIGH_WATER_BYTES: usize = 64 << 20;
/// A closed connection whose buffers held this much gives the freed memory back to the
/// kernel at once (RSS returns after a slow reader leaves).
const TRIM_AFTER_CLOSE_BYTES: usize = 1 << 20;
/// A command whose reply reached this many bytes trims the heap after it (the value it
/// built to answer is freed; issue 13, RSS under load).
const TRIM_AFTER_REPLY_BYTES: usize = 8 << 20;
/// Active expiry's time per loop round while any held shard has due keys:
/// max(`EXPIRY_MIN_US`, `EXPIRY_ROUND_PERCENT` % of the round's foreground time), shared by
/// the shards with due keys (`docs/storage.md` "Active expiry"). While keys are due the
/// worker does not park between rounds, so on an otherwise idle worker expiry runs
/// continuously in 250 µs slices, and under load it takes a quarter of the round.
const EXPIRY_MIN_US: u64 = 250;
const EXPIRY_ROUND_PERCENT: u64 = 25;
/// Arguments of a command kept on the stack while it runs; longer lists use the heap.
const ARGS_INLINE: usize = 8;
/// Data files registered with the ring (reads, chunk writes and syncs name them by
/// index: no file lookup and reference count per operation); more use plain fds.
const FIXED_FILES_MAX: u32 = 16;
/// While this worker waits for shards (lent out, or asked of a worker running a script),
/// how often it checks for a script past `busy-reply-threshold` and serves a busy round.
const BUSY_WAIT_SLICE: Duration = Duration::from_millis(1);

/// EVAL, EVALSHA, their `_RO` forms, FCALL and FCALL_RO: the commands that run a script
/// (a busy round may run from their instruction hook). Two compares for other commands.
fn is_script(spec: &CommandSpec) -> bool {
    spec.movable.is_some() && spec.group == "scripting"
}

/// The order of one remote connection's requests on this worker (see `remote_request`):
/// its parked commands, and requests that must wait for them.
#[derive(Default)]
struct RemoteOrder {
    parked: u32,
    parked_writes: u32,
    queue: VecDeque<RemoteRequest>,
}

struct RemoteRequest {
    seq: u64,
    db: u8,
    proto: Proto,
    args: Vec<Vec<u8>>,
    caller: crate::runtime::tracking::Caller,
    script_caller: Option<Arc<crate::acl::ScriptCaller>>,
}

/// What `start_keyed` decided for a keyed command.
enum Start {
    /// Every record it needs is in memory: run it now.
    RunNow,
    /// Some of its shards are borrowed (a coordinated pass): fetch its records on the
    /// batch ring, then run it.
    Borrowed,
    /// Parked for device reads; `writes` when it is a write command.
    Parked { writes: bool },
}

pub enum Outcome {
    Done,
    /// Needs other workers' shards: not consumed; the connection is
    /// deferred to this round's coordinated pass.
    Retry,
    /// Must wait for this connection's replies from other workers first (so
    /// a coordinated command cannot overtake an earlier remote one): not
    /// consumed; the connection resumes when those replies arrive.
    Blocked,
}

/// Runs a connection or server command (`Kind::Local`: PING, INFO, CONFIG, ...). The
/// server wires in `server::local::run`; the loop itself knows none of those commands.
pub type ConnectionCommand =
    fn(&mut Worker, &mut Conn, u32, &CommandSpec, &[&[u8]], u64) -> Outcome;

pub struct Worker {
    pub id: usize,
    run_connection_command: ConnectionCommand,
    pub shared: Arc<Shared>,
    // Field order matters: the ring must be dropped before the buffer ring
    // memory it references.
    ring: IoUring,
    bufring: BufRing,
    pub shards: ShardSet,
    /// Boxed: `run_slot` takes a connection out of its slot and puts it back for every
    /// batch of commands, which moves a pointer instead of the whole `Conn`.
    conns: Vec<Option<Box<Conn>>>,
    free_slots: Vec<u32>,
    next_gen: u32,
    listeners: Vec<OwnedFd>,
    mailbox: mpsc::Receiver<Msg>,
    /// A message taken from the mailbox by `mailbox_waiting` (a look before parking or
    /// while busy-polling); `drain_mailbox` handles it first.
    mailbox_next: Option<Msg>,
    wake_buf: Box<u64>,
    /// `--busy-poll-us`, or 0 when the workers outnumber the CPUs they may run on (a
    /// worker spinning would only hold off the one that has work; see `wait`).
    busy_poll_us: u64,
    /// This round's cross-worker counters, added to `Stats` once per round.
    round_hops: u64,
    round_signals: u64,
    round_signals_skipped: u64,
    round_parks: u64,
    ready: Vec<u32>,
    /// Connections stopped at a command that needs other workers' shards;
    /// served together, once per round, while those shards are lent to us.
    deferred: Vec<u32>,
    retry_pending: bool,
    /// Some shard still had keys due to expire after the last round's background work.
    expiry_backlog: bool,
    outbox: Vec<Vec<Msg>>,
    parsed: ParsedCommand,
    pub fsync: FsyncPolicy,
    pub max_bulk: usize,
    query_limit: usize,
    commands_this_round: u64,
    cqes: Vec<(u64, i32, u32)>,
    /// Commands parked for device reads, and the reads (declared after `ring`, so
    /// dropped after it: the ring may have their buffers registered).
    reads: Reads,
    /// The coordinator's ring for reads of borrowed shards (made on first use).
    batch: Option<BatchReads>,
    /// Parked commands whose reads are done, to run this round.
    ready_parked: Vec<Parked>,
    /// Per remote connection (worker, token): order of its requests parked here.
    remote_order: HashMap<(usize, u64), RemoteOrder>,
    /// Data file descriptors registered with the ring, by index.
    fixed_files: Vec<RawFd>,
    /// A command that writes ran this round (see `flush_storage`).
    round_writes: bool,
    last_background_flush_ms: u64,
    commit: GroupCommit,
    /// The epoch this round's replies need durable before they leave (nothing
    /// to wait for when it is `<= commit.durable`).
    round_need: u64,
    /// Replies to other workers' clients waiting for an epoch, in order.
    held_replies: VecDeque<(u64, usize, Msg)>,
    /// Some connection has replies in `held` (see `gate_replies`).
    any_held: bool,
    /// Completed syncs held back by `--debug-sync-delay-ms`: (due, epoch, result).
    delayed_syncs: VecDeque<(Instant, u64, i32)>,
    /// `with_workers` could not make borrowed shards durable (see `run_slot`).
    coordinated_flush_failed: bool,
    /// Why storing the coalesced lists failed (`store_coalesced`): the next group-commit
    /// epoch carries it, so with `always` the replies that wait for that epoch (those of
    /// the pushes and pops whose state was lost among them) are errors, not `+OK`.
    coalesce_error: Option<String>,
    /// The normal class's `client-output-buffer-limit`, read with the slow-log threshold.
    output_limit: crate::config::output_limits::ClassLimit,
    /// The pubsub class's limit, for connections with subscriptions.
    output_limit_pubsub: crate::config::output_limits::ClassLimit,
    /// What this worker last added to `Stats::mem_clients_normal`.
    reported_client_bytes: u64,
    /// The round clock (ms) of the last pass of `enforce_output_limits`: the pass visits
    /// every connection, so it runs once per millisecond, not once per round (a loaded
    /// worker with 200 connections runs several rounds per millisecond).
    output_limits_ms: Option<u64>,
    /// `slowlog-log-slower-than` as of this round (negative: off), read from the runtime
    /// configuration once per round and after each connection/server command (CONFIG
    /// SET is one) rather than under its lock for every command.
    slowlog_threshold_us: i64,
    /// What `shards` becomes while a script runs (the script owns the real set, see
    /// `with_script_shards`): the same size, no shard. Kept to swap in without allocating.
    spare_shards: ShardSet,
    /// Nesting of busy rounds (`busy_round`): while above 0, `dispatch` runs only what
    /// Redis allows during a busy script and holds the rest back.
    busy_depth: u32,
    /// Connections a busy round stopped at a command that must wait for the script;
    /// marked ready when it has ended.
    busy_blocked: Vec<u32>,
    /// Completions a busy round took from the ring but may not handle while the script
    /// owns the shards (device reads, syncs, chunk writes) or whose connection is the
    /// script's own (out of its slot): handled first by the next `reap`, in order.
    stashed_cqes: Vec<(u64, i32, u32)>,
    /// The DPDK port and TCP stack this worker drives (`--network=dpdk`, worker 0).
    #[cfg(feature = "dpdk")]
    dpdk: Option<DpdkNet>,
}

impl Worker {
    pub fn new(
        id: usize,
        shared: Arc<Shared>,
        shards: ShardSet,
        listeners: Vec<OwnedFd>,
        mailbox: mpsc::Receiver<Msg>,
        run_connection_command: ConnectionCommand,
    ) -> std::io::Result<Worker> {
        // Completions posted from other CPUs (softirq for received bytes, the disk's
        // interrupt for reads) would each send this CPU an inter-processor interrupt to
        // run io_uring's task work at once; in a VM those IPIs cost more than the work.
        // Deferred task work runs it only when we enter the ring to collect completions
        // (needs Linux 6.1; the ring is used by this thread only).
        let ring = IoUring::builder()
            .setup_cqsize(RING_ENTRIES * 4)
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_taskrun_flag()
            .build(RING_ENTRIES)
            .or_else(|_| {
                IoUring::builder()
                    .setup_cqsize(RING_ENTRIES * 4)
                    .build(RING_ENTRIES)
            })?;
        let bufring = BufRing::new(&ring, RECV_BUFFERS, RECV_BUFFER_BYTES)?;
        let reads = Reads::new(&ring, shared.settings.cli.debug_read_delay_ms);
        let workers = shared.workers.len();
        let spare_shards = shards.empty_like();
        let busy_poll_us = busy_poll_us(&shared.settings);
        let mut w = Worker {
            id,
            run_connection_command,
            fsync: shared.settings.appendfsync,
            max_bulk: shared.settings.proto_max_bulk_len_bytes,
            query_limit: shared.settings.client_query_buffer_limit_bytes,
            shared,
            ring,
            bufring,
            shards,
            conns: Vec::new(),
            free_slots: Vec::new(),
            next_gen: 1,
            listeners,
            mailbox,
            mailbox_next: None,
            wake_buf: Box::new(0),
            busy_poll_us,
            round_hops: 0,
            round_signals: 0,
            round_signals_skipped: 0,
            round_parks: 0,
            ready: Vec::new(),
            deferred: Vec::new(),
            retry_pending: false,
            expiry_backlog: false,
            outbox: (0..workers).map(|_| Vec::new()).collect(),
            parsed: ParsedCommand::default(),
            commands_this_round: 0,
            cqes: Vec::with_capacity(1024),
            reads,
            ready_parked: Vec::new(),
            batch: None,
            remote_order: HashMap::new(),
            fixed_files: Vec::new(),
            round_writes: false,
            last_background_flush_ms: 0,
            commit: GroupCommit::default(),
            round_need: 0,
            held_replies: VecDeque::new(),
            any_held: false,
            delayed_syncs: VecDeque::new(),
            coordinated_flush_failed: false,
            coalesce_error: None,
            slowlog_threshold_us: 0,
            output_limit: Default::default(),
            output_limit_pubsub: Default::default(),
            reported_client_bytes: 0,
            output_limits_ms: None,
            spare_shards,
            busy_depth: 0,
            busy_blocked: Vec::new(),
            stashed_cqes: Vec::new(),
            #[cfg(feature = "dpdk")]
            dpdk: None,
        };
        if let Err(e) = w.ring.submitter().register_files_sparse(FIXED_FILES_MAX) {
            tracing::warn!(
                "worker {}: no registered files ({e}); using plain descriptors",
                w.id
            );
        }
        w.register_shard_files();
        Ok(w)
    }

    /// This worker's shards' share of `--cache-size` each.
    pub fn cache_bytes_per_shard(&self) -> usize {
        let total = self.shared.cache_size_bytes.load(Ordering::Relaxed);
        (total / u64::from(self.shards.shard_count.max(1))) as usize
    }

    /// Registers the data files of the shards we hold (at start, and when recovery
    /// hands shards over); files already registered are skipped.
    fn register_shard_files(&mut self) {
        let mut fds: Vec<RawFd> = Vec::new();
        if let Some(shard) = self.shards.slots.iter().flatten().next() {
            self.reads.set_devices(shard.devices());
        }
        for shard in self.shards.slots.iter().flatten() {
            for fd in shard.device_fds() {
                if !fds.contains(&fd) {
                    fds.push(fd);
                }
            }
        }
        for fd in fds {
            if self.fixed_files.contains(&fd) || self.fixed_files.len() >= FIXED_FILES_MAX as usize
            {
                continue;
            }
            let slot = self.fixed_files.len() as u32;
            match self.ring.submitter().register_files_update(slot, &[fd]) {
                Ok(_) => self.fixed_files.push(fd),
                Err(e) => {
                    tracing::warn!("worker {}: data file not registered ({e})", self.id);
                    return;
                }
            }
        }
    }

    pub fn run(mut self) {
        crate::scripting::install_catalog(self.shared.scripts.clone());
        pubsub::install(self.shared.clone());
        super::cmdstats::install(self.shared.cmdstats.clone(), self.id);
        for i in 0..self.listeners.len() {
            self.arm_accept(i);
        }
        self.arm_wake();
        loop {
            let now = now_ms();
            self.fsync = super::fsync_from_u8(self.shared.fsync_policy.load(Ordering::Relaxed));
            self.refresh_slowlog_threshold();
            self.reap(now);
            self.poll_device_reads(now);
            if !self.delayed_syncs.is_empty() {
                self.release_delayed_syncs(now);
            }
            if self.reads.has_delayed() {
                self.release_delayed_reads(now);
            }
            #[cfg(feature = "dpdk")]
            self.dpdk_receive(now);
            let round_start = Instant::now();
            self.drain_mailbox(now);
            self.process_ready(now, round_start);
            self.deliver_blocked(now_ms());
            self.publish_keyspace_events();
            self.deliver_tracking();
            self.flush_storage(now);
            self.send_outbox();
            self.enforce_output_limits(now);
            self.submit_sends();
            let foreground_us = round_start.elapsed().as_micros() as u64;
            self.background(now, foreground_us);
            if self.commands_this_round > 0 {
                self.shared
                    .stats
                    .total_commands
                    .fetch_add(self.commands_this_round, Ordering::Relaxed);
                self.commands_this_round = 0;
            }
            self.publish_hop_counts();
            if self.shared.shutdown.load(Ordering::SeqCst) {
                break;
            }
            self.wait();
        }
        self.finish();
    }

    /// Stores the lists pushes and pops coalesced (`docs/collections.md` section 5a):
    /// once a round before the group commit takes the round's records, before a lend or
    /// a coordinated pass, before a connection command, and at shutdown.
    pub(super) fn store_coalesced(&mut self, now: u64) {
        if let Err(e) = crate::commands::collection::store_all_coalesced(&mut self.shards, now) {
            tracing::error!("storing coalesced lists failed: {e}");
            self.shared
                .stats
                .flush_failures
                .fetch_add(1, Ordering::Relaxed);
            self.coalesce_error.get_or_insert(e.to_string());
        }
    }

    fn finish(mut self) {
        self.store_coalesced(now_ms());
        // Stop listening now: the ring's multishot accepts keep the sockets open until
        // the ring is torn down, which the kernel finishes after we exit; a listening
        // socket that lingers would take new connections (reset later) and keep the port
        // from a restarted server.
        for l in &self.listeners {
            // SAFETY: plain syscall on a socket we own.
            unsafe { libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR) };
        }
        // Device reads in flight write into buffers we own: wait for them.
        // So do chunk writes, from staging buffers the shards are about to free: no
        // deadline for those (a write always completes, if only with an error).
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.commit.writes_inflight > 0
            || ((self.reads.inflight() > 0 || !self.commit.inflight.is_empty())
                && Instant::now() < deadline)
        {
            if self.reads.device_inflight() > 0 {
                // Reads on the NVMe queue: polled, not waited for in the ring.
                let _ = self.ring.submit();
                std::thread::yield_now();
                self.poll_device_reads(now_ms());
                self.release_delayed_reads(now_ms());
            } else if self.delayed_syncs.is_empty() && !self.reads.has_delayed() {
                let _ = self.ring.submit_and_wait(1);
            } else {
                let _ = self.ring.submit();
                std::thread::sleep(Duration::from_millis(1));
                self.release_delayed_syncs(now_ms());
                self.release_delayed_reads(now_ms());
            }
            self.reap(now_ms());
        }
        // Serve lend requests already queued so a coordinator never waits on
        // a worker that is gone.
        self.drain_mailbox(now_ms());
        let checkpoint = self.shared.shutdown_checkpoint.load(Ordering::SeqCst);
        for slot in self.shards.slots.iter_mut() {
            if let Some(shard) = slot.take() {
                let id = shard.id();
                if let Err(e) = shard.shutdown(checkpoint) {
                    tracing::error!("worker {}: shard {id} shutdown failed: {e}", self.id);
                }
            }
        }
        tracing::info!("worker {} stopped", self.id);
    }

    // ----- ring plumbing -------------------------------------------------

    fn arm_accept(&mut self, i: usize) {
        let fd = self.listeners[i].as_raw_fd();
        let sqe = opcode::AcceptMulti::new(types::Fd(fd))
            .build()
            .user_data(user_data(OpKind::Accept, i as u64));
        push_sqe(&mut self.ring, &sqe);
    }

    fn arm_wake(&mut self) {
        let fd = self.shared.workers[self.id].wake.as_raw_fd();
        let ptr = &mut *self.wake_buf as *mut u64 as *mut u8;
        let sqe = opcode::Read::new(types::Fd(fd), ptr, 8)
            .build()
            .user_data(user_data(OpKind::Wake, 0));
        push_sqe(&mut self.ring, &sqe);
    }

    fn arm_recv(&mut self, slot: u32) {
        let Some(conn) = self.conns[slot as usize].as_mut() else {
            return;
        };
        if conn.recv_armed || conn.closing {
            return;
        }
        let Some(fd) = conn.fd.kernel_fd() else {
            return;
        };
        conn.recv_armed = true;
        conn.ops_inflight += 1;
        let token = ((conn.gen as u64) << 32) | slot as u64;
        let sqe = opcode::RecvMulti::new(types::Fd(fd), RECV_GROUP_ID)
            .build()
            .user_data(user_data(OpKind::Recv, token));
        push_sqe(&mut self.ring, &sqe);
    }

    fn conn_mut(&mut self, token: u64) -> Option<&mut Conn> {
        let (slot, gen) = ((token & 0xffff_ffff) as usize, (token >> 32) as u32);
        self.conns
            .get_mut(slot)?
            .as_deref_mut()
            .filter(|c| c.gen == gen)
    }

    fn mark_ready(&mut self, slot: u32) {
        if let Some(c) = self.conns[slot as usize].as_mut() {
            if !c.in_ready {
                c.in_ready = true;
                self.ready.push(slot);
            }
        }
    }

    fn reap(&mut self, now: u64) {
        if !self.stashed_cqes.is_empty() {
            for (ud, res, flags) in std::mem::take(&mut self.stashed_cqes) {
                self.on_cqe(ud, res, flags, now);
            }
        }
        let mut cqes = std::mem::take(&mut self.cqes);
        cqes.clear();
        for cqe in self.ring.completion() {
            cqes.push((cqe.user_data(), cqe.result(), cqe.flags()));
        }
        for &(ud, res, flags) in &cqes {
            self.on_cqe(ud, res, flags, now);
        }
        self.cqes = cqes;
    }

    fn on_cqe(&mut self, ud: u64, res: i32, flags: u32, now: u64) {
        let (kind, token) = split_user_data(ud);
        match kind {
            k if k == OpKind::Accept as u8 => self.on_accept(token as usize, res, flags, now),
            k if k == OpKind::Recv as u8 => self.on_recv(token, res, flags),
            k if k == OpKind::Send as u8 => self.on_send(token, res),
            k if k == OpKind::Wake as u8 => self.arm_wake(),
            // A signal to another worker's eventfd: nothing to do (EAGAIN on a
            // saturated counter still wakes it).
            k if k == OpKind::Signal as u8 => {}
            k if k == OpKind::Read as u8 => self.on_read(token as usize, res, now),
            k if k == OpKind::Fsync as u8 => self.on_fsync(token, res, now),
            k if k == OpKind::ChunkWrite as u8 => self.on_chunk_write(token, res, now),
            _ => tracing::error!("unknown completion kind {kind}"),
        }
    }

    /// `reap` for a busy round: only accepts, wakes, and receives and sends of connections
    /// in their slots are handled; the rest is stashed for the next `reap`.
    fn reap_busy(&mut self, now: u64) {
        let mut cqes = std::mem::take(&mut self.cqes);
        cqes.clear();
        for cqe in self.ring.completion() {
            cqes.push((cqe.user_data(), cqe.result(), cqe.flags()));
        }
        for &(ud, res, flags) in &cqes {
            let (kind, token) = split_user_data(ud);
            let in_slot = |w: &Self| {
                w.conns
                    .get((token & 0xffff_ffff) as usize)
                    .is_some_and(|c| c.is_some())
            };
            let now_ok = kind == OpKind::Accept as u8
                || kind == OpKind::Wake as u8
                || ((kind == OpKind::Recv as u8 || kind == OpKind::Send as u8) && in_slot(self));
            // A connection's completions keep their order: those of the script's own
            // connection (out of its slot for the whole run) are all stashed.
            if now_ok {
                self.on_cqe(ud, res, flags, now);
            } else {
                self.stashed_cqes.push((ud, res, flags));
            }
        }
        self.cqes = cqes;
    }

    fn on_accept(&mut self, listener: usize, res: i32, flags: u32, now: u64) {
        if res == -libc::EINVAL || res == -libc::EBADF {
            // The listener was shut down (the worker is stopping): re-arming would fail
            // the same way at once, in a loop, until the worker exits.
            return;
        }
        if !cqueue::more(flags) {
            self.arm_accept(listener);
        }
        if res < 0 {
            tracing::warn!("accept failed: {}", std::io::Error::from_raw_os_error(-res));
            return;
        }
        // SAFETY: a successful accept returns a new fd that nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(res) };
        let sock = socket2::SockRef::from(&fd);
        let _ = sock.set_nodelay(true);
        let peer = sock.peer_addr().ok().and_then(|a| a.as_socket());
        let local_addr = sock.local_addr().ok().and_then(|a| a.as_socket());
        let addr = peer.map(|a| a.to_string()).unwrap_or_else(|| "?:0".into());
        let laddr = local_addr
            .map(|a| a.to_string())
            .unwrap_or_else(|| "?:0".into());
        let loopback = peer.is_some_and(|a| a.ip().is_loopback());
        let tls = match super::tls::accepts_tls(&self.shared.tls, local_addr) {
            Ok(tls) => tls,
            Err(()) => return,
        };
        let authenticated = match self.admit(loopback) {
            Ok(authenticated) => authenticated,
            // No plaintext on a TLS socket: a refused TLS client is just closed.
            Err(_) if tls.is_some() => return,
            Err(refusal) => {
                let _ = write_all_now(&fd, refusal);
                return;
            }
        };
        let slot = self.install_conn(Transport::Kernel(fd), addr, laddr, authenticated, now);
        if let Some(conn) = self.conns[slot as usize].as_mut() {
            conn.tls = tls;
        }
        self.arm_recv(slot);
    }

    /// Applies maxclients and protected mode to a new client: `Ok(authenticated)`, or the
    /// refusal to write before closing it (counted as rejected).
    fn admit(&self, loopback: bool) -> Result<bool, &'static [u8]> {
        let rt = self.shared.runtime.read().expect("runtime config lock");
        let stats = &self.shared.stats;
        if stats.connected_clients.load(Ordering::Relaxed) >= rt.maxclients {
            stats.rejected_connections.fetch_add(1, Ordering::Relaxed);
            return Err(b"-ERR max number of clients reached\r\n");
        }
        // As Redis: protected mode and automatic login depend on the default user having
        // no password (`nopass`), however it got one (requirepass or ACL SETUSER).
        let (nopass, enabled) = {
            let acl = self.shared.acl.read().expect("acl lock");
            let d = acl.default_user();
            (d.nopass, d.enabled)
        };
        if rt.protected_mode && nopass && !loopback {
            stats.rejected_connections.fetch_add(1, Ordering::Relaxed);
            return Err(DENIED.as_bytes());
        }
        Ok(nopass && enabled)
    }

    /// Registers an admitted connection (slot, counters, `CLIENT LIST` entry).
    fn install_conn(
        &mut self,
        fd: Transport,
        addr: String,
        laddr: String,
        authenticated: bool,
        now: u64,
    ) -> u32 {
        let stats = &self.shared.stats;
        stats.connected_clients.fetch_add(1, Ordering::Relaxed);
        stats.total_connections.fetch_add(1, Ordering::Relaxed);
        let id = self.shared.next_client_id.fetch_add(1, Ordering::Relaxed);
        let gen = self.next_gen;
        self.next_gen = self.next_gen.wrapping_add(1).max(1);
        let conn = Box::new(Conn::new(
            fd,
            gen,
            id,
            addr.clone(),
            laddr.clone(),
            now,
            authenticated,
        ));
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                self.conns.push(None);
                (self.conns.len() - 1) as u32
            }
        };
        let info = conn.client_info_line(now);
        self.conns[slot as usize] = Some(conn);
        self.shared.clients.lock().expect("clients lock").insert(
            id,
            ClientEntry {
                worker: self.id,
                token: ConnToken { slot, gen },
                addr,
                laddr,
                info,
            },
        );
        slot
    }

    fn on_recv(&mut self, token: u64, res: i32, flags: u32) {
        let slot = (token & 0xffff_ffff) as u32;
        let more = cqueue::more(flags);
        let bid = cqueue::buffer_select(flags);
        if let (Some(bid), true) = (bid, res > 0) {
            let data_len = res as usize;
            if let Some(conn) = self.conns.get_mut(slot as usize).and_then(|c| c.as_mut()) {
                if conn.gen == (token >> 32) as u32 && !conn.closing {
                    let data = self.bufring.data(bid, data_len);
                    if conn.tls.is_none() {
                        conn.inbuf.extend_from_slice(data);
                        self.shared.stats.copies.kernel.received(data_len as u64, 1);
                    } else {
                        super::tls::received(conn, data);
                    }
                }
            }
            self.bufring.recycle(bid);
        } else if let Some(bid) = bid {
            self.bufring.recycle(bid);
        }
        let Some(conn) = self.conn_mut(token) else {
            return;
        };
        if !more {
            conn.recv_armed = false;
            conn.ops_inflight -= 1;
        }
        if res > 0 {
            self.shared
                .stats
                .net_input_bytes
                .fetch_add(res as u64, Ordering::Relaxed);
            self.mark_ready(slot);
            if !more {
                self.arm_recv(slot);
            }
        } else if res == -libc::ENOBUFS {
            // The buffer ring ran dry for a moment; buffers are recycled as
            // soon as they are copied, so re-arming is enough.
            if !more {
                self.arm_recv(slot);
            }
        } else {
            // EOF or error: the client is gone.
            self.begin_close(slot);
            self.maybe_free(slot);
        }
    }

    fn on_send(&mut self, token: u64, res: i32) {
        let slot = (token & 0xffff_ffff) as u32;
        if res > 0 {
            self.shared
                .stats
                .net_output_bytes
                .fetch_add(res as u64, Ordering::Relaxed);
        }
        if res > 0 && self.conn_mut(token).is_some_and(|c| c.tls.is_none()) {
            // Sent from `sending` itself: no copy of lavik's (the kernel's is not counted).
            self.shared.stats.copies.kernel.sent(res as u64);
        }
        let Some(conn) = self.conn_mut(token) else {
            return;
        };
        conn.ops_inflight -= 1;
        conn.send_inflight = false;
        if res < 0 {
            conn.sending.clear();
            self.begin_close(slot);
            self.maybe_free(slot);
            return;
        }
        conn.send_off += res as usize;
        if conn.send_off >= conn.sending.len() {
            conn.sending.clear();
            conn.send_off = 0;
        }
        let resume = conn.unparsed() > 0 && !conn.closing;
        if conn.closing {
            self.maybe_free(slot);
            return;
        }
        if resume {
            self.mark_ready(slot);
        }
    }

    /// Stops reading a connection and releases it once nothing is in flight.
    fn begin_close(&mut self, slot: u32) {
        let Some(conn) = self.conns[slot as usize].as_mut() else {
            return;
        };
        if conn.closing {
            return;
        }
        conn.closing = true;
        match &conn.fd {
            Transport::Kernel(fd) => {
                // Ends the armed multishot receive (it completes with 0) and any send.
                // SAFETY: plain syscall on an fd we own.
                unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) };
            }
            #[cfg(feature = "dpdk")]
            Transport::Stack(handle) => dpdk::close_stack_socket(&mut self.dpdk, *handle),
        }
        let id = conn.id;
        let token = ConnToken {
            slot,
            gen: conn.gen,
        };
        super::blocking::forget(self.id, token);
        tracking::disable(conn);
        let was_monitor = conn.monitor;
        let watched = std::mem::take(&mut conn.txn.watched);
        let (subs, gen) = (std::mem::take(&mut conn.subs), conn.gen);
        self.txn_release(watched);
        self.forget_subscriptions(subs, slot, gen);
        self.shared
            .stats
            .connected_clients
            .fetch_sub(1, Ordering::Relaxed);
        self.shared
            .clients
            .lock()
            .expect("clients lock")
            .remove(&id);
        if was_monitor {
            let mut m = self.shared.monitors.lock().expect("monitors lock");
            m.retain(|&(w, t)| !(w == self.id && t.slot == slot));
            self.shared.monitor_count.store(m.len(), Ordering::SeqCst);
        }
    }

    fn maybe_free(&mut self, slot: u32) {
        let free = matches!(self.conns[slot as usize].as_ref(), Some(c) if c.closing && c.ops_inflight == 0);
        if free {
            let big = self.conns[slot as usize]
                .as_ref()
                .is_some_and(|c| c.buffer_bytes() >= TRIM_AFTER_CLOSE_BYTES);
            self.conns[slot as usize] = None; // drops (closes) the fd
            self.free_slots.push(slot);
            if big {
                tracing::debug!("connection buffers freed: trimming the heap");
                crate::runtime::trim_heap();
            }
        }
    }

    // ----- mailbox ---------------------------------------------------------

    /// True when a message waits in the mailbox (it is kept in `mailbox_next`).
    fn mailbox_waiting(&mut self) -> bool {
        if self.mailbox_next.is_none() {
            self.mailbox_next = self.mailbox.try_recv().ok();
        }
        self.mailbox_next.is_some()
    }

    fn drain_mailbox(&mut self, now: u64) {
        while let Some(msg) = self
            .mailbox_next
            .take()
            .or_else(|| self.mailbox.try_recv().ok())
        {
            match msg {
                Msg::Request {
                    from,
                    token,
                    seq,
                    db,
                    proto,
                    args,
                    caller,
                    script_caller,
                } => self.remote_request(
                    from,
                    token,
                    RemoteRequest {
                        seq,
                        db,
                        proto,
                        args,
                        caller,
                        script_caller,
                    },
                    now,
                ),
                Msg::Reply { token, seq, bytes } => {
                    let tok = token.packed();
                    if let Some(conn) = self.conn_mut(tok) {
                        conn.fill(seq, bytes);
                        let resume = conn.unparsed() > 0;
                        if resume {
                            self.mark_ready(token.slot);
                        }
                    }
                }
                Msg::Lend { give, back } => {
                    // A borrower must find every list stored (docs/collections.md 5a).
                    self.store_coalesced(now);
                    let mine: Vec<Shard> = self
                        .shards
                        .slots
                        .iter_mut()
                        .filter_map(|s| s.take())
                        .collect();
                    if give.send(mine).is_ok() {
                        match self.recv_serving_busy(&back) {
                            Ok(returned) => {
                                for s in returned {
                                    let id = s.id() as usize;
                                    self.shards.slots[id] = Some(s);
                                }
                            }
                            Err(_) => panic!("coordinator dropped lent shards"),
                        }
                    }
                }
                Msg::Adopt { shards, done } => {
                    let policy = self.fsync;
                    let cache = self.cache_bytes_per_shard();
                    for mut shard in shards {
                        shard.set_fsync_policy(policy);
                        shard.set_cache_capacity(cache);
                        let id = shard.id() as usize;
                        self.shards.slots[id] = Some(shard);
                    }
                    self.register_shard_files();
                    let _ = done.send(());
                }
                Msg::Kill { token } => {
                    let tok = token.packed();
                    if self.conn_mut(tok).is_some() {
                        self.begin_close(token.slot);
                        self.maybe_free(token.slot);
                    }
                }
                Msg::BlockRetry(r) => super::blocking::retry_later(*r),
                Msg::Unwatch { db, shard, key } => self.txn_on_unwatch(db, shard, &key),
                Msg::Prefetch { from, token, keys } => self.txn_on_prefetch(from, token, keys),
                Msg::Prefetched {
                    token,
                    fetched,
                    fetched_shard,
                    failed,
                } => self.txn_prefetched(token, fetched, fetched_shard, failed),
                Msg::Publish(p) => self.deliver(*p),
                Msg::Tracking {
                    token,
                    via_redirect,
                    push,
                } => self.deliver_tracking_msg(token, via_redirect, push),
                Msg::Monitor { token, line } => {
                    let tok = token.packed();
                    if let Some(conn) = self.conn_mut(tok) {
                        if conn.pending.is_empty() {
                            conn.out.extend_from_slice(&line);
                        } else {
                            conn.push_ready(line);
                        }
                    }
                }
            }
        }
    }

    fn send_outbox(&mut self) {
        // Replies of this round wait behind older held ones, and for this
        // round's epoch when it is not durable yet.
        let need = self.round_need;
        if need > self.commit.durable || !self.held_replies.is_empty() {
            let tag = need.max(self.held_replies.back().map_or(0, |h| h.0));
            for w in 0..self.outbox.len() {
                let mut kept = Vec::new();
                for m in self.outbox[w].drain(..) {
                    if matches!(m, Msg::Reply { .. }) {
                        self.held_replies.push_back((tag, w, m));
                    } else {
                        kept.push(m);
                    }
                }
                self.outbox[w] = kept;
            }
        }
        while let Some(&(tag, _, _)) = self.held_replies.front() {
            if tag > self.commit.durable {
                break;
            }
            let Some((tag, w, mut m)) = self.held_replies.pop_front() else {
                break;
            };
            if tag <= self.commit.failed_upto {
                if let Msg::Reply { bytes, .. } = &mut m {
                    *bytes = self.commit.failed_text.clone().into_bytes();
                }
            }
            self.outbox[w].push(m);
        }
        for w in 0..self.outbox.len() {
            if self.outbox[w].is_empty() {
                continue;
            }
            let link = &self.shared.workers[w];
            for m in self.outbox[w].drain(..) {
                self.round_hops += u64::from(matches!(m, Msg::Request { .. }));
                let _ = link.tx.send(m);
            }
            // One signal per peer per round, and none while the peer is awake: it drains
            // its mailbox before it parks. The signal is an eventfd write on our own ring,
            // submitted with this round's sends (no syscall of its own).
            if link.needs_wake() {
                self.round_signals += 1;
                let sqe = opcode::Write::new(
                    types::Fd(link.wake.as_raw_fd()),
                    std::ptr::addr_of!(WAKE_ONE).cast::<u8>(),
                    8,
                )
                .build()
                .user_data(user_data(OpKind::Signal, w as u64));
                push_sqe(&mut self.ring, &sqe);
            } else {
                self.round_signals_skipped += 1;
            }
        }
    }

    /// Adds this round's cross-worker counters to the server's stats.
    fn publish_hop_counts(&mut self) {
        let st = &self.shared.stats;
        for (local, total) in [
            (&mut self.round_hops, &st.hops),
            (&mut self.round_signals, &st.wake_signals),
            (&mut self.round_signals_skipped, &st.wake_signals_skipped),
            (&mut self.round_parks, &st.parks),
        ] {
            if *local > 0 {
                total.fetch_add(std::mem::take(local), Ordering::Relaxed);
            }
        }
    }

    // ----- commands ----------------------------------------------------------

    /// Runs what a ready connection has received (if it still exists).
    fn run_slot(&mut self, slot: u32, now: u64) {
        let Some(mut conn) = self.conns[slot as usize].take() else {
            return;
        };
        conn.in_ready = false;
        self.process_conn(&mut conn, slot, now);
        let flush_failed = std::mem::take(&mut self.coordinated_flush_failed);
        if flush_failed {
            // A command here borrowed shards and their flush failed: its reply must not
            // acknowledge what may not be durable.
            conn.out.truncate(conn.out_cleared.min(conn.out.len()));
        }
        let close_now = conn.closing;
        self.conns[slot as usize] = Some(conn);
        if flush_failed {
            self.begin_close(slot);
        }
        if close_now || flush_failed {
            self.maybe_free(slot);
        }
    }

    fn process_ready(&mut self, now: u64, round_start: Instant) {
        self.retry_pending = false;
        let budget = Duration::from_micros(self.shared.settings.cli.foreground_budget_us.max(1));
        let mut ready = std::mem::take(&mut self.ready);
        let mut served = 0;
        while served < ready.len() {
            self.run_slot(ready[served], now);
            served += 1;
            // --foreground-budget-us: past it, the rest wait for the next round (first in
            // line), so syncs, sends, completions and background work are not starved.
            // The clock is read every 4 connections.
            if served % 4 == 0 && round_start.elapsed() >= budget {
                break;
            }
        }
        if served < ready.len() {
            self.shared
                .stats
                .foreground_budget_cuts
                .fetch_add(1, Ordering::Relaxed);
            ready.drain(..served);
            ready.append(&mut self.ready);
            self.ready = ready;
        } else {
            ready.clear();
            if self.ready.is_empty() {
                self.ready = ready;
            }
        }
        if self.deferred.is_empty() {
            return;
        }
        // One lend of every worker's shards serves all connections that
        // stopped at a multi-worker command this round; while we hold them
        // every command runs locally, so each connection runs on in order.
        let deferred = std::mem::take(&mut self.deferred);
        let all: Vec<usize> = (0..self.shared.workers.len()).collect();
        let done = self.with_workers(&all, |w| {
            for &slot in &deferred {
                w.run_slot(slot, now);
            }
        });
        if std::mem::take(&mut self.coordinated_flush_failed) {
            // Their replies may acknowledge writes that are not durable: none leave.
            for &slot in &deferred {
                if let Some(c) = self.conns[slot as usize].as_mut() {
                    c.out.truncate(c.out_cleared.min(c.out.len()));
                }
                self.begin_close(slot);
                self.maybe_free(slot);
            }
        }
        if done.is_none() {
            self.retry_pending = true;
            for slot in deferred {
                self.mark_ready(slot);
            }
        }
    }

    /// True when we hold (own or have borrowed) the shards of worker `w`.
    fn holds_worker(&self, w: usize) -> bool {
        let n = self.shared.workers.len();
        self.shards
            .slots
            .iter()
            .enumerate()
            .any(|(id, s)| id % n == w && s.is_some())
    }

    fn process_conn(&mut self, conn: &mut Conn, slot: u32, now: u64) {
        let mut parsed = std::mem::take(&mut self.parsed);
        loop {
            if conn.closing || conn.close_after_reply {
                break;
            }
            if let Some(seq) = conn.blocked_seq {
                // A blocking command has not answered yet: nothing after it runs.
                if conn
                    .pending
                    .iter()
                    .any(|p| matches!(p, Slot::Waiting(s) if *s == seq))
                {
                    break;
                }
                conn.blocked_seq = None;
            }
            if self.reads.is_full()
                || conn.parked as usize >= super::reads::PARKED_PER_CONN_MAX
                || conn.pending.len() >= PENDING_REPLIES_MAX
                || conn.unsent_bytes() > OUTPUT_HIGH_WATER_BYTES
            {
                break;
            }
            let start = conn.in_pos;
            match parse_command(&conn.inbuf[start..], &mut parsed, self.max_bulk) {
                Ok(None) => {
                    if conn.unparsed() > self.query_limit {
                        tracing::warn!("closing client {}: query buffer limit reached", conn.addr);
                        conn.out.clear();
                        conn.close_after_reply = true;
                    }
                    break;
                }
                Err(e) => {
                    let text = e.reply_text();
                    conn.reply(|r| r.error(&text));
                    conn.close_after_reply = true;
                    break;
                }
                Ok(Some(())) => {
                    let consumed = parsed.consumed;
                    if parsed.arg_count() == 0 {
                        conn.in_pos += consumed;
                        continue;
                    }
                    let inbuf = std::mem::take(&mut conn.inbuf);
                    // Short argument lists (GET, SET, ...) stay on the stack.
                    let argc = parsed.arg_count();
                    let mut inline: [&[u8]; ARGS_INLINE] = [&[]; ARGS_INLINE];
                    let mut spilled: Vec<&[u8]> = Vec::new();
                    let args: &[&[u8]] = if argc <= ARGS_INLINE {
                        parsed.args_into(&inbuf[start..], &mut inline[..argc]);
                        &inline[..argc]
                    } else {
                        parsed.args(&inbuf[start..], &mut spilled);
                        &spilled
                    };
                    let outcome = self.dispatch(conn, slot, args, now);
                    drop(spilled);
                    conn.inbuf = inbuf;
                    match outcome {
                        Outcome::Done => conn.in_pos += consumed,
                        Outcome::Blocked => break,
                        Outcome::Retry => {
                            if !self.deferred.contains(&slot) {
                                self.deferred.push(slot);
                            }
                            break;
                        }
                    }
                }
            }
        }
        self.parsed = parsed;
        conn.compact_input();
    }

    fn dispatch(&mut self, conn: &mut Conn, slot: u32, args: &[&[u8]], now: u64) -> Outcome {
        let Some(spec) = lookup(args[0]) else {
            let mut msg = format!(
                "ERR unknown command '{}', with args beginning with: ",
                String::from_utf8_lossy(&args[0][..args[0].len().min(128)])
            );
            for a in &args[1..] {
                msg.push_str(&format!(
                    "'{}' ",
                    String::from_utf8_lossy(&a[..a.len().min(128)])
                ));
            }
            conn.reply(|r| r.error(&msg));
            Self::txn_flag_error(conn);
            return Outcome::Done;
        };
        if (spec.arity > 0 && args.len() != spec.arity as usize)
            || (spec.arity < 0 && args.len() < (-spec.arity) as usize)
        {
            let msg = crate::commands::wrong_args(spec.name);
            conn.reply(|r| r.error(&msg));
            super::cmdstats::record_rejected(spec, args);
            Self::txn_flag_error(conn);
            return Outcome::Done;
        }
        if !super::acl_cmd::permit(self, conn, spec, args, now) {
            super::cmdstats::record_rejected(spec, args);
            Self::txn_flag_error(conn);
            return Outcome::Done;
        }
        if self.shared.loading.load(Ordering::Acquire)
            && (!spec.flags.contains(&"loading")
                || matches!(spec.name, "save" | "bgsave" | "defrag" | "tombraider"))
        {
            conn.reply(|r| r.error("LOADING Redis is loading the dataset in memory"));
            super::cmdstats::record_rejected(spec, args);
            Self::txn_flag_error(conn);
            return Outcome::Done;
        }
        if let Some(e) = pubsub::subscribed_mode_error(conn, spec, args) {
            conn.reply(|r| r.error(&e));
            return Outcome::Done;
        }
        // A script running past `busy-reply-threshold` on some worker: Redis answers -BUSY
        // to everything but the `allow_busy` commands (one atomic load while none runs).
        if let Some(busy) = self.shared.scripts.busy_error() {
            if !crate::scripting::allowed_while_busy(spec.name, args) {
                if spec.name == "exec" {
                    // Redis's `rejectCommand` for EXEC: the transaction is discarded.
                    let text = format!("EXECABORT Transaction discarded because of: {busy}");
                    self.txn_reset(conn);
                    conn.reply(|r| r.error(&text));
                } else {
                    conn.reply(|r| r.error(busy));
                    Self::txn_flag_error(conn);
                }
                return Outcome::Done;
            }
        }
        if self.busy_depth > 0 {
            if let Some(outcome) = self.dispatch_busy(conn, slot, spec, args, now) {
                return outcome;
            }
        }
        if Self::txn_queue(conn, spec, args) {
            return Outcome::Done;
        }
        // A connection's order: nothing keyed overtakes a parked write, and no write
        // overtakes a parked read (see `Conn::parked`).
        if conn.parked > 0
            && spec.kind != Kind::Local
            && (conn.parked_writes > 0 || !spec.flags.contains(&"readonly"))
        {
            return Outcome::Blocked;
        }
        // Two clock reads per command: INFO commandstats and the slow log.
        let started = Instant::now();
        let errors_before = super::cmdstats::errors_seen();
        if spec.may_write() {
            self.round_writes = true;
        }
        let waiting_remote = conn.pending.iter().any(|p| matches!(p, Slot::Waiting(_)));
        // Client-side caching: who runs this command (one load when nobody tracks).
        let tracking_active = crate::runtime::tracking::active();
        if tracking_active {
            crate::runtime::tracking::set_current(conn.tracking.caller(conn.id));
        }
        // A restricted user's script: the commands it calls are checked against the user.
        let _script_caller =
            crate::acl::ScriptCallerScope::set(super::acl_cmd::script_caller_for(conn, spec, now));
        let outcome = match spec.kind {
            Kind::Local => {
                // Connection commands (INFO, DEBUG, SAVE, MULTI/EXEC...) see every list stored.
                self.store_coalesced(now);
                let outcome = (self.run_connection_command)(self, conn, slot, spec, args, now);
                self.refresh_slowlog_threshold();
                outcome
            }
            Kind::Keyed => self.route_keyed(conn, slot, spec, args, now),
            Kind::AllShards => {
                let all: Vec<usize> = (0..self.shared.workers.len()).collect();
                if all.iter().all(|&w| self.holds_worker(w)) {
                    self.run_local(conn, spec, args, now);
                    Outcome::Done
                } else if waiting_remote {
                    Outcome::Blocked
                } else {
                    Outcome::Retry
                }
            }
        };
        if tracking_active {
            crate::runtime::tracking::set_current(Default::default());
        }
        if matches!(outcome, Outcome::Done) {
            if conn.tracking.caching {
                conn.tracking.command_done(spec, conn.txn.in_multi);
            }
            self.commands_this_round += 1;
            conn.commands += 1;
            conn.last_cmd_ms = now;
            if self.shared.monitor_count.load(Ordering::Relaxed) > 0 && spec.name != "monitor" {
                self.feed_monitors(conn, args);
            }
            let ns = started.elapsed().as_nanos() as u64;
            // Keyed commands count where their handler runs (`exec_on`).
            if spec.kind != Kind::Keyed {
                let failed = super::cmdstats::errors_seen() != errors_before;
                super::cmdstats::record_call(spec, args, ns, failed);
            }
            if self.slowlog_threshold_us >= 0 {
                self.maybe_slowlog(conn, args, ns / 1000);
            }
        }
        outcome
    }

    /// A command read in a busy round that passed the -BUSY check: `None` when it may run
    /// as usual (connection commands that touch no shard); otherwise what it gets now:
    /// SCRIPT KILL, FUNCTION KILL and FUNCTION STATS run here on no shard; SHUTDOWN
    /// without NOSAVE gets -BUSY (as Redis); the rest (EXEC, WATCH: they need shards)
    /// waits for the script to end.
    fn dispatch_busy(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        spec: &CommandSpec,
        args: &[&[u8]],
        now: u64,
    ) -> Option<Outcome> {
        match spec.name {
            "auth" | "hello" | "quit" | "reset" | "multi" | "discard" | "unwatch" => None,
            "shutdown" => None,
            "script" | "function" if crate::scripting::allowed_while_busy(spec.name, args) => {
                let handler = spec.handler?;
                let (db, max_bulk) = (conn.db, self.max_bulk);
                let shards = &mut self.shards;
                let started = Instant::now();
                let failed = conn.reply(|r| {
                    let mut ctx = Ctx {
                        shards,
                        db,
                        now_ms: now,
                        max_bulk,
                        busy_round: None,
                    };
                    let res = handler(&mut ctx, args, r);
                    if let Err(e) = &res {
                        r.error(e);
                    }
                    res.is_err()
                });
                let ns = started.elapsed().as_nanos() as u64;
                super::cmdstats::record_call(spec, args, ns, failed);
                Some(Outcome::Done)
            }
            _ => {
                if !self.busy_blocked.contains(&slot) {
                    self.busy_blocked.push(slot);
                }
                Some(Outcome::Blocked)
            }
        }
    }

    /// One busy round: while a script runs past `busy-reply-threshold`, the worker running
    /// it (from the script's instruction hook, `Ctx::busy_round`) or waiting for shards it
    /// holds (`recv_serving_busy`) serves its other connections once, as Redis processes
    /// events from its script hook: completions (receives, sends, accepts; device and sync
    /// completions are stashed, the shards being the script's), then every ready
    /// connection — each command gets -BUSY except Redis's allow-busy ones
    /// (`dispatch_busy`) — then the sends of replies that need no durability. Returns true
    /// when the server is shutting down (SHUTDOWN NOSAVE here, or a signal).
    fn busy_round(&mut self) -> bool {
        self.busy_depth += 1;
        let now = now_ms();
        // The script's tracking caller is the script's; this round's commands are others'.
        let caller = crate::runtime::tracking::set_current(Default::default());
        // Submits what is queued and runs the ring's deferred task work, without waiting.
        self.wait_ring_us(0);
        self.reap_busy(now);
        // Every connection waiting to be served: those marked ready since the script began
        // (`ready`) and those still in this round's list behind the script's connection
        // (marked too, `in_ready`); the outer round serving one again later is harmless.
        self.ready.clear();
        for slot in 0..self.conns.len() as u32 {
            if !self.conns[slot as usize]
                .as_deref()
                .is_some_and(|c| c.in_ready)
            {
                continue;
            }
            // A connection with nothing unsent but cleared bytes gets its busy-round
            // replies (errors, AUTH, ...: no write to wait for) cleared at once; one with
            // this round's unsent replies (which may wait for a sync) keeps them back.
            let clean = self.conns[slot as usize]
                .as_deref()
                .is_some_and(|c| self.may_send_in_busy_round(c));
            self.run_slot(slot, now);
            if let Some(c) = self.conns[slot as usize].as_deref_mut().filter(|_| clean) {
                c.out_cleared = c.out.len();
            }
        }
        for slot in 0..self.conns.len() {
            let cleared = self.conns[slot]
                .as_deref()
                .is_some_and(|c| self.may_send_in_busy_round(c));
            if cleared {
                self.push_send(slot);
            }
        }
        let _ = self.ring.submit();
        crate::runtime::tracking::set_current(caller);
        self.busy_depth -= 1;
        self.shared.shutdown.load(Ordering::SeqCst)
    }

    /// Whether a busy round may send what `c` has unsent: nothing held for a sync, and
    /// with `appendfsync always` nothing of this round's that `gate_replies` has not
    /// cleared (it may wait for the round's sync). Other policies hold no reply.
    fn may_send_in_busy_round(&self, c: &Conn) -> bool {
        c.held.is_empty() && (self.fsync != FsyncPolicy::Always || c.out_cleared >= c.out.len())
    }

    /// After a script (or a wait for shards): the connections busy rounds held back run.
    fn end_busy(&mut self) {
        if self.busy_depth == 0 && !self.busy_blocked.is_empty() {
            for slot in std::mem::take(&mut self.busy_blocked) {
                self.mark_ready(slot);
            }
        }
    }

    /// Runs `f` (a script's command) on the worker's shards moved out of it, with a busy
    /// round to offer the script's hook: the script owns the shards while it runs (the
    /// worker keeps `spare_shards`, which hold none), so a busy round can use the worker
    /// without touching them. Two moves of a few words, no allocation.
    fn with_script_shards<R>(
        &mut self,
        f: impl FnOnce(&mut ShardSet, &mut dyn FnMut() -> bool) -> R,
    ) -> R {
        let placeholder = ShardSet {
            slots: Vec::new(),
            shard_count: 0,
            groups: Default::default(),
        };
        let spare = std::mem::replace(&mut self.spare_shards, placeholder);
        let mut shards = std::mem::replace(&mut self.shards, spare);
        let out = {
            let mut round = || self.busy_round();
            f(&mut shards, &mut round)
        };
        self.spare_shards = std::mem::replace(&mut self.shards, shards);
        self.end_busy();
        out
    }

    /// `rx.recv()` for shards (lent out, or asked of other workers): while some script
    /// runs past `busy-reply-threshold`, this worker serves busy rounds meanwhile instead
    /// of answering nobody.
    fn recv_serving_busy<T>(&mut self, rx: &mpsc::Receiver<T>) -> Result<T, mpsc::RecvError> {
        let out = loop {
            match rx.recv_timeout(BUSY_WAIT_SLICE) {
                Ok(v) => break Ok(v),
                Err(mpsc::RecvTimeoutError::Disconnected) => break Err(mpsc::RecvError),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if self.busy_depth == 0 && self.shared.scripts.busy_error().is_some() {
                        self.busy_round();
                    }
                }
            }
        };
        self.end_busy();
        out
    }

    fn refresh_slowlog_threshold(&mut self) {
        let rt = self.shared.runtime.read().expect("runtime lock");
        self.slowlog_threshold_us = rt.slowlog_log_slower_than_us;
        self.output_limit = rt.output_limits.normal;
        self.output_limit_pubsub = rt.output_limits.pubsub;
    }

    fn feed_monitors(&mut self, conn: &Conn, args: &[&[u8]]) {
        // Passwords (AUTH, HELLO AUTH, ACL SETUSER rules, CONFIG SET requirepass) are
        // shown as "(redacted)", as Redis does.
        let args = &super::acl_cmd::redacted(args);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let mut line = format!(
            "+{}.{:06} [{} {}]",
            t.as_secs(),
            t.subsec_micros(),
            conn.db,
            conn.addr
        );
        for a in args {
            line.push_str(" \"");
            for &b in a.iter() {
                match b {
                    b'"' => line.push_str("\\\""),
                    b'\\' => line.push_str("\\\\"),
                    b'\n' => line.push_str("\\n"),
                    b'\r' => line.push_str("\\r"),
                    32..=126 => line.push(b as char),
                    _ => line.push_str(&format!("\\x{b:02x}")),
                }
            }
            line.push('"');
        }
        line.push_str("\r\n");
        let monitors = self.shared.monitors.lock().expect("monitors lock").clone();
        for (w, token) in monitors {
            if w == self.id {
                let tok = token.packed();
                if let Some(c) = self.conn_mut(tok) {
                    c.out.extend_from_slice(line.as_bytes());
                }
            } else {
                self.outbox[w].push(Msg::Monitor {
                    token,
                    line: line.clone().into_bytes(),
                });
            }
        }
    }

    fn maybe_slowlog(&self, conn: &Conn, args: &[&[u8]], micros: u64) {
        let threshold = self.slowlog_threshold_us;
        if threshold < 0 || micros < threshold as u64 {
            return;
        }
        let args = &super::acl_cmd::redacted(args);
        let max = self
            .shared
            .runtime
            .read()
            .expect("runtime lock")
            .slowlog_max_len;
        let mut log = self.shared.slowlog.lock().expect("slowlog lock");
        let id = log.0;
        log.0 += 1;
        log.1.push_front(super::SlowEntry {
            id,
            unix: now_ms() / 1000,
            micros,
            args: args
                .iter()
                .take(32)
                .map(|a| a[..a.len().min(128)].to_vec())
                .collect(),
            addr: conn.addr.clone(),
            name: conn
                .name
                .as_deref()
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .unwrap_or_default(),
        });
        log.1.truncate(max);
    }

    /// Runs a keyed handler on shards this thread holds, into `out`.
    fn exec_handler(
        &mut self,
        spec: &CommandSpec,
        args: &[&[u8]],
        db: u8,
        proto: Proto,
        now: u64,
        out: &mut Vec<u8>,
    ) {
        exec_on(
            &mut self.shards,
            spec,
            args,
            db,
            proto,
            now,
            self.max_bulk,
            out,
        );
    }

    fn run_local(&mut self, conn: &mut Conn, spec: &CommandSpec, args: &[&[u8]], now: u64) {
        self.run_local_with(conn, spec, args, now, None);
    }

    /// `run_local`; with `wanted`, a restartable run: when it missed records, `wanted`
    /// lists their reads and nothing was answered (the caller parks the command).
    fn run_local_with(
        &mut self,
        conn: &mut Conn,
        spec: &CommandSpec,
        args: &[&[u8]],
        now: u64,
        mut wanted: Option<&mut Vec<(u32, RecordRead)>>,
    ) {
        let (db, proto, max_bulk) = (conn.db, conn.proto, self.max_bulk);
        let direct = conn.pending.is_empty();
        let mut out = if direct {
            std::mem::take(&mut conn.out)
        } else {
            Vec::new()
        };
        let wanted_now = wanted.as_deref_mut();
        if is_script(spec) {
            self.with_script_shards(|shards, round| {
                exec_restartable(
                    shards,
                    spec,
                    args,
                    db,
                    proto,
                    now,
                    max_bulk,
                    &mut out,
                    wanted_now,
                    Some(round),
                )
            });
        } else {
            let shards = &mut self.shards;
            exec_restartable(
                shards, spec, args, db, proto, now, max_bulk, &mut out, wanted_now, None,
            );
        }
        let missed = wanted.is_some_and(|w| !w.is_empty());
        if !missed {
            tracking::append_own(&mut out, proto);
        }
        if direct {
            conn.out = out;
        } else if !missed {
            conn.push_ready(out);
        }
    }

    /// Runs a keyed command on shards some of which are borrowed, with the records its
    /// owners prefetched lent (`txn::cross_prefetch`); what is still missing (after the
    /// prefetch rounds) goes out together on the batch ring first (see `BatchReads`).
    fn run_borrowed(&mut self, conn: &mut Conn, spec: &CommandSpec, args: &[&[u8]], now: u64) {
        let mut fetched = std::mem::take(&mut conn.txn.prefetched);
        let mut fetched_shard = std::mem::take(&mut conn.txn.prefetched_shard);
        conn.txn.xrounds = 0;
        self.ensure_batch_reads();
        if let Some(batch) = self.batch.as_mut() {
            batch.fetch(
                &mut self.shards,
                spec,
                args,
                conn.db,
                &mut fetched,
                &mut fetched_shard,
            );
        }
        self.count_batch_waits();
        let (db, proto, max_bulk) = (conn.db, conn.proto, self.max_bulk);
        let mut out = if conn.pending.is_empty() {
            std::mem::take(&mut conn.out)
        } else {
            Vec::new()
        };
        let mut run = |shards: &mut ShardSet, round: Option<&mut dyn FnMut() -> bool>| {
            with_lent_in(shards, &mut fetched, &fetched_shard, |shards| {
                exec_restartable(
                    shards, spec, args, db, proto, now, max_bulk, &mut out, None, round,
                )
            })
        };
        if is_script(spec) {
            self.with_script_shards(|shards, round| run(shards, Some(round)));
        } else {
            run(&mut self.shards, None);
        }
        self.reads.recycle_fetched(fetched, fetched_shard);
        tracking::append_own(&mut out, proto);
        if conn.pending.is_empty() {
            conn.out = out;
        } else {
            conn.push_ready(out);
        }
    }

    /// Makes the coordinator's batch-read ring on first use (when none can be made,
    /// handlers read what they miss one by one).
    fn ensure_batch_reads(&mut self) {
        if self.batch.is_none() {
            match BatchReads::new(self.shared.settings.cli.debug_read_delay_ms) {
                Ok(b) => self.batch = Some(b),
                Err(e) => tracing::warn!("no batch-read ring ({e}): reading one by one"),
            }
        }
    }

    /// Adds the batch ring's waits since the last call to INFO `lavik_batch_read_waits`.
    fn count_batch_waits(&mut self) {
        let waits = self
            .batch
            .as_mut()
            .map_or(0, |b| std::mem::take(&mut b.waits));
        if waits > 0 {
            self.shared
                .stats
                .batch_read_waits
                .fetch_add(waits, Ordering::Relaxed);
        }
    }

    /// Runs a keyed command here if we hold all its shards, sends it to the
    /// one worker that owns them, or defers it (keys on several workers).
    fn route_keyed(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        spec: &'static CommandSpec,
        args: &[&[u8]],
        now: u64,
    ) -> Outcome {
        // Routing, planning and (when it runs at once) the handler hash the first key once.
        let _memo = crate::runtime::keymemo::enter(args.get(1).copied().unwrap_or_default());
        let mut all_held = true;
        let mut owner: Option<usize> = None;
        let mut several = false;
        for pos in key_positions(spec, args) {
            let shard = self.shards.shard_id(args[pos]);
            if self.shards.slots[shard as usize].is_some() {
                continue;
            }
            all_held = false;
            let w = self.shared.worker_of_shard(shard);
            match owner {
                None => owner = Some(w),
                Some(o) if o != w => several = true,
                _ => {}
            }
        }
        let blocking = crate::commands::blocking::is_blocking(spec.name);
        if all_held && blocking {
            return self.route_blocking_local(conn, slot, spec, args, now);
        }
        if all_held {
            let dest = ReadDest::Local {
                token: ConnToken {
                    slot,
                    gen: conn.gen,
                },
                seq: conn.next_seq,
            };
            let (db, proto) = (conn.db, conn.proto);
            match self.start_keyed(dest, spec, args, db, proto) {
                Start::RunNow if restartable(spec) => {
                    // Its declared keys are in memory; records found below them (the
                    // pages of a paged collection) park it if they are not.
                    let mut wanted = self.reads.plan_vec();
                    self.run_local_with(conn, spec, args, now, Some(&mut wanted));
                    if wanted.is_empty() {
                        self.reads.give_plan_vec(wanted);
                    } else {
                        let p = Parked::new(dest, spec, self.reads.arg_list(args), db, proto);
                        let writes = p.is_write();
                        self.park_restarted(p, wanted, true);
                        let seq = conn.reserve();
                        debug_assert!(matches!(dest, ReadDest::Local { seq: s, .. } if s == seq));
                        conn.parked += 1;
                        conn.parked_writes += u32::from(writes);
                    }
                }
                Start::RunNow => self.run_local(conn, spec, args, now),
                Start::Borrowed => {
                    // Records not in memory are fetched by their owners first, outside the
                    // pass (`txn.rs`, "Device reads"): the command runs in a later pass.
                    // A blind write (MSET) reads nothing it does not have (`put_blind`).
                    let blind = self.shared.settings.blind_writes
                        && crate::commands::string::blind_write(spec.name, args);
                    let keys: Vec<(u8, Vec<u8>)> = key_positions(spec, args)
                        .filter(|_| !blind)
                        .map(|p| (db, args[p].to_vec()))
                        .collect();
                    if matches!(self.cross_prefetch(conn, slot, &keys), txn::Cross::Parked) {
                        return Outcome::Blocked;
                    }
                    self.run_borrowed(conn, spec, args, now)
                }
                Start::Parked { writes } => {
                    let seq = conn.reserve();
                    debug_assert!(matches!(dest, ReadDest::Local { seq: s, .. } if s == seq));
                    conn.parked += 1;
                    conn.parked_writes += u32::from(writes);
                }
            }
            return Outcome::Done;
        }
        // Keys partly here and partly elsewhere also need the lend path.
        let partly_local = key_positions(spec, args)
            .any(|pos| self.shards.slots[self.shards.shard_id(args[pos]) as usize].is_some());
        if several || partly_local {
            let waiting_remote = conn.pending.iter().any(|p| matches!(p, Slot::Waiting(_)));
            return if waiting_remote {
                Outcome::Blocked
            } else {
                Outcome::Retry
            };
        }
        let target = owner.expect("a key not held has an owner");
        let seq = conn.reserve();
        if blocking {
            // No later command of this client runs until this one has answered.
            conn.blocked_seq = Some(seq);
        }
        let token = ConnToken {
            slot,
            gen: conn.gen,
        };
        self.outbox[target].push(Msg::Request {
            from: self.id,
            token,
            seq,
            db: conn.db,
            proto: conn.proto,
            args: args.iter().map(|a| a.to_vec()).collect(),
            caller: crate::runtime::tracking::current(),
            script_caller: crate::acl::script_caller(),
        });
        Outcome::Done
    }

    /// A blocking command whose shards we hold: its reply slot is reserved first, so a
    /// client it leaves blocked is answered into that slot later (served, timed out or
    /// unblocked; `server::blocking`), and the connection parses nothing more until then.
    fn route_blocking_local(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        spec: &'static CommandSpec,
        args: &[&[u8]],
        now: u64,
    ) -> Outcome {
        let seq = conn.reserve();
        conn.blocked_seq = Some(seq);
        let token = ConnToken {
            slot,
            gen: conn.gen,
        };
        let (db, proto) = (conn.db, conn.proto);
        match self.start_keyed(ReadDest::Local { token, seq }, spec, args, db, proto) {
            Start::RunNow | Start::Borrowed => {
                super::blocking::set_current(Some(super::blocking::Waiter {
                    worker: self.id,
                    token,
                    seq,
                    proto,
                }));
                let mut out = Vec::new();
                self.exec_handler(spec, args, db, proto, now, &mut out);
                super::blocking::set_current(None);
                if !super::blocking::take_blocked() {
                    conn.fill(seq, out);
                }
            }
            Start::Parked { writes } => {
                conn.parked += 1;
                conn.parked_writes += u32::from(writes);
            }
        }
        Outcome::Done
    }

    /// Routes replies produced for blocked clients (served, timed out, unblocked) to
    /// their connections' reserved slots, here or on their own worker.
    fn deliver_blocked(&mut self, now: u64) {
        let mut mine = Vec::new();
        for r in super::blocking::take_retries() {
            if r.waiter.worker == self.id {
                mine.push(r);
            } else {
                self.outbox[r.waiter.worker].push(Msg::BlockRetry(Box::new(r)));
            }
        }
        if !mine.is_empty() {
            let all: Vec<usize> = (0..self.shared.workers.len()).collect();
            let mut left = Some(mine);
            let done = self.with_workers(&all, |w| {
                for r in left.take().unwrap_or_default() {
                    w.rerun_blocked(r, now);
                }
            });
            if done.is_none() {
                // Another coordinator is active: next round.
                for r in left.take().unwrap_or_default() {
                    super::blocking::retry_later(r);
                }
                self.retry_pending = true;
            }
        }
        let mut replies = super::blocking::take_deliveries();
        replies.extend(super::blocking::expire(self.id, now));
        for (w, bytes) in replies {
            if w.worker == self.id {
                if let Some(conn) = self.conn_mut(w.token.packed()) {
                    conn.fill(w.seq, bytes);
                    self.mark_ready(w.token.slot);
                }
            } else {
                self.outbox[w.worker].push(Msg::Reply {
                    token: w.token,
                    seq: w.seq,
                    bytes,
                });
            }
        }
    }

    /// Runs a blocked client's command again (every shard held) into its reserved slot;
    /// it blocks again when it still finds nothing.
    fn rerun_blocked(&mut self, r: super::blocking::Retry, now: u64) {
        let w = r.waiter;
        if self.conn_mut(w.token.packed()).is_none() {
            return;
        }
        let refs: Vec<&[u8]> = r.args.iter().map(|a| a.as_slice()).collect();
        let Some(spec) = lookup(refs[0]) else {
            return;
        };
        self.round_writes = true;
        let mut out = Vec::new();
        super::blocking::set_current(Some(w));
        self.exec_handler(spec, &refs, r.db, w.proto, now, &mut out);
        super::blocking::set_current(None);
        if !super::blocking::take_blocked() {
            if let Some(conn) = self.conn_mut(w.token.packed()) {
                conn.fill(w.seq, out);
                self.mark_ready(w.token.slot);
            }
        }
    }

    /// Borrows the shards of `workers` (other than ours), runs `f` with all
    /// of them held, and gives them back. `None`: another coordinator is
    /// active; retry on a later round.
    pub fn with_workers<R>(
        &mut self,
        workers: &[usize],
        f: impl FnOnce(&mut Self) -> R,
    ) -> Option<R> {
        let others: Vec<usize> = workers
            .iter()
            .copied()
            .filter(|&w| w != self.id && !self.holds_worker(w))
            .collect();
        if others.is_empty() {
            return Some(f(self));
        }
        let shared = self.shared.clone();
        let guard = shared.txn_lock.try_lock().ok()?;
        let mut backs = Vec::new();
        let mut gives = Vec::new();
        for &w in &others {
            let (give_tx, give_rx) = mpsc::channel();
            let (back_tx, back_rx) = mpsc::channel();
            self.shared.workers[w].send(Msg::Lend {
                give: give_tx,
                back: back_rx,
            });
            gives.push(give_rx);
            backs.push(back_tx);
        }
        let mut lent: Vec<Vec<u32>> = Vec::new();
        let mut complete = true;
        for rx in gives {
            match self.recv_serving_busy(&rx) {
                Ok(shards) => {
                    lent.push(shards.iter().map(|s| s.id()).collect());
                    for s in shards {
                        let id = s.id() as usize;
                        self.shards.slots[id] = Some(s);
                    }
                }
                Err(_) => {
                    lent.push(Vec::new());
                    complete = false;
                }
            }
        }
        // The whole pass is one write scope over every held shard, a group: each write in
        // it (multi-key or not) is GROUPED, so a later command of the pass that read an
        // earlier one's result cannot outlive it in a crash. It is settled once, below.
        self.store_coalesced(now_ms());
        let set = &mut self.shards;
        set.groups.in_pass = true;
        let all_ids: Vec<u32> = (0..set.shard_count)
            .filter(|&id| set.slots[id as usize].is_some())
            .collect();
        set.groups.begin(&mut set.slots, all_ids);
        let result = if complete { Some(f(self)) } else { None };
        let set = &mut self.shards;
        let ended = set.groups.end(&mut set.slots);
        set.groups.in_pass = false;
        // Every group the pass wrote is made durable on all its shards (one sync) and
        // decided before any shard goes back, so no owner ever serves an undecided write.
        let mut groups_failed = false;
        if let Err(e) = ended.and_then(|()| set.groups.settle(&mut set.slots)) {
            tracing::error!("multi-shard writes of a coordinated pass not durable: {e}");
            groups_failed = true;
        }
        if groups_failed {
            self.shared
                .stats
                .flush_failures
                .fetch_add(1, Ordering::Relaxed);
            self.coordinated_flush_failed = true;
        }
        if self.fsync == FsyncPolicy::Always {
            // What `f` wrote into borrowed shards, and what their owners wrote whose sync
            // is still running on the owner's ring, must be durable before `f`'s replies
            // (which may acknowledge or reveal it) can leave: flush them, then sync every
            // device once (all shards share the store's devices).
            let mut failed = false;
            let mut any = None;
            for ids in &lent {
                for &id in ids {
                    if let Some(s) = self.shards.slots[id as usize].as_mut() {
                        any.get_or_insert(id);
                        if s.has_unflushed() {
                            if let Err(e) = s.flush() {
                                tracing::error!("flush of lent shard {id} failed: {e}");
                                failed = true;
                            }
                        }
                    }
                }
            }
            if let Some(s) = any.and_then(|id| self.shards.slots[id as usize].as_mut()) {
                if let Err(e) = s.sync_store_devices() {
                    tracing::error!("sync after a coordinated command failed: {e}");
                    failed = true;
                }
            }
            if failed {
                self.shared
                    .stats
                    .flush_failures
                    .fetch_add(1, Ordering::Relaxed);
                self.coordinated_flush_failed = true;
            }
        }
        for (ids, back) in lent.into_iter().zip(backs) {
            let shards: Vec<Shard> = ids
                .iter()
                .filter_map(|&id| self.shards.slots[id as usize].take())
                .collect();
            let _ = back.send(shards);
        }
        drop(guard);
        result
    }

    // ----- the asynchronous command path (see `reads.rs`) ------------------------------

    /// Plans a keyed command whose shards we hold: `RunNow` when every record it needs is
    /// in memory (or a shard is borrowed: those are read synchronously, their reads must
    /// not outlive the loan), otherwise parks it with its reads on the ring; its reply
    /// goes to `dest` when it has run.
    fn start_keyed(
        &mut self,
        dest: ReadDest,
        spec: &'static CommandSpec,
        args: &[&[u8]],
        db: u8,
        proto: Proto,
    ) -> Start {
        let (n, id) = (self.shared.workers.len(), self.id);
        let own = move |s: u32| s as usize % n == id;
        if key_positions(spec, args).any(|p| !own(self.shards.shard_id(args[p]))) {
            return Start::Borrowed;
        }
        let mut reads = self.reads.plan_vec();
        plan(&mut self.shards, own, spec, args, db, &[], &mut reads);
        if reads.is_empty() {
            self.reads.give_plan_vec(reads);
            return Start::RunNow;
        }
        let mut p = Parked::new(dest, spec, self.reads.arg_list(args), db, proto);
        p.note_plan(&self.shards, &reads);
        let writes = p.is_write();
        self.shared
            .stats
            .parked_reads
            .fetch_add(reads.len() as u64, Ordering::Relaxed);
        self.shared
            .stats
            .parked_commands
            .fetch_add(1, Ordering::Relaxed);
        self.reads.park(p, reads, &mut self.ring, &self.fixed_files);
        Start::Parked { writes }
    }

    /// Parks a command whose restartable run missed the records `wanted` reads (`first`:
    /// it was not parked before, so it counts as a parked command).
    fn park_restarted(&mut self, p: Parked, wanted: Vec<(u32, RecordRead)>, first: bool) {
        self.shared
            .stats
            .parked_reads
            .fetch_add(wanted.len() as u64, Ordering::Relaxed);
        self.shared
            .stats
            .restart_reads
            .fetch_add(wanted.len() as u64, Ordering::Relaxed);
        self.shared.stats.restarts.fetch_add(1, Ordering::Relaxed);
        if first {
            self.shared
                .stats
                .parked_commands
                .fetch_add(1, Ordering::Relaxed);
        }
        self.reads
            .park_restarted(p, wanted, &self.shards, &mut self.ring, &self.fixed_files);
    }

    /// A device read completed: commands whose records are all in memory now run.
    fn on_read(&mut self, idx: usize, res: i32, now: u64) {
        let (n, id) = (self.shared.workers.len(), self.id);
        let own = move |s: u32| s as usize % n == id;
        let mut ready = std::mem::take(&mut self.ready_parked);
        let mut io = ReadIo {
            ring: &mut self.ring,
            fixed: &self.fixed_files,
            shards: &mut self.shards,
            own: &own,
        };
        self.reads.on_completion(idx, res, &mut io, &mut ready);
        for p in ready.drain(..) {
            self.run_parked(p, now);
        }
        self.ready_parked = ready;
    }

    /// Polls the device queues of reads that do not go through the ring (the userspace
    /// NVMe driver's queue pair, `AsyncReads`): each device reaps at most
    /// `--spdk-max-completions-per-poll` completions; commands whose reads are all back
    /// run now, as from `on_read`.
    fn poll_device_reads(&mut self, now: u64) {
        if self.reads.device_inflight() == 0 {
            return;
        }
        let (n, id) = (self.shared.workers.len(), self.id);
        let own = move |s: u32| s as usize % n == id;
        let mut ready = std::mem::take(&mut self.ready_parked);
        let mut io = ReadIo {
            ring: &mut self.ring,
            fixed: &self.fixed_files,
            shards: &mut self.shards,
            own: &own,
        };
        let done = self.reads.poll_devices(&mut io, &mut ready);
        if done > 0 {
            self.shared
                .stats
                .device_queue_reads
                .fetch_add(done as u64, Ordering::Relaxed);
        }
        for p in ready.drain(..) {
            self.run_parked(p, now);
        }
        self.ready_parked = ready;
    }

    /// `--debug-read-delay-ms`: read completions whose delay is over are handled now.
    fn release_delayed_reads(&mut self, now: u64) {
        let (n, id) = (self.shared.workers.len(), self.id);
        let own = move |s: u32| s as usize % n == id;
        let mut ready = std::mem::take(&mut self.ready_parked);
        let mut io = ReadIo {
            ring: &mut self.ring,
            fixed: &self.fixed_files,
            shards: &mut self.shards,
            own: &own,
        };
        self.reads.release_delayed(&mut io, &mut ready);
        for p in ready.drain(..) {
            self.run_parked(p, now);
        }
        self.ready_parked = ready;
    }

    /// Runs a parked command with its fetched records lent to their shards, and sends
    /// its reply where it belongs.
    fn run_parked(&mut self, mut p: Parked, now: u64) {
        if p.keyset.is_some() {
            return self.txn_reads_done(p);
        }
        let writes = p.is_write();
        if writes {
            self.round_writes = true;
        }
        let blocking = crate::commands::blocking::is_blocking(p.spec.name);
        // The reply of a local connection's first awaited command is written straight
        // into its output buffer; otherwise it gets room of its own up front (a value read
        // for GET goes in with one copy and no regrowth).
        let direct = match p.dest {
            ReadDest::Local { token, seq } if !blocking => self
                .conn_mut(token.packed())
                .and_then(|conn| conn.take_out_for(seq)),
            _ => None,
        };
        let is_direct = direct.is_some();
        let mut bytes = direct.unwrap_or_else(|| {
            let hint = p.fetched.iter().map(|f| f.len_bytes()).sum::<usize>() + 64;
            Vec::with_capacity(hint)
        });
        if let Some(e) = p.error.take() {
            ReplyBuf::new(&mut bytes, p.proto).error(&e);
        } else {
            let (mut fetched, fetched_shard) = (
                std::mem::take(&mut p.fetched),
                std::mem::take(&mut p.fetched_shard),
            );
            let (spec, db, proto, max_bulk) = (p.spec, p.db, p.proto, self.max_bulk);
            if blocking {
                super::blocking::set_current(Some(waiter_of(&p.dest, self.id, proto)));
            }
            // Restartable while restarts are left; at the bound the run reads what it
            // still misses synchronously.
            let restart = p.may_restart();
            if !restart && restartable(spec) {
                self.reads.stats.restart_fallbacks += 1;
                self.shared
                    .stats
                    .restart_fallbacks
                    .fetch_add(1, Ordering::Relaxed);
            }
            let mut wanted = if restart {
                self.reads.plan_vec()
            } else {
                Vec::new()
            };
            let prev = crate::runtime::tracking::set_current(p.caller);
            let _script_caller = crate::acl::ScriptCallerScope::set(p.script_caller.clone());
            let p_args = &p.args;
            let mut run = |shards: &mut ShardSet, round: Option<&mut dyn FnMut() -> bool>| {
                p_args.with_refs(|args| {
                    with_lent_in(shards, &mut fetched, &fetched_shard, |shards| {
                        exec_restartable(
                            shards,
                            spec,
                            args,
                            db,
                            proto,
                            now,
                            max_bulk,
                            &mut bytes,
                            restart.then_some(&mut wanted),
                            round,
                        )
                    })
                })
            };
            if is_script(spec) {
                self.with_script_shards(|shards, round| run(shards, Some(round)));
            } else {
                run(&mut self.shards, None);
            }
            if !wanted.is_empty() {
                // The run missed records below its keys: discarded (`bytes` is as it was),
                // parked again with what it fetched so far.
                crate::runtime::tracking::set_current(prev);
                super::blocking::set_current(None);
                if is_direct {
                    if let ReadDest::Local { token, .. } = p.dest {
                        if let Some(conn) = self.conn_mut(token.packed()) {
                            let meanwhile = std::mem::replace(&mut conn.out, bytes);
                            conn.out.extend_from_slice(&meanwhile);
                        }
                    }
                }
                (p.fetched, p.fetched_shard) = (fetched, fetched_shard);
                self.park_restarted(p, wanted, false);
                return;
            }
            self.reads.give_plan_vec(wanted);
            tracking::append_own(&mut bytes, proto);
            crate::runtime::tracking::set_current(prev);
            super::blocking::set_current(None);
            self.reads.recycle_fetched(fetched, fetched_shard);
        }
        self.reads.recycle_args(std::mem::take(&mut p.args));
        let blocked = super::blocking::take_blocked();
        match p.dest {
            ReadDest::Local { token, seq } => {
                if let Some(conn) = self.conn_mut(token.packed()) {
                    if is_direct {
                        conn.put_out(bytes);
                    } else if !blocked {
                        conn.fill(seq, bytes);
                    }
                    conn.parked -= 1;
                    conn.parked_writes -= u32::from(writes);
                    self.mark_ready(token.slot);
                }
            }
            ReadDest::Remote { from, token, seq } => {
                if !blocked {
                    self.outbox[from].push(Msg::Reply { token, seq, bytes });
                }
                let key = (from, token.packed());
                if let Some(o) = self.remote_order.get_mut(&key) {
                    o.parked -= 1;
                    o.parked_writes -= u32::from(writes);
                }
                self.resume_remote(from, token, now);
            }
        }
    }

    /// A request from another worker's connection. It waits here behind that
    /// connection's parked commands by the same rule as a local connection's commands.
    fn remote_request(&mut self, from: usize, token: ConnToken, req: RemoteRequest, now: u64) {
        if let Some(o) = self.remote_order.get_mut(&(from, token.packed())) {
            let readonly = lookup(&req.args[0]).is_some_and(|s| s.flags.contains(&"readonly"));
            if !o.queue.is_empty() || (o.parked > 0 && (o.parked_writes > 0 || !readonly)) {
                o.queue.push_back(req);
                return;
            }
        }
        self.run_remote(from, token, req, now);
    }

    fn run_remote(&mut self, from: usize, token: ConnToken, req: RemoteRequest, now: u64) {
        let refs: Vec<&[u8]> = req.args.iter().map(|a| a.as_slice()).collect();
        let Some(spec) = lookup(refs[0]) else {
            let mut bytes = Vec::new();
            ReplyBuf::new(&mut bytes, req.proto).error("ERR unknown command");
            self.outbox[from].push(Msg::Reply {
                token,
                seq: req.seq,
                bytes,
            });
            return;
        };
        if spec.may_write() {
            self.round_writes = true;
        }
        let dest = ReadDest::Remote {
            from,
            token,
            seq: req.seq,
        };
        let _script_caller = crate::acl::ScriptCallerScope::set(req.script_caller.clone());
        let prev = crate::runtime::tracking::set_current(req.caller);
        let start = self.start_keyed(dest, spec, &refs, req.db, req.proto);
        if matches!(start, Start::Parked { .. }) {
            crate::runtime::tracking::set_current(prev);
        }
        match start {
            Start::RunNow if restartable(spec) => {
                // As a local command's (`route_keyed`): records below its keys that are
                // not in memory park it.
                let mut bytes = Vec::new();
                let mut wanted = self.reads.plan_vec();
                let (db, proto, max_bulk) = (req.db, req.proto, self.max_bulk);
                let mut run = |shards: &mut ShardSet, round: Option<&mut dyn FnMut() -> bool>| {
                    exec_restartable(
                        shards,
                        spec,
                        &refs,
                        db,
                        proto,
                        now,
                        max_bulk,
                        &mut bytes,
                        Some(&mut wanted),
                        round,
                    )
                };
                if is_script(spec) {
                    self.with_script_shards(|shards, round| run(shards, Some(round)));
                } else {
                    run(&mut self.shards, None);
                }
                if !wanted.is_empty() {
                    let p = Parked::new(dest, spec, self.reads.arg_list(&refs), req.db, req.proto);
                    let writes = p.is_write();
                    crate::runtime::tracking::set_current(prev);
                    self.park_restarted(p, wanted, true);
                    let o = self.remote_order.entry((from, token.packed())).or_default();
                    o.parked += 1;
                    o.parked_writes += u32::from(writes);
                    return;
                }
                self.reads.give_plan_vec(wanted);
                tracking::append_own(&mut bytes, req.proto);
                crate::runtime::tracking::set_current(prev);
                self.outbox[from].push(Msg::Reply {
                    token,
                    seq: req.seq,
                    bytes,
                });
            }
            Start::RunNow | Start::Borrowed => {
                let mut bytes = Vec::new();
                if crate::commands::blocking::is_blocking(spec.name) {
                    super::blocking::set_current(Some(waiter_of(&dest, self.id, req.proto)));
                }
                self.exec_handler(spec, &refs, req.db, req.proto, now, &mut bytes);
                tracking::append_own(&mut bytes, req.proto);
                crate::runtime::tracking::set_current(prev);
                super::blocking::set_current(None);
                if !super::blocking::take_blocked() {
                    self.outbox[from].push(Msg::Reply {
                        token,
                        seq: req.seq,
                        bytes,
                    });
                }
            }
            Start::Parked { writes } => {
                let o = self.remote_order.entry((from, token.packed())).or_default();
                o.parked += 1;
                o.parked_writes += u32::from(writes);
            }
        }
    }

    /// Starts the queued requests of a remote connection that may run now.
    fn resume_remote(&mut self, from: usize, token: ConnToken, now: u64) {
        let key = (from, token.packed());
        loop {
            let Some(o) = self.remote_order.get_mut(&key) else {
                return;
            };
            let may_start = o.queue.front().is_some_and(|r| {
                let readonly = lookup(&r.args[0]).is_some_and(|s| s.flags.contains(&"readonly"));
                o.parked == 0 || (o.parked_writes == 0 && readonly)
            });
            if !may_start {
                if o.parked == 0 && o.queue.is_empty() {
                    self.remote_order.remove(&key);
                }
                return;
            }
            let Some(req) = o.queue.pop_front() else {
                return;
            };
            self.run_remote(from, token, req, now);
        }
    }

    // ----- storage and sending ----------------------------------------------

    /// Applies `client-output-buffer-limit` to every connection (Redis closes an offending
    /// client without sending what it has queued) and reports the clients' buffer memory.
    fn enforce_output_limits(&mut self, now: u64) {
        use crate::config::output_limits::Verdict;
        // Once per millisecond of the round clock: a limit is enforced (and
        // `mem_clients_normal` updated) at most ~1 ms late; a client over its hard limit
        // meanwhile is back-pressured at `OUTPUT_HIGH_WATER_BYTES` like any slow reader.
        if self.output_limits_ms == Some(now) {
            return;
        }
        self.output_limits_ms = Some(now);
        let (normal, pubsub) = (self.output_limit, self.output_limit_pubsub);
        let mut total = 0u64;
        let mut close = Vec::new();
        for (slot, c) in self.conns.iter_mut().enumerate() {
            let Some(conn) = c.as_deref_mut() else {
                continue;
            };
            total += conn.buffer_bytes() as u64;
            if conn.closing {
                continue;
            }
            let limit = if conn.subs.active() { pubsub } else { normal };
            match limit.judge(conn.output_bytes() as u64, conn.obuf_soft_since_ms, now) {
                Verdict::Fine => conn.obuf_soft_since_ms = None,
                Verdict::OverSoft(since) => conn.obuf_soft_since_ms = Some(since),
                Verdict::Close => close.push(slot as u32),
            }
        }
        for slot in close {
            if let Some(conn) = self.conns[slot as usize].as_mut() {
                tracing::warn!(
                    "Client {} scheduled to be closed ASAP for overcoming of output buffer limits.",
                    conn.addr
                );
                conn.out = Vec::new();
                conn.pending.clear();
                conn.pending_ready_bytes = 0;
                conn.held.clear();
            }
            self.shared
                .stats
                .client_output_limit_closes
                .fetch_add(1, Ordering::Relaxed);
            self.begin_close(slot);
            self.maybe_free(slot);
        }
        let st = &self.shared.stats.mem_clients_normal;
        if total >= self.reported_client_bytes {
            st.fetch_add(total - self.reported_client_bytes, Ordering::Relaxed);
        } else {
            st.fetch_sub(self.reported_client_bytes - total, Ordering::Relaxed);
        }
        self.reported_client_bytes = total;
    }

    fn submit_sends(&mut self) {
        self.gate_replies();
        for slot in 0..self.conns.len() {
            self.push_send(slot);
        }
        // Stack connections' `out` now holds only replies cleared to leave.
        #[cfg(feature = "dpdk")]
        self.dpdk_send();
    }

    /// Queues the send of a kernel connection's cleared replies (after `gate_replies`).
    fn push_send(&mut self, slot: usize) {
        {
            let Some(conn) = self.conns[slot].as_mut() else {
                return;
            };
            if conn.closing || conn.send_inflight {
                return;
            }
            let Some(fd) = conn.fd.kernel_fd() else {
                return;
            };
            if let Some(tls) = conn.tls.as_deref_mut() {
                // Replies, handshake messages and alerts, encrypted into `sending`.
                if conn.sending.is_empty() {
                    tls.seal(&mut conn.out, &mut conn.sending);
                    conn.out_cleared = 0;
                    conn.send_off = 0;
                }
            } else if conn.sending.is_empty() && !conn.out.is_empty() {
                std::mem::swap(&mut conn.sending, &mut conn.out);
                conn.out_cleared = 0;
                conn.send_off = 0;
            }
            if conn.sending.is_empty() {
                if conn.close_after_reply && conn.pending.is_empty() && conn.held.is_empty() {
                    self.begin_close(slot as u32);
                    self.maybe_free(slot as u32);
                }
                return;
            }
            let rest = &conn.sending[conn.send_off..];
            let token = ((conn.gen as u64) << 32) | slot as u64;
            let sqe = opcode::Send::new(types::Fd(fd), rest.as_ptr(), rest.len() as u32)
                .flags(libc::MSG_NOSIGNAL)
                .build()
                .user_data(user_data(OpKind::Send, token));
            conn.send_inflight = true;
            conn.ops_inflight += 1;
            push_sqe(&mut self.ring, &sqe);
        }
    }

    /// Bounded background work (expiry, tomb raider, defrag) once per round:
    /// `--background-budget-us`, raised to `--background-warrant-percent` of the
    /// round's foreground time, so background work keeps that share under load.
    fn background(&mut self, now: u64, foreground_us: u64) {
        let cli = &self.shared.settings.cli;
        let budget = cli
            .background_budget_us
            .max(foreground_us * cli.background_warrant_percent / 100);
        let due = self
            .shards
            .held()
            .filter(|shard| shard.expiry_due(now))
            .count() as u64;
        if let Some(expiry_us) = EXPIRY_MIN_US
            .max(foreground_us * EXPIRY_ROUND_PERCENT / 100)
            .checked_div(due)
        {
            for shard in self.shards.held() {
                if let Err(e) = shard.expire_due(now, expiry_us) {
                    tracing::warn!("shard {} active expiry failed: {e}", shard.id());
                }
            }
        }
        let mut backlog = false;
        for shard in self.shards.held() {
            if let Err(e) = shard.background(now, budget) {
                tracing::warn!("shard {} background work failed: {e}", shard.id());
            }
            backlog |= shard.expiry_due(now);
        }
        self.expiry_backlog = backlog;
    }

    fn wait(&mut self) {
        #[cfg(feature = "dpdk")]
        if self.dpdk.is_some() {
            self.dpdk_wait();
            return;
        }
        // Invalidations from this round's background expiry go out in the next round.
        // Keys due to expire: no park (active expiry runs again next round).
        // Reads on a device's own queue (NVMe) complete only by polling: no park.
        if !self.ready.is_empty()
            || self.retry_pending
            || self.expiry_backlog
            || self.reads.device_inflight() > 0
            || crate::runtime::tracking::pending()
        {
            let _ = self.ring.submit();
            if self.retry_pending {
                std::thread::yield_now();
            }
            return;
        }
        let busy_us = self.busy_poll_us;
        if busy_us > 0 {
            let _ = self.ring.submit();
            let until = Instant::now() + Duration::from_micros(busy_us);
            while Instant::now() < until {
                if !self.ring.completion().is_empty() {
                    return;
                }
                // Deferred task work (completions not yet posted) runs when we enter.
                if self.ring.submission().taskrun() {
                    let _ = self.ring.submit();
                    return;
                }
                // Not parked yet, so other workers do not signal: look ourselves.
                if self.mailbox_waiting() {
                    return;
                }
                std::hint::spin_loop();
            }
        }
        let unflushed = self
            .shards
            .slots
            .iter()
            .flatten()
            .any(|s| s.has_unflushed());
        // Longest park when nothing is pending (active expiry; 100 ms unless a test sets
        // the hook).
        let idle_wait_ms = self.shared.settings.cli.debug_idle_wait_ms.max(1);
        let wait_ms = if !self.delayed_syncs.is_empty() || self.reads.has_delayed() {
            1
        } else if unflushed {
            self.shared.settings.cli.flush_max_ms.clamp(1, idle_wait_ms)
        } else {
            idle_wait_ms
        };
        // Wake at the earliest deadline of a client blocked here (rounded up to 1 ms).
        let wait_ms = match super::blocking::next_deadline_ms(self.id) {
            Some(d) => wait_ms.min(d.saturating_sub(now_ms()).max(1)),
            None => wait_ms,
        };
        self.wait_ring_us(wait_ms * 1000);
    }

    /// Waits in the ring for a completion or `wait_us`, whichever comes first (a timeout
    /// or a signal is not an error).
    pub(super) fn wait_ring_us(&mut self, wait_us: u64) {
        // Parking (docs/architecture.md, "Waking a worker"): announce it, then look at
        // the mailbox once more. The fence pairs with `WorkerLink::needs_wake`: a sender
        // that pushed before our look is seen by it, one that pushes after sees `parked`
        // and signals the eventfd our ring reads.
        let link = &self.shared.workers[self.id];
        link.parked.store(true, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.mailbox_waiting() {
            self.shared.workers[self.id]
                .parked
                .store(false, Ordering::Relaxed);
            let _ = self.ring.submit();
            return;
        }
        self.round_parks += 1;
        self.park_ring_us(wait_us);
        self.shared.workers[self.id]
            .parked
            .store(false, Ordering::Relaxed);
    }

    fn park_ring_us(&mut self, wait_us: u64) {
        let ts = types::Timespec::new()
            .sec(wait_us / 1_000_000)
            .nsec(((wait_us % 1_000_000) * 1000) as u32);
        let args = types::SubmitArgs::new().timespec(&ts);
        match self.ring.submitter().submit_with_args(1, &args) {
            Ok(_) => {}
            Err(e)
                if e.raw_os_error() == Some(libc::ETIME)
                    || e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => tracing::error!("io_uring wait failed: {e}"),
        }
    }
}

/// The eventfd increment a signal writes (`send_outbox`); static, so the buffer outlives
/// the write on the ring.
static WAKE_ONE: u64 = 1;

/// The busy-poll time a worker uses: `--busy-poll-us`, or none when there are more
/// workers than CPUs in their mask. Workers sharing a CPU take turns on it; one spinning
/// for a completion would only delay the other, which has the work (often the very
/// request the spinner waits for).
fn busy_poll_us(settings: &crate::config::Settings) -> u64 {
    if settings.threads > settings.cpus.len() {
        0
    } else {
        settings.cli.busy_poll_us
    }
}

/// The blocked-client identity of a command's reply destination (`me`: this worker).
fn waiter_of(dest: &ReadDest, me: usize, proto: Proto) -> super::blocking::Waiter {
    let (worker, token, seq) = match *dest {
        ReadDest::Local { token, seq } => (me, token, seq),
        ReadDest::Remote { from, token, seq } => (from, token, seq),
    };
    super::blocking::Waiter {
        worker,
        token,
        seq,
        proto,
    }
}

/// Runs a keyed handler on `shards`, its reply (or error) into `out`.
#[allow(clippy::too_many_arguments)]
fn exec_on(
    shards: &mut ShardSet,
    spec: &CommandSpec,
    args: &[&[u8]],
    db: u8,
    proto: Proto,
    now: u64,
    max_bulk: usize,
    out: &mut Vec<u8>,
) {
    exec_restartable(
        shards, spec, args, db, proto, now, max_bulk, out, None, None,
    );
}

/// `exec_on`; with `wanted`, as a restartable run (`reads.rs`, "Restarting on a miss"): a
/// record not in memory is not read but added to `wanted`, and then the run is discarded —
/// `out` is as it was, and nothing else happened (no write: the shards refuse them after a
/// miss; no stats, tracking or blocked-client work) — for the caller to read what is
/// wanted and run the command again.
#[allow(clippy::too_many_arguments)]
fn exec_restartable(
    shards: &mut ShardSet,
    spec: &CommandSpec,
    args: &[&[u8]],
    db: u8,
    proto: Proto,
    now: u64,
    max_bulk: usize,
    out: &mut Vec<u8>,
    wanted: Option<&mut Vec<(u32, RecordRead)>>,
    busy_round: Option<&mut dyn FnMut() -> bool>,
) {
    let handler = spec.handler.expect("keyed commands have handlers");
    // The handler, the keyspace-hit count and the write scope hash the first key once.
    let _memo = crate::runtime::keymemo::enter(args.get(1).copied().unwrap_or_default());
    let mut ctx = Ctx {
        shards,
        db,
        now_ms: now,
        max_bulk,
        // The hook's round lives as long as the shards' borrow here (a shorter object
        // lifetime than the caller's, which `Ctx` needs).
        busy_round: match busy_round {
            Some(round) => Some(round as &mut dyn FnMut() -> bool),
            None => None,
        },
    };
    let mut r = ReplyBuf::new(out, proto);
    let mark = r.out.len();
    let (started, errors_before) = (Instant::now(), super::cmdstats::errors_seen());
    let waiter = super::blocking::before_handler();
    super::blocking::defer_begin();
    let scope = write_scope(ctx.shards, spec, args);
    // Pushes/pops on one paged list coalesce within the batch (docs/collections.md 5a);
    // every other command first stores what they coalesced. Outside the restartable run:
    // such a store may read a page synchronously.
    let allowed =
        scope.is_none() && !ctx.shards.groups.is_open() && !crate::runtime::tracking::active();
    if let Err(e) =
        crate::commands::collection::coalesce_begin(ctx.shards, spec.name, args, db, now, allowed)
    {
        tracing::error!("storing coalesced lists failed: {e}");
    }
    if let Some(ids) = scope.clone() {
        let set = &mut *ctx.shards;
        set.groups.begin(&mut set.slots, ids);
    }
    let restart = wanted.is_some();
    let events_mark = if restart {
        crate::storage::prefetch::restartable_begin();
        crate::runtime::lookups::hold();
        crate::runtime::events::queued()
    } else {
        0
    };
    // INFO keyspace_hits/misses and `keymiss`: the handler's lookups of its read keys.
    let reads = super::keystats::begin(spec, args);
    let mut res = handler(&mut ctx, args, &mut r);
    crate::commands::collection::coalesce_end();
    if let Some(wanted) = wanted {
        crate::storage::prefetch::restartable_end(wanted);
        let discarded = !wanted.is_empty();
        crate::runtime::lookups::release(!discarded);
        if discarded {
            // Discarded: nothing was written, so the scope has nothing to make durable; its
            // lookups are counted (and `keymiss` fired) by the run that is kept.
            if reads.is_some() {
                crate::runtime::lookups::disarm(|_, _| ());
            }
            crate::runtime::events::truncate(events_mark);
            if scope.is_some() {
                let _ = close_write_scope(ctx.shards);
            }
            r.out.truncate(mark);
            super::blocking::defer_end(shards, now, max_bulk);
            return;
        }
    }
    super::keystats::settle(reads, spec, ctx.shards, args, db);
    if scope.is_some() {
        if let Err(e) = close_write_scope(ctx.shards) {
            // The write may not be durable, or not whole: the client must not take it as done.
            tracing::error!("a multi-record write could not be made durable: {e}");
            res = Err(crate::commands::storage_error(e));
        }
    }
    if let Err(e) = res {
        r.out.truncate(mark);
        r.error(&e);
    }
    if r.out.len().saturating_sub(mark) >= TRIM_AFTER_REPLY_BYTES {
        // A reply this big was built from a value about as big (HGETALL, SMEMBERS, LRANGE
        // of a big paged collection), freed by now: give it back to the kernel, which glibc
        // would not do for small freed chunks (RSS would stay at the command's peak).
        crate::runtime::trim_heap();
    }
    if crate::runtime::tracking::active() {
        tracking::after_command(spec, args);
    }
    super::blocking::after_handler(waiter, shards, spec, args, db, now, max_bulk);
    super::blocking::defer_end(shards, now, max_bulk);
    let failed = super::cmdstats::errors_seen() != errors_before;
    super::cmdstats::record_call(spec, args, started.elapsed().as_nanos() as u64, failed);
}

/// The shards of a command that may write several records: several keys, or a script
/// (`numkeys` commands), over the held shards of its keys. `None` for reads and one-key
/// writes, which need no scope (they write one record; nothing extra is done for them).
fn write_scope(shards: &ShardSet, spec: &CommandSpec, args: &[&[u8]]) -> Option<Vec<u32>> {
    // One key (or none) and no `numkeys`: two integer compares, nothing else.
    if spec.movable.is_none() && spec.first_key == spec.last_key {
        return None;
    }
    if !spec.may_write() {
        return None;
    }
    let mut keys = key_positions(spec, args);
    let first = keys.next()?;
    let second = keys.next();
    if second.is_none() && spec.movable.is_none() {
        return None;
    }
    let mut ids: Vec<u32> = std::iter::once(first)
        .chain(second)
        .chain(keys)
        .filter_map(|p| args.get(p))
        .map(|k| shards.shard_id(k))
        .filter(|&id| shards.slots[id as usize].is_some())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    (!ids.is_empty()).then_some(ids)
}

/// Ends the innermost write scope; outside a coordinated pass (which settles once at its
/// end, `with_workers`) an ended group is made durable and decided at once.
pub(super) fn close_write_scope(shards: &mut ShardSet) -> Result<(), StorageError> {
    let set = &mut *shards;
    let ended = set.groups.end(&mut set.slots);
    if !set.groups.in_pass {
        set.groups.settle(&mut set.slots)?;
    }
    ended
}

fn write_all_now(fd: &OwnedFd, msg: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut s = std::fs::File::from(fd.try_clone()?);
    s.write_all(msg)
}

pub const DENIED: &str = "-DENIED Redis is running in protected mode because protected mode is enabled and no password is set for the default user. In this mode connections are only accepted from the loopback interface. If you want to connect from external computers to Redis you may adopt one of the following solutions: 1) Just disable protected mode sending the command 'CONFIG SET protected-mode no' from the loopback interface by connecting to Redis from the same host the server is running, however MAKE SURE Redis is not publicly accessible from internet if you do so. Use CONFIG REWRITE to make this change permanent. 2) Alternatively you can just disable the protected mode by editing the Redis configuration file, and setting the protected mode option to 'no', and then restarting the server. 3) If you started the server manually just for testing, restart it with the '--protected-mode no' option. 4) Set up an authentication password for the default user. NOTE: You only need to do one of the above things in order for the server to start accepting connections from the outside.\r\n";
