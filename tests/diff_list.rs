//! Differential tests: list and keyspace commands sent to Debian's `redis-server` (7.0.15)
//! and to lavik (`--threads 2`, so keys live on both workers and LMOVE/RPOPLPUSH/LMPOP
//! cross workers), replies compared byte for byte in RESP2 and then RESP3.
//!
//! The list commands' replies are the same in Redis 7.0 and 7.2. OBJECT ENCODING is not:
//! 7.0 always answers `quicklist`, 7.2 (which lavik follows) `listpack` for small lists, so
//! encodings are checked against 7.2's rules in `list_object_encoding` instead of Redis.
mod common;
use common::diff::{Pair, Rng};

/// List keys: plain ones spread over both workers, tagged ones sharing a slot.
const LKEYS: &[&str] = &["l1", "l2", "l3", "{t}a", "{t}b"];
const OTHER: &[&str] = &["str", "{t}s", "h"];
const ELEMS: &[&str] = &["a", "b", "c", "", "1", "-1", "007", "42", "x y", "a"];

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn any_key(rng: &mut Rng) -> String {
    if rng.chance(85) {
        rng.pick(LKEYS).to_string()
    } else {
        rng.pick(OTHER).to_string()
    }
}

fn elem(rng: &mut Rng, big_percent: u64) -> String {
    if rng.chance(big_percent) {
        "E".repeat(200 + rng.below(3000) as usize)
    } else {
        rng.pick(ELEMS).to_string()
    }
}

fn index(rng: &mut Rng) -> String {
    rng.pick(&[
        "0",
        "1",
        "2",
        "-1",
        "-2",
        "5",
        "-7",
        "100",
        "-100",
        "x",
        "9223372036854775807",
        "-9223372036854775808",
    ])
    .to_string()
}

fn end(rng: &mut Rng) -> String {
    rng.pick(&["LEFT", "RIGHT", "left", "Right"]).to_string()
}

fn list_command(rng: &mut Rng, big: u64) -> Vec<String> {
    let k = any_key(rng);
    match rng.below(19) {
        0..=2 => {
            let cmd = *rng.pick(&["LPUSH", "RPUSH", "LPUSHX", "RPUSHX", "RPUSH"]);
            let mut c = s(&[cmd, &k]);
            for _ in 0..1 + rng.below(4) {
                c.push(elem(rng, big));
            }
            c
        }
        3 | 4 => {
            let cmd = *rng.pick(&["LPOP", "RPOP"]);
            let mut c = s(&[cmd, &k]);
            if rng.chance(50) {
                c.push(
                    rng.pick(&["0", "1", "2", "3", "100", "-1", "x"])
                        .to_string(),
                );
            }
            c
        }
        5 => vec!["LLEN".into(), k],
        6 => vec!["LINDEX".into(), k, index(rng)],
        7 => vec!["LSET".into(), k, index(rng), elem(rng, big)],
        8 | 9 => vec!["LRANGE".into(), k, index(rng), index(rng)],
        10 => vec![
            "LINSERT".into(),
            k,
            rng.pick(&["BEFORE", "AFTER", "after", "x"]).to_string(),
            elem(rng, big),
            elem(rng, big),
        ],
        11 => vec![
            "LREM".into(),
            k,
            rng.pick(&["0", "1", "-1", "2", "-2", "x"]).to_string(),
            elem(rng, big),
        ],
        12 => vec!["LTRIM".into(), k, index(rng), index(rng)],
        13 => {
            let mut c = vec!["LPOS".into(), k, elem(rng, big)];
            for _ in 0..rng.below(3) {
                let opt = rng.pick(&["RANK", "COUNT", "MAXLEN"]).to_string();
                let v = rng.pick(&["1", "2", "-1", "-2", "0", "3"]).to_string();
                c.push(opt);
                c.push(v);
            }
            c
        }
        14 | 15 => vec!["LMOVE".into(), k, any_key(rng), end(rng), end(rng)],
        16 => vec!["RPOPLPUSH".into(), k, any_key(rng)],
        _ => {
            let n = 1 + rng.below(3);
            let mut c = vec!["LMPOP".into(), n.to_string()];
            for _ in 0..n {
                c.push(any_key(rng));
            }
            c.push(end(rng));
            if rng.chance(50) {
                c.push("COUNT".into());
                c.push(rng.pick(&["1", "2", "10"]).to_string());
            }
            c
        }
    }
}

fn keyspace_command(rng: &mut Rng) -> Vec<String> {
    let k = any_key(rng);
    match rng.below(10) {
        0 => vec!["DEL".into(), k],
        1 => vec!["TYPE".into(), k],
        2 => vec!["EXISTS".into(), k, any_key(rng)],
        3 => vec!["EXPIRE".into(), k, (rng.below(1000) + 500).to_string()],
        4 => vec!["TTL".into(), k],
        5 => vec!["SET".into(), rng.pick(OTHER).to_string(), "v".into()],
        6 => vec!["HSET".into(), "h".into(), "f".into(), "v".into()],
        7 => {
            let pool = ["{t}a", "{t}b", "{t}s"];
            let (a, b) = (rng.pick(&pool).to_string(), rng.pick(&pool).to_string());
            vec![rng.pick(&["RENAME", "RENAMENX", "COPY"]).to_string(), a, b]
        }
        8 => vec!["PERSIST".into(), k],
        _ => vec![
            "SCAN".into(),
            "0".into(),
            "TYPE".into(),
            "list".into(),
            "COUNT".into(),
            "1000".into(),
        ],
    }
}

/// SCAN's keys come in each server's own order: compare them sorted.
fn scan_sorted(reply: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(reply).into_owned();
    let mut lines: Vec<&str> = text.split("\r\n").collect();
    lines.sort();
    lines.join("|").into_bytes()
}

fn run_one(p: &mut Pair, c: &[String]) {
    let refs: Vec<&str> = c.iter().map(|x| x.as_str()).collect();
    if c[0] == "SCAN" {
        p.check_with(&refs, scan_sorted);
    } else {
        p.check(&refs);
    }
}

fn final_state_agrees(p: &mut Pair) {
    for k in LKEYS.iter().chain(OTHER) {
        p.check(&["TYPE", k]);
        p.check(&["TTL", k]);
        p.check(&["LRANGE", k, "0", "-1"]);
    }
    p.check(&["DBSIZE"]);
}

/// `steps` random commands; `big` percent of the elements are 200 B to 3 KB, so lists
/// cross the 8 KiB listpack limit.
fn sequence(p: &mut Pair, seed: u64, steps: usize, big: u64) {
    let mut rng = Rng::new(seed);
    for _ in 0..steps {
        let c = if rng.chance(85) {
            list_command(&mut rng, big)
        } else {
            keyspace_command(&mut rng)
        };
        run_one(p, &c);
    }
    final_state_agrees(p);
}

// Random list/keyspace sequences (WRONGTYPE, expiry, renames, cross-worker moves) give
// Redis's exact replies, first in RESP2 and then, on the same servers, in RESP3.
#[test]
fn list_random_sequences() {
    let mut p = Pair::start("diff-list", &["--threads", "2"]);
    sequence(&mut p, 0x1157_0001, 3000, 3);
    sequence(&mut p, 0x1157_0003, 1500, 30);
    p.hello(3);
    sequence(&mut p, 0x1157_0002, 3000, 3);
}

// Edge cases: argument checks, option errors and their order, huge counts and indices,
// WRONGTYPE both ways, empty-list deletion, RESP2 nulls versus RESP3 nulls.
#[test]
fn list_edge_cases() {
    let mut p = Pair::start("diff-list-edge", &["--threads", "2"]);
    for proto in [2, 3] {
        if proto == 3 {
            p.hello(3);
        }
        p.check(&["FLUSHALL"]);
        p.check(&["SET", "str", "x"]);
        p.check(&["RPUSH", "l", "a", "b", "c", "a", "b", "a"]);
        let cases: &[&[&str]] = &[
            &["LPUSH", "l"],
            &["LPUSH"],
            &["LLEN"],
            &["LLEN", "l", "x"],
            &["LINDEX", "l"],
            &["LSET", "l", "0"],
            &["LRANGE", "l", "0"],
            &["LINSERT", "l", "before", "a"],
            &["LREM", "l", "0"],
            &["LTRIM", "l", "0"],
            &["LMOVE", "l", "m", "left"],
            &["RPOPLPUSH", "l"],
            &["LPOS", "l"],
            &["LMPOP", "1", "l"],
            &["LPOP", "l", "1", "2"],
            &["RPOP", "l", "1", "2"],
            &["LPOP", "missing"],
            &["LPOP", "missing", "2"],
            &["LPOP", "missing", "0"],
            &["LPOP", "l", "0"],
            &["LPOP", "l", "-1"],
            &["LPOP", "l", "abc"],
            &["LPOP", "str"],
            &["LPOP", "str", "0"],
            &["RPOP", "missing", "x"],
            &["LINDEX", "missing", "x"],
            &["LINDEX", "l", "x"],
            &["LINDEX", "l", "-6"],
            &["LINDEX", "l", "-7"],
            &["LINDEX", "l", "9223372036854775807"],
            &["LINDEX", "l", "-9223372036854775808"],
            &["LINDEX", "l", "99999999999999999999"],
            &["LSET", "missing", "0", "x"],
            &["LSET", "missing", "x", "x"],
            &["LSET", "l", "x", "v"],
            &["LSET", "l", "6", "v"],
            &["LSET", "l", "-7", "v"],
            &["LSET", "str", "0", "v"],
            &["LRANGE", "l", "x", "1"],
            &["LRANGE", "missing", "x", "1"],
            &["LRANGE", "l", "-9223372036854775808", "9223372036854775807"],
            &["LRANGE", "l", "4", "2"],
            &["LRANGE", "str", "0", "-1"],
            &["LINSERT", "l", "middle", "a", "x"],
            &["LINSERT", "missing", "middle", "a", "x"],
            &["LINSERT", "missing", "before", "a", "x"],
            &["LINSERT", "l", "before", "zzz", "x"],
            &["LINSERT", "str", "before", "a", "x"],
            &["LREM", "l", "x", "a"],
            &["LREM", "missing", "x", "a"],
            &["LREM", "l", "-9223372036854775808", "zzz"],
            &["LTRIM", "missing", "x", "0"],
            &["LTRIM", "l", "0", "x"],
            &["LPOS", "l", "a"],
            &["LPOS", "l", "a", "RANK", "0"],
            &["LPOS", "l", "a", "RANK", "x"],
            &["LPOS", "l", "a", "RANK", "9223372036854775807"],
            &["LPOS", "l", "a", "RANK", "-1"],
            &["LPOS", "l", "a", "RANK", "-2", "COUNT", "0"],
            &["LPOS", "l", "a", "COUNT", "0"],
            &["LPOS", "l", "a", "COUNT", "2", "RANK", "2"],
            &["LPOS", "l", "a", "COUNT", "-1"],
            &["LPOS", "l", "a", "COUNT", "x"],
            &["LPOS", "l", "a", "MAXLEN", "-1"],
            &["LPOS", "l", "a", "MAXLEN", "x"],
            &["LPOS", "l", "a", "MAXLEN", "3", "COUNT", "0"],
            &["LPOS", "l", "a", "MAXLEN", "1", "RANK", "-1"],
            &["LPOS", "l", "a", "COUNT"],
            &["LPOS", "l", "a", "FOO", "1"],
            &["LPOS", "l", "zzz"],
            &["LPOS", "l", "zzz", "COUNT", "1"],
            &["LPOS", "missing", "a"],
            &["LPOS", "missing", "a", "COUNT", "1"],
            &["LPOS", "missing", "a", "RANK", "0"],
            &["LPOS", "str", "a"],
            &["LMOVE", "l", "m", "up", "left"],
            &["LMOVE", "l", "m", "left", "down"],
            &["LMOVE", "missing", "str", "left", "left"],
            &["LMOVE", "l", "str", "left", "left"],
            &["LMOVE", "str", "l", "left", "left"],
            &["LMOVE", "l", "l", "left", "right"],
            &["LMOVE", "l", "m", "right", "left"],
            &["RPOPLPUSH", "m", "m"],
            &["RPOPLPUSH", "m", "other"],
            &["LRANGE", "l", "0", "-1"],
            &["LMPOP", "0", "l", "left"],
            &["LMPOP", "-1", "l", "left"],
            &["LMPOP", "x", "l", "left"],
            &["LMPOP", "2", "l", "left"],
            &["LMPOP", "1", "l", "middle"],
            &["LMPOP", "1", "l", "left", "COUNT"],
            &["LMPOP", "1", "l", "left", "COUNT", "0"],
            &["LMPOP", "1", "l", "left", "COUNT", "x"],
            &["LMPOP", "1", "l", "left", "COUNT", "1", "COUNT", "1"],
            &["LMPOP", "1", "l", "left", "FOO"],
            &["LMPOP", "2", "missing", "str", "left"],
            &["LMPOP", "3", "missing", "l", "str", "right", "COUNT", "2"],
            &["LMPOP", "2", "missing", "other", "left"],
            &["LMPOP", "1", "l", "left", "COUNT", "9223372036854775807"],
            &["EXISTS", "l"],
            &["RPUSH", "l", "x"],
            &["LPOP", "l", "9223372036854775807"],
            &["EXISTS", "l"],
            &["RPUSH", "l", "1", "2", "3"],
            &["LTRIM", "l", "5", "10"],
            &["EXISTS", "l"],
            &["RPUSH", "l", "1", "2", "3"],
            &["LREM", "l", "0", "2"],
            &["LREM", "l", "-5", "1"],
            &["LREM", "l", "5", "3"],
            &["EXISTS", "l"],
            &["LPUSHX", "l", "a"],
            &["RPUSHX", "str", "a"],
            &["LPUSH", "str", "a"],
            &["TYPE", "l"],
            &["RPUSH", "l", "v"],
            &["TYPE", "l"],
            &["GET", "l"],
            &["HSET", "l", "f", "v"],
            &["SADD", "l", "m"],
            &["INCR", "l"],
            &["APPEND", "l", "x"],
        ];
        for c in cases {
            p.check(c);
        }
        // Redis 7.2 refuses RANK LONG_MIN (7.0 negated it, overflowing): lavik follows 7.2.
        let rep =
            p.l.call(&[b"LPOS", b"l", b"a", b"RANK", b"-9223372036854775808"]);
        assert_eq!(
            rep,
            b"-ERR value is out of range, value must between -9223372036854775807 and 9223372036854775807\r\n"
        );
    }
}

fn lavik_encoding(p: &mut Pair, key: &str) -> Vec<u8> {
    p.l.call(&[b"OBJECT", b"ENCODING", key.as_bytes()])
}

// OBJECT ENCODING follows Redis 7.2 (list-max-listpack-size -2): listpack until a write
// would pass 8 KiB of listpack, quicklist after, and listpack again once a shrinking
// command brings it to 4 KiB; the contents stay Redis's throughout.
#[test]
fn list_object_encoding() {
    let mut p = Pair::start("diff-list-enc", &[]);
    const LP: &[u8] = b"$8\r\nlistpack\r\n";
    const QL: &[u8] = b"$9\r\nquicklist\r\n";
    let e = "E".repeat(100); // 103 bytes as a listpack entry
                             // 7 + 79 * 103 = 8144 bytes; the 80th push would need 8144 + 100 > 8192.
    for i in 1..=80 {
        p.check(&["RPUSH", "l", &e]);
        let want = if i < 80 { LP } else { QL };
        assert_eq!(lavik_encoding(&mut p, "l"), want, "after {i} pushes");
    }
    // Back to a listpack at 39 elements (7 + 39 * 103 = 4024 <= 4096), not at 40.
    for left in (39..80).rev() {
        p.check(&["RPOP", "l"]);
        let want = if left > 39 { QL } else { LP };
        assert_eq!(lavik_encoding(&mut p, "l"), want, "at {left} elements");
    }
    // Shrinking at the head: the list stays a quicklist while two nodes remain (the 79
    // elements of the converted listpack, then the 80th alone), as Redis keeps it.
    for _ in 0..80 {
        p.check(&["RPUSH", "q", &e]);
    }
    for left in (1..80).rev() {
        p.check(&["LPOP", "q"]);
        let want = if left > 1 { QL } else { LP };
        assert_eq!(lavik_encoding(&mut p, "q"), want, "at {left} elements");
    }
    // One push of many elements is checked once, before it is written, against the raw
    // bytes added (7 + 8000 <= 8192): it stays a listpack of 8247 bytes, as in Redis 7.2,
    // and the next push converts it.
    let many: Vec<&str> = std::iter::repeat_n(e.as_str(), 80).collect();
    let mut c = vec!["LPUSH", "m"];
    c.extend(&many);
    p.check(&c);
    assert_eq!(lavik_encoding(&mut p, "m"), LP);
    p.check(&["LPUSH", "m", "x"]);
    assert_eq!(lavik_encoding(&mut p, "m"), QL);
    // LSET with a big element converts; LTRIM back to a few small ones converts back.
    p.check(&["RPUSH", "s", "a", "b", "c"]);
    assert_eq!(lavik_encoding(&mut p, "s"), LP);
    let big = "B".repeat(9000);
    p.check(&["LSET", "s", "1", &big]);
    assert_eq!(lavik_encoding(&mut p, "s"), QL);
    p.check(&["LTRIM", "s", "0", "0"]);
    assert_eq!(lavik_encoding(&mut p, "s"), LP);
    // Redis 7.2 converts before it looks for the index or the pivot: a failing LSET or
    // LINSERT with a big element still leaves a quicklist.
    p.check(&["LSET", "s", "5", &big]);
    assert_eq!(lavik_encoding(&mut p, "s"), QL);
    p.check(&["LTRIM", "s", "0", "0"]);
    assert_eq!(lavik_encoding(&mut p, "s"), LP);
    p.check(&["LINSERT", "s", "BEFORE", "nothere", &big]);
    assert_eq!(lavik_encoding(&mut p, "s"), QL);
    p.check(&["RPUSH", "s", "z"]);
    p.check(&["RPOP", "s"]);
    assert_eq!(lavik_encoding(&mut p, "s"), LP);
    p.check(&["LRANGE", "s", "0", "-1"]);
    // RESTORE settles the encoding as a freshly loaded list: one fitting node is a listpack.
    let dump = p.r.call(&[b"DUMP", b"m"]);
    let payload_at = dump.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
    let payload = &dump[payload_at..dump.len() - 2];
    assert_eq!(
        p.l.call(&[b"RESTORE", b"m2", b"0", payload]),
        b"+OK\r\n".to_vec()
    );
    assert_eq!(lavik_encoding(&mut p, "m2"), QL);
    p.check(&["RPUSH", "small", "a", "b", "c"]);
    let dump = p.r.call(&[b"DUMP", b"small"]);
    let payload = &dump[dump.windows(2).position(|w| w == b"\r\n").unwrap() + 2..dump.len() - 2];
    assert_eq!(
        p.l.call(&[b"RESTORE", b"m3", b"0", payload]),
        b"+OK\r\n".to_vec()
    );
    assert_eq!(lavik_encoding(&mut p, "m3"), LP);
    p.check(&["OBJECT", "ENCODING", "missing"]);
    p.check(&["TYPE", "m"]);
}
