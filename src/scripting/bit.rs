//! The `bit` library (LuaBitOp 1.0's API, as Redis ships it): 32-bit operations on Lua
//! numbers, results as signed 32-bit numbers.

use mlua::{Lua, MultiValue, Table, Value};

/// LuaBitOp's conversion: round to the nearest integer (ties to even) and keep the low 32
/// bits, by adding 2^52 + 2^51 and reading the low word of the double.
pub fn tobit(n: f64) -> u32 {
    (n + 6_755_399_441_055_744.0).to_bits() as u32
}

fn arg(lua: &Lua, args: &MultiValue, i: usize, name: &str) -> mlua::Result<u32> {
    let v = args.get(i).cloned().unwrap_or(Value::Nil);
    match lua.coerce_number(v.clone())? {
        Some(n) => Ok(tobit(n)),
        None => {
            let got = if i >= args.len() {
                "no value"
            } else {
                v.type_name()
            };
            Err(super::raise_error(
                lua,
                format!(
                    "bad argument #{} to '{name}' (number expected, got {got})",
                    i + 1
                ),
            ))
        }
    }
}

fn out(b: u32) -> f64 {
    b as i32 as f64
}

pub fn open(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    type Unary = fn(u32) -> u32;
    let unary: &[(&str, Unary)] = &[
        ("tobit", |b| b),
        ("bnot", |b| !b),
        ("bswap", |b| b.swap_bytes()),
    ];
    for &(name, f) in unary {
        t.raw_set(
            name,
            lua.create_function(move |lua, args: MultiValue| {
                Ok(out(f(arg(lua, &args, 0, name)?)))
            })?,
        )?;
    }
    type Fold = fn(u32, u32) -> u32;
    let folds: &[(&str, Fold)] = &[
        ("band", |a, b| a & b),
        ("bor", |a, b| a | b),
        ("bxor", |a, b| a ^ b),
    ];
    for &(name, f) in folds {
        t.raw_set(
            name,
            lua.create_function(move |lua, args: MultiValue| {
                let mut acc = arg(lua, &args, 0, name)?;
                for i in 1..args.len() {
                    acc = f(acc, arg(lua, &args, i, name)?);
                }
                Ok(out(acc))
            })?,
        )?;
    }
    type Shift = fn(u32, u32) -> u32;
    let shifts: &[(&str, Shift)] = &[
        ("lshift", |b, n| b << (n & 31)),
        ("rshift", |b, n| b >> (n & 31)),
        ("arshift", |b, n| ((b as i32) >> (n & 31)) as u32),
        ("rol", |b, n| b.rotate_left(n & 31)),
        ("ror", |b, n| b.rotate_right(n & 31)),
    ];
    for &(name, f) in shifts {
        t.raw_set(
            name,
            lua.create_function(move |lua, args: MultiValue| {
                Ok(out(f(arg(lua, &args, 0, name)?, arg(lua, &args, 1, name)?)))
            })?,
        )?;
    }
    t.raw_set(
        "tohex",
        lua.create_function(|lua, args: MultiValue| {
            let mut b = arg(lua, &args, 0, "tohex")?;
            let mut n: i64 = if args.len() < 2 || args[1].is_nil() {
                8
            } else {
                arg(lua, &args, 1, "tohex")? as i32 as i64
            };
            let digits: &[u8; 16] = if n < 0 {
                n = -n;
                b"0123456789ABCDEF"
            } else {
                b"0123456789abcdef"
            };
            let n = n.min(8) as usize;
            let mut buf = vec![0u8; n];
            for slot in buf.iter_mut().rev() {
                *slot = digits[(b & 15) as usize];
                b >>= 4;
            }
            lua.create_string(&buf)
        })?,
    )?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(src: &str) -> String {
        let lua = Lua::new();
        lua.globals().set("bit", open(&lua).unwrap()).unwrap();
        let v: Value = lua.load(src).eval().unwrap();
        lua.coerce_string(v).unwrap().unwrap().to_string_lossy()
    }

    // The operations give LuaBitOp's signed 32-bit results.
    #[test]
    fn ops() {
        assert_eq!(eval("return bit.band(0xff, 0x0f0)"), "240");
        assert_eq!(eval("return bit.bnot(0)"), "-1");
        assert_eq!(eval("return bit.tobit(0xffffffff + 1)"), "0");
        assert_eq!(eval("return bit.lshift(1, 31)"), "-2147483648");
        assert_eq!(eval("return bit.rshift(-1, 28)"), "15");
        assert_eq!(eval("return bit.arshift(-256, 4)"), "-16");
        assert_eq!(eval("return bit.rol(0x12345678, 8)"), "878082066");
        assert_eq!(eval("return bit.bswap(0x12345678)"), "2018915346");
        assert_eq!(eval("return bit.tohex(255)"), "000000ff");
        assert_eq!(eval("return bit.tohex(-1, -4)"), "FFFF");
        assert_eq!(eval("return bit.bxor(5, 3, 1)"), "7");
        assert_eq!(eval("return bit.tobit(2.5)"), "2");
    }
}
