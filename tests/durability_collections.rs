//! Hashes, sets, sorted sets and lists through restarts of the real server: a clean restart
//! (with and without the shutdown checkpoint) and SIGKILL under
//! HSET/SADD/ZADD/HDEL/SREM/ZREM/RPUSH/LPUSH/LPOP load with `--appendfsync always`.
mod common;
use common::diff::Rng;
use common::Server;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type Hashes = BTreeMap<String, BTreeMap<String, String>>;
type Sets = BTreeMap<String, BTreeSet<String>>;
type ZSets = BTreeMap<String, BTreeMap<String, i64>>;
type Lists = BTreeMap<String, VecDeque<String>>;

/// What one load thread believes: the effect of every acknowledged command, and the one
/// command it sent last without an answer (it may or may not have been applied).
#[derive(Default, Clone)]
struct Model {
    hashes: Hashes,
    sets: Sets,
    zsets: ZSets,
    lists: Lists,
    pending: Option<Vec<String>>,
    /// Commands acknowledged so far.
    acked: u64,
}

impl Model {
    /// The state with the pending command applied (the state if the server applied it).
    fn with_pending(&self) -> Model {
        let mut m = self.clone();
        if let Some(p) = &self.pending {
            m.apply(p);
        }
        m
    }

    fn apply(&mut self, c: &[String]) {
        match c[0].as_str() {
            "HSET" => {
                self.hashes
                    .entry(c[1].clone())
                    .or_default()
                    .insert(c[2].clone(), c[3].clone());
            }
            "HDEL" => {
                if let Some(h) = self.hashes.get_mut(&c[1]) {
                    h.remove(&c[2]);
                    if h.is_empty() {
                        self.hashes.remove(&c[1]);
                    }
                }
            }
            "SADD" => {
                self.sets
                    .entry(c[1].clone())
                    .or_default()
                    .insert(c[2].clone());
            }
            "SREM" => {
                if let Some(s) = self.sets.get_mut(&c[1]) {
                    s.remove(&c[2]);
                    if s.is_empty() {
                        self.sets.remove(&c[1]);
                    }
                }
            }
            "ZADD" => {
                self.zsets
                    .entry(c[1].clone())
                    .or_default()
                    .insert(c[3].clone(), c[2].parse().unwrap());
            }
            "ZREM" => {
                if let Some(z) = self.zsets.get_mut(&c[1]) {
                    z.remove(&c[2]);
                    if z.is_empty() {
                        self.zsets.remove(&c[1]);
                    }
                }
            }
            "RPUSH" => self
                .lists
                .entry(c[1].clone())
                .or_default()
                .push_back(c[2].clone()),
            "LPUSH" => self
                .lists
                .entry(c[1].clone())
                .or_default()
                .push_front(c[2].clone()),
            "LPOP" | "RPOP" => {
                if let Some(l) = self.lists.get_mut(&c[1]) {
                    if c[0] == "LPOP" {
                        l.pop_front();
                    } else {
                        l.pop_back();
                    }
                    if l.is_empty() {
                        self.lists.remove(&c[1]);
                    }
                }
            }
            other => panic!("model has no {other}"),
        }
    }
}

fn random_op(rng: &mut Rng, t: u64, n: u64) -> Vec<String> {
    let j = rng.below(6);
    let f = rng.below(12);
    // Values long enough that some hashes leave the listpack encoding.
    let v = format!("{n}-{}", "v".repeat(rng.below(80) as usize));
    match rng.below(9) {
        0 => vec!["HSET".into(), format!("c{t}:h{j}"), format!("f{f}"), v],
        1 => vec!["HDEL".into(), format!("c{t}:h{j}"), format!("f{f}")],
        2 => vec!["SADD".into(), format!("c{t}:s{j}"), format!("m{f}")],
        3 => vec!["SREM".into(), format!("c{t}:s{j}"), format!("m{f}")],
        4 => vec![
            "ZADD".into(),
            format!("c{t}:z{j}"),
            (rng.below(2000) as i64 - 1000).to_string(),
            // Members past 64 bytes (f = 11) turn some sets into skiplists.
            format!("m{f}-{}", "z".repeat(f as usize * 6)),
        ],
        5 => vec![
            "ZREM".into(),
            format!("c{t}:z{j}"),
            format!("m{f}-{}", "z".repeat(f as usize * 6)),
        ],
        6 => vec!["RPUSH".into(), format!("c{t}:l{j}"), v],
        7 => vec!["LPUSH".into(), format!("c{t}:l{j}"), v],
        _ => vec!["LPOP".into(), format!("c{t}:l{j}")],
    }
}

/// Runs one client thread per model, issuing `op`'s commands until `stop` (or until its
/// connection fails), each applied to its model once acknowledged.
fn load_with(
    port: u16,
    seed: u64,
    stop: Arc<AtomicBool>,
    start: Vec<Model>,
    op: fn(&mut Rng, u64, u64) -> Vec<String>,
) -> (Vec<Arc<Mutex<Model>>>, Vec<JoinHandle<()>>) {
    let mut models = Vec::new();
    let mut threads = Vec::new();
    for (t, m) in start.into_iter().enumerate() {
        let t = t as u64;
        let model = Arc::new(Mutex::new(m));
        models.push(model.clone());
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
            let Ok(mut con) = client.get_connection() else {
                return;
            };
            let _ = con.set_read_timeout(Some(Duration::from_secs(10)));
            let mut rng = Rng::new(seed + t);
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let c = op(&mut rng, t, n);
                n += 1;
                model.lock().unwrap().pending = Some(c.clone());
                let mut cmd = redis::cmd(&c[0]);
                for a in &c[1..] {
                    cmd.arg(a);
                }
                match cmd.query::<redis::Value>(&mut con) {
                    Ok(_) => {
                        let mut m = model.lock().unwrap();
                        m.apply(&c);
                        m.pending = None;
                        m.acked += 1;
                    }
                    Err(_) => return,
                }
            }
        }));
    }
    (models, threads)
}

fn read_hash(con: &mut redis::Connection, key: &str) -> BTreeMap<String, String> {
    redis::cmd("HGETALL").arg(key).query(con).unwrap()
}

fn read_set(con: &mut redis::Connection, key: &str) -> BTreeSet<String> {
    redis::cmd("SMEMBERS").arg(key).query(con).unwrap()
}

/// A sorted set as member -> score, checking on the way that ZRANGE lists it in
/// (score, member) order.
fn read_zset(con: &mut redis::Connection, key: &str) -> BTreeMap<String, i64> {
    let flat: Vec<String> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(con)
        .unwrap();
    let pairs: Vec<(i64, String)> = flat
        .chunks(2)
        .map(|c| (c[1].parse().unwrap(), c[0].clone()))
        .collect();
    assert!(pairs.windows(2).all(|w| w[0] < w[1]), "{key} out of order");
    pairs.into_iter().map(|(s, m)| (m, s)).collect()
}

fn read_list(con: &mut redis::Connection, key: &str) -> VecDeque<String> {
    let v: Vec<String> = redis::cmd("LRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query(con)
        .unwrap();
    v.into()
}

/// `got` (the contents of `key` after the restart) is the acknowledged state, or that state
/// with the command in flight applied.
fn assert_acked<T: PartialEq + Debug>(key: &str, got: &T, acked: &T, with_pending: &T) {
    let short = |x: &T| format!("{x:?}").chars().take(300).collect::<String>();
    assert!(
        got == acked || got == with_pending,
        "{key}: got {}, acknowledged {}",
        short(got),
        short(acked)
    );
}

/// Every key of thread `t` holds the model's contents, or (for the one key the pending
/// command touched) the contents with that command applied.
fn verify(con: &mut redis::Connection, t: u64, m: &Model) {
    fn of<T: Clone + Default>(map: &BTreeMap<String, T>, k: &str) -> T {
        map.get(k).cloned().unwrap_or_default()
    }
    let p = m.with_pending();
    for j in 0..6 {
        let k = format!("c{t}:h{j}");
        assert_acked(
            &k,
            &read_hash(con, &k),
            &of(&m.hashes, &k),
            &of(&p.hashes, &k),
        );
        let k = format!("c{t}:s{j}");
        assert_acked(&k, &read_set(con, &k), &of(&m.sets, &k), &of(&p.sets, &k));
        let k = format!("c{t}:z{j}");
        assert_acked(
            &k,
            &read_zset(con, &k),
            &of(&m.zsets, &k),
            &of(&p.zsets, &k),
        );
        let k = format!("c{t}:l{j}");
        assert_acked(
            &k,
            &read_list(con, &k),
            &of(&m.lists, &k),
            &of(&p.lists, &k),
        );
    }
}

/// One SIGKILL round: one load thread per `start` model issuing `op`'s commands; once every
/// thread has `acked` more commands acknowledged (a count, not a time: the kill lands
/// mid-load however slow the machine), SIGKILL, the threads finish, restart. Returns the
/// threads' models (acknowledged effects and the one command in flight).
fn crash_round(
    s: &mut Server,
    seed: u64,
    start: Vec<Model>,
    op: fn(&mut Rng, u64, u64) -> Vec<String>,
    acked: u64,
) -> Vec<Model> {
    let stop = Arc::new(AtomicBool::new(false));
    let (models, threads) = load_with(s.port, seed, stop.clone(), start, op);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !models.iter().all(|m| m.lock().unwrap().acked >= acked) {
        assert!(Instant::now() < deadline, "the load was never acknowledged");
        std::thread::sleep(Duration::from_millis(5));
    }
    s.kill9();
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    s.restart_after_kill();
    models.iter().map(|m| m.lock().unwrap().clone()).collect()
}

// With appendfsync always, every acknowledged HSET/HDEL/SADD/SREM/ZADD/ZREM/RPUSH/LPUSH/LPOP
// survives SIGKILL and no collection shows a state between two commands, over several
// kill/restart cycles (each kill after 20, 30 and 40 acknowledged commands per thread:
// about what the 0.7-1.1 s of load it ran before got through with every reply fsynced).
#[test]
fn sigkill_collections_always_loses_nothing_acknowledged() {
    let mut s = Server::start("coll-crash", &["--appendfsync", "always"]);
    for round in 0..3u64 {
        let start = vec![Model::default(); 3];
        let models = crash_round(&mut s, 1000 * round, start, random_op, 20 + 10 * round);
        let mut con = s.client();
        for (t, m) in models.iter().enumerate() {
            verify(&mut con, t as u64, m);
        }
        // The next round's threads reuse the key names: start from a clean keyspace.
        let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    }
}

fn fill(con: &mut redis::Connection) -> Model {
    let mut rng = Rng::new(77);
    let mut m = Model::default();
    for n in 0..3000 {
        let c = random_op(&mut rng, 0, n);
        let mut cmd = redis::cmd(&c[0]);
        for a in &c[1..] {
            cmd.arg(a);
        }
        let _: redis::Value = cmd.query(con).unwrap();
        m.apply(&c);
    }
    // One hash, one set and one list larger than a log block (1.2 MB): stored as a root
    // over fragments or pages. Built in batches.
    for batch in 0..12 {
        let mut h = redis::cmd("HSET");
        let mut s = redis::cmd("SADD");
        let mut l = redis::cmd("RPUSH");
        h.arg("big:h");
        s.arg("big:s");
        l.arg("big:l");
        for i in batch * 1000..(batch + 1) * 1000 {
            let f = format!("big{i}-{}", "p".repeat(90));
            let v = "x".repeat(100);
            h.arg(&f).arg(&v);
            s.arg(&f);
            l.arg(&f);
            m.apply(&["RPUSH".into(), "big:l".into(), f.clone()]);
            m.apply(&["HSET".into(), "big:h".into(), f.clone(), v]);
            m.apply(&["SADD".into(), "big:s".into(), f]);
        }
        let _: i64 = h.query(con).unwrap();
        let _: i64 = s.query(con).unwrap();
        let _: i64 = l.query(con).unwrap();
    }
    // And a sorted set of the same size.
    for batch in 0..12 {
        let mut z = redis::cmd("ZADD");
        z.arg("big:z");
        for i in batch * 1000..(batch + 1) * 1000 {
            let member = format!("big{i}-{}", "p".repeat(90));
            let score = (i * 7919) % 5003;
            z.arg(score).arg(&member);
            m.apply(&["ZADD".into(), "big:z".into(), score.to_string(), member]);
        }
        let _: i64 = z.query(con).unwrap();
    }
    let _: i64 = redis::cmd("EXPIRE")
        .arg("c0:h0")
        .arg(5000)
        .query(con)
        .unwrap();
    m
}

fn check_all(con: &mut redis::Connection, m: &Model) {
    let (hashes, sets) = (&m.hashes, &m.sets);
    for (k, l) in &m.lists {
        assert_eq!(&read_list(con, k), l, "{k}");
        let t: String = redis::cmd("TYPE").arg(k).query(con).unwrap();
        assert_eq!(t, "list");
    }
    for (k, z) in &m.zsets {
        assert_eq!(&read_zset(con, k), z, "{k}");
        let t: String = redis::cmd("TYPE").arg(k).query(con).unwrap();
        assert_eq!(t, "zset");
    }
    for (k, h) in hashes {
        assert_eq!(&read_hash(con, k), h, "{k}");
        let t: String = redis::cmd("TYPE").arg(k).query(con).unwrap();
        assert_eq!(t, "hash");
    }
    for (k, s) in sets {
        assert_eq!(&read_set(con, k), s, "{k}");
        let t: String = redis::cmd("TYPE").arg(k).query(con).unwrap();
        assert_eq!(t, "set");
    }
    let ttl: i64 = redis::cmd("TTL").arg("c0:h0").query(con).unwrap();
    assert!(
        hashes.contains_key("c0:h0") == (ttl > 4000),
        "TTL after restart: {ttl}"
    );
    let n: usize = redis::cmd("DBSIZE").query(con).unwrap();
    assert_eq!(n, hashes.len() + sets.len() + m.zsets.len() + m.lists.len());
}

// Hashes, sets, sorted sets and lists (small, and large enough to be stored as fragments or
// pages), their types and TTLs, are the same after a clean restart (recovery scan) and
// after restarts from the shutdown checkpoint (defrag relocation of collection records:
// tests/storage_model.rs).
#[test]
fn clean_restart_keeps_collections() {
    let mut s = Server::start("coll-restart", &[]);
    let mut con = s.client();
    let m = fill(&mut con);
    check_all(&mut con, &m);
    drop(con);
    s.restart();
    check_all(&mut s.client(), &m);
    s.args.push("--shutdown-checkpoint".into());
    s.restart();
    s.restart();
    let mut con = s.client();
    check_all(&mut con, &m);
    drop(con);
    s.restart();
    check_all(&mut s.client(), &m);
}

/// A command on thread `t`'s big hash or set (thousands of members: paged in lavik).
fn big_op(rng: &mut Rng, t: u64, n: u64) -> Vec<String> {
    let f = rng.below(2600);
    match rng.below(4) {
        0 => vec![
            "HSET".into(),
            format!("c{t}:bigh"),
            format!("field-{f}"),
            format!("v{n}"),
        ],
        1 => vec!["HDEL".into(), format!("c{t}:bigh"), format!("field-{f}")],
        2 => vec!["SADD".into(), format!("c{t}:bigs"), format!("member-{f}")],
        _ => vec!["SREM".into(), format!("c{t}:bigs"), format!("member-{f}")],
    }
}

// With appendfsync always, HSET/HDEL/SADD/SREM on big (paged) hashes and sets lose nothing
// acknowledged across SIGKILL, and each collection is exactly its acknowledged state, or
// that state plus the one command in flight — never a mix of pages of two versions.
#[test]
fn sigkill_big_collections_always_loses_nothing_acknowledged() {
    let mut s = Server::start("coll-crash-big", &["--appendfsync", "always"]);
    let threads = 2u64;
    let mut con = s.client();
    let mut start = Vec::new();
    for t in 0..threads {
        let mut m = Model::default();
        for batch in 0..4u64 {
            let mut h = redis::cmd("HSET");
            let mut st = redis::cmd("SADD");
            h.arg(format!("c{t}:bigh"));
            st.arg(format!("c{t}:bigs"));
            for i in batch * 500..(batch + 1) * 500 {
                let c = vec![
                    "HSET".into(),
                    format!("c{t}:bigh"),
                    format!("field-{i}"),
                    format!("start-{i}"),
                ];
                h.arg(&c[2]).arg(&c[3]);
                m.apply(&c);
                let c = vec!["SADD".into(), format!("c{t}:bigs"), format!("member-{i}")];
                st.arg(&c[2]);
                m.apply(&c);
            }
            let _: i64 = h.query(&mut con).unwrap();
            let _: i64 = st.query(&mut con).unwrap();
        }
        start.push(m);
    }
    for round in 0..2u64 {
        let models = crash_round(&mut s, 100 + round, start, big_op, 30);
        let mut con = s.client();
        start = Vec::new();
        for (t, m) in models.iter().enumerate() {
            let p = m.with_pending();
            let hk = format!("c{t}:bigh");
            let got = read_hash(&mut con, &hk);
            assert_acked(&hk, &got, &m.hashes[&hk], &p.hashes[&hk]);
            let sk = format!("c{t}:bigs");
            let got_set = read_set(&mut con, &sk);
            assert_acked(&sk, &got_set, &m.sets[&sk], &p.sets[&sk]);
            // The next round starts from what the server holds.
            let mut next = Model::default();
            next.hashes.insert(hk, got);
            next.sets.insert(sk, got_set);
            start.push(next);
        }
    }
}

/// A command of the big-list load (one thread: `_t` is 0).
fn list_op(rng: &mut Rng, _t: u64, n: u64) -> Vec<String> {
    let e = format!("item-{n}-{}", "q".repeat(rng.below(20) as usize));
    match rng.below(5) {
        0 | 1 => vec!["RPUSH".into(), "biglist".into(), e],
        2 => vec!["LPUSH".into(), "biglist".into(), e],
        3 => vec!["LPOP".into(), "biglist".into()],
        _ => vec!["RPOP".into(), "biglist".into()],
    }
}

// With appendfsync always, RPUSH/LPUSH/LPOP/RPOP on a big (paged) list lose nothing
// acknowledged across SIGKILL: the list is exactly its acknowledged state, or that state
// plus the one command in flight.
#[test]
fn sigkill_big_list_always_loses_nothing_acknowledged() {
    let mut s = Server::start("list-crash-big", &["--appendfsync", "always"]);
    let mut con = s.client();
    let mut acked: VecDeque<String> = (0..6000).map(|i| format!("start-{i}")).collect();
    for chunk in acked.iter().collect::<Vec<_>>().chunks(1000) {
        let mut c = redis::cmd("RPUSH");
        c.arg("biglist");
        for e in chunk {
            c.arg(e.as_str());
        }
        let _: i64 = c.query(&mut con).unwrap();
    }
    for round in 0..2u64 {
        let mut start = Model::default();
        start.lists.insert("biglist".into(), acked);
        let models = crash_round(&mut s, 300 + round, vec![start], list_op, 30);
        let mut con = s.client();
        let got: VecDeque<String> = read_list(&mut con, "biglist");
        let (m, p) = (&models[0], models[0].with_pending());
        let none = VecDeque::new();
        let or_none = |l: Option<&VecDeque<String>>| l.unwrap_or(&none).clone();
        assert_acked(
            &format!("round {round}: biglist"),
            &got,
            &or_none(m.lists.get("biglist")),
            &or_none(p.lists.get("biglist")),
        );
        let enc: String = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg("biglist")
            .query(&mut con)
            .unwrap();
        assert_eq!(enc, "quicklist");
        acked = got;
    }
}

/// A command on thread `t`'s big sorted set (thousands of members: paged in lavik).
fn big_zop(rng: &mut Rng, t: u64, _n: u64) -> Vec<String> {
    let m = format!("member-{}", rng.below(2600));
    if rng.below(3) == 0 {
        vec!["ZREM".into(), format!("c{t}:bigz"), m]
    } else {
        // Small integer scores: many ties.
        let s = (rng.below(40) as i64 - 20).to_string();
        vec!["ZADD".into(), format!("c{t}:bigz"), s, m]
    }
}

// With appendfsync always, ZADD/ZREM on big (paged) sorted sets lose nothing acknowledged
// across SIGKILL, and each sorted set is exactly its acknowledged state, or that state plus
// the one command in flight: never one tree of a version with the other tree of another.
#[test]
fn sigkill_big_zsets_always_loses_nothing_acknowledged() {
    let mut s = Server::start("zset-crash-big", &["--appendfsync", "always"]);
    let threads = 2u64;
    let mut con = s.client();
    let mut start = Vec::new();
    for t in 0..threads {
        let mut m = Model::default();
        for batch in 0..4u64 {
            let mut z = redis::cmd("ZADD");
            z.arg(format!("c{t}:bigz"));
            for i in batch * 500..(batch + 1) * 500 {
                let c = vec![
                    "ZADD".into(),
                    format!("c{t}:bigz"),
                    (i % 50).to_string(),
                    format!("member-{i}"),
                ];
                z.arg(&c[2]).arg(&c[3]);
                m.apply(&c);
            }
            let _: i64 = z.query(&mut con).unwrap();
        }
        start.push(m);
    }
    for round in 0..2u64 {
        let models = crash_round(&mut s, 200 + round, start, big_zop, 30);
        let mut con = s.client();
        start = Vec::new();
        for (t, m) in models.iter().enumerate() {
            let zk = format!("c{t}:bigz");
            let got = read_zset(&mut con, &zk);
            assert_acked(&zk, &got, &m.zsets[&zk], &m.with_pending().zsets[&zk]);
            let mut next = Model::default();
            next.zsets.insert(zk, got);
            start.push(next);
        }
    }
}
