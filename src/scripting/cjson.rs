//! The `cjson` library (lua-cjson 2.1.0's behaviour with Redis's default settings):
//! `cjson.encode`, `cjson.decode` and `cjson.null`.
//!
//! Encoding: numbers with `%.14g`, strings with `/` escaped as `\/` and control bytes as
//! `\u` escapes of four hex digits, tables whose keys are all positive integers as arrays (holes become `null`;
//! "excessively sparse" arrays, max index > 2 × count and > 10, are refused), other tables
//! as objects in Lua's `next` order, an empty table as `{}`. Decoding: objects and arrays to
//! tables, `null` to `cjson.null`, numbers by `strtod` rules (hex, `inf`, `nan` accepted as
//! lua-cjson's default allows). Errors carry lua-cjson's texts.
//!
//! The configuration functions (`encode_sparse_array`, `encode_max_depth`,
//! `decode_max_depth`, `encode_number_precision`, `encode_keep_buffer`,
//! `encode_invalid_numbers`, `decode_invalid_numbers`) change this Lua state's instance
//! (per worker: a setting made by a script on one worker does not reach the others);
//! `cjson.new()` returns an instance with default settings.

use super::{fmt_g, raise_error};
use mlua::{LightUserData, Lua, MultiValue, Table, Value};
use std::cell::Cell;
use std::rc::Rc;

/// lua-cjson's default nesting limit for both directions.
pub const DEPTH_MAX: usize = 1000;

/// One cjson instance's settings (changed by the `encode_*`/`decode_*` functions; they
/// last for the Lua state, as in Redis).
#[derive(Clone, Copy, Debug)]
struct Config {
    sparse_convert: bool,
    sparse_ratio: usize,
    sparse_safe: usize,
    encode_max_depth: usize,
    decode_max_depth: usize,
    precision: usize,
    keep_buffer: bool,
    /// 0 off (error), 1 on (`inf`, `nan`), 2 `null`.
    encode_invalid: usize,
    decode_invalid: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            sparse_convert: false,
            sparse_ratio: 2,
            sparse_safe: 10,
            encode_max_depth: DEPTH_MAX,
            decode_max_depth: DEPTH_MAX,
            precision: 14,
            keep_buffer: true,
            encode_invalid: 0,
            decode_invalid: true,
        }
    }
}

type Shared = Rc<Cell<Config>>;

fn null() -> Value {
    Value::LightUserData(LightUserData(std::ptr::null_mut()))
}

pub fn open(lua: &Lua) -> mlua::Result<Table> {
    let cfg: Shared = Rc::new(Cell::new(Config::default()));
    let t = lua.create_table()?;
    let c = cfg.clone();
    t.raw_set(
        "encode",
        lua.create_function(move |lua, args: MultiValue| {
            if args.len() != 1 {
                return Err(raise_error(
                    lua,
                    "bad argument #1 to 'encode' (expected 1 argument)".into(),
                ));
            }
            let mut out = Vec::new();
            encode(&c.get(), &args[0], &mut out, 0).map_err(|m| raise_error(lua, m))?;
            lua.create_string(&out)
        })?,
    )?;
    let c = cfg.clone();
    t.raw_set(
        "decode",
        lua.create_function(move |lua, args: MultiValue| {
            if args.len() != 1 {
                return Err(raise_error(
                    lua,
                    "bad argument #1 to 'decode' (expected 1 argument)".into(),
                ));
            }
            let Some(s) = lua.coerce_string(args[0].clone())? else {
                return Err(raise_error(
                    lua,
                    format!(
                        "bad argument #1 to 'decode' (string expected, got {})",
                        args[0].type_name()
                    ),
                ));
            };
            let bytes = s.as_bytes().to_vec();
            // lua-cjson reads up to the C string's terminator.
            let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
            let mut d = Decoder {
                cfg: c.get(),
                lua,
                s: &bytes[..end],
                pos: 0,
                depth: 0,
            };
            d.top().map_err(|e| match e {
                DecodeError::Lua(e) => e,
                DecodeError::Parse(m) => raise_error(lua, m),
            })
        })?,
    )?;
    settings(lua, &t, &cfg)?;
    t.raw_set("new", lua.create_function(|lua, _: MultiValue| open(lua))?)?;
    t.raw_set("null", null())?;
    t.raw_set("_NAME", "cjson")?;
    t.raw_set("_VERSION", "2.1.0")?;
    Ok(t)
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::LightUserData(_) => "userdata",
        other => other.type_name(),
    }
}

fn encode(cfg: &Config, v: &Value, out: &mut Vec<u8>, depth: usize) -> Result<(), String> {
    match v {
        Value::Nil => out.extend_from_slice(b"null"),
        Value::LightUserData(p) if p.0.is_null() => out.extend_from_slice(b"null"),
        Value::Boolean(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Integer(i) => encode_number(cfg, *i as f64, out)?,
        Value::Number(n) => encode_number(cfg, *n, out)?,
        Value::String(s) => encode_string(&s.as_bytes(), out),
        Value::Table(t) => encode_table(cfg, t, out, depth + 1)?,
        other => {
            return Err(format!(
                "Cannot serialise {}: type not supported",
                type_name(other)
            ))
        }
    }
    Ok(())
}

fn encode_number(cfg: &Config, n: f64, out: &mut Vec<u8>) -> Result<(), String> {
    if !n.is_finite() {
        match cfg.encode_invalid {
            0 => return Err("Cannot serialise number: must not be NaN or Inf".into()),
            2 => {
                out.extend_from_slice(b"null");
                return Ok(());
            }
            _ => {}
        }
    }
    out.extend_from_slice(fmt_g(n, cfg.precision).as_bytes());
    Ok(())
}

fn encode_string(s: &[u8], out: &mut Vec<u8>) {
    out.push(b'"');
    for &c in s {
        match c {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'/' => out.extend_from_slice(b"\\/"),
            b'\x08' => out.extend_from_slice(b"\\b"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\x0c' => out.extend_from_slice(b"\\f"),
            b'\r' => out.extend_from_slice(b"\\r"),
            c if c < 0x20 => out.extend_from_slice(format!("\\u{c:04x}").as_bytes()),
            c => out.push(c),
        }
    }
    out.push(b'"');
}

/// `Some(max index)` when every key is a positive integer (an array), `None` for an object.
fn array_length(cfg: &Config, t: &Table) -> Result<Option<usize>, String> {
    let (mut max, mut items) = (0usize, 0usize);
    for pair in t.pairs::<Value, Value>() {
        let (k, _) = pair.map_err(|e| e.to_string())?;
        let n = match k {
            Value::Number(n) => n,
            Value::Integer(i) => i as f64,
            _ => return Ok(None),
        };
        if n < 1.0 || n.floor() != n {
            return Ok(None);
        }
        max = max.max(n as usize);
        items += 1;
    }
    if cfg.sparse_ratio > 0 && max > items * cfg.sparse_ratio && max > cfg.sparse_safe {
        if !cfg.sparse_convert {
            return Err("Cannot serialise table: excessively sparse array".into());
        }
        return Ok(None);
    }
    Ok(Some(max))
}

fn encode_table(cfg: &Config, t: &Table, out: &mut Vec<u8>, depth: usize) -> Result<(), String> {
    if depth > cfg.encode_max_depth {
        return Err(format!("Cannot serialise, excessive nesting ({depth})"));
    }
    match array_length(cfg, t)? {
        Some(len) if len > 0 => {
            out.push(b'[');
            for i in 1..=len {
                if i > 1 {
                    out.push(b',');
                }
                let v: Value = t.raw_get(i).map_err(|e| e.to_string())?;
                encode(cfg, &v, out, depth)?;
            }
            out.push(b']');
        }
        _ => {
            out.push(b'{');
            let mut first = true;
            for pair in t.pairs::<Value, Value>() {
                let (k, v) = pair.map_err(|e| e.to_string())?;
                if !first {
                    out.push(b',');
                }
                first = false;
                match &k {
                    Value::String(s) => encode_string(&s.as_bytes(), out),
                    Value::Number(_) | Value::Integer(_) => {
                        out.push(b'"');
                        let n = match k {
                            Value::Number(n) => n,
                            Value::Integer(i) => i as f64,
                            _ => unreachable!("matched a number"),
                        };
                        encode_number(cfg, n, out)?;
                        out.push(b'"');
                    }
                    other => {
                        return Err(format!(
                            "Cannot serialise {}: table key must be a number or string",
                            type_name(other)
                        ))
                    }
                }
                out.push(b':');
                encode(cfg, &v, out, depth)?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

enum DecodeError {
    Lua(mlua::Error),
    Parse(String),
}

impl From<mlua::Error> for DecodeError {
    fn from(e: mlua::Error) -> Self {
        DecodeError::Lua(e)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    ObjBegin,
    ObjEnd,
    ArrBegin,
    ArrEnd,
    Str(Vec<u8>),
    Num(f64),
    Bool(bool),
    Null,
    Colon,
    Comma,
    End,
    Error(&'static str),
}

impl Token {
    fn name(&self) -> &'static str {
        match self {
            Token::ObjBegin => "T_OBJ_BEGIN",
            Token::ObjEnd => "T_OBJ_END",
            Token::ArrBegin => "T_ARR_BEGIN",
            Token::ArrEnd => "T_ARR_END",
            Token::Str(_) => "T_STRING",
            Token::Num(_) => "T_NUMBER",
            Token::Bool(_) => "T_BOOLEAN",
            Token::Null => "T_NULL",
            Token::Colon => "T_COLON",
            Token::Comma => "T_COMMA",
            Token::End => "T_END",
            Token::Error(m) => m,
        }
    }
}

struct Decoder<'a> {
    cfg: Config,
    lua: &'a Lua,
    s: &'a [u8],
    pos: usize,
    depth: usize,
}

impl Decoder<'_> {
    /// The next token and the index where it starts.
    fn next(&mut self) -> (Token, usize) {
        while self.pos < self.s.len() && matches!(self.s[self.pos], b' ' | b'\t' | b'\n' | b'\r') {
            self.pos += 1;
        }
        let at = self.pos;
        let Some(&c) = self.s.get(at) else {
            return (Token::End, at);
        };
        let single = match c {
            b'{' => Some(Token::ObjBegin),
            b'}' => Some(Token::ObjEnd),
            b'[' => Some(Token::ArrBegin),
            b']' => Some(Token::ArrEnd),
            b',' => Some(Token::Comma),
            b':' => Some(Token::Colon),
            _ => None,
        };
        if let Some(t) = single {
            self.pos += 1;
            return (t, at);
        }
        if c == b'"' {
            // lua-cjson reports a bad string where the scan stopped, not where it began.
            return match self.string() {
                Ok(t) => (t, at),
                Err((msg, stop)) => (Token::Error(msg), stop),
            };
        }
        let rest = &self.s[at..];
        for (word, tok) in [
            (&b"true"[..], Token::Bool(true)),
            (b"false", Token::Bool(false)),
            (b"null", Token::Null),
        ] {
            if rest.starts_with(word) {
                self.pos += word.len();
                return (tok, at);
            }
        }
        let invalid = is_invalid_number(rest);
        if (c == b'-' || c.is_ascii_digit()) && invalid && !self.cfg.decode_invalid {
            return (Token::Error("invalid number"), at);
        }
        if c == b'-' || c.is_ascii_digit() || (invalid && self.cfg.decode_invalid) {
            return match strtod(rest) {
                Some((n, used)) => {
                    self.pos += used;
                    (Token::Num(n), at)
                }
                None => (Token::Error("invalid number"), at),
            };
        }
        (Token::Error("invalid token"), at)
    }

    fn string(&mut self) -> Result<Token, (&'static str, usize)> {
        let mut out = Vec::new();
        self.pos += 1;
        loop {
            let Some(&c) = self.s.get(self.pos) else {
                return Err(("unexpected end of string", self.pos));
            };
            self.pos += 1;
            match c {
                b'"' => return Ok(Token::Str(out)),
                b'\\' => {
                    let escape_at = self.pos - 1;
                    let Some(&e) = self.s.get(self.pos) else {
                        return Err(("invalid escape code", escape_at));
                    };
                    self.pos += 1;
                    match e {
                        b'"' | b'\\' | b'/' => out.push(e),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'n' => out.push(b'\n'),
                        b'r' => out.push(b'\r'),
                        b't' => out.push(b'\t'),
                        b'u' => match self.unicode_escape() {
                            Some(ch) => {
                                let mut buf = [0u8; 4];
                                out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                            }
                            None => return Err(("invalid unicode escape code", escape_at)),
                        },
                        _ => return Err(("invalid escape code", escape_at)),
                    }
                }
                c => out.push(c),
            }
        }
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.s.get(self.pos..self.pos + 4)?;
        let v = u32::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()?;
        self.pos += 4;
        Some(v)
    }

    fn unicode_escape(&mut self) -> Option<char> {
        let hi = self.hex4()?;
        if (0xD800..0xDC00).contains(&hi) {
            if self.s.get(self.pos..self.pos + 2)? != b"\\u" {
                return None;
            }
            self.pos += 2;
            let lo = self.hex4()?;
            if !(0xDC00..0xE000).contains(&lo) {
                return None;
            }
            return char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00));
        }
        if (0xDC00..0xE000).contains(&hi) {
            return None;
        }
        char::from_u32(hi)
    }

    fn fail<T>(&self, expected: &str, tok: &Token, at: usize) -> Result<T, DecodeError> {
        Err(DecodeError::Parse(format!(
            "Expected {expected} but found {} at character {}",
            tok.name(),
            at + 1
        )))
    }

    fn top(&mut self) -> Result<Value, DecodeError> {
        let (tok, at) = self.next();
        let v = self.value(tok, at)?;
        let (tok, at) = self.next();
        if tok != Token::End {
            return self.fail("the end", &tok, at);
        }
        Ok(v)
    }

    fn value(&mut self, tok: Token, at: usize) -> Result<Value, DecodeError> {
        Ok(match tok {
            Token::Str(s) => Value::String(self.lua.create_string(&s)?),
            Token::Num(n) => Value::Number(n),
            Token::Bool(b) => Value::Boolean(b),
            Token::Null => null(),
            Token::ObjBegin => self.object(at)?,
            Token::ArrBegin => self.array(at)?,
            other => return self.fail("value", &other, at),
        })
    }

    fn descend(&mut self, at: usize) -> Result<(), DecodeError> {
        self.depth += 1;
        if self.depth > self.cfg.decode_max_depth {
            return Err(DecodeError::Parse(format!(
                "Found too many nested data structures ({}) at character {}",
                self.depth,
                at + 1
            )));
        }
        Ok(())
    }

    fn object(&mut self, at: usize) -> Result<Value, DecodeError> {
        self.descend(at)?;
        let t = self.lua.create_table()?;
        let (mut tok, mut at) = self.next();
        if tok == Token::ObjEnd {
            self.depth -= 1;
            return Ok(Value::Table(t));
        }
        loop {
            let Token::Str(key) = tok else {
                return self.fail("object key string", &tok, at);
            };
            let (colon, cat) = self.next();
            if colon != Token::Colon {
                return self.fail("colon", &colon, cat);
            }
            let (vt, vat) = self.next();
            let v = self.value(vt, vat)?;
            t.raw_set(self.lua.create_string(&key)?, v)?;
            let (sep, sat) = self.next();
            match sep {
                Token::ObjEnd => break,
                Token::Comma => {}
                other => return self.fail("comma or object end", &other, sat),
            }
            (tok, at) = self.next();
        }
        self.depth -= 1;
        Ok(Value::Table(t))
    }

    fn array(&mut self, at: usize) -> Result<Value, DecodeError> {
        self.descend(at)?;
        let t = self.lua.create_table()?;
        let (mut tok, mut at) = self.next();
        if tok == Token::ArrEnd {
            self.depth -= 1;
            return Ok(Value::Table(t));
        }
        let mut i = 1;
        loop {
            let v = self.value(tok, at)?;
            t.raw_set(i, v)?;
            i += 1;
            let (sep, sat) = self.next();
            match sep {
                Token::ArrEnd => break,
                Token::Comma => {}
                other => return self.fail("comma or array end", &other, sat),
            }
            (tok, at) = self.next();
        }
        self.depth -= 1;
        Ok(Value::Table(t))
    }
}

/// lua-cjson's `json_is_invalid_number`: numbers JSON does not allow (a leading `+`, hex,
/// leading zeros, `inf`, `nan`), which its default settings still decode.
fn is_invalid_number(s: &[u8]) -> bool {
    let mut p = s;
    if p.first() == Some(&b'+') {
        return true;
    }
    if p.first() == Some(&b'-') {
        p = &p[1..];
    }
    match p.first() {
        Some(b'0') => matches!(p.get(1), Some(c) if (c | 0x20) == b'x' || c.is_ascii_digit()),
        Some(&c) if c <= b'9' => false,
        _ => {
            let lower: Vec<u8> = p.iter().take(3).map(|c| c.to_ascii_lowercase()).collect();
            lower == b"inf" || lower == b"nan"
        }
    }
}

/// The configuration functions; each returns the settings in force after the call.
fn settings(lua: &Lua, t: &Table, cfg: &Shared) -> mlua::Result<()> {
    fn check_count(lua: &Lua, args: &MultiValue, n: usize, name: &str) -> mlua::Result<()> {
        if args.len() > n {
            return Err(raise_error(
                lua,
                format!(
                    "bad argument #{} to '{name}' (found too many arguments)",
                    n + 1
                ),
            ));
        }
        Ok(())
    }
    fn int_opt(
        lua: &Lua,
        args: &MultiValue,
        i: usize,
        name: &str,
        (min, max): (i64, i64),
    ) -> mlua::Result<Option<usize>> {
        let v = args.get(i).cloned().unwrap_or(Value::Nil);
        if v.is_nil() {
            return Ok(None);
        }
        let Some(n) = lua.coerce_number(v.clone())? else {
            return Err(raise_error(
                lua,
                format!(
                    "bad argument #{} to '{name}' (number expected, got {})",
                    i + 1,
                    v.type_name()
                ),
            ));
        };
        let n = n as i64;
        if n < min || n > max {
            return Err(raise_error(
                lua,
                format!(
                    "bad argument #{} to '{name}' (expected integer between {min} and {max})",
                    i + 1
                ),
            ));
        }
        Ok(Some(n as usize))
    }
    /// `json_enum_option`: a boolean, or one of `options` by name; returns the index.
    fn enum_opt(
        lua: &Lua,
        args: &MultiValue,
        i: usize,
        name: &str,
        options: &[&str],
    ) -> mlua::Result<Option<usize>> {
        match args.get(i) {
            None | Some(Value::Nil) => Ok(None),
            Some(Value::Boolean(b)) => Ok(Some(*b as usize)),
            Some(v) => {
                let s = lua.coerce_string(v.clone())?.map(|s| s.to_string_lossy());
                match s.and_then(|s| options.iter().position(|o| *o == s).map(|p| (p, s))) {
                    Some((p, _)) => Ok(Some(p)),
                    None => {
                        let shown = lua
                            .coerce_string(v.clone())?
                            .map(|s| s.to_string_lossy())
                            .unwrap_or_default();
                        Err(raise_error(
                            lua,
                            format!(
                                "bad argument #{} to '{name}' (invalid option '{shown}')",
                                i + 1
                            ),
                        ))
                    }
                }
            }
        }
    }
    const ON_OFF: &[&str] = &["off", "on"];
    const INT_RANGE: (i64, i64) = (0, i32::MAX as i64);
    const DEPTH_RANGE: (i64, i64) = (1, i32::MAX as i64);

    let c = cfg.clone();
    t.raw_set(
        "encode_sparse_array",
        lua.create_function(move |lua, args: MultiValue| {
            let name = "encode_sparse_array";
            check_count(lua, &args, 3, name)?;
            let mut v = c.get();
            if let Some(x) = enum_opt(lua, &args, 0, name, ON_OFF)? {
                v.sparse_convert = x == 1;
            }
            if let Some(x) = int_opt(lua, &args, 1, name, INT_RANGE)? {
                v.sparse_ratio = x;
            }
            if let Some(x) = int_opt(lua, &args, 2, name, INT_RANGE)? {
                v.sparse_safe = x;
            }
            c.set(v);
            Ok((
                v.sparse_convert,
                v.sparse_ratio as f64,
                v.sparse_safe as f64,
            ))
        })?,
    )?;
    for (name, decode) in [("encode_max_depth", false), ("decode_max_depth", true)] {
        let c = cfg.clone();
        t.raw_set(
            name,
            lua.create_function(move |lua, args: MultiValue| {
                check_count(lua, &args, 1, name)?;
                let mut v = c.get();
                if let Some(x) = int_opt(lua, &args, 0, name, DEPTH_RANGE)? {
                    if decode {
                        v.decode_max_depth = x;
                    } else {
                        v.encode_max_depth = x;
                    }
                }
                c.set(v);
                Ok(if decode {
                    v.decode_max_depth
                } else {
                    v.encode_max_depth
                } as f64)
            })?,
        )?;
    }
    let c = cfg.clone();
    t.raw_set(
        "encode_number_precision",
        lua.create_function(move |lua, args: MultiValue| {
            let name = "encode_number_precision";
            check_count(lua, &args, 1, name)?;
            let mut v = c.get();
            if let Some(x) = int_opt(lua, &args, 0, name, (1, 14))? {
                v.precision = x;
            }
            c.set(v);
            Ok(v.precision as f64)
        })?,
    )?;
    let c = cfg.clone();
    t.raw_set(
        "encode_keep_buffer",
        lua.create_function(move |lua, args: MultiValue| {
            let name = "encode_keep_buffer";
            check_count(lua, &args, 1, name)?;
            let mut v = c.get();
            if let Some(x) = enum_opt(lua, &args, 0, name, ON_OFF)? {
                v.keep_buffer = x == 1;
            }
            c.set(v);
            Ok(v.keep_buffer)
        })?,
    )?;
    let c = cfg.clone();
    t.raw_set(
        "encode_invalid_numbers",
        lua.create_function(move |lua, args: MultiValue| {
            let name = "encode_invalid_numbers";
            check_count(lua, &args, 1, name)?;
            let mut v = c.get();
            if let Some(x) = enum_opt(lua, &args, 0, name, &["off", "on", "null"])? {
                v.encode_invalid = x;
            }
            c.set(v);
            Ok(match v.encode_invalid {
                0 => Value::Boolean(false),
                1 => Value::Boolean(true),
                _ => Value::String(lua.create_string("null")?),
            })
        })?,
    )?;
    let c = cfg.clone();
    t.raw_set(
        "decode_invalid_numbers",
        lua.create_function(move |lua, args: MultiValue| {
            let name = "decode_invalid_numbers";
            check_count(lua, &args, 1, name)?;
            let mut v = c.get();
            if let Some(x) = enum_opt(lua, &args, 0, name, ON_OFF)? {
                v.decode_invalid = x == 1;
            }
            c.set(v);
            Ok(v.decode_invalid)
        })?,
    )?;
    Ok(())
}

/// C `strtod` on the longest valid prefix: returns the value and the bytes used.
pub fn strtod(s: &[u8]) -> Option<(f64, usize)> {
    let mut i = 0;
    let neg = match s.first() {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let sign = if neg { -1.0 } else { 1.0 };
    let rest = &s[i..];
    let lower: Vec<u8> = rest
        .iter()
        .take(8)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if lower.starts_with(b"infinity") {
        return Some((sign * f64::INFINITY, i + 8));
    }
    if lower.starts_with(b"inf") {
        return Some((sign * f64::INFINITY, i + 3));
    }
    if lower.starts_with(b"nan") {
        return Some((f64::NAN, i + 3));
    }
    if lower.starts_with(b"0x") {
        let digits = rest[2..]
            .iter()
            .take_while(|c| c.is_ascii_hexdigit())
            .count();
        if digits == 0 {
            return Some((0.0, i + 1));
        }
        let text = std::str::from_utf8(&rest[2..2 + digits]).ok()?;
        let v = u128::from_str_radix(text, 16)
            .map(|v| v as f64)
            .unwrap_or(f64::INFINITY);
        return Some((sign * v, i + 2 + digits));
    }
    let mut j = 0;
    let digits = |from: usize| {
        rest[from..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count()
    };
    let int_digits = digits(j);
    j += int_digits;
    let mut frac_digits = 0;
    if rest.get(j) == Some(&b'.') {
        frac_digits = digits(j + 1);
        if int_digits + frac_digits > 0 {
            j += 1 + frac_digits;
        }
    }
    if int_digits + frac_digits == 0 {
        return None;
    }
    if matches!(rest.get(j), Some(b'e') | Some(b'E')) {
        let mut k = j + 1;
        if matches!(rest.get(k), Some(b'+') | Some(b'-')) {
            k += 1;
        }
        let exp_digits = digits(k);
        if exp_digits > 0 {
            j = k + exp_digits;
        }
    }
    let text = std::str::from_utf8(&rest[..j]).ok()?;
    let text = text.strip_suffix('.').unwrap_or(text);
    let v: f64 = if text.starts_with('.') {
        format!("0{text}").parse().ok()?
    } else {
        text.parse().ok()?
    };
    Some((sign * v, i + j))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lua() -> Lua {
        let lua = Lua::new();
        lua.globals().set("cjson", open(&lua).unwrap()).unwrap();
        lua
    }

    fn eval(src: &str) -> String {
        let lua = lua();
        let v: Value = lua.load(src).eval().unwrap();
        lua.coerce_string(v).unwrap().unwrap().to_string_lossy()
    }

    fn err(src: &str) -> String {
        lua().load(src).exec().unwrap_err().to_string()
    }

    // Encoding gives lua-cjson's bytes for each kind of value.
    #[test]
    fn encodes() {
        assert_eq!(eval("return cjson.encode({1,2,{a=1}})"), "[1,2,{\"a\":1}]");
        assert_eq!(eval("return cjson.encode({})"), "{}");
        assert_eq!(
            eval("return cjson.encode('a/b\"\\n\\1')"),
            "\"a\\/b\\\"\\n\\u0001\""
        );
        assert_eq!(eval("return cjson.encode(0.1)"), "0.1");
        assert_eq!(eval("return cjson.encode(1/3)"), "0.33333333333333");
        assert_eq!(eval("return cjson.encode({[1]=1,[3]=3})"), "[1,null,3]");
        assert_eq!(eval("return cjson.encode({[2.5]=1})"), "{\"2.5\":1}");
        assert_eq!(eval("return cjson.encode(cjson.null)"), "null");
        assert_eq!(eval("return cjson.encode(true)"), "true");
    }

    // Unencodable values fail with lua-cjson's messages.
    #[test]
    fn encode_errors() {
        assert!(err("cjson.encode(function() end)")
            .contains("Cannot serialise function: type not supported"));
        assert!(err("cjson.encode({[1]=1,[20]=2})").contains("excessively sparse array"));
        assert!(err("cjson.encode(1/0)").contains("must not be NaN or Inf"));
        crate::scripting::with_big_stack(|| {
            assert!(
                err("local t = {} t[1] = t cjson.encode(t)").contains("excessive nesting (1001)")
            );
            let deep = format!("cjson.decode('{}')", "[".repeat(1001));
            assert!(err(&deep).contains("Found too many nested data structures (1001)"));
        });
    }

    // Decoding builds tables, and JSON's null is cjson.null.
    #[test]
    fn decodes() {
        assert_eq!(eval("return cjson.decode('[1,2,{\"a\":\"x\"}]')[3].a"), "x");
        assert_eq!(
            eval("return cjson.decode(' {\"a\" : [1, 2.5e1]} ').a[2]"),
            "25"
        );
        assert_eq!(
            eval("return tostring(cjson.decode('null') == cjson.null)"),
            "true"
        );
        assert_eq!(
            eval("return cjson.decode('\"\\\\u00e9\\\\ud83d\\\\ude00\"')"),
            "é😀"
        );
        assert_eq!(eval("return cjson.decode('0x10')"), "16");
    }

    // Malformed JSON fails with lua-cjson's token names and 1-based positions.
    #[test]
    fn decode_errors() {
        assert!(err("cjson.decode('{')")
            .contains("Expected object key string but found T_END at character 2"));
        assert!(err("cjson.decode('[1 2]')")
            .contains("Expected comma or array end but found T_NUMBER at character 4"));
        assert!(err("cjson.decode('')").contains("Expected value but found T_END at character 1"));
        assert!(err("cjson.decode('1 x')")
            .contains("Expected the end but found invalid token at character 3"));
        assert!(err("cjson.decode('{\"a\" 1}')")
            .contains("Expected colon but found T_NUMBER at character 6"));
    }
}
