//! The load engine: one event loop per client thread, many connections per loop.
//!
//! Each thread owns its connections (non-blocking sockets on a `mio` poll, edge-triggered),
//! keeps up to `--pipeline` requests in flight on each, and timestamps a request when it is
//! encoded into the connection's output buffer, which is written in the same loop turn.
//! Latency is reply time minus that stamp. Nothing is shared between threads on the hot
//! path except one relaxed counter per thread for the progress line.
//!
//! Limits: a connection's input buffer starts at `INPUT_BUFFER_BYTES` and grows only when
//! one reply is larger. After the clock runs out, outstanding replies are awaited for at
//! most `DRAIN_TIMEOUT`; what is still missing then is reported as unanswered.

use crate::options::BenchOptions;
use crate::resp::{scan_reply, ReplyKind};
use crate::stats::{OpStats, RunResult};
use crate::workload::{ClientGen, Workload};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use std::collections::VecDeque;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const INPUT_BUFFER_BYTES: usize = 16 * 1024;
const POLL_TIMEOUT: Duration = Duration::from_millis(10);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
const EVENTS_CAPACITY: usize = 1024;
const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

struct InFlight {
    sent: Instant,
    op: u8,
    request_bytes: u32,
    /// Replies still due: more than one for a multi-command template (`MULTI ; ... ; EXEC`).
    replies_left: u32,
    /// The kind the request is accounted as: an error if any of its replies was one,
    /// otherwise the last reply's kind.
    error: bool,
}

struct Conn {
    stream: TcpStream,
    gen: ClientGen,
    out: Vec<u8>,
    out_pos: usize,
    input: Vec<u8>,
    input_len: usize,
    inflight: VecDeque<InFlight>,
    closed: bool,
}

/// Per-thread results before merging.
struct ThreadOutcome {
    ops: Vec<OpStats>,
    connection_errors: u64,
    unanswered: u64,
    /// From the common start to this thread's last reply.
    elapsed: Duration,
}

/// Why a run could not be performed at all.
#[derive(Debug)]
pub struct RunError(pub String);

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn resolve(o: &BenchOptions) -> Result<SocketAddr, RunError> {
    (o.server.as_str(), o.port)
        .to_socket_addrs()
        .map_err(|e| RunError(format!("cannot resolve {}:{}: {e}", o.server, o.port)))?
        .next()
        .ok_or_else(|| RunError(format!("{} resolves to no address", o.server)))
}

impl Conn {
    fn connect(addr: SocketAddr, gen: ClientGen) -> io::Result<Self> {
        // A blocking connect keeps setup simple; the loop then runs non-blocking.
        let std_stream = std::net::TcpStream::connect(addr)?;
        std_stream.set_nodelay(true)?;
        std_stream.set_nonblocking(true)?;
        Ok(Self {
            stream: TcpStream::from_std(std_stream),
            gen,
            out: Vec::with_capacity(4096),
            out_pos: 0,
            input: vec![0; INPUT_BUFFER_BYTES],
            input_len: 0,
            inflight: VecDeque::new(),
            closed: false,
        })
    }

    /// Queue requests until the pipeline is full or the client has nothing left to send.
    fn fill(&mut self, w: &Workload, pipeline: usize, now: Instant, stopping: bool) {
        while !stopping && !self.closed && self.inflight.len() < pipeline {
            let Some((op, bytes)) = self.gen.next_request(w, &mut self.out) else {
                break;
            };
            self.inflight.push_back(InFlight {
                sent: now,
                op: op as u8,
                request_bytes: bytes as u32,
                replies_left: w.ops[op].template.commands(),
                error: false,
            });
        }
    }

    /// Write as much queued output as the socket takes.
    fn flush(&mut self) -> io::Result<()> {
        while self.out_pos < self.out.len() {
            match self.stream.write(&self.out[self.out_pos..]) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.out.clear();
        self.out_pos = 0;
        Ok(())
    }

    /// Read everything available and account each complete reply. Returns replies seen.
    fn read_replies(
        &mut self,
        w: &Workload,
        now: Instant,
        stats: &mut [OpStats],
    ) -> io::Result<u64> {
        let mut replies = 0;
        loop {
            if self.input_len == self.input.len() {
                // Only reached when one reply is bigger than the buffer.
                let bigger = self.input.len() * 2;
                self.input.resize(bigger, 0);
            }
            let room = self.input.len() - self.input_len;
            let read = match self.stream.read(&mut self.input[self.input_len..]) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(replies),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.input_len += read;
            replies += self.consume(w, now, stats)?;
            // A read that did not fill the buffer emptied the socket. Skipping the read
            // that would return EAGAIN saves a third of the syscalls per request; it is
            // safe with edge-triggered epoll on Linux because any byte arriving after this
            // read queues a new readiness event.
            if read < room {
                return Ok(replies);
            }
        }
    }

    fn consume(&mut self, w: &Workload, now: Instant, stats: &mut [OpStats]) -> io::Result<u64> {
        let mut pos = 0;
        let mut replies = 0;
        while pos < self.input_len {
            let scanned = scan_reply(&self.input[pos..self.input_len])
                .map_err(|e| io::Error::new(ErrorKind::InvalidData, e.0))?;
            let Some((len, kind)) = scanned else { break };
            let front = self
                .inflight
                .front_mut()
                .ok_or_else(|| io::Error::new(ErrorKind::InvalidData, "reply without request"))?;
            front.request_bytes = front.request_bytes.saturating_add(len as u32);
            front.error |= kind == ReplyKind::Error;
            front.replies_left -= 1;
            pos += len;
            if front.replies_left > 0 {
                continue;
            }
            let req = self.inflight.pop_front().expect("front exists");
            let kind = if req.error { ReplyKind::Error } else { kind };
            let s = &mut stats[usize::from(req.op)];
            s.record(now.saturating_duration_since(req.sent).as_nanos() as u64);
            s.bytes += u64::from(req.request_bytes);
            match kind {
                ReplyKind::Error => s.error_replies += 1,
                ReplyKind::Nil if w.ops[usize::from(req.op)].is_read => s.misses += 1,
                ReplyKind::Value if w.ops[usize::from(req.op)].is_read => s.hits += 1,
                _ => {}
            }
            replies += 1;
        }
        self.input.copy_within(pos..self.input_len, 0);
        self.input_len -= pos;
        Ok(replies)
    }

    fn done(&self, stopping: bool) -> bool {
        self.closed || ((stopping || self.gen.exhausted()) && self.inflight.is_empty())
    }
}

struct ThreadPlan {
    addr: SocketAddr,
    workload: Arc<Workload>,
    first_client: u64,
    clients: u64,
    pipeline: usize,
    test_time: Option<Duration>,
    start: Arc<Barrier>,
    progress: Arc<AtomicU64>,
    connect_failures: Arc<AtomicUsize>,
}

/// Open and register this thread's connections. Returns them and the failure count.
fn connect_all(plan: &ThreadPlan, poll: &Poll) -> io::Result<(Vec<Conn>, u64)> {
    let w = &*plan.workload;
    let mut conns = Vec::with_capacity(plan.clients as usize);
    let mut failures = 0;
    for i in 0..plan.clients {
        match Conn::connect(plan.addr, ClientGen::new(w, plan.first_client + i)) {
            Ok(mut c) => {
                let token = Token(conns.len());
                poll.registry().register(
                    &mut c.stream,
                    token,
                    Interest::READABLE | Interest::WRITABLE,
                )?;
                conns.push(c);
            }
            Err(e) => {
                // Say why once per thread (e.g. "Too many open files": raise `ulimit -n`).
                if failures == 0 {
                    eprintln!("lavik-bench: connect to {}: {e}", plan.addr);
                }
                failures += 1;
            }
        }
    }
    if failures > 0 {
        plan.connect_failures
            .fetch_add(failures as usize, Ordering::Relaxed);
    }
    Ok((conns, failures))
}

fn run_thread(plan: ThreadPlan) -> io::Result<ThreadOutcome> {
    let w = &*plan.workload;
    let mut poll = Poll::new()?;
    let (mut conns, mut connection_errors) = connect_all(&plan, &poll)?;
    plan.start.wait();
    let start = Instant::now();
    let deadline = plan.test_time.map(|t| start + t);
    let mut stats: Vec<OpStats> = w.ops.iter().map(|_| OpStats::new()).collect();
    let mut events = Events::with_capacity(EVENTS_CAPACITY);
    let mut last_reply = start;
    for c in conns.iter_mut() {
        c.fill(w, plan.pipeline, start, false);
        if c.flush().is_err() {
            c.closed = true;
            connection_errors += 1;
        }
    }
    loop {
        let now = Instant::now();
        let stopping = deadline.is_some_and(|d| now >= d);
        if conns.iter().all(|c| c.done(stopping)) {
            break;
        }
        if stopping && now >= deadline.expect("stopping implies a deadline") + DRAIN_TIMEOUT {
            break;
        }
        let timeout = deadline
            .filter(|d| *d > now)
            .map_or(POLL_TIMEOUT, |d| (d - now).min(POLL_TIMEOUT));
        match poll.poll(&mut events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        let now = Instant::now();
        let stopping = deadline.is_some_and(|d| now >= d);
        let mut replies = 0;
        for event in events.iter() {
            let c = &mut conns[event.token().0];
            if c.closed {
                continue;
            }
            // Fresh clock reads per connection (vDSO, tens of ns): with hundreds of
            // connections per poll round, one shared timestamp would skew latencies by the
            // time spent on the connections handled before this one.
            let result = c.read_replies(w, Instant::now(), &mut stats).and_then(|n| {
                replies += n;
                c.fill(w, plan.pipeline, Instant::now(), stopping);
                c.flush()
            });
            if result.is_err() {
                c.closed = true;
                connection_errors += 1;
                // Deregistering can only fail if the socket is already gone; either way
                // the connection is finished.
                let _ = poll.registry().deregister(&mut c.stream);
            }
        }
        if replies > 0 {
            last_reply = now;
            plan.progress.fetch_add(replies, Ordering::Relaxed);
        }
    }
    let unanswered = conns.iter().map(|c| c.inflight.len() as u64).sum();
    Ok(ThreadOutcome {
        ops: stats,
        connection_errors,
        unanswered,
        elapsed: last_reply.saturating_duration_since(start),
    })
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// Run one benchmark as configured. `label` prefixes the progress line.
pub fn run(o: &BenchOptions, label: &str) -> Result<RunResult, RunError> {
    let addr = resolve(o)?;
    let workload = Arc::new(Workload::from_options(o));
    let threads = o.threads as u64;
    let clients = u64::from(o.clients_per_thread);
    let start = Arc::new(Barrier::new(threads as usize + 1));
    let connect_failures = Arc::new(AtomicUsize::new(0));
    let counters: Vec<Arc<AtomicU64>> = (0..threads).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let mut handles = Vec::new();
    for t in 0..threads {
        let plan = ThreadPlan {
            addr,
            workload: Arc::clone(&workload),
            first_client: t * clients,
            clients,
            pipeline: o.pipeline as usize,
            test_time: o.test_time_secs.map(Duration::from_secs),
            start: Arc::clone(&start),
            progress: Arc::clone(&counters[t as usize]),
            connect_failures: Arc::clone(&connect_failures),
        };
        let handle = std::thread::Builder::new()
            .name(format!("bench-{t}"))
            .spawn(move || run_thread(plan))
            .map_err(|e| RunError(format!("cannot spawn thread: {e}")))?;
        handles.push(handle);
    }
    start.wait();
    let started = Instant::now();
    let start_unix_ms = unix_ms();
    let failed = connect_failures.load(Ordering::Relaxed);
    if failed as u64 == threads * clients {
        // Threads finish at once with nothing to do; collect them below for the report.
        eprintln!("{label}all {failed} connections to {addr} failed");
    }
    progress_until_done(o, label, &workload, &counters, &handles, started);
    let mut merged: Vec<OpStats> = workload.ops.iter().map(|_| OpStats::new()).collect();
    let (mut connection_errors, mut unanswered, mut elapsed) = (0, 0, Duration::ZERO);
    for h in handles {
        let outcome = h
            .join()
            .map_err(|_| RunError("a client thread panicked".into()))?
            .map_err(|e| RunError(format!("client thread I/O error: {e}")))?;
        for (m, s) in merged.iter_mut().zip(&outcome.ops) {
            m.merge(s);
        }
        connection_errors += outcome.connection_errors;
        unanswered += outcome.unanswered;
        elapsed = elapsed.max(outcome.elapsed);
    }
    Ok(RunResult {
        op_names: workload.ops.iter().map(|op| op.name.clone()).collect(),
        op_is_read: workload.ops.iter().map(|op| op.is_read).collect(),
        ops: merged,
        elapsed,
        connection_errors,
        unanswered,
        start_unix_ms,
        end_unix_ms: unix_ms(),
    })
}

/// Print a memtier-style progress line on stderr every second until all threads finish.
fn progress_until_done<T>(
    o: &BenchOptions,
    label: &str,
    w: &Workload,
    counters: &[Arc<AtomicU64>],
    handles: &[std::thread::JoinHandle<T>],
    started: Instant,
) {
    let total_requests = w.total_requests();
    let mut last = (Instant::now(), 0u64);
    let mut printed = false;
    while !handles.iter().all(|h| h.is_finished()) {
        std::thread::sleep(Duration::from_millis(50));
        if o.hide_progress || last.0.elapsed() < PROGRESS_INTERVAL {
            continue;
        }
        let now = Instant::now();
        let done: u64 = counters.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        let secs = now.duration_since(started).as_secs_f64();
        let percent = match (total_requests, o.test_time_secs) {
            (Some(total), _) if total > 0 => done as f64 * 100.0 / total as f64,
            (_, Some(t)) if t > 0 => (secs * 100.0 / t as f64).min(100.0),
            _ => 0.0,
        };
        let current = (done - last.1) as f64 / now.duration_since(last.0).as_secs_f64();
        eprint!(
            "\r{label}[{percent:3.0}%, {secs:4.0} secs] {} threads {} conns: {done:>11} ops, {current:>10.0} (avg: {:>10.0}) ops/sec   ",
            o.threads,
            o.total_clients(),
            done as f64 / secs.max(1e-9),
        );
        printed = true;
        last = (now, done);
    }
    if printed {
        eprintln!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::{parse, Parsed};
    use std::net::TcpListener;

    /// A tiny RESP server: answers SET with +OK, GET of keys ending in an even digit with
    /// a 3-byte value and odd ones with nil. Enough to check the engine's accounting.
    fn fake_server() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { return };
                std::thread::spawn(move || serve(&mut s));
            }
        });
        port
    }

    fn serve(s: &mut std::net::TcpStream) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let Ok(n) = s.read(&mut chunk) else { return };
            if n == 0 {
                return;
            }
            buf.extend_from_slice(&chunk[..n]);
            let mut reply = Vec::new();
            // Requests are arrays of bulk strings; scan_reply measures them just as well.
            while let Ok(Some((len, _))) = scan_reply(&buf) {
                let text = String::from_utf8_lossy(&buf[..len]).to_string();
                let parts: Vec<&str> = text.split("\r\n").collect();
                match parts[2] {
                    "SET" => reply.extend_from_slice(b"+OK\r\n"),
                    "BAD" => reply.extend_from_slice(b"-ERR bad\r\n"),
                    _ if parts[4].ends_with(['0', '2', '4', '6', '8']) => {
                        reply.extend_from_slice(b"$3\r\nabc\r\n")
                    }
                    _ => reply.extend_from_slice(b"$-1\r\n"),
                }
                buf.drain(..len);
            }
            if s.write_all(&reply).is_err() {
                return;
            }
        }
    }

    fn options(a: &[&str]) -> BenchOptions {
        let a: Vec<String> = a.iter().map(|s| s.to_string()).collect();
        match parse(&a).unwrap() {
            Parsed::Run(o) => *o,
            Parsed::Help => unreachable!(),
        }
    }

    // Proves a request-count run over several threads, connections and a pipeline answers
    // every request exactly once and counts hits/misses by reply kind.
    #[test]
    fn counts_every_reply() {
        let port = fake_server().to_string();
        let o = options(&[
            "-s",
            "127.0.0.1",
            "-p",
            &port,
            "-t",
            "2",
            "-c",
            "3",
            "-n",
            "400",
            "--ratio=1:3",
            "--pipeline=4",
            "--key-pattern=S:S",
            "--key-minimum=1",
            "--key-maximum=100",
            "--hide-progress",
        ]);
        let r = run(&o, "").unwrap();
        let (sets, gets) = (r.op("Sets").unwrap(), r.op("Gets").unwrap());
        assert_eq!(sets.count, 6 * 100);
        assert_eq!(gets.count, 6 * 300);
        // Each client's GETs walk keys 1..=100 three times: half even, half odd.
        assert_eq!(gets.hits, 6 * 150);
        assert_eq!(gets.misses, 6 * 150);
        assert_eq!((r.connection_errors, r.unanswered), (0, 0));
        assert!(gets.percentile_ms(50.0) > 0.0);
    }

    // Proves a `;` template is one request answered by its last reply: every request
    // counted once, hits/misses from the last reply, an error anywhere makes it an error.
    #[test]
    fn multi_command_request_waits_for_all_replies() {
        let port = fake_server().to_string();
        let run_with = |command: &str| {
            let o = options(&[
                "-s",
                "127.0.0.1",
                "-p",
                &port,
                "-t",
                "1",
                "-c",
                "2",
                "-n",
                "100",
                &format!("--command={command}"),
                "--command-key-pattern=S",
                "--command-is-read",
                "--pipeline=3",
                "--key-minimum=1",
                "--key-maximum=100",
                "--hide-progress",
            ]);
            run(&o, "").unwrap()
        };
        let r = run_with("SET __key__ v ; SET __key__ v ; GET __key__");
        let t = r.totals();
        assert_eq!(
            (t.count, t.hits, t.misses, t.error_replies),
            (200, 100, 100, 0)
        );
        assert_eq!((r.connection_errors, r.unanswered), (0, 0));
        let r = run_with("BAD __key__ ; GET __key__");
        let t = r.totals();
        assert_eq!((t.count, t.hits, t.error_replies), (200, 0, 200));
        assert_eq!(r.unanswered, 0);
    }

    // Proves a timed run stops near its deadline and leaves nothing unanswered.
    #[test]
    fn timed_run_stops() {
        let port = fake_server().to_string();
        let o = options(&[
            "-s",
            "127.0.0.1",
            "-p",
            &port,
            "-t",
            "1",
            "-c",
            "2",
            "--test-time=1",
            "--ratio=0:1",
            "--hide-progress",
        ]);
        let t = Instant::now();
        let r = run(&o, "").unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "took {:?}",
            t.elapsed()
        );
        assert!(r.op("Gets").unwrap().count > 0);
        assert_eq!(r.unanswered, 0);
    }

    // Proves a refused connection is reported as a connection error, not a hang.
    #[test]
    fn refused_connection_is_counted() {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let port = port.to_string();
        let o = options(&[
            "-s",
            "127.0.0.1",
            "-p",
            &port,
            "-t",
            "1",
            "-c",
            "2",
            "-n",
            "5",
            "--hide-progress",
        ]);
        let r = run(&o, "").unwrap();
        assert_eq!(r.connection_errors, 2);
        assert_eq!(r.totals().count, 0);
    }
}
