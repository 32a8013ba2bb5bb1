//! Starting, probing and stopping one server under test, and sampling its resource use.
//!
//! The server runs as `sh -c "exec taskset -c CPUS COMMAND"`: both `sh` and `taskset` exec,
//! so the child's PID is the server's and `/proc/PID/stat` measures the server itself.

use super::config::ServerSpec;
use crate::resp::{encode_command, scan_reply, ReplyKind};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Recovery of a big store takes minutes; the server answers -LOADING meanwhile.
const START_TIMEOUT: Duration = Duration::from_secs(600);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// A running server under test.
pub struct Server {
    pub spec: ServerSpec,
    child: Child,
    /// The exact command line used, for the report.
    pub launched: String,
}

/// A blocking one-request-at-a-time RESP client for probes (PING, DBSIZE, INFO, ...).
pub struct Probe {
    stream: TcpStream,
    buf: Vec<u8>,
}

/// A decoded probe reply (only the shapes the sweep needs).
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Text(String),
    Integer(i64),
    Nil,
    Error(String),
}

impl Probe {
    pub fn connect(port: u16) -> std::io::Result<Self> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(REPLY_TIMEOUT))?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buf: Vec::new(),
        })
    }

    pub fn call(&mut self, args: &[&str]) -> std::io::Result<Reply> {
        let mut req = Vec::new();
        let raw: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        encode_command(&mut req, &raw);
        self.stream.write_all(&req)?;
        let mut chunk = [0u8; 16 * 1024];
        loop {
            let scanned = scan_reply(&self.buf)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.0))?;
            if let Some((len, kind)) = scanned {
                let reply = decode(&self.buf[..len], kind);
                self.buf.drain(..len);
                return Ok(reply);
            }
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Decode a complete scalar reply. Aggregates are not needed by the sweep.
fn decode(bytes: &[u8], kind: ReplyKind) -> Reply {
    let text = String::from_utf8_lossy(bytes);
    match (kind, bytes.first()) {
        (ReplyKind::Nil, _) => Reply::Nil,
        (ReplyKind::Error, _) => Reply::Error(text.trim_end().trim_start_matches('-').into()),
        (_, Some(b':')) => text[1..]
            .trim_end()
            .parse()
            .map_or(Reply::Error(text.into()), Reply::Integer),
        (_, Some(b'$')) => {
            let body = text.split_once("\r\n").map_or("", |(_, b)| b);
            Reply::Text(body.strip_suffix("\r\n").unwrap_or(body).to_string())
        }
        _ => Reply::Text(text[1..].trim_end().to_string()),
    }
}

/// `used_memory:` from an INFO memory reply.
pub fn info_field(info: &str, field: &str) -> Option<u64> {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

impl Server {
    pub fn start(
        spec: &ServerSpec,
        cpus: &str,
        log_path: &std::path::Path,
    ) -> Result<Self, String> {
        let launched = if cpus.is_empty() {
            spec.command.clone()
        } else {
            format!("taskset -c {cpus} {}", spec.command)
        };
        let log = std::fs::File::create(log_path)
            .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("exec {launched}"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", spec.name))?;
        let mut server = Self {
            spec: spec.clone(),
            child,
            launched,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!(
                    "{} exited at start ({status}); see {}",
                    spec.name,
                    log_path.display()
                ));
            }
            let pong = Probe::connect(spec.port).and_then(|mut p| p.call(&["PING"]));
            if matches!(pong, Ok(Reply::Text(ref t)) if t == "PONG") {
                return Ok(server);
            }
            if Instant::now() > deadline {
                server.stop();
                return Err(format!(
                    "{} did not answer PING within {START_TIMEOUT:?}",
                    spec.name
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, wait, then SIGKILL if it does not go.
    pub fn stop(&mut self) {
        // `kill` is the portable way to send SIGTERM without `unsafe` here.
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// CPU seconds the server has used so far and seconds its threads spent runnable but
    /// waiting for a CPU, summed over its current threads from `/proc/PID/task/*/schedstat`
    /// (nanoseconds; a busy machine shows as wait). Without schedstat: utime + stime from
    /// `/proc/PID/stat` (10 ms ticks) and no wait figure.
    pub fn cpu_times(&self, clock_ticks_per_sec: f64) -> Result<(f64, Option<f64>), String> {
        match task_schedstat_seconds(self.pid()) {
            Some((on_cpu, wait)) => Ok((on_cpu, Some(wait))),
            None => Ok((self.cpu_seconds(clock_ticks_per_sec)?, None)),
        }
    }

    /// User + system CPU seconds the server has used so far.
    pub fn cpu_seconds(&self, clock_ticks_per_sec: f64) -> Result<f64, String> {
        let path = format!("/proc/{}/stat", self.pid());
        let stat = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        let ticks =
            parse_stat_cpu_ticks(&stat).ok_or_else(|| format!("{path}: unexpected format"))?;
        Ok(ticks as f64 / clock_ticks_per_sec)
    }

    /// Resident set size in KiB.
    pub fn rss_kib(&self) -> Result<u64, String> {
        let path = format!("/proc/{}/status", self.pid());
        let status = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        parse_status_rss_kib(&status).ok_or_else(|| format!("{path}: no VmRSS"))
    }
}

/// (seconds on a CPU, seconds runnable and waiting) summed over a process's threads.
fn task_schedstat_seconds(pid: u32) -> Option<(f64, f64)> {
    let mut on_cpu = 0u64;
    let mut wait = 0u64;
    let mut threads = 0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(entry) = entry else { continue };
        // A thread may exit between listing and reading; it is simply not counted.
        let Ok(text) = std::fs::read_to_string(entry.path().join("schedstat")) else {
            continue;
        };
        let (run, waited) = parse_schedstat(&text)?;
        on_cpu += run;
        wait += waited;
        threads += 1;
    }
    (threads > 0).then(|| (on_cpu as f64 / 1e9, wait as f64 / 1e9))
}

/// `/proc/.../schedstat`: nanoseconds on CPU, nanoseconds waiting on a run queue, slices.
pub fn parse_schedstat(text: &str) -> Option<(u64, u64)> {
    let mut fields = text.split_whitespace().map(|f| f.parse::<u64>());
    Some((fields.next()?.ok()?, fields.next()?.ok()?))
}

/// utime + stime (fields 14 and 15) from `/proc/PID/stat`. The command name (field 2) may
/// contain spaces and parentheses, so fields are counted after the last ')'.
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    Some(stat_field(stat, 14)? + stat_field(stat, 15)?)
}

/// cutime + cstime (fields 16 and 17): CPU of children that have been waited for.
pub fn parse_stat_children_cpu_ticks(stat: &str) -> Option<u64> {
    Some(stat_field(stat, 16)? + stat_field(stat, 17)?)
}

/// Numeric field `n` (1-based, as in proc(5)) of a stat line.
fn stat_field(stat: &str, n: usize) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    // `after` starts at field 3 (state), so field N is at index N - 3.
    after.split_whitespace().nth(n - 3)?.parse().ok()
}

/// CPU seconds of this process's finished, waited-for children (e.g. redis-benchmark).
pub fn children_cpu_seconds(clock_ticks_per_sec: f64) -> Result<f64, String> {
    let stat = std::fs::read_to_string("/proc/self/stat").map_err(|e| e.to_string())?;
    let ticks = parse_stat_children_cpu_ticks(&stat).ok_or("/proc/self/stat: unexpected format")?;
    Ok(ticks as f64 / clock_ticks_per_sec)
}

/// User + system CPU seconds of this process (all its threads, not its children).
pub fn own_cpu_seconds(clock_ticks_per_sec: f64) -> Result<f64, String> {
    let stat = std::fs::read_to_string("/proc/self/stat").map_err(|e| e.to_string())?;
    let ticks = parse_stat_cpu_ticks(&stat).ok_or("/proc/self/stat: unexpected format")?;
    Ok(ticks as f64 / clock_ticks_per_sec)
}

pub fn parse_status_rss_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Kernel clock ticks per second for /proc CPU times (USER_HZ; 100 on Linux in practice).
pub fn clock_ticks_per_sec() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves CPU ticks are read from the right fields even with ") " inside the name.
    #[test]
    fn stat_fields() {
        let stat = "1234 (weird) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 \
                    250 75 0 0 20 0 4 0 1000 1000000 500 18446744073709551615";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(325));
        assert_eq!(parse_stat_children_cpu_ticks(stat), Some(0));
        let with_children = stat.replace(" 250 75 0 0 ", " 250 75 30 12 ");
        assert_eq!(parse_stat_children_cpu_ticks(&with_children), Some(42));
        assert_eq!(parse_stat_cpu_ticks("1 (x) S 1"), None);
    }

    // Proves schedstat's run and wait nanoseconds are read, and a short line is rejected;
    // and that this very process's threads can be summed.
    #[test]
    fn schedstat_fields() {
        assert_eq!(
            parse_schedstat("617990 4823575 3\n"),
            Some((617990, 4823575))
        );
        assert_eq!(parse_schedstat("12\n"), None);
        let me = task_schedstat_seconds(std::process::id()).expect("schedstat readable");
        assert!(me.0 > 0.0 && me.1 >= 0.0, "{me:?}");
    }

    // Proves VmRSS is extracted in KiB.
    #[test]
    fn status_rss() {
        let status = "Name:\tredis-server\nVmPeak:\t  99 kB\nVmRSS:\t    8812 kB\nThreads:\t5\n";
        assert_eq!(parse_status_rss_kib(status), Some(8812));
        assert_eq!(parse_status_rss_kib("Name: x\n"), None);
    }

    // Proves probe replies decode to the values DBSIZE/STRLEN/INFO/errors carry.
    #[test]
    fn decodes_replies() {
        assert_eq!(decode(b":42\r\n", ReplyKind::Value), Reply::Integer(42));
        assert_eq!(
            decode(b"+PONG\r\n", ReplyKind::Value),
            Reply::Text("PONG".into())
        );
        assert_eq!(decode(b"$-1\r\n", ReplyKind::Nil), Reply::Nil);
        assert_eq!(
            decode(b"$5\r\na\r\nbc\r\n", ReplyKind::Value),
            Reply::Text("a\r\nbc".into())
        );
        assert_eq!(
            decode(b"-ERR no\r\n", ReplyKind::Error),
            Reply::Error("ERR no".into())
        );
        let info = "# Memory\r\nused_memory:123456\r\nused_memory_human:120K\r\n";
        assert_eq!(info_field(info, "used_memory"), Some(123456));
        assert_eq!(info_field(info, "used_memory_rss"), None);
    }
}
