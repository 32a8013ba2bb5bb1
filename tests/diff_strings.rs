//! Differential tests: string and keyspace commands sent to Debian's `redis-server` and to
//! lavik, replies compared byte for byte in RESP2 and RESP3.
//!
//! Deliberate differences from Redis 7.0.15 (Debian's) are not sent here: lavik reports
//! 7.2, so HELLO/INFO/COMMAND replies differ by design and are checked elsewhere.
mod common;
use common::diff::{frame_len, sorted_elements, Pair, Rng};

const KEYS: &[&str] = &["a", "b", "c", "{t}x", "{t}y", "n1", "n2", "f"];
const VALS: &[&str] = &["", "0", "1", "-7", "42", "hello", "3.5", "1e3", "abc def", "99999999999999999999"];

fn random_command(rng: &mut Rng) -> Vec<String> {
    let k = |rng: &mut Rng| rng.pick(KEYS).to_string();
    let v = |rng: &mut Rng| rng.pick(VALS).to_string();
    let n = |rng: &mut Rng| (rng.below(21) as i64 - 10).to_string();
    match rng.below(24) {
        0 => vec!["SET".into(), k(rng), v(rng)],
        1 => {
            let mut c = vec!["SET".into(), k(rng), v(rng)];
            let opts = ["NX", "XX", "GET", "KEEPTTL"];
            c.push(rng.pick(&opts).to_string());
            if rng.chance(30) {
                c.push("EX".into());
                c.push((rng.below(1000) + 100).to_string());
            }
            c
        }
        2 => vec!["GET".into(), k(rng)],
        3 => vec!["INCR".into(), k(rng)],
        4 => vec!["INCRBY".into(), k(rng), n(rng)],
        5 => vec!["DECRBY".into(), k(rng), n(rng)],
        6 => vec!["APPEND".into(), k(rng), v(rng)],
        7 => vec!["STRLEN".into(), k(rng)],
        8 => vec!["GETRANGE".into(), k(rng), n(rng), n(rng)],
        9 => vec!["SETRANGE".into(), k(rng), rng.below(12).to_string(), v(rng)],
        10 => vec!["MGET".into(), k(rng), k(rng), k(rng)],
        11 => vec!["MSET".into(), k(rng), v(rng), k(rng), v(rng)],
        12 => vec!["MSETNX".into(), k(rng), v(rng), k(rng), v(rng)],
        13 => vec!["DEL".into(), k(rng), k(rng)],
        14 => vec!["EXISTS".into(), k(rng), k(rng), k(rng)],
        15 => vec!["GETDEL".into(), k(rng)],
        16 => vec!["GETSET".into(), k(rng), v(rng)],
        17 => vec!["INCRBYFLOAT".into(), k(rng), rng.pick(&["1.5", "-2", "0.1", "abc", "3e2"]).to_string()],
        18 => vec!["TYPE".into(), k(rng)],
        19 => vec!["EXPIRE".into(), k(rng), (rng.below(1000) + 500).to_string()],
        20 => vec!["TTL".into(), k(rng)],
        21 => vec!["PERSIST".into(), k(rng)],
        22 => vec!["SETNX".into(), k(rng), v(rng)],
        _ => {
            // Same hash tag: RENAME/COPY stay within one slot in both servers.
            let (a, b) = if rng.chance(50) { ("{t}x", "{t}y") } else { ("{t}y", "{t}x") };
            let op = rng.pick(&["RENAME", "RENAMENX", "COPY"]).to_string();
            vec![op, a.into(), b.into()]
        }
    }
}

fn run(proto: u8, seed: u64, steps: usize) {
    let mut p = Pair::start(&format!("diff-str-{proto}"), &[]);
    if proto == 3 {
        p.hello(3);
    }
    let mut rng = Rng::new(seed);
    for _ in 0..steps {
        let c = random_command(&mut rng);
        let refs: Vec<&str> = c.iter().map(|s| s.as_str()).collect();
        p.check(&refs);
    }
    // The end state agrees key by key.
    for k in KEYS {
        p.check(&["GET", k]);
        p.check(&["TTL", k]);
    }
    p.check(&["DBSIZE"]);
    p.check_with(&["KEYS", "*"], sorted_elements);
}

// Random string/keyspace sequences give Redis's exact replies in RESP2.
#[test]
fn strings_resp2() {
    run(2, 0x5eed_0001, 1500);
}

// The same in RESP3 (nulls, doubles and maps as Redis 7 encodes them).
#[test]
fn strings_resp3() {
    run(3, 0x5eed_0002, 1500);
}

// Error replies for bad arguments match Redis's texts.
#[test]
fn string_errors() {
    let mut p = Pair::start("diff-str-err", &[]);
    p.check(&["SET", "s", "x"]);
    for c in [
        &["GET"][..],
        &["SET", "k"],
        &["SET", "k", "v", "EX"],
        &["SET", "k", "v", "EX", "0"],
        &["SET", "k", "v", "EX", "abc"],
        &["SET", "k", "v", "NX", "XX"],
        &["SET", "k", "v", "BOGUS"],
        &["INCR", "s"],
        &["INCRBY", "k", "1.5"],
        &["INCRBYFLOAT", "s", "1"],
        &["GETRANGE", "s", "a", "1"],
        &["SETRANGE", "s", "-1", "x"],
        &["MSET", "a"],
        &["EXPIRE", "s", "abc"],
        &["GETEX", "s", "EX"],
        &["GETEX", "s", "PERSIST", "EX", "1"],
        &["NOSUCHCOMMAND", "x"],
    ] {
        p.check(c);
    }
    // The frame reader itself: a nested reply parses to its end.
    assert_eq!(frame_len(b"*2\r\n:1\r\n%1\r\n+a\r\n,1.5\r\nX"), Some(24));
    assert_eq!(frame_len(b"*2\r\n:1\r\n"), None);
}
