//! Differential tests: sorted set commands sent to Debian's `redis-server` (7.0.15) and to
//! lavik (`--threads 2`, so multi-key commands cross workers), replies compared byte for
//! byte in RESP2 and RESP3.
//!
//! lavik formats scores as Redis 7.2 does (shortest round-trip digits); 7.0 prints `%.17g`
//! (`0.1` is `0.10000000000000001`), so the random scores here are integers, halves,
//! quarters and infinities, which both print alike; the 7.2 forms are checked directly.
//! ZRANK/ZREVRANK WITHSCORE is 7.2 only and also checked directly against expected bytes.
//! ZRANDMEMBER is random: checked by its properties.
mod common;
use common::diff::{Pair, Rng};

const ZKEYS: &[&str] = &["z1", "z2", "{t}a", "{t}b", "{t}c"];
const MEMBERS: &[&str] = &["a", "b", "c", "d", "e", "f", "10", "-1", "", "x y", "aa"];
const SCORES: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "2.5",
    "-0.5",
    "0.25",
    "7",
    "100",
    "-inf",
    "+inf",
    "inf",
    "3",
    "1e3",
    "12345678901234567",
    "(1",
    "x",
];
const RANGE_ENDS: &[&str] = &[
    "-inf", "+inf", "0", "1", "(1", "2.5", "(2.5", "-1", "(0", "100", "x", "(", "",
];
const LEX_ENDS: &[&str] = &[
    "-", "+", "[a", "(a", "[c", "(c", "[", "(", "[aa", "a", "[x y", "[e",
];

fn pk<'a>(rng: &mut Rng, v: &[&'a str]) -> &'a str {
    let picked: &&str = rng.pick(v);
    picked
}

fn score(rng: &mut Rng) -> String {
    // Mostly valid scores; the invalid ones exercise the error paths.
    let s = *rng.pick(SCORES);
    if (s == "x" || s == "(1") && rng.chance(70) {
        return "1".into();
    }
    s.to_string()
}

fn rank_arg(rng: &mut Rng) -> String {
    (rng.below(13) as i64 - 6).to_string()
}

/// One random command over the sorted set keys (and a set and a string, for WRONGTYPE and
/// for sets as inputs of the set operations).
fn random_command(rng: &mut Rng) -> Vec<String> {
    let key = |rng: &mut Rng| -> String {
        if rng.chance(8) {
            pk(rng, &["{t}set", "{t}str"]).to_string()
        } else {
            pk(rng, ZKEYS).to_string()
        }
    };
    let member = |rng: &mut Rng| pk(rng, MEMBERS).to_string();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let k = key(rng);
    match rng.below(30) {
        0..=4 => {
            let mut c = s(&["ZADD", &k]);
            for opt in ["NX", "XX", "GT", "LT", "CH", "INCR"] {
                if rng.chance(12) {
                    c.push(opt.into());
                }
            }
            for _ in 0..1 + rng.below(4) {
                c.push(score(rng));
                c.push(member(rng));
            }
            c
        }
        5 => s(&["ZINCRBY", &k, &score(rng), &member(rng)]),
        6 => {
            let mut c = s(&["ZREM", &k]);
            for _ in 0..1 + rng.below(3) {
                c.push(member(rng));
            }
            c
        }
        7 => s(&["ZCARD", &k]),
        8 => s(&["ZSCORE", &k, &member(rng)]),
        9 => s(&["ZMSCORE", &k, &member(rng), &member(rng)]),
        10 => s(&[pk(rng, &["ZRANK", "ZREVRANK"]), &k, &member(rng)]),
        11 => s(&["ZCOUNT", &k, pk(rng, RANGE_ENDS), pk(rng, RANGE_ENDS)]),
        12 => s(&["ZLEXCOUNT", &k, pk(rng, LEX_ENDS), pk(rng, LEX_ENDS)]),
        13..=15 => {
            let mut c = s(&["ZRANGE", &k]);
            let by = rng.below(3);
            match by {
                0 => {
                    c.push(rank_arg(rng));
                    c.push(rank_arg(rng));
                }
                1 => {
                    c.push(pk(rng, RANGE_ENDS).to_string());
                    c.push(pk(rng, RANGE_ENDS).to_string());
                    c.push("BYSCORE".into());
                }
                _ => {
                    c.push(pk(rng, LEX_ENDS).to_string());
                    c.push(pk(rng, LEX_ENDS).to_string());
                    c.push("BYLEX".into());
                }
            }
            if rng.chance(40) {
                c.push("REV".into());
            }
            if rng.chance(35) {
                c.extend(s(&[
                    "LIMIT",
                    &(rng.below(4) as i64 - 1).to_string(),
                    &(rng.below(5) as i64 - 2).to_string(),
                ]));
            }
            if rng.chance(40) {
                c.push("WITHSCORES".into());
            }
            c
        }
        16 => {
            let (name, lex) = *rng.pick(&[
                ("ZRANGEBYSCORE", false),
                ("ZREVRANGEBYSCORE", false),
                ("ZRANGEBYLEX", true),
                ("ZREVRANGEBYLEX", true),
            ]);
            let ends = if lex { LEX_ENDS } else { RANGE_ENDS };
            let mut c = s(&[name, &k, pk(rng, ends), pk(rng, ends)]);
            if !lex && rng.chance(50) {
                c.push("WITHSCORES".into());
            }
            if rng.chance(40) {
                c.extend(s(&[
                    "LIMIT",
                    &(rng.below(3) as i64).to_string(),
                    &(rng.below(5) as i64 - 1).to_string(),
                ]));
            }
            c
        }
        17 => {
            let mut c = s(&["ZREVRANGE", &k, &rank_arg(rng), &rank_arg(rng)]);
            if rng.chance(50) {
                c.push("WITHSCORES".into());
            }
            c
        }
        18 => {
            let dst = pk(rng, &["{t}a", "{t}b", "{t}c", "{t}str"]).to_string();
            let src = pk(rng, &["{t}a", "{t}b", "{t}c", "{t}set"]).to_string();
            let mut c = s(&["ZRANGESTORE", &dst, &src]);
            if rng.chance(50) {
                c.extend(s(&[pk(rng, RANGE_ENDS), pk(rng, RANGE_ENDS), "BYSCORE"]));
            } else {
                c.push(rank_arg(rng));
                c.push(rank_arg(rng));
            }
            if rng.chance(30) {
                c.push("REV".into());
            }
            c
        }
        19 => match rng.below(3) {
            0 => s(&["ZREMRANGEBYRANK", &k, &rank_arg(rng), &rank_arg(rng)]),
            1 => s(&[
                "ZREMRANGEBYSCORE",
                &k,
                pk(rng, RANGE_ENDS),
                pk(rng, RANGE_ENDS),
            ]),
            _ => s(&["ZREMRANGEBYLEX", &k, pk(rng, LEX_ENDS), pk(rng, LEX_ENDS)]),
        },
        20 => {
            let mut c = s(&[pk(rng, &["ZPOPMIN", "ZPOPMAX"]), &k]);
            if rng.chance(60) {
                c.push((rng.below(5) as i64 - 1).to_string());
            }
            c
        }
        21 => {
            let n = 1 + rng.below(3) as usize;
            let mut c = s(&["ZMPOP", &n.to_string()]);
            for _ in 0..n {
                c.push(pk(rng, &["{t}a", "{t}b", "{t}c", "{t}x"]).to_string());
            }
            c.push(pk(rng, &["MIN", "MAX", "max"]).to_string());
            if rng.chance(50) {
                c.extend(s(&["COUNT", &(rng.below(4) as i64).to_string()]));
            }
            c
        }
        22..=25 => {
            let op = *rng.pick(&[
                "ZUNION",
                "ZINTER",
                "ZDIFF",
                "ZUNIONSTORE",
                "ZINTERSTORE",
                "ZDIFFSTORE",
            ]);
            let store = op.ends_with("STORE");
            let n = 1 + rng.below(3) as usize;
            let mut c = vec![op.to_string()];
            if store {
                c.push(pk(rng, &["{t}a", "{t}c", "{t}d", "{t}str"]).to_string());
            }
            c.push(n.to_string());
            for _ in 0..n {
                c.push(pk(rng, &["{t}a", "{t}b", "{t}c", "{t}set", "{t}x"]).to_string());
            }
            if !op.starts_with("ZDIFF") {
                if rng.chance(40) {
                    c.push("WEIGHTS".into());
                    for _ in 0..n {
                        c.push(pk(rng, &["1", "2", "-1", "0", "0.5", "inf"]).to_string());
                    }
                }
                if rng.chance(40) {
                    c.extend(s(&["AGGREGATE", pk(rng, &["SUM", "MIN", "MAX"])]));
                }
            }
            if !store && rng.chance(50) {
                c.push("WITHSCORES".into());
            }
            c
        }
        26 => {
            let n = 1 + rng.below(3) as usize;
            let mut c = s(&["ZINTERCARD", &n.to_string()]);
            for _ in 0..n {
                c.push(pk(rng, &["{t}a", "{t}b", "{t}c", "{t}set"]).to_string());
            }
            if rng.chance(40) {
                c.extend(s(&["LIMIT", &rng.below(3).to_string()]));
            }
            c
        }
        27 => s(&["ZSCAN", &k, "0"]),
        28 => s(&["OBJECT", "ENCODING", pk(rng, ZKEYS)]),
        _ => s(&["TYPE", &k]),
    }
}

fn run_random(p: &mut Pair, seed: u64, steps: usize) {
    let mut rng = Rng::new(seed);
    p.check(&["SADD", "{t}set", "a", "c", "zz"]);
    p.check(&["SET", "{t}str", "v"]);
    for _ in 0..steps {
        let c = random_command(&mut rng);
        let args: Vec<&str> = c.iter().map(|s| s.as_str()).collect();
        p.check(&args);
    }
    for k in ZKEYS.iter().chain(&["{t}d"]) {
        p.check(&["ZRANGE", k, "0", "-1", "WITHSCORES"]);
    }
}

/// Commands with fixed arguments: errors, option conflicts, edge values.
fn edge_cases(p: &mut Pair) {
    let cases: &[&[&str]] = &[
        &[
            "ZADD", "e", "1", "a", "2", "b", "2", "c", "inf", "top", "-inf", "bottom",
        ],
        &["ZADD", "e", "NX", "XX", "1", "a"],
        &["ZADD", "e", "GT", "LT", "1", "a"],
        &["ZADD", "e", "NX", "GT", "1", "a"],
        &["ZADD", "e", "INCR", "1", "a", "2", "b"],
        &["ZADD", "e", "1", "a", "2"],
        &["ZADD", "e", "nan", "a"],
        &["ZADD", "e", "1e400", "a"],
        &["ZADD", "e", "INCR", "1", "nosuch"],
        &["ZADD", "e", "XX", "INCR", "1", "nosuch"],
        &["ZADD", "e", "GT", "INCR", "-1", "a"],
        &["ZADD", "e", "INCR", "-inf", "top"],
        &["ZADD", "e", "GT", "CH", "5", "a", "0", "b"],
        &["ZADD", "e", "LT", "CH", "5", "a", "0", "b"],
        &["ZADD", "e"],
        &["ZADD", "e", "1"],
        &["ZINCRBY", "e", "x", "a"],
        &["ZADD", "big", "12345678901234567", "m17", "0.5", "half"],
        &["ZSCORE", "big", "m17"],
        &["ZRANGE", "e", "0", "-1", "WITHSCORES"],
        &["ZRANGE", "e", "(1", "inf", "BYSCORE", "WITHSCORES"],
        &[
            "ZRANGE", "e", "inf", "(1", "BYSCORE", "REV", "LIMIT", "0", "2",
        ],
        &["ZRANGE", "e", "0", "-1", "LIMIT", "0", "1"],
        &["ZRANGE", "e", "0", "-1", "LIMIT", "0", "-1"],
        &["ZRANGE", "e", "-", "+", "BYLEX", "WITHSCORES"],
        &["ZRANGE", "e", "-", "+", "BYLEX", "BYSCORE"],
        &["ZRANGE", "e", "a", "b", "BYSCORE"],
        &["ZRANGE", "e", "a", "b", "BYLEX"],
        &["ZRANGE", "e", "0", "-1", "LIMIT", "x", "1", "BYSCORE"],
        &["ZRANGE", "e", "-inf", "inf", "BYSCORE", "LIMIT", "-1", "2"],
        &["ZRANGE", "e", "-inf", "inf", "BYSCORE", "LIMIT", "1", "-5"],
        &["ZRANGEBYSCORE", "e", "-inf", "inf", "BYSCORE"],
        &["ZRANGEBYSCORE", "e", "1", "2", "WITHSCORES", "LIMIT", "1"],
        &["ZRANGEBYLEX", "e", "-", "+", "WITHSCORES"],
        &["ZRANGEBYLEX", "e", "a", "+"],
        &["ZCOUNT", "e", "(2", "(2"],
        &["ZCOUNT", "e", "2", "2"],
        &["ZCOUNT", "e", "nan", "1"],
        &["ZRANGESTORE", "dst", "e", "0", "-1", "WITHSCORES"],
        &["ZRANGESTORE", "dst", "e", "0", "1"],
        &["ZRANGE", "dst", "0", "-1", "WITHSCORES"],
        &["ZRANGESTORE", "dst", "nosuch", "0", "1"],
        &["EXISTS", "dst"],
        &["ZPOPMIN", "e", "-1"],
        &["ZPOPMIN", "e", "0"],
        &["ZPOPMIN", "e", "1", "2"],
        &["ZPOPMAX", "e"],
        &["ZPOPMIN", "nosuch"],
        &["ZMPOP", "0", "e", "MIN"],
        &["ZMPOP", "1", "e", "foo"],
        &["ZMPOP", "2", "nosuch", "e", "MAX", "COUNT", "10"],
        &["ZMPOP", "1", "nosuch", "MIN"],
        &["ZMPOP", "1", "e", "MIN", "COUNT", "0"],
        &["ZMPOP", "5", "e", "MIN"],
        &["ZUNION", "0", "e"],
        &["ZUNION", "3", "e"],
        &["ZUNION", "x", "e"],
        &["ZUNION", "1", "e", "WEIGHTS", "x"],
        &["ZUNION", "1", "e", "AGGREGATE", "avg"],
        &["ZDIFF", "1", "e", "WEIGHTS", "1"],
        &["ZUNIONSTORE", "d", "1", "e", "WITHSCORES"],
        &["ZINTERCARD", "0", "e"],
        &["ZINTERCARD", "2", "e"],
        &["ZINTERCARD", "1", "e", "LIMIT", "-1"],
        &["ZRANDMEMBER", "e", "5", "WITHSCORES", "x"],
        &["ZRANDMEMBER", "e", "9223372036854775807", "WITHSCORES"],
        &["ZRANDMEMBER", "e", "-9223372036854775808"],
        &["ZRANDMEMBER", "nosuch"],
        &["ZRANDMEMBER", "nosuch", "3"],
        &["ZSCAN", "e", "x"],
        &["ZSCAN", "e", "0", "MATCH", "*o*"],
        &["ZSCAN", "e", "0", "COUNT", "0"],
        &["ZREMRANGEBYSCORE", "e", "x", "1"],
        &["ZREMRANGEBYLEX", "e", "a", "b"],
        &["ZREMRANGEBYRANK", "e", "0", "x"],
        &["ZLEXCOUNT", "e", "[", "("],
        &["ZCARD", "e"],
        &["SET", "str", "v"],
        &["ZADD", "str", "1", "a"],
        &["ZRANGE", "str", "0", "1"],
        &["ZUNION", "2", "e", "str"],
        &["TYPE", "e"],
        &["OBJECT", "ENCODING", "e"],
        // Keys in different slots, so with two workers these span both.
        &["ZADD", "x1", "1", "a", "2", "b", "3", "c"],
        &["ZADD", "x2", "10", "b", "20", "c", "30", "d"],
        &["SADD", "x3", "c", "d", "e"],
        &[
            "ZUNIONSTORE",
            "x4",
            "3",
            "x1",
            "x2",
            "x3",
            "WEIGHTS",
            "1",
            "2",
            "0.5",
        ],
        &["ZRANGE", "x4", "0", "-1", "WITHSCORES"],
        &["ZINTERSTORE", "x5", "2", "x1", "x2", "AGGREGATE", "MAX"],
        &["ZRANGE", "x5", "0", "-1", "WITHSCORES"],
        &["ZDIFFSTORE", "x6", "2", "x2", "x1"],
        &["ZRANGE", "x6", "0", "-1", "WITHSCORES"],
        &["ZINTER", "3", "x1", "x2", "x3", "WITHSCORES"],
        &["ZUNION", "2", "x1", "x3"],
        &["ZINTERCARD", "2", "x1", "x2"],
        &["ZRANGESTORE", "x7", "x2", "(10", "+inf", "BYSCORE"],
        &["ZRANGE", "x7", "0", "-1", "WITHSCORES"],
        &["ZMPOP", "3", "nosuch", "x7", "x1", "MAX", "COUNT", "5"],
        &["EXISTS", "x7"],
        &["ZUNIONSTORE", "x1", "1", "nosuch"],
        &["EXISTS", "x1"],
    ];
    for c in cases {
        p.check(c);
    }
    // Encodings: past 128 members or with a member over 64 bytes a zset is a skiplist.
    let mut args = vec!["ZADD".to_string(), "many".into()];
    for i in 0..129 {
        args.push(i.to_string());
        args.push(format!("m{i}"));
    }
    let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    p.check(&a);
    let long = "L".repeat(65);
    for c in [
        vec!["OBJECT", "ENCODING", "many"],
        vec!["ZREMRANGEBYRANK", "many", "0", "100"],
        vec!["OBJECT", "ENCODING", "many"],
        vec!["ZRANGESTORE", "few", "many", "0", "-1"],
        vec!["OBJECT", "ENCODING", "few"],
        vec!["ZADD", "longm", "1", long.as_str()],
        vec!["OBJECT", "ENCODING", "longm"],
        vec!["ZRANGE", "many", "0", "-1", "WITHSCORES"],
        vec!["ZSCORE", "many", "m128"],
        vec!["ZRANK", "many", "m128"],
        vec!["ZREVRANK", "many", "m120"],
        vec!["RENAME", "many", "{x}renamed"],
        vec!["ZRANGE", "{x}renamed", "0", "2"],
        vec!["COPY", "e", "ecopy"],
        vec!["ZRANGE", "ecopy", "0", "-1", "WITHSCORES"],
    ] {
        p.check(&c);
    }
    p.check(&["FLUSHALL"]);
}

/// ZRANDMEMBER's replies are random: distinct members for a positive count (all of them
/// when it is at least the size), any members for a negative one, each with its score.
fn random_member_properties(p: &mut Pair) {
    p.check(&["ZADD", "r", "1", "a", "2", "b", "3", "c"]);
    for _ in 0..20 {
        let one = p.l.call(&[b"ZRANDMEMBER", b"r"]);
        assert!([&b"$1\r\na\r\n"[..], b"$1\r\nb\r\n", b"$1\r\nc\r\n"].contains(&one.as_slice()));
        let two = p.l.call(&[b"ZRANDMEMBER", b"r", b"2"]);
        let text = String::from_utf8(two).unwrap();
        let members: Vec<&str> = text.split("\r\n").filter(|l| l.len() == 1).collect();
        assert_eq!(members.len(), 2, "{text:?}");
        assert_ne!(members[0], members[1]);
        let neg = p.l.call(&[b"ZRANDMEMBER", b"r", b"-5", b"WITHSCORES"]);
        let text = String::from_utf8(neg).unwrap();
        assert!(text.starts_with("*10\r\n"), "{text:?}");
        let lines: Vec<&str> = text.split("\r\n").collect();
        for pair in lines[1..].chunks(4).filter(|c| c.len() == 4) {
            let want = match pair[1] {
                "a" => "1",
                "b" => "2",
                "c" => "3",
                other => panic!("member {other}"),
            };
            assert_eq!(pair[3], want);
        }
    }
    let all = p.l.call(&[b"ZRANDMEMBER", b"r", b"10", b"WITHSCORES"]);
    assert_eq!(
        all,
        b"*6\r\n$1\r\na\r\n$1\r\n1\r\n$1\r\nb\r\n$1\r\n2\r\n$1\r\nc\r\n$1\r\n3\r\n"
    );
    p.check(&["DEL", "r"]);
}

/// What only Redis 7.2 does, checked against its documented bytes.
fn redis_7_2_only(p: &mut Pair) {
    let l = &mut p.l;
    l.call(&[b"HELLO", b"2"]);
    l.call(&[b"ZADD", b"s72", b"0.1", b"a", b"1.5", b"b", b"1e18", b"c"]);
    assert_eq!(l.call(&[b"ZSCORE", b"s72", b"a"]), b"$3\r\n0.1\r\n");
    assert_eq!(
        l.call(&[b"ZSCORE", b"s72", b"c"]),
        b"$19\r\n1000000000000000000\r\n"
    );
    // 7.2's d2string keeps the sign of zero (7.0 stores "0" in the listpack).
    l.call(&[b"ZADD", b"s72", b"-0", b"negzero"]);
    assert_eq!(l.call(&[b"ZSCORE", b"s72", b"negzero"]), b"$2\r\n-0\r\n");
    l.call(&[b"ZREM", b"s72", b"negzero"]);
    assert_eq!(
        l.call(&[b"ZRANK", b"s72", b"b", b"WITHSCORE"]),
        b"*2\r\n:1\r\n$3\r\n1.5\r\n"
    );
    assert_eq!(
        l.call(&[b"ZREVRANK", b"s72", b"a", b"withscore"]),
        b"*2\r\n:2\r\n$3\r\n0.1\r\n"
    );
    assert_eq!(l.call(&[b"ZRANK", b"s72", b"zz", b"WITHSCORE"]), b"*-1\r\n");
    assert_eq!(
        l.call(&[b"ZRANK", b"s72", b"a", b"bad"]),
        b"-ERR syntax error\r\n"
    );
    l.call(&[b"HELLO", b"3"]);
    assert_eq!(
        l.call(&[b"ZRANK", b"s72", b"b", b"WITHSCORE"]),
        b"*2\r\n:1\r\n,1.5\r\n"
    );
    assert_eq!(l.call(&[b"ZRANK", b"nosuch", b"b", b"WITHSCORE"]), b"_\r\n");
    assert_eq!(l.call(&[b"ZSCORE", b"s72", b"a"]), b",0.1\r\n");
    l.call(&[b"HELLO", b"2"]);
    l.call(&[b"DEL", b"s72"]);
}

// Fixed edge cases and random sequences give byte-identical replies in RESP2 and RESP3,
// with multi-key commands spanning both workers; 7.2-only replies match 7.2's bytes.
#[test]
fn zset_matches_redis() {
    let mut p = Pair::start("diff-zset", &["--threads", "2"]);
    for proto in [2u8, 3] {
        p.hello(proto);
        edge_cases(&mut p);
        run_random(&mut p, 0x25e7 + proto as u64, 1500);
        p.check(&["FLUSHALL"]);
    }
    p.hello(2);
    random_member_properties(&mut p);
    redis_7_2_only(&mut p);
}
