//! `--network=dpdk` end to end: the real `lavik` binary serves clients through a DPDK tap
//! port and our userspace TCP stack, and ordinary kernel clients talk to it.
//!
//! Layout: the outer process (root namespace) creates `lvk-e2e-<pid>` and re-executes
//! itself inside it (`ip netns exec`, with a raised open-file limit); the inner process
//! starts lavik (whose DPDK tap `lvkt0` appears in the namespace), gives the kernel side
//! 10.99.0.1/24, and runs the checks against 10.99.0.2:6379. Guards kill only the lavik
//! this test started (by PID) and delete the namespace, also when a check fails.
//!
//! Needs root; prints `SKIP` and passes when not root. Built only with `--features dpdk`.
//! Run: `cargo test --release --features dpdk --test dpdk_e2e`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const INSIDE_ENV: &str = "LVK_E2E_NETNS";
const TAP: &str = "lvkt0";
const SERVER_IP: &str = "10.99.0.2";
const CLIENT_CIDR: &str = "10.99.0.1/24";
const SERVER: &str = "10.99.0.2:6379";
/// The whole inner run must end within this (it normally takes 10-30 s).
const RUN_LIMIT: Duration = Duration::from_secs(150);
const READY_LIMIT: Duration = Duration::from_secs(30);
const CONNECTIONS: usize = 1000;
/// Size of the value moved each way over the lossy link, and the time allowed for it.
const LOSSY_VALUE_BYTES: usize = 4 << 20;
const LOSSY_LIMIT: Duration = Duration::from_secs(45);
const FAULTS: &str = "seed=7,loss=2,dup=1,reorder=3,delay_us=300";

fn main() {
    match std::env::var(INSIDE_ENV) {
        Ok(netns) => inside(&netns),
        Err(_) => outside(),
    }
}

// ----- outer process: namespace lifetime --------------------------------------------

/// Deletes the namespace and kills what still runs in it (only our lavik can: the
/// namespace is private to this test run).
struct NetnsGuard(String);

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if let Ok(out) = Command::new("ip").args(["netns", "pids", &self.0]).output() {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
        }
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn outside() {
    let uid = Command::new("id").arg("-u").output().expect("run id -u");
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        println!("SKIP dpdk_e2e: needs root (network namespace, tap device)");
        return;
    }
    let netns = format!("lvk-e2e-{}", std::process::id());
    run_ok("ip", &["netns", "add", &netns]);
    let _guard = NetnsGuard(netns.clone());
    let exe = std::env::current_exe().expect("test executable path");
    // `ulimit -n` in a shell rather than setrlimit here: no unsafe code in tests.
    let mut child = Command::new("ip")
        .args([
            "netns",
            "exec",
            &netns,
            "sh",
            "-c",
            "ulimit -n 8192 && exec \"$0\"",
        ])
        .arg(&exe)
        .env(INSIDE_ENV, &netns)
        .spawn()
        .expect("start the inner test process");
    let deadline = Instant::now() + RUN_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the inner test") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("dpdk_e2e did not finish within {RUN_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "inner test failed: {status}");
    println!("dpdk_e2e: all checks passed");
}

// ----- inner process: lavik and the checks -------------------------------------------

/// A lavik we started; killed by PID on drop (a failed check must not leave it running).
struct Lavik {
    child: Child,
    log: PathBuf,
}

impl Lavik {
    fn start(dir: &Path, faults: Option<&str>) -> Lavik {
        let log = dir.join(if faults.is_some() {
            "lossy.log"
        } else {
            "clean.log"
        });
        let log_file = std::fs::File::create(&log).expect("create log file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lavik"));
        cmd.args([
            "--network=dpdk",
            "--dpdk-eal-args",
            &format!(
                "-l 0 --no-huge --no-pci --no-shconf --no-telemetry -m 512 --vdev=net_tap0,iface={TAP}"
            ),
            "--dpdk-ip",
            &format!("{SERVER_IP}/24"),
            "--data-file",
        ])
        .arg(dir.join("data"))
        .args([
            "--data-file-size",
            "1gb",
            "--threads",
            "2",
            "--no-pin-workers",
            "--protected-mode",
            "no",
            // The lossy run also has every reply to a write wait for its fdatasync
            // (group commit holds replies; the stack must still send them).
            "--appendfsync",
            if faults.is_some() { "always" } else { "everysec" },
        ])
        .stdout(Stdio::null())
        .stderr(log_file);
        cmd.env_remove("LAVIK_DPDK_FAULTS");
        if let Some(spec) = faults {
            cmd.env("LAVIK_DPDK_FAULTS", spec);
        }
        let child = cmd.spawn().expect("start lavik");
        let mut lavik = Lavik { child, log };
        lavik.wait_ready();
        lavik
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn check_alive(&mut self) {
        if let Some(status) = self.child.try_wait().expect("poll lavik") {
            panic!("lavik exited ({status}); log:\n{}", self.log_text());
        }
    }

    /// Waits for the tap, configures the kernel side, then waits for PONG.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + READY_LIMIT;
        loop {
            self.check_alive();
            let up = Command::new("ip")
                .args(["link", "show", TAP])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if up {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "tap {TAP} never appeared; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        run_ok("ip", &["addr", "add", CLIENT_CIDR, "dev", TAP]);
        run_ok("ip", &["link", "set", TAP, "up"]);
        run_ok("ip", &["link", "set", "lo", "up"]);
        loop {
            self.check_alive();
            if let Ok(mut c) = Client::connect(Duration::from_millis(500)) {
                if c.command(&[b"PING"]).ok().as_deref() == Some(b"+PONG\r\n".as_slice()) {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "lavik never answered PING; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, wait for a clean exit, return its log.
    fn stop(mut self) -> String {
        run_ok("kill", &["-TERM", &self.child.id().to_string()]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().expect("poll lavik").is_none() {
            assert!(Instant::now() < deadline, "lavik did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
        self.log_text()
    }
}

impl Drop for Lavik {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn inside(netns: &str) {
    let started = Instant::now();
    let dir = std::env::temp_dir().join(netns);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");

    let lavik = Lavik::start(&dir, None);
    println!("lavik up over DPDK after {:.1?}", started.elapsed());
    redis_cli_commands(&dir);
    println!("redis-cli checks passed ({:.1?})", started.elapsed());
    copy_counters();
    println!("copy counters passed ({:.1?})", started.elapsed());
    slow_reader();
    println!("slow reader passed ({:.1?})", started.elapsed());
    redis_benchmark();
    println!("redis-benchmark passed ({:.1?})", started.elapsed());
    quit_and_maxclients();
    many_connections();
    println!(
        "{CONNECTIONS} connections passed ({:.1?})",
        started.elapsed()
    );
    // A client still connected at SIGTERM does not keep lavik from stopping. (The stack
    // also sends it a reset on the way out, but the tap device may vanish with the frame
    // still queued, so hearing it is not asserted: a timing-dependent check would make
    // the test flaky.)
    let mut lingering = Client::connect(Duration::from_secs(5)).expect("lingering client");
    assert_eq!(lingering.command(&[b"PING"]).expect("PING"), b"+PONG\r\n");
    let log = lavik.stop();
    assert!(log.contains("lavik stopped"), "no clean stop; log:\n{log}");
    drop(lingering);

    let lavik = Lavik::start(&dir, Some(FAULTS));
    lossy_transfer();
    let log = lavik.stop();
    check_faults_happened(&log);
    println!("lossy transfer passed ({:.1?} in all)", started.elapsed());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Representative commands through redis-cli, replies compared exactly.
fn redis_cli_commands(dir: &Path) {
    let cases: &[(&[&str], &str)] = &[
        (&["PING"], "PONG"),
        (&["SET", "greeting", "hello dpdk"], "OK"),
        (&["GET", "greeting"], "hello dpdk"),
        (&["INCR", "counter"], "1"),
        (&["INCR", "counter"], "2"),
        (&["INCRBY", "counter", "40"], "42"),
        (&["MSET", "a", "1", "b", "2", "c", "3"], "OK"),
        (&["MGET", "a", "b", "c", "missing"], "1\n2\n3\n"),
        (&["DEL", "a", "b", "missing"], "2"),
        (&["EXISTS", "a", "c"], "1"),
        (&["EXPIRE", "greeting", "100"], "1"),
        (&["GET", "nosuchkey"], ""),
    ];
    for (args, want) in cases {
        assert_eq!(redis_cli(args, None), *want, "redis-cli {args:?}");
    }
    let ttl: u32 = redis_cli(&["TTL", "greeting"], None)
        .parse()
        .expect("TTL is a number");
    assert!((95..=100).contains(&ttl), "TTL {ttl}");
    // 1 MiB value in through stdin (-x) and back out.
    let big = pattern(1 << 20, 1);
    let path = dir.join("big");
    std::fs::write(&path, &big).expect("write big value");
    let stdin = std::fs::File::open(&path).expect("open big value");
    assert_eq!(redis_cli(&["-x", "SET", "big"], Some(stdin)), "OK");
    assert_eq!(redis_cli(&["STRLEN", "big"], None), (1 << 20).to_string());
    let got = redis_cli(&["GET", "big"], None);
    assert!(got.as_bytes() == big.as_slice(), "1 MiB value differs");
    let info = redis_cli(&["INFO"], None);
    assert!(info.contains("connected_clients:1"), "INFO:\n{info}");
    let clients = redis_cli(&["CLIENT", "LIST"], None);
    assert!(
        clients.contains("addr=10.99.0.1:") && clients.contains("laddr=10.99.0.2:6379"),
        "CLIENT LIST: {clients}"
    );
}

/// `INFO stats` on `c`: the `lavik_*` counters, and the reply's length on the wire.
fn lavik_counters(c: &mut Client) -> (Vec<(String, u64)>, usize) {
    let reply = c.command(&[b"INFO", b"stats"]).expect("INFO stats");
    let text = String::from_utf8_lossy(&reply);
    let fields = text
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((
                k.strip_prefix("lavik_")?.to_string(),
                v.trim().parse().ok()?,
            ))
        })
        .collect();
    (fields, reply.len())
}

fn counter(fields: &[(String, u64)], name: &str) -> u64 {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no lavik_{name} in INFO stats"))
        .1
}

/// INFO's copy counters on the DPDK path (`runtime::copies`), from one connection so the
/// deltas are exact: what was received (the requests and the second INFO's) and handed to
/// the stack (the first INFO's reply and the replies between); each received byte copied
/// once (mbuf → `inbuf`, delivered directly) or twice (through the stack's ring), each
/// sent byte at least twice (into the send ring, into a frame; more if retransmitted);
/// nothing counted for kernel sockets. Then the idle loop backs off
/// (`lavik_dpdk_idle_waits` grows while nothing is sent).
fn copy_counters() {
    const KEYS: usize = 50;
    let mut c = Client::connect(Duration::from_secs(5)).expect("connect");
    let (before, first_reply) = lavik_counters(&mut c);
    let value = vec![b'v'; 1024];
    let request = |args: &[&[u8]]| {
        let mut n = format!("*{}\r\n", args.len()).len();
        for a in args {
            n += format!("${}\r\n", a.len()).len() + a.len() + 2;
        }
        n
    };
    let (mut requests, mut replies) = (0, 0);
    for i in 0..KEYS {
        let key = format!("copy:{i}");
        let args: [&[u8]; 3] = [b"SET", key.as_bytes(), &value];
        requests += request(&args);
        let reply = c.command(&args).expect("SET");
        assert_eq!(reply, b"+OK\r\n");
        replies += reply.len();
    }
    let set_requests = requests;
    for i in 0..KEYS {
        let key = format!("copy:{i}");
        let args: [&[u8]; 2] = [b"GET", key.as_bytes()];
        requests += request(&args);
        let reply = c.command(&args).expect("GET");
        assert_eq!(reply.len(), 1024 + 9, "GET {key}");
        replies += reply.len();
    }
    requests += request(&[b"INFO", b"stats"]);
    let (after, _) = lavik_counters(&mut c);
    let delta = |name: &str| counter(&after, name) - counter(&before, name);
    let (rx, rx_copied, direct) = (
        delta("dpdk_rx_bytes"),
        delta("dpdk_rx_copied_bytes"),
        delta("dpdk_rx_direct_bytes"),
    );
    let (tx, tx_copied) = (delta("dpdk_tx_bytes"), delta("dpdk_tx_copied_bytes"));
    assert_eq!(rx, requests as u64, "bytes received");
    assert!(direct > 0 && direct <= rx, "direct {direct} of {rx}");
    assert_eq!(rx_copied, direct + 2 * (rx - direct), "receive copies");
    assert_eq!(tx, (first_reply + replies) as u64, "bytes sent");
    assert!(
        tx_copied >= 2 * tx,
        "send copies {tx_copied} for {tx} bytes"
    );
    for name in ["kernel_rx_bytes", "kernel_tx_bytes"] {
        assert_eq!(counter(&after, name), 0, "{name}");
    }
    let get_requests = requests - set_requests;
    println!(
        "DPDK copies: received {rx} B ({direct} B direct), copied {rx_copied} B; sent {tx} B, \
         copied {tx_copied} B; per SET ~{} B in, per GET ~{} B in and ~{} B out (x2)",
        set_requests / KEYS,
        get_requests / KEYS,
        1024 + 9
    );
    // Idle: the loop waits in the ring once rounds stay idle for --busy-poll-us.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let (now, _) = lavik_counters(&mut c);
        if counter(&now, "dpdk_idle_waits") > counter(&after, "dpdk_idle_waits") {
            assert!(counter(&now, "dpdk_idle_wait_us") > counter(&after, "dpdk_idle_wait_us"));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the idle DPDK loop never backed off"
        );
    }
}

/// A client that sends many large GETs before reading anything: others are served
/// meanwhile, and once it reads, every reply arrives intact (output held back in the
/// server while the stack's send ring is full is sent as the ring drains).
fn slow_reader() {
    const GETS: usize = 100;
    let big = pattern(1 << 20, 1);
    let mut slow = Client::connect(Duration::from_secs(5)).expect("connect");
    let request = b"*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n".repeat(GETS);
    slow.stream
        .write_all(&request)
        .expect("send pipelined GETs");
    let mut other = Client::connect(Duration::from_secs(5)).expect("connect");
    assert_eq!(other.command(&[b"PING"]).expect("PING"), b"+PONG\r\n");
    let header = format!("${}\r\n", big.len());
    let mut reply = vec![0u8; header.len() + big.len() + 2];
    for i in 0..GETS {
        slow.reader
            .read_exact(&mut reply)
            .unwrap_or_else(|e| panic!("reply {i}: {e}"));
        assert!(reply.starts_with(header.as_bytes()), "reply {i} header");
        assert!(
            reply[header.len()..header.len() + big.len()] == big[..],
            "reply {i} body"
        );
    }
}

/// redis-benchmark with pipelining and 50 clients: every test completes without errors.
fn redis_benchmark() {
    let out = Command::new("timeout")
        .args(["60", "redis-benchmark", "-h", SERVER_IP])
        .args([
            "-t",
            "set,get,incr,mset,ping",
            "-n",
            "20000",
            "-r",
            "100000",
        ])
        .args(["-d", "1024", "-P", "16", "-c", "50", "--csv"])
        .output()
        .expect("run redis-benchmark");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "redis-benchmark failed: {}\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        !stdout.contains("ERR") && !stderr.contains("ERR") && !stderr.contains("rror"),
        "redis-benchmark reported errors:\n{stdout}\n{stderr}"
    );
    for test in [
        "PING_INLINE",
        "PING_MBULK",
        "SET",
        "GET",
        "INCR",
        "MSET (10 keys)",
    ] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("\"{test}\",")))
            .unwrap_or_else(|| panic!("no result for {test}:\n{stdout}\n{stderr}"));
        let rps: f64 = line
            .split(',')
            .nth(1)
            .and_then(|v| v.trim_matches('"').parse().ok())
            .unwrap_or_else(|| panic!("unparsable result line: {line}"));
        assert!(rps > 0.0, "{line}");
        println!("  {line}");
    }
}

/// QUIT answers +OK and then closes; maxclients refuses the client beyond it, as Redis.
fn quit_and_maxclients() {
    let mut c = Client::connect(Duration::from_secs(5)).expect("connect");
    assert_eq!(c.command(&[b"QUIT"]).expect("QUIT"), b"+OK\r\n");
    let mut rest = Vec::new();
    c.reader.read_to_end(&mut rest).expect("EOF after QUIT");
    assert!(rest.is_empty(), "bytes after QUIT: {rest:?}");

    let mut admin = Client::connect(Duration::from_secs(5)).expect("connect");
    // Earlier clients (redis-benchmark's, the QUIT one) may still be closing on the server
    // side: wait until the admin connection is the only one before counting.
    wait_for_clients(&mut admin, 1);
    let set = |admin: &mut Client, n: &[u8]| {
        let reply = admin.command(&[b"CONFIG", b"SET", b"maxclients", n]);
        assert_eq!(reply.expect("CONFIG SET"), b"+OK\r\n");
    };
    set(&mut admin, b"2");
    let mut second = Client::connect(Duration::from_secs(5)).expect("second client");
    assert_eq!(second.command(&[b"PING"]).expect("PING"), b"+PONG\r\n");
    let mut third = Client::connect(Duration::from_secs(5)).expect("third client connects");
    let mut refusal = Vec::new();
    third
        .reader
        .read_to_end(&mut refusal)
        .expect("refusal then EOF");
    assert_eq!(refusal, b"-ERR max number of clients reached\r\n");
    set(&mut admin, b"10000");
}

/// 1,000 clients at once: each is served, and all are released when they leave.
fn many_connections() {
    let mut watcher = Client::connect(Duration::from_secs(5)).expect("watcher connects");
    let mut conns = Vec::with_capacity(CONNECTIONS);
    for i in 0..CONNECTIONS {
        let c = Client::connect(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("connection {i} failed: {e}"));
        conns.push(c);
    }
    for c in conns.iter_mut() {
        c.stream.write_all(b"PING\r\n").expect("send PING");
    }
    for (i, c) in conns.iter_mut().enumerate() {
        let mut reply = [0u8; 7];
        c.stream
            .read_exact(&mut reply)
            .unwrap_or_else(|e| panic!("connection {i}: {e}"));
        assert_eq!(&reply, b"+PONG\r\n", "connection {i}");
    }
    // Earlier phases' clients may still be closing: poll rather than read once.
    wait_for_clients(&mut watcher, CONNECTIONS + 1);
    for c in conns.iter() {
        let _ = c.stream.shutdown(Shutdown::Both);
    }
    drop(conns);
    wait_for_clients(&mut watcher, 1);
    assert_eq!(watcher.command(&[b"PING"]).expect("PING"), b"+PONG\r\n");
}

/// Polls `INFO clients` until `connected_clients` is `want` (20 s at most).
fn wait_for_clients(watcher: &mut Client, want: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n = connected_clients(watcher);
        if n == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "connected_clients stuck at {n}, want {want}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Multi-MiB values both ways over a link that drops, duplicates and reorders frames.
fn lossy_transfer() {
    let started = Instant::now();
    let mut c = Client::connect(Duration::from_secs(10)).expect("connect over the lossy link");
    c.stream
        .set_read_timeout(Some(LOSSY_LIMIT))
        .expect("timeout");
    let value = pattern(LOSSY_VALUE_BYTES, 2);
    assert_eq!(
        c.command(&[b"SET", b"lossy", &value]).expect("SET"),
        b"+OK\r\n"
    );
    let set_done = started.elapsed();
    let reply = c.command(&[b"GET", b"lossy"]).expect("GET");
    let header = format!("${}\r\n", value.len());
    assert!(reply.starts_with(header.as_bytes()), "GET reply header");
    assert!(
        reply[header.len()..reply.len() - 2] == value[..],
        "value came back different"
    );
    let elapsed = started.elapsed();
    assert!(elapsed < LOSSY_LIMIT, "lossy transfer took {elapsed:?}");
    println!(
        "  {} MiB each way with faults {FAULTS}: SET {set_done:.1?}, SET+GET {elapsed:.1?}",
        LOSSY_VALUE_BYTES >> 20
    );
}

/// The fault layer really dropped, duplicated and held frames in both directions.
fn check_faults_happened(log: &str) {
    let line = log
        .lines()
        .find(|l| l.contains("fault layer:"))
        .unwrap_or_else(|| panic!("no fault layer summary in the log:\n{log}"));
    for direction in ["rx", "tx"] {
        let part = line
            .split(&format!("{direction} FaultStats"))
            .nth(1)
            .unwrap_or_else(|| panic!("no {direction} stats: {line}"));
        for counter in ["dropped", "duplicated", "held"] {
            let n: u64 = part
                .split(&format!("{counter}: "))
                .nth(1)
                .and_then(|v| v.split(|ch: char| !ch.is_ascii_digit()).next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {direction} {counter}: {line}"));
            assert!(n > 0, "{direction} {counter} is 0: {line}");
        }
    }
    println!("  {}", line.trim());
}

// ----- helpers ----------------------------------------------------------------------

fn run_ok(cmd: &str, args: &[&str]) {
    let status = Command::new(cmd).args(args).status().expect(cmd);
    assert!(status.success(), "{cmd} {args:?}: {status}");
}

/// Runs redis-cli against the server; stdout without the final newline.
fn redis_cli(args: &[&str], stdin: Option<std::fs::File>) -> String {
    let mut cmd = Command::new("timeout");
    cmd.args(["20", "redis-cli", "-h", SERVER_IP]).args(args);
    cmd.stdin(stdin.map(Stdio::from).unwrap_or_else(Stdio::null));
    let out = cmd.output().expect("run redis-cli");
    assert!(out.status.success(), "redis-cli {args:?}: {}", out.status);
    let mut text = String::from_utf8(out.stdout).expect("utf-8 reply");
    if text.ends_with('\n') {
        text.pop();
    }
    text
}

/// Deterministic printable bytes (redis-cli passes them through unchanged).
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b'a' + (x % 26) as u8
        })
        .collect()
}

fn connected_clients(c: &mut Client) -> usize {
    let reply = c.command(&[b"INFO", b"clients"]).expect("INFO clients");
    let text = String::from_utf8_lossy(&reply);
    text.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no connected_clients in {text}"))
}

/// A minimal RESP client over a kernel TCP socket (inside the namespace).
struct Client {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Client {
    fn connect(timeout: Duration) -> std::io::Result<Client> {
        let addr = SERVER.parse().expect("server address");
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(20)))?;
        let reader = BufReader::new(stream.try_clone()?);
        Ok(Client { stream, reader })
    }

    /// Sends one command; returns the whole raw reply (simple, error, integer or bulk).
    fn command(&mut self, args: &[&[u8]]) -> std::io::Result<Vec<u8>> {
        let mut req = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            req.extend_from_slice(a);
            req.extend_from_slice(b"\r\n");
        }
        self.stream.write_all(&req)?;
        let mut reply = Vec::new();
        self.reader.read_until(b'\n', &mut reply)?;
        if reply.first() == Some(&b'$') {
            let len: i64 = std::str::from_utf8(&reply[1..reply.len() - 2])
                .ok()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| std::io::Error::other("bad bulk header"))?;
            if len >= 0 {
                let start = reply.len();
                reply.resize(start + len as usize + 2, 0);
                self.reader.read_exact(&mut reply[start..])?;
            }
        }
        Ok(reply)
    }
}
