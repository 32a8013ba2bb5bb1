//! The real `lavik` binary on the userspace NVMe driver, end to end, inside the guest.
//!
//! The guest script passes the server binary (`LAVIK_SERVER_BIN`) and a namespace of its
//! own (`LAVIK_SERVER_URI`, a blank 512 MiB controller). This module starts
//! `lavik --storage=spdk --data-file=<uri> --threads 1 --no-pin-workers` on 127.0.0.1,
//! talks RESP to it over `std::net::TcpStream`, and proves:
//!
//! 1. a fresh namespace is formatted and a few thousand keys (binary values from 1 byte
//!    to 1.5 MiB, so small records, sector-spanning records and the multi-block extent
//!    path) are stored, overwritten and deleted, every reply as expected, and read back
//!    exactly while the server runs (some reads from the device, counted in `INFO`);
//! 2. SIGTERM stops it cleanly (exit status 0), and a restart — this one on locked 4 KiB
//!    pages (`BYCORF_EAL_ARGS=--no-huge`) instead of hugepages — recovers every key with
//!    its exact value and no deleted key;
//! 3. with `--appendfsync always`, SIGKILL in the middle of a pipelined load loses no
//!    acknowledged write: after a restart (with two workers, so two I/O queue pairs)
//!    every acknowledged key holds its value, a key sent but not acknowledged is either
//!    absent or exact, nothing never sent exists;
//! 4. the store never ran out of space (no `-OOM`; free blocks left at the end).
//!
//! Each step prints `PASS server-<name>` / `FAIL server-<name>: <why>` through `Report`.
use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::Report;

const PORT: u16 = 6390;
/// Keys loaded in phase 1.
const KEY_COUNT: usize = 3000;
/// Keys the writer tries to store under `appendfsync always` before it is killed.
const ALWAYS_KEY_COUNT: usize = 1200;
/// SIGKILL lands once this many of those were acknowledged.
const ALWAYS_KILL_AFTER_ACKED: usize = 400;
/// Commands written before their replies are read.
const PIPELINE_DEPTH: usize = 32;
/// Under TCG a start (bring-up, recovery scan) takes seconds; this only bounds a hang.
const START_TIMEOUT: Duration = Duration::from_secs(90);
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// Larger than one 1 MiB log block: stored through the extent path.
const BIG_VALUE_BYTES: usize = 1536 << 10;

// ----- a minimal RESP2 client ----------------------------------------------------------

#[derive(Debug, PartialEq)]
enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

struct Client {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
    out: Vec<u8>,
}

impl Client {
    fn connect() -> io::Result<Client> {
        let s = TcpStream::connect(("127.0.0.1", PORT))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(Client {
            reader: BufReader::new(s.try_clone()?),
            writer: s,
            out: Vec::new(),
        })
    }

    /// Appends one command to the output buffer (sent by `flush`).
    fn queue(&mut self, args: &[&[u8]]) {
        self.out
            .extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            self.out
                .extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            self.out.extend_from_slice(a);
            self.out.extend_from_slice(b"\r\n");
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.writer.write_all(&self.out)?;
        self.out.clear();
        Ok(())
    }

    fn call(&mut self, args: &[&[u8]]) -> io::Result<Reply> {
        self.queue(args);
        self.flush()?;
        self.read_reply()
    }

    fn line(&mut self) -> io::Result<String> {
        let mut l = Vec::new();
        self.reader.read_until(b'\n', &mut l)?;
        if !l.ends_with(b"\r\n") {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed mid-reply",
            ));
        }
        l.truncate(l.len() - 2);
        String::from_utf8(l).map_err(|_| bad("reply line is not UTF-8"))
    }

    fn read_reply(&mut self) -> io::Result<Reply> {
        let l = self.line()?;
        let (kind, rest) = l.split_at(if l.is_empty() { 0 } else { 1 });
        let number = || rest.parse::<i64>().map_err(|_| bad("bad length"));
        Ok(match kind {
            "+" => Reply::Simple(rest.to_string()),
            "-" => Reply::Error(rest.to_string()),
            ":" => Reply::Int(number()?),
            "$" => match number()? {
                -1 => Reply::Bulk(None),
                n if n >= 0 => {
                    let mut b = vec![0; n as usize + 2];
                    self.reader.read_exact(&mut b)?;
                    if !b.ends_with(b"\r\n") {
                        return Err(bad("bulk string not closed by CRLF"));
                    }
                    b.truncate(n as usize);
                    Reply::Bulk(Some(b))
                }
                _ => return Err(bad("negative bulk length")),
            },
            "*" => match number()? {
                -1 => Reply::Array(None),
                n if n >= 0 => Reply::Array(Some(
                    (0..n)
                        .map(|_| self.read_reply())
                        .collect::<io::Result<_>>()?,
                )),
                _ => return Err(bad("negative array length")),
            },
            _ => return Err(bad(&format!("unknown reply type in {l:?}"))),
        })
    }
}

fn bad(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_string())
}

// ----- the server process ---------------------------------------------------------------

struct Server {
    child: Child,
    log: PathBuf,
    /// On the userspace NVMe driver (else the io_uring file backend).
    spdk: bool,
}

impl Server {
    /// Starts lavik and waits until it answers PING.
    fn start(
        bin: &Path,
        uri: &str,
        extra: &[&str],
        env: &[(&str, &str)],
        run: usize,
    ) -> Result<Server, String> {
        let log = PathBuf::from(format!("/tmp/lavik-run{run}.log"));
        let log_file =
            std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let port = PORT.to_string();
        let data_file = format!("--data-file={uri}");
        // A plain path runs the same checks on the io_uring file backend (host debugging).
        let spdk = uri.starts_with("spdk://");
        let storage = if spdk {
            "--storage=spdk"
        } else {
            "--data-file-size=512mb"
        };
        let mut args = vec![
            storage,
            data_file.as_str(),
            "--threads",
            "1",
            "--no-pin-workers",
            "--bind",
            "127.0.0.1",
            "--port",
            port.as_str(),
        ];
        args.extend_from_slice(extra);
        let child = Command::new(bin)
            .args(&args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", bin.display()))?;
        let mut server = Server { child, log, spdk };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!(
                    "exited during start ({status}){}",
                    server.log_tail()
                ));
            }
            if let Ok(mut c) = Client::connect() {
                match c.call(&[b"PING"]) {
                    Ok(Reply::Simple(p)) if p == "PONG" => return Ok(server),
                    // Listening while recovery runs: ready once PING answers PONG.
                    Ok(Reply::Error(e)) if e.starts_with("LOADING") => {}
                    other => return Err(format!("PING: {other:?}{}", server.log_tail())),
                }
            }
            if Instant::now() > deadline {
                let _ = server.child.kill();
                return Err(format!(
                    "not ready after {START_TIMEOUT:?}{}",
                    server.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM (through the `kill` applet: no unsafe code here) and wait for the exit.
    fn terminate(&mut self) -> Result<ExitStatus, String> {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", pid.as_str()])
            .status()
            .map_err(|e| format!("kill -TERM: {e}"))?;
        if !sent.success() {
            return Err(format!("kill -TERM {pid}: {sent}"));
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() > deadline => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return Err(format!(
                        "still running {STOP_TIMEOUT:?} after SIGTERM{}",
                        self.log_tail()
                    ));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(format!("wait: {e}")),
            }
        }
    }

    /// The last lines of the server's log, for failure messages.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(12)..].join("\n  | ");
        format!("; {} ends:\n  | {tail}", self.log.display())
    }

    /// Copies the server's log to the console (prefixed, so the host script's filter
    /// leaves it out of its summary) and returns it.
    fn echo_log(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let name = self.log.file_stem().unwrap_or_default().to_string_lossy();
        for line in text.lines() {
            println!("{name}| {line}");
        }
        text
    }

    /// SIGTERM, then require exit status 0 and a log without ERROR lines (and without
    /// WARN lines unless `warnings_allowed`: a restart after SIGKILL may warn about the
    /// torn tail it skipped).
    fn stop(mut self, warnings_allowed: bool) -> Result<(), String> {
        let status = self.terminate()?;
        if !status.success() {
            return Err(format!("exit after SIGTERM: {status}{}", self.log_tail()));
        }
        let text = self.echo_log();
        let problems: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(" ERROR ") || (!warnings_allowed && l.contains(" WARN ")))
            .collect();
        if !problems.is_empty() {
            return Err(format!("server logged: {problems:?}"));
        }
        // A clean stop ends with the controller's normal shutdown (CC.SHN), not just exit.
        if self.spdk && !text.contains("controller shut down") {
            return Err("exit 0 but no controller shutdown logged".into());
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Only reached on a failed check or after an exit was collected: never leave a
        // server holding the controller for the next step.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ----- data -------------------------------------------------------------------------------

fn key(i: usize) -> Vec<u8> {
    format!("key:{i:05}").into_bytes()
}

fn always_key(j: usize) -> Vec<u8> {
    format!("always:{j:05}").into_bytes()
}

/// Value of key `i` at generation `generation`: binary (CR, LF and NUL included), length
/// mostly 1..2000 bytes, every 10th 4000..8000 (spans sectors), every 500th 200 KiB.
fn value(i: usize, generation: u64) -> Vec<u8> {
    let len = match (i, i % 500, i % 10) {
        (0, _, _) => BIG_VALUE_BYTES,
        (_, 0, _) => 200 << 10,
        (_, _, 0) => 4000 + (i * 37) % 4000,
        _ => 1 + (i * 131 + generation as usize * 17) % 2000,
    };
    let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ generation.rotate_left(29);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Runs `commands` pipelined `PIPELINE_DEPTH` at a time; `check` judges each reply.
fn pipelined(
    c: &mut Client,
    commands: &[Vec<Vec<u8>>],
    check: impl Fn(usize, &Reply) -> Result<(), String>,
) -> Result<(), String> {
    for (batch_no, batch) in commands.chunks(PIPELINE_DEPTH).enumerate() {
        for cmd in batch {
            let args: Vec<&[u8]> = cmd.iter().map(Vec::as_slice).collect();
            c.queue(&args);
        }
        c.flush().map_err(|e| format!("send: {e}"))?;
        for k in 0..batch.len() {
            let n = batch_no * PIPELINE_DEPTH + k;
            let r = c.read_reply().map_err(|e| format!("reply {n}: {e}"))?;
            check(n, &r)?;
        }
    }
    Ok(())
}

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// GETs every key of `model` plus the `absent` ones and compares byte for byte.
fn verify(c: &mut Client, model: &Model, absent: &[Vec<u8>]) -> Result<String, String> {
    let keys: Vec<&Vec<u8>> = model.keys().chain(absent.iter()).collect();
    let commands: Vec<Vec<Vec<u8>>> = keys
        .iter()
        .map(|k| vec![b"GET".to_vec(), k.to_vec()])
        .collect();
    pipelined(c, &commands, |n, r| {
        let k = keys[n];
        let want = model.get(k);
        match (r, want) {
            (Reply::Bulk(Some(got)), Some(want)) if got == want => Ok(()),
            (Reply::Bulk(None), None) => Ok(()),
            (Reply::Bulk(Some(got)), Some(want)) => Err(format!(
                "{}: {} bytes, want {} bytes (first difference at {})",
                String::from_utf8_lossy(k),
                got.len(),
                want.len(),
                got.iter()
                    .zip(want.iter())
                    .position(|(a, b)| a != b)
                    .unwrap_or(got.len().min(want.len()))
            )),
            (other, _) => Err(format!("GET {}: {other:?}", String::from_utf8_lossy(k))),
        }
    })?;
    match c.call(&[b"DBSIZE"]) {
        Ok(Reply::Int(n)) if n as usize == model.len() => Ok(format!(
            "{} keys exact, {} absent, DBSIZE {n}",
            model.len(),
            absent.len()
        )),
        other => Err(format!("DBSIZE {other:?}, want {}", model.len())),
    }
}

/// `INFO <section>` as field → value (per-shard lines are summed by field name).
fn info(c: &mut Client, section: &str) -> Result<BTreeMap<String, String>, String> {
    let text = match c.call(&[b"INFO", section.as_bytes()]) {
        Ok(Reply::Bulk(Some(b))) => String::from_utf8_lossy(&b).into_owned(),
        other => return Err(format!("INFO {section}: {other:?}")),
    };
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some((name, v)) = line.split_once(':') else {
            continue;
        };
        if name.starts_with("shard") && v.contains('=') {
            for (f, x) in v.split(',').filter_map(|kv| kv.split_once('=')) {
                let Ok(x) = x.parse::<u64>() else { continue };
                let e = out.entry(f.to_string()).or_insert_with(|| "0".to_string());
                // blocks_free is store-wide, the same on every shard: keep one copy.
                *e = if f == "blocks_free" {
                    x
                } else {
                    e.parse::<u64>().unwrap_or(0) + x
                }
                .to_string();
            }
        } else {
            out.insert(name.to_string(), v.to_string());
        }
    }
    Ok(out)
}

fn field(info: &BTreeMap<String, String>, name: &str) -> Result<u64, String> {
    info.get(name)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("INFO has no numeric {name}"))
}

// ----- the phases ---------------------------------------------------------------------------

/// Phase 1: fresh namespace; load, overwrite, delete, read back while running; SIGTERM.
fn load_phase(
    bin: &Path,
    uri: &str,
    model: &mut Model,
    deleted: &mut Vec<Vec<u8>>,
) -> Result<String, String> {
    let server = Server::start(bin, uri, &[], &[], 1)?;
    let mut c = Client::connect().map_err(|e| format!("connect: {e}"))?;
    let persistence = info(&mut c, "persistence")?;
    if persistence.get("appendfsync").map(String::as_str) != Some("everysec") {
        return Err(format!(
            "appendfsync {:?}, want everysec",
            persistence.get("appendfsync")
        ));
    }
    let mut commands = Vec::new();
    for i in 0..KEY_COUNT {
        commands.push(vec![b"SET".to_vec(), key(i), value(i, 0)]);
        model.insert(key(i), value(i, 0));
    }
    // Overwrite every 7th key, delete every 11th (the ones divisible by both: deleted).
    for i in (0..KEY_COUNT).step_by(7) {
        commands.push(vec![b"SET".to_vec(), key(i), value(i, 1)]);
        model.insert(key(i), value(i, 1));
    }
    let set_count = commands.len();
    for i in (0..KEY_COUNT).step_by(11) {
        commands.push(vec![b"DEL".to_vec(), key(i)]);
        model.remove(&key(i));
        deleted.push(key(i));
    }
    pipelined(&mut c, &commands, |n, r| match r {
        Reply::Simple(s) if n < set_count && s == "OK" => Ok(()),
        Reply::Int(1) if n >= set_count => Ok(()),
        other => Err(format!("command {n}: {other:?}")),
    })?;
    let seen = verify(&mut c, model, deleted)?;
    let storage = info(&mut c, "storage")?;
    let reads = field(&storage, "device_reads")?;
    let fsyncs = field(&storage, "fsyncs")?;
    if reads == 0 || fsyncs == 0 {
        return Err(format!(
            "device_reads {reads}, fsyncs {fsyncs}: the device was not used"
        ));
    }
    drop(c);
    server.stop(false)?;
    Ok(format!(
        "{seen}; {reads} device reads, {fsyncs} flushes; SIGTERM exit 0"
    ))
}

/// Phase 2: restart (DMA memory on locked 4 KiB pages) and read everything back; SIGTERM.
fn restart_phase(
    bin: &Path,
    uri: &str,
    model: &Model,
    deleted: &[Vec<u8>],
) -> Result<String, String> {
    let server = Server::start(bin, uri, &[], &[("BYCORF_EAL_ARGS", "--no-huge")], 2)?;
    let mut c = Client::connect().map_err(|e| format!("connect: {e}"))?;
    let recovered = field(&info(&mut c, "persistence")?, "lavik_recovered_keys")?;
    if recovered as usize != model.len() {
        return Err(format!("recovered {recovered} keys, want {}", model.len()));
    }
    let seen = verify(&mut c, model, deleted)?;
    // After a restart nothing is cached: the GETs' reads went to the NVMe queue pair
    // asynchronously (parked commands completed from the worker's poll of its queue).
    let stats = info(&mut c, "stats")?;
    let queue_reads = field(&stats, "lavik_device_queue_reads")?;
    let sync_reads = field(&stats, "lavik_sync_reads")?;
    if queue_reads == 0 {
        return Err(format!(
            "lavik_device_queue_reads 0 (sync reads {sync_reads}): no read went through the worker's NVMe queue"
        ));
    }
    drop(c);
    server.stop(false)?;
    Ok(format!(
        "{recovered} recovered (BYCORF_EAL_ARGS=--no-huge); {seen}; {queue_reads} reads from the worker's NVMe queue, {sync_reads} synchronous; SIGTERM exit 0"
    ))
}

/// Phase 3: `--appendfsync always`, a pipelined writer, SIGKILL once enough was
/// acknowledged. Returns (acknowledged, sent).
fn kill_phase(bin: &Path, uri: &str) -> Result<(usize, usize), String> {
    let mut server = Server::start(bin, uri, &["--appendfsync", "always"], &[], 3)?;
    let mut c = Client::connect().map_err(|e| format!("connect: {e}"))?;
    let persistence = info(&mut c, "persistence")?;
    if persistence.get("appendfsync").map(String::as_str) != Some("always") {
        return Err(format!(
            "appendfsync {:?}, want always",
            persistence.get("appendfsync")
        ));
    }
    let acked = Arc::new(AtomicUsize::new(0));
    let sent = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (acked, sent) = (acked.clone(), sent.clone());
        std::thread::spawn(move || -> Result<(), String> {
            for (batch_no, batch) in (0..ALWAYS_KEY_COUNT)
                .collect::<Vec<_>>()
                .chunks(PIPELINE_DEPTH / 4)
                .enumerate()
            {
                for &j in batch {
                    c.queue(&[b"SET", &always_key(j), &value(j + 1, 7)]);
                }
                sent.fetch_max(
                    batch_no * (PIPELINE_DEPTH / 4) + batch.len(),
                    Ordering::SeqCst,
                );
                if c.flush().is_err() {
                    return Ok(());
                }
                for &j in batch {
                    match c.read_reply() {
                        Ok(Reply::Simple(s)) if s == "OK" => acked.store(j + 1, Ordering::SeqCst),
                        Ok(other) => return Err(format!("SET {j}: {other:?}")),
                        Err(_) => return Ok(()), // the server was killed
                    }
                }
            }
            Ok(())
        })
    };
    let deadline = Instant::now() + IO_TIMEOUT;
    while acked.load(Ordering::SeqCst) < ALWAYS_KILL_AFTER_ACKED && !writer.is_finished() {
        if Instant::now() > deadline {
            return Err(format!(
                "only {} writes acknowledged",
                acked.load(Ordering::SeqCst)
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    server.child.kill().map_err(|e| format!("SIGKILL: {e}"))?;
    let status = server.child.wait().map_err(|e| format!("wait: {e}"))?;
    server.echo_log();
    writer.join().map_err(|_| "writer panicked".to_string())??;
    let (acked, sent) = (acked.load(Ordering::SeqCst), sent.load(Ordering::SeqCst));
    if status.success() || acked >= ALWAYS_KEY_COUNT {
        return Err(format!(
            "the kill did not land mid-load ({status}, {acked} acknowledged)"
        ));
    }
    Ok((acked, sent))
}

/// Phase 4: restart after the SIGKILL, now with two workers (two I/O queue pairs, keys
/// routed between workers); every acknowledged write is there, exact.
fn after_kill_phase(
    bin: &Path,
    uri: &str,
    model: &mut Model,
    deleted: &[Vec<u8>],
    acked: usize,
    sent: usize,
) -> Result<String, String> {
    // A later --threads overrides the default one (clap: args_override_self).
    let server = Server::start(bin, uri, &["--threads", "2"], &[], 4)?;
    if !std::fs::read_to_string(&server.log)
        .unwrap_or_default()
        .contains("2 queue pair(s)")
    {
        return Err(format!("not on 2 queue pairs{}", server.log_tail()));
    }
    let mut c = Client::connect().map_err(|e| format!("connect: {e}"))?;
    // Sent but not acknowledged: absent or exact; decide per key what the server holds.
    let mut in_doubt_present = 0;
    for j in acked..sent {
        match c.call(&[b"GET", &always_key(j)]) {
            Ok(Reply::Bulk(None)) => {}
            Ok(Reply::Bulk(Some(v))) if v == value(j + 1, 7) => {
                in_doubt_present += 1;
                model.insert(always_key(j), v);
            }
            other => return Err(format!("in-doubt key {j}: {other:?}")),
        }
    }
    for j in 0..acked {
        model.insert(always_key(j), value(j + 1, 7));
    }
    let mut absent = deleted.to_vec();
    absent.extend((sent..ALWAYS_KEY_COUNT).map(always_key));
    let seen = verify(&mut c, model, &absent)?;
    let storage = info(&mut c, "storage")?;
    let free = field(&storage, "blocks_free")?;
    if free == 0 {
        return Err("no free block left: the namespace is too small for this test".into());
    }
    drop(c);
    server.stop(true)?;
    Ok(format!(
        "{acked} acknowledged all present, {in_doubt_present} of {} in doubt present; {seen}; {free} blocks free",
        sent - acked
    ))
}

/// Runs the phases in order; a failed phase ends the sequence (later ones depend on it).
pub fn server_checks(bin: &Path, uri: &str, report: &mut Report) {
    let mut model = Model::new();
    let mut deleted = Vec::new();
    let r = load_phase(bin, uri, &mut model, &mut deleted);
    let ok = r.is_ok();
    report.record("server-load-sigterm", r);
    if !ok {
        return;
    }
    let r = restart_phase(bin, uri, &model, &deleted);
    let ok = r.is_ok();
    report.record("server-restart-exact", r);
    if !ok {
        return;
    }
    let (acked, sent) = match kill_phase(bin, uri) {
        Ok(x) => x,
        Err(e) => return report.record("server-always-sigkill", Err(e)),
    };
    report.record(
        "server-always-sigkill",
        Ok(format!("SIGKILL after {acked} acknowledged, {sent} sent")),
    );
    let r = after_kill_phase(bin, uri, &mut model, &deleted, acked, sent);
    report.record("server-after-sigkill", r);
}
