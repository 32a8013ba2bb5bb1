//! Per-command statistics: INFO `commandstats`, `errorstats`, `latencystats`, the
//! `total_error_replies` stat, LATENCY HISTOGRAM, and the latency monitor's samples.
//!
//! What it owns: one `WorkerStats` per worker, written only by that worker's thread
//! (the thread-local `CURRENT` points at it), read by whichever worker runs INFO. A
//! command counts where it executes: on the connection's worker, on the key owner's
//! worker for a forwarded request, on the coordinator for a coordinated pass.
//!
//! Cost: counters are indexed by the ACL catalog's command id (the table index, or a
//! container's subcommand id), so recording is a few plain loads and stores — one
//! writer per counter means no atomic read-modify-write (`bump` is a load and a store)
//! — plus one histogram bucket. Histograms are allocated on a command's first call.
//!
//! Reset (CONFIG RESETSTAT) cannot zero another thread's counters without racing its
//! writer, so it advances a shared epoch: a reader treats a worker whose epoch is older
//! as all zero, and the worker zeroes its own counters before it next records.
//!
//! The histogram is log-linear (as HdrHistogram, smaller): values in nanoseconds,
//! exact below 16, then 16 buckets per power of two up to 2^40 ns (about 18 minutes;
//! longer durations land in the last bucket). A percentile reports the highest value
//! of the bucket holding it, so it is never below the true value and at most 1/16
//! (6.25 %) above it. Redis's (3 significant digits) is finer; the bound is documented
//! in `docs/operations.md`.
//!
//! Deliberately missing: commands called from Lua scripts (`redis.call`) are not
//! counted as their own commands (their errors do count in `errorstats`).

use crate::acl::catalog::catalog;
use crate::commands::{CommandSpec, TABLE};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Histogram: exact values below `1 << SUB_BITS`, then `1 << SUB_BITS` buckets per octave.
pub const SUB_BITS: u32 = 4;
const SUB_BUCKETS: usize = 1 << SUB_BITS;
/// The largest recorded duration is `(1 << VALUE_BITS) - 1` ns.
const VALUE_BITS: u32 = 40;
pub const BUCKETS: usize = SUB_BUCKETS + (VALUE_BITS - SUB_BITS) as usize * SUB_BUCKETS;
const _: () = assert!(BUCKETS == 592);
/// Distinct error prefixes INFO errorstats tracks (Redis's limit); more are not listed.
pub const ERROR_PREFIXES_MAX: usize = 128;

/// A counter with one writer: plain load and store, no locked instruction.
fn bump(a: &AtomicU64, n: u64) {
    a.store(a.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// The bucket of a duration in nanoseconds.
pub fn bucket_of(ns: u64) -> usize {
    let v = ns.min((1 << VALUE_BITS) - 1);
    if v < SUB_BUCKETS as u64 {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros();
    let shift = msb - SUB_BITS;
    let sub = ((v >> shift) as usize) & (SUB_BUCKETS - 1);
    SUB_BUCKETS + shift as usize * SUB_BUCKETS + sub
}

/// The smallest and the largest duration bucket `i` holds.
pub fn bucket_range(i: usize) -> (u64, u64) {
    if i < SUB_BUCKETS {
        return (i as u64, i as u64);
    }
    let shift = ((i - SUB_BUCKETS) / SUB_BUCKETS) as u32;
    let sub = ((i - SUB_BUCKETS) % SUB_BUCKETS) as u64;
    let low = (SUB_BUCKETS as u64 + sub) << shift;
    (low, low + (1u64 << shift) - 1)
}

/// The value at percentile `p` (0..=100) of bucket counts `h`, as HdrHistogram picks it:
/// the highest value of the first bucket where the running count reaches
/// `round(p/100 * total)` (at least 1). 0 for an empty histogram.
pub fn percentile(h: &[u64], p: f64) -> u64 {
    let total: u64 = h.iter().sum();
    if total == 0 {
        return 0;
    }
    let want = ((p / 100.0) * total as f64 + 0.5).floor().max(1.0) as u64;
    let mut seen = 0;
    for (i, &c) in h.iter().enumerate() {
        seen += c;
        if seen >= want.min(total) {
            return bucket_range(i).1;
        }
    }
    bucket_range(h.len() - 1).1
}

#[derive(Default)]
pub struct CommandCounters {
    pub calls: AtomicU64,
    pub usec: AtomicU64,
    pub rejected: AtomicU64,
    pub failed: AtomicU64,
    pub hist: OnceLock<Box<[AtomicU64]>>,
}

pub struct WorkerStats {
    /// The reset epoch these counters belong to (see the module essay).
    epoch: AtomicU64,
    pub commands: Box<[CommandCounters]>,
    pub error_replies: AtomicU64,
    /// Error prefix → count; locked only when an error reply is sent, or by INFO.
    pub errors: Mutex<Vec<(String, u64)>>,
}

impl WorkerStats {
    fn new(commands: usize) -> WorkerStats {
        WorkerStats {
            epoch: AtomicU64::new(0),
            commands: (0..commands).map(|_| CommandCounters::default()).collect(),
            error_replies: AtomicU64::new(0),
            errors: Mutex::new(Vec::new()),
        }
    }

    fn zero(&self) {
        for c in self.commands.iter() {
            for a in [&c.calls, &c.usec, &c.rejected, &c.failed] {
                a.store(0, Ordering::Relaxed);
            }
            if let Some(h) = c.hist.get() {
                h.iter().for_each(|b| b.store(0, Ordering::Relaxed));
            }
        }
        self.error_replies.store(0, Ordering::Relaxed);
        self.errors.lock().expect("errors lock").clear();
    }
}

/// All workers' statistics and the reset epoch.
pub struct StatsHub {
    epoch: AtomicU64,
    pub workers: Vec<WorkerStats>,
    /// `latency-tracking`: per-command histograms are kept (commandstats are always).
    pub latency_tracking: std::sync::atomic::AtomicBool,
    /// The latency monitor (LATENCY LATEST/HISTORY/...).
    pub latency: LatencyMonitor,
    /// `latency-tracking-info-percentiles`.
    percentiles: Mutex<Vec<f64>>,
}

/// Samples kept per latency event (Redis keeps 160).
pub const LATENCY_SAMPLES_MAX: usize = 160;

/// One latency event's samples: at most one per second (the largest), newest last.
#[derive(Clone, Debug, Default)]
pub struct LatencyEvent {
    pub samples: std::collections::VecDeque<(u64, u64)>,
    pub max_ms: u64,
}

/// The latency monitor: events whose latency reached `latency-monitor-threshold`
/// milliseconds (0: off). Events: `command` and `fast-command` (commands by their
/// `fast` flag, as Redis), `lavik-commit` (a group-commit epoch: chunk writes plus sync).
#[derive(Default)]
pub struct LatencyMonitor {
    pub threshold_ms: AtomicU64,
    pub events: Mutex<std::collections::BTreeMap<String, LatencyEvent>>,
}

impl LatencyMonitor {
    /// Records `ms` for `event` if the monitor is on and `ms` reaches its threshold.
    pub fn add_if_needed(&self, event: &str, ms: u64) {
        let threshold = self.threshold_ms.load(Ordering::Relaxed);
        if threshold == 0 || ms < threshold {
            return;
        }
        self.add(event, ms, crate::server::now_ms() / 1000);
    }

    pub fn add(&self, event: &str, ms: u64, unix_s: u64) {
        let mut events = self.events.lock().expect("latency lock");
        let e = events.entry(event.to_string()).or_default();
        e.max_ms = e.max_ms.max(ms);
        match e.samples.back_mut() {
            Some(last) if last.0 == unix_s => last.1 = last.1.max(ms),
            _ => {
                e.samples.push_back((unix_s, ms));
                if e.samples.len() > LATENCY_SAMPLES_MAX {
                    e.samples.pop_front();
                }
            }
        }
    }
}

/// Sums over workers, for INFO and LATENCY HISTOGRAM.
#[derive(Clone, Debug, Default)]
pub struct CommandTotals {
    pub name: String,
    pub calls: u64,
    pub usec: u64,
    pub rejected: u64,
    pub failed: u64,
    /// Bucket counts when the command has a histogram.
    pub hist: Option<Vec<u64>>,
}

impl StatsHub {
    pub fn new(workers: usize) -> StatsHub {
        let n = catalog().commands.len();
        StatsHub {
            epoch: AtomicU64::new(0),
            workers: (0..workers).map(|_| WorkerStats::new(n)).collect(),
            latency_tracking: std::sync::atomic::AtomicBool::new(true),
            latency: LatencyMonitor::default(),
            percentiles: Mutex::new(vec![50.0, 99.0, 99.9]),
        }
    }

    pub fn percentiles(&self) -> Vec<f64> {
        self.percentiles.lock().expect("percentiles lock").clone()
    }

    /// CONFIG SET latency-tracking-info-percentiles: numbers from 0 to 100, space separated.
    pub fn set_percentiles(&self, text: &str) -> Result<(), String> {
        let mut v = Vec::new();
        for word in text.split_whitespace() {
            let p: f64 = word
                .parse()
                .map_err(|_| "Invalid latency-tracking-info-percentiles parameters".to_string())?;
            if !(0.0..=100.0).contains(&p) {
                return Err(
                    "latency-tracking-info-percentiles parameters should sit between [0.0,100.0]"
                        .into(),
                );
            }
            v.push(p);
        }
        *self.percentiles.lock().expect("percentiles lock") = v;
        Ok(())
    }

    pub fn percentiles_text(&self) -> String {
        let v = self.percentiles();
        v.iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// CONFIG RESETSTAT: every worker's counters read as zero from now on.
    pub fn reset(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    fn current(&self, w: &WorkerStats) -> bool {
        w.epoch.load(Ordering::Acquire) == self.epoch.load(Ordering::Acquire)
    }

    /// Per command id with anything counted, summed over workers, in catalog order.
    pub fn totals(&self) -> Vec<CommandTotals> {
        let cat = catalog();
        let mut out: Vec<CommandTotals> = Vec::new();
        for (id, c) in cat.commands.iter().enumerate() {
            let mut t = CommandTotals {
                name: c.fullname.clone(),
                ..Default::default()
            };
            for w in self.workers.iter().filter(|w| self.current(w)) {
                let k = &w.commands[id];
                t.calls += k.calls.load(Ordering::Relaxed);
                t.usec += k.usec.load(Ordering::Relaxed);
                t.rejected += k.rejected.load(Ordering::Relaxed);
                t.failed += k.failed.load(Ordering::Relaxed);
                if let Some(h) = k.hist.get() {
                    let sum = t.hist.get_or_insert_with(|| vec![0; BUCKETS]);
                    for (s, b) in sum.iter_mut().zip(h.iter()) {
                        *s += b.load(Ordering::Relaxed);
                    }
                }
            }
            if t.hist.as_ref().is_some_and(|h| h.iter().all(|&b| b == 0)) {
                t.hist = None;
            }
            if t.calls > 0 || t.rejected > 0 || t.failed > 0 {
                out.push(t);
            }
        }
        out
    }

    pub fn error_totals(&self) -> (u64, Vec<(String, u64)>) {
        let mut total = 0;
        let mut by: Vec<(String, u64)> = Vec::new();
        for w in self.workers.iter().filter(|w| self.current(w)) {
            total += w.error_replies.load(Ordering::Relaxed);
            for (p, n) in w.errors.lock().expect("errors lock").iter() {
                match by.iter_mut().find(|(q, _)| q == p) {
                    Some(e) => e.1 += n,
                    None => by.push((p.clone(), *n)),
                }
            }
        }
        by.sort();
        (total, by)
    }
}

thread_local! {
    static CURRENT: RefCell<Option<(Arc<StatsHub>, usize)>> = const { RefCell::new(None) };
    /// Error replies this thread has produced (for "did this command fail").
    static ERRORS_SEEN: Cell<u64> = const { Cell::new(0) };
}

/// Makes this thread record into worker `id`'s statistics.
pub fn install(hub: Arc<StatsHub>, id: usize) {
    CURRENT.with(|c| *c.borrow_mut() = Some((hub, id)));
    crate::resp::encode::set_error_hook(on_error_reply);
}

fn with_mine(f: impl FnOnce(&StatsHub, &WorkerStats)) {
    CURRENT.with(|c| {
        if let Some((hub, id)) = c.borrow().as_ref() {
            let w = &hub.workers[*id];
            let epoch = hub.epoch.load(Ordering::Acquire);
            if w.epoch.load(Ordering::Relaxed) != epoch {
                w.zero();
                w.epoch.store(epoch, Ordering::Release);
            }
            f(hub, w);
        }
    });
}

/// The error prefix Redis counts: the text before the first space within the first 32
/// bytes, or `ERR` when there is none.
pub fn error_prefix(msg: &str) -> &str {
    let head = &msg.as_bytes()[..msg.len().min(32)];
    match head.iter().position(|&b| b == b' ') {
        Some(i) => &msg[..i],
        None => "ERR",
    }
}

/// Called for every error reply encoded on this thread (`ReplyBuf::error`).
fn on_error_reply(msg: &str) {
    ERRORS_SEEN.with(|e| e.set(e.get() + 1));
    with_mine(|_, w| {
        bump(&w.error_replies, 1);
        let prefix = error_prefix(msg);
        let mut errors = w.errors.lock().expect("errors lock");
        if let Some(e) = errors.iter_mut().find(|(p, _)| p == prefix) {
            e.1 += 1;
        } else if errors.len() < ERROR_PREFIXES_MAX {
            errors.push((prefix.to_string(), 1));
        }
    });
}

/// How many error replies this thread has produced so far.
pub fn errors_seen() -> u64 {
    ERRORS_SEEN.with(|e| e.get())
}

/// The catalog id a call of `spec` with `args` counts as: the command, or its
/// subcommand; `None` for an unknown subcommand (Redis counts no command then).
pub fn command_id(spec: &CommandSpec, args: &[&[u8]]) -> Option<usize> {
    let base = TABLE.as_ptr() as usize;
    let at = spec as *const CommandSpec as usize;
    let size = std::mem::size_of::<CommandSpec>();
    if at < base || at >= base + std::mem::size_of_val(TABLE) {
        return None;
    }
    let index = (at - base) / size;
    let cat = catalog();
    if cat.commands[index].subcommands.is_empty() {
        return Some(index);
    }
    cat.resolve(index, args)
}

/// A call that ran: its duration, and whether it replied with an error.
pub fn record_call(spec: &CommandSpec, args: &[&[u8]], ns: u64, failed: bool) {
    let Some(id) = command_id(spec, args) else {
        return;
    };
    with_mine(|hub, w| {
        let c = &w.commands[id];
        bump(&c.calls, 1);
        bump(&c.usec, ns / 1000);
        if failed {
            bump(&c.failed, 1);
        }
        if hub.latency_tracking.load(Ordering::Relaxed) {
            let h = c
                .hist
                .get_or_init(|| (0..BUCKETS).map(|_| AtomicU64::new(0)).collect());
            bump(&h[bucket_of(ns)], 1);
        }
        let event = if spec.flags.contains(&"fast") {
            "fast-command"
        } else {
            "command"
        };
        hub.latency.add_if_needed(event, ns / 1_000_000);
    });
}

/// A call refused before it ran (arity, permissions, loading).
pub fn record_rejected(spec: &CommandSpec, args: &[&[u8]]) {
    let Some(id) = command_id(spec, args) else {
        return;
    };
    with_mine(|_, w| bump(&w.commands[id].rejected, 1));
}

#[cfg(test)]
mod tests {
    use super::*;

    // Every value lands in a bucket whose range holds it, and bucket widths stay within
    // 1/16 of their lower bound (the documented error bound).
    #[test]
    fn buckets_hold_their_values() {
        let mut v = 0u64;
        while v < (1 << VALUE_BITS) {
            let (lo, hi) = bucket_range(bucket_of(v));
            assert!(lo <= v && v <= hi, "{v} in {lo}..={hi}");
            assert!((hi - lo) * 16 <= lo.max(1), "{lo}..={hi}");
            v = v * 9 / 8 + 1;
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_of(15), 15);
        assert_eq!(bucket_of(16), 16);
    }

    // Percentiles pick the bucket where the running count reaches p% of the total.
    #[test]
    fn percentiles() {
        let mut h = vec![0u64; BUCKETS];
        for ns in 1..=100u64 {
            h[bucket_of(ns * 1000)] += 1;
        }
        let p50 = percentile(&h, 50.0);
        assert!((50_000..=50_000 + 50_000 / 16).contains(&p50), "{p50}");
        let p99 = percentile(&h, 99.0);
        assert!((99_000..=99_000 + 99_000 / 16).contains(&p99), "{p99}");
        assert_eq!(percentile(&vec![0; BUCKETS], 50.0), 0);
    }

    // Error prefixes follow Redis: the first word, or ERR when the text has no space early.
    #[test]
    fn prefixes() {
        assert_eq!(error_prefix("WRONGTYPE Operation against"), "WRONGTYPE");
        assert_eq!(error_prefix("ERR syntax error"), "ERR");
        assert_eq!(error_prefix("NOSPACEATALL"), "ERR");
    }

    // Subcommands count under `container|sub`; unknown subcommands under nothing.
    #[test]
    fn ids() {
        let cat = catalog();
        let config = crate::commands::lookup(b"config").unwrap();
        let id = command_id(config, &[b"config", b"GET", b"x"]).unwrap();
        assert_eq!(cat.commands[id].fullname, "config|get");
        assert_eq!(command_id(config, &[b"config", b"nope"]), None);
        let get = crate::commands::lookup(b"get").unwrap();
        assert_eq!(
            cat.commands[command_id(get, &[b"get", b"k"]).unwrap()].fullname,
            "get"
        );
    }
}
