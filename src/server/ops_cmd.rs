//! MEMORY and LATENCY: diagnostics containers, run on the connection's worker.
//!
//! MEMORY USAGE reports what a key costs in RAM — its share of the index and its expiry
//! entry — not its value, which lives on the device (`docs/operations.md`). It borrows
//! the key owner's shards (a coordinated call when another worker owns the key), like
//! INFO; so its key is not subject to ACL key patterns (it declares no key position).
//! MEMORY STATS gives Redis's field names with lavik's figures. LATENCY reads the
//! latency monitor and the per-command histograms of `cmdstats`.

use super::cmdstats::{bucket_range, CommandTotals};
use super::conn::Conn;
use super::worker::{Outcome, Worker};
use crate::commands::{eq_ic, parse_int, ERR_SYNTAX};
use crate::resp::ReplyBuf;
use std::sync::atomic::Ordering;

fn err(conn: &mut Conn, msg: &str) -> Outcome {
    conn.reply(|r| r.error(msg));
    Outcome::Done
}

fn unknown_sub(conn: &mut Conn, cmd: &str, sub: &[u8]) -> Outcome {
    let msg = format!(
        "ERR unknown subcommand '{}'. Try {cmd} HELP.",
        String::from_utf8_lossy(sub)
    );
    err(conn, &msg)
}

fn help(conn: &mut Conn, lines: &[&str]) -> Outcome {
    conn.reply(|r| {
        r.array(lines.len());
        for l in lines {
            r.simple(l);
        }
    });
    Outcome::Done
}

const MEMORY_HELP: &[&str] = &[
    "MEMORY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "DOCTOR",
    "    Return memory problems reports.",
    "MALLOC-STATS",
    "    Return internal statistics report from the memory allocator.",
    "PURGE",
    "    Attempt to purge dirty pages for reclamation by the allocator.",
    "STATS",
    "    Return information about the memory usage of the server.",
    "USAGE <key> [SAMPLES <count>]",
    "    Return memory in bytes used by <key> and its value. Nested values are",
    "    sampled up to <count> times (default: 5, 0 means sample all).",
    "HELP",
    "    Prints this help.",
];

const LATENCY_HELP: &[&str] = &[
    "LATENCY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "DOCTOR",
    "    Return a human readable latency analysis report.",
    "GRAPH <event>",
    "    Return an ASCII latency graph for the <event> class.",
    "HISTORY <event>",
    "    Return time-latency samples for the <event> class.",
    "LATEST",
    "    Return the latest latency samples for all events.",
    "RESET [<event> ...]",
    "    Reset latency data of one or more <event> classes.",
    "    (default: reset all data for all event classes)",
    "HISTOGRAM [COMMAND ...]",
    "    Return a cumulative distribution of latencies in the format of a histogram for the specified command names.",
    "    If no commands are specified then all histograms are replied.",
    "HELP",
    "    Prints this help.",
];

/// Server-wide memory figures MEMORY STATS and DOCTOR report.
struct MemoryFigures {
    heap: u64,
    rss: u64,
    clients: u64,
    staging: u64,
    keys: u64,
    per_db: Vec<(usize, u64, u64, u64)>,
    overhead: u64,
    cache: u64,
}

fn memory_figures(w: &mut Worker) -> Option<MemoryFigures> {
    let all: Vec<usize> = (0..w.shared.workers.len()).collect();
    let stats = w.with_workers(&all, |w| {
        w.shards
            .held()
            .map(|s| s.stats())
            .collect::<Vec<crate::storage::ShardStats>>()
    })?;
    let clients = w.shared.stats.mem_clients_normal.load(Ordering::Relaxed);
    let mut per_db = Vec::new();
    let mut keys = 0;
    let mut overhead = clients;
    let mut staging = 0;
    let mut cache = 0;
    for s in &stats {
        keys += s.keys;
        staging += s.staging_bytes;
        cache += s.cache.bytes;
        overhead += s.index_bytes
            + s.expiry_bytes
            + s.tomb_raider_bytes
            + s.block_table_bytes
            + s.staging_bytes;
    }
    for db in 0..16 {
        let mut k = 0;
        let (mut main, mut expires) = (0, 0);
        for s in &stats {
            let n = s.keys_per_db[db];
            k += n;
            // A shard's index and expiry sets are split among its dbs by key count
            // (INFO's per-shard figures are not kept per db).
            main += s.index_bytes * n / s.keys.max(1);
            expires += s.expiry_bytes * n / s.keys.max(1);
        }
        if k > 0 {
            per_db.push((db, k, main, expires));
        }
    }
    Some(MemoryFigures {
        heap: super::local::heap_bytes(),
        rss: super::local::rss_bytes(),
        clients,
        staging,
        keys,
        per_db,
        overhead,
        cache,
    })
}

pub fn memory(w: &mut Worker, conn: &mut Conn, a: &[&[u8]], now: u64) -> Outcome {
    let sub = a[1];
    if eq_ic(sub, "help") && a.len() == 2 {
        return help(conn, MEMORY_HELP);
    }
    if eq_ic(sub, "usage") && a.len() >= 3 {
        let mut j = 3;
        while j < a.len() {
            if eq_ic(a[j], "samples") && j + 1 < a.len() {
                match parse_int(a[j + 1]) {
                    Err(e) => return err(conn, &e),
                    Ok(n) if n < 0 => return err(conn, ERR_SYNTAX),
                    // Values are not in RAM: no sampling to do, any count is the same.
                    Ok(_) => {}
                }
                j += 2;
            } else {
                return err(conn, ERR_SYNTAX);
            }
        }
        let key = a[2];
        let db = conn.db;
        let owner = w.shared.worker_of_shard(w.shards.shard_id(key));
        let Some(res) = w.with_workers(&[owner], |w| {
            w.shards.for_key(key).key_ram_bytes(db, key, now)
        }) else {
            return Outcome::Retry;
        };
        match res {
            Err(e) => return err(conn, &crate::commands::storage_error(e)),
            Ok(Some(n)) => conn.reply(|r| r.int(n as i64)),
            Ok(None) => conn.reply(|r| r.null()),
        }
        return Outcome::Done;
    }
    if eq_ic(sub, "stats") && a.len() == 2 {
        let Some(f) = memory_figures(w) else {
            return Outcome::Retry;
        };
        conn.reply(|r| memory_stats_reply(r, &f));
        return Outcome::Done;
    }
    if eq_ic(sub, "doctor") && a.len() == 2 {
        let Some(f) = memory_figures(w) else {
            return Outcome::Retry;
        };
        let text = memory_doctor_text(&f);
        conn.reply(|r| r.verbatim(&text));
        return Outcome::Done;
    }
    if eq_ic(sub, "malloc-stats") && a.len() == 2 {
        // lavik runs on glibc malloc, for which Redis gives the same answer.
        conn.reply(|r| r.verbatim("Stats not supported for the current allocator"));
        return Outcome::Done;
    }
    if eq_ic(sub, "purge") && a.len() == 2 {
        crate::runtime::trim_heap();
        conn.reply(|r| r.ok());
        return Outcome::Done;
    }
    unknown_sub(conn, "MEMORY", sub)
}

fn memory_stats_reply(r: &mut ReplyBuf, f: &MemoryFigures) {
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let dataset = f.heap.saturating_sub(f.overhead);
    let ints: [(&str, u64); 10] = [
        ("peak.allocated", f.heap),
        ("total.allocated", f.heap),
        // Not measured: lavik does not record its heap at start.
        ("startup.allocated", 0),
        ("replication.backlog", 0),
        ("clients.slaves", 0),
        ("clients.normal", f.clients),
        ("cluster.links", 0),
        // The staging blocks hold writes on their way to the device, as the AOF buffer.
        ("aof.buffer", f.staging),
        ("lua.caches", 0),
        ("functions.caches", 0),
    ];
    r.map(ints.len() + f.per_db.len() + 18);
    for (k, v) in ints {
        r.bulk_str(k);
        r.int(v as i64);
    }
    for &(db, _, main, expires) in &f.per_db {
        r.bulk_str(&format!("db.{db}"));
        r.map(3);
        r.bulk_str("overhead.hashtable.main");
        r.int(main as i64);
        r.bulk_str("overhead.hashtable.expires");
        r.int(expires as i64);
        r.bulk_str("overhead.hashtable.slot-to-keys");
        r.int(0);
    }
    r.bulk_str("overhead.total");
    r.int(f.overhead as i64);
    r.bulk_str("keys.count");
    r.int(f.keys as i64);
    r.bulk_str("keys.bytes-per-key");
    r.int(f.overhead.checked_div(f.keys).unwrap_or(0) as i64);
    r.bulk_str("dataset.bytes");
    r.int(dataset as i64);
    r.bulk_str("dataset.percentage");
    r.double(ratio(dataset, f.heap) * 100.0);
    r.bulk_str("peak.percentage");
    r.double(100.0);
    r.bulk_str("allocator.allocated");
    r.int(f.heap as i64);
    r.bulk_str("allocator.active");
    r.int(f.heap as i64);
    r.bulk_str("allocator.resident");
    r.int(f.rss as i64);
    r.bulk_str("allocator-fragmentation.ratio");
    r.double(1.0);
    r.bulk_str("allocator-fragmentation.bytes");
    r.int(0);
    r.bulk_str("allocator-rss.ratio");
    r.double(ratio(f.rss, f.heap));
    r.bulk_str("allocator-rss.bytes");
    r.int(f.rss as i64 - f.heap as i64);
    r.bulk_str("rss-overhead.ratio");
    r.double(1.0);
    r.bulk_str("rss-overhead.bytes");
    r.int(0);
    r.bulk_str("fragmentation");
    r.double(ratio(f.rss, f.heap));
    r.bulk_str("fragmentation.bytes");
    r.int(f.rss as i64 - f.heap as i64);
    r.bulk_str("lavik.cache.bytes");
    r.int(f.cache as i64);
}

/// Rules of thumb for MEMORY DOCTOR, in lavik's terms.
const DOCTOR_MIN_RSS_BYTES: u64 = 64 << 20;
const DOCTOR_FRAGMENTATION_MAX: f64 = 1.4;
const DOCTOR_CLIENTS_SHARE_MAX: f64 = 0.25;

fn memory_doctor_text(f: &MemoryFigures) -> String {
    if f.rss < DOCTOR_MIN_RSS_BYTES {
        return format!(
            "lavik memory doctor: the process holds {} bytes of RSS, too little for a diagnosis. Values live on the data device; RAM holds the index ({} keys), the record cache, staging blocks and client buffers.\n",
            f.rss, f.keys
        );
    }
    let mut issues = Vec::new();
    let frag = f.rss as f64 / f.heap.max(1) as f64;
    if frag > DOCTOR_FRAGMENTATION_MAX {
        issues.push(format!(
            "* RSS is {frag:.2} times the allocated heap: memory freed by the allocator is not returned to the system (MEMORY PURGE asks it to)."
        ));
    }
    let clients_share = f.clients as f64 / f.heap.max(1) as f64;
    if clients_share > DOCTOR_CLIENTS_SHARE_MAX {
        issues.push(format!(
            "* Client buffers hold {} bytes ({:.0}% of the heap): slow readers or large pipelines; see client-output-buffer-limit.",
            f.clients,
            clients_share * 100.0
        ));
    }
    if issues.is_empty() {
        "lavik memory doctor: no memory problems found.\n".to_string()
    } else {
        format!(
            "lavik memory doctor found these issues:\n\n{}\n",
            issues.join("\n")
        )
    }
}

pub fn latency(w: &mut Worker, conn: &mut Conn, a: &[&[u8]]) -> Outcome {
    let sub = a[1];
    let mon = &w.shared.cmdstats.latency;
    if eq_ic(sub, "help") && a.len() == 2 {
        return help(conn, LATENCY_HELP);
    }
    if eq_ic(sub, "latest") && a.len() == 2 {
        let events = mon.events.lock().expect("latency lock").clone();
        conn.reply(|r| {
            r.array(events.len());
            for (name, e) in &events {
                let (t, ms) = e.samples.back().copied().unwrap_or((0, 0));
                r.array(4);
                r.bulk_str(name);
                r.int(t as i64);
                r.int(ms as i64);
                r.int(e.max_ms as i64);
            }
        });
        return Outcome::Done;
    }
    if eq_ic(sub, "history") && a.len() == 3 {
        let name = String::from_utf8_lossy(a[2]).into_owned();
        let samples = mon
            .events
            .lock()
            .expect("latency lock")
            .get(&name)
            .map(|e| e.samples.clone())
            .unwrap_or_default();
        conn.reply(|r| {
            r.array(samples.len());
            for (t, ms) in samples {
                r.array(2);
                r.int(t as i64);
                r.int(ms as i64);
            }
        });
        return Outcome::Done;
    }
    if eq_ic(sub, "reset") {
        let mut events = mon.events.lock().expect("latency lock");
        let n = if a.len() == 2 {
            let n = events.len();
            events.clear();
            n
        } else {
            a[2..]
                .iter()
                .filter(|e| events.remove(&*String::from_utf8_lossy(e)).is_some())
                .count()
        };
        drop(events);
        conn.reply(|r| r.int(n as i64));
        return Outcome::Done;
    }
    if eq_ic(sub, "graph") && a.len() == 3 {
        let name = String::from_utf8_lossy(a[2]).into_owned();
        let event = mon.events.lock().expect("latency lock").get(&name).cloned();
        let Some(e) = event.filter(|e| !e.samples.is_empty()) else {
            return err(
                conn,
                &format!("ERR No samples available for event '{name}'"),
            );
        };
        let text = latency_graph(&name, &e, crate::server::now_ms() / 1000);
        conn.reply(|r| r.verbatim(&text));
        return Outcome::Done;
    }
    if eq_ic(sub, "doctor") && a.len() == 2 {
        let threshold = mon.threshold_ms.load(Ordering::Relaxed);
        let events = mon.events.lock().expect("latency lock").clone();
        let text = latency_doctor_text(threshold, &events);
        conn.reply(|r| r.verbatim(&text));
        return Outcome::Done;
    }
    if eq_ic(sub, "histogram") {
        let totals = w.shared.cmdstats.totals();
        let picked: Vec<&CommandTotals> = totals
            .iter()
            .filter(|t| t.hist.is_some())
            .filter(|t| {
                a.len() == 2
                    || a[2..].iter().any(|n| {
                        let n = String::from_utf8_lossy(n).to_ascii_lowercase();
                        t.name == n || t.name.strip_prefix(&format!("{n}|")).is_some()
                    })
            })
            .collect();
        conn.reply(|r| {
            r.map(picked.len());
            for t in picked {
                r.bulk_str(&t.name);
                histogram_reply(r, t);
            }
        });
        return Outcome::Done;
    }
    unknown_sub(conn, "LATENCY", sub)
}

/// `{calls, histogram_usec: {bound_usec: cumulative count}}` at powers of two from
/// 1024 ns, as Redis iterates its histogram; only bounds where the count grows.
fn histogram_reply(r: &mut ReplyBuf, t: &CommandTotals) {
    let h = t.hist.as_deref().unwrap_or(&[]);
    let total: u64 = h.iter().sum();
    let mut points = Vec::new();
    let (mut bound, mut cumulative, mut i, mut last) = (1024u64, 0u64, 0usize, 0u64);
    while cumulative < total {
        while i < h.len() && bucket_range(i).1 < bound {
            cumulative += h[i];
            i += 1;
        }
        if cumulative > last {
            points.push((bound / 1000, cumulative));
            last = cumulative;
        }
        bound = bound.saturating_mul(2);
        if i >= h.len() {
            break;
        }
    }
    r.map(2);
    r.bulk_str("calls");
    r.int(t.calls as i64);
    r.bulk_str("histogram_usec");
    r.map(points.len());
    for (usec, n) in points {
        r.int(usec as i64);
        r.int(n as i64);
    }
}

/// Rows of a LATENCY GRAPH: each sample is a column, `#` up to its height.
const GRAPH_ROWS: u64 = 8;

fn latency_graph(name: &str, e: &super::cmdstats::LatencyEvent, now_s: u64) -> String {
    let max = e.samples.iter().map(|s| s.1).max().unwrap_or(0).max(1);
    let min = e.samples.iter().map(|s| s.1).min().unwrap_or(0);
    let mut out = format!(
        "{name} - high {max} ms, low {min} ms (all time high {} ms)\n",
        e.max_ms
    );
    out.push_str(&"-".repeat(80));
    out.push('\n');
    for row in (1..=GRAPH_ROWS).rev() {
        let line: String = e
            .samples
            .iter()
            .map(|s| {
                if s.1 * GRAPH_ROWS >= row * max {
                    '#'
                } else {
                    ' '
                }
            })
            .collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    // Under each column: how long ago its sample was, in seconds.
    let ages: Vec<String> = e
        .samples
        .iter()
        .map(|s| format!("{}s", now_s.saturating_sub(s.0)))
        .collect();
    out.push_str(&format!("sample ages, oldest first: {}\n", ages.join(" ")));
    out
}

fn latency_doctor_text(
    threshold: u64,
    events: &std::collections::BTreeMap<String, super::cmdstats::LatencyEvent>,
) -> String {
    if threshold == 0 {
        return "lavik latency doctor: the latency monitor is off. Turn it on with CONFIG SET latency-monitor-threshold <milliseconds>.\n".to_string();
    }
    if events.is_empty() {
        return format!(
            "lavik latency doctor: no event reached the {threshold} ms threshold since the start or the last LATENCY RESET.\n"
        );
    }
    let mut out = format!(
        "lavik latency doctor: events at or above {threshold} ms since the start or the last LATENCY RESET:\n\n"
    );
    for (name, e) in events {
        let n = e.samples.len() as u64;
        let avg = e.samples.iter().map(|s| s.1).sum::<u64>() / n.max(1);
        out.push_str(&format!(
            "* {name}: {n} samples (at most one per second), average {avg} ms, highest {} ms.{}\n",
            e.max_ms,
            match name.as_str() {
                "command" => " Slow commands: see SLOWLOG GET; commands over many elements or keys cost in proportion.",
                "fast-command" => " O(1) commands ran slowly: the worker was busy (a coordinated pass, a large pipeline) or the CPU was taken by another process.",
                "lavik-commit" => " A group commit (chunk writes and sync) was slow: the data device is slow or saturated; appendfsync always waits for it.",
                _ => "",
            }
        ));
    }
    out
}
