//! Reply encoding for RESP2 and RESP3.

use std::io::Write;

/// The protocol a connection speaks, switched by `HELLO`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Resp2,
    Resp3,
}

thread_local! {
    /// Told about every error reply this thread encodes (the server's `errorstats`).
    static ERROR_HOOK: std::cell::Cell<Option<fn(&str)>> = const { std::cell::Cell::new(None) };
}

/// Makes `hook` see every error reply this thread encodes from now on.
pub fn set_error_hook(hook: fn(&str)) {
    ERROR_HOOK.with(|h| h.set(Some(hook)));
}

/// A reply sink: appends encoded replies to a byte vector.
pub struct ReplyBuf<'a> {
    pub out: &'a mut Vec<u8>,
    pub proto: Proto,
}

impl<'a> ReplyBuf<'a> {
    pub fn new(out: &'a mut Vec<u8>, proto: Proto) -> Self {
        ReplyBuf { out, proto }
    }

    pub fn simple(&mut self, s: &str) {
        self.out.push(b'+');
        self.out.extend_from_slice(s.as_bytes());
        self.out.extend_from_slice(b"\r\n");
    }

    pub fn ok(&mut self) {
        self.out.extend_from_slice(b"+OK\r\n");
    }

    /// `msg` is the whole error line without the leading `-`, e.g.
    /// `ERR syntax error` or `WRONGTYPE ...`. CR/LF are replaced by spaces
    /// as Redis does, so an error can never break the framing.
    pub fn error(&mut self, msg: &str) {
        if let Some(hook) = ERROR_HOOK.with(|h| h.get()) {
            hook(msg);
        }
        self.out.push(b'-');
        for &b in msg.as_bytes() {
            self.out
                .push(if b == b'\r' || b == b'\n' { b' ' } else { b });
        }
        self.out.extend_from_slice(b"\r\n");
    }

    pub fn int(&mut self, v: i64) {
        self.out.push(b':');
        let _ = write!(self.out, "{v}");
        self.out.extend_from_slice(b"\r\n");
    }

    /// Every GET reply goes through here: one reservation, no formatting machinery.
    pub fn bulk(&mut self, b: &[u8]) {
        self.out.reserve(b.len() + BULK_FRAMING_MAX_BYTES);
        self.out.push(b'$');
        push_decimal(self.out, b.len() as u64);
        self.out.extend_from_slice(b"\r\n");
        self.out.extend_from_slice(b);
        self.out.extend_from_slice(b"\r\n");
    }

    pub fn bulk_str(&mut self, s: &str) {
        self.bulk(s.as_bytes());
    }

    /// RESP3 verbatim string (`=`), a bulk string in RESP2 (used by INFO
    /// and CLIENT INFO/LIST as Redis does).
    pub fn verbatim(&mut self, s: &str) {
        match self.proto {
            Proto::Resp2 => self.bulk_str(s),
            Proto::Resp3 => {
                let _ = write!(self.out, "={}\r\ntxt:", s.len() + 4);
                self.out.extend_from_slice(s.as_bytes());
                self.out.extend_from_slice(b"\r\n");
            }
        }
    }

    /// A null value: `$-1` in RESP2, `_` in RESP3.
    pub fn null(&mut self) {
        match self.proto {
            Proto::Resp2 => self.out.extend_from_slice(b"$-1\r\n"),
            Proto::Resp3 => self.out.extend_from_slice(b"_\r\n"),
        }
    }

    /// A null array: `*-1` in RESP2, `_` in RESP3.
    pub fn null_array(&mut self) {
        match self.proto {
            Proto::Resp2 => self.out.extend_from_slice(b"*-1\r\n"),
            Proto::Resp3 => self.out.extend_from_slice(b"_\r\n"),
        }
    }

    pub fn array(&mut self, n: usize) {
        let _ = write!(self.out, "*{n}\r\n");
    }

    /// An out-of-band message of `n` elements (Pub/Sub): `>n` in RESP3, an array in RESP2.
    pub fn push(&mut self, n: usize) {
        match self.proto {
            Proto::Resp2 => self.array(n),
            Proto::Resp3 => {
                let _ = write!(self.out, ">{n}\r\n");
            }
        }
    }

    /// A map of `n` pairs: `%n` in RESP3, a flat array of 2n in RESP2.
    pub fn map(&mut self, n: usize) {
        match self.proto {
            Proto::Resp2 => self.array(n * 2),
            Proto::Resp3 => {
                let _ = write!(self.out, "%{n}\r\n");
            }
        }
    }

    /// A set of `n` elements: `~n` in RESP3, an array in RESP2.
    pub fn set(&mut self, n: usize) {
        match self.proto {
            Proto::Resp2 => self.array(n),
            Proto::Resp3 => {
                let _ = write!(self.out, "~{n}\r\n");
            }
        }
    }

    /// A double: `,` in RESP3, a bulk string in RESP2 (formatted as Redis
    /// formats INCRBYFLOAT results: shortest round-trip representation).
    pub fn double(&mut self, v: f64) {
        let s = format_double(v);
        match self.proto {
            Proto::Resp2 => self.bulk_str(&s),
            Proto::Resp3 => {
                self.out.push(b',');
                self.out.extend_from_slice(s.as_bytes());
                self.out.extend_from_slice(b"\r\n");
            }
        }
    }

    pub fn bool(&mut self, v: bool) {
        match self.proto {
            Proto::Resp2 => self.int(v as i64),
            Proto::Resp3 => self
                .out
                .extend_from_slice(if v { b"#t\r\n" } else { b"#f\r\n" }),
        }
    }
}

/// Bytes a bulk string adds around its payload at most: `$`, 20 digits, two CRLFs.
const BULK_FRAMING_MAX_BYTES: usize = 1 + 20 + 4;

/// Appends `v` in decimal, the digits `write!(out, "{v}")` gives.
fn push_decimal(out: &mut Vec<u8>, v: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = v;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// Formats a float the way Redis replies with INCRBYFLOAT (`%.17Lg` then
/// trimmed): integers have no decimal point, others are shortest round-trip.
pub fn format_double(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if v == v.trunc() && v.abs() < 1e17 {
        return format!("{}", v as i64);
    }
    let s = format!("{v}");
    if s.contains('e') {
        return s;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(proto: Proto, f: impl FnOnce(&mut ReplyBuf)) -> Vec<u8> {
        let mut v = Vec::new();
        f(&mut ReplyBuf::new(&mut v, proto));
        v
    }

    // Each reply type encodes to its exact RESP2 bytes.
    #[test]
    fn resp2_bytes() {
        assert_eq!(enc(Proto::Resp2, |r| r.null()), b"$-1\r\n");
        assert_eq!(enc(Proto::Resp2, |r| r.int(-5)), b":-5\r\n");
        assert_eq!(enc(Proto::Resp2, |r| r.bulk(b"ab")), b"$2\r\nab\r\n");
        assert_eq!(enc(Proto::Resp2, |r| r.map(1)), b"*2\r\n");
        assert_eq!(enc(Proto::Resp2, |r| r.double(3.5)), b"$3\r\n3.5\r\n");
        assert_eq!(
            enc(Proto::Resp2, |r| r.error("ERR a\r\nb")),
            b"-ERR a  b\r\n"
        );
    }

    // The RESP3 forms differ exactly where RESP3 adds types.
    #[test]
    fn resp3_bytes() {
        assert_eq!(enc(Proto::Resp3, |r| r.null()), b"_\r\n");
        assert_eq!(enc(Proto::Resp3, |r| r.map(2)), b"%2\r\n");
        assert_eq!(enc(Proto::Resp3, |r| r.double(10.0)), b",10\r\n");
        assert_eq!(enc(Proto::Resp3, |r| r.verbatim("x")), b"=5\r\ntxt:x\r\n");
    }

    // The bulk header's length digits are exact at the edges of each digit count.
    #[test]
    fn bulk_header_lengths() {
        for len in [0usize, 1, 9, 10, 99, 100, 1024, 65_536, 1_000_000] {
            let payload = vec![b'x'; len];
            let mut want = format!("${len}\r\n").into_bytes();
            want.extend_from_slice(&payload);
            want.extend_from_slice(b"\r\n");
            assert_eq!(enc(Proto::Resp2, |r| r.bulk(&payload)), want);
        }
    }

    proptest::proptest! {
        // push_decimal agrees with Rust's own formatting for every u64.
        #[test]
        fn decimal_matches_format(v: u64) {
            let mut out = b"prefix".to_vec();
            push_decimal(&mut out, v);
            proptest::prop_assert_eq!(out, format!("prefix{v}").into_bytes());
        }
    }

    // Doubles print like Redis's INCRBYFLOAT replies.
    #[test]
    fn double_format() {
        assert_eq!(format_double(10.5), "10.5");
        assert_eq!(format_double(5000.0), "5000");
        assert_eq!(format_double(0.1 + 0.2), "0.30000000000000004");
    }
}
