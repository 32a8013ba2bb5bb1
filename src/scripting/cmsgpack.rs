//! The `cmsgpack` library (lua-cmsgpack 0.4, as Redis ships it): `cmsgpack.pack(...)`,
//! `cmsgpack.unpack(s)`, `cmsgpack.unpack_one(s [, offset])`,
//! `cmsgpack.unpack_limit(s, limit [, offset])`.
//!
//! Encoding as lua-cmsgpack: integral numbers in the smallest int/uint form, other numbers
//! as float32 when exact, else float64; strings as fixstr/str8/str16/str32; a table whose
//! keys are exactly 1..n as an array, others as a map (in `next` order); tables nested
//! deeper than 16 and unencodable values as nil.

use super::raise_error;
use mlua::{Lua, MultiValue, Table, Value};

/// lua-cmsgpack's `LUACMSGPACK_MAX_NESTING`: a table at this depth is encoded as nil.
const NESTING_MAX: usize = 16;

fn encode_int(n: i64, out: &mut Vec<u8>) {
    if n >= 0 {
        let u = n as u64;
        if u <= 127 {
            out.push(u as u8);
        } else if u <= 0xff {
            out.extend_from_slice(&[0xcc, u as u8]);
        } else if u <= 0xffff {
            out.push(0xcd);
            out.extend_from_slice(&(u as u16).to_be_bytes());
        } else if u <= 0xffff_ffff {
            out.push(0xce);
            out.extend_from_slice(&(u as u32).to_be_bytes());
        } else {
            out.push(0xcf);
            out.extend_from_slice(&u.to_be_bytes());
        }
    } else if n >= -32 {
        out.push(n as i8 as u8);
    } else if n >= -128 {
        out.extend_from_slice(&[0xd0, n as i8 as u8]);
    } else if n >= -32768 {
        out.push(0xd1);
        out.extend_from_slice(&(n as i16).to_be_bytes());
    } else if n >= -2_147_483_648 {
        out.push(0xd2);
        out.extend_from_slice(&(n as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

fn encode_number(n: f64, out: &mut Vec<u8>) {
    if n.is_finite() && (n as i64) as f64 == n {
        encode_int(n as i64, out);
    } else if (n as f32) as f64 == n || n.is_nan() {
        out.push(0xca);
        out.extend_from_slice(&(n as f32).to_be_bytes());
    } else {
        out.push(0xcb);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

fn encode_bytes(s: &[u8], out: &mut Vec<u8>) {
    let len = s.len();
    if len < 32 {
        out.push(0xa0 | len as u8);
    } else if len <= 0xff {
        out.extend_from_slice(&[0xd9, len as u8]);
    } else if len <= 0xffff {
        out.push(0xda);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
    out.extend_from_slice(s);
}

fn header(out: &mut Vec<u8>, n: usize, fix: u8, w16: u8, w32: u8) {
    if n <= 15 {
        out.push(fix | n as u8);
    } else if n <= 0xffff {
        out.push(w16);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(w32);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

/// `Some(n)` when the keys are exactly 1..n (lua-cmsgpack's `table_is_an_array`).
fn array_len(lua: &Lua, t: &Table) -> mlua::Result<Option<usize>> {
    let (mut count, mut max) = (0usize, 0usize);
    for pair in t.pairs::<Value, Value>() {
        let (k, _) = pair?;
        let n = match &k {
            Value::Number(_) | Value::Integer(_) | Value::String(_) => lua.coerce_number(k)?,
            _ => None,
        };
        match n {
            Some(n) if n > 0.0 && n.floor() == n => {
                count += 1;
                max = max.max(n as usize);
            }
            _ => return Ok(None),
        }
    }
    Ok((max == count).then_some(count))
}

fn encode(lua: &Lua, v: &Value, out: &mut Vec<u8>, level: usize) -> mlua::Result<()> {
    match v {
        Value::Boolean(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        Value::Number(n) => encode_number(*n, out),
        Value::Integer(i) => encode_int(*i, out),
        Value::String(s) => encode_bytes(&s.as_bytes(), out),
        Value::Table(t) if level < NESTING_MAX => match array_len(lua, t)? {
            Some(n) => {
                header(out, n, 0x90, 0xdc, 0xdd);
                for i in 1..=n {
                    let e: Value = t.raw_get(i)?;
                    encode(lua, &e, out, level + 1)?;
                }
            }
            None => {
                let pairs: Vec<(Value, Value)> =
                    t.pairs::<Value, Value>().collect::<mlua::Result<_>>()?;
                header(out, pairs.len(), 0x80, 0xde, 0xdf);
                for (k, e) in &pairs {
                    encode(lua, k, out, level + 1)?;
                    encode(lua, e, out, level + 1)?;
                }
            }
        },
        _ => out.push(0xc0),
    }
    Ok(())
}

enum DecodeError {
    Eof,
    BadFormat,
    Lua(mlua::Error),
}

impl From<mlua::Error> for DecodeError {
    fn from(e: mlua::Error) -> Self {
        DecodeError::Lua(e)
    }
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], DecodeError> {
        let s = self.b.get(self.pos..self.pos + n).ok_or(DecodeError::Eof)?;
        self.pos += n;
        Ok(s)
    }

    fn uint(&mut self, n: usize) -> Result<u64, DecodeError> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | b as u64))
    }

    fn decode(&mut self, lua: &Lua) -> Result<Value, DecodeError> {
        let t = self.take(1)?[0];
        Ok(match t {
            0x00..=0x7f => Value::Number(t as f64),
            0xe0..=0xff => Value::Number(t as i8 as f64),
            0xcc => Value::Number(self.uint(1)? as f64),
            0xcd => Value::Number(self.uint(2)? as f64),
            0xce => Value::Number(self.uint(4)? as f64),
            0xcf => Value::Number(self.uint(8)? as f64),
            0xd0 => Value::Number(self.uint(1)? as u8 as i8 as f64),
            0xd1 => Value::Number(self.uint(2)? as u16 as i16 as f64),
            0xd2 => Value::Number(self.uint(4)? as u32 as i32 as f64),
            0xd3 => Value::Number(self.uint(8)? as i64 as f64),
            0xc0 => Value::Nil,
            0xc2 => Value::Boolean(false),
            0xc3 => Value::Boolean(true),
            0xca => Value::Number(f32::from_bits(self.uint(4)? as u32) as f64),
            0xcb => Value::Number(f64::from_bits(self.uint(8)?)),
            0xa0..=0xbf => self.string(lua, (t & 0x1f) as usize)?,
            0xd9 | 0xc4 => {
                let n = self.uint(1)? as usize;
                self.string(lua, n)?
            }
            0xda | 0xc5 => {
                let n = self.uint(2)? as usize;
                self.string(lua, n)?
            }
            0xdb | 0xc6 => {
                let n = self.uint(4)? as usize;
                self.string(lua, n)?
            }
            0x90..=0x9f => self.array(lua, (t & 0x0f) as usize)?,
            0xdc => {
                let n = self.uint(2)? as usize;
                self.array(lua, n)?
            }
            0xdd => {
                let n = self.uint(4)? as usize;
                self.array(lua, n)?
            }
            0x80..=0x8f => self.map(lua, (t & 0x0f) as usize)?,
            0xde => {
                let n = self.uint(2)? as usize;
                self.map(lua, n)?
            }
            0xdf => {
                let n = self.uint(4)? as usize;
                self.map(lua, n)?
            }
            _ => return Err(DecodeError::BadFormat),
        })
    }

    fn string(&mut self, lua: &Lua, n: usize) -> Result<Value, DecodeError> {
        let s = self.take(n)?;
        Ok(Value::String(lua.create_string(s)?))
    }

    fn array(&mut self, lua: &Lua, n: usize) -> Result<Value, DecodeError> {
        let t = lua.create_table()?;
        for i in 1..=n {
            let v = self.decode(lua)?;
            t.raw_set(i, v)?;
        }
        Ok(Value::Table(t))
    }

    fn map(&mut self, lua: &Lua, n: usize) -> Result<Value, DecodeError> {
        let t = lua.create_table()?;
        for _ in 0..n {
            let k = self.decode(lua)?;
            let v = self.decode(lua)?;
            if !k.is_nil() {
                t.raw_set(k, v)?;
            }
        }
        Ok(Value::Table(t))
    }
}

/// lua-cmsgpack's `mp_unpack_full`: decodes up to `limit` values (all when `None`) from
/// `offset`; `with_offset` puts the next offset (-1 at the end) first.
fn unpack_full(
    lua: &Lua,
    args: &MultiValue,
    limit: Option<i64>,
    offset: i64,
    with_offset: bool,
) -> mlua::Result<MultiValue> {
    let s = match args.front() {
        Some(v) => lua.coerce_string(v.clone())?,
        None => None,
    };
    let Some(s) = s else {
        return Err(raise_error(
            lua,
            "MessagePack decoding needs a string as input.".into(),
        ));
    };
    let bytes = s.as_bytes().to_vec();
    let len = bytes.len() as i64;
    if offset < 0 || limit.is_some_and(|l| l < 0) {
        return Err(raise_error(
            lua,
            format!("Invalid request to unpack with offset of {offset} and limit of {len}."),
        ));
    }
    if offset > len {
        return Err(raise_error(
            lua,
            format!("Start offset {offset} greater than input length {len}."),
        ));
    }
    let limit = limit.unwrap_or(i64::MAX);
    let mut c = Cursor {
        b: &bytes,
        pos: offset as usize,
    };
    let mut out = Vec::new();
    let mut count = 0;
    while c.pos < bytes.len() && count < limit {
        match c.decode(lua) {
            Ok(v) => out.push(v),
            Err(DecodeError::Eof) => {
                return Err(raise_error(lua, "Missing bytes in input.".into()))
            }
            Err(DecodeError::BadFormat) => {
                return Err(raise_error(lua, "Bad data format in input.".into()))
            }
            Err(DecodeError::Lua(e)) => return Err(e),
        }
        count += 1;
    }
    if with_offset {
        let next = if c.pos >= bytes.len() {
            -1
        } else {
            c.pos as i64
        };
        out.insert(0, Value::Number(next as f64));
    }
    Ok(MultiValue::from_iter(out))
}

fn opt_int(lua: &Lua, args: &MultiValue, i: usize) -> mlua::Result<i64> {
    match args.get(i) {
        None | Some(Value::Nil) => Ok(0),
        Some(v) => Ok(lua.coerce_number(v.clone())?.unwrap_or(0.0) as i64),
    }
}

pub fn open(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set(
        "pack",
        lua.create_function(|lua, args: MultiValue| {
            if args.is_empty() {
                return Err(raise_error(
                    lua,
                    "bad argument #0 to 'pack' (MessagePack pack needs input.)".into(),
                ));
            }
            let mut out = Vec::new();
            for a in args.iter() {
                encode(lua, a, &mut out, 0)?;
            }
            lua.create_string(&out)
        })?,
    )?;
    t.raw_set(
        "unpack",
        lua.create_function(|lua, args: MultiValue| unpack_full(lua, &args, None, 0, false))?,
    )?;
    t.raw_set(
        "unpack_one",
        lua.create_function(|lua, args: MultiValue| {
            let offset = opt_int(lua, &args, 1)?;
            unpack_full(lua, &args, Some(1), offset, true)
        })?,
    )?;
    t.raw_set(
        "unpack_limit",
        lua.create_function(|lua, args: MultiValue| {
            let limit = opt_int(lua, &args, 1)?;
            let offset = opt_int(lua, &args, 2)?;
            unpack_full(lua, &args, Some(limit), offset, true)
        })?,
    )?;
    t.raw_set("_NAME", "cmsgpack")?;
    t.raw_set("_VERSION", "lua-cmsgpack 0.4.0")?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(src: &str) -> Vec<u8> {
        let lua = Lua::new();
        lua.globals().set("cmsgpack", open(&lua).unwrap()).unwrap();
        let v: Value = lua.load(src).eval().unwrap();
        lua.coerce_string(v).unwrap().unwrap().as_bytes().to_vec()
    }

    // Packing picks lua-cmsgpack's smallest encodings.
    #[test]
    fn packs() {
        assert_eq!(eval("return cmsgpack.pack({1, 2})"), b"\x92\x01\x02");
        assert_eq!(
            eval("return cmsgpack.pack(-1, 200, -200)"),
            b"\xff\xcc\xc8\xd1\xff\x38"
        );
        assert_eq!(eval("return cmsgpack.pack(1.5)"), b"\xca\x3f\xc0\x00\x00");
        assert_eq!(
            eval("return cmsgpack.pack(0.1)"),
            [&[0xcb][..], &0.1f64.to_be_bytes()].concat()
        );
        assert_eq!(eval("return cmsgpack.pack('ab')"), b"\xa2ab");
        assert_eq!(eval("return cmsgpack.pack({a = true})"), b"\x81\xa1a\xc3");
        assert_eq!(eval("return cmsgpack.pack({[1] = 1, [3] = 3})").len(), 5);
        assert_eq!(eval("return cmsgpack.pack({})"), b"\x90");
    }

    // Unpacking round-trips values and reports offsets.
    #[test]
    fn unpacks() {
        assert_eq!(
            eval("return cmsgpack.unpack(cmsgpack.pack({1, {x = 'y'}}))[2].x"),
            b"y"
        );
        assert_eq!(
            eval("local a, b = cmsgpack.unpack(cmsgpack.pack(1, 2)) return a + b"),
            b"3"
        );
        assert_eq!(
            eval("local o, v = cmsgpack.unpack_one(cmsgpack.pack(7, 8)) return o .. ':' .. v"),
            b"1:7"
        );
        assert_eq!(
            eval("local o, v = cmsgpack.unpack_one(cmsgpack.pack(7, 8), 1) return o .. ':' .. v"),
            b"-1:8"
        );
    }
}
