//! Command line and Redis-style config file.
//!
//! Flags carry the published Lavik names. A config file given as the first
//! positional argument holds `directive value...` lines (Redis syntax:
//! `#` comments, quoted values); each directive is either one of our flag
//! names or a Redis directive we understand. Command-line flags override the
//! file. Unknown directives are refused with their line number, so a typo
//! never silently runs with a default.

pub mod output_limits;
pub mod rewrite;
pub mod tls;
use clap::Parser;
use std::path::PathBuf;

pub mod build;

use crate::resp::parse::split_args;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "lavik",
    version = build::VERSION,
    about = "Redis-compatible key-value server: key index in RAM, values on SSD",
    args_override_self = true
)]
pub struct Cli {
    /// Redis-style config file (`directive value` lines); flags override it.
    pub config_file: Option<PathBuf>,
    /// Address to listen on (repeatable).
    #[arg(long = "bind", num_args = 1..)]
    pub bind: Vec<String>,
    /// TCP port (0 disables TCP).
    #[arg(long, default_value_t = 6379)]
    pub port: u16,
    /// Worker threads (default: CPUs in the affinity mask).
    #[arg(long, visible_alias = "shards")]
    pub threads: Option<usize>,
    /// CPUs to pin workers to, e.g. `0-1,4` (default: the affinity mask).
    #[arg(long)]
    pub cpus: Option<String>,
    /// Pin each worker to one CPU.
    #[arg(long, overrides_with = "no_pin_workers")]
    pub pin_workers: bool,
    /// Do not pin workers.
    #[arg(long)]
    pub no_pin_workers: bool,
    /// Data file or block device (repeatable); `spdk://BDF/NSID` with --storage=spdk.
    #[arg(long = "data-file")]
    pub data_file: Vec<String>,
    /// RAM for recently read records (e.g. 256mb; 0 = off: every read from the device).
    #[arg(long, default_value = "64mb")]
    pub cache_size: String,
    /// Fixed size of a data file lavik creates (e.g. 4gb). Without it, one data file
    /// (the default) starts small and grows with the data up to --data-file-max-size;
    /// several data files are created at 1gb each.
    #[arg(long)]
    pub data_file_size: Option<String>,
    /// Largest size a growing data file may reach (default: its size at start plus 80% of
    /// the file system's free space).
    #[arg(long)]
    pub data_file_max_size: Option<String>,
    /// Test hook: the first size of a growing data file.
    #[arg(long, default_value = "256mb", hide = true)]
    pub data_file_initial_size: String,
    /// Test hook: how much a growing data file grows by at a time.
    #[arg(long, default_value = "1gb", hide = true)]
    pub data_file_grow_step: String,
    /// Storage backend.
    #[arg(long, default_value = "uring")]
    pub storage: String,
    /// Network backend.
    #[arg(long, default_value = "kernel")]
    pub network: String,
    /// Directory for lavik.log.
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
    /// Log to stderr (in addition to --log-dir).
    #[arg(long)]
    pub logtostderr: bool,
    /// Password clients must AUTH with.
    #[arg(long)]
    pub requirepass: Option<String>,
    /// An ACL user: `NAME rule...` (Redis's `user` directive; repeatable).
    #[arg(long = "user")]
    pub user: Vec<String>,
    /// ACL file for users (ACL LOAD / ACL SAVE); not together with `user` lines.
    #[arg(long)]
    pub aclfile: Option<PathBuf>,
    /// Maximum simultaneous clients.
    #[arg(long, default_value_t = 10000)]
    pub maxclients: usize,
    /// Output buffer limit of a client class: `CLASS HARD SOFT SECONDS` (repeatable),
    /// as Redis's `client-output-buffer-limit`.
    #[arg(long)]
    pub client_output_buffer_limit: Vec<String>,
    /// Keyspace notification classes (Redis's `notify-keyspace-events`, e.g. `KEA`).
    #[arg(long, default_value = "")]
    pub notify_keyspace_events: String,
    /// Per-client query buffer limit (e.g. 1gb).
    #[arg(long, default_value = "1gb")]
    pub client_query_buffer_limit: String,
    /// Largest bulk string accepted (e.g. 512mb).
    #[arg(long, default_value = "512mb")]
    pub proto_max_bulk_len: String,
    /// Refuse non-loopback clients when no password is set (yes|no).
    #[arg(long, default_value = "yes")]
    pub protected_mode: String,
    /// Busy-poll this long before parking a worker.
    #[arg(long, default_value_t = 20)]
    pub busy_poll_us: u64,
    /// Foreground work budget per loop round.
    #[arg(long, default_value_t = 1000)]
    pub foreground_budget_us: u64,
    /// Background work budget per loop round.
    #[arg(long, default_value_t = 10)]
    pub background_budget_us: u64,
    /// Minimum CPU share guaranteed to background work.
    #[arg(long, default_value_t = 1)]
    pub background_warrant_percent: u64,
    /// Prometheus metrics port (0 = off).
    #[arg(long, default_value_t = 0)]
    pub metrics_port: u16,
    /// Write an index checkpoint on clean shutdown.
    #[arg(long)]
    pub shutdown_checkpoint: bool,
    /// Test hook: hold the recovered store this long before serving (to see -LOADING).
    #[arg(long, default_value_t = 0, hide = true)]
    pub debug_load_delay_ms: u64,
    /// Test hook: the index hash is ANDed with this (fewer bits = distinct keys collide).
    #[arg(long, default_value_t = u64::MAX, hide = true)]
    pub debug_hash_mask: u64,
    /// Plain SET/SETEX/PSETEX/MSET overwrite without reading the old record first
    /// (`docs/index.md`, "Blind overwrites") (yes|no).
    #[arg(long, default_value = "yes")]
    pub blind_writes: String,
    /// A paged collection's root listing more directory pages than this is stored as a
    /// version-2 root (base page + change list); tests lower it to reach that form small.
    #[arg(long, default_value_t = 64, hide = true)]
    pub paged_base_min_dirs: usize,
    /// Pushes and pops on one paged list coalesce within a worker round
    /// (`docs/collections.md` section 5a) (yes|no; `no` for before/after measurements).
    #[arg(long, default_value = "yes", hide = true)]
    pub coalesce_lists: String,
    /// Test hook: each group-commit `fdatasync` counts as done this long after it
    /// completes (to see that replies wait for it).
    #[arg(long, default_value_t = 0, hide = true)]
    pub debug_sync_delay_ms: u64,
    /// Test hook: each device read a command waits for counts as done this long after it
    /// completes (to see that other connections are served meanwhile).
    #[arg(long, default_value_t = 0, hide = true)]
    pub debug_read_delay_ms: u64,
    /// Test hook: the data files are read the way NVMe namespaces are (no descriptor,
    /// asynchronous reads polled on the worker's own queue, `device::GatedDevice`), and no
    /// read completes while this file exists.
    #[arg(long, hide = true)]
    pub debug_async_device_hold: Option<PathBuf>,
    /// Test hook: a worker's longest park when nothing is pending (normally 100 ms). A
    /// long one makes a lost mailbox wake-up a hang instead of a 100 ms delay.
    #[arg(long, default_value_t = 100, hide = true)]
    pub debug_idle_wait_ms: u64,
    /// Slow log threshold in microseconds (negative: off), as Redis's.
    #[arg(long, default_value_t = 10_000, allow_hyphen_values = true)]
    pub slowlog_log_slower_than: i64,
    /// Slow log entries kept.
    #[arg(long, default_value_t = 128)]
    pub slowlog_max_len: usize,
    /// Latency monitor threshold in milliseconds (0: off).
    #[arg(long, default_value_t = 0)]
    pub latency_monitor_threshold: u64,
    /// Per-command latency histograms for INFO latencystats (yes|no).
    #[arg(long, default_value = "yes")]
    pub latency_tracking: String,
    /// Percentiles INFO latencystats reports, space separated.
    #[arg(long, default_value = "50 99 99.9")]
    pub latency_tracking_info_percentiles: String,
    /// Durability: always | everysec | no.
    #[arg(long, default_value = "everysec")]
    pub appendfsync: String,
    /// Longest time a write stays unflushed with `everysec`.
    #[arg(long, default_value_t = 100)]
    pub flush_max_ms: u64,
    /// Tombstone sweep interval (0 = off; default one day).
    #[arg(long, default_value_t = 86_400_000)]
    pub tomb_raider_interval_ms: u64,
    /// Blocks under defrag at once per device.
    #[arg(long, default_value_t = 1)]
    pub defrag_max_active_per_device: u32,
    /// Start with defrag paused.
    #[arg(long)]
    pub defrag_paused: bool,
    /// Pause between defrag steps.
    #[arg(long, default_value_t = 0)]
    pub defrag_sleep_ms: u64,
    /// Pause between relocated records.
    #[arg(long, default_value_t = 0)]
    pub defrag_record_sleep_us: u64,
    /// NVMe completions reaped per poll (appliance mode).
    #[arg(long, default_value_t = 8)]
    pub spdk_max_completions_per_poll: u32,
    /// Use O_DIRECT on data files (yes|no).
    #[arg(long, default_value = "yes")]
    pub direct_io: String,
    /// DPDK EAL arguments for `--network=dpdk`, one string (default: env `BYCORF_EAL_ARGS`).
    #[arg(long, allow_hyphen_values = true)]
    pub dpdk_eal_args: Option<String>,
    /// DPDK port to serve on: a port id or a device name (default: the first port).
    #[arg(long)]
    pub dpdk_port: Option<String>,
    /// Our address on the DPDK port, `A.B.C.D/prefix` (required with `--network=dpdk`).
    #[arg(long)]
    pub dpdk_ip: Option<String>,
    /// Next hop for destinations outside the DPDK subnet.
    #[arg(long)]
    pub dpdk_gateway: Option<String>,
    /// Ethernet address to use instead of the port's own (turns on promiscuous mode).
    #[arg(long)]
    pub dpdk_mac: Option<String>,
    /// TLS port (0: no TLS listener), beside or instead of `--port` (see docs/tls.md).
    #[arg(long, default_value_t = 0)]
    pub tls_port: u16,
    /// The server's certificate chain (PEM).
    #[arg(long)]
    pub tls_cert_file: Option<String>,
    /// The server certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long)]
    pub tls_key_file: Option<String>,
    /// CA certificates (PEM) that client certificates must chain to.
    #[arg(long)]
    pub tls_ca_cert_file: Option<String>,
    /// A directory of CA certificates (PEM files), as `--tls-ca-cert-file`.
    #[arg(long)]
    pub tls_ca_cert_dir: Option<String>,
    /// Client certificates: `yes` (required), `optional` (checked if sent) or `no`.
    #[arg(long, default_value = "yes")]
    pub tls_auth_clients: String,
    /// TLS versions to accept, e.g. "TLSv1.2 TLSv1.3" (empty: both).
    #[arg(long, default_value = "")]
    pub tls_protocols: String,
    /// TLS 1.3 cipher suites, colon separated (e.g. TLS_AES_256_GCM_SHA384; empty: all).
    #[arg(long, default_value = "")]
    pub tls_ciphersuites: String,
    /// TLS 1.2 ciphers, colon separated OpenSSL names (e.g. ECDHE-RSA-AES128-GCM-SHA256).
    #[arg(long, default_value = "")]
    pub tls_ciphers: String,
    /// Keep server-side TLS sessions for resumption (yes/no).
    #[arg(long, default_value = "yes")]
    pub tls_session_caching: String,
    /// Sessions kept for resumption.
    #[arg(long, default_value_t = 20480)]
    pub tls_session_cache_size: usize,
    /// Choose the cipher suite by the server's order rather than the client's (yes/no).
    #[arg(long, default_value = "no")]
    pub tls_prefer_server_ciphers: String,
}

/// Settings after merging file and flags and validating values.
#[derive(Debug, Clone)]
pub struct Settings {
    pub cli: Cli,
    pub binds: Vec<String>,
    pub threads: usize,
    pub cpus: Vec<usize>,
    pub pin_workers: bool,
    pub data_files: Vec<PathBuf>,
    /// Size of a data file lavik creates (fixed, or the first size of a growing one).
    pub data_file_size_bytes: u64,
    pub cache_size_bytes: u64,
    pub output_limits: output_limits::OutputLimits,
    /// `Some` when the one data file grows with the data (no `--data-file-size`).
    pub data_file_growth: Option<crate::storage::GrowthConfig>,
    pub client_query_buffer_limit_bytes: usize,
    pub proto_max_bulk_len_bytes: usize,
    pub protected_mode: bool,
    pub appendfsync: crate::storage::FsyncPolicy,
    pub direct_io: bool,
    /// `--blind-writes`.
    pub blind_writes: bool,
    pub config_file: Option<PathBuf>,
    /// `user` directives, each split into words (name first), validated.
    pub acl_users: Vec<Vec<Vec<u8>>>,
    /// Appliance networking (`--network=dpdk`); `None` in kernel mode.
    pub dpdk: Option<DpdkSettings>,
    /// The TLS listener's settings as given at start (`server::tls` builds the context).
    pub tls: tls::TlsSettings,
}

/// Validated `--network=dpdk` settings. Parsing needs no DPDK, so it is built and tested
/// without the `dpdk` feature; only using them does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DpdkSettings {
    /// EAL arguments after the program name (`-m` added from `BYCORF_DPDK_MEMORY_MB`).
    pub eal_args: Vec<String>,
    /// Port to serve on; `None` = the first port.
    pub port: Option<DpdkPort>,
    pub ip: std::net::Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: Option<std::net::Ipv4Addr>,
    pub mac: Option<[u8; 6]>,
    /// The TCP port the userspace stack listens on (`--port`).
    pub listen_port: u16,
}

/// How `--dpdk-port` names the port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DpdkPort {
    Id(u16),
    Name(String),
}

/// Environment variable with the EAL arguments (the published name).
pub const EAL_ARGS_ENV: &str = "BYCORF_EAL_ARGS";
/// Environment variable with the EAL memory in MiB (becomes `-m`).
pub const DPDK_MEMORY_ENV: &str = "BYCORF_DPDK_MEMORY_MB";

/// Builds the DPDK settings from the flags and the two environment values (passed in so
/// tests need not touch the process environment). Flags win over the environment.
pub fn dpdk_settings(
    cli: &Cli,
    eal_args_env: Option<&str>,
    memory_mb_env: Option<&str>,
) -> Result<DpdkSettings, String> {
    let text = cli.dpdk_eal_args.as_deref().or(eal_args_env).unwrap_or("");
    let mut eal_args: Vec<String> = split_args(text.as_bytes())
        .ok_or_else(|| format!("--dpdk-eal-args: unbalanced quotes in '{text}'"))?
        .into_iter()
        .map(|w| String::from_utf8_lossy(&w).into_owned())
        .collect();
    if let Some(mb) = memory_mb_env.map(str::trim).filter(|v| !v.is_empty()) {
        let mb: u32 = mb.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
            format!("{DPDK_MEMORY_ENV} must be a positive number of MiB, got '{mb}'")
        })?;
        let has_memory = eal_args.iter().any(|a| {
            a == "-m" || a.starts_with("--socket-mem") || (a.starts_with("-m") && a.len() > 2)
        });
        if !has_memory {
            eal_args.push("-m".into());
            eal_args.push(mb.to_string());
        }
    }
    let ip_text = cli
        .dpdk_ip
        .as_deref()
        .ok_or("--network=dpdk needs --dpdk-ip A.B.C.D/prefix")?;
    let (ip, prefix_len) = parse_ipv4_prefix(ip_text)
        .ok_or_else(|| format!("--dpdk-ip takes A.B.C.D/prefix (prefix 1-32), got '{ip_text}'"))?;
    let gateway = match cli.dpdk_gateway.as_deref() {
        None => None,
        Some(g) => Some(
            g.parse::<std::net::Ipv4Addr>()
                .map_err(|_| format!("--dpdk-gateway takes A.B.C.D, got '{g}'"))?,
        ),
    };
    let mac = match cli.dpdk_mac.as_deref() {
        None => None,
        Some(m) => Some(parse_mac(m).ok_or_else(|| {
            format!("--dpdk-mac takes a unicast address like 02:00:00:00:00:01, got '{m}'")
        })?),
    };
    let port = cli.dpdk_port.as_deref().map(|p| match p.parse::<u16>() {
        Ok(id) => DpdkPort::Id(id),
        Err(_) => DpdkPort::Name(p.to_string()),
    });
    if cli.port == 0 {
        return Err("--network=dpdk needs a TCP port (--port must not be 0)".into());
    }
    Ok(DpdkSettings {
        eal_args,
        port,
        ip,
        prefix_len,
        gateway,
        mac,
        listen_port: cli.port,
    })
}

/// `A.B.C.D/prefix` with a prefix of 1 to 32.
pub fn parse_ipv4_prefix(s: &str) -> Option<(std::net::Ipv4Addr, u8)> {
    let (ip, prefix) = s.split_once('/')?;
    let prefix: u8 = prefix.parse().ok().filter(|p| (1..=32).contains(p))?;
    Some((ip.parse().ok()?, prefix))
}

/// `aa:bb:cc:dd:ee:ff` (or with `-`), unicast only.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6 {
        return None;
    }
    let mut mac = [0u8; 6];
    for (byte, part) in mac.iter_mut().zip(parts) {
        if part.len() != 2 {
            return None;
        }
        *byte = u8::from_str_radix(part, 16).ok()?;
    }
    (mac[0] & 1 == 0 && mac != [0; 6]).then_some(mac)
}

/// Parses Redis memory units: `1gb`, `512mb`, `100k`, plain bytes.
pub fn parse_memory(s: &str) -> Option<u64> {
    let l = s.trim().to_ascii_lowercase();
    let units: [(&str, u64); 8] = [
        ("gb", 1 << 30),
        ("mb", 1 << 20),
        ("kb", 1 << 10),
        ("g", 1_000_000_000),
        ("m", 1_000_000),
        ("k", 1_000),
        ("b", 1),
        ("", 1),
    ];
    for (suffix, mult) in units {
        if let Some(num) = l.strip_suffix(suffix) {
            if let Ok(n) = num.parse::<u64>() {
                return n.checked_mul(mult);
            }
            if suffix.is_empty() {
                return None;
            }
        }
    }
    None
}

pub fn parse_yes_no(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "yes" | "true" | "1" | "on" => Some(true),
        "no" | "false" | "0" | "off" => Some(false),
        _ => None,
    }
}

pub fn parse_fsync(s: &str) -> Option<crate::storage::FsyncPolicy> {
    use crate::storage::FsyncPolicy;
    match s.to_ascii_lowercase().as_str() {
        "always" => Some(FsyncPolicy::Always),
        "everysec" => Some(FsyncPolicy::EverySec),
        "no" => Some(FsyncPolicy::No),
        _ => None,
    }
}

/// Directives accepted in a config file: our flag names plus these Redis
/// directives that mean the same thing here. Directives that Redis has but
/// which have no meaning for this engine and are harmless are accepted and
/// ignored (listed in `IGNORED_DIRECTIVES`).
const FLAG_DIRECTIVES: &[&str] = &[
    "bind",
    "port",
    "threads",
    "shards",
    "cpus",
    "pin-workers",
    "data-file",
    "data-file-size",
    "cache-size",
    "data-file-max-size",
    "storage",
    "network",
    "log-dir",
    "logtostderr",
    "requirepass",
    "aclfile",
    "maxclients",
    "client-query-buffer-limit",
    "client-output-buffer-limit",
    "notify-keyspace-events",
    "proto-max-bulk-len",
    "protected-mode",
    "busy-poll-us",
    "foreground-budget-us",
    "background-budget-us",
    "background-warrant-percent",
    "metrics-port",
    "shutdown-checkpoint",
    "appendfsync",
    "flush-max-ms",
    "tomb-raider-interval-ms",
    "defrag-max-active-per-device",
    "defrag-paused",
    "defrag-sleep-ms",
    "defrag-record-sleep-us",
    "spdk-max-completions-per-poll",
    "slowlog-log-slower-than",
    "slowlog-max-len",
    "latency-monitor-threshold",
    "latency-tracking",
    "latency-tracking-info-percentiles",
    "direct-io",
    "dpdk-eal-args",
    "dpdk-port",
    "dpdk-ip",
    "dpdk-gateway",
    "dpdk-mac",
    "tls-port",
    "tls-cert-file",
    "tls-key-file",
    "tls-ca-cert-file",
    "tls-ca-cert-dir",
    "tls-auth-clients",
    "tls-protocols",
    "tls-ciphersuites",
    "tls-ciphers",
    "tls-session-caching",
    "tls-session-cache-size",
    "tls-prefer-server-ciphers",
];
/// Redis directives for what lavik does not do: accepted when they ask for nothing
/// (`no`), refused otherwise, so a config file never silently loses a promise.
const OFF_ONLY_DIRECTIVES: &[&str] = &["tls-replication", "tls-cluster"];
const BOOL_FLAGS: &[&str] = &[
    "pin-workers",
    "logtostderr",
    "shutdown-checkpoint",
    "defrag-paused",
];
const IGNORED_DIRECTIVES: &[&str] = &[
    "daemonize",
    "save",
    "appendonly",
    "loglevel",
    "databases",
    "timeout",
    "tcp-keepalive",
    "tcp-backlog",
    "supervised",
    "always-show-logo",
    "stop-writes-on-bgsave-error",
];

/// Turns a config file into flag arguments (placed before the real ones so
/// the real ones win). Errors name the line.
pub fn config_file_args(text: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let lineno = i + 1;
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let Some(words) = split_args(t.as_bytes()) else {
            return Err(format!("config line {lineno}: unbalanced quotes"));
        };
        let words: Vec<String> = words
            .into_iter()
            .map(|w| String::from_utf8_lossy(&w).into_owned())
            .collect();
        let name = words[0].to_ascii_lowercase();
        let values = &words[1..];
        if IGNORED_DIRECTIVES.contains(&name.as_str()) {
            if name == "daemonize"
                && values
                    .first()
                    .is_some_and(|v| parse_yes_no(v) == Some(true))
            {
                return Err(format!(
                    "config line {lineno}: daemonize yes is not supported; run under a supervisor"
                ));
            }
            continue;
        }
        if OFF_ONLY_DIRECTIVES.contains(&name.as_str()) {
            if values.first().and_then(|v| parse_yes_no(v)) != Some(false) {
                return Err(format!(
                    "config line {lineno}: '{name}' is not supported (only '{name} no')"
                ));
            }
            continue;
        }
        if name == "user" {
            if values.is_empty() {
                return Err(format!("config line {lineno}: 'user' needs a username"));
            }
            // One flag per line; words re-quoted so `--user` splits them back the same.
            let quoted: Vec<String> = values.iter().map(|v| quote_word(v)).collect();
            out.push(format!("--user={}", quoted.join(" ")));
            continue;
        }
        if !FLAG_DIRECTIVES.contains(&name.as_str()) {
            return Err(format!(
                "config line {lineno}: unknown directive '{}'",
                words[0]
            ));
        }
        if values.is_empty() {
            return Err(format!("config line {lineno}: '{name}' needs a value"));
        }
        if BOOL_FLAGS.contains(&name.as_str()) {
            match parse_yes_no(&values[0]) {
                Some(true) => out.push(format!("--{name}")),
                Some(false) if name == "pin-workers" => out.push("--no-pin-workers".into()),
                Some(false) => {}
                None => return Err(format!("config line {lineno}: '{name}' takes yes or no")),
            }
            continue;
        }
        if name == "client-output-buffer-limit"
            || name == "latency-tracking-info-percentiles"
            || name == "tls-protocols"
        {
            // One class group per line, its four words as one value.
            out.push(format!("--{name}={}", values.join(" ")));
            continue;
        }
        for v in values {
            out.push(format!("--{name}={v}"));
        }
    }
    Ok(out)
}

/// A word in double quotes (with `\\` and `\"` escaped) if it holds whitespace or quotes.
fn quote_word(w: &str) -> String {
    if w.is_empty()
        || w.chars()
            .any(|c| c.is_whitespace() || c == '"' || c == '\'')
    {
        let mut q = String::from("\"");
        for c in w.chars() {
            match c {
                '"' | '\\' => {
                    q.push('\\');
                    q.push(c);
                }
                '\n' => q.push_str("\\n"),
                '\r' => q.push_str("\\r"),
                '\t' => q.push_str("\\t"),
                _ => q.push(c),
            }
        }
        q.push('"');
        q
    } else {
        w.to_string()
    }
}

/// Splits the `--user` values into words and checks them as Redis does at start.
fn acl_users(cli: &Cli) -> Result<Vec<Vec<Vec<u8>>>, String> {
    let mut users = Vec::new();
    for line in &cli.user {
        let words = split_args(line.as_bytes())
            .ok_or_else(|| format!("--user: unbalanced quotes in '{line}'"))?;
        if words.is_empty() {
            return Err("--user needs a username".into());
        }
        users.push(words);
    }
    if !users.is_empty() && cli.aclfile.is_some() {
        return Err("Configuring Redis with users defined in redis.conf and at the same setting an ACL file path is invalid. This setup is very likely to lead to configuration errors and security holes, please define either an ACL file or declare users directly in your redis.conf, but not both.".into());
    }
    crate::acl::users_from_config(&users)?;
    if let Some(path) = &cli.aclfile {
        // Checked here so a bad file stops the start before anything is opened.
        crate::server::acl_cmd::load_file(path)
            .map_err(|e| format!("Aborting Redis startup because of ACL errors: {e}"))?;
    }
    Ok(users)
}

/// CPUs in this process's affinity mask.
pub fn affinity_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it for pid 0 (us).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size we pass.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return (0..std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1))
            .collect();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `i` is below CPU_SETSIZE and `set` was initialised above.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

/// Parses a CPU list like `0-3,6`.
pub fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut v = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        if let Some((a, b)) = part.split_once('-') {
            let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
            if a > b {
                return None;
            }
            v.extend(a..=b);
        } else {
            v.push(part.parse().ok()?);
        }
    }
    if v.is_empty() {
        None
    } else {
        Some(v)
    }
}

impl Settings {
    /// Parses the process arguments (and the config file they name).
    pub fn from_args(args: Vec<String>) -> Result<Settings, String> {
        let first = Cli::try_parse_from(&args).map_err(|e| e.to_string())?;
        let mut merged = args.clone();
        if let Some(path) = &first.config_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
            let mut file_args = config_file_args(&text)?;
            // Repeatable options given on the command line replace the file's.
            for repeatable in ["--bind", "--data-file"] {
                if args
                    .iter()
                    .any(|a| a == repeatable || a.starts_with(&format!("{repeatable}=")))
                {
                    file_args.retain(|a| !a.starts_with(&format!("{repeatable}=")));
                }
            }
            let mut v = vec![args[0].clone()];
            v.extend(file_args);
            v.extend(args[1..].iter().cloned());
            merged = v;
        }
        let cli = Cli::try_parse_from(&merged).map_err(|e| e.to_string())?;
        Settings::validate(cli)
    }

    fn validate(cli: Cli) -> Result<Settings, String> {
        let mut cpus = match &cli.cpus {
            Some(s) => parse_cpu_list(s).ok_or_else(|| format!("invalid --cpus '{s}'"))?,
            None => affinity_cpus(),
        };
        if cpus.is_empty() {
            cpus.push(0);
        }
        let threads = cli.threads.unwrap_or(cpus.len());
        if threads == 0 || threads > 1024 {
            return Err(format!(
                "--threads must be between 1 and 1024, got {threads}"
            ));
        }
        match cli.storage.as_str() {
            "uring" => {}
            "spdk" if !build::HAS_NVME => return Err(build::refusal("--storage=spdk")),
            "spdk" => {}
            other => return Err(format!("--storage must be uring or spdk, got '{other}'")),
        }
        let dpdk = match cli.network.as_str() {
            "kernel" => None,
            "dpdk" if !build::HAS_DPDK => return Err(build::refusal("--network=dpdk")),
            "dpdk" => Some(dpdk_settings(
                &cli,
                std::env::var(EAL_ARGS_ENV).ok().as_deref(),
                std::env::var(DPDK_MEMORY_ENV).ok().as_deref(),
            )?),
            other => return Err(format!("--network must be kernel or dpdk, got '{other}'")),
        };
        let size_flag = |flag: &str, v: &str| {
            parse_memory(v)
                .filter(|&n| n >= 16 << 20)
                .ok_or_else(|| format!("invalid --{flag} '{v}' (at least 16mb)"))
        };
        let fixed_size_bytes = match &cli.data_file_size {
            Some(v) => Some(size_flag("data-file-size", v)?),
            None => None,
        };
        let max_size_bytes = match &cli.data_file_max_size {
            Some(v) => Some(size_flag("data-file-max-size", v)?),
            None => None,
        };
        let initial_size_bytes = size_flag("data-file-initial-size", &cli.data_file_initial_size)?;
        let grow_step_bytes = size_flag("data-file-grow-step", &cli.data_file_grow_step)?;
        let cache_size_bytes = parse_memory(&cli.cache_size)
            .ok_or_else(|| format!("invalid --cache-size '{}'", cli.cache_size))?;
        let mut output_limits = output_limits::OutputLimits::default();
        for g in &cli.client_output_buffer_limit {
            output_limits
                .apply(g)
                .map_err(|e| format!("--client-output-buffer-limit '{g}': {e}"))?;
        }
        if crate::commands::events::parse(&cli.notify_keyspace_events).is_none() {
            return Err(format!(
                "invalid --notify-keyspace-events '{}': Invalid event class character. Use 'Ag$lshzxeKEtmdn'.",
                cli.notify_keyspace_events
            ));
        }
        let client_query_buffer_limit_bytes = parse_memory(&cli.client_query_buffer_limit)
            .filter(|&n| n >= 1 << 20)
            .ok_or_else(|| {
                format!(
                    "invalid --client-query-buffer-limit '{}' (at least 1mb)",
                    cli.client_query_buffer_limit
                )
            })? as usize;
        let proto_max_bulk_len_bytes = parse_memory(&cli.proto_max_bulk_len)
            .filter(|&n| n >= 1 << 20)
            .ok_or_else(|| {
                format!(
                    "invalid --proto-max-bulk-len '{}' (at least 1mb)",
                    cli.proto_max_bulk_len
                )
            })? as usize;
        let protected_mode = parse_yes_no(&cli.protected_mode).ok_or_else(|| {
            format!(
                "--protected-mode takes yes or no, got '{}'",
                cli.protected_mode
            )
        })?;
        let direct_io = parse_yes_no(&cli.direct_io)
            .ok_or_else(|| format!("--direct-io takes yes or no, got '{}'", cli.direct_io))?;
        let blind_writes = parse_yes_no(&cli.blind_writes)
            .ok_or_else(|| format!("--blind-writes takes yes or no, got '{}'", cli.blind_writes))?;
        let appendfsync = parse_fsync(&cli.appendfsync).ok_or_else(|| {
            format!(
                "--appendfsync takes always, everysec or no, got '{}'",
                cli.appendfsync
            )
        })?;
        let binds = if cli.bind.is_empty() {
            vec!["127.0.0.1".to_string()]
        } else {
            cli.bind.clone()
        };
        let data_files = if cli.data_file.is_empty() {
            vec![PathBuf::from("lavik.data")]
        } else {
            cli.data_file.iter().map(PathBuf::from).collect()
        };
        for f in &data_files {
            let is_spdk = f.to_string_lossy().starts_with("spdk://");
            if is_spdk && !build::HAS_NVME {
                return Err(build::refusal(&format!("--data-file={}", f.display())));
            }
            if is_spdk && cli.storage != "spdk" {
                return Err(format!(
                    "{}: spdk:// data files need --storage=spdk",
                    f.display()
                ));
            }
            if !is_spdk && cli.storage == "spdk" {
                return Err(format!(
                    "--storage=spdk takes --data-file=spdk://BDF/NSID (e.g. spdk://0000:00:04.0/1), got {}",
                    f.display()
                ));
            }
        }
        // One data file and no fixed size: it grows. Several files keep the old default.
        let grows = fixed_size_bytes.is_none() && data_files.len() == 1 && cli.storage != "spdk";
        if !grows && max_size_bytes.is_some() {
            return Err(
                "--data-file-max-size applies to one growing data file: not with --data-file-size, several data files or --storage=spdk"
                    .into(),
            );
        }
        let data_file_growth =
            grows.then(|| crate::storage::GrowthConfig::with_step(grow_step_bytes, max_size_bytes));
        let data_file_size_bytes = match fixed_size_bytes {
            Some(n) => n,
            None if grows => initial_size_bytes,
            None => 1 << 30,
        };
        let acl_users = acl_users(&cli)?;
        let tls = tls::TlsSettings::from_cli(&cli)?;
        Ok(Settings {
            tls,
            acl_users,
            pin_workers: !cli.no_pin_workers,
            data_file_growth,
            config_file: cli
                .config_file
                .clone()
                .map(|p| std::fs::canonicalize(&p).unwrap_or(p)),
            binds,
            threads,
            cpus,
            data_files,
            data_file_size_bytes,
            cache_size_bytes,
            output_limits,
            client_query_buffer_limit_bytes,
            proto_max_bulk_len_bytes,
            protected_mode,
            appendfsync,
            direct_io,
            blind_writes,
            dpdk,
            cli,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(args: &[&str]) -> Result<Settings, String> {
        let mut v = vec!["lavik".to_string()];
        v.extend(args.iter().map(|s| s.to_string()));
        Settings::from_args(v)
    }

    // Defaults match the published ones.
    #[test]
    fn defaults() {
        let s = settings(&["--threads", "2"]).unwrap();
        assert_eq!(s.binds, vec!["127.0.0.1"]);
        assert_eq!(s.cli.port, 6379);
        assert_eq!(s.threads, 2);
        assert_eq!(s.cli.maxclients, 10000);
        assert_eq!(s.data_files, vec![PathBuf::from("lavik.data")]);
        assert!(s.pin_workers);
    }

    // A config file sets values, flags override it, unknown directives name their line.
    #[test]
    fn config_file_merging() {
        let dir = std::env::temp_dir().join(format!("lavik-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lavik.conf");
        std::fs::write(
            &path,
            "# comment\nport 7000\nbind 127.0.0.1 ::1\nappendfsync always\nsave \"\"\n",
        )
        .unwrap();
        let p = path.to_str().unwrap();
        let s = settings(&[p, "--threads", "1"]).unwrap();
        assert_eq!(s.cli.port, 7000);
        assert_eq!(s.binds, vec!["127.0.0.1", "::1"]);
        assert_eq!(s.appendfsync, crate::storage::FsyncPolicy::Always);
        let s = settings(&[p, "--port", "7001", "--bind", "0.0.0.0"]).unwrap();
        assert_eq!(s.cli.port, 7001);
        assert_eq!(s.binds, vec!["0.0.0.0"]);
        std::fs::write(&path, "port 7000\n\nfrobnicate yes\n").unwrap();
        let e = settings(&[p]).unwrap_err();
        assert!(e.contains("line 3") && e.contains("frobnicate"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    // Without --data-file-size the one data file grows (first size and step from the hidden
    // flags); a fixed size or several files do not, and a limit without growth is refused.
    #[test]
    fn data_file_grows_unless_sized() {
        let s = settings(&[]).unwrap();
        let g = s.data_file_growth.clone().unwrap();
        assert_eq!(s.data_file_size_bytes, 256 << 20);
        assert_eq!(g.step_bytes, 1 << 30);
        assert_eq!(g.max_bytes, None);
        let s = settings(&[
            "--data-file-initial-size",
            "32mb",
            "--data-file-grow-step",
            "16mb",
            "--data-file-max-size",
            "64mb",
        ])
        .unwrap();
        assert_eq!(s.data_file_size_bytes, 32 << 20);
        let g = s.data_file_growth.unwrap();
        assert_eq!((g.step_bytes, g.max_bytes), (16 << 20, Some(64 << 20)));
        let s = settings(&["--data-file-size", "2gb"]).unwrap();
        assert_eq!(
            (s.data_file_size_bytes, s.data_file_growth),
            (2 << 30, None)
        );
        let s = settings(&["--data-file", "a", "--data-file", "b"]).unwrap();
        assert_eq!(
            (s.data_file_size_bytes, s.data_file_growth),
            (1 << 30, None)
        );
        let e = settings(&["--data-file-size", "2gb", "--data-file-max-size", "4gb"]).unwrap_err();
        assert!(e.contains("--data-file-max-size"), "{e}");
        assert!(settings(&["--data-file-max-size", "1mb"]).is_err());
    }

    // Memory units and CPU lists parse like Redis and taskset.
    #[test]
    fn units_and_cpu_lists() {
        assert_eq!(parse_memory("1gb"), Some(1 << 30));
        assert_eq!(parse_memory("100"), Some(100));
        assert_eq!(parse_memory("5k"), Some(5000));
        assert_eq!(parse_memory("x"), None);
        assert_eq!(parse_cpu_list("0-2,5"), Some(vec![0, 1, 2, 5]));
        assert_eq!(parse_cpu_list("3-1"), None);
    }

    // Bad values are refused with a message, never silently defaulted.
    #[test]
    fn bad_values_refused() {
        assert!(settings(&["--appendfsync", "sometimes"]).is_err());
        assert!(settings(&["--threads", "0"]).is_err());
    }

    // A build without DPDK or the NVMe driver refuses those modes at start, naming its
    // variant; a build with them goes on to check their own settings.
    #[test]
    fn modes_left_out_of_the_build_are_refused() {
        let e = settings(&["--network", "dpdk"]).unwrap_err();
        if build::HAS_DPDK {
            assert!(e.contains("--dpdk-ip"), "{e}");
        } else {
            assert!(
                e.starts_with("--network=dpdk is not available in the ")
                    && e.contains(build::VARIANT),
                "{e}"
            );
        }
        let e = settings(&["--storage", "spdk", "--data-file", "spdk://0000:00:04.0/1"]);
        let e2 = settings(&["--data-file", "spdk://0000:00:04.0/1"]).unwrap_err();
        if build::HAS_NVME {
            assert!(e.is_ok(), "{e:?}");
            assert!(e2.contains("need --storage=spdk"), "{e2}");
        } else {
            let e = e.unwrap_err();
            assert!(
                e.starts_with("--storage=spdk is not available in the "),
                "{e}"
            );
            assert!(
                e2.starts_with("--data-file=spdk://0000:00:04.0/1 is not available"),
                "{e2}"
            );
        }
    }

    fn cli(args: &[&str]) -> Cli {
        let mut v = vec!["lavik"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).unwrap()
    }

    // DPDK flags parse into addresses; the flag's EAL args win over the environment's, and
    // the memory variable becomes `-m` only when the args do not size memory themselves.
    #[test]
    fn dpdk_settings_from_flags_and_env() {
        let c = cli(&[
            "--dpdk-eal-args",
            "--no-huge --vdev=net_tap0,iface=t0",
            "--dpdk-ip",
            "10.99.0.2/24",
            "--dpdk-gateway",
            "10.99.0.1",
            "--dpdk-port",
            "net_tap0",
            "--dpdk-mac",
            "02:00:00:00:00:07",
            "--port",
            "7000",
        ]);
        let d = dpdk_settings(&c, Some("--ignored"), Some("512")).unwrap();
        assert_eq!(
            d.eal_args,
            vec!["--no-huge", "--vdev=net_tap0,iface=t0", "-m", "512"]
        );
        assert_eq!(d.ip, std::net::Ipv4Addr::new(10, 99, 0, 2));
        assert_eq!(d.prefix_len, 24);
        assert_eq!(d.gateway, Some(std::net::Ipv4Addr::new(10, 99, 0, 1)));
        assert_eq!(d.port, Some(DpdkPort::Name("net_tap0".into())));
        assert_eq!(d.mac, Some([2, 0, 0, 0, 0, 7]));
        assert_eq!(d.listen_port, 7000);
        let c = cli(&["--dpdk-ip", "10.0.0.1/8", "--dpdk-port", "1"]);
        let d = dpdk_settings(&c, Some("-l 0 -m 256"), Some("512")).unwrap();
        assert_eq!(d.eal_args, vec!["-l", "0", "-m", "256"]);
        assert_eq!(d.port, Some(DpdkPort::Id(1)));
        assert_eq!(d.gateway, None);
    }

    // Missing or malformed DPDK values are refused with the flag's name.
    #[test]
    fn dpdk_settings_refuse_bad_values() {
        let e = dpdk_settings(&cli(&[]), None, None).unwrap_err();
        assert!(e.contains("--dpdk-ip"), "{e}");
        for bad in ["10.0.0.1", "10.0.0.1/33", "10.0.0.1/0", "10.0.0/24"] {
            let e = dpdk_settings(&cli(&["--dpdk-ip", bad]), None, None).unwrap_err();
            assert!(e.contains("--dpdk-ip"), "{bad}: {e}");
        }
        let ok = ["--dpdk-ip", "10.0.0.1/24"];
        let e = dpdk_settings(
            &cli(&[&ok[..], &["--dpdk-mac", "01:00:5e:00:00:01"]].concat()),
            None,
            None,
        )
        .unwrap_err();
        assert!(e.contains("--dpdk-mac"), "{e}");
        let e = dpdk_settings(
            &cli(&[&ok[..], &["--dpdk-gateway", "x"]].concat()),
            None,
            None,
        )
        .unwrap_err();
        assert!(e.contains("--dpdk-gateway"), "{e}");
        let e = dpdk_settings(&cli(&ok), None, Some("lots")).unwrap_err();
        assert!(e.contains(DPDK_MEMORY_ENV), "{e}");
        let e = dpdk_settings(&cli(&[&ok[..], &["--port", "0"]].concat()), None, None).unwrap_err();
        assert!(e.contains("--port"), "{e}");
    }

    // The config file the packages install is accepted line by line and means what its
    // comments say (a directive lavik refuses would stop the packaged service at start).
    #[test]
    fn packaged_config_file_is_valid() {
        let text = include_str!("../../tools/packaging/lavik.conf");
        let mut args = vec!["lavik".to_string()];
        args.extend(config_file_args(text).unwrap());
        let s = Settings::validate(Cli::try_parse_from(&args).unwrap()).unwrap();
        assert_eq!(s.binds, vec!["127.0.0.1"]);
        assert_eq!(s.cli.port, 6379);
        assert_eq!(
            s.data_files,
            vec![PathBuf::from("/var/lib/lavik/lavik.data")]
        );
        assert_eq!(s.appendfsync, crate::storage::FsyncPolicy::EverySec);
        assert!(s.protected_mode);
        assert!(s.dpdk.is_none());
        // Its commented-out directives are real ones too: uncommented, they still parse.
        let uncommented: String = text
            .lines()
            .filter_map(|l| l.strip_prefix("# "))
            .filter(|l| {
                let name = l.split_whitespace().next().unwrap_or("");
                FLAG_DIRECTIVES.contains(&name) && !name.starts_with("dpdk")
            })
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(uncommented.lines().count() >= 10, "{uncommented}");
        config_file_args(&uncommented).unwrap();
    }

    // Config-file directives reach the DPDK flags under the same names.
    #[test]
    fn dpdk_directives_map_to_flags() {
        let args = config_file_args(
            "dpdk-eal-args \"--no-huge -m 512\"\ndpdk-ip 10.99.0.2/24\ndpdk-port 0\n",
        )
        .unwrap();
        assert_eq!(
            args,
            vec![
                "--dpdk-eal-args=--no-huge -m 512",
                "--dpdk-ip=10.99.0.2/24",
                "--dpdk-port=0"
            ]
        );
        let c = cli(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(c.dpdk_eal_args.as_deref(), Some("--no-huge -m 512"));
    }

    // notify-keyspace-events from a config file (`""` too) or a flag; a bad class letter is
    // refused at start with Redis's hint.
    #[test]
    fn notify_keyspace_events_setting() {
        let args = config_file_args("notify-keyspace-events KEA\n").unwrap();
        assert_eq!(args, vec!["--notify-keyspace-events=KEA"]);
        let args = config_file_args("notify-keyspace-events \"\"\n").unwrap();
        let s = settings(&[args[0].as_str()]).unwrap();
        assert_eq!(s.cli.notify_keyspace_events, "");
        let s = settings(&["--notify-keyspace-events", "Ex"]).unwrap();
        assert_eq!(s.cli.notify_keyspace_events, "Ex");
        let e = settings(&["--notify-keyspace-events", "Kq"]).unwrap_err();
        assert!(e.contains("Invalid event class character"), "{e}");
    }

    // A `user` line becomes one --user flag whose words split back exactly, quotes included.
    #[test]
    fn user_lines_round_trip() {
        let args = config_file_args(
            "user alice on \">two words\" 'q\"x' ~k* (+get ~s*)\naclfile users.acl\n",
        )
        .unwrap();
        assert_eq!(args[1], "--aclfile=users.acl");
        let value = args[0].strip_prefix("--user=").unwrap();
        let words = split_args(value.as_bytes()).unwrap();
        let expected: Vec<&[u8]> = vec![
            b"alice",
            b"on",
            b">two words",
            b"q\"x",
            b"~k*",
            b"(+get",
            b"~s*)",
        ];
        assert_eq!(words, expected);
    }

    // Users in both the config and an ACL file are refused, as Redis refuses them.
    #[test]
    fn users_and_aclfile_exclusive() {
        let e = settings(&["--user", "x on", "--aclfile", "/nonexistent.acl"]).unwrap_err();
        assert!(e.contains("please define either an ACL file"), "{e}");
        let s = settings(&["--user", "x on >p", "--user", "y"]).unwrap();
        assert_eq!(s.acl_users.len(), 2);
    }
}
