//! `lavik-bench sweep --config FILE`: compare servers over connection counts.
//!
//! For every server: start it pinned, FLUSHALL, fill `keys` keys (P:P, allkeys), check
//! DBSIZE and sampled STRLEN, warm up with random GETs. Then for each command (GET, SET)
//! and connection count, measure every server in turn (A B A B ...) so that a noisy
//! machine hits all of them alike. Each point records throughput, latency percentiles,
//! the server's CPU seconds (utime+stime from /proc), requests per server-CPU-second, RSS
//! and INFO used_memory, and checks zero misses and zero connection errors. Optionally the
//! same point is measured with `redis-benchmark` right after, to cross-check the numbers.
//!
//! Output (in `out_dir`): results.csv, results.json, charts.svg, README.md, server logs.
//! The run fails (non-zero exit) if any check failed, after writing everything.

mod config;
mod report;
mod server;
mod svg;

use crate::engine;
use crate::options::{BenchOptions, CommandTemplate, KeyPattern, Requests};
use config::SweepConfig;
use server::{Probe, Reply, Server};
use std::path::Path;
use std::process::Command;

/// Set in the environment of the re-executed, pinned sweep process.
const PINNED_ENV: &str = "LAVIK_BENCH_SWEEP_PINNED";
/// Connections for the GET warm-up after the fill (it lasts `warmup_seconds`).
const WARMUP_CONNECTIONS: u32 = 16;

/// One measured point.
#[derive(Clone, Debug)]
pub struct Point {
    pub server: String,
    pub command: String,
    pub connections: u32,
    /// Which repetition of this point (0-based); reports use the median run.
    pub repeat: u32,
    pub ops: u64,
    pub ops_per_sec: f64,
    pub avg_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub p9999_ms: f64,
    pub hits: u64,
    pub misses: u64,
    pub error_replies: u64,
    pub connection_errors: u64,
    pub server_cpu_seconds: f64,
    /// Seconds the server's threads were runnable but waiting for a CPU during the point
    /// (schedstat); large values mean the machine was busy. None where not available.
    pub server_wait_seconds: Option<f64>,
    pub ops_per_server_cpu_second: f64,
    /// CPU seconds of the load generator itself; near `point_seconds` x client threads
    /// means the client, not the server, was the limit.
    pub client_cpu_seconds: f64,
    pub rss_kib: u64,
    pub used_memory_bytes: u64,
    /// redis-benchmark's requests/s, p99 and requests per server CPU-second at the same
    /// point, measured right after ours, when configured.
    pub redis_benchmark_rps: Option<f64>,
    pub redis_benchmark_p99_ms: Option<f64>,
    pub redis_benchmark_ops_per_server_cpu_second: Option<f64>,
    /// CPU microseconds redis-benchmark itself used per request (client efficiency).
    pub redis_benchmark_client_us_per_request: Option<f64>,
}

/// A pass/fail check recorded in the report.
#[derive(Clone, Debug)]
pub struct Check {
    pub server: String,
    pub what: String,
    pub ok: bool,
    pub detail: String,
}

pub fn main(args: &[String]) -> Result<(), String> {
    let path = match args {
        [flag, path] if flag == "--config" => path.clone(),
        [arg] if arg.starts_with("--config=") => arg["--config=".len()..].to_string(),
        _ => return Err("usage: lavik-bench sweep --config FILE".into()),
    };
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let cfg = config::parse(&text).map_err(|e| format!("{path}: {e}"))?;
    if !cfg.client_cpus.is_empty() && std::env::var_os(PINNED_ENV).is_none() {
        return rerun_pinned(&cfg.client_cpus, args);
    }
    run(&cfg, &path, &text)
}

/// Re-execute this sweep under `taskset -c CPUS` so the client is pinned as configured,
/// with the open-file limit raised (best effort) for sweeps with many connections.
fn rerun_pinned(cpus: &str, args: &[String]) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let status = Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -n "$(ulimit -Hn)" 2>/dev/null; exec taskset -c "$0" "$@""#)
        .arg(cpus)
        .arg(exe)
        .arg("sweep")
        .args(args)
        .env(PINNED_ENV, "1")
        .status()
        .map_err(|e| format!("cannot run taskset: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("pinned sweep failed ({status})"))
    }
}

fn run(cfg: &SweepConfig, config_path: &str, config_text: &str) -> Result<(), String> {
    let out = Path::new(&cfg.out_dir);
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let ticks = server::clock_ticks_per_sec();
    let load_at_start = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut checks = Vec::new();
    let mut servers = Vec::new();
    for spec in &cfg.servers {
        let log = out.join(format!("{}.log", spec.name));
        match Server::start(spec, &cfg.server_cpus, &log) {
            Ok(s) => servers.push(s),
            Err(e) => {
                servers.iter_mut().for_each(Server::stop);
                return Err(e);
            }
        }
    }
    let result = measure_all(cfg, &mut servers, ticks, &mut checks);
    let launched: Vec<(String, String)> = servers
        .iter()
        .map(|s| (s.spec.name.clone(), s.launched.clone()))
        .collect();
    servers.iter_mut().for_each(Server::stop);
    let points = result?;
    let ctx = report::Context {
        cfg,
        config_path,
        config_text,
        load_at_start: load_at_start.trim(),
        launched: &launched,
        points: &points,
        checks: &checks,
    };
    report::write_all(&ctx, out)?;
    eprintln!("sweep: wrote {}", out.display());
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| format!("{}: {} ({})", c.server, c.what, c.detail))
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("failed checks:\n  {}", failed.join("\n  ")))
    }
}

fn measure_all(
    cfg: &SweepConfig,
    servers: &mut [Server],
    ticks: f64,
    checks: &mut Vec<Check>,
) -> Result<Vec<Point>, String> {
    for s in servers.iter() {
        fill_and_check(cfg, s, checks)?;
        if let Some(bin) = &cfg.redis_benchmark {
            prefill_redis_benchmark_keys(bin, cfg, s, checks)?;
        }
    }
    for s in servers.iter() {
        if cfg.warmup_seconds > 0 {
            let mut o = point_options(cfg, s.spec.port, "get", WARMUP_CONNECTIONS);
            o.test_time_secs = Some(cfg.warmup_seconds);
            engine::run(&o, &format!("[{} warm-up] ", s.spec.name)).map_err(|e| e.to_string())?;
        }
    }
    let total = cfg.commands.len() * cfg.connections.len() * servers.len() * cfg.repeats as usize;
    let mut points = Vec::with_capacity(total);
    for command in &cfg.commands {
        for &conns in &cfg.connections {
            // A B A B: every server in turn at this point before moving on.
            for repeat in 0..cfg.repeats {
                for s in servers.iter() {
                    let label = format!(
                        "[{}/{total} {} {} c={conns}] ",
                        points.len() + 1,
                        s.spec.name,
                        command.to_uppercase()
                    );
                    let mut p = measure_point(cfg, s, command, conns, ticks, &label)?;
                    p.repeat = repeat;
                    record_point_checks(&p, checks);
                    points.push(p);
                }
            }
        }
    }
    Ok(points)
}

/// Options equivalent to the point's command line (see [`point_command_line`]).
fn point_options(cfg: &SweepConfig, port: u16, command: &str, conns: u32) -> BenchOptions {
    let threads = cfg.client_threads.min(conns);
    let spec = cfg.command(command);
    let get = command == "get";
    let commands = if spec.is_builtin() {
        Vec::new()
    } else {
        vec![CommandTemplate {
            args: spec.args.clone(),
            ratio: 1,
            key_pattern: cfg.key_pattern,
            is_read: spec.is_read,
            distinct_keys: spec.distinct_keys,
        }]
    };
    BenchOptions {
        server: "127.0.0.1".into(),
        port,
        threads,
        clients_per_thread: conns / threads,
        test_time_secs: Some(cfg.point_seconds),
        ratio_set: u32::from(!get),
        ratio_get: u32::from(get),
        pipeline: cfg.pipeline,
        key_pattern_set: cfg.key_pattern,
        key_pattern_get: cfg.key_pattern,
        key_minimum: 1,
        key_maximum: cfg.keys,
        key_prefix: cfg.prefix_of(command),
        data_size_bytes: cfg.data_size_bytes,
        distinct_client_seed: true,
        commands,
        print_percentiles: vec![50.0, 99.0, 99.9, 99.99],
        hide_histogram: true,
        ..BenchOptions::default()
    }
}

/// The memtier-style command line of a point, for the README (N = connections).
pub fn point_command_line(cfg: &SweepConfig, command: &str) -> String {
    let spec = cfg.command(command);
    let get = command == "get";
    let (threads, clients) = if cfg.client_threads == 1 {
        ("1".to_string(), "N".to_string())
    } else {
        (
            format!("min({},N)", cfg.client_threads),
            format!("N/min({},N)", cfg.client_threads),
        )
    };
    let p = cfg.key_pattern.letter();
    let what = if spec.is_builtin() {
        format!(
            "--ratio={}:{} --key-pattern={p}:{p}",
            u32::from(!get),
            u32::from(get)
        )
    } else {
        format!(
            "--command=\"{}\" --command-key-pattern={p}{}{}",
            spec.args.join(" "),
            if spec.is_read {
                " --command-is-read"
            } else {
                ""
            },
            if spec.distinct_keys {
                " --command-distinct-keys"
            } else {
                ""
            }
        )
    };
    format!(
        "lavik-bench -s 127.0.0.1 -p PORT -t {threads} -c {clients} --test-time={} {what} \\\n  \
         --pipeline={} --key-minimum=1 --key-maximum={} --key-prefix={} \\\n  \
         -d {} --distinct-client-seed --print-percentiles=50,99,99.9,99.99 --hide-histogram",
        cfg.point_seconds,
        cfg.pipeline,
        cfg.keys,
        cfg.prefix_of(command),
        cfg.data_size_bytes
    )
}

/// Options that set every key of an extra keyspace exactly once with its fill template.
fn extra_fill_options(cfg: &SweepConfig, port: u16, prefix: &str, fill: &[String]) -> BenchOptions {
    BenchOptions {
        commands: vec![CommandTemplate {
            args: fill.to_vec(),
            ratio: 1,
            key_pattern: KeyPattern::Parallel,
            is_read: false,
            distinct_keys: false,
        }],
        key_prefix: prefix.into(),
        ..fill_options(cfg, port)
    }
}

pub fn extra_fill_command_line(cfg: &SweepConfig, prefix: &str, fill: &[String]) -> String {
    format!(
        "lavik-bench -s 127.0.0.1 -p PORT -t 1 -c {} --requests=allkeys --command=\"{}\" \
         --command-key-pattern=P --pipeline={} --key-minimum=1 --key-maximum={} --key-prefix={prefix} -d {} --hide-histogram",
        cfg.fill_connections,
        fill.join(" "),
        cfg.fill_pipeline,
        cfg.keys,
        cfg.data_size_bytes
    )
}

fn fill_options(cfg: &SweepConfig, port: u16) -> BenchOptions {
    BenchOptions {
        server: "127.0.0.1".into(),
        port,
        threads: 1,
        clients_per_thread: cfg.fill_connections,
        requests: Requests::AllKeys,
        ratio_set: 1,
        ratio_get: 0,
        pipeline: cfg.fill_pipeline,
        key_pattern_set: KeyPattern::Parallel,
        key_pattern_get: KeyPattern::Parallel,
        key_minimum: 1,
        key_maximum: cfg.keys,
        key_prefix: cfg.key_prefix.clone(),
        data_size_bytes: cfg.data_size_bytes,
        hide_histogram: true,
        ..BenchOptions::default()
    }
}

pub fn fill_command_line(cfg: &SweepConfig) -> String {
    format!(
        "lavik-bench -s 127.0.0.1 -p PORT -t 1 -c {} --requests=allkeys --ratio=1:0 \
         --key-pattern=P:P --pipeline={} --key-minimum=1 --key-maximum={} --key-prefix={} -d {} --hide-histogram",
        cfg.fill_connections, cfg.fill_pipeline, cfg.keys, cfg.key_prefix, cfg.data_size_bytes
    )
}

fn check(checks: &mut Vec<Check>, server: &str, what: &str, ok: bool, detail: String) {
    if !ok {
        eprintln!("sweep: CHECK FAILED {server}: {what}: {detail}");
    }
    checks.push(Check {
        server: server.into(),
        what: what.into(),
        ok,
        detail,
    });
}

fn fill_and_check(cfg: &SweepConfig, s: &Server, checks: &mut Vec<Check>) -> Result<(), String> {
    let name = &s.spec.name;
    let io = |e: std::io::Error| format!("{name}: {e}");
    let mut probe = Probe::connect(s.spec.port).map_err(io)?;
    let flushed = probe.call(&["FLUSHALL"]).map_err(io)?;
    check(
        checks,
        name,
        "FLUSHALL before fill",
        flushed == Reply::Text("OK".into()),
        format!("{flushed:?}"),
    );
    let r = engine::run(&fill_options(cfg, s.spec.port), &format!("[{name} fill] "))
        .map_err(|e| e.to_string())?;
    let sets = r.op("Sets").map_or(0, |x| x.count);
    check(
        checks,
        name,
        "fill: every SET answered, no errors",
        sets == cfg.keys && r.connection_errors == 0 && r.totals().error_replies == 0,
        format!(
            "{sets} SETs in {:.2} s ({:.0} ops/s), {} connection errors",
            r.elapsed.as_secs_f64(),
            r.ops_per_sec(&r.totals()),
            r.connection_errors
        ),
    );
    let dbsize = probe.call(&["DBSIZE"]).map_err(io)?;
    check(
        checks,
        name,
        "DBSIZE equals keys",
        dbsize == Reply::Integer(cfg.keys as i64),
        format!("{dbsize:?}, want {}", cfg.keys),
    );
    let samples = u64::from(cfg.strlen_samples).min(cfg.keys);
    let mut wrong = Vec::new();
    for i in 0..samples {
        // Evenly spread sample over 1..=keys, including both ends.
        let key = 1 + i * (cfg.keys - 1) / samples.saturating_sub(1).max(1);
        let k = format!("{}{key}", cfg.key_prefix);
        let len = probe.call(&["STRLEN", &k]).map_err(io)?;
        if len != Reply::Integer(cfg.data_size_bytes as i64) {
            wrong.push(format!("{k}={len:?}"));
        }
    }
    check(
        checks,
        name,
        "sampled STRLEN equals data_size",
        wrong.is_empty(),
        format!(
            "{samples} keys sampled, {} wrong {:?}",
            wrong.len(),
            wrong.iter().take(3).collect::<Vec<_>>()
        ),
    );
    for (i, (prefix, fill)) in cfg.extra_fills().iter().enumerate() {
        let o = extra_fill_options(cfg, s.spec.port, prefix, fill);
        let r = engine::run(&o, &format!("[{name} fill {prefix}] ")).map_err(|e| e.to_string())?;
        let t = r.totals();
        check(
            checks,
            name,
            &format!(
                "fill {prefix}: every `{}` answered, no errors",
                fill.join(" ")
            ),
            t.count == cfg.keys && r.connection_errors == 0 && t.error_replies == 0,
            format!(
                "{} requests in {:.2} s, {} error replies, {} connection errors",
                t.count,
                r.elapsed.as_secs_f64(),
                t.error_replies,
                r.connection_errors
            ),
        );
        let want = cfg.keys * (i as u64 + 2);
        let dbsize = probe.call(&["DBSIZE"]).map_err(io)?;
        check(
            checks,
            name,
            &format!("DBSIZE after fill {prefix}"),
            dbsize == Reply::Integer(want as i64),
            format!("{dbsize:?}, want {want}"),
        );
    }
    Ok(())
}

/// redis-benchmark reads and writes its own keys (`key:` + 12 digits). Writing 10x the
/// key count at random leaves about e^-10 of them missing, so its GETs hit like ours and
/// the cross-check compares the same work.
fn prefill_redis_benchmark_keys(
    bin: &str,
    cfg: &SweepConfig,
    s: &Server,
    checks: &mut Vec<Check>,
) -> Result<(), String> {
    let mut args = redis_benchmark_args(cfg, s.spec.port, "set", 16, cfg.keys * 10);
    let p = args
        .iter()
        .position(|a| a == "-P")
        .expect("args include -P");
    args[p + 1] = "64".into();
    eprintln!(
        "[{} prefill for redis-benchmark] {bin} {}",
        s.spec.name,
        args.join(" ")
    );
    let out = Command::new(bin)
        .args(&args)
        .output()
        .map_err(|e| format!("cannot run {bin}: {e}"))?;
    let parsed = parse_redis_benchmark_csv(&String::from_utf8_lossy(&out.stdout));
    check(
        checks,
        &s.spec.name,
        "redis-benchmark key prefill",
        out.status.success() && parsed.is_some(),
        format!(
            "{} SETs, {:?} req/s",
            cfg.keys * 10,
            parsed.map(|p| p.0.round())
        ),
    );
    Ok(())
}

fn used_memory(port: u16) -> u64 {
    Probe::connect(port)
        .and_then(|mut p| p.call(&["INFO", "memory"]))
        .ok()
        .and_then(|r| match r {
            Reply::Text(t) => server::info_field(&t, "used_memory"),
            _ => None,
        })
        .unwrap_or(0)
}

fn measure_point(
    cfg: &SweepConfig,
    s: &Server,
    command: &str,
    conns: u32,
    ticks: f64,
    label: &str,
) -> Result<Point, String> {
    let o = point_options(cfg, s.spec.port, command, conns);
    let (cpu_before, wait_before) = s.cpu_times(ticks)?;
    let client_before = server::own_cpu_seconds(ticks)?;
    let r = engine::run(&o, label).map_err(|e| e.to_string())?;
    let (cpu_after, wait_after) = s.cpu_times(ticks)?;
    let cpu = cpu_after - cpu_before;
    let server_wait_seconds = wait_before.zip(wait_after).map(|(a, b)| b - a);
    let client_cpu_seconds = server::own_cpu_seconds(ticks)? - client_before;
    let builtin = cfg.command(command).is_builtin();
    let st = if builtin {
        r.op(if command == "get" { "Gets" } else { "Sets" })
    } else {
        r.ops.first()
    }
    .ok_or("missing op stats")?;
    let ops_per_sec = r.ops_per_sec(st);
    // redis-benchmark -t knows only the built-in shapes.
    let rb = match &cfg.redis_benchmark {
        Some(bin) if builtin => redis_benchmark(bin, cfg, s, command, conns, ops_per_sec, ticks)?,
        _ => RedisBenchmark::default(),
    };
    Ok(Point {
        server: s.spec.name.clone(),
        command: command.into(),
        connections: conns,
        repeat: 0,
        ops: st.count,
        ops_per_sec,
        avg_ms: st.avg_ms(),
        p50_ms: st.percentile_ms(50.0),
        p99_ms: st.percentile_ms(99.0),
        p999_ms: st.percentile_ms(99.9),
        p9999_ms: st.percentile_ms(99.99),
        hits: st.hits,
        misses: st.misses,
        error_replies: st.error_replies,
        connection_errors: r.connection_errors + r.unanswered,
        server_cpu_seconds: cpu,
        server_wait_seconds,
        ops_per_server_cpu_second: if cpu > 0.0 {
            st.count as f64 / cpu
        } else {
            0.0
        },
        client_cpu_seconds,
        rss_kib: s.rss_kib()?,
        used_memory_bytes: used_memory(s.spec.port),
        redis_benchmark_rps: rb.rps,
        redis_benchmark_p99_ms: rb.p99_ms,
        redis_benchmark_ops_per_server_cpu_second: rb.ops_per_server_cpu_second,
        redis_benchmark_client_us_per_request: rb.client_us_per_request,
    })
}

fn record_point_checks(p: &Point, checks: &mut Vec<Check>) {
    let what = format!("{} c={}", p.command.to_uppercase(), p.connections);
    let ok = p.connection_errors == 0 && p.error_replies == 0 && p.misses == 0 && p.ops > 0;
    let detail = format!(
        "{} ops, {} misses, {} error replies, {} connection errors/unanswered",
        p.ops, p.misses, p.error_replies, p.connection_errors
    );
    check(
        checks,
        &p.server,
        &format!("{what}: zero misses and errors"),
        ok,
        detail,
    );
}

/// The redis-benchmark command line for a point (the client is pinned by inheritance).
pub fn redis_benchmark_args(
    cfg: &SweepConfig,
    port: u16,
    command: &str,
    conns: u32,
    requests: u64,
) -> Vec<String> {
    [
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-c",
        &conns.to_string(),
        "-n",
        &requests.to_string(),
        "-t",
        command,
        "-d",
        &cfg.data_size_bytes.to_string(),
        "-r",
        &cfg.keys.to_string(),
        "-P",
        &cfg.pipeline.to_string(),
        "--csv",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[derive(Default)]
struct RedisBenchmark {
    rps: Option<f64>,
    p99_ms: Option<f64>,
    ops_per_server_cpu_second: Option<f64>,
    client_us_per_request: Option<f64>,
}

/// Run redis-benchmark for about `point_seconds`, parse its CSV and measure server CPU.
fn redis_benchmark(
    bin: &str,
    cfg: &SweepConfig,
    s: &Server,
    command: &str,
    conns: u32,
    our_rate: f64,
    ticks: f64,
) -> Result<RedisBenchmark, String> {
    let requests = ((our_rate * cfg.point_seconds as f64) as u64).max(10_000);
    let cpu_before = s.cpu_seconds(ticks)?;
    let client_before = server::children_cpu_seconds(ticks)?;
    let out = Command::new(bin)
        .args(redis_benchmark_args(
            cfg,
            s.spec.port,
            command,
            conns,
            requests,
        ))
        .output()
        .map_err(|e| format!("cannot run {bin}: {e}"))?;
    let cpu = s.cpu_seconds(ticks)? - cpu_before;
    let client_cpu = server::children_cpu_seconds(ticks)? - client_before;
    let text = String::from_utf8_lossy(&out.stdout);
    let Some((rps, p99_ms)) = parse_redis_benchmark_csv(&text) else {
        eprintln!("sweep: could not parse redis-benchmark output: {text}");
        return Ok(RedisBenchmark::default());
    };
    Ok(RedisBenchmark {
        rps: Some(rps),
        p99_ms,
        ops_per_server_cpu_second: (cpu > 0.0).then(|| requests as f64 / cpu),
        client_us_per_request: Some(client_cpu * 1e6 / requests as f64),
    })
}

/// From redis-benchmark 6/7 `--csv` output: requests/s and, when present, p99 ms.
pub fn parse_redis_benchmark_csv(text: &str) -> Option<(f64, Option<f64>)> {
    let rows: Vec<Vec<String>> = text
        .lines()
        .map(|l| {
            l.split(',')
                .map(|f| f.trim().trim_matches('"').to_string())
                .collect()
        })
        .collect();
    let header = rows.iter().find(|r| r.first().is_some_and(|f| f == "test"));
    let data = rows
        .iter()
        .rev()
        .find(|r| r.len() >= 2 && r[0] != "test" && r[1].parse::<f64>().is_ok())?;
    let rps = data[1].parse().ok()?;
    let p99 = header
        .and_then(|h| h.iter().position(|f| f == "p99_latency_ms"))
        .and_then(|i| data.get(i)?.parse().ok());
    Some((rps, p99))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves redis-benchmark 7's CSV (with header) and 5's (without) both parse.
    #[test]
    fn parses_redis_benchmark_csv() {
        let v7 = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\"GET\",\"129769.02\",\"0.229\",\"0.056\",\"0.207\",\"0.383\",\"0.599\",\"4.927\"\n";
        assert_eq!(
            parse_redis_benchmark_csv(v7),
            Some((129769.02, Some(0.599)))
        );
        assert_eq!(
            parse_redis_benchmark_csv("\"SET\",\"81234.50\"\n"),
            Some((81234.5, None))
        );
        assert_eq!(parse_redis_benchmark_csv("garbage\n"), None);
    }

    // Proves sweep points translate into the intended memtier-style options.
    #[test]
    fn point_options_match_intent() {
        let cfg = SweepConfig {
            client_threads: 2,
            keys: 1000,
            ..SweepConfig::default()
        };
        let o = point_options(&cfg, 7, "set", 8);
        assert_eq!((o.threads, o.clients_per_thread), (2, 4));
        assert_eq!((o.ratio_set, o.ratio_get), (1, 0));
        assert_eq!((o.key_minimum, o.key_maximum), (1, 1000));
        let one = point_options(&cfg, 7, "get", 1);
        assert_eq!(
            (one.threads, one.clients_per_thread, one.ratio_get),
            (1, 1, 1)
        );
        let fill = fill_options(&cfg, 7);
        assert_eq!(fill.requests, Requests::AllKeys);
        assert_eq!(fill.key_pattern_set, KeyPattern::Parallel);
    }

    // Proves a `command =` point runs exactly its template on its own keyspace with the
    // sweep's key pattern, and its extra fill covers that keyspace with the fill template.
    #[test]
    fn template_point_options() {
        let cfg = config::parse(
            "keys = 1000\nkey_pattern = G\ncommands = get,incr\n\
             command = incr | INCR __key__ | prefix=c- | fill=SET __key__ 1\n\
             server = a | 1 | x\n",
        )
        .unwrap();
        let o = point_options(&cfg, 7, "incr", 4);
        assert_eq!(o.commands.len(), 1);
        assert_eq!(o.commands[0].args, vec!["INCR", "__key__"]);
        assert_eq!(o.commands[0].key_pattern, KeyPattern::Gaussian);
        assert_eq!(o.key_prefix, "c-");
        let get = point_options(&cfg, 7, "get", 4);
        assert!(get.commands.is_empty());
        assert_eq!(
            (get.key_pattern_get, get.key_prefix.as_str()),
            (KeyPattern::Gaussian, "memtier-")
        );
        let fills = cfg.extra_fills();
        let f = extra_fill_options(&cfg, 7, &fills[0].0, &fills[0].1);
        assert_eq!(f.requests, Requests::AllKeys);
        assert_eq!(f.commands[0].key_pattern, KeyPattern::Parallel);
        assert_eq!((f.key_prefix.as_str(), f.key_maximum), ("c-", 1000));
        assert!(point_command_line(&cfg, "incr")
            .contains("--command=\"INCR __key__\" --command-key-pattern=G"));
    }

    // Proves a whole sweep against two real redis-server instances, with a template command
    // on its own filled keyspace, passes every check and writes all four outputs. Needs
    // redis-server and redis-benchmark on PATH; about a minute, so ignored by default: `cargo test -p lavik-bench -- --ignored`.
    #[test]
    #[ignore]
    fn tiny_sweep_against_redis_server() {
        let dir = std::env::temp_dir().join(format!("lavik-bench-sweep-{}", std::process::id()));
        let text = format!(
            "out_dir = {}\nkeys = 2000\nconnections = 1,4\npoint_seconds = 1\n\
             warmup_seconds = 1\nrepeats = 2\nredis_benchmark = redis-benchmark\n\
             commands = get,set,incr\n\
             command = incr | INCR __key__ | prefix=counter- | fill=SET __key__ 1\n\
             server = a | 7461 | redis-server --port {{port}} --bind 127.0.0.1 --save \"\" --appendonly no\n\
             server = b | 7462 | redis-server --port {{port}} --bind 127.0.0.1 --save \"\" --appendonly no\n",
            dir.display()
        );
        let cfg = config::parse(&text).unwrap();
        run(&cfg, "test.conf", &text).expect("sweep with all checks passing");
        let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
        // 3 commands x 2 connection counts x 2 repeats x 2 servers, plus the header.
        assert_eq!(csv.lines().count(), 1 + 24);
        for f in ["results.json", "charts.svg", "README.md"] {
            assert!(dir.join(f).exists(), "{f} missing");
        }
        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
        assert!(!readme.contains("FAILED"));
        assert!(readme.contains("DBSIZE after fill counter-"));
        assert!(readme.contains("| INCR | 1 |"), "cost table lists INCR");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
