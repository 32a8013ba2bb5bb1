//! Commands that need only a paged collection's root answer from it (issue 13, "RSS under
//! load": OBJECT ENCODING used to read every page of a 10M-member collection), and commands
//! on one hot paged collection cost a bounded number of device reads (issue 14).
mod common;
use common::diff::Pair;

/// Elements per collection: enough for directory pages above the leaves.
const N: u64 = 6_000;

/// Fills hash `h`, set `s`, list `l` and sorted set `z` (N elements each) on both servers,
/// then restarts lavik so that every root and page is on the device (`--cache-size 0`:
/// nothing cached, nothing staged).
fn paged_pair(tag: &str) -> Pair {
    let mut p = Pair::start(
        tag,
        &["--threads", "1", "--cache-size", "0", "--defrag-paused"],
    );
    for start in (0..N).step_by(300) {
        let range = start..(start + 300).min(N);
        let mut hset = vec!["HSET".to_string(), "h".into()];
        let mut sadd = vec!["SADD".to_string(), "s".into()];
        let mut rpush = vec!["RPUSH".to_string(), "l".into()];
        let mut zadd = vec!["ZADD".to_string(), "z".into()];
        for i in range {
            hset.extend([format!("field:{i}"), i.to_string()]);
            sadd.push(format!("member:{i}"));
            rpush.push(format!("item:{i}"));
            zadd.extend([i.to_string(), format!("member:{i}")]);
        }
        for cmd in [hset, sadd, rpush, zadd] {
            let a: Vec<&str> = cmd.iter().map(|x| x.as_str()).collect();
            p.check(&a);
        }
    }
    p.check(&["SET", "str", "x"]);
    p.lavik.restart();
    p.l = common::diff::RespConn::connect(p.lavik.port);
    p
}

// OBJECT ENCODING (and the other commands that need only a key's kind, expiry or
// existence) on paged collections whose pages are all on the device read no page: no run
// is restarted for a page (`lavik_restart_reads`) and nothing is read synchronously
// (`lavik_sync_reads`), while the replies are redis-server's. Before the change OBJECT
// ENCODING, SCAN TYPE, TTL/PTTL/EXPIRE/PERSIST, RENAMENX/COPY/MOVE onto an existing key read
// the whole collection (every leaf, restarted round by round).
#[test]
fn root_only_commands_read_no_page() {
    let mut p = paged_pair("hot-rootonly");
    let restart_reads = p.lavik.info_u64("stats", "lavik_restart_reads");
    let sync_reads = p.lavik.info_u64("stats", "lavik_sync_reads");
    // Each key also exists in db 1, so MOVE answers 0.
    p.check(&["SELECT", "1"]);
    p.check(&["MSET", "h", "1", "s", "1", "l", "1", "z", "1"]);
    p.check(&["SELECT", "0"]);
    for key in ["h", "s", "l", "z"] {
        p.check(&["OBJECT", "ENCODING", key]);
        p.check(&["OBJECT", "REFCOUNT", key]);
        // Redis's idle time is its clock's (lavik keeps none: always 0), so lavik alone.
        let idle = p.l.call(&[b"OBJECT", b"IDLETIME", key.as_bytes()]);
        assert_eq!(idle, b":0\r\n", "OBJECT IDLETIME {key}");
        p.check(&["OBJECT", "FREQ", key]);
        p.check(&["TYPE", key]);
        p.check(&["EXISTS", key]);
        p.check(&["TTL", key]);
        p.check(&["PTTL", key]);
        p.check(&["EXPIRETIME", key]);
        p.check(&["EXPIRE", key, "1000", "XX"]);
        p.check(&["EXPIRE", key, "1000"]);
        p.check(&["EXPIRE", key, "2000", "NX"]);
        p.check(&["EXPIRE", key, "10", "GT"]);
        p.check(&["TTL", key]);
        p.check(&["PERSIST", key]);
        p.check(&["PERSIST", key]);
        p.check(&["TTL", key]);
        p.check(&["RENAMENX", key, "str"]);
        p.check(&["COPY", key, "str"]);
        p.check(&["MOVE", key, "1"]);
        p.check(&["RENAME", key, key]);
    }
    assert_eq!(
        p.lavik.info_u64("stats", "lavik_restart_reads"),
        restart_reads,
        "a root-only command read pages"
    );
    assert_eq!(
        p.lavik.info_u64("stats", "lavik_sync_reads"),
        sync_reads,
        "a root-only command read synchronously"
    );
    // SCAN with TYPE: the kind of each key from its root. SCAN touches every shard, so it
    // reads synchronously (`docs/architecture.md`): at most the 5 keys' records per call.
    let sync_reads = p.lavik.info_u64("stats", "lavik_sync_reads");
    for (t, want) in [("hash", "h"), ("set", "s"), ("list", "l"), ("zset", "z")] {
        let got =
            p.l.call(&[b"SCAN", b"0", b"COUNT", b"100", b"TYPE", t.as_bytes()]);
        let want = format!("*2\r\n$1\r\n0\r\n*1\r\n$1\r\n{want}\r\n");
        assert_eq!(String::from_utf8_lossy(&got), want, "SCAN TYPE {t}");
    }
    let scan_reads = p.lavik.info_u64("stats", "lavik_sync_reads") - sync_reads;
    assert!(scan_reads <= 4 * 5, "SCAN TYPE read {scan_reads} records");
    // The collections are intact (the counted commands read only their roots).
    for cmd in [["HLEN", "h"], ["SCARD", "s"], ["LLEN", "l"], ["ZCARD", "z"]] {
        p.check(&cmd);
    }
}

/// Device reads of every shard so far (INFO storage, `device_reads=` of each shard line).
fn device_reads(s: &common::Server) -> u64 {
    let mut c = s.raw();
    let text = c.bulk(&[b"INFO", b"storage"]);
    text.lines()
        .filter(|l| l.starts_with("shard"))
        .flat_map(|l| l.split(','))
        .filter_map(|f| f.strip_prefix("device_reads="))
        .map(|n| n.trim().parse::<u64>().unwrap())
        .sum()
}

// Concurrent pushes from many connections on one paged list whose pages are all on the
// device (cache off): each of them misses the same root, directory page and end leaf. A
// record already on the ring for another parked command is not read again (the command
// waits for that read and takes a copy), so the pushes cost a few device reads in all, not
// a few per push; each is applied exactly once. The read delay keeps every push's reads
// overlapping the first one's. Before the change: 3 reads per push (over 100 here).
#[test]
fn concurrent_pushes_on_one_paged_list_share_their_reads() {
    const CONNS: usize = 40;
    let mut s = common::Server::start(
        "hot-pushes",
        &["--threads", "1", "--cache-size", "0", "--defrag-paused"],
    );
    {
        let mut c = s.raw();
        for start in (0..N).step_by(500) {
            let mut cmd = vec!["RPUSH".to_string(), "l".into()];
            cmd.extend((start..(start + 500).min(N)).map(|i| format!("item:{i}")));
            let a: Vec<&[u8]> = cmd.iter().map(|x| x.as_bytes()).collect();
            c.cmd(&a);
            let rep = c.read_exact(1);
            assert_eq!(rep, b":");
            let mut line = Vec::new();
            while !line.ends_with(b"\r\n") {
                line.extend(c.read_exact(1));
            }
        }
        c.expect(&[b"OBJECT", b"ENCODING", b"l"], b"$9\r\nquicklist\r\n");
    }
    s.args
        .extend(["--debug-read-delay-ms", "300"].map(String::from));
    s.restart();
    let before = device_reads(&s);
    let mut conns: Vec<_> = (0..CONNS).map(|_| s.raw()).collect();
    for (i, c) in conns.iter_mut().enumerate() {
        let v = format!("new:{i}");
        c.send(&common::resp(&["LPUSH", "l", &v]));
    }
    let mut lens = Vec::new();
    for c in conns.iter_mut() {
        let mut line = Vec::new();
        while !line.ends_with(b"\r\n") {
            line.extend(c.read_exact(1));
        }
        let text = String::from_utf8_lossy(&line).into_owned();
        let n: u64 = text
            .trim()
            .strip_prefix(':')
            .unwrap_or_else(|| panic!("LPUSH answered {text:?}"))
            .parse()
            .unwrap();
        lens.push(n);
    }
    let reads = device_reads(&s) - before;
    lens.sort_unstable();
    let want: Vec<u64> = (N + 1..=N + CONNS as u64).collect();
    assert_eq!(lens, want, "every push applied once");
    let mut c = s.raw();
    c.expect(
        &[b"LLEN", b"l"],
        format!(":{}\r\n", N + CONNS as u64).as_bytes(),
    );
    assert!(
        reads <= 12,
        "{CONNS} concurrent pushes on one list read {reads} records from the device"
    );
}

/// Fills list `key` with `n` elements `item:0..n` (RPUSH batches of 500).
fn fill_list(s: &common::Server, key: &str, n: u64) {
    let mut c = s.raw();
    for start in (0..n).step_by(500) {
        let mut cmd = vec!["RPUSH".to_string(), key.into()];
        cmd.extend((start..(start + 500).min(n)).map(|i| format!("item:{i}")));
        let a: Vec<&[u8]> = cmd.iter().map(|x| x.as_bytes()).collect();
        c.cmd(&a);
        let _ = read_line(&mut c);
    }
    c.expect(
        &[b"OBJECT", b"ENCODING", key.as_bytes()],
        b"$9\r\nquicklist\r\n",
    );
}

fn read_line(c: &mut common::Raw) -> String {
    let mut line = Vec::new();
    while !line.ends_with(b"\r\n") {
        line.extend(c.read_exact(1));
    }
    String::from_utf8_lossy(&line).into_owned()
}

/// Reads one bulk-string reply (`$n\r\n...\r\n`).
fn read_bulk(c: &mut common::Raw) -> String {
    let head = read_line(c);
    let n: usize = head
        .trim()
        .strip_prefix('$')
        .unwrap_or_else(|| panic!("not a bulk reply: {head:?}"))
        .parse()
        .unwrap();
    let body = c.read_exact(n + 2);
    String::from_utf8_lossy(&body[..n]).into_owned()
}

/// All elements of list `key` (LRANGE 0 -1).
fn list_contents(s: &common::Server, key: &str) -> Vec<String> {
    let mut c = s.raw();
    c.cmd(&[b"LRANGE", key.as_bytes(), b"0", b"-1"]);
    let head = read_line(&mut c);
    let n: usize = head.trim().strip_prefix('*').unwrap().parse().unwrap();
    (0..n).map(|_| read_bulk(&mut c)).collect()
}

/// Sends one command from each of `conns` while the worker sleeps (DEBUG SLEEP on
/// another connection), so that all of them are in the worker's next batch whatever the
/// machine's load; returns each connection's reply line (or bulk body).
fn one_batch(
    s: &common::Server,
    conns: &mut [common::Raw],
    cmds: &[Vec<String>],
    bulk: bool,
) -> Vec<String> {
    let mut sleeper = s.raw();
    sleeper.send(&common::resp(&["DEBUG", "SLEEP", "0.3"]));
    // Sent while the worker sleeps, the commands below are all readable when it wakes.
    std::thread::sleep(std::time::Duration::from_millis(50));
    for (c, cmd) in conns.iter_mut().zip(cmds) {
        let a: Vec<&str> = cmd.iter().map(|x| x.as_str()).collect();
        c.send(&common::resp(&a));
    }
    let replies = conns
        .iter_mut()
        .map(|c| if bulk { read_bulk(c) } else { read_line(c) })
        .collect();
    assert_eq!(read_line(&mut sleeper), "+OK\r\n");
    replies
}

// N connections pushing to (and popping from) one paged list in the same batches write
// far fewer device bytes per command than one end-leaf + directory page + root each: the
// batch's commands run on the decoded list kept in the shard's overlay, stored once when
// the round ends (docs/collections.md section 5a). The contents are exact: every push
// applied once, the pops return the head elements exactly once, a restart shows the same
// list. Without the overlay (`--coalesce-lists no`) the pushes write 1 843 B each (552 960
// bytes for 300: every push its own end leaf, directory page and root), which fails the
// bound below.
#[test]
fn concurrent_pushes_on_one_paged_list_coalesce() {
    const CONNS: usize = 50;
    const ROUNDS: usize = 6;
    let mut s = common::Server::start(
        "hot-coalesce",
        &[
            "--threads",
            "1",
            "--defrag-paused",
            "--appendfsync",
            "always",
        ],
    );
    fill_list(&s, "l", N);
    let mut conns: Vec<_> = (0..CONNS).map(|_| s.raw()).collect();
    let bytes_before = s.info_u64("storage", "lavik_device_write_bytes");
    let coalesced_before = s.info_u64("storage", "lavik_coalesced_commands");
    let mut pushed = Vec::new();
    for round in 0..ROUNDS {
        let cmds: Vec<Vec<String>> = (0..CONNS)
            .map(|i| {
                let v = format!("new:{round}:{i}");
                pushed.push(v.clone());
                vec!["LPUSH".into(), "l".into(), v]
            })
            .collect();
        let mut lens: Vec<u64> = one_batch(&s, &mut conns, &cmds, false)
            .iter()
            .map(|r| r.trim().strip_prefix(':').unwrap().parse().unwrap())
            .collect();
        lens.sort_unstable();
        let base = N + (round * CONNS) as u64;
        assert_eq!(lens, (base + 1..=base + CONNS as u64).collect::<Vec<_>>());
    }
    let bytes = s.info_u64("storage", "lavik_device_write_bytes") - bytes_before;
    let coalesced = s.info_u64("storage", "lavik_coalesced_commands") - coalesced_before;
    let per_push = bytes / (ROUNDS * CONNS) as u64;
    eprintln!(
        "{bytes} device bytes for {} pushes, {coalesced} from the overlay",
        ROUNDS * CONNS
    );
    assert!(
        per_push <= 1_024,
        "{} pushes in {ROUNDS} batches wrote {bytes} device bytes ({per_push} per push; \
         {coalesced} served from the overlay)",
        ROUNDS * CONNS
    );
    // Exact contents: the head holds the pushes (each batch in some order, batches newest
    // first), then the original list unchanged.
    let all = list_contents(&s, "l");
    assert_eq!(all.len(), N as usize + pushed.len());
    for round in 0..ROUNDS {
        let at = (ROUNDS - 1 - round) * CONNS;
        let mut got = all[at..at + CONNS].to_vec();
        got.sort();
        let mut want = pushed[round * CONNS..(round + 1) * CONNS].to_vec();
        want.sort();
        assert_eq!(got, want, "batch {round} of pushes");
    }
    let tail: Vec<String> = (0..N).map(|i| format!("item:{i}")).collect();
    assert_eq!(all[pushed.len()..], tail[..]);
    // Pops in batches: each pops one of the head's elements, exactly once, in list order
    // within the batch's set.
    let bytes_before = s.info_u64("storage", "lavik_device_write_bytes");
    let mut popped = Vec::new();
    for _ in 0..ROUNDS {
        let cmds: Vec<Vec<String>> = (0..CONNS)
            .map(|_| vec!["LPOP".into(), "l".into()])
            .collect();
        popped.extend(one_batch(&s, &mut conns, &cmds, true));
    }
    let pop_bytes = s.info_u64("storage", "lavik_device_write_bytes") - bytes_before;
    eprintln!("{pop_bytes} device bytes for {} pops", ROUNDS * CONNS);
    popped.sort();
    let mut want = all[..ROUNDS * CONNS].to_vec();
    want.sort();
    assert_eq!(popped, want, "every pop returned a distinct head element");
    assert!(
        pop_bytes / ((ROUNDS * CONNS) as u64) <= 1_024,
        "pops wrote {pop_bytes} device bytes"
    );
    assert_eq!(list_contents(&s, "l"), tail);
    // Mixed with other commands in one batch: LLEN, LRANGE, DUMP-able state are exact.
    let cmds: Vec<Vec<String>> = (0..CONNS)
        .map(|i| match i % 5 {
            0 => vec!["LLEN".into(), "l".into()],
            1 => vec!["LINDEX".into(), "l".into(), "0".into()],
            _ => vec!["RPUSH".into(), "l".into(), format!("tail:{i}")],
        })
        .collect();
    let replies = one_batch(&s, &mut conns, &cmds, false);
    assert!(replies.iter().all(|r| !r.starts_with('-')), "{replies:?}");
    let after = list_contents(&s, "l");
    assert_eq!(after.len(), N as usize + CONNS / 5 * 3);
    s.restart();
    assert_eq!(
        list_contents(&s, "l"),
        after,
        "a restart shows the same list"
    );
}

// SIGKILL under concurrent pushes on one paged list with `appendfsync always`: every push
// that was acknowledged is in the list after recovery, each client's pushes appear in its
// order with nothing missing before its last acknowledged one (a prefix of each client's
// commands), and the original elements are intact. The overlay is stored before the round's
// group commit, so no reply leaves before its push is durable.
#[test]
fn sigkill_under_coalesced_pushes_loses_nothing_acknowledged() {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    const CONNS: usize = 20;
    let mut s = common::Server::start(
        "hot-coalesce-kill",
        &["--threads", "1", "--appendfsync", "always"],
    );
    fill_list(&s, "l", N);
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..CONNS).map(|_| AtomicU64::new(0)).collect());
    let threads: Vec<_> = (0..CONNS)
        .map(|i| {
            let (stop, acked, port) = (stop.clone(), acked.clone(), s.port);
            std::thread::spawn(move || {
                let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
                let mut buf = [0u8; 64];
                for j in 0u64.. {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let v = format!("c{i}:{j}");
                    if c.write_all(&common::resp(&["RPUSH", "l", &v])).is_err() {
                        return;
                    }
                    let mut got = Vec::new();
                    while !got.ends_with(b"\r\n") {
                        match c.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    assert_eq!(
                        got[0],
                        b':',
                        "RPUSH answered {:?}",
                        String::from_utf8_lossy(&got)
                    );
                    acked[i].store(j + 1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    // Kill once every client has had many pushes acknowledged.
    while acked.iter().any(|a| a.load(Ordering::SeqCst) < 30) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    s.kill9();
    let acked_at_kill: Vec<u64> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    s.restart_after_kill();
    let all = list_contents(&s, "l");
    let original: Vec<String> = (0..N).map(|i| format!("item:{i}")).collect();
    assert_eq!(
        all[..N as usize],
        original[..],
        "the original elements are intact"
    );
    let mut per_conn: Vec<Vec<u64>> = vec![Vec::new(); CONNS];
    for e in &all[N as usize..] {
        let (c, j) = e[1..].split_once(':').unwrap();
        per_conn[c.parse::<usize>().unwrap()].push(j.parse().unwrap());
    }
    for (i, got) in per_conn.iter().enumerate() {
        let want: Vec<u64> = (0..got.len() as u64).collect();
        assert_eq!(got, &want, "client {i}: its pushes in order, none missing");
        assert!(
            got.len() as u64 >= acked_at_kill[i],
            "client {i}: {} acknowledged, {} survived",
            acked_at_kill[i],
            got.len()
        );
    }
}
