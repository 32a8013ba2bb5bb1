//! Black-box command tests through a real client library (the `redis` crate).
mod common;
use common::Server;
use redis::{cmd, Connection, Value};

fn q<T: redis::FromRedisValue>(c: &mut Connection, args: &[&str]) -> T {
    let mut command = cmd(args[0]);
    for a in &args[1..] {
        command.arg(*a);
    }
    command.query(c).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn qerr(c: &mut Connection, args: &[&str]) -> String {
    let mut command = cmd(args[0]);
    for a in &args[1..] {
        command.arg(*a);
    }
    match command.query::<Value>(c) {
        Err(e) => e.to_string(),
        Ok(v) => panic!("{args:?} succeeded with {v:?}"),
    }
}

// String commands behave as in Redis 7, run on two workers.
#[test]
fn strings() {
    let s = Server::start("cmd-strings", &[]);
    let mut c = s.client();
    assert_eq!(q::<String>(&mut c, &["SET", "k", "v"]), "OK");
    assert_eq!(q::<Option<String>>(&mut c, &["SET", "k", "v2", "NX"]), None);
    assert_eq!(
        q::<Option<String>>(&mut c, &["SET", "k", "v2", "XX", "GET"]),
        Some("v".into())
    );
    assert_eq!(
        q::<Option<String>>(&mut c, &["SET", "nokey", "x", "XX"]),
        None
    );
    assert_eq!(
        q::<Option<String>>(&mut c, &["SET", "nk", "x", "NX", "GET"]),
        None
    );
    assert_eq!(q::<String>(&mut c, &["GET", "nk"]), "x");
    assert_eq!(q::<i64>(&mut c, &["SETNX", "k", "z"]), 0);
    assert_eq!(q::<i64>(&mut c, &["SETNX", "fresh", "z"]), 1);
    assert_eq!(q::<String>(&mut c, &["SETEX", "t", "100", "v"]), "OK");
    let ttl: i64 = q(&mut c, &["TTL", "t"]);
    assert!((90..=100).contains(&ttl), "TTL {ttl}");
    assert_eq!(q::<String>(&mut c, &["PSETEX", "pt", "100000", "v"]), "OK");
    assert!(q::<i64>(&mut c, &["PTTL", "pt"]) > 90_000);
    assert_eq!(q::<String>(&mut c, &["GETSET", "k", "new"]), "v2");
    assert_eq!(q::<String>(&mut c, &["GETDEL", "k"]), "new");
    assert_eq!(q::<Option<String>>(&mut c, &["GET", "k"]), None);
    q::<String>(&mut c, &["SET", "g", "val"]);
    assert_eq!(q::<String>(&mut c, &["GETEX", "g", "EX", "50"]), "val");
    let ttl = q::<i64>(&mut c, &["TTL", "g"]);
    assert!((45..=50).contains(&ttl), "TTL {ttl}");
    assert_eq!(q::<String>(&mut c, &["GETEX", "g", "PERSIST"]), "val");
    assert_eq!(q::<i64>(&mut c, &["TTL", "g"]), -1);
    assert_eq!(
        q::<String>(&mut c, &["MSET", "a", "1", "b", "2", "c", "3"]),
        "OK"
    );
    assert_eq!(
        q::<Vec<Option<String>>>(&mut c, &["MGET", "a", "b", "nosuch", "c"]),
        vec![Some("1".into()), Some("2".into()), None, Some("3".into())]
    );
    assert_eq!(q::<i64>(&mut c, &["MSETNX", "a", "9", "zz", "9"]), 0);
    assert_eq!(q::<Option<String>>(&mut c, &["GET", "zz"]), None);
    assert_eq!(q::<i64>(&mut c, &["MSETNX", "y1", "9", "y2", "9"]), 1);
    assert_eq!(q::<i64>(&mut c, &["APPEND", "ap", "Hello"]), 5);
    assert_eq!(q::<i64>(&mut c, &["APPEND", "ap", " World"]), 11);
    assert_eq!(q::<i64>(&mut c, &["STRLEN", "ap"]), 11);
    assert_eq!(q::<i64>(&mut c, &["STRLEN", "none"]), 0);
    assert_eq!(q::<String>(&mut c, &["GETRANGE", "ap", "0", "4"]), "Hello");
    assert_eq!(
        q::<String>(&mut c, &["GETRANGE", "ap", "-5", "-1"]),
        "World"
    );
    assert_eq!(q::<String>(&mut c, &["GETRANGE", "ap", "5", "2"]), "");
    assert_eq!(
        q::<String>(&mut c, &["SUBSTR", "ap", "0", "100"]),
        "Hello World"
    );
    assert_eq!(q::<i64>(&mut c, &["SETRANGE", "ap", "6", "Redis"]), 11);
    assert_eq!(q::<String>(&mut c, &["GET", "ap"]), "Hello Redis");
    assert_eq!(q::<i64>(&mut c, &["SETRANGE", "pad", "3", "x"]), 4);
    assert_eq!(q::<Vec<u8>>(&mut c, &["GET", "pad"]), b"\0\0\0x".to_vec());
    assert_eq!(q::<i64>(&mut c, &["INCR", "n"]), 1);
    assert_eq!(q::<i64>(&mut c, &["INCRBY", "n", "10"]), 11);
    assert_eq!(q::<i64>(&mut c, &["DECR", "n"]), 10);
    assert_eq!(q::<i64>(&mut c, &["DECRBY", "n", "20"]), -10);
    q::<String>(&mut c, &["SET", "f", "10.50"]);
    assert_eq!(q::<String>(&mut c, &["INCRBYFLOAT", "f", "0.1"]), "10.6");
    assert_eq!(q::<String>(&mut c, &["INCRBYFLOAT", "f", "-5.6"]), "5");
    q::<String>(&mut c, &["MSET", "{l}1", "ohmytext", "{l}2", "mynewtext"]);
    assert_eq!(q::<String>(&mut c, &["LCS", "{l}1", "{l}2"]), "mytext");
    assert_eq!(q::<i64>(&mut c, &["LCS", "{l}1", "{l}2", "LEN"]), 6);
    let idx: Value = q(
        &mut c,
        &[
            "LCS",
            "{l}1",
            "{l}2",
            "IDX",
            "MINMATCHLEN",
            "4",
            "WITHMATCHLEN",
        ],
    );
    let text = format!("{idx:?}");
    assert!(text.contains("int(4)") || text.contains("Int(4)"), "{text}");
    // Keys with a TTL keep it through INCR and APPEND, as in Redis.
    q::<String>(&mut c, &["SET", "tt", "1", "EX", "100"]);
    q::<i64>(&mut c, &["INCR", "tt"]);
    assert!(q::<i64>(&mut c, &["TTL", "tt"]) > 0);
    assert!(
        qerr(&mut c, &["SETEX", "x", "-1", "v"]).contains("invalid expire time in 'setex' command")
    );
}

// Keyspace commands, including ones whose keys land on different workers.
#[test]
fn keyspace() {
    let s = Server::start("cmd-keyspace", &[]);
    let mut c = s.client();
    for i in 0..50 {
        q::<String>(&mut c, &["SET", &format!("key{i}"), &format!("{i}")]);
    }
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 50);
    assert_eq!(
        q::<i64>(&mut c, &["EXISTS", "key1", "key2", "nope", "key1"]),
        3
    );
    assert_eq!(q::<i64>(&mut c, &["DEL", "key1", "key2", "nope"]), 2);
    assert_eq!(q::<i64>(&mut c, &["UNLINK", "key3"]), 1);
    assert_eq!(q::<i64>(&mut c, &["TOUCH", "key4", "key3"]), 1);
    assert_eq!(q::<String>(&mut c, &["TYPE", "key4"]), "string");
    assert_eq!(q::<String>(&mut c, &["TYPE", "key3"]), "none");
    let mut keys: Vec<String> = q(&mut c, &["KEYS", "key1*"]);
    keys.sort();
    assert_eq!(
        keys,
        (10..20).map(|i| format!("key{i}")).collect::<Vec<_>>()
    );
    // SCAN visits every key over a full iteration (repeats are allowed, as in Redis).
    let mut seen = std::collections::BTreeSet::new();
    let mut cursor = "0".to_string();
    loop {
        let (next, batch): (String, Vec<String>) = q(&mut c, &["SCAN", &cursor, "COUNT", "7"]);
        for k in batch {
            seen.insert(k);
        }
        if next == "0" {
            break;
        }
        cursor = next;
    }
    assert_eq!(seen.len(), 47);
    let (_, matched): (String, Vec<String>) =
        q(&mut c, &["SCAN", "0", "MATCH", "key4*", "COUNT", "1000"]);
    assert_eq!(matched.len(), 11);
    let (_, typed): (String, Vec<String>) =
        q(&mut c, &["SCAN", "0", "TYPE", "hash", "COUNT", "1000"]);
    assert!(typed.is_empty());
    let rk: String = q(&mut c, &["RANDOMKEY"]);
    assert!(rk.starts_with("key"));
    // RENAME across workers moves value and TTL.
    q::<i64>(&mut c, &["EXPIRE", "key5", "1000"]);
    assert_eq!(q::<String>(&mut c, &["RENAME", "key5", "renamed"]), "OK");
    assert_eq!(q::<String>(&mut c, &["GET", "renamed"]), "5");
    assert!(q::<i64>(&mut c, &["TTL", "renamed"]) > 990);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "key5"]), 0);
    assert_eq!(q::<i64>(&mut c, &["RENAMENX", "renamed", "key6"]), 0);
    assert_eq!(q::<i64>(&mut c, &["RENAMENX", "renamed", "key5"]), 1);
    assert_eq!(q::<i64>(&mut c, &["COPY", "key5", "copy1"]), 1);
    assert_eq!(q::<i64>(&mut c, &["COPY", "key5", "copy1"]), 0);
    assert_eq!(q::<i64>(&mut c, &["COPY", "key6", "copy1", "REPLACE"]), 1);
    assert_eq!(q::<String>(&mut c, &["GET", "copy1"]), "6");
    assert_eq!(q::<i64>(&mut c, &["COPY", "key6", "copy2", "DB", "3"]), 1);
    assert_eq!(q::<Option<String>>(&mut c, &["GET", "copy2"]), None);
    q::<String>(&mut c, &["SELECT", "3"]);
    assert_eq!(q::<String>(&mut c, &["GET", "copy2"]), "6");
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 1);
    assert_eq!(q::<String>(&mut c, &["FLUSHDB"]), "OK");
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 0);
    q::<String>(&mut c, &["SELECT", "0"]);
    assert!(q::<i64>(&mut c, &["DBSIZE"]) > 40);
    assert_eq!(q::<String>(&mut c, &["FLUSHALL", "SYNC"]), "OK");
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 0);
    assert_eq!(q::<Option<String>>(&mut c, &["RANDOMKEY"]), None);
}

// Expiry: TTL family, NX/XX/GT/LT conditions, lazy expiry on access, PERSIST.
#[test]
fn expiry() {
    let s = Server::start("cmd-expiry", &[]);
    let mut c = s.client();
    assert_eq!(q::<i64>(&mut c, &["TTL", "missing"]), -2);
    q::<String>(&mut c, &["SET", "k", "v"]);
    assert_eq!(q::<i64>(&mut c, &["TTL", "k"]), -1);
    assert_eq!(q::<i64>(&mut c, &["EXPIRETIME", "k"]), -1);
    assert_eq!(q::<i64>(&mut c, &["EXPIRE", "k", "100", "XX"]), 0);
    assert_eq!(q::<i64>(&mut c, &["EXPIRE", "k", "100", "GT"]), 0);
    assert_eq!(q::<i64>(&mut c, &["EXPIRE", "k", "100", "NX"]), 1);
    assert_eq!(q::<i64>(&mut c, &["EXPIRE", "k", "50", "GT"]), 0);
    assert_eq!(q::<i64>(&mut c, &["EXPIRE", "k", "50", "LT"]), 1);
    // 50, not 100 (49 once half a second passed on a loaded machine).
    let ttl = q::<i64>(&mut c, &["TTL", "k"]);
    assert!((45..=50).contains(&ttl), "TTL {ttl}");
    let now: i64 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert_eq!(
        q::<i64>(&mut c, &["EXPIREAT", "k", &(now + 500).to_string()]),
        1
    );
    assert_eq!(q::<i64>(&mut c, &["EXPIRETIME", "k"]), now + 500);
    assert_eq!(q::<i64>(&mut c, &["PEXPIRETIME", "k"]), (now + 500) * 1000);
    assert_eq!(q::<i64>(&mut c, &["PERSIST", "k"]), 1);
    assert_eq!(q::<i64>(&mut c, &["PERSIST", "k"]), 0);
    assert_eq!(q::<i64>(&mut c, &["PEXPIRE", "k", "150"]), 1);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(q::<Option<String>>(&mut c, &["GET", "k"]), None);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "k"]), 0);
    // An expire time in the past deletes the key at once.
    q::<String>(&mut c, &["SET", "p", "v"]);
    assert_eq!(q::<i64>(&mut c, &["EXPIRE", "p", "-1"]), 1);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "p"]), 0);
    q::<String>(&mut c, &["SET", "px", "v", "PX", "100"]);
    std::thread::sleep(std::time::Duration::from_millis(250));
    assert_eq!(q::<i64>(&mut c, &["TTL", "px"]), -2);
    q::<String>(&mut c, &["SET", "ka", "v", "KEEPTTL"]);
    assert_eq!(q::<i64>(&mut c, &["TTL", "ka"]), -1);
    q::<String>(&mut c, &["SET", "ka", "v", "EX", "100"]);
    q::<String>(&mut c, &["SET", "ka", "w", "KEEPTTL"]);
    // Kept: 100 (99 once half a second passed on a loaded machine), not -1.
    let ttl = q::<i64>(&mut c, &["TTL", "ka"]);
    assert!((95..=100).contains(&ttl), "TTL {ttl}");
    q::<String>(&mut c, &["SET", "ka", "w"]);
    assert_eq!(q::<i64>(&mut c, &["TTL", "ka"]), -1);
    assert!(qerr(&mut c, &["EXPIRE", "ka", "9223372036854775807"]).contains("invalid expire time"));
}

// Connection and server commands answer as redis-cli and client libraries expect.
#[test]
fn connection_and_server() {
    let s = Server::start("cmd-server", &[]);
    let mut c = s.client();
    assert_eq!(q::<String>(&mut c, &["PING"]), "PONG");
    assert_eq!(q::<String>(&mut c, &["PING", "hi"]), "hi");
    assert_eq!(q::<String>(&mut c, &["ECHO", "x y"]), "x y");
    let id: i64 = q(&mut c, &["CLIENT", "ID"]);
    assert!(id > 0);
    assert_eq!(q::<String>(&mut c, &["CLIENT", "SETNAME", "tester"]), "OK");
    assert_eq!(q::<String>(&mut c, &["CLIENT", "GETNAME"]), "tester");
    assert!(
        qerr(&mut c, &["CLIENT", "SETNAME", "a b"]).contains("Client names cannot contain spaces")
    );
    let list: String = q(&mut c, &["CLIENT", "LIST"]);
    assert!(list.contains("name=tester"), "{list}");
    let info: String = q(&mut c, &["CLIENT", "INFO"]);
    assert!(info.starts_with(&format!("id={id} ")), "{info}");
    assert_eq!(
        q::<String>(&mut c, &["CLIENT", "SETINFO", "lib-name", "x"]),
        "OK"
    );
    assert_eq!(q::<String>(&mut c, &["CLIENT", "NO-EVICT", "on"]), "OK");
    // Killing another client closes its connection.
    let mut other = s.client();
    let other_id: i64 = q(&mut other, &["CLIENT", "ID"]);
    assert_eq!(
        q::<i64>(&mut c, &["CLIENT", "KILL", "ID", &other_id.to_string()]),
        1
    );
    // The close reaches the other connection's worker asynchronously: wait for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while cmd("PING").query::<String>(&mut other).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the killed client still answers"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let count: i64 = q(&mut c, &["COMMAND", "COUNT"]);
    assert!(count > 60);
    let infos: Vec<Value> = q(&mut c, &["COMMAND", "INFO", "get", "nosuch"]);
    assert_eq!(infos.len(), 2);
    assert_eq!(infos[1], Value::Nil);
    let docs: Value = q(&mut c, &["COMMAND", "DOCS", "set"]);
    assert!(format!("{docs:?}").contains("summary"));
    let info: String = q(&mut c, &["INFO"]);
    for field in [
        "redis_version:",
        "connected_clients:",
        "used_memory:",
        "total_commands_processed:",
        "appendfsync:",
        "# Keyspace",
        "role:master",
    ] {
        assert!(info.contains(field), "INFO lacks {field}");
    }
    let section: String = q(&mut c, &["INFO", "clients"]);
    assert!(section.starts_with("# Clients") && !section.contains("# Server"));
    let cfg: Vec<String> = q(&mut c, &["CONFIG", "GET", "maxc*"]);
    assert_eq!(cfg, vec!["maxclients", "10000"]);
    let cfg: Vec<String> = q(&mut c, &["CONFIG", "GET", "appendfsync"]);
    assert_eq!(cfg, vec!["appendfsync", "everysec"]);
    assert_eq!(
        q::<String>(&mut c, &["CONFIG", "SET", "maxclients", "500"]),
        "OK"
    );
    let cfg: Vec<String> = q(&mut c, &["CONFIG", "GET", "maxclients"]);
    assert_eq!(cfg[1], "500");
    assert!(qerr(&mut c, &["CONFIG", "SET", "nonsense", "1"]).contains("Unknown option"));
    assert_eq!(q::<String>(&mut c, &["CONFIG", "RESETSTAT"]), "OK");
    let t: Vec<String> = q(&mut c, &["TIME"]);
    assert_eq!(t.len(), 2);
    assert_eq!(q::<String>(&mut c, &["SAVE"]), "OK");
    assert!(q::<i64>(&mut c, &["LASTSAVE"]) > 1_700_000_000);
    assert_eq!(
        q::<String>(&mut c, &["BGSAVE"]),
        "Background saving started"
    );
    assert_eq!(
        q::<String>(&mut c, &["CONFIG", "SET", "slowlog-log-slower-than", "0"]),
        "OK"
    );
    q::<String>(&mut c, &["DEBUG", "SLEEP", "0.01"]);
    assert!(q::<i64>(&mut c, &["SLOWLOG", "LEN"]) > 0);
    let entries: Vec<Value> = q(&mut c, &["SLOWLOG", "GET", "1"]);
    assert_eq!(entries.len(), 1);
    assert_eq!(q::<String>(&mut c, &["SLOWLOG", "RESET"]), "OK");
    assert_eq!(q::<String>(&mut c, &["RESET"]), "RESET");
    assert_eq!(q::<Option<String>>(&mut c, &["CLIENT", "GETNAME"]), None);
}

// MONITOR streams other clients' commands.
#[test]
fn monitor() {
    use std::io::{BufRead, BufReader, Write};
    let s = Server::start("cmd-monitor", &[]);
    let mut m = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    m.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    m.write_all(b"MONITOR\r\n").unwrap();
    let mut r = BufReader::new(m.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert_eq!(line, "+OK\r\n");
    let mut c = s.client();
    q::<String>(&mut c, &["SET", "watched", "1"]);
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        if line.contains("\"SET\" \"watched\" \"1\"") {
            break;
        }
    }
}

// SHUTDOWN stops the server cleanly and the data survives a restart.
#[test]
fn shutdown_and_restart_keeps_data() {
    let mut s = Server::start("cmd-shutdown", &[]);
    let mut c = s.client();
    for i in 0..200 {
        q::<String>(&mut c, &["SET", &format!("k{i}"), &format!("value-{i}")]);
    }
    s.restart();
    let mut c = s.client();
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 200);
    assert_eq!(q::<String>(&mut c, &["GET", "k123"]), "value-123");
    let _ = cmd("SHUTDOWN").query::<Value>(&mut c);
    let child = s.child.as_mut().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success());
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "SHUTDOWN did not stop the server"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

// Engine controls: CONFIG SET appendfsync switches durability live; DEFRAG and
// TOMBRAIDER report and change every shard.
#[test]
fn engine_controls() {
    let s = Server::start("cmd-engine", &[]);
    let mut c = s.client();
    assert_eq!(
        q::<String>(&mut c, &["CONFIG", "SET", "appendfsync", "always"]),
        "OK"
    );
    assert_eq!(
        q::<Vec<String>>(&mut c, &["CONFIG", "GET", "appendfsync"]),
        vec!["appendfsync", "always"]
    );
    let info: String = q(&mut c, &["INFO", "persistence"]);
    assert!(info.contains("appendfsync:always"), "{info}");
    assert!(qerr(&mut c, &["CONFIG", "SET", "appendfsync", "sometimes"]).contains("must be one of"));
    q::<String>(&mut c, &["SET", "k", "v"]);
    assert_eq!(q::<String>(&mut c, &["DEFRAG", "PAUSE"]), "OK");
    let st: String = q(&mut c, &["DEFRAG", "STATUS"]);
    assert!(st.contains("paused=true") && st.contains("shard0:"), "{st}");
    assert_eq!(q::<String>(&mut c, &["DEFRAG", "RESUME"]), "OK");
    let st: String = q(&mut c, &["DEFRAG", "STATUS"]);
    assert!(st.contains("paused=false"), "{st}");
    assert_eq!(
        q::<String>(&mut c, &["TOMBRAIDER", "INTERVAL", "5000"]),
        "OK"
    );
    let st: String = q(&mut c, &["TOMBRAIDER", "STATUS"]);
    assert!(st.contains("interval_ms=5000"), "{st}");
    assert_eq!(q::<String>(&mut c, &["TOMBRAIDER", "OFF"]), "OK");
    let st: String = q(&mut c, &["TOMBRAIDER", "STATUS"]);
    assert!(st.contains("enabled=false"), "{st}");
    assert!(qerr(&mut c, &["DEFRAG", "BOGUS"]).contains("unknown subcommand"));
}
