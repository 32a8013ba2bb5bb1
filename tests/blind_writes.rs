//! Blind overwrites through the server (`--blind-writes`, `docs/index.md` "Blind overwrites"):
//! replies identical to redis-server under forced index collisions, and no foreground read
//! for plain SETs of existing keys.

mod common;
use common::diff::{sorted_elements, Pair, Rng};
use common::Server;

fn info_field(text: &str, field: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO"))
        .trim()
        .parse()
        .unwrap()
}

/// Writes big values in db 1 (on both servers) so that lavik seals its open blocks and the
/// db-0 records written before are only on the device.
fn fill(p: &mut Pair, round: u64) {
    let big = vec![b'a' + (round % 26) as u8; 250_000];
    p.check(&["SELECT", "1"]);
    for i in 0..40 {
        let key = format!("filler{i}");
        p.check_bytes(&[b"SET", key.as_bytes(), &big]);
    }
    p.check(&["SELECT", "0"]);
}

// Proves string writes with blind overwrites on and only 4 index positions per db and shard (many
// keys share one) answer exactly as redis-server does: SET (plain, EX, NX/XX/GET), SETEX,
// PSETEX, MSET, GET, DEL, EXISTS, APPEND, STRLEN, DBSIZE and KEYS, with the old records on
// the device; and that the blind path was taken (INFO counters).
#[test]
fn blind_writes_match_redis_under_collisions() {
    let mask = (0xC000_0000_0000_0000u64).to_string();
    let mut p = Pair::start(
        "blind-diff",
        &["--blind-writes", "yes", "--debug-hash-mask", &mask],
    );
    let mut rng = Rng::new(12);
    let key = |rng: &mut Rng| format!("k{}", rng.below(24));
    for step in 0..540u64 {
        if step % 90 == 0 {
            fill(&mut p, step);
        }
        let k = key(&mut rng);
        let v = format!("v{step}");
        match rng.below(100) {
            0..=29 => p.check(&["SET", &k, &v]),
            30..=34 => p.check(&["SET", &k, &v, "EX", "1000"]),
            35..=39 => p.check(&["SETEX", &k, "1000", &v]),
            40..=42 => p.check(&["PSETEX", &k, "1000000", &v]),
            43..=49 => {
                let k2 = key(&mut rng);
                let k3 = key(&mut rng);
                p.check(&["MSET", &k, &v, &k2, "m2", &k3, "m3"])
            }
            50..=67 => p.check(&["GET", &k]),
            68..=75 => p.check(&["DEL", &k]),
            76..=79 => p.check(&["EXISTS", &k]),
            80..=84 => {
                let opt = ["NX", "XX", "GET"][rng.below(3) as usize];
                p.check(&["SET", &k, &v, opt])
            }
            85..=87 => p.check(&["APPEND", &k, "+"]),
            88..=90 => p.check(&["STRLEN", &k]),
            91..=95 => p.check(&["DBSIZE"]),
            _ => p.check_with(&["KEYS", "*"], sorted_elements),
        };
    }
    p.check(&["DBSIZE"]);
    p.check_with(&["KEYS", "*"], sorted_elements);
    for i in 0..24 {
        p.check(&["GET", &format!("k{i}")]);
    }
    let info = p.lavik.raw().bulk(&[b"INFO", b"storage"]);
    assert!(info_field(&info, "lavik_blind_writes") > 20, "{info}");
    assert!(info_field(&info, "lavik_blind_settled_new") > 0, "{info}");
    assert!(info_field(&info, "lavik_blind_settled_same") > 0, "{info}");
}

// Proves plain SET, SETEX and MSET of existing keys whose records are only on the device
// make no foreground read (INFO lavik_overwrite_reads stays 0, every one is a blind write),
// and that values and DBSIZE are exact afterwards.
#[test]
fn blind_overwrites_make_no_foreground_read() {
    let s = Server::start("blind-reads", &["--blind-writes", "yes"]);
    let mut c = s.client();
    let info = |c: &mut redis::Connection| -> String {
        redis::cmd("INFO").arg("storage").query(c).unwrap()
    };
    for i in 0..200 {
        let _: () = redis::cmd("SET")
            .arg(format!("k{i}"))
            .arg("old")
            .query(&mut c)
            .unwrap();
    }
    let big = vec![b'x'; 250_000];
    let _: () = redis::cmd("SELECT").arg(1).query(&mut c).unwrap();
    for i in 0..100 {
        let _: () = redis::cmd("SET")
            .arg(format!("filler{i}"))
            .arg(&big[..])
            .query(&mut c)
            .unwrap();
    }
    let _: () = redis::cmd("SELECT").arg(0).query(&mut c).unwrap();
    let before = info(&mut c);
    for i in 0..200 {
        let (k, v) = (format!("k{i}"), format!("new{i}"));
        let cmd = match i % 4 {
            0 | 1 => redis::cmd("SET").arg(&k).arg(&v).clone(),
            2 => redis::cmd("SETEX").arg(&k).arg(1000).arg(&v).clone(),
            _ => redis::cmd("MSET").arg(&k).arg(&v).clone(),
        };
        let _: () = cmd.query(&mut c).unwrap();
    }
    let after = info(&mut c);
    for f in ["lavik_overwrite_reads", "lavik_blind_writes"] {
        assert_eq!(info_field(&before, f), 0, "{f} before: {before}");
    }
    assert_eq!(info_field(&after, "lavik_overwrite_reads"), 0, "{after}");
    assert_eq!(info_field(&after, "lavik_blind_writes"), 200, "{after}");
    for i in 0..200 {
        let v: String = redis::cmd("GET")
            .arg(format!("k{i}"))
            .query(&mut c)
            .unwrap();
        assert_eq!(v, format!("new{i}"));
    }
    let n: u64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(n, 200);
    let info = info(&mut c);
    assert_eq!(info_field(&info, "lavik_blind_settled_same"), 200, "{info}");
    assert_eq!(info_field(&info, "lavik_blind_pending"), 0, "{info}");
}
