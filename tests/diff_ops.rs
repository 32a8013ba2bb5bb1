//! Differential tests of the operations commands against Debian's `redis-server`
//! (7.0.15): INFO commandstats / errorstats field names and counts after a fixed
//! sequence, CONFIG RESETSTAT, MEMORY and LATENCY HELP and errors, OBJECT FREQ /
//! IDLETIME / REFCOUNT, MOVE sequences across dbs and value kinds, the latency config
//! parameters, and CONFIG REWRITE's file for the same edits.
//!
//! Compared by content rather than bytes where Redis's order is a hash table's
//! (commandstats lines, options CONFIG REWRITE appends), and timings never.
mod common;
use common::diff::{Pair, RespConn, Rng};
use std::process::{Command, Stdio};

fn text(reply: &[u8]) -> String {
    let s = String::from_utf8_lossy(reply).into_owned();
    // A bulk or verbatim string: drop the header line (and a verbatim "txt:" prefix).
    let body = s.split_once("\r\n").map(|(_, b)| b).unwrap_or(&s);
    body.strip_prefix("txt:").unwrap_or(body).to_string()
}

/// `cmdstat_NAME` → (calls, rejected_calls, failed_calls), sorted by name.
fn commandstats(reply: &[u8]) -> Vec<(String, u64, u64, u64)> {
    let mut v: Vec<_> = text(reply)
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .map(|l| {
            let (name, fields) = l.split_once(':').unwrap();
            let get = |f: &str| -> u64 {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(&format!("{f}=")))
                    .unwrap_or_else(|| panic!("{f} in {l}"))
                    .parse()
                    .unwrap()
            };
            assert!(
                fields.contains(",usec=") && fields.contains(",usec_per_call="),
                "{l}"
            );
            (
                name.to_string(),
                get("calls"),
                get("rejected_calls"),
                get("failed_calls"),
            )
        })
        .collect();
    v.sort();
    v
}

fn stat(reply: &[u8], field: &str) -> String {
    text(reply)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("{field} missing"))
        .to_string()
}

// Proves commandstats (names, calls, rejected and failed counts), errorstats and
// total_error_replies match Redis after RESETSTAT and a fixed sequence with rejections
// (arity), failures (WRONGTYPE, syntax), unknown commands and subcommands.
#[test]
fn command_and_error_stats_as_redis() {
    let mut p = Pair::start("diff-ops-stats", &[]);
    p.check(&["CONFIG", "RESETSTAT"]);
    let seq: &[&[&str]] = &[
        &["SET", "a", "1"],
        &["SET", "b", "x"],
        &["GET", "a"],
        &["GET"],
        &["HSET", "h", "f", "v"],
        &["HGET", "a", "f"],
        &["INCR", "b"],
        &["SET", "a", "1", "XX", "NX"],
        &["MGET", "a", "b", "h"],
        &["DEL", "b"],
        &["CONFIG", "GET", "maxclients"],
        &["CONFIG", "GET"],
        &["CONFIG", "NOSUCH"],
        &["OBJECT", "ENCODING", "a"],
        &["OBJECT", "FREQ", "a"],
        &["NOSUCHCOMMAND", "x"],
        &["MOVE", "a", "1"],
        &["MOVE", "a", "1"],
        &["SELECT", "1"],
        &["EXISTS", "a"],
        &["SELECT", "0"],
        &["PING"],
    ];
    for args in seq {
        p.check(args);
    }
    let (l, r) = p.both(&[b"INFO", b"commandstats"]);
    assert_eq!(commandstats(&l), commandstats(&r));
    assert!(commandstats(&l)
        .iter()
        .any(|c| c.0 == "config|get" && c.1 == 1 && c.2 == 1));
    // Error prefixes, sorted as Redis's radix tree lists them.
    let (l, r) = p.both(&[b"INFO", b"errorstats"]);
    assert_eq!(text(&l), text(&r));
    assert!(
        text(&l).contains("errorstat_WRONGTYPE:count=1"),
        "{}",
        text(&l)
    );
    let (l, r) = p.both(&[b"INFO", b"stats"]);
    assert_eq!(
        stat(&l, "total_error_replies"),
        stat(&r, "total_error_replies")
    );
    // RESETSTAT empties them: only its own call is left.
    p.check(&["CONFIG", "RESETSTAT"]);
    let (l, r) = p.both(&[b"INFO", b"commandstats"]);
    assert_eq!(commandstats(&l), commandstats(&r));
    assert_eq!(commandstats(&l).len(), 1);
    p.check(&["INFO", "errorstats"]);
    // Not in the default set: INFO alone has errorstats but neither commandstats nor
    // latencystats.
    let (l, r) = p.both(&[b"INFO"]);
    for s in [&l, &r] {
        let t = text(s);
        assert!(
            t.contains("# Errorstats") && !t.contains("# Commandstats"),
            "{t}"
        );
        assert!(!t.contains("# Latencystats"));
    }
    let (l, r) = p.both(&[b"INFO", b"latencystats"]);
    let names = |b: &[u8]| -> Vec<String> {
        let mut v: Vec<String> = text(b)
            .lines()
            .filter_map(|l| l.strip_prefix("latency_percentiles_usec_"))
            .map(|l| {
                let (name, f) = l.split_once(':').unwrap();
                let keys: Vec<&str> = f
                    .split(',')
                    .map(|kv| kv.split('=').next().unwrap())
                    .collect();
                format!("{name}:{}", keys.join(","))
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&l), names(&r));
}

// Proves MEMORY and LATENCY HELP, their argument errors, the empty-monitor replies, and
// the latency configuration parameters (get, set, errors) match Redis byte for byte.
#[test]
fn memory_latency_replies_as_redis() {
    let mut p = Pair::start("diff-ops-memlat", &[]);
    for proto in [2u8, 3] {
        p.hello(proto);
        for args in [
            &["MEMORY", "HELP"][..],
            &["LATENCY", "HELP"],
            &["MEMORY", "USAGE", "nokey"],
            &["MEMORY", "USAGE", "nokey", "SAMPLES", "x"],
            &["MEMORY", "USAGE", "nokey", "SAMPLES", "-1"],
            &["MEMORY", "USAGE", "nokey", "FOO"],
            &["MEMORY", "USAGE", "nokey", "SAMPLES"],
            &["MEMORY", "USAGE"],
            &["MEMORY", "STATS", "x"],
            &["MEMORY", "NOSUCH"],
            &["MEMORY", "PURGE"],
            &["LATENCY", "LATEST"],
            &["LATENCY", "HISTORY", "command"],
            &["LATENCY", "RESET"],
            &["LATENCY", "RESET", "command", "fast-command"],
            &["LATENCY", "GRAPH", "command"],
            &["LATENCY", "GRAPH"],
            &["LATENCY", "HISTOGRAM", "nosuch"],
            &["LATENCY", "NOSUCH"],
            &["CONFIG", "GET", "latency-tracking"],
            &["CONFIG", "GET", "latency-monitor-threshold"],
            &["CONFIG", "GET", "latency-tracking-info-percentiles"],
            &[
                "CONFIG",
                "SET",
                "latency-tracking-info-percentiles",
                "50 99.99 100",
            ],
            &["CONFIG", "GET", "latency-tracking-info-percentiles"],
            &["CONFIG", "SET", "latency-tracking-info-percentiles", "abc"],
            &["CONFIG", "SET", "latency-tracking-info-percentiles", "101"],
            &[
                "CONFIG",
                "SET",
                "latency-tracking-info-percentiles",
                "50 99 99.9",
            ],
            &["CONFIG", "SET", "latency-monitor-threshold", "x"],
            &["CONFIG", "SET", "latency-tracking", "maybe"],
            &["CONFIG", "SET", "latency-tracking", "no"],
            &["CONFIG", "GET", "latency-tracking"],
            &["CONFIG", "SET", "latency-tracking", "yes"],
            &["CONFIG", "REWRITE"],
            &["CONFIG", "REWRITE", "x"],
        ] {
            p.check(args);
        }
        p.check(&["SET", "k", "v"]);
        let (l, r) = p.both(&[b"MEMORY", b"USAGE", b"k"]);
        assert!(l.starts_with(b":") && r.starts_with(b":"));
    }
}

// Proves OBJECT FREQ / IDLETIME / REFCOUNT / HELP give Redis's replies for strings
// (shared integers included), hashes, sets and missing keys.
#[test]
fn object_subcommands_as_redis() {
    let mut p = Pair::start("diff-ops-object", &[]);
    for args in [
        &["SET", "int", "1"][..],
        &["SET", "big", "10000"],
        &["SET", "neg", "-1"],
        &["SET", "str", "hello"],
        &["HSET", "h", "f", "v"],
        &["SADD", "s", "1", "2"],
        &["OBJECT", "HELP"],
        &["OBJECT", "HELP", "x"],
        &["OBJECT", "NOSUCH", "int"],
        &["OBJECT", "FREQ"],
        &["OBJECT", "FREQ", "nokey"],
        &["OBJECT", "IDLETIME", "nokey"],
        &["OBJECT", "REFCOUNT", "nokey"],
    ] {
        p.check(args);
    }
    for key in ["int", "big", "neg", "str", "h", "s"] {
        for sub in ["FREQ", "IDLETIME", "REFCOUNT", "ENCODING"] {
            if sub == "IDLETIME" {
                // Redis counts whole seconds of its LRU clock since the last access (lavik
                // keeps none: 0). Touched just before, Redis says 0, or 1 if its clock
                // ticked in between (a loaded machine, or bad luck): both mean "just used".
                p.check(&["TOUCH", key]);
                p.check_with(&["OBJECT", sub, key], |b| {
                    if b == b":1\r\n" {
                        b":0\r\n".to_vec()
                    } else {
                        b.to_vec()
                    }
                });
            } else {
                p.check(&["OBJECT", sub, key]);
            }
        }
    }
}

// Proves random MOVE sequences (strings, hashes, sets, with and without TTL, across
// dbs, with Redis's errors) leave both servers with the same replies and contents.
#[test]
fn move_sequences_as_redis() {
    let mut p = Pair::start("diff-ops-move", &[]);
    let mut rng = Rng::new(0x0030_17e5);
    let keys = ["k1", "k2", "{t}k3", "k4"];
    let dbs = ["0", "1", "2", "15", "16", "-1", "x", "99999999999"];
    for _ in 0..400 {
        let k = *rng.pick(&keys);
        let db = *rng.pick(&dbs[..4]);
        let v = rng.below(100).to_string();
        let args: Vec<String> = match rng.below(12) {
            0 => vec!["SET".into(), k.into(), v],
            1 => vec!["HSET".into(), k.into(), "f".into(), v],
            2 => vec!["SADD".into(), k.into(), v],
            3..=5 => vec!["MOVE".into(), k.into(), (*rng.pick(&dbs)).into()],
            6 => vec!["SELECT".into(), db.into()],
            7 => vec!["TYPE".into(), k.into()],
            8 => vec!["EXPIRE".into(), k.into(), "1000".into()],
            // PERSIST says whether the TTL travelled with the key, without timing.
            9 => vec!["PERSIST".into(), k.into()],
            10 => vec!["DBSIZE".into()],
            _ => vec!["DUMP".into(), k.into()],
        };
        let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        p.check(&a);
    }
    p.check(&["MOVE", "k1"]);
    p.check(&["MOVE", "k1", "1", "x"]);
    for db in 0..16 {
        let d = db.to_string();
        p.check(&["SELECT", &d]);
        p.check(&["DBSIZE"]);
        for k in keys {
            p.check(&["DUMP", k]);
        }
    }
}

/// Starts redis-server on `conf` in `dir` on a free port and waits until it answers there
/// itself (not another test's server that took the port between choosing and binding).
fn start_redis_conf(conf: &std::path::Path, dir: &std::path::Path) -> (std::process::Child, u16) {
    for _ in 0..5 {
        let port = common::free_port();
        let mut child = Command::new("redis-server")
            .arg(conf)
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--dir",
            ])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let ours = loop {
            if let Ok(Some(_)) = child.try_wait() {
                break false;
            }
            if let Some(pid) = common::diff::server_pid(port) {
                break pid == child.id();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server on {port} not ready"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        if ours {
            return (child, port);
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("redis-server did not start");
}

/// Lines Redis writes for options lavik does not have (it rewrites every option it
/// knows that differs from its default, including those given on its command line).
fn lavik_options_only(file: &str) -> Vec<String> {
    const REDIS_ONLY: &[&str] = &[
        "logfile",
        "pidfile",
        "dir",
        "daemonize",
        "user",
        "latency-tracking-info-percentiles",
        "save",
        "appendonly",
        "bind",
        "enable-debug-command",
        // Immutable in lavik, which rewrites only the options CONFIG SET can change.
        "port",
    ];
    file.lines()
        .filter(|l| !REDIS_ONLY.contains(&l.split(' ').next().unwrap_or("")))
        .map(|l| l.to_string())
        .collect()
}

// Proves CONFIG REWRITE gives the file Redis gives for the same config file and the same
// CONFIG SETs: comments and order kept, lines replaced in place (also at the default),
// non-default new options appended after the signature (as a set: Redis's order is its
// hash table's), defaults not added; and a second rewrite as well.
#[test]
fn config_rewrite_as_redis() {
    let dir = std::env::temp_dir().join(format!("lavik-diff-ops-rewrite-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let original = "# my config\n\n# clients\nmaxclients 100\nslowlog-max-len 64\n# keep this\nprotected-mode yes\nappendfsync everysec\n";
    let (rconf, lconf) = (dir.join("redis.conf"), dir.join("lavik.conf"));
    std::fs::write(&rconf, original).unwrap();
    std::fs::write(&lconf, original).unwrap();
    let (mut redis, rport) = start_redis_conf(&rconf, &dir);
    let lavik = common::Server::start("diff-ops-rewrite", &[lconf.to_str().unwrap()]);
    let mut r = RespConn::connect(rport);
    let mut l = RespConn::connect(lavik.port);
    let rounds: &[&[(&str, &str)]] = &[
        &[
            ("maxclients", "200"),
            ("slowlog-max-len", "128"),
            ("slowlog-log-slower-than", "5000"),
            ("appendfsync", "always"),
            ("latency-monitor-threshold", "25"),
        ],
        &[
            ("maxclients", "10000"),
            ("slowlog-log-slower-than", "10000"),
            ("protected-mode", "no"),
        ],
    ];
    for round in rounds {
        for (k, v) in *round {
            let args: [&[u8]; 4] = [b"CONFIG", b"SET", k.as_bytes(), v.as_bytes()];
            assert_eq!(r.call(&args), b"+OK\r\n");
            assert_eq!(l.call(&args), b"+OK\r\n");
        }
        assert_eq!(r.call(&[b"CONFIG", b"REWRITE"]), b"+OK\r\n");
        assert_eq!(l.call(&[b"CONFIG", b"REWRITE"]), b"+OK\r\n");
        let rf = lavik_options_only(&std::fs::read_to_string(&rconf).unwrap());
        let lf = lavik_options_only(&std::fs::read_to_string(&lconf).unwrap());
        let sig = |v: &[String]| v.iter().position(|l| l == "# Generated by CONFIG REWRITE");
        let (rs, ls) = (sig(&rf).unwrap(), sig(&lf).unwrap());
        assert_eq!(rf[..rs], lf[..ls], "lines before the signature");
        let (mut ra, mut la) = (rf[rs..].to_vec(), lf[ls..].to_vec());
        ra.sort();
        la.sort();
        assert_eq!(ra, la, "appended lines");
    }
    let _ = redis.kill();
    let _ = redis.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
