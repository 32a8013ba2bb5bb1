//! Writing a sweep's results: results.csv, results.json, charts.svg and README.md.

use super::config::SweepConfig;
use super::svg::{render, Panel, Series};
use super::{Check, Point};
use serde_json::json;
use std::fmt::Write;
use std::path::Path;
use std::process::Command;

pub struct Context<'a> {
    pub cfg: &'a SweepConfig,
    pub config_path: &'a str,
    pub config_text: &'a str,
    /// /proc/loadavg before the servers started.
    pub load_at_start: &'a str,
    /// (server name, exact launch command).
    pub launched: &'a [(String, String)],
    pub points: &'a [Point],
    pub checks: &'a [Check],
}

pub const CSV_HEADER: &str = "server,command,connections,repeat,ops,ops_per_sec,avg_ms,p50_ms,p99_ms,p99_9_ms,p99_99_ms,hits,misses,error_replies,connection_errors,server_cpu_seconds,ops_per_server_cpu_second,client_cpu_seconds,rss_kib,used_memory_bytes,redis_benchmark_rps,redis_benchmark_p99_ms,redis_benchmark_ops_per_server_cpu_second,redis_benchmark_client_us_per_request,server_wait_seconds";

fn opt(v: Option<f64>) -> String {
    v.map_or(String::new(), |x| format!("{x:.3}"))
}

pub fn csv(points: &[Point]) -> String {
    let mut s = String::from(CSV_HEADER);
    s.push('\n');
    for p in points {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{:.1},{:.4},{:.4},{:.4},{:.4},{:.4},{},{},{},{},{:.4},{:.0},{:.2},{},{},{},{},{},{},{}",
            p.server,
            p.command,
            p.connections,
            p.repeat,
            p.ops,
            p.ops_per_sec,
            p.avg_ms,
            p.p50_ms,
            p.p99_ms,
            p.p999_ms,
            p.p9999_ms,
            p.hits,
            p.misses,
            p.error_replies,
            p.connection_errors,
            p.server_cpu_seconds,
            p.ops_per_server_cpu_second,
            p.client_cpu_seconds,
            p.rss_kib,
            p.used_memory_bytes,
            opt(p.redis_benchmark_rps),
            opt(p.redis_benchmark_p99_ms),
            opt(p.redis_benchmark_ops_per_server_cpu_second),
            opt(p.redis_benchmark_client_us_per_request),
            opt(p.server_wait_seconds),
        );
    }
    s
}

fn point_json(p: &Point) -> serde_json::Value {
    json!({
        "server": p.server, "command": p.command, "connections": p.connections,
        "repeat": p.repeat,
        "ops": p.ops, "ops_per_sec": p.ops_per_sec, "avg_ms": p.avg_ms,
        "p50_ms": p.p50_ms, "p99_ms": p.p99_ms, "p99.9_ms": p.p999_ms, "p99.99_ms": p.p9999_ms,
        "hits": p.hits, "misses": p.misses, "error_replies": p.error_replies,
        "connection_errors": p.connection_errors, "server_cpu_seconds": p.server_cpu_seconds,
        "server_wait_seconds": p.server_wait_seconds,
        "ops_per_server_cpu_second": p.ops_per_server_cpu_second,
        "client_cpu_seconds": p.client_cpu_seconds, "rss_kib": p.rss_kib,
        "used_memory_bytes": p.used_memory_bytes,
        "redis_benchmark_rps": p.redis_benchmark_rps,
        "redis_benchmark_p99_ms": p.redis_benchmark_p99_ms,
        "redis_benchmark_ops_per_server_cpu_second": p.redis_benchmark_ops_per_server_cpu_second,
        "redis_benchmark_client_us_per_request": p.redis_benchmark_client_us_per_request,
    })
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|v| v.is_finite());
    values.sort_by(f64::total_cmp);
    values.get(values.len().saturating_sub(1) / 2).copied()
}

/// One point per (server, command, connections): the repetition with the median
/// throughput (lower median for even counts), with redis-benchmark's figures replaced by
/// their own medians over the repetitions. Keeps first-seen order.
pub fn summarize(points: &[Point]) -> Vec<Point> {
    let mut out: Vec<Point> = Vec::new();
    for p in points {
        let same = |q: &Point| {
            q.server == p.server && q.command == p.command && q.connections == p.connections
        };
        if out.iter().any(same) {
            continue;
        }
        let mut runs: Vec<&Point> = points.iter().filter(|q| same(q)).collect();
        runs.sort_by(|a, b| a.ops_per_sec.total_cmp(&b.ops_per_sec));
        let mut chosen = runs[(runs.len() - 1) / 2].clone();
        let rb = |f: fn(&Point) -> Option<f64>| median(runs.iter().filter_map(|q| f(q)).collect());
        chosen.redis_benchmark_rps = rb(|q| q.redis_benchmark_rps);
        chosen.redis_benchmark_p99_ms = rb(|q| q.redis_benchmark_p99_ms);
        chosen.redis_benchmark_ops_per_server_cpu_second =
            rb(|q| q.redis_benchmark_ops_per_server_cpu_second);
        chosen.redis_benchmark_client_us_per_request =
            rb(|q| q.redis_benchmark_client_us_per_request);
        out.push(chosen);
    }
    out
}

/// Build the chart panels: for each command, throughput, p99.9 and ops per CPU-second.
fn points_of<'a>(
    points: &'a [Point],
    server: &'a str,
    command: &'a str,
) -> impl Iterator<Item = &'a Point> + 'a {
    points
        .iter()
        .filter(move |p| p.server == server && p.command == command)
}

pub fn panels(cfg: &SweepConfig, points: &[Point]) -> Vec<Panel> {
    type Metric = (&'static str, &'static str, fn(&Point) -> f64);
    let metrics: [Metric; 3] = [
        ("throughput", "ops/s", |p| p.ops_per_sec),
        ("p99.9 latency", "ms", |p| p.p999_ms),
        ("requests per server CPU-second", "ops per CPU-s", |p| {
            p.ops_per_server_cpu_second
        }),
    ];
    let mut out = Vec::new();
    for (title, unit, metric) in metrics {
        for command in &cfg.commands {
            let mut series: Vec<Series> = cfg
                .servers
                .iter()
                .map(|s| Series {
                    name: s.name.clone(),
                    points: points_of(points, &s.name, command)
                        .map(|p| (f64::from(p.connections), metric(p)))
                        .collect(),
                    dashed: false,
                })
                .collect();
            // redis-benchmark's own figures at the same points, dashed, where measured.
            let reference: Option<fn(&Point) -> Option<f64>> = match title {
                "throughput" => Some(|p| p.redis_benchmark_rps),
                "requests per server CPU-second" => {
                    Some(|p| p.redis_benchmark_ops_per_server_cpu_second)
                }
                _ => None,
            };
            if let Some(reference) = reference.filter(|_| cfg.redis_benchmark.is_some()) {
                for s in &cfg.servers {
                    series.push(Series {
                        name: format!("{} (redis-benchmark)", s.name),
                        points: points_of(points, &s.name, command)
                            .filter_map(|p| Some((f64::from(p.connections), reference(p)?)))
                            .collect(),
                        dashed: true,
                    });
                }
            }
            out.push(Panel {
                title: format!("{} {title}", command.to_uppercase()),
                y_label: unit.into(),
                series,
            });
        }
    }
    if cfg.commands.len() > MAX_METRIC_MAJOR_COMMANDS {
        // Many commands: one row per command (its three metrics side by side).
        let n = cfg.commands.len();
        let mut slots: Vec<Option<Panel>> = out.into_iter().map(Some).collect();
        out = (0..n)
            .flat_map(|c| (0..metrics.len()).map(move |m| m * n + c))
            .filter_map(|i| slots[i].take())
            .collect();
    }
    out
}

/// Up to this many commands the chart has one row per metric, beyond it one per command.
const MAX_METRIC_MAJOR_COMMANDS: usize = 4;

fn chart_columns(cfg: &SweepConfig) -> usize {
    if cfg.commands.len() > MAX_METRIC_MAJOR_COMMANDS {
        3
    } else {
        cfg.commands.len()
    }
}

/// One row of the cost table: a command at one connection count.
#[derive(Clone, Debug, PartialEq)]
pub struct CostRow {
    pub command: String,
    pub connections: u32,
    pub keys_per_request: u32,
    /// Requests per server CPU-second, one per configured server (None: not measured).
    pub per_cpu_second: Vec<Option<f64>>,
    /// Each server's cost per key relative to its own GET at the same connections:
    /// GET rate / (this rate x keys per request). None without a GET point.
    pub cost_vs_get: Vec<Option<f64>>,
}

/// Requests per server CPU-second (the median over a point's repetitions, not the
/// median-throughput run's figure: the CPU metric is what this table is about) and cost
/// relative to GET, from every measured run.
pub fn cost_table(cfg: &SweepConfig, points: &[Point]) -> Vec<CostRow> {
    let rate = |server: &str, command: &str, conns: u32| {
        median(
            points
                .iter()
                .filter(|p| p.server == server && p.command == command && p.connections == conns)
                .map(|p| p.ops_per_server_cpu_second)
                .filter(|r| *r > 0.0)
                .collect(),
        )
    };
    let mut rows = Vec::new();
    for &conns in &cfg.connections {
        for command in &cfg.commands {
            let k = cfg.command(command).keys_per_request();
            let per: Vec<Option<f64>> = cfg
                .servers
                .iter()
                .map(|s| rate(&s.name, command, conns))
                .collect();
            let cost = cfg
                .servers
                .iter()
                .zip(&per)
                .map(|(s, r)| Some(rate(&s.name, "get", conns)? / (r.as_ref()? * f64::from(k))))
                .collect();
            rows.push(CostRow {
                command: command.clone(),
                connections: conns,
                keys_per_request: k,
                per_cpu_second: per,
                cost_vs_get: cost,
            });
        }
    }
    rows
}

/// The issue-11 goal: no command costs more than this many GETs per key it reads.
pub const COST_GOAL: f64 = 1.3;

fn fmt_opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or("n/a".into(), |x| format!("{x:.decimals$}"))
}

fn cost_table_text(cfg: &SweepConfig, rows: &[CostRow]) -> String {
    let names: Vec<&str> = cfg.servers.iter().map(|s| s.name.as_str()).collect();
    let first = names[0];
    let mut s = String::from(
        "
## Requests per server CPU-second

",
    );
    let _ = writeln!(
        s,
        "Median over each point's repetitions. \"{first} / X\" is the ratio of requests per server\n\
         CPU-second.\n\
         \"cost vs GET\" is a server's CPU per key relative to its own GET at the same connection\n\
         count: GET's requests per CPU-second / (the command's x keys per request), so MGET of 10\n\
         keys counts as 10 key reads. Goal (issue 11): {first}'s cost vs GET at most {COST_GOAL}.\n"
    );
    for &conns in &cfg.connections {
        let _ = writeln!(
            s,
            "### {conns} connections
"
        );
        s.push_str("| command | keys/request |");
        for n in &names {
            let _ = write!(s, " {n} ops per CPU-s |");
        }
        for n in &names[1..] {
            let _ = write!(s, " {first} / {n} |");
        }
        for n in &names {
            let _ = write!(s, " {n} cost vs GET |");
        }
        let _ = writeln!(s, " {first} ≤ {COST_GOAL}x GET |");
        s.push_str("|---|---:|");
        s.push_str(&"---:|".repeat(names.len() * 3 - 1));
        s.push_str(
            "---|
",
        );
        for r in rows.iter().filter(|r| r.connections == conns) {
            let _ = write!(
                s,
                "| {} | {} |",
                r.command.to_uppercase(),
                r.keys_per_request
            );
            for v in &r.per_cpu_second {
                let _ = write!(s, " {} |", fmt_opt(*v, 0));
            }
            for v in &r.per_cpu_second[1..] {
                let ratio = r.per_cpu_second[0].zip(*v).map(|(a, b)| a / b);
                let _ = write!(s, " {} |", fmt_opt(ratio, 2));
            }
            for v in &r.cost_vs_get {
                let _ = write!(s, " {} |", fmt_opt(*v, 2));
            }
            let verdict = match r.cost_vs_get[0] {
                Some(c) if c <= COST_GOAL => "yes",
                Some(_) => "**no**",
                None => "n/a",
            };
            let _ = writeln!(s, " {verdict} |");
        }
        s.push('\n');
    }
    s
}

fn tool_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| {
            let mut t = String::from_utf8_lossy(&o.stdout).to_string();
            t.push_str(&String::from_utf8_lossy(&o.stderr));
            t.lines().next().unwrap_or("").trim().to_string()
        })
        .unwrap_or_default()
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Machine, OS, tool versions, time and commit, as (name, value) rows.
pub fn environment(ctx: &Context) -> Vec<(String, String)> {
    let cpuinfo = read_trim("/proc/cpuinfo");
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    let cpus = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let mem = read_trim("/proc/meminfo")
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    let os = read_trim("/etc/os-release")
        .lines()
        .find_map(|l| {
            l.strip_prefix("PRETTY_NAME=")
                .map(|v| v.trim_matches('"').to_string())
        })
        .unwrap_or_default();
    let mut rows = vec![
        (
            "date (UTC)".into(),
            tool_line("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
        ),
        ("CPU".into(), format!("{model} ({cpus} logical CPUs)")),
        (
            "memory".into(),
            mem.split_whitespace().skip(1).collect::<Vec<_>>().join(" "),
        ),
        ("OS".into(), os),
        ("kernel".into(), read_trim("/proc/sys/kernel/osrelease")),
        (
            "load average at start".into(),
            ctx.load_at_start.to_string(),
        ),
        ("load average at end".into(), read_trim("/proc/loadavg")),
        (
            "lavik-bench".into(),
            format!(
                "{} (commit {})",
                env!("CARGO_PKG_VERSION"),
                tool_line("git", &["rev-parse", "--short", "HEAD"])
            ),
        ),
    ];
    for s in &ctx.cfg.servers {
        let bin = s.command.split_whitespace().next().unwrap_or("");
        rows.push((
            format!("{} version", s.name),
            tool_line(bin, &["--version"]),
        ));
    }
    if let Some(rb) = &ctx.cfg.redis_benchmark {
        rows.push(("redis-benchmark".into(), tool_line(rb, &["--version"])));
    }
    rows
}

/// Agreement with redis-benchmark over all points: (ratios ours/theirs, share within 15 %).
pub struct Agreement {
    pub ratios: Vec<f64>,
    pub median: f64,
    pub within_15_percent: usize,
}

pub fn agreement(pairs: impl Iterator<Item = (f64, Option<f64>)>) -> Option<Agreement> {
    let ratios: Vec<f64> = pairs
        .filter_map(|(ours, theirs)| theirs.filter(|t| *t > 0.0).map(|t| ours / t))
        .collect();
    let median = median(ratios.clone())?;
    let within_15_percent = ratios.iter().filter(|r| (0.85..=1.15).contains(*r)).count();
    Some(Agreement {
        ratios,
        median,
        within_15_percent,
    })
}

fn cross_check_text(summary: &[Point]) -> String {
    let mut s = String::from("\n## Cross-check with redis-benchmark\n\n");
    s.push_str("Ratio of lavik-bench's figure to redis-benchmark's at the same point and server\n(summary rows below; 1.00 = identical).\n\n| figure | points | median ratio | points within ±15 % |\n|---|---:|---:|---:|\n");
    let rows: [(&str, Option<Agreement>); 2] = [
        (
            "ops/s",
            agreement(
                summary
                    .iter()
                    .map(|p| (p.ops_per_sec, p.redis_benchmark_rps)),
            ),
        ),
        (
            "ops per server CPU-s",
            agreement(summary.iter().map(|p| {
                (
                    p.ops_per_server_cpu_second,
                    p.redis_benchmark_ops_per_server_cpu_second,
                )
            })),
        ),
    ];
    for (name, a) in rows {
        if let Some(a) = a {
            let _ = writeln!(
                s,
                "| {name} | {} | {:.2} | {} |",
                a.ratios.len(),
                a.median,
                a.within_15_percent
            );
        }
    }
    let ours = median(
        summary
            .iter()
            .filter(|p| p.ops > 0)
            .map(|p| p.client_cpu_seconds * 1e6 / p.ops as f64)
            .collect(),
    );
    let theirs = median(
        summary
            .iter()
            .filter_map(|p| p.redis_benchmark_client_us_per_request)
            .collect(),
    );
    if let (Some(ours), Some(theirs)) = (ours, theirs) {
        let _ = writeln!(
            s,
            "\nClient CPU per request (median over points): lavik-bench {ours:.2} µs, redis-benchmark {theirs:.2} µs."
        );
    }
    s
}

fn readme(ctx: &Context, env: &[(String, String)]) -> String {
    let cfg = ctx.cfg;
    let mut s = format!("# {}\n\n", cfg.title);
    s.push_str("Generated by `lavik-bench sweep`; numbers are from one run on the machine below and\nare only comparable within this run. Servers were measured point by point in turn\n(A B A B), so machine noise hits all of them alike.\n\n![charts](charts.svg)\n\n## Machine and versions\n\n| | |\n|---|---|\n");
    for (k, v) in env {
        let _ = writeln!(s, "| {k} | {} |", v.replace('|', "\\|"));
    }
    s.push_str("\n## Exact commands\n\n```sh\n");
    let _ = writeln!(s, "lavik-bench sweep --config {}", ctx.config_path);
    s.push_str("```\n\nServers (pinned with taskset):\n\n```sh\n");
    for (name, cmd) in ctx.launched {
        let _ = writeln!(s, "# {name}\n{cmd}");
    }
    let _ = write!(s, "```\n\nClient pinned with `taskset -c {}`. Per server: `FLUSHALL`, then the fill\n\n```sh\n{}\n```\n\n", if cfg.client_cpus.is_empty() { "(none)" } else { &cfg.client_cpus }, super::fill_command_line(cfg));
    let extra = cfg.extra_fills();
    if !extra.is_empty() {
        s.push_str("then DBSIZE and sampled STRLEN checks; then each command's own keyspace is filled (DBSIZE checked after each):\n\n```sh\n");
        for (prefix, fill) in &extra {
            let _ = writeln!(s, "{}", super::extra_fill_command_line(cfg, prefix, fill));
        }
        s.push_str("```\n\n");
    }
    let _ = write!(s, "then DBSIZE and {} sampled STRLEN checks, {} s of GET warm-up, then per point (N = connections):\n\n```sh\n", cfg.strlen_samples, cfg.warmup_seconds);
    for command in &cfg.commands {
        let _ = writeln!(s, "{}", super::point_command_line(cfg, command));
    }
    s.push_str("```\n\n");
    if cfg.redis_benchmark.is_some() {
        let args = super::redis_benchmark_args(cfg, 0, "get|set", 0, 0).join(" ");
        let _ = write!(s, "Cross-check, right after each point on the same server (-n = our rate x point seconds;\nits `key:NNNNNNNNNNNN` keys were prefilled with 10 x keys random SETs, so DBSIZE and\nmemory during the sweep include them):\n\n```sh\nredis-benchmark {}\n```\n\n", args.replace("-p 0", "-p PORT").replace("-c 0", "-c N").replace("-n 0", "-n REQUESTS"));
    }
    s.push_str("Configuration file:\n\n```\n");
    s.push_str(ctx.config_text.trim_end());
    s.push_str("\n```\n\n## Checks\n\n| server | check | result | detail |\n|---|---|---|---|\n");
    for c in ctx.checks {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            c.server,
            c.what,
            if c.ok { "ok" } else { "**FAILED**" },
            c.detail
        );
    }
    if cfg.redis_benchmark.is_some() {
        s.push_str(&cross_check_text(&summarize(ctx.points)));
    }
    let summary = summarize(ctx.points);
    s.push_str(&cost_table_text(cfg, &cost_table(cfg, ctx.points)));
    s.push_str("\n## Results\n\n");
    let rb = cfg.redis_benchmark.is_some();
    if cfg.repeats > 1 {
        let _ = writeln!(
            s,
            "Each row is the median-throughput run of {} repetitions (all runs are in results.csv).\n",
            cfg.repeats
        );
    }
    for command in &cfg.commands {
        let _ = writeln!(s, "### {}\n", command.to_uppercase());
        s.push_str("| conns | server | ops/s | p50 ms | p99 ms | p99.9 ms | p99.99 ms | server CPU s | server waited for CPU s | ops per CPU-s | client CPU s | RSS MiB | used_memory MiB |");
        s.push_str(if rb {
            " redis-benchmark ops/s | ops/s ours / theirs | redis-benchmark ops per CPU-s | ops per CPU-s ours / theirs |\n"
        } else {
            "\n"
        });
        s.push_str("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        s.push_str(if rb { "---:|---:|---:|---:|\n" } else { "\n" });
        for p in summary.iter().filter(|p| &p.command == command) {
            let _ = write!(
                s,
                "| {} | {} | {:.0} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {:.0} | {:.2} | {:.1} | {:.1} |",
                p.connections, p.server, p.ops_per_sec, p.p50_ms, p.p99_ms, p.p999_ms, p.p9999_ms,
                p.server_cpu_seconds, fmt_opt(p.server_wait_seconds, 3), p.ops_per_server_cpu_second,
                p.client_cpu_seconds, p.rss_kib as f64 / 1024.0,
                p.used_memory_bytes as f64 / 1048576.0
            );
            if rb {
                for (ours, theirs) in [
                    (p.ops_per_sec, p.redis_benchmark_rps),
                    (
                        p.ops_per_server_cpu_second,
                        p.redis_benchmark_ops_per_server_cpu_second,
                    ),
                ] {
                    match theirs {
                        Some(r) if r > 0.0 => {
                            let _ = write!(s, " {r:.0} | {:.2} |", ours / r);
                        }
                        _ => s.push_str(" n/a | |"),
                    }
                }
            }
            s.push('\n');
        }
        s.push('\n');
    }
    s.push_str(
        "Files: `results.csv`, `results.json`, `charts.svg`, one `<server>.log` per server.\n",
    );
    s
}

pub fn write_all(ctx: &Context, out: &Path) -> Result<(), String> {
    let write = |name: &str, body: &str| {
        std::fs::write(out.join(name), body)
            .map_err(|e| format!("{}: {e}", out.join(name).display()))
    };
    let env = environment(ctx);
    write("results.csv", &csv(ctx.points))?;
    let doc = json!({
        "title": ctx.cfg.title,
        "environment": env.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "servers": ctx.launched.iter().map(|(n, c)| json!({"name": n, "command": c})).collect::<Vec<_>>(),
        "checks": ctx.checks.iter().map(|c| json!({"server": c.server, "check": c.what, "ok": c.ok, "detail": c.detail})).collect::<Vec<_>>(),
        "points": ctx.points.iter().map(point_json).collect::<Vec<_>>(),
        "summary": summarize(ctx.points).iter().map(point_json).collect::<Vec<_>>(),
        "cost_table": cost_table(ctx.cfg, ctx.points).iter().map(|r| json!({
            "command": r.command, "connections": r.connections,
            "keys_per_request": r.keys_per_request,
            "servers": ctx.cfg.servers.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
            "ops_per_server_cpu_second": r.per_cpu_second,
            "cost_vs_get": r.cost_vs_get,
        })).collect::<Vec<_>>(),
    });
    write(
        "results.json",
        &serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?,
    )?;
    let subtitle = format!(
        "{} keys x {} B, pipeline {}, {} s per point, servers on CPU {}, client on CPU {}",
        ctx.cfg.keys,
        ctx.cfg.data_size_bytes,
        ctx.cfg.pipeline,
        ctx.cfg.point_seconds,
        ctx.cfg.server_cpus,
        ctx.cfg.client_cpus
    );
    let columns = chart_columns(ctx.cfg);
    let summary = summarize(ctx.points);
    write(
        "charts.svg",
        &render(
            &ctx.cfg.title,
            &subtitle,
            &panels(ctx.cfg, &summary),
            columns,
        ),
    )?;
    write("README.md", &readme(ctx, &env))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::config::ServerSpec;

    fn point(server: &str, command: &str, conns: u32, rate: f64) -> Point {
        Point {
            server: server.into(),
            command: command.into(),
            connections: conns,
            repeat: 0,
            ops: 10,
            ops_per_sec: rate,
            avg_ms: 0.1,
            p50_ms: 0.1,
            p99_ms: 0.2,
            p999_ms: 0.3,
            p9999_ms: 0.4,
            hits: 10,
            misses: 0,
            error_replies: 0,
            connection_errors: 0,
            server_cpu_seconds: 1.0,
            server_wait_seconds: Some(0.1),
            ops_per_server_cpu_second: 10.0,
            client_cpu_seconds: 0.5,
            rss_kib: 2048,
            used_memory_bytes: 1 << 20,
            redis_benchmark_rps: Some(rate * 0.9),
            redis_benchmark_p99_ms: None,
            redis_benchmark_ops_per_server_cpu_second: None,
            redis_benchmark_client_us_per_request: None,
        }
    }

    // Proves the CSV has a header plus one row per point with the same column count.
    #[test]
    fn csv_rows() {
        let text = csv(&[point("a", "get", 1, 5.0), point("b", "get", 1, 6.0)]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        let columns = CSV_HEADER.split(',').count();
        assert!(lines.iter().all(|l| l.split(',').count() == columns));
        assert!(lines[2].starts_with("b,get,1,0,10,6.0,"));
    }

    // Proves panels group points by command and metric, one series per server.
    #[test]
    fn panels_group_points() {
        let cfg = SweepConfig {
            servers: ["a", "b"]
                .iter()
                .map(|n| ServerSpec {
                    name: n.to_string(),
                    port: 1,
                    command: "x".into(),
                })
                .collect(),
            ..SweepConfig::default()
        };
        let pts = [
            point("a", "get", 1, 5.0),
            point("a", "get", 2, 7.0),
            point("b", "set", 2, 3.0),
        ];
        let p = panels(&cfg, &pts);
        assert_eq!(p.len(), 6);
        assert_eq!(p[0].title, "GET throughput");
        assert_eq!(p[0].series[0].points, vec![(1.0, 5.0), (2.0, 7.0)]);
        assert!(p[0].series[1].points.is_empty());
        assert_eq!(p[1].series[1].points, vec![(2.0, 3.0)]);
        assert_eq!(p[3].title, "SET p99.9 latency");
    }

    // Proves the cost table takes the median over repetitions, divides by keys per request,
    // relates each server to its own GET, and lays out many commands one row per command.
    #[test]
    fn cost_table_and_layout() {
        let cfg = super::super::config::parse(
            "commands = get,mget,incr,set,strlen\nconnections = 1\n\
             command = mget | MGET __key__ __key__ | distinct_keys\n\
             command = incr | INCR __key__\ncommand = strlen | STRLEN __key__\n\
             server = a | 1 | x\nserver = b | 2 | y\n",
        )
        .unwrap();
        let mut pts = Vec::new();
        for (server, command, rate) in [
            ("a", "get", 100.0),
            ("a", "mget", 40.0),
            ("a", "mget", 10.0),
            ("a", "mget", 45.0),
            ("a", "incr", 50.0),
            ("b", "get", 200.0),
            ("b", "mget", 50.0),
        ] {
            let mut p = point(server, command, 1, 1.0);
            p.ops_per_server_cpu_second = rate;
            pts.push(p);
        }
        let rows = cost_table(&cfg, &pts);
        assert_eq!(rows.len(), 5);
        assert_eq!(rows[1].keys_per_request, 2);
        assert_eq!(rows[1].per_cpu_second, vec![Some(40.0), Some(50.0)]);
        // a: 100 / (40 x 2) = 1.25; b: 200 / (50 x 2) = 2.
        assert_eq!(rows[1].cost_vs_get, vec![Some(1.25), Some(2.0)]);
        assert_eq!(rows[2].cost_vs_get, vec![Some(2.0), None]);
        let text = cost_table_text(&cfg, &rows);
        assert!(
            text.contains("| MGET | 2 | 40 | 50 | 0.80 | 1.25 | 2.00 | yes |"),
            "{text}"
        );
        assert!(
            text.contains("| INCR | 1 | 50 | n/a | n/a | 2.00 | n/a | **no** |"),
            "{text}"
        );
        let p = panels(&cfg, &pts);
        assert_eq!(chart_columns(&cfg), 3);
        let titles: Vec<&str> = p.iter().take(4).map(|p| p.title.as_str()).collect();
        assert_eq!(
            titles,
            [
                "GET throughput",
                "GET p99.9 latency",
                "GET requests per server CPU-second",
                "MGET throughput"
            ]
        );
    }

    // Proves the summary keeps one median run per point and takes redis-benchmark medians.
    #[test]
    fn summary_takes_medians() {
        let mut runs = vec![
            point("a", "get", 1, 5.0),
            point("a", "get", 1, 9.0),
            point("a", "get", 1, 7.0),
            point("b", "get", 1, 1.0),
        ];
        runs[1].redis_benchmark_rps = Some(100.0);
        let s = summarize(&runs);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].ops_per_sec, 7.0);
        // redis-benchmark values 4.5, 100, 6.3: median 6.3.
        assert!((s[0].redis_benchmark_rps.unwrap() - 6.3).abs() < 1e-9);
        assert_eq!(s[1].server, "b");
    }

    // Proves the agreement summary counts ratios within ±15 % and skips missing figures.
    #[test]
    fn agreement_counts() {
        let a = agreement(
            [
                (100.0, Some(100.0)),
                (120.0, Some(100.0)),
                (80.0, Some(100.0)),
                (5.0, None),
            ]
            .into_iter(),
        )
        .unwrap();
        assert_eq!(a.ratios.len(), 3);
        assert_eq!(a.within_15_percent, 1);
        assert!((a.median - 1.0).abs() < 1e-12);
        assert!(agreement([(1.0, None)].into_iter()).is_none());
    }
}
