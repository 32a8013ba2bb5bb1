//! The command line and config file, through the real binary.
mod common;
use std::process::Command;

fn lavik(args: &[&str], dir: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_lavik"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

// Unknown config directives are refused with their line number; bad flags exit 2.
#[test]
fn config_file_errors() {
    let dir = common::temp_dir("cli");
    std::fs::write(dir.join("bad.conf"), "port 7000\n# c\nfrobnicate 1\n").unwrap();
    let out = lavik(&["bad.conf"], &dir);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 3") && err.contains("frobnicate"),
        "{err}"
    );
    let out = lavik(&["--appendfsync", "sometimes"], &dir);
    assert_eq!(out.status.code(), Some(2));
    let out = lavik(&["--network", "dpdk"], &dir);
    assert_eq!(out.status.code(), Some(2));
    // Without the feature DPDK mode is refused outright, naming the variant; with it, its
    // address is required.
    let expected = if cfg!(feature = "dpdk") {
        "--dpdk-ip"
    } else {
        "--network=dpdk is not available in the minimal build of lavik"
    };
    assert!(String::from_utf8_lossy(&out.stderr).contains(expected));
    let _ = std::fs::remove_dir_all(&dir);
}

// `--version` names the variant, the commit this checkout is at, and the features.
#[test]
fn version_names_variant_commit_features() {
    let dir = common::temp_dir("cli-version");
    let out = lavik(&["--version"], &dir);
    assert_eq!(out.status.code(), Some(0));
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (variant, features) = match (cfg!(feature = "dpdk"), cfg!(feature = "nvme")) {
        (true, _) => ("standard", "dpdk nvme"),
        (false, false) => ("minimal", "none"),
        (false, true) => ("custom", "nvme"),
    };
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    // The test and the binary share a profile; the dev profile's binary says so.
    let kind = if cfg!(debug_assertions) {
        ", debug build"
    } else {
        ""
    };
    let want = format!(
        "lavik {} (variant {variant}, commit {head}, features: {features}{kind})",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(line, want);
    let _ = std::fs::remove_dir_all(&dir);
}

// A config file sets the port; a flag overrides the file.
#[test]
fn config_file_applies() {
    let dir = common::temp_dir("cli-ok");
    let p1 = common::free_port();
    std::fs::write(
        dir.join("ok.conf"),
        format!("port {p1}\nappendfsync always\nsave \"\"\n"),
    )
    .unwrap();
    let s = common::Server::start_in(dir.clone(), &["ok.conf"]);
    // The harness passes --port, which overrides the file's port.
    let mut c = s.raw();
    c.expect(
        &[b"CONFIG", b"GET", b"appendfsync"],
        b"*2\r\n$11\r\nappendfsync\r\n$6\r\nalways\r\n",
    );
    c.expect(
        &[b"CONFIG", b"GET", b"port"],
        format!(
            "*2\r\n$4\r\nport\r\n${}\r\n{}\r\n",
            s.port.to_string().len(),
            s.port
        )
        .as_bytes(),
    );
}

// --metrics-port serves Prometheus text with live counters.
#[test]
fn metrics_port() {
    use std::io::{Read, Write};
    let mp = common::free_port();
    let s = common::Server::start("cli-metrics", &["--metrics-port", &mp.to_string()]);
    let mut c = s.raw();
    c.expect(&[b"SET", b"a", b"1"], b"+OK\r\n");
    // The harness's readiness probe is closed, and the worker adds a round's commands to
    // the total just after sending its replies: poll until the counters show both.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let mut h = std::net::TcpStream::connect(("127.0.0.1", mp)).unwrap();
        h.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        h.read_to_string(&mut body).unwrap();
        assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
        let line = body
            .lines()
            .find(|l| l.starts_with("lavik_commands_processed_total "))
            .unwrap();
        let n: u64 = line.split(' ').nth(1).unwrap().parse().unwrap();
        if n >= 2 && body.contains("lavik_connected_clients 1\n") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "metrics never showed the SET and one client: {body}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

// A second server on a running server's data file, or on its port, is refused with a
// clear message (SO_REUSEPORT would otherwise let them share the port, and two
// processes on one file would corrupt it).
#[test]
fn second_instance_refused() {
    let s = common::Server::start("cli-twice", &[]);
    let data = s.dir.join("lavik.data").display().to_string();
    let other_port = common::free_port().to_string();
    let out = lavik(
        &[
            "--port",
            &other_port,
            "--data-file",
            &data,
            "--no-pin-workers",
        ],
        &s.dir,
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by another process"), "{err}");
    let port = s.port.to_string();
    let other_data = s.dir.join("other.data").display().to_string();
    let out = lavik(
        &[
            "--port",
            &port,
            "--data-file",
            &other_data,
            "--data-file-size",
            "64mb",
            "--no-pin-workers",
        ],
        &s.dir,
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Address already in use"), "{err}");
    // The first server is unharmed.
    let mut c = s.client();
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
}

// Proves a 1 us --foreground-budget-us cuts rounds short and still answers every pipelined command in order.
#[test]
fn foreground_budget_cuts_rounds_without_losing_order() {
    use std::io::{Read, Write};
    let s = common::Server::start(
        "cli-budget",
        &["--foreground-budget-us", "1", "--threads", "1"],
    );
    const CONNS: usize = 24;
    const PER_CONN: usize = 200;
    let mut conns: Vec<std::net::TcpStream> = (0..CONNS)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap())
        .collect();
    // Every connection is accepted and set up before the one worker goes to sleep, so
    // all the pipelines below are ready together when it wakes.
    let mut sleeper = s.raw();
    sleeper.expect(&[b"PING"], b"+PONG\r\n");
    for c in conns.iter_mut() {
        c.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
        let mut pong = [0u8; 7];
        c.read_exact(&mut pong).unwrap();
    }
    sleeper.cmd(&[b"DEBUG", b"SLEEP", b"0.3"]);
    std::thread::sleep(std::time::Duration::from_millis(50));
    for (i, c) in conns.iter_mut().enumerate() {
        let key = format!("budget:{i}");
        let mut req = Vec::new();
        for _ in 0..PER_CONN {
            req.extend_from_slice(
                format!("*2\r\n$4\r\nINCR\r\n${}\r\n{key}\r\n", key.len()).as_bytes(),
            );
        }
        c.write_all(&req).unwrap();
    }
    for c in conns.iter_mut() {
        c.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        let want: Vec<u8> = (1..=PER_CONN)
            .flat_map(|n| format!(":{n}\r\n").into_bytes())
            .collect();
        let mut got = vec![0u8; want.len()];
        c.read_exact(&mut got).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want)
        );
    }
    assert_eq!(sleeper.read_exact(5), b"+OK\r\n");
    let mut c = s.client();
    let info: String = redis::cmd("INFO").arg("stats").query(&mut c).unwrap();
    let cuts: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("lavik_foreground_budget_cuts:"))
        .expect("budget cut counter in INFO")
        .trim()
        .parse()
        .unwrap();
    assert!(cuts > 0, "no round was cut: {info}");
}

// Under systemd (`Type=notify`) the server sends READY=1 only once recovery is done and
// commands run (not while it answers -LOADING), and STOPPING=1 when SIGTERM stops it.
#[test]
fn sd_notify_ready_after_loading_and_stopping_at_shutdown() {
    // A loaded machine may start the process past its loading window: that attempt proves
    // nothing and runs again with a longer window. A server sending READY while loading
    // fails every attempt.
    for delay_ms in [1500u64, 6000, 20000] {
        if sd_notify_attempt(delay_ms) {
            return;
        }
    }
    panic!("no attempt ran inside the loading window");
}

/// One start with a `delay_ms` loading window; false when the window was over before
/// the checks that need it (inconclusive).
fn sd_notify_attempt(delay_ms: u64) -> bool {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixDatagram;
    use std::time::{Duration, Instant};
    let dir = common::temp_dir("cli-notify");
    let sock_path = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    let port = common::free_port();
    let data = dir.join("lavik.data").display().to_string();
    let launched = Instant::now();
    let window = Duration::from_millis(delay_ms);
    let mut child = Command::new(env!("CARGO_BIN_EXE_lavik"))
        .args([
            "--port",
            &port.to_string(),
            "--data-file",
            &data,
            "--data-file-size",
            "64mb",
            "--threads",
            "1",
            "--no-pin-workers",
            "--debug-load-delay-ms",
            &delay_ms.to_string(),
        ])
        .env("NOTIFY_SOCKET", &sock_path)
        .current_dir(&dir)
        .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
        .spawn()
        .unwrap();
    let ping = |c: &mut std::net::TcpStream| -> String {
        c.write_all(b"PING\r\n").unwrap();
        let mut b = [0u8; 128];
        let n = c.read(&mut b).unwrap();
        String::from_utf8_lossy(&b[..n]).into_owned()
    };
    let give_up = |mut child: std::process::Child| {
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&dir);
        false
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    // Our own log says when it listens (a connect could reach another test's server).
    while !std::fs::read_to_string(dir.join("stderr.log"))
        .unwrap_or_default()
        .contains("listening on port")
    {
        assert!(
            Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "lavik did not listen"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let first = ping(&mut c);
    if !first.starts_with("-LOADING") {
        assert!(launched.elapsed() >= window, "not loading: {first}");
        return give_up(child);
    }
    sock.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 512];
    if sock.recv(&mut buf).is_ok() {
        assert!(
            launched.elapsed() >= window,
            "READY sent while still loading"
        );
        return give_up(child);
    }
    sock.set_nonblocking(false).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let n = sock.recv(&mut buf).unwrap();
    let ready = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(ready.starts_with("READY=1\nSTATUS="), "{ready}");
    assert_eq!(ping(&mut c), "+PONG\r\n");
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let n = sock.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"STOPPING=1");
    assert!(child.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
    true
}
