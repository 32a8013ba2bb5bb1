//! The server: worker threads, connections, routing and dispatch.
//!
//! One pinned worker thread per CPU. Each owns an io_uring (multishot accept
//! on its own `SO_REUSEPORT` listener, multishot receive into a provided
//! buffer ring, sends batched once per loop round), the connections it
//! accepted, and a subset of the storage shards (`shard % workers ==
//! worker`). Keys map to Redis Cluster slots, slots to shards.
//!
//! A command whose keys all live on one worker runs there: locally, or sent
//! over that worker's mailbox with the reply coming back the same way; the
//! connection keeps replies in request order with reserved slots. A command
//! whose keys span workers (MSET, MGET, DEL, RENAME ... across shards) or
//! that needs every shard (KEYS, SCAN, DBSIZE, FLUSHALL, INFO) runs on the
//! connection's worker after the other workers *lend* it their shards: each
//! lender hands its shards over its mailbox and blocks until they come
//! back. One coordinator at a time (a global try-lock; a worker that fails
//! to get it retries on its next round and meanwhile keeps serving its
//! mailbox, so two coordinators cannot deadlock). The command therefore
//! sees all its keys with no other command interleaved: atomic as in Redis.
//!
//! Durability: before a round's replies leave the worker (to sockets or to
//! other workers' mailboxes), shards whose policy says so are flushed: with
//! `appendfsync always` one flush covers every write of the round (group
//! commit). If that flush fails, the round's replies are not sent.
//!
//! Deliberately missing for now: zero-copy parsing from the provided
//! buffers (bytes are copied once into the connection's buffer), async
//! device reads (a GET that misses staging blocks the worker for one device
//! read), allocation-free cross-worker messages.

pub mod acl_cmd;
pub mod blocking;
pub mod cmdstats;
mod conn;
#[cfg(any(test, feature = "dpdk"))]
pub mod faults;
pub mod keystats;
pub mod local;
pub mod metrics;
pub mod notify;
mod ops_cmd;
mod reads;
pub mod tls;
mod worker;

/// PUBLISH / SPUBLISH from a script (`scripting::engine`).
pub use worker::pubsub::script_publish;

use crate::commands::ShardSet;
use crate::config::Settings;
use crate::resp::Proto;
use crate::storage::Shard;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use std::time::Instant;

pub use worker::tracking;
#[cfg(feature = "dpdk")]
pub use worker::DpdkNet;
pub use worker::Worker;

/// Identifies a connection on its worker: slab index and generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnToken {
    pub slot: u32,
    pub gen: u32,
}

impl ConnToken {
    /// The 64-bit form used in SQE user data and connection lookups.
    pub fn packed(self) -> u64 {
        ((self.gen as u64) << 32) | self.slot as u64
    }
}

pub enum Msg {
    /// Run a command on the receiving worker's shards and reply.
    Request {
        from: usize,
        token: ConnToken,
        seq: u64,
        db: u8,
        proto: Proto,
        args: Vec<Vec<u8>>,
        /// The requesting client, for client-side caching (`server::tracking`).
        caller: crate::runtime::tracking::Caller,
        /// A restricted user running a script: the script's commands are checked against
        /// it (`acl::ScriptCaller`).
        script_caller: Option<Arc<crate::acl::ScriptCaller>>,
    },
    /// The reply to a `Request`.
    Reply {
        token: ConnToken,
        seq: u64,
        bytes: Vec<u8>,
    },
    /// Hand all shards to a coordinator and wait for them to come back.
    Lend {
        give: mpsc::Sender<Vec<Shard>>,
        back: mpsc::Receiver<Vec<Shard>>,
    },
    /// Recovery is done: take these shards (ours) and say so on `done`.
    Adopt {
        shards: Vec<Shard>,
        done: mpsc::Sender<()>,
    },
    /// Close a connection (CLIENT KILL).
    Kill { token: ConnToken },
    /// Run a blocked client's command again with every shard held (`server::blocking`).
    BlockRetry(Box<blocking::Retry>),
    /// A Pub/Sub message for subscribers on this worker (`pubsub::Publication`).
    Publish(Box<worker::pubsub::Publication>),
    /// A MONITOR line for a monitoring connection on this worker.
    Monitor { token: ConnToken, line: Vec<u8> },
    /// A connection elsewhere stopped watching `key` of our shard `shard` (see `txn.rs`).
    Unwatch { db: u8, shard: u32, key: Vec<u8> },
    /// Fetch the records lookups of `keys` need on our shards into memory and send them
    /// back (`Prefetched`): a cross-worker command's reads, made before the coordinated
    /// pass that runs it (`txn.rs`, "Device reads").
    Prefetch {
        from: usize,
        token: ConnToken,
        keys: Vec<(u8, Vec<u8>)>,
    },
    /// The records a `Prefetch` fetched (`failed`: a read failed).
    Prefetched {
        token: ConnToken,
        fetched: Vec<crate::storage::prefetch::Fetched>,
        fetched_shard: Vec<u32>,
        failed: bool,
    },
    /// A client-side-caching message for a connection on this worker (`tracking.rs`).
    Tracking {
        token: ConnToken,
        via_redirect: bool,
        push: tracking::Push,
    },
}

pub struct WorkerLink {
    pub tx: mpsc::Sender<Msg>,
    pub wake: OwnedFd,
    /// The worker is blocked in its ring, or about to block: set before its last look at
    /// the mailbox and cleared when it wakes. A sender signals `wake` only while it is set
    /// (docs/architecture.md, "Waking a worker"): a worker that is running or
    /// busy-polling finds the message on its own, without an eventfd write and read.
    pub parked: AtomicBool,
}

impl WorkerLink {
    pub fn new(tx: mpsc::Sender<Msg>, wake: OwnedFd) -> WorkerLink {
        WorkerLink {
            tx,
            wake,
            parked: AtomicBool::new(false),
        }
    }

    pub fn send(&self, m: Msg) {
        // The receiver lives as long as the process; a send error means the
        // worker already exited during shutdown, when nothing waits anyway.
        let _ = self.tx.send(m);
        if self.needs_wake() {
            crate::runtime::eventfd_signal(self.wake.as_raw_fd());
        }
    }

    /// Called after pushing messages: true when the worker may be parked and must be
    /// signalled. The fence pairs with the one in `Worker::park`: either this load sees
    /// `parked`, or the worker's look at the mailbox after setting it sees the message.
    pub fn needs_wake(&self) -> bool {
        std::sync::atomic::fence(Ordering::SeqCst);
        self.parked.load(Ordering::Relaxed)
    }
}

/// Runtime-settable configuration (`CONFIG SET`).
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    pub requirepass: Option<String>,
    pub maxclients: usize,
    pub protected_mode: bool,
    pub slowlog_log_slower_than_us: i64,
    pub slowlog_max_len: usize,
    pub output_limits: crate::config::output_limits::OutputLimits,
}

#[derive(Default)]
pub struct Stats {
    pub total_commands: AtomicU64,
    pub total_connections: AtomicU64,
    pub rejected_connections: AtomicU64,
    pub connected_clients: AtomicUsize,
    pub net_input_bytes: AtomicU64,
    pub net_output_bytes: AtomicU64,
    pub instantaneous_ops: AtomicU64,
    pub last_save_unix: AtomicU64,
    pub flush_failures: AtomicU64,
    /// Group-commit epochs completed, and their summed chunk-write and sync phases.
    pub commit_epochs: AtomicU64,
    pub commit_write_us: AtomicU64,
    pub commit_sync_us: AtomicU64,
    /// Rounds that left ready connections for the next round at --foreground-budget-us.
    pub foreground_budget_cuts: AtomicU64,
    /// Cross-worker traffic and parking (`worker.rs`, added once per round): requests
    /// sent to another worker's mailbox, eventfd signals sent to a parked worker, signals
    /// skipped because the receiver was awake, and blocking waits in the ring.
    pub hops: AtomicU64,
    pub wake_signals: AtomicU64,
    pub wake_signals_skipped: AtomicU64,
    pub parks: AtomicU64,
    /// Commands that waited for device reads without blocking their worker, and the
    /// reads they made (`server::reads`).
    pub parked_commands: AtomicU64,
    /// Bytes held by normal clients' buffers (all workers; each adds its change per round).
    pub mem_clients_normal: AtomicU64,
    /// Clients closed for exceeding `client-output-buffer-limit`.
    pub client_output_limit_closes: AtomicU64,
    pub parked_reads: AtomicU64,
    /// Of the reads above: those completed from a device's own queue (`AsyncReads`: the
    /// userspace NVMe driver's queue pair, polled in the worker's round) instead of the
    /// worker's io_uring.
    pub device_queue_reads: AtomicU64,
    /// Of `parked_reads`: reads a restartable run wanted (records below the declared keys'
    /// own, e.g. a collection's pages; `reads.rs`, "Restarting on a miss").
    pub restart_reads: AtomicU64,
    /// Restartable runs discarded for a miss (each one round of reads for its command).
    pub restarts: AtomicU64,
    /// Commands that reached `reads::RESTARTS_MAX` and read the rest synchronously.
    pub restart_fallbacks: AtomicU64,
    /// Waits of a coordinated pass for reads on the batch ring (`reads::BatchReads`): the
    /// whole server waits for the device during each.
    pub batch_read_waits: AtomicU64,
    /// Rounds in which a cross-worker command (EXEC, WATCH, a script, any multi-worker
    /// keyed command) left the coordinated pass to have its records fetched by their
    /// owning workers first (`txn.rs`, "Device reads"), and of those, rounds after the
    /// first for the same command (a record changed meanwhile).
    pub cross_prefetches: AtomicU64,
    pub cross_prefetch_retries: AtomicU64,
    /// Cross-worker commands that still missed records after `CROSS_PREFETCH_ROUNDS_MAX`
    /// rounds (or a failed read) and fetched them on the batch ring inside the pass.
    pub cross_prefetch_fallbacks: AtomicU64,
    /// Bytes copied between network and connection buffers, per transport, and the DPDK
    /// loop's idle back-off (`runtime::copies`).
    pub copies: crate::runtime::copies::CopyCounters,
}

pub struct ClientEntry {
    pub worker: usize,
    pub token: ConnToken,
    pub addr: String,
    pub laddr: String,
    pub info: String,
}

pub struct SlowEntry {
    pub id: u64,
    pub unix: u64,
    pub micros: u64,
    pub args: Vec<Vec<u8>>,
    pub addr: String,
    pub name: String,
}

pub struct Shared {
    pub settings: Settings,
    pub runtime: RwLock<RuntimeConfig>,
    /// ACL users and log; `acl_gen` counts changes so connections re-read their user
    /// only after one.
    pub acl: RwLock<crate::acl::AclState>,
    pub acl_gen: AtomicU64,
    pub shard_count: u32,
    pub workers: Vec<WorkerLink>,
    pub txn_lock: Mutex<()>,
    pub stats: Stats,
    pub clients: Mutex<HashMap<u64, ClientEntry>>,
    pub next_client_id: AtomicU64,
    pub shutdown: AtomicBool,
    pub shutdown_checkpoint: AtomicBool,
    pub start: Instant,
    pub slowlog: Mutex<(u64, std::collections::VecDeque<SlowEntry>)>,
    pub monitors: Mutex<Vec<(usize, ConnToken)>>,
    pub monitor_count: AtomicUsize,
    /// `appendfsync` in force (0 always, 1 everysec, 2 no); `CONFIG SET` changes it.
    pub fsync_policy: std::sync::atomic::AtomicU8,
    /// `--cache-size` as in force (CONFIG SET changes it): divided among the shards.
    pub cache_size_bytes: AtomicU64,
    pub recovered_keys: AtomicU64,
    pub recovery_ms: AtomicU64,
    /// `lavik_recovery_*` lines of `INFO persistence` (the open's phases), set once when
    /// recovery ends.
    pub recovery_phases: Mutex<String>,
    pub config_file: Option<std::path::PathBuf>,
    /// Recovery is still running: commands without the `loading` flag get
    /// `-LOADING` (the workers have no shards yet).
    pub loading: AtomicBool,
    /// Unix seconds when loading started, and recovery's counters for INFO.
    pub loading_start_s: AtomicU64,
    pub progress: Option<Arc<crate::storage::RecoveryProgress>>,
    /// Every script seen by EVAL or SCRIPT LOAD, for all workers' Lua states.
    pub scripts: Arc<crate::scripting::Catalog>,
    /// Every Pub/Sub subscription of the server (`pubsub.rs`), and how many there are
    /// (PUBLISH with no subscriber anywhere takes no lock).
    pub pubsub: RwLock<worker::pubsub::Registry>,
    pub pubsub_subscriptions: AtomicUsize,
    /// Per-command counters, error counts and the latency monitor (`cmdstats`).
    pub cmdstats: Arc<cmdstats::StatsHub>,
    /// The TLS context for connections on `--tls-port` (CONFIG SET rebuilds it).
    pub tls: tls::TlsContext,
}

impl Shared {
    pub fn worker_of_shard(&self, shard: u32) -> usize {
        shard as usize % self.workers.len()
    }

    pub fn request_shutdown(&self, checkpoint: bool) {
        if checkpoint {
            self.shutdown_checkpoint.store(true, Ordering::SeqCst);
        }
        self.shutdown.store(true, Ordering::SeqCst);
        for w in &self.workers {
            crate::runtime::eventfd_signal(w.wake.as_raw_fd());
        }
    }
}

pub fn fsync_to_u8(p: crate::storage::FsyncPolicy) -> u8 {
    match p {
        crate::storage::FsyncPolicy::Always => 0,
        crate::storage::FsyncPolicy::EverySec => 1,
        crate::storage::FsyncPolicy::No => 2,
    }
}

pub fn fsync_from_u8(v: u8) -> crate::storage::FsyncPolicy {
    match v {
        0 => crate::storage::FsyncPolicy::Always,
        1 => crate::storage::FsyncPolicy::EverySec,
        _ => crate::storage::FsyncPolicy::No,
    }
}

/// A worker that runs connection and server commands with `local::run`: the loop
/// (`worker.rs`) and those commands (`local.rs`) meet only here.
pub fn new_worker(
    id: usize,
    shared: Arc<Shared>,
    shards: ShardSet,
    listeners: Vec<OwnedFd>,
    mailbox: mpsc::Receiver<Msg>,
) -> std::io::Result<Worker> {
    Worker::new(id, shared, shards, listeners, mailbox, local::run)
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Builds the shared state and the per-worker mailboxes; returns the
/// receivers in worker order.
pub fn build_shared(
    settings: Settings,
    shard_count: u32,
    progress: Option<Arc<crate::storage::RecoveryProgress>>,
) -> std::io::Result<(Arc<Shared>, Vec<mpsc::Receiver<Msg>>)> {
    let mut links = Vec::new();
    let mut rxs = Vec::new();
    for _ in 0..settings.threads {
        let (tx, rx) = mpsc::channel();
        links.push(WorkerLink::new(tx, crate::runtime::eventfd()?));
        rxs.push(rx);
    }
    let runtime = RuntimeConfig {
        requirepass: settings.cli.requirepass.clone().filter(|p| !p.is_empty()),
        maxclients: settings.cli.maxclients,
        protected_mode: settings.protected_mode,
        slowlog_log_slower_than_us: settings.cli.slowlog_log_slower_than,
        slowlog_max_len: settings.cli.slowlog_max_len,
        output_limits: settings.output_limits,
    };
    crate::commands::events::set_flags(
        crate::commands::events::parse(&settings.cli.notify_keyspace_events).unwrap_or(0),
    );
    let acl = acl_cmd::initial_acl(&settings).map_err(std::io::Error::other)?;
    let cmdstats = Arc::new(cmdstats::StatsHub::new(settings.threads));
    cmdstats
        .set_percentiles(&settings.cli.latency_tracking_info_percentiles)
        .map_err(std::io::Error::other)?;
    let tracking = crate::config::parse_yes_no(&settings.cli.latency_tracking)
        .ok_or_else(|| std::io::Error::other("latency-tracking takes yes or no"))?;
    cmdstats.latency_tracking.store(tracking, Ordering::Relaxed);
    cmdstats
        .latency
        .threshold_ms
        .store(settings.cli.latency_monitor_threshold, Ordering::Relaxed);
    let tls = tls::TlsContext::new(&settings.tls)
        .map_err(|e| std::io::Error::other(format!("TLS configuration: {e}")))?;
    let shared = Shared {
        acl: RwLock::new(acl),
        acl_gen: AtomicU64::new(1),
        config_file: settings.config_file.clone(),
        shutdown_checkpoint: AtomicBool::new(settings.cli.shutdown_checkpoint),
        fsync_policy: std::sync::atomic::AtomicU8::new(fsync_to_u8(settings.appendfsync)),
        cache_size_bytes: AtomicU64::new(settings.cache_size_bytes),
        settings,
        runtime: RwLock::new(runtime),
        shard_count,
        workers: links,
        txn_lock: Mutex::new(()),
        stats: Stats::default(),
        clients: Mutex::new(HashMap::new()),
        next_client_id: AtomicU64::new(1),
        shutdown: AtomicBool::new(false),
        start: Instant::now(),
        slowlog: Mutex::new((0, Default::default())),
        monitors: Mutex::new(Vec::new()),
        monitor_count: AtomicUsize::new(0),
        recovered_keys: AtomicU64::new(0),
        recovery_ms: AtomicU64::new(0),
        recovery_phases: Mutex::new(String::new()),
        loading: AtomicBool::new(progress.is_some()),
        loading_start_s: AtomicU64::new(now_ms() / 1000),
        progress,
        scripts: Arc::new(crate::scripting::Catalog::default()),
        pubsub: RwLock::new(Default::default()),
        pubsub_subscriptions: AtomicUsize::new(0),
        cmdstats,
        tls,
    };
    Ok((Arc::new(shared), rxs))
}

/// Splits the opened shards among workers (`shard % workers`).
pub fn distribute_shards(shards: Vec<Shard>, workers: usize, shard_count: u32) -> Vec<ShardSet> {
    let mut sets: Vec<ShardSet> = (0..workers)
        .map(|_| ShardSet {
            slots: (0..shard_count).map(|_| None).collect(),
            shard_count,
            groups: Default::default(),
        })
        .collect();
    for s in shards {
        let id = s.id();
        sets[id as usize % workers].slots[id as usize] = Some(s);
    }
    sets
}
