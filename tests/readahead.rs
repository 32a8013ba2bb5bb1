//! Read-ahead on the asynchronous path (`docs/collections.md` section 5): a whole-collection
//! read of a paged hash, set or list of hundreds of leaves, all on the device (`--cache-size
//! 0`), asks for a whole level of pages per restart, so it finishes in a few rounds with no
//! blocking read; HMGET and SMISMEMBER read only the leaves of the names asked for, in two
//! rounds. Replies are compared with redis-server's.
mod common;
use common::diff::{sorted_elements, sorted_pairs, Pair, RespConn};
use common::Server;

/// Bytes of each value, member and element: leaves of 4-8 KiB hold 20-40 of them.
const PAD: usize = 200;
/// Hash fields / set members per set / list elements: 250-600 leaves each.
const HASH_FIELDS: usize = 8_000;
const SET_MEMBERS: usize = 6_000;
const LIST_ELEMS: usize = 16_000;
/// Elements per building command (few big commands keep the test short).
const BATCH: usize = 1_000;

/// The counters of INFO stats a measurement compares.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    sync_reads: u64,
    restart_reads: u64,
    restarts: u64,
    fallbacks: u64,
}

fn counters(s: &Server) -> Counters {
    let text = s.raw().bulk(&[b"INFO", b"stats"]);
    let get = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .unwrap_or_else(|| panic!("no {name} in INFO"))
            .trim()
            .parse()
            .unwrap()
    };
    Counters {
        sync_reads: get("lavik_sync_reads"),
        restart_reads: get("lavik_restart_reads"),
        restarts: get("lavik_restarts"),
        fallbacks: get("lavik_restart_fallbacks"),
    }
}

/// Runs `f` and returns how the counters moved.
fn measure(p: &mut Pair, f: impl FnOnce(&mut Pair)) -> Counters {
    let a = counters(&p.lavik);
    f(p);
    let b = counters(&p.lavik);
    Counters {
        sync_reads: b.sync_reads - a.sync_reads,
        restart_reads: b.restart_reads - a.restart_reads,
        restarts: b.restarts - a.restarts,
        fallbacks: b.fallbacks - a.fallbacks,
    }
}

fn padded(prefix: &str, i: usize) -> String {
    let s = format!("{prefix}:{i}:");
    format!("{s}{}", "x".repeat(PAD - s.len()))
}

/// Sends `cmd key items...` in batches of `BATCH` items to both servers.
fn build(p: &mut Pair, cmd: &str, key: &str, items: &[String]) {
    for chunk in items.chunks(BATCH) {
        let mut args = vec![cmd, key];
        args.extend(chunk.iter().map(|s| s.as_str()));
        p.check(&args);
    }
}

/// Asserts what a whole-collection read on the asynchronous path costs: no blocking read,
/// no fallback to one, and one round per `READAHEAD_READS_MAX` (256) pages plus one for the
/// directory pages (200 per round asserted, for the byte budget's share).
fn assert_read_ahead(what: &str, c: Counters) {
    assert_eq!(c.sync_reads, 0, "{what}: blocking reads ({c:?})");
    assert_eq!(c.fallbacks, 0, "{what}: ran out of restarts ({c:?})");
    assert!(
        c.restart_reads >= 200,
        "{what}: too few pages to prove anything ({c:?})"
    );
    let bound = 1 + c.restart_reads.div_ceil(200);
    assert!(
        c.restarts >= 2 && c.restarts <= bound,
        "{what}: {} rounds for {} pages (at most {bound})",
        c.restarts,
        c.restart_reads
    );
}

// HGETALL/HKEYS/HVALS, SMEMBERS, SUNION(STORE), LRANGE 0 -1 and SORT on paged collections of
// 250-600 leaves read every page once, a level per round, with no blocking read, and answer
// as redis-server; SINTER/SDIFF read each page at most once in a few rounds; HMGET of 3
// fields and SMISMEMBER read only their leaves in two rounds.
#[test]
fn whole_collection_reads_ahead() {
    let mut p = Pair::start(
        "readahead",
        &["--threads", "1", "--cache-size", "0", "--defrag-paused"],
    );
    let mut pairs = Vec::with_capacity(2 * HASH_FIELDS);
    for i in 0..HASH_FIELDS {
        pairs.push(format!("f{i}"));
        pairs.push(padded("v", i));
    }
    build(&mut p, "HSET", "h", &pairs);
    let s1: Vec<String> = (0..SET_MEMBERS).map(|i| padded("m", i)).collect();
    // Half of s2 overlaps s1.
    let s2: Vec<String> = (SET_MEMBERS / 2..SET_MEMBERS * 3 / 2)
        .map(|i| padded("m", i))
        .collect();
    build(&mut p, "SADD", "s1", &s1);
    build(&mut p, "SADD", "s2", &s2);
    let list: Vec<String> = (0..LIST_ELEMS).map(|i| padded("e", i)).collect();
    build(&mut p, "RPUSH", "l", &list);
    // Every page on the device, nothing cached.
    p.lavik.restart();
    p.l = RespConn::connect(p.lavik.port);

    let all = measure(&mut p, |p| {
        p.check_with(&["HGETALL", "h"], sorted_pairs);
    });
    assert_read_ahead("HGETALL", all);
    for cmd in ["HKEYS", "HVALS"] {
        let c = measure(&mut p, |p| {
            p.check_with(&[cmd, "h"], sorted_elements);
        });
        assert_read_ahead(cmd, c);
        assert_eq!(
            c.restart_reads, all.restart_reads,
            "{cmd} reads the same pages as HGETALL"
        );
    }

    let one = measure(&mut p, |p| {
        p.check_with(&["SMEMBERS", "s1"], sorted_elements);
    });
    assert_read_ahead("SMEMBERS", one);
    let two = measure(&mut p, |p| {
        p.check_with(&["SMEMBERS", "s2"], sorted_elements);
    });
    let union = measure(&mut p, |p| {
        p.check_with(&["SUNION", "s1", "s2"], sorted_elements);
    });
    assert_read_ahead("SUNION", union);
    assert_eq!(
        union.restart_reads,
        one.restart_reads + two.restart_reads,
        "SUNION reads each source's pages once"
    );
    // The smaller source walked leaf by leaf, each leaf's members probed in the other: the
    // probes of every batch ask for their pages in the same round.
    for cmd in [["SINTER", "s1", "s2"], ["SDIFF", "s1", "s2"]] {
        let c = measure(&mut p, |p| {
            p.check_with(&cmd, sorted_elements);
        });
        assert_eq!(c.sync_reads, 0, "{cmd:?}: {c:?}");
        assert_eq!(c.fallbacks, 0, "{cmd:?}: {c:?}");
        assert!(
            c.restarts <= 6 && c.restart_reads <= one.restart_reads + two.restart_reads,
            "{cmd:?}: each page at most once, in a few rounds: {c:?}"
        );
    }
    let stored = measure(&mut p, |p| {
        p.check(&["SUNIONSTORE", "u", "s1", "s2"]);
    });
    assert_read_ahead("SUNIONSTORE", stored);
    p.check_with(&["SMEMBERS", "u"], sorted_elements);

    let lrange = measure(&mut p, |p| {
        p.check(&["LRANGE", "l", "0", "-1"]);
    });
    assert_read_ahead("LRANGE 0 -1", lrange);
    let part = measure(&mut p, |p| {
        p.check(&["LRANGE", "l", "2000", "2999"]);
    });
    assert_eq!(part.sync_reads, 0, "LRANGE part: {part:?}");
    assert!(
        part.restart_reads < lrange.restart_reads / 4 && part.restarts <= 2,
        "LRANGE of a tenth reads only its pages: {part:?} of {lrange:?}"
    );
    let sort = measure(&mut p, |p| {
        p.check(&["SORT", "s1", "ALPHA", "LIMIT", "0", "5"]);
    });
    assert_read_ahead("SORT", sort);

    // Three fields far apart (and one of each kind missing from the hash, in SMISMEMBER).
    let hmget = measure(&mut p, |p| {
        p.check(&["HMGET", "h", "f3", "f4000", "f7999"]);
    });
    assert_eq!(hmget.sync_reads, 0, "HMGET: {hmget:?}");
    assert!(
        hmget.restart_reads <= 6 && hmget.restarts <= 2,
        "HMGET of 3 fields reads at most their directory pages and leaves: {hmget:?}"
    );
    let (a, b, c) = (padded("m", 1), padded("m", 5_999), padded("m", 9_999));
    let smis = measure(&mut p, |p| {
        p.check(&["SMISMEMBER", "s1", &a, &b, &c, "absent"]);
    });
    assert_eq!(smis.sync_reads, 0, "SMISMEMBER: {smis:?}");
    assert!(
        smis.restart_reads <= 8 && smis.restarts <= 2,
        "SMISMEMBER of 4 members reads at most their pages: {smis:?}"
    );
}

// Scripts over a paged hash on the device (EVAL, EVALSHA, FCALL; a read-modify-write, a
// `redis.pcall` that would have caught the miss, a `pcall` loop, a whole-hash read) park for
// the pages below their declared keys and run again, with no blocking read, and answer as
// redis-server.
#[test]
fn scripts_on_paged_collections_park() {
    let mut p = Pair::start(
        "readahead-scripts",
        &["--threads", "1", "--cache-size", "0", "--defrag-paused"],
    );
    const FIELDS: usize = 3_000;
    let mut pairs = Vec::with_capacity(2 * FIELDS);
    for i in 0..FIELDS {
        pairs.push(format!("f{i}"));
        pairs.push(padded("v", i));
    }
    build(&mut p, "HSET", "h", &pairs);
    p.lavik.restart();
    p.l = RespConn::connect(p.lavik.port);

    let get = "return redis.call('HGET', KEYS[1], ARGV[1])";
    let rmw = "local v = redis.call('HGET', KEYS[1], ARGV[1]) \
               redis.call('HSET', KEYS[1], ARGV[1], v .. '!') \
               return redis.call('HSTRLEN', KEYS[1], ARGV[1])";
    let caught = "local r = redis.pcall('HGET', KEYS[1], ARGV[1]) \
                  if type(r) == 'table' then return 'caught' end return r";
    let looped = "for i = 1, 3 do pcall(redis.call, 'HGET', KEYS[1], ARGV[i]) end \
                  return redis.call('HMGET', KEYS[1], ARGV[1], ARGV[2], ARGV[3])";
    // Without the stop at the first miss this would spin: every retry would miss again.
    let retry = "local r repeat r = redis.pcall('HGET', KEYS[1], ARGV[1]) \
                 until type(r) ~= 'table' return r";
    let whole = "return #redis.call('HGETALL', KEYS[1])";
    let sha = p.check(&["SCRIPT", "LOAD", get]);
    let sha = String::from_utf8_lossy(&sha)
        .lines()
        .nth(1)
        .expect("SCRIPT LOAD replies a bulk string")
        .to_string();
    let lib = "#!lua name=t\nredis.register_function('hget', \
               function(keys, args) return redis.call('HGET', keys[1], args[1]) end)";
    p.check(&["FUNCTION", "LOAD", lib]);
    let cases: [(&str, Vec<&str>); 8] = [
        ("EVAL HGET", vec!["EVAL", get, "1", "h", "f10"]),
        ("EVALSHA HGET", vec!["EVALSHA", &sha, "1", "h", "f700"]),
        ("FCALL", vec!["FCALL", "hget", "1", "h", "f1400"]),
        ("EVAL_RO", vec!["EVAL_RO", get, "1", "h", "f2100"]),
        ("read-modify-write", vec!["EVAL", rmw, "1", "h", "f2800"]),
        ("redis.pcall", vec!["EVAL", caught, "1", "h", "f350"]),
        ("pcall retry loop", vec!["EVAL", retry, "1", "h", "f2950"]),
        (
            "pcall loop",
            vec!["EVAL", looped, "1", "h", "f1050", "f1750", "f2450"],
        ),
    ];
    for (what, args) in cases {
        let c = measure(&mut p, |p| {
            p.check(&args);
        });
        assert_eq!(c.sync_reads, 0, "{what}: blocking reads ({c:?})");
        assert_eq!(c.fallbacks, 0, "{what}: ran out of restarts ({c:?})");
        assert!(c.restarts >= 1, "{what}: the pages were in memory ({c:?})");
    }
    let c = measure(&mut p, |p| {
        p.check(&["EVAL", whole, "1", "h"]);
    });
    assert_eq!(c.sync_reads, 0, "EVAL HGETALL: blocking reads ({c:?})");
    assert_eq!(c.fallbacks, 0, "EVAL HGETALL: ran out of restarts ({c:?})");
    assert!(
        c.restart_reads >= 50 && c.restarts <= 4,
        "EVAL HGETALL reads ahead, a level per round ({c:?})"
    );
    p.check(&["HGET", "h", "f2800"]);
}
