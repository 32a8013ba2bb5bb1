//! Test harness: starts the real `lavik` binary on a free loopback port in a
//! fresh directory and talks to it over TCP.
#![allow(dead_code)]

pub mod diff;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    pub port: u16,
    pub dir: PathBuf,
    pub child: Option<Child>,
    pub args: Vec<String>,
}

static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A free loopback port: any (the kernel's choice), or one of `LAVIK_TEST_PORTS=LOW-HIGH`
/// when set (to keep test servers inside a port range on a shared machine).
pub fn free_port() -> u16 {
    static NEXT_PORT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    if let Some((low, high)) = std::env::var("LAVIK_TEST_PORTS").ok().and_then(|r| {
        let (a, b) = r.split_once('-')?;
        Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?))
    }) {
        let span = high.saturating_sub(low) + 1;
        for _ in 0..span {
            let n = NEXT_PORT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let port = (low + (std::process::id() + n) % span) as u16;
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
        panic!("no free port in LAVIK_TEST_PORTS");
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

pub fn temp_dir(tag: &str) -> PathBuf {
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("lavik-test-{}-{}-{}", tag, std::process::id(), n));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Creates the fixed-size data file a server in `dir` started with `args` is about to
/// create (the harness's `dir/lavik.data`, or lavik's default `./lavik.data` under a test's
/// own `--data-file-size`), sparse at its full size, unless the test names its own
/// `--data-file` or the file exists (a restart). lavik formats an existing file that reads
/// as zeros as a new store, skipping the one-off zero-fill it gives a file it creates (~1 s
/// a GiB on an idle disk here, ~10 s under load; paid by every server of the suite: 256 MiB
/// by default, 1 GiB each in `diff_bitmap`, 6 GiB in `tools`, whose start-up then overran
/// its 60 s deadline on a loaded machine). Replies and stored bytes are the same; the fill
/// only makes later writes cheaper, and `tests/storage_file.rs` checks it on the library.
fn make_sparse_data_file(dir: &std::path::Path, args: &[String]) {
    let path = dir.join("lavik.data");
    // The last size flag wins, as in lavik's own parsing.
    let mut size = None;
    for (i, a) in args.iter().enumerate() {
        match a.as_str() {
            "--data-file-size" => size = args.get(i + 1),
            "--data-file" if args.get(i + 1).map(PathBuf::from) != Some(path.clone()) => return,
            _ => {}
        }
    }
    let Some(bytes) = size.and_then(|v| lavik::config::parse_memory(v)) else {
        return;
    };
    if !path.exists() {
        std::fs::File::create(&path)
            .and_then(|f| f.set_len(bytes))
            .unwrap();
    }
}

impl Server {
    /// Starts lavik with `extra` flags (port and data file are chosen here).
    pub fn start(tag: &str, extra: &[&str]) -> Server {
        let dir = temp_dir(tag);
        Server::start_in(dir, extra)
    }

    pub fn start_in(dir: PathBuf, extra: &[&str]) -> Server {
        // A test of the growing data file gives its own sizes (and no fixed size).
        let grows = extra.iter().any(|a| {
            a.starts_with("--data-file-initial-size")
                || a.starts_with("--data-file-grow-step")
                || a.starts_with("--data-file-max-size")
        });
        Server::start_sized(dir, extra, !grows)
    }

    /// Starts lavik as a newcomer would: no data file or size flags, in an empty directory
    /// (the default `./lavik.data`, which grows with the data).
    pub fn start_on_defaults(tag: &str, extra: &[&str]) -> Server {
        Server::start_sized(temp_dir(tag), extra, false)
    }

    fn start_sized(dir: PathBuf, extra: &[&str], fixed_size: bool) -> Server {
        let port = free_port();
        let mut args: Vec<String> = vec!["--port".into(), port.to_string()];
        if fixed_size {
            args.push("--data-file-size".into());
            args.push("256mb".into());
        }
        args.push("--no-pin-workers".into());
        if fixed_size && !extra.iter().any(|a| a.starts_with("--data-file")) {
            args.push("--data-file".into());
            args.push(dir.join("lavik.data").display().to_string());
        }
        if !extra.iter().any(|a| a.starts_with("--threads")) {
            args.push("--threads".into());
            args.push("2".into());
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        if fixed_size {
            make_sparse_data_file(&dir, &args);
        }
        let mut s = Server {
            port,
            dir,
            child: None,
            args,
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        // Another test may take the port between our choosing it and the server binding
        // it; the server then refuses to start ("Address already in use"): move on.
        for _ in 0..5 {
            self.launch();
            if !self.exited_on_busy_port() {
                break;
            }
            self.port = free_port();
            let i = self.args.iter().position(|a| a == "--port").unwrap();
            self.args[i + 1] = self.port.to_string();
        }
        self.wait_ready();
    }

    /// Waits until the process says it listens (false) or exits because its port is
    /// taken (true). Only our own log counts, never a connect: a connect could reach the
    /// other process holding the port. The deadline is for a loaded machine, not a guess
    /// at how long start-up takes.
    fn exited_on_busy_port(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.stderr().contains("listening on port")
                || self.args.iter().any(|a| a.contains("log-dir"))
            {
                return false;
            }
            if let Ok(Some(_)) = self.child.as_mut().unwrap().try_wait() {
                return self.stderr().contains("Address already in use");
            }
            assert!(
                Instant::now() < deadline,
                "lavik neither listened nor exited: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Starts the process without waiting for it to answer.
    pub fn launch(&mut self) {
        let log =
            std::fs::File::create(self.dir.join(format!("stderr-{}.log", self.port))).unwrap();
        // `LAVIK_TEST_EXTRA_ARGS` (whitespace-separated) runs every test's server with more
        // flags, e.g. `--paged-base-min-dirs 0` to store every paged root as version 2.
        let extra: Vec<String> = std::env::var("LAVIK_TEST_EXTRA_ARGS")
            .map(|v| v.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default();
        let child = Command::new(env!("CARGO_BIN_EXE_lavik"))
            .args(&self.args)
            .args(&extra)
            .current_dir(&self.dir)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start lavik");
        self.child = Some(child);
    }

    /// Waits until PING answers PONG (or NOAUTH): listening and done loading. Probes only
    /// once our own process logged that it listens, so a probe never reaches another
    /// process that holds the port.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let logs_to_stderr = !self.args.iter().any(|a| a.contains("log-dir"));
        while logs_to_stderr && !self.stderr().contains("listening on port") {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("lavik exited early ({status}): {}", self.stderr());
            }
            assert!(
                Instant::now() < deadline,
                "lavik did not listen: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        loop {
            if let Ok(mut c) = TcpStream::connect(("127.0.0.1", self.port)) {
                c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                // With a password, authenticate first: NOAUTH comes before LOADING, so
                // only PONG proves the server is done loading.
                let pass = self
                    .args
                    .iter()
                    .position(|a| a == "--requirepass")
                    .and_then(|i| self.args.get(i + 1));
                let probe = match pass {
                    Some(p) => format!("AUTH {p}\r\nPING\r\n"),
                    None => "PING\r\n".to_string(),
                };
                let lines_wanted = if pass.is_some() { 2 } else { 1 };
                if c.write_all(probe.as_bytes()).is_ok() {
                    let mut b = [0u8; 128];
                    let mut n = 0;
                    while n < b.len()
                        && b[..n].windows(2).filter(|w| *w == b"\r\n").count() < lines_wanted
                    {
                        match c.read(&mut b[n..]) {
                            Ok(0) | Err(_) => break,
                            Ok(k) => n += k,
                        }
                    }
                    let got = &b[..n];
                    if got.windows(5).any(|w| w == b"+PONG")
                        || (pass.is_none() && got.starts_with(b"-NOAUTH"))
                    {
                        return;
                    }
                }
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("lavik exited early ({status}): {}", self.stderr());
            }
            assert!(
                Instant::now() < deadline,
                "lavik did not start: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join(format!("stderr-{}.log", self.port)))
            .unwrap_or_default()
    }

    pub fn raw(&self) -> Raw {
        Raw::connect(self.port)
    }

    /// The integer `field` of `INFO section` (panics when INFO lacks it).
    pub fn info_u64(&self, section: &str, field: &str) -> u64 {
        let text = self.raw().bulk(&[b"INFO", section.as_bytes()]);
        text.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .unwrap_or_else(|| panic!("no {field} in INFO {section}"))
            .trim()
            .parse()
            .unwrap()
    }

    pub fn client(&self) -> redis::Connection {
        let c = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).unwrap();
        c.get_connection().unwrap()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY-free: use the kill command to send SIGTERM to our own child.
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Some(st) = c.try_wait().unwrap() {
                    assert!(st.success(), "lavik exited with {st}");
                    return;
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    panic!("lavik did not stop on SIGTERM");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Restarts on the same directory, data file and port.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    pub fn restart_after_kill(&mut self) {
        self.kill9();
        self.spawn();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The RESP multibulk encoding of `args`.
pub fn resp(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(format!("${}\r\n{a}\r\n", a.len()).bytes());
    }
    out
}

/// SETs `k0` .. `k{keys - 1}` to `value_bytes` bytes of `v` each, pipelining `per_batch`
/// SETs at a time and checking every reply is +OK. Keys written first are the first whose
/// blocks are sealed on the device.
pub fn fill_strings(s: &Server, keys: usize, value_bytes: usize, per_batch: usize) {
    let mut c = s.raw();
    let value = vec![b'v'; value_bytes];
    let mut batch = Vec::new();
    let mut in_batch = 0;
    for i in 0..keys {
        let key = format!("k{i}");
        batch.extend_from_slice(
            format!(
                "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${value_bytes}\r\n",
                key.len()
            )
            .as_bytes(),
        );
        batch.extend_from_slice(&value);
        batch.extend_from_slice(b"\r\n");
        in_batch += 1;
        if in_batch == per_batch || i == keys - 1 {
            c.send(&batch);
            let got = c.read_exact(5 * in_batch);
            assert!(got.chunks(5).all(|r| r == b"+OK\r\n"), "fill failed");
            batch.clear();
            in_batch = 0;
        }
    }
}

/// A raw RESP connection for byte-exact checks.
pub struct Raw {
    pub s: TcpStream,
    buf: Vec<u8>,
}

impl Raw {
    pub fn connect(port: u16) -> Raw {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        // Generous: a reply late on a loaded machine is not a failure (a hang still is).
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.set_nodelay(true).unwrap();
        Raw { s, buf: Vec::new() }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }

    /// Encodes `args` as a multibulk command and sends it.
    pub fn cmd(&mut self, args: &[&[u8]]) {
        let mut b = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            b.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            b.extend_from_slice(a);
            b.extend_from_slice(b"\r\n");
        }
        self.send(&b);
    }

    /// Reads exactly `n` bytes.
    pub fn read_exact(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            let mut tmp = [0u8; 65536];
            let got = self.s.read(&mut tmp).expect("read reply");
            assert!(
                got > 0,
                "connection closed; have {:?}",
                String::from_utf8_lossy(&self.buf)
            );
            self.buf.extend_from_slice(&tmp[..got]);
        }
        self.buf.drain(..n).collect()
    }

    /// Sends a command whose reply is a bulk string and returns its text.
    #[allow(dead_code)]
    pub fn bulk(&mut self, args: &[&[u8]]) -> String {
        self.cmd(args);
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n") {
            head.extend(self.read_exact(1));
        }
        let text = String::from_utf8_lossy(&head);
        let n: usize = text
            .trim_start_matches('$')
            .trim_end()
            .parse()
            .unwrap_or_else(|_| panic!("not a bulk reply: {text:?}"));
        let body = self.read_exact(n + 2);
        String::from_utf8_lossy(&body[..n]).into_owned()
    }

    /// Waits until INFO says `connected_clients` is `n` (closes are counted when the
    /// server handles them, a moment after the client's close).
    #[allow(dead_code)]
    pub fn wait_connected_clients(&mut self, n: usize) {
        let want = format!("connected_clients:{n}\r\n");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.bulk(&[b"INFO", b"clients"]).contains(&want) {
            assert!(
                Instant::now() < deadline,
                "connected_clients never became {n}"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Sends a command and checks the exact reply bytes.
    pub fn expect(&mut self, args: &[&[u8]], reply: &[u8]) {
        self.cmd(args);
        let got = self.read_exact(reply.len());
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(reply),
            "reply to {:?}",
            args.iter()
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
        );
    }

    /// True while no byte of a reply has arrived (a non-blocking peek: nothing is
    /// consumed, the reply can still be read in full).
    pub fn nothing_arrived(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        self.s.set_nonblocking(true).unwrap();
        let mut tmp = [0u8; 1];
        let r = self.s.peek(&mut tmp);
        self.s.set_nonblocking(false).unwrap();
        matches!(r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }

    /// True when the server closed the connection (after any pending bytes).
    pub fn is_closed(&mut self) -> bool {
        let mut tmp = [0u8; 4096];
        loop {
            match self.s.read(&mut tmp) {
                Ok(0) => return true,
                Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
                Err(_) => return false,
            }
        }
    }
}
