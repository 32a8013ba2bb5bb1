//! Differential tests: HyperLogLog commands sent to Debian's `redis-server` and to lavik,
//! replies compared byte for byte in RESP2 and RESP3 — including `GET` of the HLL bytes, so
//! the sparse/dense representation, the promotion point and the cached cardinality must be
//! Redis's exactly.
mod common;
use common::diff::{Pair, Rng};

/// Keys in different slots (and so, with two workers, on different workers), plus two that
/// share a hash tag.
const KEYS: &[&str] = &["h1", "h2", "h3", "{t}a", "{t}b", "big"];

/// Strings that are not HLLs to Redis: too short, a bad encoding byte, an integer.
const NOT_HLL_VALUES: &[&[u8]] = &[
    b"hello",
    b"HYLL",
    b"HYLL\x02\0\0\0\0\0\0\0\0\0\0\0\x7f\xff",
    b"12345678901234567",
];

fn element(rng: &mut Rng, universe: u64) -> String {
    format!("e{}", rng.below(universe))
}

fn pfadd(rng: &mut Rng, key: &str, n: usize, universe: u64) -> Vec<Vec<u8>> {
    let mut c = vec![b"PFADD".to_vec(), key.as_bytes().to_vec()];
    for _ in 0..n {
        c.push(element(rng, universe).into_bytes());
    }
    c
}

/// The payload of a bulk-string reply, or `None` for any other reply.
fn bulk_payload(reply: &[u8]) -> Option<Vec<u8>> {
    if reply.first() != Some(&b'$') {
        return None;
    }
    let head_end = reply.windows(2).position(|w| w == b"\r\n")?;
    let n: i64 = std::str::from_utf8(&reply[1..head_end])
        .ok()?
        .parse()
        .ok()?;
    (n >= 0).then(|| reply[head_end + 2..head_end + 2 + n as usize].to_vec())
}

/// A damaged copy of an HLL value: one register byte changed, a few bytes cut, or a byte
/// appended (which makes a dense one the wrong length).
fn damage(rng: &mut Rng, mut v: Vec<u8>) -> Vec<u8> {
    match rng.below(3) {
        0 if v.len() > 16 => {
            let at = 16 + rng.below((v.len() - 16) as u64) as usize;
            v[at] = rng.below(256) as u8;
        }
        1 if v.len() > 17 => {
            let cut = 1 + rng.below(3.min(v.len() as u64 - 17)) as usize;
            v.truncate(v.len() - cut);
        }
        _ => v.push(rng.below(256) as u8),
    }
    v
}

/// Runs one random command on both servers and returns the (identical) reply.
fn random_step(p: &mut Pair, rng: &mut Rng) -> Vec<u8> {
    let k = |rng: &mut Rng| rng.pick(KEYS).to_string();
    let cmd: Vec<Vec<u8>> = match rng.below(40) {
        0..=9 => {
            let key = k(rng);
            let n = 1 + rng.below(8) as usize;
            pfadd(rng, &key, n, 3000)
        }
        10..=12 => {
            // Big batches: the keys cross 3000 bytes sparse and become dense.
            let key = if rng.chance(50) {
                "big".to_string()
            } else {
                k(rng)
            };
            let n = 50 + rng.below(400) as usize;
            pfadd(rng, &key, n, 8000)
        }
        13..=16 => vec![b"PFCOUNT".to_vec(), k(rng).into_bytes()],
        17..=19 => {
            let mut c = vec![b"PFCOUNT".to_vec()];
            for _ in 0..2 + rng.below(3) {
                c.push(k(rng).into_bytes());
            }
            c
        }
        20..=22 => {
            let mut c = vec![b"PFMERGE".to_vec()];
            for _ in 0..1 + rng.below(4) {
                c.push(k(rng).into_bytes());
            }
            c
        }
        23..=25 => vec![b"GET".to_vec(), k(rng).into_bytes()],
        26 => {
            let v = rng.pick(NOT_HLL_VALUES);
            vec![b"SET".to_vec(), k(rng).into_bytes(), v.to_vec()]
        }
        27 => vec![b"DEL".to_vec(), k(rng).into_bytes()],
        28 => vec![b"EXPIRE".to_vec(), k(rng).into_bytes(), b"1000".to_vec()],
        29 => vec![b"TTL".to_vec(), k(rng).into_bytes()],
        30 => vec![
            b"PFDEBUG".to_vec(),
            b"ENCODING".to_vec(),
            k(rng).into_bytes(),
        ],
        31 => vec![b"PFDEBUG".to_vec(), b"DECODE".to_vec(), k(rng).into_bytes()],
        32 => {
            let sub = rng.pick(&["TODENSE", "GETREG", "todense", "NOSUCH"]);
            vec![
                b"PFDEBUG".to_vec(),
                sub.as_bytes().to_vec(),
                k(rng).into_bytes(),
            ]
        }
        33 => vec![b"PFADD".to_vec(), k(rng).into_bytes()],
        34..=35 => {
            // Copy one key's bytes to another through GET/SET, sometimes damaged.
            let (src, dst) = (k(rng), k(rng));
            let got = p.check_bytes(&[b"GET", src.as_bytes()]);
            let Some(mut v) = bulk_payload(&got) else {
                return got;
            };
            if rng.chance(60) {
                v = damage(rng, v);
            }
            vec![b"SET".to_vec(), dst.into_bytes(), v]
        }
        36 => vec![b"SET".to_vec(), b"h3".to_vec(), b"plain".to_vec()],
        _ => vec![b"PFCOUNT".to_vec(), k(rng).into_bytes(), b"h3".to_vec()],
    };
    if cmd[0] == b"PFADD" && covers_too_few(p, &cmd[1]) {
        // Redis 7.0.15 reads past the value here (fixed in 7.2.10 / CVE-2025-32023, whose
        // INVALIDOBJ lavik gives); not comparable, so the key is only counted.
        return p.check_bytes(&[b"PFCOUNT", &cmd[1]]);
    }
    let refs: Vec<&[u8]> = cmd.iter().map(|a| a.as_slice()).collect();
    p.check_bytes(&refs)
}

/// True if Redis holds a sparse HLL at `key` whose opcodes cover fewer than 16384
/// registers (looked up on the Redis side only; GET changes nothing).
fn covers_too_few(p: &mut Pair, key: &[u8]) -> bool {
    let Some(v) = bulk_payload(&p.r.call(&[b"GET", key])) else {
        return false;
    };
    if v.len() < 16 || &v[..4] != b"HYLL" || v[4] != 1 {
        return false;
    }
    let (mut at, mut covered) = (16, 0usize);
    while at < v.len() {
        let c = v[at];
        if c & 0xc0 == 0 {
            covered += (c & 0x3f) as usize + 1;
            at += 1;
        } else if c & 0x80 != 0 {
            covered += (c & 3) as usize + 1;
            at += 1;
        } else {
            let low = v.get(at + 1).copied().unwrap_or(0) as usize;
            covered += ((((c & 0x3f) as usize) << 8) | low) + 1;
            at += 2;
        }
    }
    covered < 16384
}

fn run(proto: u8, seed: u64, steps: usize) {
    let mut p = Pair::start(&format!("diff-hll-{proto}"), &[]);
    if proto == 3 {
        p.hello(3);
    }
    let mut rng = Rng::new(seed);
    let (mut dense_gets, mut sparse_gets, mut corrupt, mut not_hll) = (0, 0, 0, 0);
    for _ in 0..steps {
        let reply = random_step(&mut p, &mut rng);
        match bulk_payload(&reply) {
            Some(v) if v.len() == 12304 && v.starts_with(b"HYLL\0") => dense_gets += 1,
            Some(v) if v.starts_with(b"HYLL\x01") => sparse_gets += 1,
            _ => {}
        }
        corrupt += reply.starts_with(b"-INVALIDOBJ") as u32;
        not_hll += reply.starts_with(b"-WRONGTYPE") as u32;
    }
    // The sequence reached every representation and both error paths.
    assert!(
        dense_gets > 0 && sparse_gets > 0,
        "{dense_gets} dense, {sparse_gets} sparse"
    );
    assert!(
        corrupt > 0 && not_hll > 0,
        "{corrupt} INVALIDOBJ, {not_hll} WRONGTYPE"
    );
    // The end state agrees key by key, before and after refreshing the caches.
    for k in KEYS {
        p.check(&["GET", k]);
        p.check(&["PFCOUNT", k]);
        p.check(&["GET", k]);
        p.check(&["TTL", k]);
    }
}

// Random PFADD/PFCOUNT/PFMERGE/GET/SET/DEL sequences give Redis's exact replies and bytes.
#[test]
fn hll_resp2() {
    run(2, 0x11_0001, 1200);
}

// The same in RESP3.
#[test]
fn hll_resp3() {
    run(3, 0x11_0002, 1200);
}

// One key grown element by element through the sparse->dense promotion matches at every step.
#[test]
fn hll_promotion_step_by_step() {
    let mut p = Pair::start("diff-hll-promo", &[]);
    let mut rng = Rng::new(0x11_0003);
    let mut seen_sparse = false;
    for i in 0..3000 {
        let e = element(&mut rng, 1_000_000);
        p.check(&["PFADD", "k", &e]);
        // Size and encoding after every element pin the promotion to the same PFADD.
        p.check(&["STRLEN", "k"]);
        let enc = p.check(&["PFDEBUG", "ENCODING", "k"]);
        seen_sparse |= enc == b"+sparse\r\n";
        if i % 50 == 0 {
            p.check(&["GET", "k"]);
            p.check(&["PFCOUNT", "k"]);
        }
    }
    // The key started sparse and ended dense: the promotion happened in between.
    assert!(seen_sparse);
    assert_eq!(p.check(&["PFDEBUG", "ENCODING", "k"]), b"+dense\r\n");
    p.check(&["GET", "k"]);
    p.check(&["PFCOUNT", "k"]);
}

// A dense value written by SET (registers above 32 included) merges, counts and caches as in Redis.
#[test]
fn hll_crafted_dense() {
    let mut p = Pair::start("diff-hll-dense", &[]);
    let mut v = b"HYLL\0\0\0\0\0\0\0\0\0\0\0\x80".to_vec();
    v.resize(16 + 12288, 0);
    // Registers 0..=2 (bytes 16..19) = 40, 7, 51; the last register = 63.
    v[16] = 40 | (7 << 6);
    v[17] = (7 >> 2) | ((51 & 0xf) << 4);
    v[18] = 51 >> 4;
    v[16 + 12287] = 63 << 2;
    p.check_bytes(&[b"SET", b"d", &v]);
    p.check(&["PFCOUNT", "d"]);
    p.check(&["GET", "d"]);
    p.check(&["PFADD", "s", "a", "b", "c"]);
    p.check(&["PFCOUNT", "s", "d"]);
    p.check(&["PFMERGE", "s", "d"]);
    p.check(&["PFDEBUG", "ENCODING", "s"]);
    p.check(&["GET", "s"]);
    p.check(&["PFCOUNT", "s"]);
    p.check(&["PFDEBUG", "GETREG", "d"]);
    // One byte short or long: no longer an HLL.
    p.check_bytes(&[b"SET", b"d", &v[..v.len() - 1]]);
    p.check(&["PFCOUNT", "d"]);
    p.check(&["PFADD", "d", "x"]);
    // An empty HLL merged into a missing key gives Redis's fresh sparse value.
    p.check(&["PFMERGE", "new"]);
    p.check(&["GET", "new"]);
    p.check(&["PFMERGE", "new2", "missing", "s"]);
    p.check(&["GET", "new2"]);
}

// Errors and edge replies: wrong types, arity, PFDEBUG on missing keys, TTL kept on update.
#[test]
fn hll_errors() {
    let mut p = Pair::start("diff-hll-err", &[]);
    p.check(&["SET", "s", "not an hll"]);
    p.check(&["SET", "n", "123"]);
    for c in [
        &["PFADD"][..],
        &["PFCOUNT"],
        &["PFMERGE"],
        &["PFDEBUG", "ENCODING"],
        &["PFDEBUG", "ENCODING", "k", "x"],
        &["PFSELFTEST", "extra"],
        &["PFADD", "s", "a"],
        &["PFADD", "n", "a"],
        &["PFCOUNT", "s"],
        &["PFCOUNT", "missing"],
        &["PFCOUNT", "missing", "s"],
        &["PFMERGE", "d", "s"],
        &["PFMERGE", "s", "missing"],
        &["PFDEBUG", "ENCODING", "missing"],
        &["PFDEBUG", "ENCODING", "s"],
        &["PFADD", "k", "a", "b"],
        &["PFADD", "k", "a", "b"],
        &["PFDEBUG", "NOSUCH", "k"],
        &["PFDEBUG", "DECODE", "k"],
        &["PFDEBUG", "TODENSE", "k"],
        &["PFDEBUG", "TODENSE", "k"],
        &["PFDEBUG", "DECODE", "k"],
        &["EXPIRE", "k", "1000"],
        &["PFADD", "k", "c"],
        &["TTL", "k"],
        &["PFCOUNT", "k"],
        &["TTL", "k"],
        &["PFMERGE", "k", "missing"],
        &["TTL", "k"],
        &["GET", "k"],
    ] {
        p.check(c);
    }
}
