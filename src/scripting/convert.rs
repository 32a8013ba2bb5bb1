//! Conversions between RESP and Lua values, as Redis 7 does them.
//!
//! Command reply → Lua (`redis.call`'s result): integer → number, bulk → string, null bulk
//! and null array → `false`, array → table, status → `{ok=...}`, error → `{err=...}`; and
//! under `redis.setresp(3)`: null → `nil`, boolean → boolean, double → `{double=n}`, map →
//! `{map={...}}`, set → `{set={k=true}}`, big number → `{big_number=s}`, verbatim →
//! `{verbatim_string={format=, string=}}`.
//!
//! Lua → reply (the script's return value): string → bulk, number → integer (truncated),
//! boolean → `:1`/null (RESP2 script) or a RESP3 boolean, a table → `{err=}` error, `{ok=}`
//! status, `{double=}`, `{big_number=}`, `{verbatim_string=}`, `{map=}`, `{set=}` or an array
//! that stops at the first `nil`; anything else → null.

use crate::resp::{Proto, ReplyBuf};
use mlua::{Lua, Table, Value};
use std::io::Write;

/// Nesting deeper than this in a script's reply becomes an error element (a table that
/// contains itself would otherwise recurse forever).
pub const REPLY_DEPTH_MAX: usize = 1000;

/// Redis's `luaPushErrorBuff`: an error line (with or without its leading `-`) as the text
/// of an `{err=...}` table: `-CODE msg` keeps its code, a bare message gets `ERR`, and
/// trailing CR/LF are trimmed.
pub fn error_table_text(line: &[u8]) -> Vec<u8> {
    let (code, msg): (&[u8], &[u8]) = match line.strip_prefix(b"-") {
        Some(rest) => match rest.iter().position(|&b| b == b' ') {
            Some(sp) => (&rest[..sp], &rest[sp + 1..]),
            None => (b"ERR", rest),
        },
        None => (b"ERR", line),
    };
    let mut start = 0;
    let mut end = msg.len();
    while start < end && matches!(msg[start], b'\r' | b'\n') {
        start += 1;
    }
    while end > start && matches!(msg[end - 1], b'\r' | b'\n') {
        end -= 1;
    }
    let mut out = code.to_vec();
    out.push(b' ');
    out.extend_from_slice(&msg[start..end]);
    out
}

fn line(b: &[u8], pos: &mut usize) -> mlua::Result<Vec<u8>> {
    let from = *pos;
    let end = b[from..]
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|p| from + p)
        .ok_or_else(|| mlua::Error::runtime("truncated reply"))?;
    *pos = end + 2;
    Ok(b[from..end].to_vec())
}

fn int_of(bytes: &[u8]) -> mlua::Result<i64> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| mlua::Error::runtime("bad length in reply"))
}

fn single_field(lua: &Lua, name: &str, v: impl mlua::IntoLua) -> mlua::Result<Value> {
    let t = lua.create_table()?;
    t.raw_set(name, v)?;
    Ok(Value::Table(t))
}

/// Parses one RESP reply at `*pos` of `b` (written by a command handler) into a Lua value.
pub fn reply_to_lua(lua: &Lua, b: &[u8], pos: &mut usize) -> mlua::Result<Value> {
    let t = *b
        .get(*pos)
        .ok_or_else(|| mlua::Error::runtime("empty reply"))?;
    *pos += 1;
    let head = line(b, pos)?;
    Ok(match t {
        b':' => Value::Number(int_of(&head)? as f64),
        b'+' => single_field(lua, "ok", lua.create_string(&head)?)?,
        b'-' => {
            let mut full = b"-".to_vec();
            full.extend_from_slice(&head);
            single_field(lua, "err", lua.create_string(error_table_text(&full))?)?
        }
        b'$' | b'=' => {
            let n = int_of(&head)?;
            if n < 0 {
                return Ok(Value::Boolean(false));
            }
            let n = n as usize;
            let body = b
                .get(*pos..*pos + n)
                .ok_or_else(|| mlua::Error::runtime("truncated bulk"))?;
            *pos += n + 2;
            if t == b'$' {
                Value::String(lua.create_string(body)?)
            } else {
                let (format, text) = if body.len() >= 4 && body[3] == b':' {
                    (&body[..3], &body[4..])
                } else {
                    (&b"txt"[..], body)
                };
                let inner = lua.create_table()?;
                inner.raw_set("format", lua.create_string(format)?)?;
                inner.raw_set("string", lua.create_string(text)?)?;
                single_field(lua, "verbatim_string", inner)?
            }
        }
        b'*' | b'~' | b'%' => {
            let n = int_of(&head)?;
            if n < 0 {
                return Ok(Value::Boolean(false));
            }
            let items = lua.create_table()?;
            for j in 0..n as usize {
                match t {
                    b'*' => {
                        let v = reply_to_lua(lua, b, pos)?;
                        items.raw_set(j + 1, v)?;
                    }
                    b'~' => {
                        let v = reply_to_lua(lua, b, pos)?;
                        if !v.is_nil() {
                            items.raw_set(v, true)?;
                        }
                    }
                    _ => {
                        let k = reply_to_lua(lua, b, pos)?;
                        let v = reply_to_lua(lua, b, pos)?;
                        if !k.is_nil() {
                            items.raw_set(k, v)?;
                        }
                    }
                }
            }
            match t {
                b'*' => Value::Table(items),
                b'~' => single_field(lua, "set", items)?,
                _ => single_field(lua, "map", items)?,
            }
        }
        b'_' => Value::Nil,
        b'#' => Value::Boolean(head == b"t"),
        b',' => {
            let s = String::from_utf8_lossy(&head).to_ascii_lowercase();
            let d = match s.as_str() {
                "inf" => f64::INFINITY,
                "-inf" => f64::NEG_INFINITY,
                "nan" | "-nan" => f64::NAN,
                other => other.parse().unwrap_or(0.0),
            };
            single_field(lua, "double", d)?
        }
        b'(' => single_field(lua, "big_number", lua.create_string(&head)?)?,
        other => {
            return Err(mlua::Error::runtime(format!(
                "unexpected reply type {:?}",
                other as char
            )))
        }
    })
}

/// Writes the script's return value `v` as the reply to the client. `script_resp3` is the
/// protocol the script chose with `redis.setresp` (it decides how booleans convert).
pub fn lua_to_reply(v: &Value, r: &mut ReplyBuf, script_resp3: bool) {
    write_value(v, r, script_resp3, 0);
}

fn write_value(v: &Value, r: &mut ReplyBuf, script_resp3: bool, depth: usize) {
    if depth > REPLY_DEPTH_MAX {
        r.error("reached lua stack limit");
        return;
    }
    match v {
        Value::String(s) => r.bulk(&s.as_bytes()),
        Value::Boolean(b) => {
            if script_resp3 {
                r.bool(*b);
            } else if *b {
                r.int(1);
            } else {
                r.null();
            }
        }
        Value::Integer(i) => r.int(*i),
        Value::Number(n) => r.int(truncate(*n)),
        Value::Table(t) => write_table(t, r, script_resp3, depth),
        _ => r.null(),
    }
}

/// C's `(long long)` cast of a double, saturating where C would be undefined.
fn truncate(n: f64) -> i64 {
    n as i64
}

fn field(t: &Table, name: &str) -> Value {
    t.raw_get(name).unwrap_or(Value::Nil)
}

fn write_table(t: &Table, r: &mut ReplyBuf, script_resp3: bool, depth: usize) {
    if let Value::String(e) = field(t, "err") {
        let mut msg = b"-".to_vec();
        msg.extend_from_slice(&e.as_bytes());
        push_error(r, &msg);
        return;
    }
    if let Value::String(ok) = field(t, "ok") {
        r.simple(&spaces_for_newlines(&ok.as_bytes()));
        return;
    }
    if let Some(d) = number_of(&field(t, "double")) {
        r.double(d);
        return;
    }
    if let Value::String(big) = field(t, "big_number") {
        let text = spaces_for_newlines(&big.as_bytes());
        match r.proto {
            Proto::Resp2 => r.bulk(text.as_bytes()),
            Proto::Resp3 => {
                let _ = write!(r.out, "({text}\r\n");
            }
        }
        return;
    }
    if let Value::Table(vt) = field(t, "verbatim_string") {
        if let (Value::String(format), Value::String(text)) =
            (field(&vt, "format"), field(&vt, "string"))
        {
            let (format, text) = (format.as_bytes(), text.as_bytes());
            match r.proto {
                Proto::Resp2 => r.bulk(&text),
                Proto::Resp3 => {
                    let _ = write!(r.out, "={}\r\n", text.len() + 4);
                    let mut f = format.to_vec();
                    f.resize(3, b' ');
                    r.out.extend_from_slice(&f);
                    r.out.push(b':');
                    r.out.extend_from_slice(&text);
                    r.out.extend_from_slice(b"\r\n");
                }
            }
            return;
        }
    }
    if let Value::Table(m) = field(t, "map") {
        let pairs: Vec<(Value, Value)> = m.pairs::<Value, Value>().filter_map(Result::ok).collect();
        r.map(pairs.len());
        for (k, v) in &pairs {
            write_value(k, r, script_resp3, depth + 1);
            write_value(v, r, script_resp3, depth + 1);
        }
        return;
    }
    if let Value::Table(s) = field(t, "set") {
        let keys: Vec<Value> = s
            .pairs::<Value, Value>()
            .filter_map(Result::ok)
            .map(|(k, _)| k)
            .collect();
        r.set(keys.len());
        for k in &keys {
            write_value(k, r, script_resp3, depth + 1);
        }
        return;
    }
    let mut items = Vec::new();
    for j in 1.. {
        let v: Value = t.raw_get(j).unwrap_or(Value::Nil);
        if v.is_nil() {
            break;
        }
        items.push(v);
    }
    r.array(items.len());
    for v in &items {
        write_value(v, r, script_resp3, depth + 1);
    }
}

fn number_of(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => Some(*n),
        Value::Integer(i) => Some(*i as f64),
        _ => None,
    }
}

fn spaces_for_newlines(b: &[u8]) -> String {
    b.iter()
        .map(|&c| {
            if c == b'\r' || c == b'\n' {
                ' '
            } else {
                c as char
            }
        })
        .collect::<String>()
}

/// An error reply from raw bytes (`-` included): Redis writes the bytes as they are, with
/// CR/LF mapped to spaces.
pub fn push_error(r: &mut ReplyBuf, line_with_dash: &[u8]) {
    for &b in line_with_dash {
        r.out.push(if b == b'\r' || b == b'\n' { b' ' } else { b });
    }
    r.out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to_lua_and_back(reply: &[u8], client: Proto, script_resp3: bool) -> Vec<u8> {
        let lua = Lua::new();
        let mut pos = 0;
        let v = reply_to_lua(&lua, reply, &mut pos).unwrap();
        assert_eq!(pos, reply.len(), "the whole reply was parsed");
        let mut out = Vec::new();
        lua_to_reply(&v, &mut ReplyBuf::new(&mut out, client), script_resp3);
        out
    }

    fn eval_reply(src: &str, client: Proto, script_resp3: bool) -> Vec<u8> {
        let lua = Lua::new();
        let v: Value = lua.load(src).eval().unwrap();
        let mut out = Vec::new();
        lua_to_reply(&v, &mut ReplyBuf::new(&mut out, client), script_resp3);
        out
    }

    // RESP2 command replies survive the trip through Lua as Redis converts them.
    #[test]
    fn resp2_round_trip() {
        let p = Proto::Resp2;
        assert_eq!(to_lua_and_back(b":-42\r\n", p, false), b":-42\r\n");
        assert_eq!(
            to_lua_and_back(b"$3\r\nabc\r\n", p, false),
            b"$3\r\nabc\r\n"
        );
        assert_eq!(to_lua_and_back(b"$-1\r\n", p, false), b"$-1\r\n");
        assert_eq!(to_lua_and_back(b"*-1\r\n", p, false), b"$-1\r\n");
        assert_eq!(to_lua_and_back(b"+OK\r\n", p, false), b"+OK\r\n");
        assert_eq!(
            to_lua_and_back(b"-WRONGTYPE Operation\r\n", p, false),
            b"-WRONGTYPE Operation\r\n"
        );
        // A null element becomes false, a value: the array keeps its length.
        assert_eq!(
            to_lua_and_back(b"*3\r\n:1\r\n$-1\r\n$1\r\nx\r\n", p, false),
            b"*3\r\n:1\r\n$-1\r\n$1\r\nx\r\n"
        );
    }

    // RESP3 replies become Redis's typed tables and come back as RESP3 types.
    #[test]
    fn resp3_types() {
        let p = Proto::Resp3;
        assert_eq!(to_lua_and_back(b"_\r\n", p, true), b"_\r\n");
        assert_eq!(to_lua_and_back(b"#t\r\n", p, true), b"#t\r\n");
        assert_eq!(to_lua_and_back(b"#f\r\n", p, false), b"_\r\n");
        assert_eq!(to_lua_and_back(b",3.5\r\n", p, true), b",3.5\r\n");
        assert_eq!(
            to_lua_and_back(b",3.5\r\n", Proto::Resp2, true),
            b"$3\r\n3.5\r\n"
        );
        assert_eq!(to_lua_and_back(b"(123\r\n", p, true), b"(123\r\n");
        assert_eq!(
            to_lua_and_back(b"%1\r\n$1\r\na\r\n:1\r\n", p, true),
            b"%1\r\n$1\r\na\r\n:1\r\n"
        );
        assert_eq!(
            to_lua_and_back(b"%1\r\n$1\r\na\r\n:1\r\n", Proto::Resp2, true),
            b"*2\r\n$1\r\na\r\n:1\r\n"
        );
        assert_eq!(
            to_lua_and_back(b"~1\r\n$1\r\na\r\n", p, true),
            b"~1\r\n$1\r\na\r\n"
        );
        assert_eq!(
            to_lua_and_back(b"=8\r\ntxt:abcd\r\n", p, true),
            b"=8\r\ntxt:abcd\r\n"
        );
    }

    // Script return values convert as Redis's luaReplyToRedisReply does.
    #[test]
    fn script_values() {
        let p = Proto::Resp2;
        assert_eq!(eval_reply("return 3.99", p, false), b":3\r\n");
        assert_eq!(eval_reply("return -3.99", p, false), b":-3\r\n");
        assert_eq!(
            eval_reply("return {1,2,nil,4}", p, false),
            b"*2\r\n:1\r\n:2\r\n"
        );
        assert_eq!(eval_reply("return true", p, false), b":1\r\n");
        assert_eq!(eval_reply("return false", p, false), b"$-1\r\n");
        assert_eq!(eval_reply("return false", Proto::Resp3, false), b"_\r\n");
        assert_eq!(eval_reply("return false", p, true), b":0\r\n");
        assert_eq!(eval_reply("return nil", p, false), b"$-1\r\n");
        assert_eq!(
            eval_reply("return {err='bad\\nthing'}", p, false),
            b"-bad thing\r\n"
        );
        assert_eq!(eval_reply("return {ok='fine'}", p, false), b"+fine\r\n");
        assert_eq!(
            eval_reply("return {double=1.5}", Proto::Resp3, true),
            b",1.5\r\n"
        );
        assert_eq!(eval_reply("return function() end", p, false), b"$-1\r\n");
        let nested = eval_reply("return {1, {2, {err='x'}}}", p, false);
        assert_eq!(nested, b"*2\r\n:1\r\n*2\r\n:2\r\n-x\r\n");
    }

    // A self-referencing table ends in an error element instead of recursing forever.
    #[test]
    fn cyclic_table() {
        crate::scripting::with_big_stack(|| {
            let out = eval_reply("local t = {} t[1] = t return t", Proto::Resp2, false);
            assert!(out.ends_with(b"-reached lua stack limit\r\n"));
        });
    }

    // Error lines become {err=} texts with Redis's code rules.
    #[test]
    fn error_text() {
        assert_eq!(error_table_text(b"-WRONGTYPE bad"), b"WRONGTYPE bad");
        assert_eq!(error_table_text(b"-NOCODE"), b"ERR NOCODE");
        assert_eq!(error_table_text(b"plain words\r\n"), b"ERR plain words");
    }
}
