//! Differential testing against Debian's `redis-server`: the same commands go to a real
//! Redis and to lavik, and the reply bytes are compared. Redis is the specification.
//!
//! Use: `let mut p = Pair::start("tag", &[])` (lavik flags), `p.hello(3)` for RESP3,
//! then `p.check(&["SET", "k", "v"])` per command; a mismatch panics with both replies
//! and the command history. `Rng` makes random sequences reproducible from a seed.
#![allow(dead_code)]

use super::{free_port, temp_dir, Server};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` started for one test on a free loopback port, persistence off.
pub struct Redis {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Redis {
    pub fn start(tag: &str) -> Redis {
        let dir = temp_dir(&format!("redis-{tag}"));
        for _ in 0..5 {
            let port = free_port();
            let child = Command::new("redis-server")
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--daemonize",
                    "no",
                    "--enable-debug-command",
                    "yes",
                ])
                .current_dir(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server is installed (tools/test installs it)");
            let mut r = Redis {
                port,
                dir: dir.clone(),
                child: Some(child),
            };
            if r.wait_ready() {
                return r;
            }
            r.kill();
        }
        panic!("redis-server did not start");
    }

    /// Waits until our own redis-server answers on `port`; false if it exited (e.g. the
    /// port was taken meanwhile) or another process answers there.
    fn wait_ready(&mut self) -> bool {
        let pid = self.child.as_ref().unwrap().id();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.as_mut().unwrap().try_wait() {
                return false;
            }
            if let Some(answered_by) = server_pid(self.port) {
                return answered_by == pid;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `process_id` INFO reports on `port` (Redis and lavik both give it), or `None` if
/// nothing answers there yet. A test that starts a server on a port it chose checks this
/// against its child: between choosing the port and binding it, another test may take it.
pub fn server_pid(port: u16) -> Option<u32> {
    let s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut c = RespConn { s, buf: Vec::new() };
    c.s.write_all(b"INFO server\r\n").ok()?;
    let mut tmp = [0u8; 4096];
    let reply = loop {
        if let Some(n) = frame_len(&c.buf) {
            break c.buf[..n].to_vec();
        }
        match c.s.read(&mut tmp) {
            Ok(0) | Err(_) => return None,
            Ok(k) => c.buf.extend_from_slice(&tmp[..k]),
        }
    };
    String::from_utf8_lossy(&reply)
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// A connection that reads whole RESP2/RESP3 replies as raw bytes.
pub struct RespConn {
    s: TcpStream,
    buf: Vec<u8>,
}

impl RespConn {
    pub fn connect(port: u16) -> RespConn {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        // Generous: a reply late on a loaded machine is not a failure (a hang still is).
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.set_nodelay(true).unwrap();
        RespConn { s, buf: Vec::new() }
    }

    pub fn send(&mut self, args: &[&[u8]]) {
        let mut b = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            b.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            b.extend_from_slice(a);
            b.extend_from_slice(b"\r\n");
        }
        self.s.write_all(&b).unwrap();
    }

    /// Sends one command and returns its whole reply.
    pub fn call(&mut self, args: &[&[u8]]) -> Vec<u8> {
        self.send(args);
        self.reply()
    }

    /// Whether the server closed the connection: the next read sees its end (or a reset)
    /// before any byte; waits up to the read timeout.
    pub fn closed(&mut self) -> bool {
        let mut tmp = [0u8; 64];
        match self.s.read(&mut tmp) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }

    pub fn set_timeout(&mut self, t: Duration) {
        self.s.set_read_timeout(Some(t)).unwrap();
    }

    /// The next whole reply, or `None` if the read timeout passes first (bytes read so far
    /// stay buffered for the next call).
    pub fn try_reply(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some(n) = frame_len(&self.buf) {
                return Some(self.buf.drain(..n).collect());
            }
            let mut tmp = [0u8; 65536];
            match self.s.read(&mut tmp) {
                Ok(0) => panic!("connection closed"),
                Ok(got) => self.buf.extend_from_slice(&tmp[..got]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return None
                }
                Err(e) => panic!("read reply: {e}"),
            }
        }
    }

    /// Reads the next whole reply (one RESP frame, nested aggregates included).
    pub fn reply(&mut self) -> Vec<u8> {
        loop {
            if let Some(n) = frame_len(&self.buf) {
                return self.buf.drain(..n).collect();
            }
            let mut tmp = [0u8; 65536];
            let got = self.s.read(&mut tmp).expect("read reply");
            assert!(
                got > 0,
                "connection closed with a partial reply {:?}",
                String::from_utf8_lossy(&self.buf)
            );
            self.buf.extend_from_slice(&tmp[..got]);
        }
    }
}

/// Length of the first complete RESP frame in `b`, or `None` if more bytes are needed.
pub fn frame_len(b: &[u8]) -> Option<usize> {
    fn line_end(b: &[u8], from: usize) -> Option<usize> {
        b[from..]
            .windows(2)
            .position(|w| w == b"\r\n")
            .map(|p| from + p)
    }
    fn frame(b: &[u8], at: usize) -> Option<usize> {
        let t = *b.get(at)?;
        let end = line_end(b, at + 1)?;
        let head = std::str::from_utf8(&b[at + 1..end]).ok()?;
        let after = end + 2;
        match t {
            b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Some(after),
            b'$' | b'!' | b'=' => {
                let n: i64 = head.parse().ok()?;
                if n < 0 {
                    return Some(after);
                }
                let stop = after + n as usize + 2;
                (b.len() >= stop).then_some(stop)
            }
            b'*' | b'~' | b'>' | b'%' | b'|' => {
                let n: i64 = head.parse().ok()?;
                if n < 0 {
                    return Some(after);
                }
                let items = if t == b'%' || t == b'|' { 2 * n } else { n };
                let mut pos = after;
                for _ in 0..items {
                    pos = frame(b, pos)?;
                }
                Some(pos)
            }
            other => panic!("not a RESP type byte: {:?}", other as char),
        }
    }
    frame(b, 0)
}

/// lavik and Redis side by side, one connection to each.
pub struct Pair {
    pub lavik: Server,
    pub redis: Redis,
    pub l: RespConn,
    pub r: RespConn,
    history: Vec<String>,
}

fn show(args: &[&[u8]]) -> String {
    args.iter()
        .map(|a| format!("{:?}", String::from_utf8_lossy(a)))
        .collect::<Vec<_>>()
        .join(" ")
}

impl Pair {
    pub fn start(tag: &str, lavik_flags: &[&str]) -> Pair {
        let lavik = Server::start(tag, lavik_flags);
        let redis = Redis::start(tag);
        let l = RespConn::connect(lavik.port);
        let r = RespConn::connect(redis.port);
        Pair {
            lavik,
            redis,
            l,
            r,
            history: Vec::new(),
        }
    }

    /// Switches both connections to RESP `proto` (2 or 3); the HELLO replies differ
    /// (server name, version), so only their success is checked.
    pub fn hello(&mut self, proto: u8) {
        let p = proto.to_string();
        for c in [&mut self.l, &mut self.r] {
            let rep = c.call(&[b"HELLO", p.as_bytes()]);
            assert!(!rep.starts_with(b"-"), "HELLO {proto}: {rep:?}");
        }
    }

    /// Sends `args` to both and returns (lavik, redis) replies without comparing.
    pub fn both(&mut self, args: &[&[u8]]) -> (Vec<u8>, Vec<u8>) {
        self.history.push(show(args));
        (self.l.call(args), self.r.call(args))
    }

    /// Sends `args` to both; panics unless the replies are byte-identical.
    pub fn check(&mut self, args: &[&str]) -> Vec<u8> {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        self.check_bytes(&a)
    }

    pub fn check_bytes(&mut self, args: &[&[u8]]) -> Vec<u8> {
        let (l, r) = self.both(args);
        if l != r && !ttl_clock_skew(args, &l, &r) {
            let keep = if std::env::var_os("DIFF_STRICT").is_some() {
                100000
            } else {
                30
            };
            let tail: Vec<&String> = self.history.iter().rev().take(keep).rev().collect();
            panic!(
                "reply differs for {}\n lavik: {:?}\n redis: {:?}\n last commands:\n  {}",
                show(args),
                String::from_utf8_lossy(&l),
                String::from_utf8_lossy(&r),
                tail.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join("\n  ")
            );
        }
        l
    }

    /// Like `check`, but compares the replies after `normalize` (for replies whose order
    /// Redis leaves unspecified, e.g. sorting the elements of a set reply).
    pub fn check_with(&mut self, args: &[&str], normalize: impl Fn(&[u8]) -> Vec<u8>) -> Vec<u8> {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        let (l, r) = self.both(&a);
        let (nl, nr) = (normalize(&l), normalize(&r));
        assert!(
            nl == nr,
            "normalized reply differs for {}\n lavik: {:?}\n redis: {:?}",
            show(&a),
            String::from_utf8_lossy(&l),
            String::from_utf8_lossy(&r)
        );
        l
    }
}

/// A TTL's seconds, rounded from milliseconds as Redis does ((ms + 500) / 1000), may differ
/// by one between the servers when the rounding boundary falls between the moments each
/// got the EXPIRE and the TTL (one server is always asked a little after the other): that
/// is the two clocks, not a difference in behaviour. Only positive TTLs one second apart.
fn ttl_clock_skew(args: &[&[u8]], l: &[u8], r: &[u8]) -> bool {
    let secs = |b: &[u8]| -> Option<i64> {
        std::str::from_utf8(b.strip_prefix(b":")?.strip_suffix(b"\r\n")?)
            .ok()?
            .parse()
            .ok()
    };
    args.first().is_some_and(|c| c.eq_ignore_ascii_case(b"TTL"))
        && matches!((secs(l), secs(r)), (Some(a), Some(b)) if a > 0 && b > 0 && (a - b).abs() == 1)
}

/// A map-like reply (`%n`, or a flat RESP2 array of field, value) with its (field, value)
/// pairs sorted, so replies whose pair order Redis leaves unspecified compare equal. Other
/// replies pass as is.
pub fn sorted_pairs(reply: &[u8]) -> Vec<u8> {
    if !matches!(reply.first(), Some(b'*') | Some(b'%')) {
        return reply.to_vec();
    }
    let head_end = reply.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
    let mut frames = Vec::new();
    let mut pos = head_end;
    while pos < reply.len() {
        let n = frame_len(&reply[pos..]).unwrap();
        frames.push(&reply[pos..pos + n]);
        pos += n;
    }
    let mut pairs: Vec<Vec<u8>> = frames.chunks(2).map(|c| c.concat()).collect();
    pairs.sort();
    [reply[..head_end].to_vec(), pairs.concat()].concat()
}

/// Sorts the elements of a flat aggregate reply (array or set of scalars) so replies
/// whose element order Redis leaves unspecified compare equal. Other replies pass as is.
pub fn sorted_elements(reply: &[u8]) -> Vec<u8> {
    if !matches!(reply.first(), Some(b'*') | Some(b'~')) {
        return reply.to_vec();
    }
    let head_end = reply.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
    let mut items = Vec::new();
    let mut pos = head_end;
    while pos < reply.len() {
        let n = frame_len(&reply[pos..]).expect("complete reply");
        items.push(reply[pos..pos + n].to_vec());
        pos += n;
    }
    items.sort();
    let mut out = reply[..head_end].to_vec();
    for i in items {
        out.extend(i);
    }
    out
}

/// A small deterministic generator (xorshift64*), so a failing sequence can be replayed
/// from its seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// lavik's INFO `lavik_device_write_bytes` (device bytes written so far).
pub fn device_write_bytes(p: &mut Pair) -> u64 {
    let rep = p.l.call(&[b"INFO", b"storage"]);
    let text = String::from_utf8_lossy(&rep).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("lavik_device_write_bytes:"))
        .expect("INFO storage reports lavik_device_write_bytes")
        .trim()
        .parse()
        .unwrap()
}

/// lavik's device write counter once the server's timed flush wrote everything staged
/// (two equal readings).
pub fn settled_write_bytes(p: &mut Pair) -> u64 {
    let mut last = device_write_bytes(p);
    loop {
        std::thread::sleep(std::time::Duration::from_millis(60));
        let now = device_write_bytes(p);
        if now == last {
            return now;
        }
        last = now;
    }
}
