//! The request parser. See the module essay in `mod.rs`.

/// Redis's `proto-max-bulk-len` default: 512 MiB.
pub const BULK_MAX_BYTES: usize = 512 * 1024 * 1024;
/// Redis accepts at most 1024*1024 arguments in one multibulk (for clients
/// that are not authenticated it is lower; we apply one limit to all).
pub const ARGS_MAX: usize = 1024 * 1024;
/// Longest inline command (and longest `*N`/`$N` line) before the request is
/// rejected: Redis's PROTO_INLINE_MAX_SIZE.
pub const INLINE_MAX_BYTES: usize = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// A malformed frame: the payload is the text after `-ERR Protocol error: `.
    Protocol(&'static str),
    /// `expected '$', got 'X'` carries the offending byte.
    ExpectedDollar(u8),
}

impl ParseError {
    /// The full error line Redis sends before closing the connection.
    pub fn reply_text(&self) -> String {
        match self {
            ParseError::Protocol(msg) => format!("ERR Protocol error: {msg}"),
            ParseError::ExpectedDollar(b) => {
                format!("ERR Protocol error: expected '$', got '{}'", *b as char)
            }
        }
    }
}

/// One complete command: `args[i]` is a range into the parsed buffer, or an
/// owned unescaped argument (inline requests with quotes need unescaping).
#[derive(Debug, Default)]
pub struct ParsedCommand {
    /// Bytes of the buffer this command used, including its terminator.
    pub consumed: usize,
    /// Argument byte ranges `(start, end)` into the input buffer.
    pub ranges: Vec<(usize, usize)>,
    /// Inline arguments that had to be unescaped; when non-empty, these are
    /// the arguments and `ranges` is empty.
    pub owned: Vec<Vec<u8>>,
}

impl ParsedCommand {
    pub fn clear(&mut self) {
        self.consumed = 0;
        self.ranges.clear();
        self.owned.clear();
    }

    pub fn arg_count(&self) -> usize {
        if self.owned.is_empty() {
            self.ranges.len()
        } else {
            self.owned.len()
        }
    }

    /// The arguments as slices into `out`, which must hold exactly `arg_count()`
    /// of them (lets the caller keep short argument lists on the stack).
    pub fn args_into<'a>(&'a self, buf: &'a [u8], out: &mut [&'a [u8]]) {
        assert_eq!(out.len(), self.arg_count(), "argument slots");
        if self.owned.is_empty() {
            for (slot, &(s, e)) in out.iter_mut().zip(&self.ranges) {
                *slot = &buf[s..e];
            }
        } else {
            for (slot, v) in out.iter_mut().zip(&self.owned) {
                *slot = v.as_slice();
            }
        }
    }

    /// The arguments as slices, given the buffer that was parsed.
    pub fn args<'a>(&'a self, buf: &'a [u8], out: &mut Vec<&'a [u8]>) {
        out.clear();
        if self.owned.is_empty() {
            out.extend(self.ranges.iter().map(|&(s, e)| &buf[s..e]));
        } else {
            out.extend(self.owned.iter().map(|v| v.as_slice()));
        }
    }
}

fn find_crlf(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i + 1 < buf.len() {
        match memchr(b'\r', &buf[i..]) {
            Some(p) => {
                let at = i + p;
                if at + 1 < buf.len() && buf[at + 1] == b'\n' {
                    return Some(at);
                }
                i = at + 1;
            }
            None => return None,
        }
    }
    None
}

fn memchr(needle: u8, hay: &[u8]) -> Option<usize> {
    hay.iter().position(|&b| b == needle)
}

/// Parses a decimal i64 the way Redis's `string2ll` does (no spaces, no `+`).
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    let (neg, digits) = if s[0] == b'-' {
        (true, &s[1..])
    } else {
        (false, s)
    };
    if digits.is_empty() || (digits[0] == b'0' && digits.len() > 1) {
        return None;
    }
    let mut v: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        let dv = (d - b'0') as i64;
        v = if neg {
            v.checked_mul(10)?.checked_sub(dv)?
        } else {
            v.checked_mul(10)?.checked_add(dv)?
        };
    }
    if neg && digits == b"0" {
        return None;
    }
    Some(v)
}

/// Parses one command from the front of `buf` into `out`.
///
/// `Ok(None)`: incomplete, call again with more bytes. `Ok(Some(()))` with
/// `out.consumed == n` and zero arguments: an empty frame (`*0`, `*-1`, blank
/// inline line) that Redis silently skips. `bulk_max` is the bulk length
/// limit in force (`proto-max-bulk-len`).
pub fn parse_command(
    buf: &[u8],
    out: &mut ParsedCommand,
    bulk_max: usize,
) -> Result<Option<()>, ParseError> {
    out.clear();
    if buf.is_empty() {
        return Ok(None);
    }
    if buf[0] == b'*' {
        parse_multibulk(buf, out, bulk_max)
    } else {
        parse_inline(buf, out)
    }
}

/// Longest run of digits `plain_decimal_line` takes: any 18-digit number fits an i64.
const PLAIN_DECIMAL_DIGITS_MAX: usize = 18;

/// The common case of a length line, `<digits>\r\n` at `from`, read in one pass:
/// `Some((value, eol))` exactly when `find_crlf` would find that CRLF at `eol` and
/// `parse_i64` would accept the digits (no sign, no leading zero, at most 18 digits).
/// Anything else is `None`, and the caller's general path decides.
fn plain_decimal_line(buf: &[u8], from: usize) -> Option<(i64, usize)> {
    let mut value: i64 = 0;
    let mut at = from;
    while at < buf.len() && at - from < PLAIN_DECIMAL_DIGITS_MAX && buf[at].is_ascii_digit() {
        value = value * 10 + i64::from(buf[at] - b'0');
        at += 1;
    }
    let digits = at - from;
    if digits == 0 || (digits > 1 && buf[from] == b'0') {
        return None;
    }
    (buf.get(at..at + 2) == Some(b"\r\n")).then_some((value, at))
}

/// A length line at `from`: its value as `parse_i64` reads it, and where its CRLF is;
/// `None` while the CRLF has not arrived.
fn length_line(buf: &[u8], from: usize) -> Option<(Option<i64>, usize)> {
    if let Some((value, eol)) = plain_decimal_line(buf, from) {
        return Some((Some(value), eol));
    }
    let eol = find_crlf(buf, from)?;
    Some((parse_i64(&buf[from..eol]), eol))
}

fn parse_multibulk(
    buf: &[u8],
    out: &mut ParsedCommand,
    bulk_max: usize,
) -> Result<Option<()>, ParseError> {
    let Some((count, eol)) = length_line(buf, 1) else {
        if buf.len() > INLINE_MAX_BYTES {
            return Err(ParseError::Protocol("too big mbulk count string"));
        }
        return Ok(None);
    };
    let count = match count {
        Some(n) if n <= ARGS_MAX as i64 => n,
        _ => return Err(ParseError::Protocol("invalid multibulk length")),
    };
    let mut pos = eol + 2;
    if count <= 0 {
        out.consumed = pos;
        return Ok(Some(()));
    }
    for _ in 0..count {
        if pos >= buf.len() {
            return Ok(None);
        }
        if buf[pos] != b'$' {
            return Err(ParseError::ExpectedDollar(buf[pos]));
        }
        let Some((len, eol)) = length_line(buf, pos + 1) else {
            if buf.len() - pos > INLINE_MAX_BYTES {
                return Err(ParseError::Protocol("too big bulk count string"));
            }
            return Ok(None);
        };
        let len = match len {
            Some(n) if n >= 0 && (n as u64) <= bulk_max as u64 => n as usize,
            _ => return Err(ParseError::Protocol("invalid bulk length")),
        };
        let start = eol + 2;
        let end = start + len;
        if buf.len() < end + 2 {
            return Ok(None);
        }
        // Redis does not check the two bytes after a bulk payload; neither do
        // we, so clients that send exactly what Redis accepts keep working.
        out.ranges.push((start, end));
        pos = end + 2;
    }
    out.consumed = pos;
    Ok(Some(()))
}

fn parse_inline(buf: &[u8], out: &mut ParsedCommand) -> Result<Option<()>, ParseError> {
    let Some(nl) = memchr(b'\n', buf) else {
        if buf.len() > INLINE_MAX_BYTES {
            return Err(ParseError::Protocol("too big inline request"));
        }
        return Ok(None);
    };
    let mut line = &buf[..nl];
    if line.last() == Some(&b'\r') {
        line = &line[..line.len() - 1];
    }
    out.consumed = nl + 1;
    match split_args(line) {
        Some(args) => {
            out.owned = args;
            Ok(Some(()))
        }
        None => Err(ParseError::Protocol("unbalanced quotes in request")),
    }
}

fn hex_val(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|v| v as u8)
}

/// Splits an inline line like Redis's `sdssplitargs`: whitespace separates,
/// double quotes allow `\n`, `\xHH` escapes, single quotes allow `\'`.
/// A closing quote must be followed by a space or the end. `None` on
/// unbalanced quotes.
pub fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut args = Vec::new();
    let mut i = 0;
    loop {
        while i < line.len() && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= line.len() {
            return Some(args);
        }
        let mut cur = Vec::new();
        let (mut in_dq, mut in_sq) = (false, false);
        loop {
            if in_dq {
                if i >= line.len() {
                    return None;
                }
                let c = line[i];
                if c == b'\\' && i + 3 < line.len() && line[i + 1] == b'x' {
                    if let (Some(h), Some(l)) = (hex_val(line[i + 2]), hex_val(line[i + 3])) {
                        cur.push(h * 16 + l);
                        i += 4;
                        continue;
                    }
                }
                if c == b'\\' && i + 1 < line.len() {
                    let e = match line[i + 1] {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 8,
                        b'a' => 7,
                        other => other,
                    };
                    cur.push(e);
                    i += 2;
                    continue;
                }
                if c == b'"' {
                    if i + 1 < line.len() && !line[i + 1].is_ascii_whitespace() {
                        return None;
                    }
                    in_dq = false;
                    i += 1;
                    break;
                }
                cur.push(c);
                i += 1;
            } else if in_sq {
                if i >= line.len() {
                    return None;
                }
                let c = line[i];
                if c == b'\\' && i + 1 < line.len() && line[i + 1] == b'\'' {
                    cur.push(b'\'');
                    i += 2;
                    continue;
                }
                if c == b'\'' {
                    if i + 1 < line.len() && !line[i + 1].is_ascii_whitespace() {
                        return None;
                    }
                    in_sq = false;
                    i += 1;
                    break;
                }
                cur.push(c);
                i += 1;
            } else {
                if i >= line.len() || line[i].is_ascii_whitespace() {
                    break;
                }
                match line[i] {
                    b'"' => in_dq = true,
                    b'\'' => in_sq = true,
                    c => cur.push(c),
                }
                i += 1;
            }
        }
        let _ = (in_dq, in_sq);
        args.push(cur);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Parsed = Option<(usize, Vec<Vec<u8>>)>;

    fn args_of(buf: &[u8]) -> Result<Parsed, ParseError> {
        let mut pc = ParsedCommand::default();
        match parse_command(buf, &mut pc, BULK_MAX_BYTES)? {
            None => Ok(None),
            Some(()) => {
                let mut v = Vec::new();
                pc.args(buf, &mut v);
                Ok(Some((pc.consumed, v.iter().map(|a| a.to_vec()).collect())))
            }
        }
    }

    // A known multibulk literal parses into its arguments and consumes it all.
    #[test]
    fn multibulk_known_bytes() {
        let b = b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\nEXTRA";
        let (n, a) = args_of(b).unwrap().unwrap();
        assert_eq!(n, b.len() - 5);
        assert_eq!(a, vec![b"GET".to_vec(), b"key".to_vec()]);
    }

    // Every strict prefix of a valid frame is "incomplete", never an error.
    #[test]
    fn truncated_is_incomplete() {
        let b = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n";
        for cut in 0..b.len() {
            assert_eq!(args_of(&b[..cut]).unwrap().map(|x| x.0), None, "cut {cut}");
        }
        assert!(args_of(b).unwrap().is_some());
    }

    // Malformed frames produce Redis's exact error texts.
    #[test]
    fn malformed_frames() {
        let e = |b: &[u8]| args_of(b).unwrap_err().reply_text();
        assert_eq!(e(b"*x\r\n"), "ERR Protocol error: invalid multibulk length");
        assert_eq!(
            e(b"*1\r\n+a\r\n"),
            "ERR Protocol error: expected '$', got '+'"
        );
        assert_eq!(
            e(b"*1\r\n$-5\r\n"),
            "ERR Protocol error: invalid bulk length"
        );
        assert_eq!(
            e(b"*1\r\n$536870913\r\n"),
            "ERR Protocol error: invalid bulk length"
        );
        assert_eq!(
            e(b"*2000000\r\n"),
            "ERR Protocol error: invalid multibulk length"
        );
        assert_eq!(
            e(b"SET \"a b\r\n"),
            "ERR Protocol error: unbalanced quotes in request"
        );
        let big = vec![b'a'; INLINE_MAX_BYTES + 1];
        assert_eq!(e(&big), "ERR Protocol error: too big inline request");
    }

    // Inline commands split on whitespace and honour quotes and escapes.
    #[test]
    fn inline_commands() {
        let (n, a) = args_of(b"set k \"a\\x41\\n\" 'it\\'s'\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(n, 25);
        assert_eq!(
            a,
            vec![
                b"set".to_vec(),
                b"k".to_vec(),
                b"aA\n".to_vec(),
                b"it's".to_vec()
            ]
        );
        assert_eq!(args_of(b"\r\n").unwrap().unwrap().1.len(), 0);
        assert_eq!(
            args_of(b"PING\n").unwrap().unwrap().1,
            vec![b"PING".to_vec()]
        );
    }

    // Empty multibulk frames are consumed with no arguments, as Redis skips them.
    #[test]
    fn empty_multibulk_skipped() {
        assert_eq!(args_of(b"*0\r\n").unwrap().unwrap(), (4, vec![]));
        assert_eq!(args_of(b"*-1\r\n").unwrap().unwrap(), (5, vec![]));
    }

    // Integers parse like Redis's string2ll: strict, no leading zeros or '+'.
    #[test]
    fn integer_parsing() {
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"9223372036854775808"), None);
        assert_eq!(parse_i64(b"01"), None);
        assert_eq!(parse_i64(b"+1"), None);
        assert_eq!(parse_i64(b"-0"), None);
        assert_eq!(parse_i64(b""), None);
        assert_eq!(parse_i64(b" 1"), None);
    }

    proptest::proptest! {
        // Any argument list encoded as multibulk parses back to itself.
        #[test]
        fn multibulk_roundtrip(args in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..40), 1..8)) {
            let mut b = format!("*{}\r\n", args.len()).into_bytes();
            for a in &args {
                b.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                b.extend_from_slice(a);
                b.extend_from_slice(b"\r\n");
            }
            let (n, got) = args_of(&b).unwrap().unwrap();
            proptest::prop_assert_eq!(n, b.len());
            proptest::prop_assert_eq!(got, args);
        }

        // The one-pass length reader agrees with find_crlf + parse_i64 on any bytes.
        #[test]
        fn plain_decimal_agrees_with_general_path(b in proptest::collection::vec(proptest::sample::select(b"0123456789\r\n-+x".to_vec()), 0..30)) {
            if let Some((value, eol)) = plain_decimal_line(&b, 0) {
                proptest::prop_assert_eq!(find_crlf(&b, 0), Some(eol));
                proptest::prop_assert_eq!(parse_i64(&b[..eol]), Some(value));
            }
        }

        // Arbitrary bytes never panic the parser.
        #[test]
        fn arbitrary_bytes_no_panic(b in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let _ = args_of(&b);
        }
    }
}
