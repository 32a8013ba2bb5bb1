//! Differential tests: SORT and SORT_RO sent to Debian's `redis-server` (7.0.15) and to
//! lavik (`--threads 2`, so a STORE destination may live on the other worker), replies
//! compared byte for byte in RESP2 and then RESP3.
//!
//! The cluster rule: lavik refuses a BY pattern with `*` and a GET pattern other than `#`
//! unless the pattern hashes to the sorted key's slot (Redis 7.4.2's rule in cluster mode;
//! Redis 7.0/7.2 in cluster mode refuse every such pattern). redis-server here is not in
//! cluster mode and accepts every pattern, so only tagged patterns (`{s}w_*` for keys
//! `{s}...`), `nosort` and `#` are compared; the refusal of the rest is checked on lavik
//! alone (`refuses_patterns_outside_the_slot`).
//!
//! Where Redis's order is unspecified the replies are compared as multisets
//! (`sorted_elements`): a set with `BY nosort` and no STORE (Redis returns its hash order,
//! lavik sorts it), and ALPHA with BY when some elements have no BY value (ties, which
//! Redis leaves in its set's hash order).
mod common;
use common::diff::{sorted_elements, Pair, RespConn, Rng};

const LIST: &str = "{s}l";
const SET: &str = "{s}set";
const ZSET: &str = "{s}z";
const SOURCES: &[&str] = &[LIST, SET, ZSET, "{s}missing"];
const NUMBERS: &[&str] = &[
    "1",
    "2",
    "10",
    "-3",
    "2.5",
    "1e2",
    "007",
    " 4",
    "inf",
    "-inf",
    "0",
    "-0",
    "3.25",
    "42",
    "-17",
    "9223372036854775807",
];
const WORDS: &[&str] = &["a", "b", "ab", "abc", "x1", "B", "zz", "m", "", "q9"];
const DESTS: &[&str] = &["{s}dst", "dst-other", "{s}l"];

/// One round's data: which elements have BY values and whether those are all numeric.
struct Data {
    /// Every element has a `{s}w_*` string and `{s}o_*` hash (fields n and f).
    complete: bool,
}

fn fill(p: &mut Pair, rng: &mut Rng) -> Data {
    p.check(&["FLUSHALL"]);
    let words = rng.chance(40);
    let pool: &[&str] = if words { WORDS } else { NUMBERS };
    let mut elements: Vec<String> = Vec::new();
    let mut push = vec!["RPUSH".to_string(), LIST.to_string()];
    for _ in 0..rng.below(12) {
        let e = rng.pick(pool).to_string();
        push.push(e.clone());
        elements.push(e);
    }
    let mut sadd = vec!["SADD".to_string(), SET.to_string()];
    let mut zadd = vec!["ZADD".to_string(), ZSET.to_string()];
    for _ in 0..rng.below(12) {
        let e = rng.pick(pool).to_string();
        sadd.push(e.clone());
        zadd.push(rng.pick(&["1", "2", "-5", "0.5", "2"]).to_string());
        zadd.push(e.clone());
        elements.push(e);
    }
    for cmd in [push, sadd, zadd] {
        if cmd.len() > 2 {
            let a: Vec<&str> = cmd.iter().map(|s| s.as_str()).collect();
            p.check(&a);
        }
    }
    elements.sort();
    elements.dedup();
    let complete = rng.chance(60);
    for (i, e) in elements.iter().enumerate() {
        if complete || rng.chance(60) {
            // Unique numeric weights in complete rounds, so no two elements tie.
            let w = if complete || rng.chance(85) {
                format!("{}", (rng.below(50) as i64 - 25) * 100 + i as i64)
            } else {
                "notanumber".to_string()
            };
            p.check(&["SET", &format!("{{s}}w_{e}"), &w]);
        }
        if complete || rng.chance(60) {
            let n = format!("{}.5", rng.below(1000) * 100 + i as u64);
            let f = format!("f{}{i:02}", rng.below(10));
            p.check(&["HSET", &format!("{{s}}o_{e}"), "n", &n, "f", &f]);
        }
    }
    p.check(&["SET", "{s}str", "x"]);
    p.check(&["HSET", "{s}h", "a", "1"]);
    p.check(&["SET", "{s}o_a", "a string, not a hash"]);
    Data { complete }
}

fn sort_command(rng: &mut Rng, data: &Data) -> (Vec<String>, bool) {
    let src = rng.pick(SOURCES).to_string();
    let readonly = rng.chance(25);
    let mut a = vec![
        if readonly { "SORT_RO" } else { "SORT" }.to_string(),
        src.clone(),
    ];
    let by = match rng.below(7) {
        0 | 1 => None,
        2 => Some("nosort"),
        3 => Some("{s}w_*"),
        4 => Some("{s}o_*->n"),
        5 => Some("{s}o_*->f"),
        _ => Some("{s}none_*"),
    };
    let alpha = rng.chance(40);
    let desc = rng.chance(40);
    let nosort = by == Some("nosort");
    // See the module comment: where Redis's order is unspecified, compare as multisets
    // (and store nothing, so later commands see the same data on both servers).
    let alpha_ties =
        alpha && by.is_some() && !nosort && (!data.complete || by == Some("{s}none_*"));
    let unordered_ties = alpha_ties && src != LIST;
    let store = !readonly && !unordered_ties && rng.chance(30);
    let set_hash_order = src == SET && nosort && !store;
    let unordered = set_hash_order || unordered_ties;
    let mut opts: Vec<Vec<String>> = Vec::new();
    if let Some(b) = by {
        opts.push(vec!["BY".into(), b.into()]);
    }
    if alpha {
        opts.push(vec!["ALPHA".into()]);
    }
    if desc {
        opts.push(vec!["DESC".into()]);
    } else if rng.chance(20) {
        opts.push(vec!["ASC".into()]);
    }
    if !unordered && !alpha_ties && rng.chance(40) {
        let start = rng.pick(&["0", "1", "3", "-2", "20"]);
        let count = rng.pick(&["1", "2", "5", "0", "-1", "100"]);
        opts.push(vec!["LIMIT".into(), start.to_string(), count.to_string()]);
    }
    for _ in 0..rng.below(4) {
        let g = rng.pick(&[
            "#",
            "{s}w_*",
            "{s}o_*->f",
            "{s}o_*->n",
            "{s}o_*->zz",
            "{s}none_*",
            "{s}fixed",
            "{s}w_*->",
        ]);
        opts.push(vec!["GET".into(), g.to_string()]);
    }
    if store {
        opts.push(vec!["STORE".into(), rng.pick(DESTS).to_string()]);
    }
    // Options in any order (Redis parses them left to right, later ones winning).
    for i in (1..opts.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        opts.swap(i, j);
    }
    for o in opts {
        for w in o {
            if rng.chance(30) {
                a.push(w.to_lowercase());
            } else {
                a.push(w);
            }
        }
    }
    (a, unordered)
}

fn run_random(p: &mut Pair, rng: &mut Rng, rounds: usize, per_round: usize) {
    for _ in 0..rounds {
        let data = fill(p, rng);
        for _ in 0..per_round {
            let (cmd, unordered) = sort_command(rng, &data);
            let a: Vec<&str> = cmd.iter().map(|s| s.as_str()).collect();
            if unordered {
                p.check_with(&a, sorted_elements);
            } else {
                p.check(&a);
            }
            if let Some(i) = cmd.iter().position(|w| w.eq_ignore_ascii_case("store")) {
                let dest = cmd[i + 1].clone();
                p.check(&["LRANGE", &dest, "0", "-1"]);
                p.check(&["TYPE", &dest]);
                p.check(&["TTL", &dest]);
            }
        }
    }
}

// Random lists, sets and sorted sets of numbers and words, sorted with random option
// combinations (BY, GET, LIMIT, ALPHA, ASC/DESC, STORE), match Redis in RESP2 and RESP3.
#[test]
fn random_sorts_match_redis() {
    let mut p = Pair::start("diff-sort", &["--threads", "2"]);
    let mut rng = Rng::new(0x50f7);
    run_random(&mut p, &mut rng, 40, 12);
    p.hello(3);
    run_random(&mut p, &mut rng, 25, 12);
    p.hello(2);
    edge_cases(&mut p);
    p.hello(3);
    edge_cases(&mut p);
    refuses_patterns_outside_the_slot(&mut p);
    command_info(&mut p);
    acl_users(&mut p);
}

/// ACL: BY with `*` and any GET (even `#`) need a user who may read every key (`~*` or
/// `%R~*`); the STORE destination needs write access, the sorted key read access. The
/// error of the first refused option wins, as in Redis's option parsing.
fn acl_users(p: &mut Pair) {
    p.check(&["RPUSH", "{s}acl", "2", "1"]);
    p.check(&["ACL", "SETUSER", "ro", "on", "nopass", "%R~*", "+@all"]);
    p.check(&["ACL", "SETUSER", "some", "on", "nopass", "~{s}*", "+@all"]);
    p.check(&["ACL", "SETUSER", "wo", "on", "nopass", "%W~*", "+@all"]);
    let (lp, rp) = (p.lavik.port, p.redis.port);
    for user in ["ro", "some", "wo"] {
        let mut l = RespConn::connect(lp);
        let mut r = RespConn::connect(rp);
        let cmds: &[&[&str]] = &[
            &["AUTH", user, "x"],
            &["SORT", "{s}acl"],
            &["SORT_RO", "{s}acl", "BY", "{s}w_*"],
            &["SORT", "{s}acl", "GET", "#"],
            &["SORT", "{s}acl", "BY", "nosort", "GET", "{s}w_*"],
            &["SORT", "{s}acl", "LIMIT", "x", "1", "GET", "#"],
            &["SORT", "{s}acl", "GET", "#", "LIMIT", "x", "1"],
            &["SORT", "{s}acl", "STORE", "{s}acl-d"],
            &["SORT", "{s}acl", "BY", "nosort"],
        ];
        for cmd in cmds {
            let a: Vec<&[u8]> = cmd.iter().map(|s| s.as_bytes()).collect();
            let (lr, rr) = (l.call(&a), r.call(&a));
            // NOPERM texts are 7.2's in lavik ("No permissions to access a key"), 7.0's here.
            if lr.starts_with(b"-NOPERM") && rr.starts_with(b"-NOPERM") {
                continue;
            }
            assert_eq!(
                String::from_utf8_lossy(&lr),
                String::from_utf8_lossy(&rr),
                "user {user}: {cmd:?}"
            );
        }
    }
}

/// Arity, flags (movablekeys), key positions and ACL categories as Redis (lavik reports no
/// key specs, so the comparison stops after the categories).
fn command_info(p: &mut Pair) {
    for name in ["sort", "sort_ro"] {
        p.check_with(&["COMMAND", "INFO", name], |reply| {
            let last = b"+@dangerous\r\n";
            let cut = reply
                .windows(last.len())
                .position(|w| w == last)
                .expect("categories listed");
            reply[..cut + last.len()].to_vec()
        });
    }
}

/// Error texts and their order, STORE's delete and TTL rules, and patterns naming keys of
/// other kinds, compared with Redis.
fn edge_cases(p: &mut Pair) {
    p.check(&["FLUSHALL"]);
    p.check(&["RPUSH", "{s}l", "3", "1", "2", "x"]);
    p.check(&["RPUSH", "{s}n", "3", "1", "2", "10", "-1.5", "1e1"]);
    p.check(&["SADD", "{s}set", "c", "a", "b"]);
    p.check(&["SET", "{s}str", "v"]);
    p.check(&["HSET", "{s}h", "f", "v"]);
    // Numeric sort of a non-number, and of a bad BY value: the conversion error.
    p.check(&["SORT", "{s}l"]);
    p.check(&["SORT", "{s}l", "STORE", "{s}d"]);
    p.check(&["EXISTS", "{s}d"]);
    p.check(&["SORT", "{s}l", "ALPHA"]);
    p.check(&["SORT", "{s}n"]);
    p.check(&["SORT", "{s}n", "DESC", "LIMIT", "1", "3"]);
    // WRONGTYPE for a string and a hash; option errors come first.
    p.check(&["SORT", "{s}str"]);
    p.check(&["SORT_RO", "{s}h"]);
    p.check(&["SORT", "{s}str", "LIMIT", "x", "1"]);
    p.check(&["SORT", "{s}str", "FOO"]);
    p.check(&["SORT", "{s}l", "LIMIT", "0"]);
    p.check(&["SORT", "{s}l", "LIMIT", "0", "1.5"]);
    p.check(&["SORT", "{s}l", "BY"]);
    p.check(&["SORT", "{s}l", "GET"]);
    p.check(&["SORT", "{s}l", "STORE"]);
    p.check(&["SORT_RO", "{s}n", "STORE", "{s}d"]);
    p.check(&["SORT"]);
    p.check(&["SORT_RO"]);
    // STORE: a list without TTL replacing any value; an empty result deletes the key.
    p.check(&["SET", "{s}d", "old", "EX", "100"]);
    p.check(&["SORT", "{s}n", "STORE", "{s}d"]);
    p.check(&["TYPE", "{s}d"]);
    p.check(&["TTL", "{s}d"]);
    p.check(&["LRANGE", "{s}d", "0", "-1"]);
    p.check(&["SORT", "{s}missing", "STORE", "{s}d"]);
    p.check(&["EXISTS", "{s}d"]);
    p.check(&["SORT", "{s}n", "LIMIT", "10", "2", "STORE", "dst-other"]);
    p.check(&["SORT", "{s}n", "STORE", "{s}d", "STORE", "dst-other"]);
    p.check(&["LRANGE", "dst-other", "0", "-1"]);
    p.check(&["EXISTS", "{s}d"]);
    // A set with BY nosort and STORE is sorted ALPHA (DESC honoured).
    p.check(&["SORT", "{s}set", "BY", "nosort", "DESC", "STORE", "{s}d"]);
    p.check(&["LRANGE", "{s}d", "0", "-1"]);
    // The sorted key itself as destination: read before written.
    p.check(&["SORT", "{s}n", "DESC", "STORE", "{s}n"]);
    p.check(&["LRANGE", "{s}n", "0", "-1"]);
    // GET of a string through ->, of a hash without ->, of a missing field: nil, and
    // STORE keeps an empty string for them.
    p.check(&["SET", "{s}k_3", "three"]);
    p.check(&["HSET", "{s}k_1", "f", "one"]);
    p.check(&[
        "SORT",
        "{s}l",
        "BY",
        "nosort",
        "GET",
        "{s}k_*",
        "GET",
        "{s}k_*->f",
        "GET",
        "#",
    ]);
    p.check(&[
        "SORT", "{s}l", "BY", "nosort", "GET", "{s}k_*", "STORE", "{s}d",
    ]);
    p.check(&["LRANGE", "{s}d", "0", "-1"]);
    // BY a constant after a pattern: no sort (dontsort sticks).
    p.check(&["SORT", "{s}l", "BY", "{s}k_*", "BY", "nosort", "DESC"]);
    p.check(&["SORT", "{s}l", "BY", "nosort", "BY", "{s}k_*", "ALPHA"]);
    // An untagged key with patterns tagged by its own name shares its slot.
    p.check(&["RPUSH", "plain", "2", "1", "3"]);
    p.check(&["SET", "{plain}w_1", "30"]);
    p.check(&["SET", "{plain}w_2", "20"]);
    p.check(&[
        "SORT",
        "plain",
        "BY",
        "{plain}w_*",
        "GET",
        "#",
        "GET",
        "{plain}w_*",
    ]);
    p.check(&["SORT_RO", "plain", "BY", "nosort", "GET", "#"]);
    // Sorted sets keep their score order with BY nosort, reversed by DESC, cut by LIMIT.
    p.check(&["ZADD", "{s}z", "3", "c", "1", "b", "2", "a", "1", "a0"]);
    p.check(&["SORT", "{s}z", "BY", "nosort"]);
    p.check(&["SORT", "{s}z", "BY", "nosort", "DESC", "LIMIT", "1", "2"]);
    p.check(&["SORT", "{s}z", "ALPHA", "DESC"]);
    // In MULTI, STORE to a key on the other worker; in a script a set with BY nosort is
    // sorted (ALPHA), which Redis does there too.
    p.check(&["MULTI"]);
    p.check(&["SORT", "{s}set", "ALPHA", "DESC", "STORE", "dst-other"]);
    p.check(&["SORT_RO", "{s}z", "BY", "nosort", "GET", "#"]);
    p.check(&["EXEC"]);
    p.check(&["LRANGE", "dst-other", "0", "-1"]);
    p.check(&["SADD", "{s}set", "10", "9", "x", "-1"]);
    let script = "return redis.call('SORT', KEYS[1], 'BY', 'nosort', 'DESC', 'LIMIT', '1', '4')";
    p.check(&["EVAL", script, "1", "{s}set"]);
    let script = "return redis.call('SORT', KEYS[1], 'BY', KEYS[1] .. '*')";
    p.check(&["EVAL", script, "1", "{s}l"]);
}

/// BY/GET patterns whose keys may lie outside the sorted key's slot are refused (lavik
/// alone: redis-server here is not in cluster mode); `nosort`, `#` and tagged ones pass.
fn refuses_patterns_outside_the_slot(p: &mut Pair) {
    const BY: &[u8] = b"-ERR BY option of SORT denied in Cluster mode when keys formed by the pattern may be in different slots.\r\n";
    const GET: &[u8] = b"-ERR GET option of SORT denied in Cluster mode when keys formed by the pattern may be in different slots.\r\n";
    p.l.call(&[b"RPUSH", b"{s}r", b"1", b"2"]);
    let cases: &[(&[&str], &[u8])] = &[
        (&["SORT", "{s}r", "BY", "w_*"], BY),
        (&["SORT", "{s}r", "BY", "{other}w_*"], BY),
        (&["SORT", "{s}r", "BY", "*{s}"], BY),
        (&["SORT", "{s}r", "BY", "{}{s}w_*"], BY),
        (&["SORT_RO", "{s}r", "BY", "w_*->f"], BY),
        (&["SORT", "{s}r", "GET", "w_*"], GET),
        (&["SORT", "{s}r", "GET", "#", "GET", "{x}*"], GET),
        (&["SORT", "{s}r", "BY", "nosort", "GET", "fixed"], GET),
        (&["SORT", "{s}r", "GET", "w_?*"], GET),
        // The first refused option decides which error.
        (&["SORT", "{s}r", "GET", "w_*", "BY", "w_*"], GET),
    ];
    for (cmd, want) in cases {
        let a: Vec<&[u8]> = cmd.iter().map(|s| s.as_bytes()).collect();
        let got = p.l.call(&a);
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(want),
            "{cmd:?}"
        );
    }
    // Refused before anything is written: no STORE happened.
    let got =
        p.l.call(&[b"SORT", b"{s}r", b"STORE", b"{s}never", b"GET", b"x_*"]);
    assert_eq!(got, GET);
    assert_eq!(p.l.call(&[b"EXISTS", b"{s}never"]), b":0\r\n");
    // Constant BY patterns and `#` are always allowed, tagged ones when the tag matches.
    for cmd in [
        &["SORT", "{s}r", "BY", "nosort", "GET", "#"][..],
        &["SORT", "{s}r", "BY", "w_nostar"],
        &["SORT", "{s}r", "BY", "{s}w_*", "GET", "{s}x_*->f"],
    ] {
        let a: Vec<&[u8]> = cmd.iter().map(|s| s.as_bytes()).collect();
        let got = p.l.call(&a);
        assert!(
            got.starts_with(b"*"),
            "{cmd:?}: {:?}",
            String::from_utf8_lossy(&got)
        );
    }
}

fn sync_reads(c: &mut redis::Connection) -> u64 {
    let text: String = redis::cmd("INFO").arg("stats").query(c).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("lavik_sync_reads:"))
        .expect("lavik_sync_reads in INFO")
        .trim()
        .parse()
        .unwrap()
}

// The keys BY/GET patterns form are not prefetched: with no record cache, those whose
// values are on the device are read synchronously and counted in lavik_sync_reads, and
// the reply still has their values (lavik alone).
#[test]
fn pattern_keys_are_read_synchronously_and_counted() {
    const ELEMENTS: usize = 40;
    // Over a 1 MiB block of 1 KB values in the {s} shard, so the first ones are sealed.
    const FILL: usize = 1500;
    let s = common::Server::start("sort-sync", &["--threads", "1", "--cache-size", "0"]);
    let mut c = s.client();
    let mut pipe = redis::pipe();
    for i in 0..FILL {
        let value = format!("{i:04}{}", "v".repeat(996));
        pipe.cmd("SET")
            .arg(format!("{{s}}w_{i}"))
            .arg(value)
            .ignore();
    }
    pipe.cmd("RPUSH")
        .arg("{s}l")
        .arg((0..ELEMENTS).collect::<Vec<_>>())
        .ignore();
    let () = pipe.query(&mut c).unwrap();
    let before = sync_reads(&mut c);
    let got: Vec<Vec<u8>> = redis::cmd("SORT")
        .arg(&["{s}l", "BY", "nosort", "GET", "{s}w_*"])
        .query(&mut c)
        .unwrap();
    let after = sync_reads(&mut c);
    assert_eq!(got.len(), ELEMENTS);
    for (i, v) in got.iter().enumerate() {
        assert!(v.starts_with(format!("{i:04}").as_bytes()) && v.len() == 1000);
    }
    assert!(
        after > before,
        "no synchronous read counted ({before} -> {after})"
    );
}
