//! Differential tests: bitmap commands (SETBIT, GETBIT, BITCOUNT, BITPOS, BITOP, BITFIELD,
//! BITFIELD_RO) mixed with string commands, sent to Debian's `redis-server` and to lavik,
//! replies compared byte for byte in RESP2 and RESP3.
//!
//! Deliberate difference from Redis 7.0.15 (Debian's): lavik follows 7.2, where BITCOUNT
//! and BITPOS check their arguments before the key, so a bad argument on a *missing* key
//! is an error (7.0 replied 0 or -1). Those cases are not sent to both; `seven_two_order`
//! checks lavik alone.
mod common;
use common::diff::{sorted_elements, Pair, Rng};
use common::Server;

const KEYS: &[&str] = &["k1", "k2", "k3", "{b}d"];

/// lavik flags: room on the device for many rewrites of MiB-sized values.
const FLAGS: &[&str] = &["--data-file-size", "1gb"];

/// A bit offset: mostly near the start, sometimes tens of KiB in, rarely a few MiB.
fn bit_offset(rng: &mut Rng) -> u64 {
    match rng.below(100) {
        0..=69 => rng.below(120),
        70..=94 => rng.below(80_000),
        _ => rng.below(3 * 8 * 1024 * 1024),
    }
}

/// A range bound for BITCOUNT/BITPOS: small, negative, or far out.
fn bound(rng: &mut Rng) -> String {
    match rng.below(10) {
        0..=5 => (rng.below(41) as i64 - 20).to_string(),
        6 | 7 => (rng.below(400) as i64 - 200).to_string(),
        8 => (rng.below(1 << 24) as i64).to_string(),
        _ => rng
            .pick(&["0", "-1", "9223372036854775807", "-9223372036854775808"])
            .to_string(),
    }
}

fn unit(rng: &mut Rng) -> String {
    rng.pick(&["BYTE", "BIT", "bit", "byte"]).to_string()
}

fn field_type(rng: &mut Rng) -> String {
    if rng.chance(50) {
        format!(
            "i{}",
            rng.pick(&[1, 2, 3, 5, 8, 13, 16, 31, 32, 33, 63, 64])
        )
    } else {
        format!(
            "u{}",
            rng.pick(&[1, 2, 3, 5, 8, 13, 16, 31, 32, 33, 62, 63])
        )
    }
}

fn field_value(rng: &mut Rng) -> String {
    match rng.below(6) {
        0 => (rng.below(21) as i64 - 10).to_string(),
        1 => (rng.below(600) as i64 - 300).to_string(),
        2 => (rng.next_u64() as i64).to_string(),
        3 => (rng.next_u64() as i64 >> rng.below(63)).to_string(),
        _ => rng
            .pick(&[
                "127",
                "128",
                "-128",
                "-129",
                "255",
                "256",
                "32767",
                "-32768",
                "65535",
                "2147483647",
                "-2147483648",
                "4294967295",
                "9223372036854775807",
                "-9223372036854775808",
                "4611686018427387903",
                "-4611686018427387904",
            ])
            .to_string(),
    }
}

fn field_offset(rng: &mut Rng) -> String {
    match rng.below(4) {
        0 => format!("#{}", rng.below(40)),
        1 => bit_offset(rng).to_string(),
        _ => rng.below(200).to_string(),
    }
}

fn bitfield(rng: &mut Rng, key: String, read_only: bool) -> Vec<String> {
    let mut c = vec![
        if read_only { "BITFIELD_RO" } else { "BITFIELD" }.to_string(),
        key,
    ];
    for _ in 0..rng.below(4) + 1 {
        let op = if read_only { 0 } else { rng.below(4) };
        match op {
            0 => c.extend(["GET".into(), field_type(rng), field_offset(rng)]),
            1 => c.extend([
                "SET".into(),
                field_type(rng),
                field_offset(rng),
                field_value(rng),
            ]),
            2 => c.extend([
                "INCRBY".into(),
                field_type(rng),
                field_offset(rng),
                field_value(rng),
            ]),
            _ => c.extend([
                "OVERFLOW".into(),
                rng.pick(&["WRAP", "SAT", "FAIL", "sat"]).to_string(),
            ]),
        }
    }
    c
}

/// A short value; often all ones or all zeros, so BITPOS meets runs without a match.
fn random_value(rng: &mut Rng) -> Vec<u8> {
    let len = rng.below(12) as usize;
    match rng.below(4) {
        0 => vec![0xff; len],
        1 => vec![0x00; len],
        _ => (0..len)
            .map(|_| *rng.pick(&[b'a', b'0', 0x7f, 0xff, 0x80, 0x00, b'A', 0xfe]))
            .collect(),
    }
}

fn random_command(rng: &mut Rng) -> Vec<Vec<u8>> {
    let k = |rng: &mut Rng| rng.pick(KEYS).as_bytes().to_vec();
    match rng.below(10) {
        0 => return vec![b"SET".to_vec(), k(rng), random_value(rng)],
        1 => return vec![b"APPEND".to_vec(), k(rng), random_value(rng)],
        2 => {
            let at = rng.below(40).to_string().into_bytes();
            return vec![b"SETRANGE".to_vec(), k(rng), at, random_value(rng)];
        }
        _ => {}
    }
    random_text_command(rng)
        .into_iter()
        .map(String::into_bytes)
        .collect()
}

fn random_text_command(rng: &mut Rng) -> Vec<String> {
    let k = |rng: &mut Rng| rng.pick(KEYS).to_string();
    match rng.below(30) {
        0..=4 => vec![
            "SETBIT".into(),
            k(rng),
            bit_offset(rng).to_string(),
            rng.pick(&["0", "1"]).to_string(),
        ],
        5 | 6 => vec!["GETBIT".into(), k(rng), bit_offset(rng).to_string()],
        7 => vec!["BITCOUNT".into(), k(rng)],
        8 | 9 => vec!["BITCOUNT".into(), k(rng), bound(rng), bound(rng)],
        10 | 11 => vec!["BITCOUNT".into(), k(rng), bound(rng), bound(rng), unit(rng)],
        12 => vec!["BITPOS".into(), k(rng), rng.pick(&["0", "1"]).to_string()],
        13 => vec![
            "BITPOS".into(),
            k(rng),
            rng.pick(&["0", "1"]).to_string(),
            bound(rng),
        ],
        14 => vec![
            "BITPOS".into(),
            k(rng),
            rng.pick(&["0", "1"]).to_string(),
            bound(rng),
            bound(rng),
        ],
        15 | 16 => {
            let bit = rng.pick(&["0", "1"]).to_string();
            vec![
                "BITPOS".into(),
                k(rng),
                bit,
                bound(rng),
                bound(rng),
                unit(rng),
            ]
        }
        17 | 18 => {
            let op = rng
                .pick(&["AND", "OR", "XOR", "NOT", "and", "xor"])
                .to_string();
            let n = if op.eq_ignore_ascii_case("not") {
                1
            } else {
                rng.below(3) + 1
            };
            let mut c = vec!["BITOP".into(), op, k(rng)];
            c.extend((0..n).map(|_| k(rng)));
            c
        }
        19..=21 => {
            let key = k(rng);
            bitfield(rng, key, false)
        }
        22 => {
            let key = k(rng);
            bitfield(rng, key, true)
        }
        23..=25 => vec!["GET".into(), k(rng)],
        26 | 27 => vec!["DEL".into(), k(rng)],
        28 => vec!["STRLEN".into(), k(rng)],
        _ => {
            // A TTL that bitmap writes must keep (and BITOP's destination must drop).
            if rng.chance(50) {
                vec![
                    "EXPIRE".into(),
                    k(rng),
                    (rng.below(1000) + 1000).to_string(),
                ]
            } else {
                vec!["TTL".into(), k(rng)]
            }
        }
    }
}

fn run(proto: u8, seed: u64, steps: usize) {
    let mut p = Pair::start(&format!("diff-bits-{proto}"), FLAGS);
    if proto == 3 {
        p.hello(3);
    }
    let mut rng = Rng::new(seed);
    for _ in 0..steps {
        let c = random_command(&mut rng);
        let refs: Vec<&[u8]> = c.iter().map(|s| s.as_slice()).collect();
        p.check_bytes(&refs);
    }
    // The end state agrees key by key, byte for byte.
    for k in KEYS {
        p.check(&["GET", k]);
        p.check(&["TTL", k]);
    }
    p.check(&["DBSIZE"]);
    p.check_with(&["KEYS", "*"], sorted_elements);
}

// Random bitmap/string sequences give Redis's exact replies in RESP2.
#[test]
fn bitmaps_resp2() {
    run(2, 0xb175_0001, 900);
}

// The same in RESP3 (BITFIELD's FAIL null is `_`).
#[test]
fn bitmaps_resp3() {
    run(3, 0xb175_0002, 900);
}

// Every BITFIELD overflow mode at the edges of every width, signed and unsigned.
#[test]
fn bitfield_overflow_edges() {
    let mut p = Pair::start("diff-bits-edges", &[]);
    let mut rng = Rng::new(0xb175_0003);
    for mode in ["WRAP", "SAT", "FAIL"] {
        for bits in 1..=64u32 {
            for signed in [true, false] {
                if !signed && bits == 64 {
                    continue;
                }
                let ty = format!("{}{bits}", if signed { 'i' } else { 'u' });
                let offset = rng.below(50).to_string();
                for v in [
                    field_value(&mut rng),
                    field_value(&mut rng),
                    "1".into(),
                    "-1".into(),
                ] {
                    p.check(&["BITFIELD", "e", "OVERFLOW", mode, "SET", &ty, &offset, &v]);
                    p.check(&[
                        "BITFIELD", "e", "OVERFLOW", mode, "INCRBY", &ty, &offset, &v,
                    ]);
                    p.check(&[
                        "BITFIELD", "e", "OVERFLOW", mode, "INCRBY", &ty, &offset, "-1",
                    ]);
                    p.check(&["BITFIELD_RO", "e", "GET", &ty, &offset]);
                }
            }
        }
    }
    p.check(&["GET", "e"]);
}

// `proto-max-bulk-len` bounds every bit offset, with Redis's error text.
#[test]
fn offset_limit_follows_proto_max_bulk_len() {
    let mut p = Pair::start("diff-bits-limit", &["--proto-max-bulk-len", "1mb"]);
    let set =
        p.r.call(&[b"CONFIG", b"SET", b"proto-max-bulk-len", b"1mb"]);
    assert_eq!(set, b"+OK\r\n");
    for c in [
        &["SETBIT", "m", "8388608", "1"][..],
        &["GETBIT", "m", "8388608"],
        &["BITFIELD", "m", "SET", "u8", "#1048576", "1"],
        &["BITFIELD", "m", "GET", "i64", "8388608"],
        &["BITFIELD_RO", "m", "GET", "u8", "#1048576"],
        &["SETBIT", "m", "8388607", "1"],
        &["GETBIT", "m", "8388607"],
        &["STRLEN", "m"],
        // The offset is within the limit; the field may then end just past it.
        &["BITFIELD", "m", "SET", "i64", "8388607", "-1"],
        &["STRLEN", "m"],
        &["BITCOUNT", "m"],
        &["BITPOS", "m", "1"],
        &["BITPOS", "m", "0", "-3"],
    ] {
        p.check(c);
    }
}

// Error replies for bad arguments match Redis's texts (on existing keys and where 7.0
// and 7.2 agree on missing ones).
#[test]
fn bitmap_errors() {
    let mut p = Pair::start("diff-bits-err", &[]);
    p.check(&["SET", "s", "foobar"]);
    for c in [
        &["SETBIT", "s"][..],
        &["SETBIT", "s", "-1", "1"],
        &["SETBIT", "s", "abc", "1"],
        &["SETBIT", "s", "1.5", "1"],
        &["SETBIT", "s", "4294967296", "1"],
        &["SETBIT", "s", "9223372036854775808", "1"],
        &["SETBIT", "s", "0", "2"],
        &["SETBIT", "s", "0", "-1"],
        &["SETBIT", "s", "0", "x"],
        &["SETBIT", "s", "x", "x"],
        &["SETBIT", "missing", "-1", "1"],
        &["GETBIT", "s"],
        &["GETBIT", "s", "-1"],
        &["GETBIT", "missing", "x"],
        &["GETBIT", "s", "4294967296"],
        &["BITCOUNT"],
        &["BITCOUNT", "s", "0"],
        &["BITCOUNT", "s", "a", "1"],
        &["BITCOUNT", "s", "0", "b"],
        &["BITCOUNT", "s", "0", "1", "BOTH"],
        &["BITCOUNT", "s", "0", "1", "BIT", "x"],
        &["BITPOS", "s"],
        &["BITPOS", "s", "2"],
        &["BITPOS", "s", "x"],
        &["BITPOS", "missing", "2"],
        &["BITPOS", "s", "1", "x"],
        &["BITPOS", "s", "1", "0", "x"],
        &["BITPOS", "s", "1", "0", "x", "BOTH"],
        &["BITPOS", "s", "1", "0", "1", "BOTH"],
        &["BITPOS", "s", "1", "0", "1", "BIT", "x"],
        &["BITOP", "AND", "d"],
        &["BITOP", "NAND", "d", "s"],
        &["BITOP", "NOT", "d", "s", "s"],
        &["BITOP", "NOT", "d"],
        &["BITFIELD"],
        &["BITFIELD", "s", "GET"],
        &["BITFIELD", "s", "GET", "u8"],
        &["BITFIELD", "s", "BOGUS", "u8", "0"],
        &["BITFIELD", "s", "GET", "u64", "0"],
        &["BITFIELD", "s", "GET", "i65", "0"],
        &["BITFIELD", "s", "GET", "i0", "0"],
        &["BITFIELD", "s", "GET", "U8", "0"],
        &["BITFIELD", "s", "GET", "x8", "0"],
        &["BITFIELD", "s", "GET", "u8", "-1"],
        &["BITFIELD", "s", "GET", "u8", "#-1"],
        &["BITFIELD", "s", "GET", "u8", "##1"],
        // `#n` is scaled in wrapping 64-bit arithmetic, as Redis's C does: 2^57 x 64
        // wraps negative, 2^58 x 64 wraps to offset 0.
        &["BITFIELD", "s", "GET", "i64", "#144115188075855872"],
        &["BITFIELD", "s", "GET", "i64", "#288230376151711744"],
        &["BITFIELD", "s", "GET", "i8", "#1152921504606846977"],
        &["BITFIELD", "s", "SET", "u8", "0"],
        &["BITFIELD", "s", "SET", "u8", "0", "x"],
        &["BITFIELD", "s", "INCRBY", "u8", "0", "1.5"],
        &["BITFIELD", "s", "OVERFLOW"],
        &["BITFIELD", "s", "OVERFLOW", "BOGUS"],
        &[
            "BITFIELD", "s", "GET", "u8", "0", "OVERFLOW", "BOGUS", "GET", "u8", "0",
        ],
        &["BITFIELD", "s", "GET", "u8", "0", "GET", "i8"],
        &["BITFIELD_RO", "s", "SET", "u8", "0", "1"],
        &["BITFIELD_RO", "s", "INCRBY", "u8", "0", "1"],
        &["BITFIELD_RO", "s", "GET", "u8", "0", "OVERFLOW", "SAT"],
        &["BITFIELD_RO", "missing", "INCRBY", "u8", "0", "1"],
        &["BITFIELD_RO", "s", "OVERFLOW", "FAIL"],
        &["BITFIELD", "s"],
        &["BITFIELD", "s", "OVERFLOW", "SAT"],
        &["EXISTS", "missing"],
        // Nothing above changed the value.
        &["GET", "s"],
    ] {
        p.check(c);
    }
}

// Documented examples and edge cases: the empty string, all-ones strings, masks at
// both ends of BIT ranges, BITOP on missing keys deleting the destination.
#[test]
fn bitmap_edge_cases() {
    let mut p = Pair::start("diff-bits-edge", &[]);
    let mut cmds: Vec<Vec<String>> = Vec::new();
    let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    cmds.push(v(&["SET", "e", ""]));
    for bit in ["0", "1"] {
        cmds.push(v(&["BITPOS", "e", bit]));
        cmds.push(v(&["BITPOS", "e", bit, "0"]));
        cmds.push(v(&["BITPOS", "e", bit, "0", "-1"]));
        cmds.push(v(&["BITPOS", "missing", bit]));
        cmds.push(v(&["BITPOS", "missing", bit, "3", "5", "BIT"]));
    }
    cmds.push(v(&["BITCOUNT", "e"]));
    cmds.push(v(&["BITCOUNT", "e", "0", "-1", "BIT"]));
    cmds.push(v(&["SET", "f", "\u{7f}\u{7f}\u{7f}"]));
    cmds.push(v(&["SETRANGE", "f", "0", "\u{7f}"]));
    cmds.push(v(&["SETBIT", "f", "0", "1"]));
    cmds.push(v(&["SETBIT", "f", "8", "1"]));
    cmds.push(v(&["SETBIT", "f", "16", "1"]));
    // f is now three 0xff bytes.
    for (s, e) in [
        ("0", "-1"),
        ("1", "2"),
        ("0", "0"),
        ("-1", "-1"),
        ("2", "1"),
        ("5", "-3"),
    ] {
        for u in ["BYTE", "BIT"] {
            cmds.push(v(&["BITPOS", "f", "0", s, e, u]));
            cmds.push(v(&["BITPOS", "f", "1", s, e, u]));
            cmds.push(v(&["BITCOUNT", "f", s, e, u]));
        }
        cmds.push(v(&["BITPOS", "f", "0", s]));
        cmds.push(v(&["BITPOS", "f", "0", s, e]));
    }
    cmds.push(v(&["BITPOS", "f", "0"]));
    cmds.push(v(&["SET", "d", "x"]));
    cmds.push(v(&["EXPIRE", "d", "1000"]));
    cmds.push(v(&["BITOP", "OR", "d", "missing", "missing2"]));
    cmds.push(v(&["EXISTS", "d"]));
    cmds.push(v(&["SET", "d", "x"]));
    cmds.push(v(&["EXPIRE", "d", "1000"]));
    cmds.push(v(&["BITOP", "AND", "d", "f", "missing"]));
    cmds.push(v(&["GET", "d"]));
    cmds.push(v(&["TTL", "d"]));
    cmds.push(v(&["BITOP", "NOT", "d", "f"]));
    cmds.push(v(&["GET", "d"]));
    cmds.push(v(&["BITOP", "XOR", "d", "f", "e", "d"]));
    cmds.push(v(&["GET", "d"]));
    cmds.push(v(&["EXPIRE", "f", "1000"]));
    cmds.push(v(&["SETBIT", "f", "100", "1"]));
    cmds.push(v(&["BITFIELD", "f", "INCRBY", "u2", "200", "1"]));
    cmds.push(v(&["TTL", "f"]));
    cmds.push(v(&["GET", "f"]));
    // A failing write still creates the key, as in Redis.
    cmds.push(v(&[
        "BITFIELD", "g", "OVERFLOW", "FAIL", "SET", "u2", "#3", "9",
    ]));
    cmds.push(v(&["GET", "g"]));
    cmds.push(v(&["BITFIELD", "g", "GET", "u4", "100"]));
    cmds.push(v(&["STRLEN", "g"]));
    cmds.push(v(&[
        "BITFIELD_RO",
        "h",
        "GET",
        "i8",
        "0",
        "GET",
        "u4",
        "#2",
    ]));
    cmds.push(v(&["EXISTS", "h"]));
    cmds.push(v(&["SET", "n", "12345"]));
    cmds.push(v(&["BITCOUNT", "n"]));
    cmds.push(v(&[
        "BITFIELD", "n", "GET", "u8", "#1", "INCRBY", "u8", "#1", "1",
    ]));
    cmds.push(v(&["GET", "n"]));
    for c in &cmds {
        let refs: Vec<&str> = c.iter().map(|s| s.as_str()).collect();
        p.check(&refs);
    }
}

// 7.2 order (lavik only; Redis 7.0 differs): BITCOUNT and BITPOS check their arguments
// before the key, so a missing key does not hide a bad argument.
#[test]
fn seven_two_order() {
    let server = Server::start("bits-72", &[]);
    let mut c = server.raw();
    c.expect(&[b"BITCOUNT", b"missing", b"0"], b"-ERR syntax error\r\n");
    c.expect(
        &[b"BITCOUNT", b"missing", b"x", b"1"],
        b"-ERR value is not an integer or out of range\r\n",
    );
    c.expect(
        &[b"BITCOUNT", b"missing", b"0", b"1", b"BOTH"],
        b"-ERR syntax error\r\n",
    );
    c.expect(
        &[b"BITPOS", b"missing", b"1", b"x"],
        b"-ERR value is not an integer or out of range\r\n",
    );
    c.expect(
        &[b"BITPOS", b"missing", b"0", b"0", b"1", b"BOTH"],
        b"-ERR syntax error\r\n",
    );
    c.expect(&[b"BITCOUNT", b"missing", b"0", b"1"], b":0\r\n");
    c.expect(&[b"BITPOS", b"missing", b"0", b"5"], b":0\r\n");
    c.expect(&[b"BITPOS", b"missing", b"1", b"5"], b":-1\r\n");
}
