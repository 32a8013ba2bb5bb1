//! The asynchronous command path: commands that wait for the device without blocking
//! their worker.
//!
//! Every keyed command on the worker's own shards goes through `plan`: the records its
//! declared keys (the command table's key positions) need are looked up in the index and
//! checked against memory (staging buffers, the record cache). When everything is there
//! the command runs at once — that is the whole cost for a staged or cached key, and for
//! a key that does not exist. Otherwise the command is *parked* here: its arguments are
//! copied, its reply slot is reserved on the connection (or on the requesting worker),
//! and its reads go on the worker's ring, all of them together. The worker keeps serving
//! other connections. When the last read completes the command is planned again (the
//! shard may have changed meanwhile: an overwrite, a relocation, a large value's
//! fragments now known) and either reads more or is handed back to the worker to run,
//! with its records lent to their shards (`Shard::lend_prefetched`), so the handler's
//! ordinary synchronous lookups find everything in memory. Nothing is applied before the
//! handler runs, so nothing is ever half-applied.
//!
//! Bounds (named constants below, and what happens at them):
//! - `READS_INFLIGHT_MAX` device reads on the ring per worker. A parked command whose
//!   reads do not fit waits in FIFO order for read slots (`waiting`); nothing falls back
//!   to a blocking read.
//! - `PARKED_MAX` parked commands per worker. At the bound the worker stops parsing new
//!   commands (`is_full`): connections keep their bytes until reads complete.
//! - `PARKED_PER_CONN_MAX` parked commands per connection; beyond it that connection's
//!   input waits (its replies to come stay bounded as well).
//! - `PLAN_ROUNDS_MAX` rounds of planning per command; a command that still misses records
//!   after that (a key rewritten on every round) runs anyway and its handler reads the
//!   rest synchronously (counted as `lavik_sync_reads`).
//!
//! Restarting on a miss. The plan covers declared keys only; records a handler finds
//! below them (a paged collection's directory pages and leaves, read through
//! `Shard::read_record`) are fetched by restarting: a command on own shards runs
//! restartably (`restartable`), a record it misses is recorded as wanted instead of read
//! (`storage::prefetch::restartable_begin`), the run is discarded (nothing was written:
//! the shards refuse writes after a miss, and a miss after a write is read synchronously),
//! and the command parks for the wanted reads (`Reads::park_restarted`, the same bounds and
//! order as a first park), keeping what it fetched, and runs again. At most
//! `RESTARTS_MAX` times; then its last run reads what it misses synchronously. A page walker
//! does not stop at its first miss (read-ahead, `storage::paged::Ahead`): it notes every page
//! it will need next that is not in memory, up to `prefetch::READAHEAD_READS_MAX` reads and
//! `READAHEAD_BYTES_MAX` bytes per run, so a whole-collection read asks for a level of the
//! tree per round (`docs/collections.md` section 5); what a round fetched is held by the
//! parked command until it finishes (≤ `RESTARTS_MAX` × `READAHEAD_BYTES_MAX` of pages).
//!
//! Ordering is the caller's job (the worker): a connection's commands never overtake an
//! earlier parked write, and a write never overtakes an earlier parked read.
//!
//! Transactions and scripts. EVAL, EVALSHA, FCALL (and their `_RO` forms) are keyed
//! commands whose declared keys are the `numkeys` ones: they plan, park and run here like
//! any keyed command, the script running with its declared keys' records lent. An EXEC
//! whose shards are all the worker's own parks as one unit before it runs: the lookups of
//! every queued command's declared keys and of the watched keys are planned together
//! (`plan_keys`, a `Parked` with a `keyset`), the connection stops at its EXEC (nothing
//! after it is parsed) and the worker serves others. When the unit's reads are done (with
//! the same re-plan rule and `PLAN_ROUNDS_MAX` as a command) its records go to the
//! connection, and EXEC is dispatched again: it plans once more with those records in
//! hand (the shards may have changed meanwhile), parks again for anything new, or runs
//! the WATCH check and the whole queue at once with the records lent (`lend`), no other
//! command in between. A queued command that writes a key stages a new record and points
//! the index at it, so a later queued read of that key finds the staged record, never the
//! lent old one. An EXEC, WATCH, script or other command on borrowed shards (the
//! coordinated cross-worker pass) cannot park there: the pass plans its lookups and, when
//! records are missing, the command leaves the pass unrun while each owning worker fetches
//! its part as a `keyset` unit marked `cross` (a `Msg::Prefetch` from the coordinator; the
//! coordinator parks its own part), and the records go back to the connection
//! (`Msg::Prefetched`) for a later pass (`txn.rs`, `cross_prefetch`). Only after
//! `CROSS_PREFETCH_ROUNDS_MAX` rounds does the pass read what is still missing on the
//! `BatchReads` ring, and wait.

use super::ConnToken;
use crate::commands::table::key_positions;
use crate::commands::{CommandSpec, ShardSet};
use crate::device::{AlignedBuf, BlockDevice, ReadEvent};
use crate::resp::Proto;
use crate::runtime::ring::{file_target, push_sqe, FileTarget};
use crate::runtime::{user_data, OpKind};
use crate::storage::prefetch::{Fetched, ReadDone, RecordPool, RecordRead, READ_WINDOW_BYTES};
use io_uring::{opcode, types, IoUring};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Device reads in flight per worker.
pub const READS_INFLIGHT_MAX: usize = 256;
/// Commands parked per worker before the worker stops parsing new ones.
pub const PARKED_MAX: usize = 4096;
/// Commands of one connection parked at once; beyond it the connection's input is not
/// parsed until one completes (a pipeline's reads still overlap this deep, and the replies
/// a connection can have coming back stay bounded).
pub const PARKED_PER_CONN_MAX: usize = 64;
/// Planning rounds per command (see the module essay).
pub const PLAN_ROUNDS_MAX: u32 = 4;
/// Restarts per command (see "Restarting on a miss" in the module essay): a lookup in a
/// paged collection needs two (its directory page, then its leaf); a command that still
/// misses after this many runs once more with its misses read synchronously (counted as
/// `lavik_sync_reads`).
pub const RESTARTS_MAX: u32 = 8;
/// Size of a pooled read buffer: the engine's first read window.
const READ_BUFFER_BYTES: usize = READ_WINDOW_BYTES;
/// Pooled read buffers registered with the ring at start (`IORING_REGISTER_BUFFERS`):
/// one per read that may be in flight. A read into a registered buffer skips pinning
/// its pages on every submission.
const FIXED_READ_BUFFERS: usize = READS_INFLIGHT_MAX;
const _: () = assert!(FIXED_READ_BUFFERS <= u16::MAX as usize);
const _: () = assert!(READS_INFLIGHT_MAX <= PARKED_MAX);
// A round completing every read on the ring finds its record vectors in the pool.
const _: () = assert!(crate::storage::prefetch::RECORD_POOL_MAX >= READS_INFLIGHT_MAX);
// One round of read-ahead fits the ring at once.
const _: () = assert!(crate::storage::prefetch::READAHEAD_READS_MAX <= READS_INFLIGHT_MAX);
/// Emptied vectors of finished commands kept for the next ones (each kind).
const SPARE_VECS_MAX: usize = 64;
/// A finished command's argument buffer is kept for reuse only up to this capacity
/// (a big SET's value is not held on to).
const SPARE_ARGS_BYTES_MAX: usize = 4096;

/// Where a parked command's reply goes.
#[derive(Clone, Copy, Debug)]
pub enum ReadDest {
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

/// A parked command's arguments in one allocation: each argument's length (4 bytes,
/// little-endian) followed by its bytes. `Reads::arg_list` builds one in a buffer a
/// finished command left behind (`Reads::recycle_args`), so parking a GET allocates
/// nothing in the steady state.
#[derive(Default)]
pub struct ArgList {
    data: Vec<u8>,
    count: usize,
}

/// Arguments a parked command runs with before `ArgList::with_refs` needs the heap.
const ARGS_ON_STACK: usize = 16;

impl ArgList {
    pub fn new(args: &[&[u8]]) -> ArgList {
        ArgList::new_in(Vec::new(), args)
    }

    /// `new` in the buffer `data` (emptied first; it grows only if it is too small).
    pub fn new_in(mut data: Vec<u8>, args: &[&[u8]]) -> ArgList {
        let total = args.iter().map(|a| a.len() + 4).sum();
        data.clear();
        data.reserve(total);
        for a in args {
            data.extend_from_slice(&(a.len() as u32).to_le_bytes());
            data.extend_from_slice(a);
        }
        ArgList {
            data,
            count: args.len(),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let mut rest = self.data.as_slice();
        std::iter::from_fn(move || {
            let (len, tail) = rest.split_first_chunk::<4>()?;
            let (arg, tail) = tail.split_at(u32::from_le_bytes(*len) as usize);
            rest = tail;
            Some(arg)
        })
    }

    /// Runs `f` on the arguments as a slice of slices (on the stack for short commands).
    pub fn with_refs<R>(&self, f: impl FnOnce(&[&[u8]]) -> R) -> R {
        if self.count <= ARGS_ON_STACK {
            let mut refs: [&[u8]; ARGS_ON_STACK] = [&[]; ARGS_ON_STACK];
            for (slot, a) in refs.iter_mut().zip(self.iter()) {
                *slot = a;
            }
            f(&refs[..self.count])
        } else {
            let refs: Vec<&[u8]> = self.iter().collect();
            f(&refs)
        }
    }
}

/// A command waiting for device reads.
pub struct Parked {
    pub dest: ReadDest,
    pub spec: &'static CommandSpec,
    pub args: ArgList,
    pub db: u8,
    pub proto: Proto,
    /// Records fetched so far, with the shard each belongs to.
    pub fetched: Vec<Fetched>,
    pub fetched_shard: Vec<u32>,
    /// A read failed: the command answers this error instead of running.
    pub error: Option<String>,
    reads_left: u32,
    rounds: u32,
    /// Runs discarded because they missed a record (`RESTARTS_MAX`).
    pub restarts: u32,
    /// The planned shards' `change_signature` sum when the reads were planned; with every
    /// read back as a plain record and the sum unchanged, planning again would find
    /// nothing new, so the command runs at once (one index probe less per GET).
    plan_signature: u64,
    /// A read came back stale or as a large value's root: plan again.
    needs_replan: bool,
    /// Reads not submitted yet (the ring was at `READS_INFLIGHT_MAX`).
    unsubmitted: Vec<(u32, RecordRead)>,
    /// The client running it, for client-side caching (the thread's caller when parked).
    pub caller: crate::runtime::tracking::Caller,
    /// A restricted user's script (`acl::ScriptCaller`), checked again when it re-runs.
    pub script_caller: Option<std::sync::Arc<crate::acl::ScriptCaller>>,
    /// A transaction's reads (see "Transactions" in the module essay): the (db, key)
    /// lookups planned instead of `spec`'s key positions. Such a unit runs no handler
    /// when its reads are done; its records go back to the connection's EXEC.
    pub keyset: Option<Vec<(u8, Vec<u8>)>>,
    /// A cross-worker command's reads (a `keyset` unit; see "Transactions" in the module
    /// essay): when done its records go to the requesting connection, on this worker or
    /// another (`ReadDest::Remote`), not to an EXEC parked here.
    pub cross: bool,
}

impl Parked {
    pub fn new(
        dest: ReadDest,
        spec: &'static CommandSpec,
        args: ArgList,
        db: u8,
        proto: Proto,
    ) -> Parked {
        Parked {
            dest,
            spec,
            args,
            db,
            proto,
            fetched: Vec::new(),
            fetched_shard: Vec::new(),
            error: None,
            reads_left: 0,
            rounds: 0,
            restarts: 0,
            plan_signature: 0,
            needs_replan: true,
            unsubmitted: Vec::new(),
            caller: crate::runtime::tracking::current(),
            script_caller: crate::acl::script_caller(),
            keyset: None,
            cross: false,
        }
    }

    /// Records what the plan depended on (call right after planning `reads`).
    pub fn note_plan(&mut self, shards: &ShardSet, reads: &[(u32, RecordRead)]) {
        self.plan_signature = plan_signature(shards, reads);
        self.needs_replan = false;
    }

    pub fn is_write(&self) -> bool {
        self.spec.may_write()
    }

    /// May this command's next run be a restartable one (`restartable`, and restarts
    /// left)?
    pub fn may_restart(&self) -> bool {
        self.restarts < RESTARTS_MAX && restartable(self.spec)
    }
}

/// Whether a keyed command on the worker's own shards may run restartably: discarded at
/// its first record not in memory and run again after the read. Not blocking commands
/// (their run registers or serves waiting clients). Transactions and the coordinated pass
/// never run restartably either (see the module essay). Scripts do (EVAL, EVALSHA, FCALL
/// and their `_RO` forms): a `redis.call` that misses stops the script (every later call,
/// `pcall` and instruction hook raises, `scripting::engine`, `RunState::missed`) and the run
/// is discarded like any other; what a discarded script run leaves outside the shards is
/// its `redis.log` lines (written again by the run that is kept) and nothing else a client
/// can see. A script that wrote before its first miss reads synchronously from then on,
/// as every restartable run does.
pub fn restartable(spec: &CommandSpec) -> bool {
    !crate::commands::blocking::is_blocking(spec.name)
}

/// A read buffer: one of the pooled buffers (registered with the ring when `fixed` names
/// its index), or a larger one allocated for a long record.
struct ReadBuf {
    bytes: AlignedBuf,
    /// Index among the ring's registered buffers. Such a buffer is never freed while the
    /// ring lives: it is always in `Reads::bufs` or in a pending read.
    fixed: Option<u16>,
}

/// A read on the ring. The buffer is owned here, untouched, until its completion.
struct PendingRead {
    parked: usize,
    shard: u32,
    plan: RecordRead,
    buf: ReadBuf,
    /// Other parked commands waiting for the same record (`Reads::submit_for`: a record
    /// already on the ring is not read twice); each gets a copy, after `parked`.
    also: Vec<usize>,
}

/// What completing a read needs from the worker: its ring and registered files (to
/// submit follow-up reads), its shards, and which shards are its own.
pub struct ReadIo<'a> {
    pub ring: &'a mut IoUring,
    pub fixed: &'a [RawFd],
    pub shards: &'a mut ShardSet,
    pub own: &'a dyn Fn(u32) -> bool,
}

/// Counters for INFO.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadStats {
    pub parked_commands: u64,
    /// Runs discarded for a record not in memory (the command parked again).
    pub restarts: u64,
    /// Commands that reached `RESTARTS_MAX` and ran with synchronous reads.
    pub restart_fallbacks: u64,
    pub reads_submitted: u64,
    pub stale_reads: u64,
    pub waited_for_slots: u64,
    /// Reads not submitted because the same record was already on the ring for another
    /// parked command (it got a copy of that read's record).
    pub shared_reads: u64,
    /// Reads submitted to a device's own queue (`AsyncReads`: the userspace NVMe driver)
    /// instead of the ring.
    pub device_reads_submitted: u64,
}

pub struct Reads {
    reads: Vec<Option<PendingRead>>,
    free_reads: Vec<usize>,
    inflight: usize,
    /// Reads on the ring by (file, offset), to find one a new plan asks for again.
    on_ring: HashMap<(RawFd, u64), Vec<usize>>,
    parked: Vec<Option<Parked>>,
    free_parked: Vec<usize>,
    parked_count: usize,
    /// Parked commands with unsubmitted reads, oldest first.
    waiting: VecDeque<usize>,
    /// Idle pooled read buffers (the ring may have them registered: `Reads` must be
    /// dropped after the ring, see `Worker`'s field order).
    bufs: Vec<ReadBuf>,
    /// Completions held back by `--debug-read-delay-ms`: (due, read index, result).
    delayed: VecDeque<(Instant, usize, i32)>,
    delay: Duration,
    pub stats: ReadStats,
    /// What finished commands leave behind, reused so that parking a command allocates
    /// nothing but its arguments in the steady state: records' byte vectors, plan
    /// vectors, fetched-record vectors.
    pool: RecordPool,
    spare_plans: Vec<Vec<(u32, RecordRead)>>,
    spare_fetched: Vec<(Vec<Fetched>, Vec<u32>)>,
    /// The store's devices (`set_devices`); a plan's stand-in descriptor
    /// (`device::async_device_fd`) names one that reads through `AsyncReads`.
    devices: Vec<Arc<dyn BlockDevice>>,
    /// Reads on `AsyncReads` devices not reported done yet (part of `inflight`).
    device_inflight: usize,
    /// Completions collected during one device poll: (read index, result).
    device_done: Vec<(usize, i32)>,
    /// Argument buffers of finished commands (`arg_list`, `recycle_args`).
    spare_args: Vec<Vec<u8>>,
    /// Emptied `on_ring` lists, so a read's entry allocates nothing (at most one per
    /// read that can be in flight).
    spare_on_ring: Vec<Vec<usize>>,
}

/// The reads `spec` with `args` needs on the shards `own` accepts (the worker's own
/// shards: borrowed ones are read synchronously, their reads must not outlive the loan).
pub fn plan(
    shards: &mut ShardSet,
    own: impl Fn(u32) -> bool,
    spec: &CommandSpec,
    args: &[&[u8]],
    db: u8,
    have: &[Fetched],
    out: &mut Vec<(u32, RecordRead)>,
) {
    thread_local! {
        /// `plan_key_reads`'s output before it joins `out`; one per thread, so planning
        /// allocates nothing once it has grown.
        static SCRATCH: RefCell<Vec<RecordRead>> = const { RefCell::new(Vec::new()) };
    }
    SCRATCH.with(|scratch| {
        let mut reads = scratch.borrow_mut();
        plan_with(shards, own, spec, args, db, have, out, &mut reads)
    })
}

#[allow(clippy::too_many_arguments)]
fn plan_with(
    shards: &mut ShardSet,
    own: impl Fn(u32) -> bool,
    spec: &CommandSpec,
    args: &[&[u8]],
    db: u8,
    have: &[Fetched],
    out: &mut Vec<(u32, RecordRead)>,
    reads: &mut Vec<RecordRead>,
) {
    reads.clear();
    let blind = crate::commands::string::blind_write(spec.name, args);
    for pos in key_positions(spec, args) {
        let id = shards.shard_id(args[pos]);
        if !own(id) {
            continue;
        }
        let Some(shard) = shards.slots[id as usize].as_mut() else {
            continue;
        };
        if blind && shard.blind_writes {
            continue; // `Shard::put_blind` reads nothing it does not have
        }
        shard.plan_key_reads(db, args[pos], have, reads);
        for r in reads.drain(..) {
            if !out.iter().any(|(_, o)| o.same_record(&r)) {
                out.push((id, r));
            }
        }
    }
}

/// The reads that lookups of `keys` ((db, key) pairs) need on the shards `own` accepts:
/// `plan` for a list of keys gathered from several commands (a transaction's queue).
pub fn plan_keys(
    shards: &mut ShardSet,
    own: impl Fn(u32) -> bool,
    keys: &[(u8, Vec<u8>)],
    have: &[Fetched],
    out: &mut Vec<(u32, RecordRead)>,
) {
    let mut reads = Vec::new();
    for (db, key) in keys {
        let id = shards.shard_id(key);
        if !own(id) {
            continue;
        }
        let Some(shard) = shards.slots[id as usize].as_mut() else {
            continue;
        };
        shard.plan_key_reads(*db, key, have, &mut reads);
        for r in reads.drain(..) {
            if !out.iter().any(|(_, o)| o.same_record(&r)) {
                out.push((id, r));
            }
        }
    }
}

/// The sum of `change_signature` over the distinct shards `reads` touch.
/// (No vector of the ids is built: this runs for every parked command.)
fn plan_signature(shards: &ShardSet, reads: &[(u32, RecordRead)]) -> u64 {
    let mut sum = 0u64;
    for (i, (id, _)) in reads.iter().enumerate() {
        if reads[..i].iter().any(|(o, _)| o == id) {
            continue;
        }
        sum = sum.wrapping_add(signature_of(shards, *id));
    }
    sum
}

/// The sum of `change_signature` over the distinct shards in `ids`.
pub fn shard_signature(shards: &ShardSet, ids: &[u32]) -> u64 {
    let mut sum = 0u64;
    for (i, id) in ids.iter().enumerate() {
        if ids[..i].contains(id) {
            continue;
        }
        sum = sum.wrapping_add(signature_of(shards, *id));
    }
    sum
}

fn signature_of(shards: &ShardSet, id: u32) -> u64 {
    shards.slots[id as usize]
        .as_ref()
        .map_or(0, |s| s.change_signature())
}

impl Reads {
    pub fn new(ring: &IoUring, delay_ms: u64) -> Reads {
        let bufs: Vec<AlignedBuf> = (0..FIXED_READ_BUFFERS)
            .map(|_| AlignedBuf::new_zeroed(READ_BUFFER_BYTES))
            .collect();
        Reads {
            reads: Vec::new(),
            free_reads: Vec::new(),
            inflight: 0,
            on_ring: HashMap::new(),
            parked: Vec::new(),
            free_parked: Vec::new(),
            parked_count: 0,
            waiting: VecDeque::new(),
            bufs: register_read_bufs(ring, bufs),
            delayed: VecDeque::new(),
            delay: Duration::from_millis(delay_ms),
            stats: ReadStats::default(),
            pool: RecordPool::default(),
            spare_plans: Vec::new(),
            spare_fetched: Vec::new(),
            devices: Vec::new(),
            device_inflight: 0,
            device_done: Vec::new(),
            spare_args: Vec::new(),
            spare_on_ring: Vec::new(),
        }
    }

    /// The store's devices, for reads planned on devices without a file descriptor
    /// that read asynchronously (the userspace NVMe driver).
    pub fn set_devices(&mut self, devices: &[Arc<dyn BlockDevice>]) {
        if self.devices.len() < devices.len() {
            self.devices = devices.to_vec();
        }
    }

    /// Reads on `AsyncReads` devices (the NVMe queue) not done yet: the worker polls
    /// them every round and never parks while there are any.
    pub fn device_inflight(&self) -> usize {
        self.device_inflight
    }

    /// Polls every `AsyncReads` device with reads of ours outstanding (each reaps at most
    /// its per-poll cap of completions) and completes the reads that are over. Returns
    /// the number of reads completed.
    pub fn poll_devices(&mut self, io: &mut ReadIo, ready: &mut Vec<Parked>) -> usize {
        if self.device_inflight == 0 {
            return 0;
        }
        let mut done = std::mem::take(&mut self.device_done);
        {
            let Reads { devices, reads, .. } = self;
            for dev in devices.iter() {
                let Some(a) = dev.async_reads() else {
                    continue;
                };
                a.poll_reads(&mut |ev| match ev {
                    ReadEvent::Data { token, at, bytes } => {
                        if let Some(r) = reads.get_mut(token as usize).and_then(Option::as_mut) {
                            let dst = r.buf.bytes.as_mut_slice();
                            let end = (at + bytes.len()).min(dst.len());
                            if at < end {
                                dst[at..end].copy_from_slice(&bytes[..end - at]);
                            }
                        }
                    }
                    ReadEvent::Done { token, result } => {
                        let res = match (result, reads.get(token as usize)) {
                            (Ok(()), Some(Some(r))) => r.plan.len_bytes as i32,
                            (Ok(()), _) => -libc::EIO,
                            (Err(e), _) => -crate::device::error_errno(&e),
                        };
                        done.push((token as usize, res));
                    }
                });
            }
        }
        let n = done.len();
        for (idx, res) in done.drain(..) {
            self.device_inflight = self.device_inflight.saturating_sub(1);
            self.on_completion(idx, res, io, ready);
        }
        // Reads whose submission failed while completing these wait for the next poll.
        done.append(&mut self.device_done);
        self.device_done = done;
        n
    }

    /// An empty plan vector (a reused one when there is one); hand it back with
    /// `give_plan_vec` when it did not go to `park`.
    pub fn plan_vec(&mut self) -> Vec<(u32, RecordRead)> {
        self.spare_plans.pop().unwrap_or_default()
    }

    pub fn give_plan_vec(&mut self, mut v: Vec<(u32, RecordRead)>) {
        if self.spare_plans.len() < SPARE_VECS_MAX {
            v.clear();
            self.spare_plans.push(v);
        }
    }

    /// `args` copied for a command about to park, in a reused buffer when there is one.
    pub fn arg_list(&mut self, args: &[&[u8]]) -> ArgList {
        ArgList::new_in(self.spare_args.pop().unwrap_or_default(), args)
    }

    /// A finished command's argument buffer, kept for the next `arg_list` (small ones, up
    /// to `SPARE_VECS_MAX` of them).
    pub fn recycle_args(&mut self, args: ArgList) {
        let data = args.data;
        if data.capacity() <= SPARE_ARGS_BYTES_MAX && self.spare_args.len() < SPARE_VECS_MAX {
            self.spare_args.push(data);
        }
    }

    /// A finished command's fetched records and their vectors, kept for reuse.
    pub fn recycle_fetched(&mut self, mut fetched: Vec<Fetched>, mut fetched_shard: Vec<u32>) {
        for f in fetched.drain(..) {
            self.pool.recycle(f);
        }
        fetched_shard.clear();
        if self.spare_fetched.len() < SPARE_VECS_MAX {
            self.spare_fetched.push((fetched, fetched_shard));
        }
    }

    /// Reads on the ring (a worker that stops waits for them: they write into our buffers).
    pub fn inflight(&self) -> usize {
        self.inflight
    }

    /// At `PARKED_MAX`: the worker stops parsing new commands until some complete.
    pub fn is_full(&self) -> bool {
        self.parked_count >= PARKED_MAX
    }

    /// Completions held back by the test-only read delay.
    pub fn has_delayed(&self) -> bool {
        !self.delayed.is_empty()
    }

    /// Parks `p` again after a restartable run of it missed the records `wanted` reads
    /// (non-empty); what it fetched so far stays with it for the next run. When the reads
    /// are back and the shards they touch did not change, it runs at once; otherwise its
    /// declared keys are planned again first (the same rule as a first park).
    pub fn park_restarted(
        &mut self,
        mut p: Parked,
        wanted: Vec<(u32, RecordRead)>,
        shards: &ShardSet,
        ring: &mut IoUring,
        fixed: &[RawFd],
    ) {
        self.stats.restarts += 1;
        p.restarts += 1;
        p.rounds = 0;
        p.note_plan(shards, &wanted);
        self.park(p, wanted, ring, fixed);
    }

    /// Parks `p` and submits `reads` (non-empty) for it.
    pub fn park(
        &mut self,
        mut p: Parked,
        reads: Vec<(u32, RecordRead)>,
        ring: &mut IoUring,
        fixed: &[RawFd],
    ) {
        debug_assert!(!reads.is_empty());
        self.stats.parked_commands += 1;
        if p.fetched.capacity() == 0 {
            if let Some((f, s)) = self.spare_fetched.pop() {
                (p.fetched, p.fetched_shard) = (f, s);
            }
        }
        p.fetched.reserve(reads.len());
        p.fetched_shard.reserve(reads.len());
        p.unsubmitted = reads;
        let idx = match self.free_parked.pop() {
            Some(i) => i,
            None => {
                self.parked.push(None);
                self.parked.len() - 1
            }
        };
        self.parked[idx] = Some(p);
        self.parked_count += 1;
        self.submit_for(idx, ring, fixed);
    }

    /// Submits what fits of parked command `idx`'s unsubmitted reads; the rest wait in
    /// line for read slots.
    fn submit_for(&mut self, idx: usize, ring: &mut IoUring, fixed: &[RawFd]) {
        let Some(mut unsubmitted) = self.parked[idx]
            .as_mut()
            .map(|p| std::mem::take(&mut p.unsubmitted))
        else {
            return;
        };
        while self.inflight < READS_INFLIGHT_MAX {
            let Some((shard, plan)) = unsubmitted.pop() else {
                break;
            };
            // The record is on the ring already for another parked command (writers of one
            // hot collection all missing its newest leaf after a block seal): wait for that
            // read and take a copy, instead of reading it once per command.
            if let Some(r) = self.on_ring_read(shard, &plan) {
                if let Some(read) = self.reads[r].as_mut() {
                    if read.parked != idx && !read.also.contains(&idx) {
                        read.also.push(idx);
                        self.stats.shared_reads += 1;
                        if let Some(p) = self.parked[idx].as_mut() {
                            p.reads_left += 1;
                        }
                    }
                }
                continue;
            }
            let buf = self.buf_for(plan.len_bytes);
            self.submit(
                PendingRead {
                    parked: idx,
                    shard,
                    plan,
                    buf,
                    also: Vec::new(),
                },
                ring,
                fixed,
            );
            if let Some(p) = self.parked[idx].as_mut() {
                p.reads_left += 1;
            }
        }
        if unsubmitted.is_empty() {
            self.give_plan_vec(unsubmitted);
        } else {
            self.stats.waited_for_slots += 1;
            if let Some(p) = self.parked[idx].as_mut() {
                p.unsubmitted = unsubmitted;
            }
            if !self.waiting.contains(&idx) {
                self.waiting.push_back(idx);
            }
        }
    }

    /// The read on the ring, if any, of the record `plan` names on `shard`.
    fn on_ring_read(&self, shard: u32, plan: &RecordRead) -> Option<usize> {
        self.on_ring
            .get(&(plan.fd, plan.offset_bytes))?
            .iter()
            .copied()
            .find(|&r| {
                self.reads[r]
                    .as_ref()
                    .is_some_and(|x| x.shard == shard && x.plan.same_record(plan))
            })
    }

    fn submit(&mut self, mut read: PendingRead, ring: &mut IoUring, fixed: &[RawFd]) {
        let idx = match self.free_reads.pop() {
            Some(i) => i,
            None => {
                self.reads.push(None);
                self.reads.len() - 1
            }
        };
        let spare = &mut self.spare_on_ring;
        self.on_ring
            .entry((read.plan.fd, read.plan.offset_bytes))
            .or_insert_with(|| spare.pop().unwrap_or_default())
            .push(idx);
        let len = read.plan.len_bytes.min(read.buf.bytes.len());
        let off = read.plan.offset_bytes;
        if let Some(dev) = crate::device::async_device_index(read.plan.fd) {
            // The userspace NVMe driver (or its stand-in): submitted to this thread's
            // own queue pair, completed by `poll_devices` in a later round.
            match self.devices.get(dev).and_then(|d| d.async_reads()) {
                Some(a) => a.submit_read(idx as u64, off, len),
                None => {
                    tracing::error!(
                        "read planned on device {dev}, which has no asynchronous reads"
                    );
                    self.device_done.push((idx, -libc::EIO));
                }
            }
            self.reads[idx] = Some(read);
            self.inflight += 1;
            self.device_inflight += 1;
            self.stats.reads_submitted += 1;
            self.stats.device_reads_submitted += 1;
            return;
        }
        let ptr = read.buf.bytes.as_mut_slice().as_mut_ptr();
        let sqe = match (file_target(fixed, read.plan.fd), read.buf.fixed) {
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
        self.inflight += 1;
        self.stats.reads_submitted += 1;
        push_sqe(ring, &sqe);
    }

    fn buf_for(&mut self, len: usize) -> ReadBuf {
        if len <= READ_BUFFER_BYTES {
            if let Some(buf) = self.bufs.pop() {
                return buf;
            }
        }
        ReadBuf {
            bytes: AlignedBuf::new_zeroed(len.max(READ_BUFFER_BYTES)),
            fixed: None,
        }
    }

    fn recycle(&mut self, buf: ReadBuf) {
        // Registered buffers always go back (they must outlive the ring); others of the
        // pooled size too.
        if buf.fixed.is_some() || buf.bytes.len() == READ_BUFFER_BYTES {
            self.bufs.push(buf);
        }
    }

    /// A read completion from the ring. With the test-only delay it is held back and
    /// handled by `release_delayed`. Returns the commands now ready to run.
    pub fn on_completion(
        &mut self,
        idx: usize,
        res: i32,
        io: &mut ReadIo,
        ready: &mut Vec<Parked>,
    ) {
        if !self.delay.is_zero() {
            self.delayed
                .push_back((Instant::now() + self.delay, idx, res));
            return;
        }
        self.complete(idx, res, io, ready);
    }

    /// Handles held-back completions whose delay is over.
    pub fn release_delayed(&mut self, io: &mut ReadIo, ready: &mut Vec<Parked>) {
        let now = Instant::now();
        while self.delayed.front().is_some_and(|d| d.0 <= now) {
            if let Some((_, idx, res)) = self.delayed.pop_front() {
                self.complete(idx, res, io, ready);
            }
        }
    }

    fn complete(&mut self, idx: usize, res: i32, io: &mut ReadIo, ready: &mut Vec<Parked>) {
        let Some(mut read) = self.reads.get_mut(idx).and_then(|r| r.take()) else {
            return;
        };
        self.free_reads.push(idx);
        self.inflight -= 1;
        let at = (read.plan.fd, read.plan.offset_bytes);
        if let Some(v) = self.on_ring.get_mut(&at) {
            v.retain(|&r| r != idx);
            if v.is_empty() {
                if let Some(v) = self.on_ring.remove(&at) {
                    if self.spare_on_ring.len() < READS_INFLIGHT_MAX {
                        self.spare_on_ring.push(v);
                    }
                }
            }
        }
        let pidx = read.parked;
        let also = std::mem::take(&mut read.also);
        let outcome = if res < 0 || (res as usize) < read.plan.len_bytes {
            let e = if res < 0 {
                std::io::Error::from_raw_os_error(-res).to_string()
            } else {
                "short device read".to_string()
            };
            Err(format!("ERR storage error: device error: {e}"))
        } else {
            match io.shards.slots[read.shard as usize].as_mut() {
                // The shard went away (lent out while the read ran): plan again later.
                None => Ok(ReadDone::Stale),
                Some(shard) => {
                    Ok(shard.complete_read(&read.plan, read.buf.bytes.as_slice(), &mut self.pool))
                }
            }
        };
        let shard = read.shard;
        match outcome {
            Ok(ReadDone::More(plan)) => {
                let buf = if plan.len_bytes > read.buf.bytes.len() {
                    self.recycle(read.buf);
                    ReadBuf {
                        bytes: AlignedBuf::new_zeroed(plan.len_bytes),
                        fixed: None,
                    }
                } else {
                    read.buf
                };
                self.submit(
                    PendingRead {
                        parked: pidx,
                        shard,
                        plan,
                        buf,
                        also,
                    },
                    io.ring,
                    io.fixed,
                );
                return;
            }
            Ok(ReadDone::Record(f)) => {
                self.recycle(read.buf);
                for &w in &also {
                    if let Some(p) = self.parked[w].as_mut() {
                        p.needs_replan |= f.is_large_root();
                        p.fetched.push(f.clone());
                        p.fetched_shard.push(shard);
                    }
                }
                if let Some(p) = self.parked[pidx].as_mut() {
                    p.needs_replan |= f.is_large_root();
                    p.fetched.push(f);
                    p.fetched_shard.push(shard);
                }
            }
            Ok(ReadDone::Stale) => {
                self.recycle(read.buf);
                self.stats.stale_reads += 1;
                for &w in std::iter::once(&pidx).chain(&also) {
                    if let Some(p) = self.parked[w].as_mut() {
                        p.needs_replan = true;
                    }
                }
            }
            Err(e) => {
                self.recycle(read.buf);
                for &w in std::iter::once(&pidx).chain(&also) {
                    if let Some(p) = self.parked[w].as_mut() {
                        p.needs_replan = true;
                        p.error.get_or_insert_with(|| e.clone());
                    }
                }
            }
        }
        // The command that asked first runs first (its reply order among the others is
        // theirs to keep: each waits on its own connection's slot).
        for w in std::iter::once(pidx).chain(also) {
            let done = match self.parked[w].as_mut() {
                Some(p) => {
                    p.reads_left -= 1;
                    p.reads_left == 0 && p.unsubmitted.is_empty()
                }
                None => false,
            };
            if done {
                self.replan(w, io, ready);
            }
        }
        self.pump(io.ring, io.fixed);
    }

    /// All of a command's reads are back: plan again; run it (hand it to the worker)
    /// when nothing is missing, after an error, or after `PLAN_ROUNDS_MAX` rounds.
    fn replan(&mut self, pidx: usize, io: &mut ReadIo, ready: &mut Vec<Parked>) {
        let Some(p) = self.parked[pidx].as_mut() else {
            return;
        };
        // Every read came back as a plain record and nothing the plan depended on changed
        // (its shards are exactly those of the fetched records): planning again would find
        // nothing new, so the command runs now.
        if !p.needs_replan
            && p.rounds == 0
            && p.error.is_none()
            && shard_signature(io.shards, &p.fetched_shard) == p.plan_signature
        {
            if let Some(p) = self.parked[pidx].take() {
                self.free_parked.push(pidx);
                self.parked_count -= 1;
                ready.push(p);
            }
            return;
        }
        p.rounds += 1;
        let mut more = self.spare_plans.pop().unwrap_or_default();
        if p.error.is_none() && p.rounds < PLAN_ROUNDS_MAX {
            let (spec, db, fetched) = (p.spec, p.db, &p.fetched);
            match &p.keyset {
                Some(keys) => plan_keys(io.shards, io.own, keys, fetched, &mut more),
                None => p.args.with_refs(|args| {
                    plan(io.shards, io.own, spec, args, db, fetched, &mut more);
                }),
            }
        }
        if more.is_empty() {
            self.give_plan_vec(more);
            if let Some(p) = self.parked[pidx].take() {
                self.free_parked.push(pidx);
                self.parked_count -= 1;
                ready.push(p);
            }
            return;
        }
        p.unsubmitted = more;
        self.submit_for(pidx, io.ring, io.fixed);
    }

    /// Gives free read slots to parked commands waiting for them, oldest first.
    fn pump(&mut self, ring: &mut IoUring, fixed: &[RawFd]) {
        while self.inflight < READS_INFLIGHT_MAX {
            let Some(idx) = self.waiting.pop_front() else {
                return;
            };
            self.submit_for(idx, ring, fixed);
        }
    }
}

/// Reads for a command that runs on borrowed shards (a coordinated multi-worker pass) and
/// still misses records after its prefetch rounds (see the module essay): the coordinator
/// holds every lender's shards and the lenders wait for it, so the command cannot be
/// parked; instead all its reads go on a small ring of their own at once and the
/// coordinator waits for them together — one device latency for the command (a whole
/// transaction) instead of one per key. A separate ring, so that waiting on it consumes no
/// completion of the worker's own ring.
pub struct BatchReads {
    ring: IoUring,
    /// `--debug-read-delay-ms`: each wait also lasts this long (a slow device, for tests).
    delay: Duration,
    /// Waits for the device so far (taken by the caller for INFO `lavik_batch_read_waits`).
    pub waits: u64,
}

/// Entries of the batch ring: reads submitted per wait.
const BATCH_RING_ENTRIES: u32 = 64;

impl BatchReads {
    pub fn new(delay_ms: u64) -> std::io::Result<BatchReads> {
        Ok(BatchReads {
            ring: IoUring::new(BATCH_RING_ENTRIES)?,
            delay: Duration::from_millis(delay_ms),
            waits: 0,
        })
    }

    /// Fetches what `spec` with `args` needs from every held shard, waiting for the reads
    /// (all in flight together), beyond what `fetched` (with `fetched_shard`) already
    /// holds; the records join those two vectors.
    pub fn fetch(
        &mut self,
        shards: &mut ShardSet,
        spec: &CommandSpec,
        args: &[&[u8]],
        db: u8,
        fetched: &mut Vec<Fetched>,
        fetched_shard: &mut Vec<u32>,
    ) {
        self.fetch_planned(shards, fetched, fetched_shard, |shards, have, todo| {
            plan(shards, |_| true, spec, args, db, have, todo)
        });
    }

    /// `fetch` for the lookups of `keys` ((db, key) pairs, a transaction's).
    pub fn fetch_keys(
        &mut self,
        shards: &mut ShardSet,
        keys: &[(u8, Vec<u8>)],
        fetched: &mut Vec<Fetched>,
        fetched_shard: &mut Vec<u32>,
    ) {
        self.fetch_planned(shards, fetched, fetched_shard, |shards, have, todo| {
            plan_keys(shards, |_| true, keys, have, todo)
        });
    }

    fn fetch_planned(
        &mut self,
        shards: &mut ShardSet,
        fetched: &mut Vec<Fetched>,
        fetched_shard: &mut Vec<u32>,
        mut planner: impl FnMut(&mut ShardSet, &[Fetched], &mut Vec<(u32, RecordRead)>),
    ) {
        let mut todo = Vec::new();
        let mut pool = RecordPool::default();
        for _ in 0..PLAN_ROUNDS_MAX {
            if todo.is_empty() {
                planner(shards, fetched, &mut todo);
            }
            if todo.is_empty() {
                break;
            }
            // Reads on a device without a descriptor (NVMe) are left to the handler's
            // synchronous read: this ring cannot reach that device's queue.
            todo.retain(|(_, r)| crate::device::async_device_index(r.fd).is_none());
            if todo.is_empty() {
                break;
            }
            let batch: Vec<(u32, RecordRead)> = todo
                .drain(..todo.len().min(BATCH_RING_ENTRIES as usize))
                .collect();
            let mut bufs: Vec<AlignedBuf> = batch
                .iter()
                .map(|(_, r)| AlignedBuf::new_zeroed(r.len_bytes))
                .collect();
            for (i, ((_, r), buf)) in batch.iter().zip(bufs.iter_mut()).enumerate() {
                let sqe = opcode::Read::new(
                    types::Fd(r.fd),
                    buf.as_mut_slice().as_mut_ptr(),
                    r.len_bytes as u32,
                )
                .offset(r.offset_bytes)
                .build()
                .user_data(i as u64);
                push_sqe(&mut self.ring, &sqe);
            }
            self.waits += 1;
            let mut results = vec![None; batch.len()];
            let mut done = 0;
            while done < batch.len() {
                if let Err(e) = self.ring.submit_and_wait(batch.len() - done) {
                    if e.raw_os_error() != Some(libc::EINTR) {
                        tracing::error!("batch read wait failed: {e}");
                    }
                }
                for cqe in self.ring.completion() {
                    let i = cqe.user_data() as usize;
                    if results[i].is_none() {
                        done += 1;
                    }
                    results[i] = Some(cqe.result());
                }
            }
            if !self.delay.is_zero() {
                std::thread::sleep(self.delay);
            }
            // Every read has completed: `bufs` are ours again.
            for (((id, r), buf), res) in batch.into_iter().zip(&bufs).zip(results) {
                let res = res.unwrap_or(-libc::EIO);
                if res < 0 || (res as usize) < r.len_bytes {
                    continue; // the handler's synchronous read reports the error
                }
                let Some(shard) = shards.slots[id as usize].as_mut() else {
                    continue;
                };
                match shard.complete_read(&r, buf.as_slice(), &mut pool) {
                    ReadDone::Record(f) => {
                        fetched.push(f);
                        fetched_shard.push(id);
                    }
                    ReadDone::More(longer) => todo.push((id, longer)),
                    ReadDone::Stale => {}
                }
            }
        }
    }
}

/// Lends fetched records to their shards for the time `run` takes, then takes them back,
/// leaving them in `fetched` afterwards (in their order, matching `fetched_shard`) for the
/// caller to reuse. Records of one shard — every single-key
/// command — are lent as the vector itself, with no allocation.
pub fn with_lent_in<R>(
    shards: &mut ShardSet,
    fetched: &mut Vec<Fetched>,
    fetched_shard: &[u32],
    run: impl FnOnce(&mut ShardSet) -> R,
) -> R {
    if fetched_shard.windows(2).all(|w| w[0] == w[1]) {
        let sh = fetched_shard.first().map(|s| *s as usize);
        if let Some(s) = sh.and_then(|sh| shards.slots[sh].as_mut()) {
            s.lend_prefetched(fetched);
        }
        let r = run(shards);
        if let Some(s) = sh.and_then(|sh| shards.slots[sh].as_mut()) {
            s.take_prefetched(fetched);
        }
        return r;
    }
    let mut lent: Vec<(u32, Vec<Fetched>)> = Vec::new();
    for (f, sh) in fetched.drain(..).zip(fetched_shard.iter().copied()) {
        match lent.iter_mut().find(|(s, _)| *s == sh) {
            Some((_, v)) => v.push(f),
            None => lent.push((sh, vec![f])),
        }
    }
    for (sh, v) in lent.iter_mut() {
        if let Some(s) = shards.slots[*sh as usize].as_mut() {
            s.lend_prefetched(v);
        }
    }
    let r = run(shards);
    for (sh, v) in lent.iter_mut() {
        if let Some(s) = shards.slots[*sh as usize].as_mut() {
            s.take_prefetched(v);
        }
        v.reverse();
    }
    // Back in their first order, so `fetched_shard` still names each one's shard (a
    // restarted command is lent them again).
    for sh in fetched_shard {
        if let Some(f) = lent
            .iter_mut()
            .find(|(s, _)| s == sh)
            .and_then(|(_, v)| v.pop())
        {
            fetched.push(f);
        }
    }
    r
}

/// Records lent to their shards for longer than one closure: a transaction lends what
/// its reads fetched for the WATCH check and its whole queue, then `give_back`.
pub struct Lent {
    groups: Vec<(u32, Vec<Fetched>)>,
}

/// Lends `fetched` (with the shard of each) to those shards; shards not held keep nothing
/// (their records come back unused).
pub fn lend(shards: &mut ShardSet, fetched: Vec<Fetched>, fetched_shard: Vec<u32>) -> Lent {
    let mut groups: Vec<(u32, Vec<Fetched>)> = Vec::new();
    for (f, sh) in fetched.into_iter().zip(fetched_shard) {
        match groups.iter_mut().find(|(s, _)| *s == sh) {
            Some((_, v)) => v.push(f),
            None => groups.push((sh, vec![f])),
        }
    }
    for (sh, v) in groups.iter_mut() {
        if let Some(s) = shards.slots[*sh as usize].as_mut() {
            s.lend_prefetched(v);
        }
    }
    Lent { groups }
}

impl Lent {
    /// Ends the loan: the records come back with their shards.
    pub fn give_back(mut self, shards: &mut ShardSet) -> (Vec<Fetched>, Vec<u32>) {
        let (mut fetched, mut fetched_shard) = (Vec::new(), Vec::new());
        for (sh, v) in self.groups.iter_mut() {
            if let Some(s) = shards.slots[*sh as usize].as_mut() {
                s.take_prefetched(v);
            }
            fetched_shard.extend(std::iter::repeat_n(*sh, v.len()));
            fetched.append(v);
        }
        (fetched, fetched_shard)
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
    // SAFETY: the buffers stay allocated, unmoved on the heap, for as long as the ring:
    // they live in `Reads::bufs` or in a pending read, both owned by a `Reads` that the
    // worker declares (and so drops) after its ring, and a pooled buffer is never freed
    // (`recycle` always keeps registered ones).
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

#[cfg(test)]
mod tests {
    use super::*;

    // Proves an argument list built in a reused buffer holds exactly the new arguments
    // (nothing of what the buffer held before) and keeps the buffer's allocation.
    #[test]
    fn arg_list_in_reused_buffer() {
        let old = ArgList::new(&[b"SET", b"a-much-longer-key", &[1u8; 200]]);
        let ptr = old.data.as_ptr();
        let args: [&[u8]; 2] = [b"GET", b"k"];
        let new = ArgList::new_in(old.data, &args);
        assert_eq!(new.data.as_ptr(), ptr);
        assert_eq!(new.iter().collect::<Vec<_>>(), args.to_vec());
        new.with_refs(|a| assert_eq!(a, &args[..]));
    }
}
