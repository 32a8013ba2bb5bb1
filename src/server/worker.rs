//! The worker loop. See the module essay in `mod.rs`.

use super::conn::{Conn, Slot, Transport};
use super::{local, now_ms, ClientEntry, ConnToken, Msg, Shared};
use crate::commands::table::key_positions;
use crate::commands::{lookup, CommandSpec, Ctx, Kind, ShardSet};
use crate::device::AlignedBuf;
use crate::resp::{parse_command, ParsedCommand, Proto, ReplyBuf};
use crate::runtime::bufring::{BufRing, RECV_GROUP_ID};
use crate::runtime::{split_user_data, user_data, OpKind};
use crate::storage::get_async::{GetReadStep, GetStep, PutStep, ReadPlan};
use crate::storage::{FsyncPolicy, Shard, StorageError, Value, ValueKind};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
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
/// Longest park when nothing is pending (active expiry, shutdown checks).
const IDLE_WAIT_MS: u64 = 100;
/// GET device reads in flight per worker; beyond it GETs read synchronously.
const READS_INFLIGHT_MAX: usize = 256;
/// Arguments of a command kept on the stack while it runs; longer lists use the heap.
const ARGS_INLINE: usize = 8;
/// Size of a pooled read buffer (the engine's first read window).
const READ_BUFFER_BYTES: usize = 8192;
/// Data files registered with the ring (reads, chunk writes and syncs name them by
/// index: no file lookup and reference count per operation); more use plain fds.
const FIXED_FILES_MAX: u32 = 16;
/// Pooled read buffers registered with the ring at start (`IORING_REGISTER_BUFFERS`):
/// one per read that may be in flight. A read into a registered buffer skips pinning
/// its pages on every submission (`get_user_pages`, a few % of a GET's CPU time).
const FIXED_READ_BUFFERS: usize = READS_INFLIGHT_MAX;
const _: () = assert!(FIXED_READ_BUFFERS <= u16::MAX as usize);
/// Key and value copies kept by pending reads come from a pool, so a steady stream of
/// GETs and SETs allocates nothing; buffers bigger than this are dropped, not pooled.
const POOLED_BYTES_MAX_BYTES: usize = 64 << 10;
/// Buffers the pool keeps: a key and a value for every read that may be in flight.
const POOLED_BUFFERS_MAX: usize = 2 * READS_INFLIGHT_MAX;

/// Where the answer to an asynchronous GET goes.
#[derive(Clone, Copy)]
enum ReadDest {
    Local {
        token: ConnToken,
        seq: u64,
    },
    Remote {
        from: usize,
        token: ConnToken,
        seq: u64,
    },
}

/// A GET waiting for its device read. The buffer is owned here, untouched,
/// until the read's completion arrives. `key` and `set_value` come from the
/// worker's byte-buffer pool and go back to it when the operation ends.
struct PendingRead {
    dest: ReadDest,
    /// `Some(value)`: a plain SET verifying the key it overwrites; `None`: a GET.
    set_value: Option<Vec<u8>>,
    shard: u32,
    db: u8,
    proto: Proto,
    key: Vec<u8>,
    plan: ReadPlan,
    buf: ReadBuf,
}

/// A GET/SET read buffer: one of the worker's pooled buffers (registered with the ring
/// when `fixed` names its index), or a larger one allocated for a long record.
struct ReadBuf {
    bytes: AlignedBuf,
    /// Index among the ring's registered buffers. Such a buffer is never freed while the
    /// ring lives: it is always in `Worker::read_bufs` or in a pending read.
    fixed: Option<u16>,
}

/// Group commit that does not stall the worker: a flush *epoch* writes every
/// shard's staged records (one device write each) and then syncs the data files
/// with `fdatasync` submitted on the worker's ring. While it runs the worker
/// goes on serving; replies that acknowledge (or reveal) writes not yet durable
/// are held, tagged with the epoch that covers them, and leave when it ends.
/// Up to `EPOCHS_INFLIGHT_MAX` epochs are in flight; their writes are issued
/// in order (each completes before the next starts) and they become durable in
/// order, so a reply never leaves before every earlier write is durable.
#[derive(Default)]
struct GroupCommit {
    /// Epochs started; epochs whose syncs all completed (`durable <= issued`).
    issued: u64,
    durable: u64,
    /// Epochs started and not yet durable, oldest first.
    inflight: VecDeque<Epoch>,
    /// A write ran after the newest epoch started: the next must cover it.
    wanted: bool,
    /// Chunk writes on the ring (all belong to the newest epoch).
    writes_inflight: u32,
    /// Held replies tagged with an epoch up to this one must not leave (the
    /// epoch failed); with the message they get instead.
    failed_upto: u64,
    failed_text: String,
}

struct Epoch {
    id: u64,
    /// Its chunk writes still in flight; its syncs are issued when none is left.
    writes_left: u32,
    /// The data files to sync once its writes are done.
    fds: Vec<RawFd>,
    /// Its `fdatasync`s that have not completed.
    syncs_left: u32,
    /// Its first error (its write or one of its syncs).
    error: Option<String>,
    started: Instant,
    /// When its writes were done and its syncs issued.
    synced_from: Option<Instant>,
}

/// Group-commit epochs whose `fdatasync` may be in flight at once. More than
/// one lets a write that arrives during a sync start its own sync at once
/// instead of waiting for the one in flight to end.
const EPOCHS_INFLIGHT_MAX: usize = 8;

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

pub struct Worker {
    pub id: usize,
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
    wake_buf: Box<u64>,
    ready: Vec<u32>,
    /// Connections stopped at a command that needs other workers' shards;
    /// served together, once per round, while those shards are lent to us.
    deferred: Vec<u32>,
    retry_pending: bool,
    outbox: Vec<Vec<Msg>>,
    parsed: ParsedCommand,
    pub fsync: FsyncPolicy,
    pub max_bulk: usize,
    query_limit: usize,
    commands_this_round: u64,
    cqes: Vec<(u64, i32, u32)>,
    reads: Vec<Option<PendingRead>>,
    free_reads: Vec<usize>,
    reads_inflight: usize,
    /// Idle pooled read buffers (declared after `ring`, so dropped after it: the ring
    /// may have them registered).
    read_bufs: Vec<ReadBuf>,
    /// Spare buffers for pending reads' key and value copies (see `POOLED_BUFFERS_MAX`).
    spare_bytes: Vec<Vec<u8>>,
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
    /// `slowlog-log-slower-than` as of this round (negative: off), read from the runtime
    /// configuration once per round and after each connection/server command (CONFIG
    /// SET is one) rather than under its lock for every command.
    slowlog_threshold_us: i64,
    /// The DPDK port and TCP stack this worker drives (`--network=dpdk`, worker 0).
    #[cfg(feature = "dpdk")]
    dpdk: Option<DpdkNet>,
}

/// How an operation names a data file: registered index or plain descriptor.
enum FileTarget {
    Fixed(u32),
    Fd(RawFd),
}

fn file_target(fixed: &[RawFd], fd: RawFd) -> FileTarget {
    match fixed.iter().position(|&f| f == fd) {
        Some(i) => FileTarget::Fixed(i as u32),
        None => FileTarget::Fd(fd),
    }
}

/// Records one shard's part of an epoch: the files it needs synced, or its error.
fn note_flush(epoch: &mut Epoch, shard: u32, r: Result<Vec<RawFd>, crate::storage::StorageError>) {
    match r {
        Ok(list) => {
            for fd in list {
                if !epoch.fds.contains(&fd) {
                    epoch.fds.push(fd);
                }
            }
        }
        Err(e) => {
            tracing::error!("shard {shard} flush failed: {e}");
            epoch.error.get_or_insert(e.to_string());
        }
    }
}

fn push_sqe(ring: &mut IoUring, sqe: &squeue::Entry) {
    loop {
        // SAFETY: every SQE we build points at memory that outlives the
        // operation: connection buffers are not touched while their send is
        // in flight (`send_inflight`), GET read buffers are owned by their
        // `PendingRead` until its completion, receive buffers belong to the buffer
        // ring, the wake buffer is a Box owned by the worker, and a chunk write's
        // bytes are in a staging buffer its shard keeps unchanged and alive (parked
        // if the block is sealed meanwhile) until the write's completion reaches
        // `Shard::flush_chunk_done`; `finish` waits for those completions.
        if unsafe { ring.submission().push(sqe) }.is_ok() {
            return;
        }
        let _ = ring.submit();
    }
}

impl Worker {
    pub fn new(
        id: usize,
        shared: Arc<Shared>,
        shards: ShardSet,
        listeners: Vec<OwnedFd>,
        mailbox: mpsc::Receiver<Msg>,
    ) -> std::io::Result<Worker> {
        // Allocated before the ring, so that an early return drops the ring first.
        let read_bufs: Vec<AlignedBuf> = (0..FIXED_READ_BUFFERS)
            .map(|_| AlignedBuf::new_zeroed(READ_BUFFER_BYTES))
            .collect();
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
        let read_bufs = Self::register_read_bufs(&ring, read_bufs);
        let workers = shared.workers.len();
        let mut w = Worker {
            id,
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
            wake_buf: Box::new(0),
            ready: Vec::new(),
            deferred: Vec::new(),
            retry_pending: false,
            outbox: (0..workers).map(|_| Vec::new()).collect(),
            parsed: ParsedCommand::default(),
            commands_this_round: 0,
            cqes: Vec::with_capacity(1024),
            reads: Vec::new(),
            free_reads: Vec::new(),
            reads_inflight: 0,
            read_bufs,
            spare_bytes: Vec::new(),
            fixed_files: Vec::new(),
            round_writes: false,
            last_background_flush_ms: 0,
            commit: GroupCommit::default(),
            round_need: 0,
            held_replies: VecDeque::new(),
            any_held: false,
            delayed_syncs: VecDeque::new(),
            coordinated_flush_failed: false,
            slowlog_threshold_us: 0,
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

    /// Registers the data files of the shards we hold (at start, and when recovery
    /// hands shards over); files already registered are skipped.
    fn register_shard_files(&mut self) {
        let mut fds: Vec<RawFd> = Vec::new();
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

    /// The ring's name for a data file: its registered index if it has one.
    fn file_target(&self, fd: RawFd) -> FileTarget {
        file_target(&self.fixed_files, fd)
    }

    pub fn run(mut self) {
        crate::scripting::install_catalog(self.shared.scripts.clone());
        for i in 0..self.listeners.len() {
            self.arm_accept(i);
        }
        self.arm_wake();
        loop {
            let now = now_ms();
            self.fsync = super::fsync_from_u8(self.shared.fsync_policy.load(Ordering::Relaxed));
            self.refresh_slowlog_threshold();
            self.reap(now);
            if !self.delayed_syncs.is_empty() {
                self.release_delayed_syncs(now);
            }
            #[cfg(feature = "dpdk")]
            self.dpdk_receive(now);
            let round_start = Instant::now();
            self.drain_mailbox(now);
            self.process_ready(now, round_start);
            self.flush_storage(now);
            self.send_outbox();
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
            if self.shared.shutdown.load(Ordering::SeqCst) {
                break;
            }
            self.wait();
        }
        self.finish();
    }

    fn finish(mut self) {
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
            || ((self.reads_inflight > 0 || !self.commit.inflight.is_empty())
                && Instant::now() < deadline)
        {
            if self.delayed_syncs.is_empty() {
                let _ = self.ring.submit_and_wait(1);
            } else {
                let _ = self.ring.submit();
                std::thread::sleep(Duration::from_millis(1));
                self.release_delayed_syncs(now_ms());
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
        let mut cqes = std::mem::take(&mut self.cqes);
        cqes.clear();
        for cqe in self.ring.completion() {
            cqes.push((cqe.user_data(), cqe.result(), cqe.flags()));
        }
        for &(ud, res, flags) in &cqes {
            let (kind, token) = split_user_data(ud);
            match kind {
                k if k == OpKind::Accept as u8 => self.on_accept(token as usize, res, flags, now),
                k if k == OpKind::Recv as u8 => self.on_recv(token, res, flags),
                k if k == OpKind::Send as u8 => self.on_send(token, res),
                k if k == OpKind::Wake as u8 => self.arm_wake(),
                k if k == OpKind::Read as u8 => self.on_read(token as usize, res, now),
                k if k == OpKind::Fsync as u8 => self.on_fsync(token, res, now),
                k if k == OpKind::ChunkWrite as u8 => self.on_chunk_write(token, res, now),
                _ => tracing::error!("unknown completion kind {kind}"),
            }
        }
        self.cqes = cqes;
    }

    fn on_accept(&mut self, listener: usize, res: i32, flags: u32, now: u64) {
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
        let authenticated = match self.admit(loopback) {
            Ok(authenticated) => authenticated,
            Err(refusal) => {
                let _ = write_all_now(&fd, refusal);
                return;
            }
        };
        let slot = self.install_conn(Transport::Kernel(fd), addr, laddr, authenticated, now);
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
        if rt.protected_mode && rt.requirepass.is_none() && !loopback {
            stats.rejected_connections.fetch_add(1, Ordering::Relaxed);
            return Err(DENIED.as_bytes());
        }
        Ok(rt.requirepass.is_none())
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
                    conn.inbuf
                        .extend_from_slice(self.bufring.data(bid, data_len));
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
        let was_monitor = conn.monitor;
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
            self.conns[slot as usize] = None; // drops (closes) the fd
            self.free_slots.push(slot);
        }
    }

    // ----- mailbox ---------------------------------------------------------

    fn drain_mailbox(&mut self, now: u64) {
        while let Ok(msg) = self.mailbox.try_recv() {
            match msg {
                Msg::Request {
                    from,
                    token,
                    seq,
                    db,
                    proto,
                    args,
                } => {
                    if args.len() == 2 && args[0].eq_ignore_ascii_case(b"get") {
                        let dest = ReadDest::Remote { from, token, seq };
                        let shard = self.shards.shard_id(&args[1]);
                        if let Some(v) = self.try_get_async(dest, shard, db, &args[1], proto, now) {
                            let mut bytes = Vec::new();
                            write_get_reply(&mut ReplyBuf::new(&mut bytes, proto), v);
                            self.outbox[from].push(Msg::Reply { token, seq, bytes });
                        }
                        continue;
                    }
                    let refs: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
                    if lookup(refs[0]).is_some_and(|spec| spec.may_write()) {
                        self.round_writes = true;
                    }
                    let mut bytes = Vec::new();
                    if let Some(spec) = lookup(refs[0]) {
                        self.exec_handler(spec, &refs, db, proto, now, &mut bytes);
                    }
                    self.outbox[from].push(Msg::Reply { token, seq, bytes });
                }
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
                    let mine: Vec<Shard> = self
                        .shards
                        .slots
                        .iter_mut()
                        .filter_map(|s| s.take())
                        .collect();
                    if give.send(mine).is_ok() {
                        match back.recv() {
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
                    for mut shard in shards {
                        shard.set_fsync_policy(policy);
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
                Msg::Monitor { token, line } => {
                    let tok = token.packed();
                    if let Some(conn) = self.conn_mut(tok) {
                        if conn.pending.is_empty() {
                            conn.out.extend_from_slice(&line);
                        } else {
                            conn.pending.push_back(Slot::Ready(line));
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
                let _ = link.tx.send(m);
            }
            crate::runtime::eventfd_signal(link.wake.as_raw_fd());
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
            if conn.write_blocked
                || conn.pending.len() >= PENDING_REPLIES_MAX
                || conn.out.len() > OUTPUT_HIGH_WATER_BYTES
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
            return Outcome::Done;
        };
        if (spec.arity > 0 && args.len() != spec.arity as usize)
            || (spec.arity < 0 && args.len() < (-spec.arity) as usize)
        {
            let msg = crate::commands::wrong_args(spec.name);
            conn.reply(|r| r.error(&msg));
            return Outcome::Done;
        }
        if !conn.authenticated && !matches!(spec.name, "auth" | "hello" | "quit" | "reset") {
            conn.reply(|r| r.error("NOAUTH Authentication required."));
            return Outcome::Done;
        }
        if self.shared.loading.load(Ordering::Acquire)
            && (!spec.flags.contains(&"loading")
                || matches!(spec.name, "save" | "bgsave" | "defrag" | "tombraider"))
        {
            conn.reply(|r| r.error("LOADING Redis is loading the dataset in memory"));
            return Outcome::Done;
        }
        // Timing costs two clock reads per command: only when the slow log is on.
        let started = (self.slowlog_threshold_us >= 0).then(Instant::now);
        if spec.may_write() {
            self.round_writes = true;
        }
        let waiting_remote = conn.pending.iter().any(|p| matches!(p, Slot::Waiting(_)));
        let outcome = match spec.kind {
            Kind::Local => {
                let outcome = local::run(self, conn, slot, spec, args, now);
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
        if matches!(outcome, Outcome::Done) {
            self.commands_this_round += 1;
            conn.commands += 1;
            conn.last_cmd_ms = now;
            if self.shared.monitor_count.load(Ordering::Relaxed) > 0 && spec.name != "monitor" {
                self.feed_monitors(conn, args);
            }
            if let Some(started) = started {
                let micros = started.elapsed().as_micros() as u64;
                self.maybe_slowlog(conn, args, micros);
            }
        }
        outcome
    }

    fn refresh_slowlog_threshold(&mut self) {
        let rt = self.shared.runtime.read().expect("runtime lock");
        self.slowlog_threshold_us = rt.slowlog_log_slower_than_us;
    }

    fn feed_monitors(&mut self, conn: &Conn, args: &[&[u8]]) {
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
        let handler = spec.handler.expect("keyed commands have handlers");
        let mut ctx = Ctx {
            shards: &mut self.shards,
            db,
            now_ms: now,
            max_bulk: self.max_bulk,
        };
        let mut r = ReplyBuf::new(out, proto);
        let mark = r.out.len();
        if let Err(e) = handler(&mut ctx, args, &mut r) {
            r.out.truncate(mark);
            r.error(&e);
        }
    }

    fn run_local(&mut self, conn: &mut Conn, spec: &CommandSpec, args: &[&[u8]], now: u64) {
        let (db, proto) = (conn.db, conn.proto);
        if conn.pending.is_empty() {
            let mut out = std::mem::take(&mut conn.out);
            self.exec_handler(spec, args, db, proto, now, &mut out);
            conn.out = out;
        } else {
            let mut out = Vec::new();
            self.exec_handler(spec, args, db, proto, now, &mut out);
            conn.pending.push_back(Slot::Ready(out));
        }
    }

    /// Runs a keyed command here if we hold all its shards, sends it to the
    /// one worker that owns them, or defers it (keys on several workers).
    fn route_keyed(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        spec: &CommandSpec,
        args: &[&[u8]],
        now: u64,
    ) -> Outcome {
        let mut all_held = true;
        let mut owner: Option<usize> = None;
        let mut several = false;
        // The shard of the first key (GET and SET have one key; computed once).
        let mut first_shard: Option<u32> = None;
        for pos in key_positions(spec, args) {
            let shard = self.shards.shard_id(args[pos]);
            first_shard.get_or_insert(shard);
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
        if let (true, Some(shard)) = (all_held, first_shard) {
            if spec.name == "set" && args.len() == 3 {
                let seq = conn.next_seq;
                let dest = ReadDest::Local {
                    token: ConnToken {
                        slot,
                        gen: conn.gen,
                    },
                    seq,
                };
                let (key, value) = (args[1], args[2]);
                match self.try_set_async(dest, shard, conn.db, key, value, conn.proto, now) {
                    Some(res) => conn.reply(|r| write_set_reply(r, res)),
                    None => {
                        let reserved = conn.reserve();
                        debug_assert_eq!(reserved, seq);
                        conn.write_blocked = true;
                    }
                }
                return Outcome::Done;
            }
            if spec.name == "get" {
                let seq = conn.next_seq;
                let dest = ReadDest::Local {
                    token: ConnToken {
                        slot,
                        gen: conn.gen,
                    },
                    seq,
                };
                match self.try_get_async(dest, shard, conn.db, args[1], conn.proto, now) {
                    Some(v) => conn.reply(|r| write_get_reply(r, v)),
                    None => {
                        let reserved = conn.reserve();
                        debug_assert_eq!(reserved, seq);
                    }
                }
                return Outcome::Done;
            }
            self.run_local(conn, spec, args, now);
            return Outcome::Done;
        }
        if all_held {
            self.run_local(conn, spec, args, now);
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
        });
        Outcome::Done
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
            match rx.recv() {
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
        let result = if complete { Some(f(self)) } else { None };
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

    // ----- asynchronous GET ----------------------------------------------------

    /// Starts a GET on one of our own shards (`shard_id` is the key's). `Some(answer)`:
    /// answered now. `None`: a device read is in flight and `dest` will get the reply.
    fn try_get_async(
        &mut self,
        dest: ReadDest,
        shard_id: u32,
        db: u8,
        key: &[u8],
        proto: Proto,
        now: u64,
    ) -> Option<Result<Option<Value>, StorageError>> {
        debug_assert_eq!(shard_id, self.shards.shard_id(key));
        let own = shard_id as usize % self.shared.workers.len() == self.id;
        let Some(shard) = self.shards.slots[shard_id as usize].as_mut() else {
            return Some(Err(StorageError::Corrupt("shard not held".into())));
        };
        if !own || self.reads_inflight >= READS_INFLIGHT_MAX {
            return Some(shard.get(db, key, now));
        }
        match shard.get_begin(db, key, now) {
            Ok(GetStep::Done(v)) => Some(Ok(v)),
            Err(e) => Some(Err(e)),
            Ok(GetStep::Read(plan)) => {
                let buf = self.read_buf_for(plan.len_bytes);
                let key = self.pooled_copy(key);
                let read = PendingRead {
                    dest,
                    set_value: None,
                    shard: shard_id,
                    db,
                    proto,
                    key,
                    plan,
                    buf,
                };
                self.submit_read(read);
                None
            }
        }
    }

    /// Starts a plain `SET key value` on one of our own shards (`shard_id` is the key's).
    /// `Some(result)`: done now. `None`: the read that verifies the overwritten key is
    /// in flight.
    #[allow(clippy::too_many_arguments)]
    fn try_set_async(
        &mut self,
        dest: ReadDest,
        shard_id: u32,
        db: u8,
        key: &[u8],
        value: &[u8],
        proto: Proto,
        now: u64,
    ) -> Option<Result<(), StorageError>> {
        debug_assert_eq!(shard_id, self.shards.shard_id(key));
        let own = shard_id as usize % self.shared.workers.len() == self.id;
        let inflight_full = self.reads_inflight >= READS_INFLIGHT_MAX;
        let Some(shard) = self.shards.slots[shard_id as usize].as_mut() else {
            return Some(Err(StorageError::Corrupt("shard not held".into())));
        };
        if !own || inflight_full {
            return Some(shard.put(db, key, ValueKind::String, value, None, now));
        }
        match shard.put_begin(db, key, ValueKind::String, value, None, now) {
            Ok(PutStep::Done) => Some(Ok(())),
            Err(e) => Some(Err(e)),
            Ok(PutStep::Read(plan)) => {
                let buf = self.read_buf_for(plan.len_bytes);
                let key = self.pooled_copy(key);
                let value = self.pooled_copy(value);
                let read = PendingRead {
                    dest,
                    set_value: Some(value),
                    shard: shard_id,
                    db,
                    proto,
                    key,
                    plan,
                    buf,
                };
                self.submit_read(read);
                None
            }
        }
    }

    /// A copy of `bytes` in a buffer from the pool (allocated only when the pool is empty).
    fn pooled_copy(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut v = self.spare_bytes.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(bytes);
        v
    }

    /// Gives a buffer from `pooled_copy` back to the pool (or frees it when the pool is full).
    fn recycle_bytes(&mut self, v: Vec<u8>) {
        if v.capacity() <= POOLED_BYTES_MAX_BYTES && self.spare_bytes.len() < POOLED_BUFFERS_MAX {
            self.spare_bytes.push(v);
        }
    }

    /// Registers the pooled read buffers with `ring` as fixed buffers (index = position).
    /// Without registration (an old kernel, a locked-memory limit) they serve as plain
    /// buffers and reads use `IORING_OP_READ`.
    fn register_read_bufs(ring: &IoUring, bufs: Vec<AlignedBuf>) -> Vec<ReadBuf> {
        let mut bufs = bufs;
        let iovecs: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_slice().as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: the buffers stay allocated, unmoved on the heap, for as long as the
        // ring: the caller stores them in `Worker::read_bufs`, a field declared (and so
        // dropped) after `ring`, and a pooled buffer is only ever moved between that pool
        // and a `PendingRead` (also dropped after `ring`), never freed.
        let registered = match unsafe { ring.submitter().register_buffers(&iovecs) } {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!("read buffers not registered with io_uring: {e}");
                false
            }
        };
        bufs.into_iter()
            .enumerate()
            .map(|(i, bytes)| ReadBuf {
                bytes,
                fixed: registered.then_some(i as u16),
            })
            .collect()
    }

    fn read_buf_for(&mut self, len: usize) -> ReadBuf {
        if len <= READ_BUFFER_BYTES {
            if let Some(buf) = self.read_bufs.pop() {
                return buf;
            }
        }
        ReadBuf {
            bytes: AlignedBuf::new_zeroed(len.max(READ_BUFFER_BYTES)),
            fixed: None,
        }
    }

    fn submit_read(&mut self, mut read: PendingRead) {
        let idx = match self.free_reads.pop() {
            Some(i) => i,
            None => {
                self.reads.push(None);
                self.reads.len() - 1
            }
        };
        let len = read.plan.len_bytes.min(read.buf.bytes.len());
        let ptr = read.buf.bytes.as_mut_slice().as_mut_ptr();
        let off = read.plan.offset_bytes;
        let sqe = match (self.file_target(read.plan.fd), read.buf.fixed) {
            (FileTarget::Fixed(f), Some(b)) => {
                opcode::ReadFixed::new(types::Fixed(f), ptr, len as u32, b)
                    .offset(off)
                    .build()
            }
            (FileTarget::Fixed(f), None) => opcode::Read::new(types::Fixed(f), ptr, len as u32)
                .offset(off)
                .build(),
            (FileTarget::Fd(fd), Some(b)) => {
                opcode::ReadFixed::new(types::Fd(fd), ptr, len as u32, b)
                    .offset(off)
                    .build()
            }
            (FileTarget::Fd(fd), None) => opcode::Read::new(types::Fd(fd), ptr, len as u32)
                .offset(off)
                .build(),
        }
        .user_data(user_data(OpKind::Read, idx as u64));
        self.reads[idx] = Some(read);
        self.reads_inflight += 1;
        push_sqe(&mut self.ring, &sqe);
    }

    /// The outcome of a completed device read: `Ok` when all planned bytes arrived.
    fn read_status(res: i32, want_bytes: usize) -> Result<(), crate::storage::StorageError> {
        if res >= 0 && res as usize >= want_bytes {
            return Ok(());
        }
        let e = if res < 0 {
            std::io::Error::from_raw_os_error(-res)
        } else {
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "short device read")
        };
        Err(crate::storage::StorageError::Device(
            crate::device::DeviceError::Io(e),
        ))
    }

    /// Issues the next read of a pending operation, growing its buffer if the plan needs it.
    fn resubmit_read(&mut self, mut read: PendingRead, plan: ReadPlan) {
        if plan.len_bytes > read.buf.bytes.len() {
            let bigger = ReadBuf {
                bytes: AlignedBuf::new_zeroed(plan.len_bytes),
                fixed: None,
            };
            let old = std::mem::replace(&mut read.buf, bigger);
            self.recycle_read_buf(old);
        }
        read.plan = plan;
        self.submit_read(read);
    }

    fn recycle_read_buf(&mut self, buf: ReadBuf) {
        // Registered buffers always go back (they must outlive the ring); others of the
        // pooled size too, as before registration existed.
        if buf.fixed.is_some() || buf.bytes.len() == READ_BUFFER_BYTES {
            self.read_bufs.push(buf);
        }
    }

    fn on_read(&mut self, idx: usize, res: i32, now: u64) {
        let Some(read) = self.reads.get_mut(idx).and_then(|r| r.take()) else {
            return;
        };
        self.free_reads.push(idx);
        self.reads_inflight -= 1;
        if read.set_value.is_some() {
            self.on_set_read(read, res, now);
            return;
        }
        let step = Self::read_status(res, read.plan.len_bytes).and_then(|()| {
            match self.shards.slots[read.shard as usize].as_mut() {
                Some(shard) => shard.get_continue_in_place(
                    read.db,
                    &read.key,
                    read.plan.clone(),
                    read.buf.bytes.as_slice(),
                    now,
                ),
                None => Err(StorageError::Corrupt(
                    "shard not held at read completion".into(),
                )),
            }
        });
        let answer = match step {
            Ok(GetReadStep::Read(plan)) => return self.resubmit_read(read, plan),
            Ok(GetReadStep::InBuffer { kind, range, .. }) => Ok((kind, range)),
            Ok(GetReadStep::Done(v)) => Err(Ok(v)),
            Err(e) => Err(Err(e)),
        };
        // The value goes from the read buffer straight into the reply, copied once.
        let buf = read.buf.bytes.as_slice();
        self.deliver_with(read.dest, read.proto, |r| match answer {
            // As write_get_reply: only strings answer a GET.
            Ok((kind, range)) => {
                if kind == ValueKind::String {
                    r.bulk(&buf[range])
                } else {
                    r.error(crate::commands::ERR_WRONGTYPE)
                }
            }
            Err(v) => write_get_reply(r, v),
        });
        self.recycle_read_buf(read.buf);
        self.recycle_bytes(read.key);
    }

    fn on_set_read(&mut self, mut read: PendingRead, res: i32, now: u64) {
        self.round_writes = true;
        let value = read.set_value.take().expect("a SET carries its value");
        let step = Self::read_status(res, read.plan.len_bytes).and_then(|()| {
            match self.shards.slots[read.shard as usize].as_mut() {
                Some(shard) => shard.put_continue(
                    read.db,
                    &read.key,
                    ValueKind::String,
                    &value,
                    None,
                    read.plan.clone(),
                    read.buf.bytes.as_slice(),
                    now,
                ),
                None => Err(StorageError::Corrupt(
                    "shard not held at read completion".into(),
                )),
            }
        });
        match step {
            Ok(PutStep::Read(plan)) => {
                read.set_value = Some(value);
                self.resubmit_read(read, plan);
            }
            other => {
                self.recycle_read_buf(read.buf);
                self.recycle_bytes(read.key);
                self.recycle_bytes(value);
                if let ReadDest::Local { token, .. } = read.dest {
                    if let Some(conn) = self.conn_mut(token.packed()) {
                        conn.write_blocked = false;
                    }
                    self.mark_ready(token.slot);
                }
                let res = other.map(|_| ());
                self.deliver_with(read.dest, read.proto, |r| write_set_reply(r, res));
            }
        }
    }

    /// Writes the reply of a finished asynchronous operation where it belongs: into the
    /// connection's output in request order (no intermediate buffer when it is the
    /// reply the connection waits for first), or into a message to another worker.
    fn deliver_with(&mut self, dest: ReadDest, proto: Proto, write: impl FnOnce(&mut ReplyBuf)) {
        match dest {
            ReadDest::Remote { from, token, seq } => {
                let mut bytes = Vec::new();
                write(&mut ReplyBuf::new(&mut bytes, proto));
                self.outbox[from].push(Msg::Reply { token, seq, bytes })
            }
            ReadDest::Local { token, seq } => {
                let tok = token.packed();
                if let Some(conn) = self.conn_mut(tok) {
                    conn.fill_with(seq, proto, write);
                    if conn.unparsed() > 0 {
                        self.mark_ready(token.slot);
                    }
                }
            }
        }
    }

    // ----- storage and sending ----------------------------------------------

    fn flush_storage(&mut self, now: u64) {
        self.round_need = 0;
        match self.fsync {
            FsyncPolicy::No => self.flush_storage_sync(now),
            FsyncPolicy::Always => {
                // Records staged by background work alone (defrag relocations,
                // expiry tombstones) acknowledge nothing: they wait for the
                // flush-max-ms window instead of costing a sync every round.
                if std::mem::take(&mut self.round_writes) {
                    self.commit.wanted = true;
                }
                if self.can_start_epoch() {
                    let window_over = now.saturating_sub(self.last_background_flush_ms)
                        >= self.shared.settings.cli.flush_max_ms;
                    let background = window_over && self.shards.held().any(|s| s.has_unflushed());
                    if self.commit.wanted || background {
                        self.start_epoch(now);
                    }
                }
                self.round_need = self.commit.issued + u64::from(self.commit.wanted);
            }
            FsyncPolicy::EverySec => {
                self.round_writes = false;
                if self.commit.inflight.is_empty() && self.shards.held().any(|s| s.flush_due(now)) {
                    self.start_epoch(now);
                }
            }
        }
    }

    /// A new epoch may start: fewer than the maximum in flight, and the newest
    /// one's chunk writes are done (a shard has at most one write in flight, and
    /// an epoch's writes are issued after the previous epoch's have completed).
    fn can_start_epoch(&self) -> bool {
        self.commit.inflight.len() < EPOCHS_INFLIGHT_MAX
            && self
                .commit
                .inflight
                .back()
                .is_none_or(|e| e.writes_left == 0)
    }

    /// Starts a group-commit epoch: every shard with staged records (all of
    /// them with `always`, those whose window is over with `everysec`) hands
    /// its chunk to a write on the ring, and the worker goes on serving; when
    /// the epoch's writes have completed, one `fdatasync` per data file goes on
    /// the ring (`on_chunk_write`).
    fn start_epoch(&mut self, now: u64) {
        let always = self.fsync == FsyncPolicy::Always;
        let id = self.commit.issued + 1;
        let mut epoch = Epoch {
            id,
            writes_left: 0,
            fds: Vec::new(),
            syncs_left: 0,
            error: None,
            started: Instant::now(),
            synced_from: None,
        };
        for shard in self.shards.held() {
            let due = if always {
                shard.has_unflushed()
            } else {
                shard.flush_due(now)
            };
            if !due {
                continue;
            }
            let sid = shard.id();
            let r = match shard.flush_chunk_begin() {
                Ok(Some(io)) => {
                    let sqe = match file_target(&self.fixed_files, io.fd) {
                        FileTarget::Fixed(f) => {
                            opcode::Write::new(types::Fixed(f), io.ptr, io.len as u32)
                                .offset(io.offset)
                                .build()
                        }
                        FileTarget::Fd(fd) => {
                            opcode::Write::new(types::Fd(fd), io.ptr, io.len as u32)
                                .offset(io.offset)
                                .build()
                        }
                    }
                    .user_data(user_data(OpKind::ChunkWrite, u64::from(sid)));
                    push_sqe(&mut self.ring, &sqe);
                    epoch.writes_left += 1;
                    self.commit.writes_inflight += 1;
                    Ok(Vec::new())
                }
                Ok(None) => shard.flush_write(),
                Err(e) => Err(e),
            };
            note_flush(&mut epoch, sid, r);
        }
        self.commit.issued = id;
        self.commit.wanted = false;
        self.last_background_flush_ms = now;
        let writes = epoch.writes_left;
        self.commit.inflight.push_back(epoch);
        if writes == 0 {
            self.issue_syncs(now);
        }
        // Start the device work now rather than at the end of the round.
        let _ = self.ring.submit();
    }

    /// The newest epoch's writes are done: its syncs go on the ring (or, with
    /// none to do, it may be durable already).
    fn issue_syncs(&mut self, now: u64) {
        let Some(epoch) = self.commit.inflight.back_mut() else {
            return;
        };
        let id = epoch.id;
        epoch.synced_from = Some(Instant::now());
        epoch.syncs_left = epoch.fds.len() as u32;
        for fd in std::mem::take(&mut epoch.fds) {
            let sqe = match file_target(&self.fixed_files, fd) {
                FileTarget::Fixed(f) => opcode::Fsync::new(types::Fixed(f)),
                FileTarget::Fd(fd) => opcode::Fsync::new(types::Fd(fd)),
            }
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .user_data(user_data(OpKind::Fsync, id));
            push_sqe(&mut self.ring, &sqe);
        }
        if self
            .commit
            .inflight
            .back()
            .is_some_and(|e| e.syncs_left == 0)
        {
            self.advance_epochs(now);
        } else {
            let _ = self.ring.submit();
        }
    }

    /// A shard's chunk write completed: the shard retries a failed one itself;
    /// the epoch's syncs start when its last write is done.
    fn on_chunk_write(&mut self, shard_id: u64, res: i32, now: u64) {
        self.commit.writes_inflight = self.commit.writes_inflight.saturating_sub(1);
        let r = match self
            .shards
            .slots
            .get_mut(shard_id as usize)
            .and_then(|s| s.as_mut())
        {
            Some(shard) => shard.flush_chunk_done(res),
            None => Err(crate::storage::StorageError::Corrupt(format!(
                "chunk write completion for shard {shard_id}, which this worker does not hold"
            ))),
        };
        // Only the newest epoch can have writes in flight.
        let Some(epoch) = self.commit.inflight.back_mut() else {
            tracing::error!("chunk write completion outside an epoch");
            return;
        };
        note_flush(epoch, shard_id as u32, r);
        epoch.writes_left = epoch.writes_left.saturating_sub(1);
        if epoch.writes_left == 0 {
            self.issue_syncs(now);
        }
    }

    fn on_fsync(&mut self, id: u64, res: i32, now: u64) {
        let delay = self.shared.settings.cli.debug_sync_delay_ms;
        if delay > 0 {
            self.delayed_syncs
                .push_back((Instant::now() + Duration::from_millis(delay), id, res));
            return;
        }
        self.fsync_done(id, res, now);
    }

    /// `--debug-sync-delay-ms`: syncs whose delay is over count as completed now.
    fn release_delayed_syncs(&mut self, now: u64) {
        while self
            .delayed_syncs
            .front()
            .is_some_and(|d| d.0 <= Instant::now())
        {
            if let Some((_, id, res)) = self.delayed_syncs.pop_front() {
                self.fsync_done(id, res, now);
            }
        }
    }

    fn fsync_done(&mut self, id: u64, res: i32, now: u64) {
        let Some(epoch) = self.commit.inflight.iter_mut().find(|e| e.id == id) else {
            tracing::error!("fdatasync completion for unknown epoch {id}");
            return;
        };
        if res < 0 {
            let e = std::io::Error::from_raw_os_error(-res);
            tracing::error!("fdatasync of a data file failed: {e}");
            epoch.error.get_or_insert(e.to_string());
        }
        epoch.syncs_left = epoch.syncs_left.saturating_sub(1);
        self.advance_epochs(now);
    }

    /// Epochs at the front whose syncs all ended are durable: their held
    /// replies may leave (or, if one failed, must not); writes made meanwhile
    /// start the next epoch at once.
    fn advance_epochs(&mut self, now: u64) {
        // Durable: every write done, its syncs issued and all of them completed (an
        // epoch still writing has no syncs counted yet: it is not durable).
        while self
            .commit
            .inflight
            .front()
            .is_some_and(|e| e.writes_left == 0 && e.synced_from.is_some() && e.syncs_left == 0)
        {
            let Some(epoch) = self.commit.inflight.pop_front() else {
                break;
            };
            self.commit.durable = epoch.id;
            let end = Instant::now();
            let synced_from = epoch.synced_from.unwrap_or(end);
            let st = &self.shared.stats;
            st.commit_epochs.fetch_add(1, Ordering::Relaxed);
            st.commit_write_us.fetch_add(
                synced_from.duration_since(epoch.started).as_micros() as u64,
                Ordering::Relaxed,
            );
            st.commit_sync_us.fetch_add(
                end.duration_since(synced_from).as_micros() as u64,
                Ordering::Relaxed,
            );
            if let Some(err) = epoch.error {
                self.shared
                    .stats
                    .flush_failures
                    .fetch_add(1, Ordering::Relaxed);
                if self.fsync == FsyncPolicy::Always {
                    self.commit.failed_upto = epoch.id;
                    self.commit.failed_text =
                        format!("-ERR storage flush failed, write not acknowledged: {err}\r\n");
                }
            }
        }
        if self.commit.wanted && self.fsync == FsyncPolicy::Always && self.can_start_epoch() {
            self.start_epoch(now);
        }
    }

    /// Flushes with the sync done in place (`appendfsync no` writes without
    /// syncing, so nothing waits).
    fn flush_storage_sync(&mut self, now: u64) {
        let mut failed: Option<String> = None;
        // With `always`, a round that ran a write flushes every shard with staged
        // records before any reply leaves. Records staged by background work
        // alone (defrag relocations, expiry tombstones) acknowledge nothing, so
        // they wait for the flush-max-ms window instead of costing an fsync on
        // every round.
        let always = self.fsync == FsyncPolicy::Always;
        let window_over = now.saturating_sub(self.last_background_flush_ms)
            >= self.shared.settings.cli.flush_max_ms;
        let foreground = std::mem::take(&mut self.round_writes);
        let mut flushed_background = false;
        for shard in self.shards.held() {
            let due = if always {
                shard.has_unflushed() && (foreground || window_over)
            } else {
                shard.flush_due(now)
            };
            if due {
                flushed_background |= !foreground;
                if let Err(e) = shard.flush() {
                    tracing::error!("shard {} flush failed: {e}", shard.id());
                    failed = Some(e.to_string());
                }
            }
        }
        if flushed_background {
            self.last_background_flush_ms = now;
        }
        let Some(err) = failed else { return };
        self.shared
            .stats
            .flush_failures
            .fetch_add(1, Ordering::Relaxed);
        if self.fsync == FsyncPolicy::No {
            return;
        }
        // Replies of this round may acknowledge writes that are not durable:
        // none of them leave. Local clients lose the connection (no false
        // OK); remote requesters get an error in place of their reply.
        let text = format!("-ERR storage flush failed, write not acknowledged: {err}\r\n");
        for slot in 0..self.conns.len() as u32 {
            let unsent = matches!(self.conns[slot as usize].as_ref(), Some(c) if !c.out.is_empty() && !c.closing);
            if unsent {
                if let Some(c) = self.conns[slot as usize].as_mut() {
                    c.out.clear();
                }
                self.begin_close(slot);
                self.maybe_free(slot);
            }
        }
        for msgs in self.outbox.iter_mut() {
            for m in msgs.iter_mut() {
                if let Msg::Reply { bytes, .. } = m {
                    *bytes = text.clone().into_bytes();
                }
            }
        }
    }

    /// Group commit: this round's replies wait for the epoch that makes them
    /// true, behind any older held ones; those whose epoch ended may leave.
    /// Runs before anything is sent, whatever the connection's transport.
    fn gate_replies(&mut self) {
        let need = self.round_need;
        let durable = self.commit.durable;
        // Nothing to hold and nothing held (the common case without `always`): no
        // pass over the connections. Bytes left unsent from such rounds may be held
        // once gating resumes, which only delays them, in order.
        if need <= durable && !self.any_held {
            return;
        }
        let mut any_held = false;
        for slot in 0..self.conns.len() {
            let Some(conn) = self.conns[slot].as_mut() else {
                continue;
            };
            if conn.closing {
                continue;
            }
            // Group commit: this round's replies wait for the epoch that makes
            // them true, behind any older held ones; those whose epoch ended go.
            let cleared = conn.out_cleared.min(conn.out.len());
            if conn.out.len() > cleared && (need > durable || !conn.held.is_empty()) {
                let tag = need.max(conn.held.back().map_or(0, |h| h.0));
                let bytes = conn.out.split_off(cleared);
                match conn.held.back_mut() {
                    Some((t, b)) if *t == tag => b.extend_from_slice(&bytes),
                    _ => conn.held.push_back((tag, bytes)),
                }
            }
            if conn
                .held
                .front()
                .is_some_and(|h| h.0 <= self.commit.failed_upto)
            {
                // Their epoch failed: no false acknowledgement leaves.
                conn.held.clear();
                conn.out.clear();
                self.begin_close(slot as u32);
                self.maybe_free(slot as u32);
                continue;
            }
            while conn.held.front().is_some_and(|h| h.0 <= durable) {
                if let Some((_, b)) = conn.held.pop_front() {
                    conn.out.extend_from_slice(&b);
                }
            }
            conn.out_cleared = conn.out.len();
            any_held |= !conn.held.is_empty();
        }
        self.any_held = any_held;
    }

    fn submit_sends(&mut self) {
        self.gate_replies();
        for slot in 0..self.conns.len() {
            let Some(conn) = self.conns[slot].as_mut() else {
                continue;
            };
            if conn.closing || conn.send_inflight {
                continue;
            }
            let Some(fd) = conn.fd.kernel_fd() else {
                continue;
            };
            if conn.sending.is_empty() && !conn.out.is_empty() {
                std::mem::swap(&mut conn.sending, &mut conn.out);
                conn.out_cleared = 0;
                conn.send_off = 0;
            }
            if conn.sending.is_empty() {
                if conn.close_after_reply && conn.pending.is_empty() && conn.held.is_empty() {
                    self.begin_close(slot as u32);
                    self.maybe_free(slot as u32);
                }
                continue;
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
        // Stack connections' `out` now holds only replies cleared to leave.
        #[cfg(feature = "dpdk")]
        self.dpdk_send();
    }

    /// Bounded background work (expiry, tomb raider, defrag) once per round:
    /// `--background-budget-us`, raised to `--background-warrant-percent` of the
    /// round's foreground time, so background work keeps that share under load.
    fn background(&mut self, now: u64, foreground_us: u64) {
        let cli = &self.shared.settings.cli;
        let budget = cli
            .background_budget_us
            .max(foreground_us * cli.background_warrant_percent / 100);
        for shard in self.shards.held() {
            if let Err(e) = shard.background(now, budget) {
                tracing::warn!("shard {} background work failed: {e}", shard.id());
            }
        }
    }

    fn wait(&mut self) {
        #[cfg(feature = "dpdk")]
        if self.dpdk.is_some() {
            self.dpdk_wait();
            return;
        }
        if !self.ready.is_empty() || self.retry_pending {
            let _ = self.ring.submit();
            if self.retry_pending {
                std::thread::yield_now();
            }
            return;
        }
        let busy_us = self.shared.settings.cli.busy_poll_us;
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
                std::hint::spin_loop();
            }
        }
        let unflushed = self
            .shards
            .slots
            .iter()
            .flatten()
            .any(|s| s.has_unflushed());
        let wait_ms = if !self.delayed_syncs.is_empty() {
            1
        } else if unflushed {
            self.shared.settings.cli.flush_max_ms.clamp(1, IDLE_WAIT_MS)
        } else {
            IDLE_WAIT_MS
        };
        let ts = types::Timespec::new()
            .sec(wait_ms / 1000)
            .nsec(((wait_ms % 1000) * 1_000_000) as u32);
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

/// The reply to a GET: the value, a null, or the error.
fn write_get_reply(r: &mut ReplyBuf, v: Result<Option<Value>, StorageError>) {
    match v {
        Ok(Some(v)) if v.kind != ValueKind::String => r.error(crate::commands::ERR_WRONGTYPE),
        Ok(Some(v)) => r.bulk(&v.bytes),
        Ok(None) => r.null(),
        Err(e) => r.error(&crate::commands::storage_error(e)),
    }
}

/// The reply to a plain SET: `+OK` or the error.
fn write_set_reply(r: &mut ReplyBuf, res: Result<(), StorageError>) {
    match res {
        Ok(()) => r.ok(),
        Err(e) => r.error(&crate::commands::storage_error(e)),
    }
}

/// Writes a short message to a fresh socket before dropping it (used for
/// the maxclients and protected-mode refusals, as Redis does).
fn write_all_now(fd: &OwnedFd, msg: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut s = std::fs::File::from(fd.try_clone()?);
    s.write_all(msg)
}

pub const DENIED: &str = "-DENIED Redis is running in protected mode because protected mode is enabled and no password is set for the default user. In this mode connections are only accepted from the loopback interface. If you want to connect from external computers to Redis you may adopt one of the following solutions: 1) Just disable protected mode sending the command 'CONFIG SET protected-mode no' from the loopback interface by connecting to Redis from the same host the server is running, however MAKE SURE Redis is not publicly accessible from internet if you do so. Use CONFIG REWRITE to make this change permanent. 2) Alternatively you can just disable the protected mode by editing the Redis configuration file, and setting the protected mode option to 'no', and then restarting the server. 3) If you started the server manually just for testing, restart it with the '--protected-mode no' option. 4) Set up an authentication password for the default user. NOTE: You only need to do one of the above things in order for the server to start accepting connections from the outside.\r\n";
