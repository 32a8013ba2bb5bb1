//! Glob patterns over the wire: pathological KEYS and SCAN MATCH patterns come back
//! promptly and leave the server serving (issue 11's security bug), and KEYS agrees with
//! Debian's `redis-server` on a table of patterns and on random ones.
mod common;
use common::diff::{sorted_elements, Pair, RespConn, Rng};
use common::Server;

/// `a*a*…a*b` with `n` stars: exponential for a naive backtracking matcher.
fn pathological(n: usize) -> Vec<u8> {
    let mut p = b"a*".repeat(n);
    p.push(b'b');
    p
}

/// Collects every key a full SCAN with `MATCH pattern` returns.
fn scan_all(c: &mut RespConn, pattern: &[u8]) -> Vec<Vec<u8>> {
    let mut cursor = b"0".to_vec();
    let mut keys = Vec::new();
    loop {
        let reply = c.call(&[b"SCAN", &cursor, b"MATCH", pattern, b"COUNT", b"1000"]);
        let (next, batch) = parse_scan(&reply);
        keys.extend(batch);
        if next == b"0" {
            break;
        }
        cursor = next;
    }
    keys.sort();
    keys.dedup();
    keys
}

/// Splits a RESP2 SCAN reply into its cursor and keys.
fn parse_scan(reply: &[u8]) -> (Vec<u8>, Vec<Vec<u8>>) {
    fn bulk(b: &[u8], pos: &mut usize) -> Vec<u8> {
        assert_eq!(
            b[*pos],
            b'$',
            "bulk expected in {:?}",
            String::from_utf8_lossy(b)
        );
        let end = *pos + b[*pos..].windows(2).position(|w| w == b"\r\n").unwrap();
        let n: usize = std::str::from_utf8(&b[*pos + 1..end])
            .unwrap()
            .parse()
            .unwrap();
        let v = b[end + 2..end + 2 + n].to_vec();
        *pos = end + 2 + n + 2;
        v
    }
    assert!(
        reply.starts_with(b"*2\r\n"),
        "{:?}",
        String::from_utf8_lossy(reply)
    );
    let mut pos = 4;
    let cursor = bulk(reply, &mut pos);
    let end = pos + reply[pos..].windows(2).position(|w| w == b"\r\n").unwrap();
    let n: usize = std::str::from_utf8(&reply[pos + 1..end])
        .unwrap()
        .parse()
        .unwrap();
    pos = end + 2;
    let keys = (0..n).map(|_| bulk(reply, &mut pos)).collect();
    (cursor, keys)
}

// The patterns that froze a worker for good now get their (empty) answer, and PING answers.
#[test]
fn pathological_patterns_answer_promptly() {
    let server = Server::start("glob-patho", &[]);
    // RespConn reads with a 60 s timeout: a spinning worker fails the test, not hangs it.
    let mut c = RespConn::connect(server.port);
    let long_a = vec![b'a'; 3000];
    for k in [&b"a".repeat(60)[..], &long_a, b"ab", b"other"] {
        assert_eq!(c.call(&[b"SET", k, b"1"]), b"+OK\r\n");
    }
    // The issue's pattern: 19 stars then `b`, against keys of `a` runs.
    let issue = pathological(19);
    assert_eq!(c.call(&[b"KEYS", &issue]), b"*0\r\n");
    assert!(scan_all(&mut c, &issue).is_empty());
    // Many more stars against a 3000-byte key: still O(pattern x key).
    let heavy = pathological(300);
    assert_eq!(c.call(&[b"KEYS", &heavy]), b"*0\r\n");
    assert!(scan_all(&mut c, &heavy).is_empty());
    // Once a key of that shape exists, the same pattern finds it (and only it).
    let mut winner = b"a".repeat(25);
    winner.push(b'b');
    assert_eq!(c.call(&[b"SET", &winner, b"1"]), b"+OK\r\n");
    assert_eq!(
        c.call(&[b"KEYS", &issue]),
        [&b"*1\r\n$26\r\n"[..], &winner, b"\r\n"].concat()
    );
    assert_eq!(scan_all(&mut c, &issue), vec![winner]);
    // Redis's own regression case: 50000 `*?` groups (past its nesting limit) match nothing.
    let nested = b"*?".repeat(50_000);
    assert_eq!(c.call(&[b"KEYS", &nested]), b"*0\r\n");
    // The worker is still serving, on this connection and on a new one.
    assert_eq!(c.call(&[b"PING"]), b"+PONG\r\n");
    let mut fresh = RespConn::connect(server.port);
    assert_eq!(fresh.call(&[b"PING"]), b"+PONG\r\n");
    assert_eq!(fresh.call(&[b"GET", b"other"]), b"$1\r\n1\r\n");
}

const KEYS: &[&[u8]] = &[
    b"",
    b"a",
    b"b",
    b"ab",
    b"abc",
    b"hello",
    b"hallo",
    b"hxllo",
    b"hllo",
    b"heeeello",
    b"h]llo",
    b"-",
    b"]",
    b"^",
    b"\\",
    b"*",
    b"?",
    b"[",
    b"x[",
    b"b\xe9",
    b"\xe9",
    b"\x80",
    b"\x00",
    b"A",
    b"Hello",
    b"key:*",
    b"key:a",
    b"key:",
    b"_",
    b"a-b",
    b"a\\",
    b"{t}1",
];

const PATTERNS: &[&[u8]] = &[
    b"*",
    b"**",
    b"?",
    b"??",
    b"*?",
    b"a*",
    b"*a",
    b"*b*",
    b"h?llo",
    b"h*llo",
    b"h[ae]llo",
    b"h[^e]llo",
    b"h[a-b]llo",
    b"h[b-a]llo",
    b"h[\\]]llo",
    b"[\\-]",
    b"[a\\-z]",
    b"[-a]",
    b"[]",
    b"[^]",
    b"[]x",
    b"[a-]x",
    b"[abc",
    b"[",
    b"[^",
    b"x[",
    b"x\\[",
    b"[a\\",
    b"\\",
    b"a\\",
    b"\\\\",
    b"key:\\*",
    b"key:*",
    b"key:?",
    b"\\?",
    b"\\*",
    b"[a-\xff]",
    b"[a-\xff]*",
    b"b[\x80-\xff]",
    b"[\x80-\xff]",
    b"[\x00-a]",
    b"[^a-z]",
    b"[A-Z]*",
    b"*[",
    b"*]",
    b"?*?",
    b"a*b*c",
    b"*\\",
    b"[*]",
    b"[?]",
    b"[[]",
    b"{t}*",
    b"a[-]b",
    b"a[b-]",
];

fn keys_sorted(p: &mut Pair, pattern: &[u8]) {
    let (l, r) = p.both(&[b"KEYS", pattern]);
    assert_eq!(
        sorted_elements(&l),
        sorted_elements(&r),
        "KEYS {:?}\n lavik: {:?}\n redis: {:?}",
        String::from_utf8_lossy(pattern),
        String::from_utf8_lossy(&l),
        String::from_utf8_lossy(&r)
    );
}

// KEYS gives Redis's answer for every pattern feature and quirk in the table.
#[test]
fn keys_patterns_match_redis() {
    let mut p = Pair::start("glob-diff", &[]);
    for k in KEYS {
        p.check_bytes(&[b"SET", k, b"v"]);
    }
    let long = b"a".repeat(3000);
    p.check_bytes(&[b"SET", &long, b"v"]);
    for pat in PATTERNS {
        keys_sorted(&mut p, pat);
    }
    // Star nesting around Redis's limit of 1000 (the long key has room for all groups).
    for n in [999, 1000, 1001] {
        let mut pat = b"*?".repeat(n);
        keys_sorted(&mut p, &pat);
        pat.push(b'*');
        keys_sorted(&mut p, &pat);
    }
    keys_sorted(&mut p, &pathological(19));
    keys_sorted(&mut p, &pathological(100));
}

// KEYS agrees with Redis on random patterns over the special characters.
#[test]
fn keys_random_patterns_match_redis() {
    let mut p = Pair::start("glob-rand", &[]);
    for k in KEYS {
        p.check_bytes(&[b"SET", k, b"v"]);
    }
    let alphabet: &[u8] = b"ab*?[]^-\\h:x\xe9";
    let mut rng = Rng::new(0x610b_0001);
    for _ in 0..600 {
        let len = rng.below(7) as usize;
        let pat: Vec<u8> = (0..len).map(|_| *rng.pick(alphabet)).collect();
        keys_sorted(&mut p, &pat);
    }
}
