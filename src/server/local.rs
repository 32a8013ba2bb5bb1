//! Connection and server commands: they act on the connection or the
//! process (PING, HELLO, AUTH, SELECT, CLIENT, COMMAND, INFO, CONFIG, ...)
//! and run on the connection's worker.

use super::conn::Conn;
use super::worker::{Outcome, Worker};
use super::{now_ms, ConnToken, Msg};
use crate::commands::{eq_ic, parse_int, wrong_args, CommandSpec, ERR_SYNTAX, TABLE};
use crate::resp::{Proto, ReplyBuf};
use std::sync::atomic::Ordering;

pub const REDIS_VERSION: &str = "7.2.4";

fn err(conn: &mut Conn, msg: &str) -> Outcome {
    conn.reply(|r| r.error(msg));
    Outcome::Done
}

fn unknown_sub(conn: &mut Conn, cmd: &str, sub: &[u8]) -> Outcome {
    let msg = format!(
        "ERR unknown subcommand '{}'. Try {} HELP.",
        String::from_utf8_lossy(sub),
        cmd.to_ascii_uppercase()
    );
    err(conn, &msg)
}

pub fn run(
    w: &mut Worker,
    conn: &mut Conn,
    slot: u32,
    spec: &CommandSpec,
    a: &[&[u8]],
    now: u64,
) -> Outcome {
    match spec.name {
        "ping" => {
            if a.len() > 2 {
                return err(conn, &wrong_args("ping"));
            }
            // RESP2 subscribed mode answers as a message: `*2 pong <arg or "">`.
            let subscribed = conn.proto == Proto::Resp2 && conn.subs.active();
            conn.reply(|r| {
                if subscribed {
                    r.array(2);
                    r.bulk(b"pong");
                    r.bulk(a.get(1).copied().unwrap_or(b""));
                } else if a.len() == 2 {
                    r.bulk(a[1])
                } else {
                    r.simple("PONG")
                }
            });
            Outcome::Done
        }
        "subscribe" | "psubscribe" | "ssubscribe" | "unsubscribe" | "punsubscribe"
        | "sunsubscribe" | "publish" | "spublish" | "pubsub" => {
            let outcome = w.pubsub_command(conn, slot, spec.name, a);
            if spec.name.ends_with("subscribe") {
                // CLIENT LIST on other connections shows the new sub/psub/ssub counts.
                refresh_registry(w, conn, now);
            }
            outcome
        }
        "echo" => {
            conn.reply(|r| r.bulk(a[1]));
            Outcome::Done
        }
        "hello" => hello(w, conn, a, now),
        "auth" => auth(w, conn, a, now),
        "acl" => super::acl_cmd::acl(w, conn, a, now),
        "select" => {
            match crate::resp::parse::parse_i64(a[1]) {
                None => return err(conn, "ERR value is not an integer or out of range"),
                Some(n) if !(0..16).contains(&n) => {
                    return err(conn, "ERR DB index is out of range")
                }
                Some(n) => conn.db = n as u8,
            }
            conn.reply(|r| r.ok());
            Outcome::Done
        }
        "quit" => {
            conn.reply(|r| r.ok());
            conn.close_after_reply = true;
            Outcome::Done
        }
        "multi" | "exec" | "discard" | "watch" | "unwatch" => {
            w.txn_command(conn, slot, spec, a, now)
        }
        "reset" => {
            super::tracking::disable(conn);
            w.txn_reset(conn);
            conn.db = 0;
            conn.proto = Proto::Resp2;
            conn.name = None;
            let subs = std::mem::take(&mut conn.subs);
            w.forget_subscriptions(subs, slot, conn.gen);
            super::acl_cmd::reset_user(w, conn);
            refresh_registry(w, conn, now);
            if conn.monitor {
                conn.monitor = false;
                let mut m = w.shared.monitors.lock().expect("monitors lock");
                m.retain(|&(wk, t)| !(wk == w.id && t.slot == slot));
                w.shared.monitor_count.store(m.len(), Ordering::SeqCst);
            }
            conn.reply(|r| r.simple("RESET"));
            Outcome::Done
        }
        "client" => client(w, conn, slot, a, now),
        "command" => command(conn, a),
        "info" => info(w, conn, a),
        "config" => config(w, conn, a),
        "time" => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            conn.reply(|r| {
                r.array(2);
                r.bulk(t.as_secs().to_string().as_bytes());
                r.bulk(t.subsec_micros().to_string().as_bytes());
            });
            Outcome::Done
        }
        "shutdown" => {
            let mut save = false;
            for o in &a[1..] {
                if eq_ic(o, "abort") {
                    return err(conn, "ERR No shutdown in progress.");
                } else if eq_ic(o, "save") {
                    save = true;
                } else if !(eq_ic(o, "nosave") || eq_ic(o, "now") || eq_ic(o, "force")) {
                    return err(conn, ERR_SYNTAX);
                }
            }
            tracing::info!("SHUTDOWN requested by client {}", conn.addr);
            w.shared.request_shutdown(save);
            // Redis closes the connection without a reply on success.
            conn.close_after_reply = true;
            Outcome::Done
        }
        "save" | "bgsave" => {
            let all: Vec<usize> = (0..w.shared.workers.len()).collect();
            let res = w.with_workers(&all, |w| {
                let mut first_err = None;
                for s in w.shards.held() {
                    if let Err(e) = s.flush() {
                        first_err.get_or_insert(e.to_string());
                    }
                }
                first_err
            });
            match res {
                None => Outcome::Retry,
                Some(Some(e)) => err(conn, &format!("ERR flush failed: {e}")),
                Some(None) => {
                    w.shared
                        .stats
                        .last_save_unix
                        .store(now / 1000, Ordering::Relaxed);
                    if spec.name == "save" {
                        conn.reply(|r| r.ok());
                    } else {
                        conn.reply(|r| r.simple("Background saving started"));
                    }
                    Outcome::Done
                }
            }
        }
        "lastsave" => {
            let t = w.shared.stats.last_save_unix.load(Ordering::Relaxed);
            conn.reply(|r| r.int(t as i64));
            Outcome::Done
        }
        "slowlog" => slowlog(w, conn, a),
        "debug" => {
            if eq_ic(a[1], "sleep") && a.len() == 3 {
                let secs: f64 = std::str::from_utf8(a[2])
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0.0);
                std::thread::sleep(std::time::Duration::from_secs_f64(secs.clamp(0.0, 3600.0)));
                conn.reply(|r| r.ok());
                Outcome::Done
            } else {
                unknown_sub(conn, "debug", a[1])
            }
        }
        "monitor" => {
            conn.monitor = true;
            let mut m = w.shared.monitors.lock().expect("monitors lock");
            m.push((
                w.id,
                ConnToken {
                    slot,
                    gen: conn.gen,
                },
            ));
            w.shared.monitor_count.store(m.len(), Ordering::SeqCst);
            drop(m);
            conn.reply(|r| r.ok());
            Outcome::Done
        }
        "memory" => super::ops_cmd::memory(w, conn, a, now),
        "latency" => super::ops_cmd::latency(w, conn, a),
        "defrag" => defrag(w, conn, a),
        "tombraider" => tombraider(w, conn, a),
        other => err(conn, &format!("ERR command '{other}' is not implemented")),
    }
}

fn auth(w: &mut Worker, conn: &mut Conn, a: &[&[u8]], now: u64) -> Outcome {
    if a.len() > 3 {
        return err(conn, ERR_SYNTAX);
    }
    if a.len() == 2 && super::acl_cmd::default_nopass(w) {
        return err(
            conn,
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        );
    }
    let (user, pass) = if a.len() == 3 {
        (a[1], a[2])
    } else {
        (&b"default"[..], a[1])
    };
    match super::acl_cmd::authenticate(w, conn, user, pass, a[0], now) {
        Ok(()) => conn.reply(|r| r.ok()),
        Err(e) => conn.reply(|r| r.error(e)),
    }
    Outcome::Done
}

fn hello(w: &mut Worker, conn: &mut Conn, a: &[&[u8]], now: u64) -> Outcome {
    let mut proto = conn.proto;
    let mut i = 1;
    if a.len() >= 2 {
        match crate::resp::parse::parse_i64(a[1]) {
            None => {
                return err(
                    conn,
                    "ERR Protocol version is not an integer or out of range",
                )
            }
            Some(2) => proto = Proto::Resp2,
            Some(3) => proto = Proto::Resp3,
            Some(_) => return err(conn, "NOPROTO unsupported protocol version"),
        }
        i = 2;
    }
    let mut auth: Option<(&[u8], &[u8])> = None;
    let mut name: Option<&[u8]> = None;
    while i < a.len() {
        if eq_ic(a[i], "auth") && i + 2 < a.len() {
            auth = Some((a[i + 1], a[i + 2]));
            i += 3;
        } else if eq_ic(a[i], "setname") && i + 1 < a.len() {
            name = Some(a[i + 1]);
            i += 2;
        } else {
            return err(
                conn,
                &format!(
                    "ERR Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(a[i])
                ),
            );
        }
    }
    if let Some((u, p)) = auth {
        if let Err(e) = super::acl_cmd::authenticate(w, conn, u, p, a[0], now) {
            return err(conn, e);
        }
    }
    if !conn.authenticated {
        return err(conn, "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time");
    }
    if let Some(n) = name {
        if !valid_client_name(n) {
            return err(
                conn,
                "ERR Client names cannot contain spaces, newlines or special characters.",
            );
        }
        conn.name = if n.is_empty() { None } else { Some(n.to_vec()) };
    }
    conn.proto = proto;
    let id = conn.id;
    conn.reply(|r| {
        r.map(7);
        r.bulk_str("server");
        r.bulk_str("redis");
        r.bulk_str("version");
        r.bulk_str(REDIS_VERSION);
        r.bulk_str("proto");
        r.int(if proto == Proto::Resp3 { 3 } else { 2 });
        r.bulk_str("id");
        r.int(id as i64);
        r.bulk_str("mode");
        r.bulk_str("standalone");
        r.bulk_str("role");
        r.bulk_str("master");
        r.bulk_str("modules");
        r.array(0);
    });
    Outcome::Done
}

fn valid_client_name(n: &[u8]) -> bool {
    n.iter().all(|&c| (b'!'..=b'~').contains(&c))
}

fn client(w: &mut Worker, conn: &mut Conn, slot: u32, a: &[&[u8]], now: u64) -> Outcome {
    let sub = a[1];
    if let Some(outcome) = super::tracking::client_command(w, conn, a) {
        refresh_registry(w, conn, now);
        return outcome;
    }
    if eq_ic(sub, "id") && a.len() == 2 {
        let id = conn.id;
        conn.reply(|r| r.int(id as i64));
    } else if eq_ic(sub, "setname") && a.len() == 3 {
        if !valid_client_name(a[2]) {
            return err(
                conn,
                "ERR Client names cannot contain spaces, newlines or special characters.",
            );
        }
        conn.name = if a[2].is_empty() {
            None
        } else {
            Some(a[2].to_vec())
        };
        refresh_registry(w, conn, now);
        conn.reply(|r| r.ok());
    } else if eq_ic(sub, "getname") && a.len() == 2 {
        let name = conn.name.clone();
        conn.reply(|r| match name {
            Some(n) => r.bulk(&n),
            None => r.null(),
        });
    } else if eq_ic(sub, "info") && a.len() == 2 {
        let line = conn.client_info_line(now) + "\n";
        conn.reply(|r| r.verbatim(&line));
    } else if eq_ic(sub, "list") {
        refresh_registry(w, conn, now);
        let mut ids: Option<Vec<u64>> = None;
        let mut i = 2;
        while i < a.len() {
            if eq_ic(a[i], "id") {
                let mut v = Vec::new();
                for x in &a[i + 1..] {
                    match parse_int(x) {
                        Ok(n) if n > 0 => v.push(n as u64),
                        _ => return err(conn, "ERR Invalid client ID"),
                    }
                }
                ids = Some(v);
                break;
            } else if eq_ic(a[i], "type") && i + 1 < a.len() {
                i += 2;
            } else {
                return err(conn, ERR_SYNTAX);
            }
        }
        let clients = w.shared.clients.lock().expect("clients lock");
        let mut entries: Vec<(&u64, &super::ClientEntry)> = clients.iter().collect();
        entries.sort_by_key(|(id, _)| **id);
        let mut text = String::new();
        for (id, e) in entries {
            if ids.as_ref().is_some_and(|v| !v.contains(id)) {
                continue;
            }
            if super::blocking::is_blocked(e.worker, e.token) {
                text.push_str(&e.info.replacen(" flags=N ", " flags=b ", 1));
            } else {
                text.push_str(&e.info);
            }
            text.push('\n');
        }
        drop(clients);
        conn.reply(|r| r.verbatim(&text));
    } else if eq_ic(sub, "kill") {
        return client_kill(w, conn, slot, a);
    } else if eq_ic(sub, "unblock") && (a.len() == 3 || a.len() == 4) {
        return client_unblock(w, conn, a);
    } else if eq_ic(sub, "setinfo") && a.len() == 4 {
        if eq_ic(a[2], "lib-name") {
            conn.lib_name = Some(a[3].to_vec());
        } else if eq_ic(a[2], "lib-ver") {
            conn.lib_ver = Some(a[3].to_vec());
        } else {
            return err(
                conn,
                &format!(
                    "ERR Unrecognized option '{}'",
                    String::from_utf8_lossy(a[2])
                ),
            );
        }
        refresh_registry(w, conn, now);
        conn.reply(|r| r.ok());
    } else if (eq_ic(sub, "no-evict") || eq_ic(sub, "no-touch")) && a.len() == 3 {
        if !(eq_ic(a[2], "on") || eq_ic(a[2], "off")) {
            return err(conn, ERR_SYNTAX);
        }
        conn.reply(|r| r.ok());
    } else {
        return unknown_sub(conn, "client", sub);
    }
    Outcome::Done
}

pub(super) fn refresh_registry(w: &Worker, conn: &Conn, now: u64) {
    if let Some(e) = w
        .shared
        .clients
        .lock()
        .expect("clients lock")
        .get_mut(&conn.id)
    {
        e.info = conn.client_info_line(now);
    }
}

/// CLIENT UNBLOCK id [TIMEOUT|ERROR]: 1 when that client was blocked and is now answered.
fn client_unblock(w: &mut Worker, conn: &mut Conn, a: &[&[u8]]) -> Outcome {
    let Ok(id) = parse_int(a[2]) else {
        return err(conn, crate::commands::ERR_NOT_INT);
    };
    let error = match a.get(3) {
        None => false,
        Some(o) if eq_ic(o, "timeout") => false,
        Some(o) if eq_ic(o, "error") => true,
        Some(_) => return err(conn, "ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR"),
    };
    let target = w
        .shared
        .clients
        .lock()
        .expect("clients lock")
        .get(&(id as u64))
        .map(|e| (e.worker, e.token));
    let done = target
        .and_then(|(worker, token)| super::blocking::unblock(worker, token, error))
        .map(|(waiter, bytes)| super::blocking::deliver_later(waiter, bytes))
        .is_some();
    conn.reply(|r| r.int(i64::from(done)));
    Outcome::Done
}

fn client_kill(w: &mut Worker, conn: &mut Conn, _slot: u32, a: &[&[u8]]) -> Outcome {
    let old_form = a.len() == 3;
    let (mut id, mut addr, mut laddr, mut skipme) = (None, None, None, true);
    let mut user: Option<String> = None;
    if old_form {
        addr = Some(String::from_utf8_lossy(a[2]).into_owned());
    } else {
        let mut i = 2;
        while i + 1 < a.len() {
            let v = a[i + 1];
            if eq_ic(a[i], "id") {
                match parse_int(v) {
                    Ok(n) if n > 0 => id = Some(n as u64),
                    _ => return err(conn, "ERR client-id should be greater than 0"),
                }
            } else if eq_ic(a[i], "addr") {
                addr = Some(String::from_utf8_lossy(v).into_owned());
            } else if eq_ic(a[i], "laddr") {
                laddr = Some(String::from_utf8_lossy(v).into_owned());
            } else if eq_ic(a[i], "skipme") {
                skipme = eq_ic(v, "yes");
            } else if eq_ic(a[i], "user") {
                let name = String::from_utf8_lossy(v).into_owned();
                if w.shared.acl.read().expect("acl lock").user(&name).is_none() {
                    return err(conn, &format!("ERR No such user '{name}'"));
                }
                user = Some(name);
            } else if !(eq_ic(a[i], "type") || eq_ic(a[i], "maxage")) {
                return err(conn, ERR_SYNTAX);
            }
            i += 2;
        }
        if i != a.len() {
            return err(conn, ERR_SYNTAX);
        }
    }
    let victims: Vec<(u64, usize, ConnToken)> = {
        let clients = w.shared.clients.lock().expect("clients lock");
        clients
            .iter()
            .filter(|(cid, e)| {
                id.is_none_or(|x| x == **cid)
                    && addr.as_ref().is_none_or(|x| *x == e.addr)
                    && laddr.as_ref().is_none_or(|x| *x == e.laddr)
                    && user
                        .as_ref()
                        .is_none_or(|u| super::acl_cmd::registry_user(&e.info) == u)
                    && !(skipme && **cid == conn.id)
            })
            .map(|(cid, e)| (*cid, e.worker, e.token))
            .collect()
    };
    let mut killed_self = false;
    for (cid, wk, token) in &victims {
        if *cid == conn.id {
            killed_self = true;
        } else {
            w.shared.workers[*wk].send(Msg::Kill { token: *token });
        }
    }
    if old_form {
        if victims.is_empty() {
            return err(conn, "ERR No such client");
        }
        conn.reply(|r| r.ok());
    } else {
        let n = victims.len() as i64;
        conn.reply(|r| r.int(n));
    }
    if killed_self {
        conn.close_after_reply = true;
    }
    Outcome::Done
}

fn command_info(r: &mut ReplyBuf, c: &CommandSpec) {
    r.array(10);
    r.bulk_str(c.name);
    r.int(c.arity as i64);
    r.set(c.flags.len());
    for f in c.flags {
        r.simple(f);
    }
    r.int(c.first_key as i64);
    r.int(c.last_key as i64);
    r.int(c.step as i64);
    let cat = crate::acl::catalog();
    let cats = cat
        .lookup(c.name.as_bytes())
        .map(|id| crate::acl::catalog::category_names(cat.commands[id].categories))
        .unwrap_or_default();
    r.set(cats.len());
    for name in cats {
        r.simple(&format!("@{name}"));
    }
    r.array(0);
    if c.first_key > 0 {
        r.array(1);
        r.map(3);
        r.bulk_str("flags");
        r.set(0);
        r.bulk_str("begin_search");
        r.map(2);
        r.bulk_str("type");
        r.bulk_str("index");
        r.bulk_str("spec");
        r.map(1);
        r.bulk_str("index");
        r.int(c.first_key as i64);
        r.bulk_str("find_keys");
        r.map(2);
        r.bulk_str("type");
        r.bulk_str("range");
        r.bulk_str("spec");
        r.map(3);
        r.bulk_str("lastkey");
        r.int(if c.last_key < 0 {
            c.last_key as i64
        } else {
            (c.last_key - c.first_key) as i64
        });
        r.bulk_str("keystep");
        r.int(c.step as i64);
        r.bulk_str("limit");
        r.int(0);
    } else {
        r.array(0);
    }
    r.array(0);
}

fn command(conn: &mut Conn, a: &[&[u8]]) -> Outcome {
    if a.len() == 1 {
        conn.reply(|r| {
            r.array(TABLE.len());
            for c in TABLE {
                command_info(r, c);
            }
        });
        return Outcome::Done;
    }
    let sub = a[1];
    if eq_ic(sub, "count") {
        conn.reply(|r| r.int(TABLE.len() as i64));
    } else if eq_ic(sub, "list") {
        conn.reply(|r| {
            r.array(TABLE.len());
            for c in TABLE {
                r.bulk_str(c.name);
            }
        });
    } else if eq_ic(sub, "info") {
        let names: Vec<&[u8]> = if a.len() == 2 {
            TABLE.iter().map(|c| c.name.as_bytes()).collect()
        } else {
            a[2..].to_vec()
        };
        conn.reply(|r| {
            r.array(names.len());
            for n in names {
                match crate::commands::lookup(n) {
                    Some(c) => command_info(r, c),
                    None => r.null_array(),
                }
            }
        });
    } else if eq_ic(sub, "docs") {
        let specs: Vec<&CommandSpec> = if a.len() == 2 {
            TABLE.iter().collect()
        } else {
            a[2..]
                .iter()
                .filter_map(|n| crate::commands::lookup(n))
                .collect()
        };
        conn.reply(|r| {
            r.map(specs.len());
            for c in specs {
                r.bulk_str(c.name);
                r.map(3);
                r.bulk_str("summary");
                r.bulk_str(c.summary);
                r.bulk_str("since");
                r.bulk_str(c.since);
                r.bulk_str("group");
                r.bulk_str(c.group);
            }
        });
    } else {
        return unknown_sub(conn, "command", sub);
    }
    Outcome::Done
}

fn slowlog(w: &mut Worker, conn: &mut Conn, a: &[&[u8]]) -> Outcome {
    let sub = a[1];
    if eq_ic(sub, "len") && a.len() == 2 {
        let n = w.shared.slowlog.lock().expect("slowlog lock").1.len();
        conn.reply(|r| r.int(n as i64));
    } else if eq_ic(sub, "reset") && a.len() == 2 {
        w.shared.slowlog.lock().expect("slowlog lock").1.clear();
        w.shared.acl.write().expect("acl lock").log.denied = [0; 4];
        conn.reply(|r| r.ok());
    } else if eq_ic(sub, "get") && a.len() <= 3 {
        let count = if a.len() == 3 {
            match parse_int(a[2]) {
                Ok(n) if n >= -1 => n,
                _ => return err(conn, "ERR count should be greater than or equal to -1"),
            }
        } else {
            10
        };
        let log = w.shared.slowlog.lock().expect("slowlog lock");
        let n = if count < 0 {
            log.1.len()
        } else {
            (count as usize).min(log.1.len())
        };
        let entries: Vec<_> = log
            .1
            .iter()
            .take(n)
            .map(|e| {
                (
                    e.id,
                    e.unix,
                    e.micros,
                    e.args.clone(),
                    e.addr.clone(),
                    e.name.clone(),
                )
            })
            .collect();
        drop(log);
        conn.reply(|r| {
            r.array(entries.len());
            for (id, unix, micros, args, addr, name) in entries {
                r.array(6);
                r.int(id as i64);
                r.int(unix as i64);
                r.int(micros as i64);
                r.array(args.len());
                for x in &args {
                    r.bulk(x);
                }
                r.bulk_str(&addr);
                r.bulk_str(&name);
            }
        });
    } else {
        return unknown_sub(conn, "slowlog", sub);
    }
    Outcome::Done
}

/// The configuration parameters CONFIG GET reports, with current values.
fn config_params(w: &Worker) -> Vec<(String, String)> {
    use crate::storage::collection::{
        HASH_MAX_LISTPACK_ENTRIES, HASH_MAX_LISTPACK_VALUE_BYTES, SET_MAX_INTSET_ENTRIES,
        SET_MAX_LISTPACK_ENTRIES, SET_MAX_LISTPACK_VALUE_BYTES,
    };
    let s = &w.shared.settings;
    let rt = w.shared.runtime.read().expect("runtime lock").clone();
    let fsync = w.fsync.as_str();
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
    let mut params = vec![
        ("bind".into(), s.binds.join(" ")),
        ("port".into(), s.cli.port.to_string()),
        (
            "requirepass".into(),
            rt.requirepass.clone().unwrap_or_default(),
        ),
        ("maxclients".into(), rt.maxclients.to_string()),
        (
            "client-output-buffer-limit".into(),
            rt.output_limits.render(),
        ),
        (
            "cache-size".into(),
            w.shared
                .cache_size_bytes
                .load(Ordering::Relaxed)
                .to_string(),
        ),
        ("protected-mode".into(), yes_no(rt.protected_mode)),
        ("blind-writes".into(), yes_no(s.blind_writes)),
        ("appendonly".into(), "yes".into()),
        ("appendfsync".into(), fsync.into()),
        ("save".into(), String::new()),
        ("databases".into(), "16".into()),
        ("maxmemory".into(), "0".into()),
        (
            "proto-max-bulk-len".into(),
            s.proto_max_bulk_len_bytes.to_string(),
        ),
        (
            "client-query-buffer-limit".into(),
            s.client_query_buffer_limit_bytes.to_string(),
        ),
        (
            "slowlog-log-slower-than".into(),
            rt.slowlog_log_slower_than_us.to_string(),
        ),
        ("slowlog-max-len".into(), rt.slowlog_max_len.to_string()),
        (
            "tracking-table-max-keys".into(),
            super::tracking::MAX_KEYS
                .load(Ordering::Relaxed)
                .to_string(),
        ),
        (
            "busy-reply-threshold".into(),
            w.shared.scripts.busy_threshold_ms().to_string(),
        ),
        (
            "lua-time-limit".into(),
            w.shared.scripts.busy_threshold_ms().to_string(),
        ),
        (
            "notify-keyspace-events".into(),
            crate::commands::events::render(crate::commands::events::flags()),
        ),
        ("threads".into(), s.threads.to_string()),
        (
            "data-file".into(),
            s.data_files
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" "),
        ),
        ("flush-max-ms".into(), s.cli.flush_max_ms.to_string()),
        (
            "tomb-raider-interval-ms".into(),
            s.cli.tomb_raider_interval_ms.to_string(),
        ),
        ("busy-poll-us".into(), s.cli.busy_poll_us.to_string()),
        (
            "foreground-budget-us".into(),
            s.cli.foreground_budget_us.to_string(),
        ),
        (
            "background-budget-us".into(),
            s.cli.background_budget_us.to_string(),
        ),
        (
            "shutdown-checkpoint".into(),
            yes_no(w.shared.shutdown_checkpoint.load(Ordering::Relaxed)),
        ),
        ("storage".into(), s.cli.storage.clone()),
        ("network".into(), s.cli.network.clone()),
        (
            "latency-tracking".into(),
            yes_no(w.shared.cmdstats.latency_tracking.load(Ordering::Relaxed)),
        ),
        // The collection layer's fixed encoding thresholds (OBJECT ENCODING follows
        // them); not settable: the encoding of stored collections depends on them.
        (
            "hash-max-listpack-entries".into(),
            HASH_MAX_LISTPACK_ENTRIES.to_string(),
        ),
        (
            "hash-max-listpack-value".into(),
            HASH_MAX_LISTPACK_VALUE_BYTES.to_string(),
        ),
        (
            "hash-max-ziplist-entries".into(),
            HASH_MAX_LISTPACK_ENTRIES.to_string(),
        ),
        (
            "hash-max-ziplist-value".into(),
            HASH_MAX_LISTPACK_VALUE_BYTES.to_string(),
        ),
        (
            "set-max-intset-entries".into(),
            SET_MAX_INTSET_ENTRIES.to_string(),
        ),
        (
            "set-max-listpack-entries".into(),
            SET_MAX_LISTPACK_ENTRIES.to_string(),
        ),
        (
            "set-max-listpack-value".into(),
            SET_MAX_LISTPACK_VALUE_BYTES.to_string(),
        ),
        (
            "latency-tracking-info-percentiles".into(),
            w.shared.cmdstats.percentiles_text(),
        ),
        (
            "latency-monitor-threshold".into(),
            w.shared
                .cmdstats
                .latency
                .threshold_ms
                .load(Ordering::Relaxed)
                .to_string(),
        ),
    ];
    params.extend(w.shared.tls.settings().params());
    params
}

fn config(w: &mut Worker, conn: &mut Conn, a: &[&[u8]]) -> Outcome {
    let sub = a[1];
    if eq_ic(sub, "get") && a.len() >= 3 {
        let params = config_params(w);
        let mut hits: Vec<(String, String)> = Vec::new();
        for p in &a[2..] {
            let pat = p.to_ascii_lowercase();
            for (k, v) in &params {
                if crate::commands::glob_match(&pat, k.as_bytes())
                    && !hits.iter().any(|(hk, _)| hk == k)
                {
                    hits.push((k.clone(), v.clone()));
                }
            }
        }
        conn.reply(|r| {
            r.map(hits.len());
            for (k, v) in hits {
                r.bulk_str(&k);
                r.bulk_str(&v);
            }
        });
    } else if eq_ic(sub, "set") && a.len() >= 4 && a.len().is_multiple_of(2) {
        let mut rt = w.shared.runtime.read().expect("runtime lock").clone();
        // TLS parameters change together: one new context for all of them.
        let mut new_tls: Option<(String, crate::config::tls::TlsSettings)> = None;
        let mut new_fsync: Option<crate::storage::FsyncPolicy> = None;
        let mut new_cache: Option<u64> = None;
        let mut new_requirepass: Option<Option<String>> = None;
        let mut new_busy: Option<u64> = None;
        let mut new_notify: Option<u32> = None;
        let mut new_tracking_max: Option<u64> = None;
        let mut latency_tracking: Option<bool> = None;
        let mut percentiles: Option<String> = None;
        let mut latency_threshold: Option<u64> = None;
        for pair in a[2..].chunks(2) {
            let name = String::from_utf8_lossy(pair[0]).to_ascii_lowercase();
            let val = String::from_utf8_lossy(pair[1]).into_owned();
            let bad = || {
                format!("ERR CONFIG SET failed (possibly related to argument '{name}') - argument couldn't be parsed into an integer")
            };
            match name.as_str() {
                "requirepass" => {
                    rt.requirepass = if val.is_empty() { None } else { Some(val) };
                    new_requirepass = Some(rt.requirepass.clone());
                }
                "maxclients" => match val.parse::<usize>() {
                    Ok(n) if n >= 1 => rt.maxclients = n,
                    _ => return err(conn, &bad()),
                },
                "protected-mode" => match crate::config::parse_yes_no(&val) {
                    Some(b) => rt.protected_mode = b,
                    None => return err(conn, &format!("ERR CONFIG SET failed (possibly related to argument '{name}') - argument must be 'yes' or 'no'")),
                },
                "slowlog-log-slower-than" => match val.parse::<i64>() {
                    Ok(n) => rt.slowlog_log_slower_than_us = n,
                    Err(_) => return err(conn, &bad()),
                },
                "slowlog-max-len" => match val.parse::<usize>() {
                    Ok(n) => rt.slowlog_max_len = n,
                    Err(_) => return err(conn, &bad()),
                },
                "tracking-table-max-keys" => match val.parse::<i64>() {
                    Ok(n) if n >= 0 => new_tracking_max = Some(n as u64),
                    Ok(_) => return err(conn, &format!("ERR CONFIG SET failed (possibly related to argument '{name}') - argument must be between 0 and 9223372036854775807 inclusive")),
                    Err(_) => return err(conn, &bad()),
                },
                "busy-reply-threshold" | "lua-time-limit" => match val.parse::<u64>() {
                    Ok(n) => new_busy = Some(n),
                    Err(_) => return err(conn, &bad()),
                },
                "save" | "appendonly" => {}
                "notify-keyspace-events" => match crate::commands::events::parse(&val) {
                    Some(f) => new_notify = Some(f),
                    None => return err(conn, &format!("ERR CONFIG SET failed (possibly related to argument '{name}') - Invalid event class character. Use 'Ag$lshzxeKEtmdn'.")),
                },
                "latency-tracking" => match crate::config::parse_yes_no(&val) {
                    Some(b) => latency_tracking = Some(b),
                    None => return err(conn, &format!("ERR CONFIG SET failed (possibly related to argument '{name}') - argument must be 'yes' or 'no'")),
                },
                "latency-tracking-info-percentiles" => {
                    let mut problem = None;
                    for p in val.split_whitespace() {
                        match p.parse::<f64>() {
                            Err(_) => problem = problem.or(Some("Invalid latency-tracking-info-percentiles parameters")),
                            Ok(p) if !(0.0..=100.0).contains(&p) => problem = problem.or(Some("latency-tracking-info-percentiles parameters should sit between [0.0,100.0]")),
                            Ok(_) => {}
                        }
                    }
                    if let Some(problem) = problem {
                        return err(conn, &format!("ERR CONFIG SET failed (possibly related to argument '{name}') - {problem}"));
                    }
                    percentiles = Some(val);
                }
                "latency-monitor-threshold" => match val.parse::<u64>() {
                    Ok(n) if n <= i64::MAX as u64 => latency_threshold = Some(n),
                    _ => return err(conn, &bad()),
                },
                "client-output-buffer-limit" => {
                    if let Err(e) = rt.output_limits.apply(&val) {
                        return err(conn, &format!("ERR CONFIG SET failed (possibly related to argument '{name}') - {e}"));
                    }
                }
                "cache-size" => match crate::config::parse_memory(&val) {
                    Some(n) => new_cache = Some(n),
                    None => return err(conn, &format!("ERR CONFIG SET failed (possibly related to argument '{name}') - argument must be a memory value")),
                },
                "appendfsync" => match crate::config::parse_fsync(&val) {
                    Some(p) => new_fsync = Some(p),
                    None => return err(conn, &format!("ERR CONFIG SET failed (possibly related to argument '{name}') - argument(s) must be one of the following: always, everysec, no")),
                },
                "shutdown-checkpoint" => match crate::config::parse_yes_no(&val) {
                    Some(b) => w.shared.shutdown_checkpoint.store(b, Ordering::SeqCst),
                    None => return err(conn, &format!("ERR CONFIG SET failed (possibly related to argument '{name}') - argument must be 'yes' or 'no'")),
                },
                _ if crate::config::tls::SETTABLE.contains(&name.as_str()) => {
                    let (_, tls) = new_tls
                        .get_or_insert_with(|| (name.clone(), w.shared.tls.settings()));
                    if let Err(e) = tls.set(&name, &val) {
                        return err(conn, &format!("ERR CONFIG SET failed (possibly related to argument '{name}') - {e}"));
                    }
                }
                _ if config_params(w).iter().any(|(k, _)| *k == name) => {
                    return err(conn, &format!("ERR CONFIG SET failed (possibly related to argument '{name}') - can't set immutable config"));
                }
                _ => return err(conn, &format!("ERR Unknown option or number of arguments for CONFIG SET - '{name}'")),
            }
        }
        if let Some((first, tls)) = new_tls {
            // Before anything else applies: a context that fails to build changes nothing.
            if let Err(e) = w.shared.tls.apply(tls) {
                tracing::warn!(
                    "Failed applying new TLS configuration ({e}); the previous one stays"
                );
                return err(conn, &format!("ERR CONFIG SET failed (possibly related to argument '{first}') - Unable to update TLS configuration. Check server logs."));
            }
        }
        if let Some(p) = new_fsync {
            // Every shard switches while all are held, so no round runs half-switched.
            let all = all_workers(w);
            let switched = w.with_workers(&all, |w| {
                for s in w.shards.held() {
                    s.set_fsync_policy(p);
                }
                w.shared
                    .fsync_policy
                    .store(super::fsync_to_u8(p), Ordering::SeqCst);
                w.fsync = p;
            });
            if switched.is_none() {
                return Outcome::Retry;
            }
        }
        if let Some(n) = new_cache {
            // Every shard gets its share while all are held.
            let all = all_workers(w);
            let resized = w.with_workers(&all, |w| {
                w.shared.cache_size_bytes.store(n, Ordering::Relaxed);
                let share = w.cache_bytes_per_shard();
                for s in w.shards.held() {
                    s.set_cache_capacity(share);
                }
            });
            if resized.is_none() {
                return Outcome::Retry;
            }
        }
        *w.shared.runtime.write().expect("runtime lock") = rt;
        if let Some(ms) = new_busy {
            w.shared.scripts.set_busy_threshold_ms(ms);
        }
        if let Some(f) = new_notify {
            crate::commands::events::set_flags(f);
        }
        if let Some(n) = new_tracking_max {
            super::tracking::MAX_KEYS.store(n, Ordering::Relaxed);
        }
        let hub = &w.shared.cmdstats;
        if let Some(b) = latency_tracking {
            hub.latency_tracking.store(b, Ordering::Relaxed);
        }
        if let Some(p) = percentiles {
            // Validated above; cannot fail.
            let _ = hub.set_percentiles(&p);
        }
        if let Some(n) = latency_threshold {
            hub.latency.threshold_ms.store(n, Ordering::Relaxed);
        }
        if let Some(p) = new_requirepass {
            super::acl_cmd::set_requirepass(w, p.as_deref());
        }
        conn.reply(|r| r.ok());
    } else if eq_ic(sub, "resetstat") && a.len() == 2 {
        // What Redis's CONFIG RESETSTAT resets (server stats, command and error tables;
        // not the slow log nor the latency monitor), plus lavik's own event counters.
        let st = &w.shared.stats;
        for c in [
            &st.total_commands,
            &st.total_connections,
            &st.rejected_connections,
            &st.net_input_bytes,
            &st.net_output_bytes,
            &st.client_output_limit_closes,
            &st.foreground_budget_cuts,
            &st.hops,
            &st.wake_signals,
            &st.wake_signals_skipped,
            &st.parks,
            &st.parked_commands,
            &st.parked_reads,
            &st.device_queue_reads,
            &st.restart_reads,
            &st.restarts,
            &st.restart_fallbacks,
            &st.batch_read_waits,
            &st.cross_prefetches,
            &st.cross_prefetch_retries,
            &st.cross_prefetch_fallbacks,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        super::keystats::reset();
        w.shared.cmdstats.reset();
        w.shared.acl.write().expect("acl lock").log.denied = [0; 4];
        conn.reply(|r| r.ok());
    } else if eq_ic(sub, "rewrite") && a.len() == 2 {
        let Some(path) = w.shared.config_file.clone() else {
            return err(conn, "ERR The server is running without a config file");
        };
        if let Err(e) = config_rewrite(w, &path) {
            tracing::warn!("CONFIG REWRITE failed: {e}");
            return err(conn, &format!("ERR Rewriting config file: {e}"));
        }
        tracing::info!("CONFIG REWRITE executed with success.");
        conn.reply(|r| r.ok());
    } else if eq_ic(sub, "get")
        || eq_ic(sub, "set")
        || eq_ic(sub, "resetstat")
        || eq_ic(sub, "rewrite")
    {
        let msg = format!(
            "ERR wrong number of arguments for 'config|{}' command",
            String::from_utf8_lossy(sub).to_ascii_lowercase()
        );
        return err(conn, &msg);
    } else {
        return unknown_sub(conn, "config", sub);
    }
    Outcome::Done
}

/// The runtime-settable options CONFIG REWRITE writes, with their current values and
/// whether each differs from its default (`config::rewrite` has the rules).
fn rewrite_options(w: &Worker) -> Vec<crate::config::rewrite::OptionLines> {
    use crate::config::rewrite::{quoted, OptionLines};
    let params = config_params(w);
    let value = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let defaults: [(&'static str, &str); 10] = [
        ("maxclients", "10000"),
        ("protected-mode", "yes"),
        ("slowlog-log-slower-than", "10000"),
        ("slowlog-max-len", "128"),
        ("appendfsync", "everysec"),
        ("cache-size", "67108864"),
        ("shutdown-checkpoint", "no"),
        ("latency-tracking", "yes"),
        ("latency-tracking-info-percentiles", "50 99 99.9"),
        ("latency-monitor-threshold", "0"),
    ];
    let mut out: Vec<OptionLines> = defaults
        .iter()
        .map(|&(name, default)| {
            let v = value(name);
            OptionLines {
                name,
                lines: vec![format!("{name} {v}")],
                force: v != default,
            }
        })
        .collect();
    let pass = value("requirepass");
    out.push(OptionLines {
        name: "requirepass",
        lines: vec![format!("requirepass {}", quoted(&pass))],
        force: !pass.is_empty(),
    });
    out
}

/// CONFIG REWRITE: the new text to a temporary file beside the old one, synced, then
/// renamed over it (a crash leaves the old file or the new one, never a mix).
fn config_rewrite(w: &Worker, path: &std::path::Path) -> std::io::Result<()> {
    use std::io::Write;
    let old = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    let new = crate::config::rewrite::rewrite(&old, &rewrite_options(w));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "lavik.conf".into());
    let tmp = path.with_file_name(format!(".{name}.rewrite-{}", std::process::id()));
    let res = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        if let Ok(meta) = std::fs::metadata(path) {
            f.set_permissions(meta.permissions())?;
        }
        f.write_all(new.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

fn rusage() -> (f64, f64) {
    // SAFETY: rusage is plain data filled by the kernel.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a live rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    (t(ru.ru_stime), t(ru.ru_utime))
}

pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

/// Bytes the allocator has handed out and not got back (glibc mallinfo2).
pub fn heap_bytes() -> u64 {
    // SAFETY: mallinfo2 only reads allocator statistics.
    let mi = unsafe { libc::mallinfo2() };
    (mi.uordblks + mi.hblkhd) as u64
}

fn info(w: &mut Worker, conn: &mut Conn, a: &[&[u8]]) -> Outcome {
    let all: Vec<usize> = (0..w.shared.workers.len()).collect();
    let Some(((keys_per_db, expires_per_db), shard_stats, growth)) = w.with_workers(&all, |w| {
        let mut keys = [0u64; 16];
        let mut expires = [0u64; 16];
        let mut stats = Vec::new();
        let mut growth = None;
        for s in w.shards.held() {
            // Exact keyspace counts; a failed settle leaves the count short (logged).
            if let Err(e) = s.settle_blind_all() {
                tracing::warn!(shard = s.id(), error = %e, "INFO: blind writes not settled");
            }
            for (db, k) in keys.iter_mut().enumerate() {
                *k += s.key_count(db as u8);
                expires[db] += s.volatile_count_db(db as u8);
            }
            stats.push((s.id(), s.stats()));
            growth = growth.or_else(|| s.growth_status());
        }
        ((keys, expires), stats, growth)
    }) else {
        return Outcome::Retry;
    };
    let wanted: Vec<String> = a[1..]
        .iter()
        .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase())
        .collect();
    let all_sections = wanted.is_empty()
        || wanted
            .iter()
            .any(|s| s == "all" || s == "everything" || s == "default");
    let want = |name: &str| all_sections || wanted.iter().any(|s| s == name);
    // Not in the default set (as Redis): only by name, `all` or `everything`.
    let want_extra = |name: &str| {
        wanted
            .iter()
            .any(|s| s == name || s == "all" || s == "everything")
    };
    let sh = &w.shared;
    let st = &sh.stats;
    let uptime = sh.start.elapsed().as_secs();
    let mut out = String::new();
    if want("server") {
        out.push_str(&format!(
            "# Server\r\nredis_version:{REDIS_VERSION}\r\nlavik_version:{}\r\nlavik_variant:{}\r\nlavik_git_sha:{}\r\nredis_git_sha1:00000000\r\nredis_mode:standalone\r\nos:{}\r\narch_bits:64\r\nmultiplexing_api:io_uring\r\nprocess_id:{}\r\ntcp_port:{}\r\nserver_time_usec:{}\r\nuptime_in_seconds:{uptime}\r\nuptime_in_days:{}\r\nio_threads_active:0\r\nlavik_workers:{}\r\nexecutable:{}\r\nconfig_file:{}\r\n\r\n",
            env!("CARGO_PKG_VERSION"),
            crate::config::build::VARIANT,
            env!("LAVIK_GIT_SHA"),
            std::env::consts::OS,
            std::process::id(),
            sh.settings.cli.port,
            now_ms() * 1000,
            uptime / 86400,
            sh.workers.len(),
            std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default(),
            sh.config_file.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
        ));
    }
    if want("clients") {
        out.push_str(&format!(
            "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\nblocked_clients:{}\r\ntracking_clients:{}\r\n\r\n",
            st.connected_clients.load(Ordering::Relaxed),
            sh.runtime.read().expect("runtime lock").maxclients,
            super::blocking::blocked_clients(),
            crate::runtime::tracking::tracking_clients()
        ));
    }
    let index_bytes: u64 = shard_stats.iter().map(|(_, s)| s.index_bytes).sum();
    if want("memory") {
        let used = heap_bytes();
        out.push_str(&format!(
            "# Memory\r\nused_memory:{used}\r\nused_memory_human:{:.2}M\r\nused_memory_rss:{}\r\nused_memory_peak:{used}\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\nmem_clients_normal:{}\r\nlavik_index_bytes:{index_bytes}\r\nlavik_cache_bytes:{}\r\nlavik_cache_size:{}\r\n\r\n",
            used as f64 / (1 << 20) as f64,
            rss_bytes(),
            st.mem_clients_normal.load(Ordering::Relaxed),
            shard_stats.iter().map(|(_, s)| s.cache.bytes).sum::<u64>(),
            sh.cache_size_bytes.load(Ordering::Relaxed),
        ));
    }
    if want("persistence") {
        let fsync = w.fsync.as_str();
        let meaning = match w.fsync {
            crate::storage::FsyncPolicy::Always => {
                "a write is acknowledged only after it is durable on the device"
            }
            crate::storage::FsyncPolicy::EverySec => {
                "acknowledged writes may be lost if the machine fails within flush-max-ms"
            }
            crate::storage::FsyncPolicy::No => {
                "writes are handed to the device when staging fills; the device is never synced"
            }
        };
        let loading = sh.loading.load(Ordering::Acquire);
        let mut loading_fields = format!("loading:{}\r\nasync_loading:0\r\n", u8::from(loading));
        if let (true, Some(p)) = (loading, sh.progress.as_ref()) {
            // Recovery reads whole blocks: progress in blocks, shown in bytes.
            let block = p.block_size_bytes.load(Ordering::Relaxed);
            let total = p.blocks_total.load(Ordering::Relaxed) * block;
            let done = p.bytes_done.load(Ordering::Relaxed).min(total);
            let start = sh.loading_start_s.load(Ordering::Relaxed);
            let elapsed = (crate::server::now_ms() / 1000).saturating_sub(start);
            let perc = if total == 0 {
                0.0
            } else {
                done as f64 * 100.0 / total as f64
            };
            let eta = (elapsed * (total - done)).checked_div(done).unwrap_or(1);
            loading_fields.push_str(&format!(
                "loading_start_time:{start}\r\nloading_total_bytes:{total}\r\nloading_rdb_used_mem:0\r\nloading_loaded_bytes:{done}\r\nloading_loaded_perc:{perc:.2}\r\nloading_eta_seconds:{eta}\r\n"
            ));
        }
        let epochs = st.commit_epochs.load(Ordering::Relaxed);
        out.push_str(&format!(
            "# Persistence\r\n{loading_fields}rdb_last_save_time:{}\r\naof_enabled:1\r\nappendfsync:{fsync}\r\nlavik_flush_max_ms:{}\r\nlavik_durability:{meaning}\r\nlavik_flush_failures:{}\r\nlavik_group_commits:{}\r\nlavik_group_commit_avg_write_us:{}\r\nlavik_group_commit_avg_sync_us:{}\r\nlavik_recovered_keys:{}\r\nlavik_recovery_ms:{}\r\n{}\r\n",
            st.last_save_unix.load(Ordering::Relaxed),
            sh.settings.cli.flush_max_ms,
            st.flush_failures.load(Ordering::Relaxed),
            epochs,
            st.commit_write_us.load(Ordering::Relaxed) / epochs.max(1),
            st.commit_sync_us.load(Ordering::Relaxed) / epochs.max(1),
            sh.recovered_keys.load(Ordering::Relaxed),
            sh.recovery_ms.load(Ordering::Relaxed),
            sh.recovery_phases.lock().unwrap_or_else(|e| e.into_inner()),
        ));
    }
    if want("stats") {
        let pubsub_counts = sh.pubsub.read().expect("pubsub lock").counts();
        let tracking_counts = super::tracking::info_counts();
        out.push_str(&format!(
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\ninstantaneous_ops_per_sec:{}\r\ntotal_net_input_bytes:{}\r\ntotal_net_output_bytes:{}\r\nrejected_connections:{}\r\nexpired_keys:{}\r\nkeyspace_hits:{}\r\nkeyspace_misses:{}\r\npubsub_channels:{}\r\npubsub_patterns:{}\r\npubsubshard_channels:{}\r\ntracking_total_keys:{}\r\ntracking_total_items:{}\r\ntracking_total_prefixes:{}\r\ntotal_error_replies:{}\r\nunexpected_error_replies:0\r\n{}lavik_foreground_budget_cuts:{}\r\nlavik_hops:{}\r\nlavik_wake_signals:{}\r\nlavik_wake_signals_skipped:{}\r\nlavik_parks:{}\r\nclient_output_buffer_limit_disconnections:{}\r\nlavik_cache_hits:{}\r\nlavik_cache_misses:{}\r\nlavik_cache_evictions:{}\r\nlavik_parked_commands:{}\r\nlavik_parked_reads:{}\r\nlavik_restart_reads:{}\r\nlavik_restarts:{}\r\nlavik_restart_fallbacks:{}\r\nlavik_sync_reads:{}\r\nlavik_device_queue_reads:{}\r\nlavik_batch_read_waits:{}\r\nlavik_cross_prefetches:{}\r\nlavik_cross_prefetch_retries:{}\r\nlavik_cross_prefetch_fallbacks:{}\r\n{}\r\n",
            st.total_connections.load(Ordering::Relaxed),
            st.total_commands.load(Ordering::Relaxed),
            st.instantaneous_ops.load(Ordering::Relaxed),
            st.net_input_bytes.load(Ordering::Relaxed),
            st.net_output_bytes.load(Ordering::Relaxed),
            st.rejected_connections.load(Ordering::Relaxed),
            shard_stats.iter().map(|(_, s)| s.expired_keys).sum::<u64>(),
            super::keystats::hits(),
            super::keystats::misses(),
            pubsub_counts.0,
            pubsub_counts.1,
            pubsub_counts.2,
            tracking_counts.0,
            tracking_counts.1,
            tracking_counts.2,
            sh.cmdstats.error_totals().0,
            sh.acl.read().expect("acl lock").log.info_lines(),
            st.foreground_budget_cuts.load(Ordering::Relaxed),
            st.hops.load(Ordering::Relaxed),
            st.wake_signals.load(Ordering::Relaxed),
            st.wake_signals_skipped.load(Ordering::Relaxed),
            st.parks.load(Ordering::Relaxed),
            st.client_output_limit_closes.load(Ordering::Relaxed),
            shard_stats.iter().map(|(_, s)| s.cache.hits).sum::<u64>(),
            shard_stats.iter().map(|(_, s)| s.cache.misses).sum::<u64>(),
            shard_stats.iter().map(|(_, s)| s.cache.evictions).sum::<u64>(),
            st.parked_commands.load(Ordering::Relaxed),
            st.parked_reads.load(Ordering::Relaxed),
            st.restart_reads.load(Ordering::Relaxed),
            st.restarts.load(Ordering::Relaxed),
            st.restart_fallbacks.load(Ordering::Relaxed),
            shard_stats.iter().map(|(_, s)| s.cache.sync_reads).sum::<u64>(),
            st.device_queue_reads.load(Ordering::Relaxed),
            st.batch_read_waits.load(Ordering::Relaxed),
            st.cross_prefetches.load(Ordering::Relaxed),
            st.cross_prefetch_retries.load(Ordering::Relaxed),
            st.cross_prefetch_fallbacks.load(Ordering::Relaxed),
            st.copies.info_lines(),
        ));
    }
    if want("replication") {
        out.push_str("# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmaster_failover_state:no-failover\r\nmaster_repl_offset:0\r\n\r\n");
    }
    if want("cpu") {
        let (sys, user) = rusage();
        out.push_str(&format!(
            "# CPU\r\nused_cpu_sys:{sys:.6}\r\nused_cpu_user:{user:.6}\r\n\r\n"
        ));
    }
    if want_extra("commandstats") {
        out.push_str("# Commandstats\r\n");
        for t in sh.cmdstats.totals() {
            if t.calls == 0 && t.rejected == 0 && t.failed == 0 {
                continue;
            }
            out.push_str(&format!(
                "cmdstat_{}:calls={},usec={},usec_per_call={:.2},rejected_calls={},failed_calls={}\r\n",
                t.name,
                t.calls,
                t.usec,
                if t.calls == 0 { 0.0 } else { t.usec as f64 / t.calls as f64 },
                t.rejected,
                t.failed
            ));
        }
        out.push_str("\r\n");
    }
    if want("errorstats") {
        out.push_str("# Errorstats\r\n");
        for (prefix, n) in sh.cmdstats.error_totals().1 {
            out.push_str(&format!("errorstat_{prefix}:count={n}\r\n"));
        }
        out.push_str("\r\n");
    }
    if want_extra("latencystats") {
        out.push_str("# Latencystats\r\n");
        let percentiles = sh.cmdstats.percentiles();
        for t in sh.cmdstats.totals() {
            let Some(h) = &t.hist else { continue };
            let fields: Vec<String> = percentiles
                .iter()
                .map(|&p| {
                    let ns = super::cmdstats::percentile(h, p);
                    format!("p{p}={:.3}", ns as f64 / 1000.0)
                })
                .collect();
            out.push_str(&format!(
                "latency_percentiles_usec_{}:{}\r\n",
                t.name,
                fields.join(",")
            ));
        }
        out.push_str("\r\n");
    }
    if want("storage") {
        out.push_str(&format!(
            "# Storage\r\nlavik_shards:{}\r\nlavik_index_bytes:{index_bytes}\r\nlavik_device_write_bytes:{}\r\nlavik_defrag_write_bytes:{}\r\nlavik_coalesced_commands:{}\r\nlavik_coalesced_flushes:{}\r\n",
            sh.shard_count,
            // Bytes written to the devices by all shards (docs/collections.md section 5).
            shard_stats.iter().map(|(_, s)| s.device_write_bytes).sum::<u64>(),
            // Record bytes defrag appended (part of the above; docs/collections.md 3a).
            shard_stats.iter().map(|(_, s)| s.defrag_write_bytes).sum::<u64>(),
            // Pushes/pops served from the batch overlay, and its stores (collections 5a).
            shard_stats.iter().map(|(_, s)| s.coalesced_commands).sum::<u64>(),
            shard_stats.iter().map(|(_, s)| s.coalesced_flushes).sum::<u64>()
        ));
        // A growing data file: its size, limit, room left and steps (storage/grow.rs).
        match &growth {
            Some(g) => out.push_str(&format!(
                "lavik_data_file_growable:1\r\nlavik_data_file_bytes:{}\r\nlavik_data_file_max_bytes:{}\r\nlavik_data_file_room_bytes:{}\r\nlavik_data_file_grow_step_bytes:{}\r\nlavik_data_file_grows:{}\r\nlavik_data_file_growing:{}\r\nlavik_data_file_grow_error:{}\r\n",
                g.size_bytes,
                g.max_bytes,
                g.max_bytes.saturating_sub(g.size_bytes),
                g.step_bytes,
                g.grows,
                u8::from(g.growing),
                g.last_error.replace(['\r', '\n'], " "),
            )),
            None => out.push_str("lavik_data_file_growable:0\r\n"),
        }
        // Paged roots deleted/overwritten whose pages the background has yet to release.
        out.push_str(&format!(
            "lavik_paged_releases_pending:{}\r\nlavik_paged_release_dirs_pending:{}\r\n",
            shard_stats
                .iter()
                .map(|(_, s)| s.paged_releases_pending)
                .sum::<u64>(),
            shard_stats
                .iter()
                .map(|(_, s)| s.paged_release_dirs_pending)
                .sum::<u64>()
        ));
        // Blind overwrites (`docs/index.md`, "Blind overwrites").
        let sum = |f: fn(&crate::storage::ShardStats) -> u64| {
            shard_stats.iter().map(|(_, s)| f(s)).sum::<u64>()
        };
        out.push_str(&format!(
            "lavik_overwrite_reads:{}\r\nlavik_blind_writes:{}\r\nlavik_blind_settled_same:{}\r\nlavik_blind_settled_new:{}\r\nlavik_blind_pending:{}\r\nlavik_blind_sweep_reads:{}\r\nlavik_device_reads:{}\r\nlavik_device_read_bytes:{}\r\n",
            sum(|s| s.overwrite_reads),
            sum(|s| s.blind_writes),
            sum(|s| s.blind_settled_same),
            sum(|s| s.blind_settled_new),
            sum(|s| s.blind_pending),
            sum(|s| s.blind_sweep_reads),
            sum(|s| s.device_reads),
            sum(|s| s.device_read_bytes),
        ));
        for (id, s) in &shard_stats {
            out.push_str(&format!("shard{id}:{}\r\n", stats_line(s)));
        }
        out.push_str("\r\n");
    }
    if want("keyspace") {
        out.push_str("# Keyspace\r\n");
        for (db, &k) in keys_per_db.iter().enumerate() {
            if k > 0 {
                // Redis also prints `avg_ttl=`, an estimate from its expiry sampling;
                // lavik keeps no such estimate and leaves the field out.
                let e = expires_per_db[db];
                out.push_str(&format!("db{db}:keys={k},expires={e}\r\n"));
            }
        }
        out.push_str("\r\n");
    }
    while out.ends_with("\r\n\r\n") {
        out.truncate(out.len() - 2);
    }
    conn.reply(|r| r.verbatim(&out));
    Outcome::Done
}

/// `Debug` of an engine status struct as `field=value,...`.
fn debug_line(dbg: String) -> String {
    let inner = dbg
        .split_once('{')
        .map(|(_, r)| r.trim_end_matches('}').trim())
        .unwrap_or(&dbg);
    inner.replace(": ", "=").replace(", ", ",")
}

fn all_workers(w: &Worker) -> Vec<usize> {
    (0..w.shared.workers.len()).collect()
}

/// DEFRAG PAUSE|RESUME|STATUS over every shard.
fn defrag(w: &mut Worker, conn: &mut Conn, a: &[&[u8]]) -> Outcome {
    let sub = a[1];
    let pause = if eq_ic(sub, "pause") {
        Some(true)
    } else if eq_ic(sub, "resume") {
        Some(false)
    } else if eq_ic(sub, "status") {
        None
    } else {
        return unknown_sub(conn, "defrag", sub);
    };
    let all = all_workers(w);
    let Some(lines) = w.with_workers(&all, |w| {
        let mut lines = Vec::new();
        for s in w.shards.held() {
            if let Some(p) = pause {
                s.set_defrag_paused(p);
            }
            lines.push(format!(
                "shard{}:{}",
                s.id(),
                debug_line(format!("{:?}", s.defrag_status()))
            ));
        }
        lines
    }) else {
        return Outcome::Retry;
    };
    if pause.is_some() {
        conn.reply(|r| r.ok());
    } else {
        let text = lines.join("\r\n") + "\r\n";
        conn.reply(|r| r.verbatim(&text));
    }
    Outcome::Done
}

/// TOMBRAIDER ON|OFF|STATUS|NOW|INTERVAL ms over every shard.
fn tombraider(w: &mut Worker, conn: &mut Conn, a: &[&[u8]]) -> Outcome {
    enum Op {
        Enable(bool),
        Status,
        Now,
        Interval(u64),
    }
    let sub = a[1];
    let op = if eq_ic(sub, "on") && a.len() == 2 {
        Op::Enable(true)
    } else if eq_ic(sub, "off") && a.len() == 2 {
        Op::Enable(false)
    } else if eq_ic(sub, "status") && a.len() == 2 {
        Op::Status
    } else if eq_ic(sub, "now") && a.len() == 2 {
        Op::Now
    } else if eq_ic(sub, "interval") && a.len() == 3 {
        match parse_int(a[2]) {
            Ok(n) if n >= 0 => Op::Interval(n as u64),
            _ => return err(conn, "ERR value is not an integer or out of range"),
        }
    } else {
        return unknown_sub(conn, "tombraider", sub);
    };
    let all = all_workers(w);
    let Some(lines) = w.with_workers(&all, |w| {
        let mut lines = Vec::new();
        for s in w.shards.held() {
            match op {
                Op::Enable(e) => s.set_tomb_raider_enabled(e),
                Op::Now => s.tomb_raider_start_now(),
                Op::Interval(ms) => s.set_tomb_raider_interval_ms(ms),
                Op::Status => {}
            }
            lines.push(format!(
                "shard{}:{}",
                s.id(),
                debug_line(format!("{:?}", s.tomb_raider_status()))
            ));
        }
        lines
    }) else {
        return Outcome::Retry;
    };
    if matches!(op, Op::Status) {
        let text = lines.join("\r\n") + "\r\n";
        conn.reply(|r| r.verbatim(&text));
    } else {
        conn.reply(|r| r.ok());
    }
    Outcome::Done
}

/// `ShardStats` as `field=value,...`, whatever fields the engine reports.
fn stats_line(s: &crate::storage::ShardStats) -> String {
    debug_line(format!("{s:?}")).replacen("cache=cache_", "cache_", 1)
}
