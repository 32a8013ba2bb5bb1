//! The offline tools of the `lavik` binary that start no server (`plan`,
//! `--command-reference`), and the operations commands whose results only lavik can
//! check (counts across workers, latency percentiles and monitor, MEMORY figures,
//! CONFIG REWRITE read back by a restart).
mod common;
use common::Server;
use redis::{cmd, Connection, Value};
use std::process::Command;

fn q<T: redis::FromRedisValue>(c: &mut Connection, args: &[&str]) -> T {
    let mut command = cmd(args[0]);
    for a in &args[1..] {
        command.arg(*a);
    }
    command.query(c).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// The value of `prefix...:` lines of an INFO section: the part after the colon.
fn info_line(c: &mut Connection, section: &str, name: &str) -> Option<String> {
    let info: String = q(c, &["INFO", section]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(|s| s.to_string())
}

fn field(line: &str, key: &str) -> f64 {
    line.split(',')
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{key} in {line}"))
        .parse()
        .unwrap()
}

// Proves commandstats sum over workers (keys on both, a coordinated MGET counted once),
// latencystats percentiles are ordered and positive, LATENCY HISTOGRAM's cumulative
// count reaches the calls, and latency-tracking off keeps counts but no histograms.
#[test]
fn command_stats_across_workers() {
    let srv = Server::start("ops-cmdstats", &["--threads", "2"]);
    let mut c = srv.client();
    let _: String = q(&mut c, &["CONFIG", "RESETSTAT"]);
    let keys: Vec<String> = (0..50).map(|i| format!("key{i}")).collect();
    for k in &keys {
        let _: String = q(&mut c, &["SET", k, "v"]);
    }
    let mut mget = vec!["MGET"];
    mget.extend(keys.iter().map(|k| k.as_str()));
    let _: Value = q(&mut c, &mget);
    let set = info_line(&mut c, "commandstats", "cmdstat_set").unwrap();
    assert_eq!(field(&set, "calls"), 50.0, "{set}");
    assert_eq!(field(&set, "failed_calls"), 0.0);
    let m = info_line(&mut c, "commandstats", "cmdstat_mget").unwrap();
    assert_eq!(field(&m, "calls"), 1.0, "{m}");
    let lat = info_line(&mut c, "latencystats", "latency_percentiles_usec_set").unwrap();
    let (p50, p99, p999) = (field(&lat, "p50"), field(&lat, "p99"), field(&lat, "p99.9"));
    assert!(0.0 < p50 && p50 <= p99 && p99 <= p999, "{lat}");
    // {set: {calls: 50, histogram_usec: {bound: cumulative...}}}
    let h: Value = q(&mut c, &["LATENCY", "HISTOGRAM", "set"]);
    let dump = format!("{h:?}");
    assert!(dump.contains("calls") && dump.contains("int(50)"), "{dump}");
    let _: String = q(&mut c, &["CONFIG", "SET", "latency-tracking", "no"]);
    let _: String = q(&mut c, &["CONFIG", "RESETSTAT"]);
    let _: String = q(&mut c, &["SET", "a", "1"]);
    let set = info_line(&mut c, "commandstats", "cmdstat_set").unwrap();
    assert_eq!(field(&set, "calls"), 1.0);
    assert!(info_line(&mut c, "latencystats", "latency_percentiles_usec_set").is_none());
}

// Proves the latency monitor records a slow command at the threshold (LATEST, HISTORY,
// GRAPH, DOCTOR), RESET clears it, and nothing is recorded with the monitor off.
#[test]
fn latency_monitor_events() {
    let srv = Server::start("ops-latency", &[]);
    let mut c = srv.client();
    let _: String = q(&mut c, &["DEBUG", "SLEEP", "0.02"]);
    let latest: Vec<Value> = q(&mut c, &["LATENCY", "LATEST"]);
    assert!(latest.is_empty(), "monitor off by default");
    let _: String = q(&mut c, &["CONFIG", "SET", "latency-monitor-threshold", "5"]);
    let _: String = q(&mut c, &["DEBUG", "SLEEP", "0.02"]);
    let _: String = q(&mut c, &["PING"]);
    let latest: Vec<(String, i64, i64, i64)> = q(&mut c, &["LATENCY", "LATEST"]);
    assert_eq!(latest.len(), 1, "{latest:?}");
    assert_eq!(latest[0].0, "command");
    assert!(
        latest[0].2 >= 20 && latest[0].3 >= latest[0].2,
        "{latest:?}"
    );
    let history: Vec<(i64, i64)> = q(&mut c, &["LATENCY", "HISTORY", "command"]);
    assert_eq!(history.len(), 1);
    let graph: String = q(&mut c, &["LATENCY", "GRAPH", "command"]);
    assert!(graph.starts_with("command - high"), "{graph}");
    let doctor: String = q(&mut c, &["LATENCY", "DOCTOR"]);
    assert!(doctor.contains("* command: 1 samples"), "{doctor}");
    let n: i64 = q(&mut c, &["LATENCY", "RESET"]);
    assert_eq!(n, 1);
    let latest: Vec<Value> = q(&mut c, &["LATENCY", "LATEST"]);
    assert!(latest.is_empty());
}

// Proves MEMORY USAGE reports the index share (small, no value bytes: a 10 KB value
// costs the same as a short one) plus the expiry entry for a key with a TTL, and MEMORY
// STATS counts the keys.
#[test]
fn memory_usage_and_stats() {
    let srv = Server::start("ops-memory", &[]);
    let mut c = srv.client();
    let _: String = q(&mut c, &["SET", "small", "v"]);
    let big = "x".repeat(10_000);
    let _: String = q(&mut c, &["SET", "big", &big]);
    let small: i64 = q(&mut c, &["MEMORY", "USAGE", "small"]);
    let large: i64 = q(&mut c, &["MEMORY", "USAGE", "big", "SAMPLES", "0"]);
    assert!((1..=64).contains(&small), "{small}");
    assert!(large <= small + 8, "{small} vs {large}");
    let _: i64 = q(&mut c, &["EXPIRE", "small", "100"]);
    let ttl: i64 = q(&mut c, &["MEMORY", "USAGE", "small"]);
    assert!(ttl > small, "{ttl} vs {small}");
    let none: Value = q(&mut c, &["MEMORY", "USAGE", "nokey"]);
    assert_eq!(none, Value::Nil);
    let stats: Vec<Value> = q(&mut c, &["MEMORY", "STATS"]);
    let pos = stats
        .iter()
        .position(|v| matches!(v, Value::BulkString(b) if b == b"keys.count"))
        .unwrap();
    assert_eq!(stats[pos + 1], Value::Int(2));
    let doctor: String = q(&mut c, &["MEMORY", "DOCTOR"]);
    assert!(doctor.starts_with("lavik memory doctor"), "{doctor}");
}

// Proves CONFIG REWRITE writes a file the server starts from again with the same
// settings, keeps its comments and unknown-to-rewrite lines, and leaves no temp file.
#[test]
fn config_rewrite_round_trip() {
    let dir = std::env::temp_dir().join(format!("lavik-ops-rewrite-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("lavik.conf");
    std::fs::write(&conf, "# top comment\nmaxclients 50\n# tail comment\n").unwrap();
    let mut srv = Server::start("ops-rewrite", &[conf.to_str().unwrap()]);
    let mut c = srv.client();
    for (k, v) in [
        ("maxclients", "321"),
        ("slowlog-log-slower-than", "-1"),
        ("latency-tracking-info-percentiles", "50 90"),
        ("latency-monitor-threshold", "7"),
        ("shutdown-checkpoint", "yes"),
    ] {
        let _: String = q(&mut c, &["CONFIG", "SET", k, v]);
    }
    let _: String = q(&mut c, &["CONFIG", "REWRITE"]);
    let text = std::fs::read_to_string(&conf).unwrap();
    assert!(
        text.starts_with("# top comment\nmaxclients 321\n# tail comment\n"),
        "{text}"
    );
    assert!(text.contains("# Generated by CONFIG REWRITE\n"), "{text}");
    assert!(
        text.contains("\nlatency-tracking-info-percentiles 50 90\n"),
        "{text}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "only the config file remains");
    srv.restart();
    let mut c = srv.client();
    for (k, v) in [
        ("maxclients", "321"),
        ("slowlog-log-slower-than", "-1"),
        ("latency-tracking-info-percentiles", "50 90"),
        ("latency-monitor-threshold", "7"),
        ("shutdown-checkpoint", "yes"),
    ] {
        let got: Vec<String> = q(&mut c, &["CONFIG", "GET", k]);
        assert_eq!(got, vec![k.to_string(), v.to_string()]);
    }
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

fn lavik(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lavik"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// Proves `lavik --command-reference` prints exactly the committed docs/commands.md.
#[test]
fn command_reference_is_the_committed_file() {
    let (code, text, _) = lavik(&["--command-reference"]);
    assert_eq!(code, 0);
    let file =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/commands.md")).unwrap();
    assert!(
        text == file,
        "docs/commands.md differs from the binary's output"
    );
}

// Proves `lavik plan` prints RAM, device and Redis figures for 10M x 1 KiB and refuses bad arguments with exit 2.
#[test]
fn plan_prints_and_validates() {
    let (code, text, err) = lavik(&[
        "plan",
        "--keys",
        "10000000",
        "--value-bytes",
        "1024",
        "--ttl-share",
        "0.5",
        "--threads",
        "1",
        "--cache-size",
        "0",
    ]);
    assert_eq!(code, 0, "{err}");
    // 10M x 11.31 B/key index; 5M volatile keys x 2.3 B; 1072-byte records.
    assert!(
        text.contains("index (11.31 B/key, at least 2621440 per shard) 113100000 bytes"),
        "{text}"
    );
    assert!(
        text.contains("TTL state (2.3 B/volatile key) 11500000 bytes"),
        "{text}"
    );
    assert!(text.contains("record size            1072 bytes"), "{text}");
    assert!(text.contains("Redis 7 RAM for the same data"), "{text}");
    let (code, _, err) = lavik(&["plan", "--keys", "10"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--keys and --value-bytes are required"),
        "{err}"
    );
}
