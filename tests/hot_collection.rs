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
