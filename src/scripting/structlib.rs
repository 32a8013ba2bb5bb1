//! The `struct` library (Roberto Ierusalimschy's lua-struct, as Redis ships it):
//! `struct.pack(fmt, ...)`, `struct.unpack(fmt, s [, pos])`, `struct.size(fmt)`.
//!
//! Format: `>` big endian, `<` / `=` little (this machine's order), `!n` alignment,
//! `x` pad byte, `b/B` 1, `h/H` 2, `l/L` 8, `T` 8, `i/I[n]` n (default 4) byte integers
//! (lowercase signed), `f` float, `d` double, `s` zero-terminated string, `c[n]` fixed
//! string (`c0`: length from the previous value when unpacking), spaces ignored.

use super::raise_error;
use mlua::{Lua, MultiValue, Table, Value};

/// lua-struct's `MAXINTSIZE`: the widest `i`/`I` integer.
const INT_SIZE_MAX: usize = 32;
/// The alignment `!` without a number selects (a double's on x86-64).
const NATIVE_ALIGN: usize = 8;

struct Header {
    big_endian: bool,
    align: usize,
}

struct Fmt<'a> {
    f: &'a [u8],
    pos: usize,
}

impl Fmt<'_> {
    fn getnum(&mut self, lua: &Lua, default: usize) -> mlua::Result<usize> {
        if !self.f.get(self.pos).is_some_and(|c| c.is_ascii_digit()) {
            return Ok(default);
        }
        let mut a: usize = 0;
        while let Some(&c) = self.f.get(self.pos).filter(|c| c.is_ascii_digit()) {
            a = a
                .checked_mul(10)
                .and_then(|v| v.checked_add((c - b'0') as usize))
                .filter(|&v| v <= i32::MAX as usize)
                .ok_or_else(|| raise_error(lua, "integral size overflow".into()))?;
            self.pos += 1;
        }
        Ok(a)
    }

    fn optsize(&mut self, lua: &Lua, opt: u8) -> mlua::Result<usize> {
        Ok(match opt {
            b'B' | b'b' => 1,
            b'H' | b'h' => 2,
            b'L' | b'l' | b'T' | b'd' => 8,
            b'f' => 4,
            b'x' => 1,
            b'c' => self.getnum(lua, 1)?,
            b'i' | b'I' => {
                let sz = self.getnum(lua, 4)?;
                if sz > INT_SIZE_MAX {
                    return Err(raise_error(
                        lua,
                        format!("integral size {sz} is larger than limit of {INT_SIZE_MAX}"),
                    ));
                }
                sz
            }
            _ => 0,
        })
    }

    fn control(&mut self, lua: &Lua, opt: u8, h: &mut Header, fname: &str) -> mlua::Result<()> {
        match opt {
            b' ' => {}
            b'>' => h.big_endian = true,
            b'<' | b'=' => h.big_endian = false,
            b'!' => {
                let a = self.getnum(lua, NATIVE_ALIGN)?;
                if !a.is_power_of_two() {
                    return Err(raise_error(
                        lua,
                        format!("alignment {a} is not a power of 2"),
                    ));
                }
                h.align = a;
            }
            other => {
                return Err(arg_error(
                    lua,
                    1,
                    fname,
                    &format!("invalid format option '{}'", other as char),
                ))
            }
        }
        Ok(())
    }
}

fn to_align(len: usize, h: &Header, opt: u8, size: usize) -> usize {
    if size == 0 || opt == b'c' {
        return 0;
    }
    let size = size.min(h.align);
    (size - (len & (size - 1))) & (size - 1)
}

fn arg_error(lua: &Lua, n: usize, fname: &str, msg: &str) -> mlua::Error {
    raise_error(lua, format!("bad argument #{n} to '{fname}' ({msg})"))
}

fn check_number(lua: &Lua, args: &MultiValue, i: usize, fname: &str) -> mlua::Result<f64> {
    let v = args.get(i).cloned().unwrap_or(Value::Nil);
    match lua.coerce_number(v.clone())? {
        Some(n) => Ok(n),
        None => Err(arg_error(
            lua,
            i + 1,
            fname,
            &format!("number expected, got {}", got(args, i, fname)),
        )),
    }
}

fn check_bytes(lua: &Lua, args: &MultiValue, i: usize, fname: &str) -> mlua::Result<Vec<u8>> {
    let v = args.get(i).cloned().unwrap_or(Value::Nil);
    match lua.coerce_string(v)? {
        Some(s) => Ok(s.as_bytes().to_vec()),
        None => Err(arg_error(
            lua,
            i + 1,
            fname,
            &format!("string expected, got {}", got(args, i, fname)),
        )),
    }
}

/// The type a check reports. `pack` pushes a nil marker after its arguments, so a missing
/// one reads as "nil" there and as "no value" elsewhere.
fn got(args: &MultiValue, i: usize, fname: &str) -> &'static str {
    match args.get(i) {
        None if fname == "pack" => "nil",
        None => "no value",
        Some(v) => v.type_name(),
    }
}

fn pack(lua: &Lua, args: MultiValue) -> mlua::Result<mlua::LuaString> {
    let fmt = check_bytes(lua, &args, 0, "pack")?;
    let mut f = Fmt { f: &fmt, pos: 0 };
    let mut h = Header {
        big_endian: false,
        align: 1,
    };
    let mut arg = 1;
    let mut out: Vec<u8> = Vec::new();
    while f.pos < f.f.len() {
        let opt = f.f[f.pos];
        f.pos += 1;
        let mut size = f.optsize(lua, opt)?;
        let pad = to_align(out.len(), &h, opt, size);
        out.resize(out.len() + pad, 0);
        match opt {
            b'b' | b'B' | b'h' | b'H' | b'l' | b'L' | b'T' | b'i' | b'I' => {
                let n = check_number(lua, &args, arg, "pack")?;
                arg += 1;
                let mut value: u64 = if n < 0.0 { n as i64 as u64 } else { n as u64 };
                let mut bytes = vec![0u8; size];
                for b in bytes.iter_mut() {
                    *b = value as u8;
                    value >>= 8;
                }
                if h.big_endian {
                    bytes.reverse();
                }
                out.extend_from_slice(&bytes);
            }
            b'x' => out.push(0),
            b'f' => {
                let v = check_number(lua, &args, arg, "pack")? as f32;
                arg += 1;
                out.extend_from_slice(&if h.big_endian {
                    v.to_be_bytes()
                } else {
                    v.to_le_bytes()
                });
            }
            b'd' => {
                let v = check_number(lua, &args, arg, "pack")?;
                arg += 1;
                out.extend_from_slice(&if h.big_endian {
                    v.to_be_bytes()
                } else {
                    v.to_le_bytes()
                });
            }
            b'c' | b's' => {
                let s = check_bytes(lua, &args, arg, "pack")?;
                arg += 1;
                if size == 0 {
                    size = s.len();
                }
                if s.len() < size {
                    // lua-struct reports the argument after the string (its counter moved on).
                    return Err(arg_error(lua, arg + 1, "pack", "string too short"));
                }
                out.extend_from_slice(&s[..size]);
                if opt == b's' {
                    out.push(0);
                }
            }
            other => f.control(lua, other, &mut h, "pack")?,
        }
    }
    lua.create_string(&out)
}

fn get_integer(b: &[u8], big_endian: bool, signed: bool) -> f64 {
    let mut l: u64 = 0;
    if big_endian {
        for &c in b {
            l = (l << 8) | c as u64;
        }
    } else {
        for &c in b.iter().rev() {
            l = (l << 8) | c as u64;
        }
    }
    if !signed {
        return l as f64;
    }
    let shift = (b.len() * 8).saturating_sub(1).min(63) as u32;
    let mask = u64::MAX << shift;
    if l & mask != 0 {
        l |= mask;
    }
    l as i64 as f64
}

fn unpack(lua: &Lua, args: MultiValue) -> mlua::Result<MultiValue> {
    let fmt = check_bytes(lua, &args, 0, "unpack")?;
    let data = check_bytes(lua, &args, 1, "unpack")?;
    let start = match args.get(2) {
        None | Some(Value::Nil) => 1.0,
        Some(_) => check_number(lua, &args, 2, "unpack")?,
    };
    let start = start as i64 - 1;
    if start < 0 || start as usize > data.len() {
        return Err(arg_error(lua, 3, "unpack", "offset must be 1 or greater"));
    }
    let mut pos = start as usize;
    let mut f = Fmt { f: &fmt, pos: 0 };
    let mut h = Header {
        big_endian: false,
        align: 1,
    };
    let mut results: Vec<Value> = Vec::new();
    while f.pos < f.f.len() {
        let opt = f.f[f.pos];
        f.pos += 1;
        let mut size = f.optsize(lua, opt)?;
        pos += to_align(pos, &h, opt, size);
        if pos > data.len() || size > data.len() - pos {
            return Err(arg_error(lua, 2, "unpack", "data string too short"));
        }
        match opt {
            b'b' | b'B' | b'h' | b'H' | b'l' | b'L' | b'T' | b'i' | b'I' => {
                let signed = opt.is_ascii_lowercase();
                results.push(Value::Number(get_integer(
                    &data[pos..pos + size],
                    h.big_endian,
                    signed,
                )));
            }
            b'x' => {}
            b'f' => {
                let mut b = [0u8; 4];
                b.copy_from_slice(&data[pos..pos + 4]);
                let v = if h.big_endian {
                    f32::from_be_bytes(b)
                } else {
                    f32::from_le_bytes(b)
                };
                results.push(Value::Number(v as f64));
            }
            b'd' => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&data[pos..pos + 8]);
                let v = if h.big_endian {
                    f64::from_be_bytes(b)
                } else {
                    f64::from_le_bytes(b)
                };
                results.push(Value::Number(v));
            }
            b'c' => {
                if size == 0 {
                    let prev = results
                        .last()
                        .cloned()
                        .and_then(|v| lua.coerce_number(v).ok().flatten());
                    let Some(n) = prev else {
                        return Err(raise_error(lua, "format 'c0' needs a previous size".into()));
                    };
                    results.pop();
                    size = n as usize;
                    if size > data.len() - pos {
                        return Err(arg_error(lua, 2, "unpack", "data string too short"));
                    }
                }
                results.push(Value::String(lua.create_string(&data[pos..pos + size])?));
            }
            b's' => {
                let Some(z) = data[pos..].iter().position(|&b| b == 0) else {
                    return Err(raise_error(lua, "unfinished string in data".into()));
                };
                results.push(Value::String(lua.create_string(&data[pos..pos + z])?));
                size = z + 1;
            }
            other => f.control(lua, other, &mut h, "unpack")?,
        }
        pos += size;
    }
    results.push(Value::Number((pos + 1) as f64));
    Ok(MultiValue::from_iter(results))
}

fn size(lua: &Lua, args: MultiValue) -> mlua::Result<f64> {
    let fmt = check_bytes(lua, &args, 0, "size")?;
    let mut f = Fmt { f: &fmt, pos: 0 };
    let mut h = Header {
        big_endian: false,
        align: 1,
    };
    let mut pos = 0usize;
    while f.pos < f.f.len() {
        let opt = f.f[f.pos];
        f.pos += 1;
        let size = f.optsize(lua, opt)?;
        pos += to_align(pos, &h, opt, size);
        if opt == b's' {
            return Err(arg_error(lua, 1, "size", "options 's' has no fixed size"));
        }
        if opt == b'c' && size == 0 {
            return Err(arg_error(lua, 1, "size", "options 'c0' has no fixed size"));
        }
        if !opt.is_ascii_alphanumeric() {
            f.control(lua, opt, &mut h, "size")?;
        }
        pos += size;
    }
    Ok(pos as f64)
}

pub fn open(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set("pack", lua.create_function(pack)?)?;
    t.raw_set("unpack", lua.create_function(unpack)?)?;
    t.raw_set("size", lua.create_function(size)?)?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(src: &str) -> Vec<u8> {
        let lua = Lua::new();
        lua.globals().set("struct", open(&lua).unwrap()).unwrap();
        let v: Value = lua.load(src).eval().unwrap();
        lua.coerce_string(v).unwrap().unwrap().as_bytes().to_vec()
    }

    // Packing gives lua-struct's bytes: endianness, widths, alignment, strings.
    #[test]
    fn packs() {
        assert_eq!(eval("return struct.pack('>I2', 1)"), b"\x00\x01");
        assert_eq!(eval("return struct.pack('<i4', -2)"), b"\xfe\xff\xff\xff");
        assert_eq!(
            eval("return struct.pack('!4 b i4', 1, 2)"),
            b"\x01\x00\x00\x00\x02\x00\x00\x00"
        );
        assert_eq!(eval("return struct.pack('s', 'ab')"), b"ab\x00");
        assert_eq!(eval("return struct.pack('c3', 'abcdef')"), b"abc");
        assert_eq!(eval("return struct.pack('>d', 1.5)"), 1.5f64.to_be_bytes());
    }

    // Unpacking reads the values back and returns the next position last.
    #[test]
    fn unpacks() {
        assert_eq!(
            eval("local a, b = struct.unpack('>I2', '\\0\\1') return a .. ',' .. b"),
            b"1,3"
        );
        assert_eq!(
            eval("return (struct.unpack('<i4', struct.pack('<i4', -2)))"),
            b"-2"
        );
        assert_eq!(eval("return (struct.unpack('s', 'hi\\0rest'))"), b"hi");
        assert_eq!(
            eval("return (struct.unpack('b c0', struct.pack('b c0', 3, 'xyz')))"),
            b"xyz"
        );
        assert_eq!(eval("return struct.size('>I2 d')"), b"10");
        assert_eq!(eval("return struct.size('!8 b d')"), b"16");
    }
}
