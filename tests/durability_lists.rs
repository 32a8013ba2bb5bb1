//! Lists (with hashes and sets beside them) through restarts of the real server (the
//! sorted-set twin of this file is `durability_collections.rs`): a clean restart (with and
//! without the shutdown checkpoint) and SIGKILL under HSET/SADD/HDEL/SREM/RPUSH/LPUSH/LPOP
//! load with `--appendfsync always`.
mod common;
use common::diff::Rng;
use common::Server;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Hashes = BTreeMap<String, BTreeMap<String, String>>;
type Sets = BTreeMap<String, BTreeSet<String>>;
type Lists = BTreeMap<String, VecDeque<String>>;

/// What one load thread believes: the effect of every acknowledged command, and the one
/// command it sent last without an answer (it may or may not have been applied).
#[derive(Default, Clone)]
struct Model {
    hashes: Hashes,
    sets: Sets,
    lists: Lists,
    pending: Option<Vec<String>>,
}

impl Model {
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
            "LPOP" => {
                if let Some(l) = self.lists.get_mut(&c[1]) {
                    l.pop_front();
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
    match rng.below(7) {
        0 => vec!["HSET".into(), format!("c{t}:h{j}"), format!("f{f}"), v],
        1 => vec!["HDEL".into(), format!("c{t}:h{j}"), format!("f{f}")],
        2 => vec!["SADD".into(), format!("c{t}:s{j}"), format!("m{f}")],
        3 => vec!["SREM".into(), format!("c{t}:s{j}"), format!("m{f}")],
        4 => vec!["RPUSH".into(), format!("c{t}:l{j}"), v],
        5 => vec!["LPUSH".into(), format!("c{t}:l{j}"), v],
        _ => vec!["LPOP".into(), format!("c{t}:l{j}")],
    }
}

/// Runs `threads` connections of random collection writes until `stop`; each returns its
/// model (acknowledged effects and the possibly-applied last command).
fn load(port: u16, threads: u64, seed: u64, stop: Arc<AtomicBool>) -> Vec<Arc<Mutex<Model>>> {
    let mut models = Vec::new();
    for t in 0..threads {
        let model = Arc::new(Mutex::new(Model::default()));
        models.push(model.clone());
        let stop = stop.clone();
        std::thread::spawn(move || {
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
            let Ok(mut con) = client.get_connection() else {
                return;
            };
            let _ = con.set_read_timeout(Some(Duration::from_secs(10)));
            let mut rng = Rng::new(seed + t);
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let c = random_op(&mut rng, t, n);
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
                    }
                    Err(_) => return,
                }
            }
        });
    }
    models
}

fn read_hash(con: &mut redis::Connection, key: &str) -> BTreeMap<String, String> {
    redis::cmd("HGETALL").arg(key).query(con).unwrap()
}

fn read_set(con: &mut redis::Connection, key: &str) -> BTreeSet<String> {
    redis::cmd("SMEMBERS").arg(key).query(con).unwrap()
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

/// Every key of thread `t` holds the model's contents, or (for the one key the pending
/// command touched) the contents with that command applied.
fn verify(con: &mut redis::Connection, t: u64, m: &Model) {
    let mut with_pending = m.clone();
    if let Some(p) = &m.pending {
        with_pending.apply(p);
    }
    for j in 0..6 {
        let hk = format!("c{t}:h{j}");
        let got = read_hash(con, &hk);
        let a = m.hashes.get(&hk).cloned().unwrap_or_default();
        let b = with_pending.hashes.get(&hk).cloned().unwrap_or_default();
        assert!(
            got == a || got == b,
            "{hk}: got {got:?}, acknowledged {a:?}"
        );
        let sk = format!("c{t}:s{j}");
        let got = read_set(con, &sk);
        let a = m.sets.get(&sk).cloned().unwrap_or_default();
        let b = with_pending.sets.get(&sk).cloned().unwrap_or_default();
        assert!(
            got == a || got == b,
            "{sk}: got {got:?}, acknowledged {a:?}"
        );
        let lk = format!("c{t}:l{j}");
        let got = read_list(con, &lk);
        let a = m.lists.get(&lk).cloned().unwrap_or_default();
        let b = with_pending.lists.get(&lk).cloned().unwrap_or_default();
        assert!(
            got == a || got == b,
            "{lk}: got {got:?}, acknowledged {a:?}"
        );
    }
}

// With appendfsync always, every acknowledged HSET/HDEL/SADD/SREM/RPUSH/LPUSH/LPOP survives
// SIGKILL and no collection shows a state between two commands, over several kill/restart
// cycles.
#[test]
fn sigkill_collections_always_loses_nothing_acknowledged() {
    let mut s = Server::start("coll-crash", &["--appendfsync", "always"]);
    for round in 0..3u64 {
        let stop = Arc::new(AtomicBool::new(false));
        let models = load(s.port, 3, 1000 * round, stop.clone());
        std::thread::sleep(Duration::from_millis(700 + 200 * round));
        // ... and not before the load acknowledged something (slow on a loaded machine).
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while models.iter().all(|m| {
            let m = m.lock().unwrap();
            m.hashes.len() + m.sets.len() + m.lists.len() == 0
        }) {
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: the load acknowledged nothing"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        s.kill9();
        stop.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        s.restart_after_kill();
        let mut con = s.client();
        let mut acked_total = 0;
        for (t, m) in models.iter().enumerate() {
            let m = m.lock().unwrap().clone();
            acked_total += m.hashes.len() + m.sets.len() + m.lists.len();
            verify(&mut con, t as u64, &m);
        }
        assert!(
            acked_total > 0,
            "round {round}: the load acknowledged nothing"
        );
        // The next round's threads reuse the key names: start from a clean keyspace.
        let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    }
}

fn fill(con: &mut redis::Connection) -> (Hashes, Sets, Lists) {
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
    // over fragments. Built in batches, since stage 1 rewrites the whole value per command.
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
    let _: i64 = redis::cmd("EXPIRE")
        .arg("c0:h0")
        .arg(5000)
        .query(con)
        .unwrap();
    (m.hashes, m.sets, m.lists)
}

fn check_all(con: &mut redis::Connection, hashes: &Hashes, sets: &Sets, lists: &Lists) {
    for (k, l) in lists {
        assert_eq!(&read_list(con, k), l, "{k}");
        let t: String = redis::cmd("TYPE").arg(k).query(con).unwrap();
        assert_eq!(t, "list");
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
    assert_eq!(n, hashes.len() + sets.len() + lists.len());
}

// Hashes, sets and lists (small, and large enough to be stored as fragments), their types and
// TTLs, are the same after a clean restart (recovery scan) and after restarts from the
// shutdown checkpoint (defrag relocation of collection records: tests/storage_model.rs).
#[test]
fn clean_restart_keeps_collections() {
    let mut s = Server::start("coll-restart", &[]);
    let mut con = s.client();
    let (hashes, sets, lists) = fill(&mut con);
    check_all(&mut con, &hashes, &sets, &lists);
    drop(con);
    s.restart();
    check_all(&mut s.client(), &hashes, &sets, &lists);
    s.args.push("--shutdown-checkpoint".into());
    s.restart();
    s.restart();
    let mut con = s.client();
    check_all(&mut con, &hashes, &sets, &lists);
    drop(con);
    s.restart();
    check_all(&mut s.client(), &hashes, &sets, &lists);
}
