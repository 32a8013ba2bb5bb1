//! RESP request encoding and a reply scanner (sans-IO).
//!
//! The load generator never needs reply contents, only where each reply ends and whether
//! it was nil (a miss), an error, or a value. [`scan_reply`] finds that without allocating;
//! an incomplete reply is `Ok(None)`, not an error. Requests are compiled once into byte
//! segments with holes for the key, so encoding a request is a few `extend_from_slice`s.

/// What kind of reply arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyKind {
    /// Null bulk string, null array or RESP3 null: a miss for reads.
    Nil,
    /// `-ERR ...` or a RESP3 blob error.
    Error,
    /// Anything else.
    Value,
}

#[derive(Debug, PartialEq, Eq)]
pub struct ProtocolError(pub String);

/// Largest aggregate we accept; a peer announcing more is broken or hostile.
const AGGREGATE_LEN_MAX: i64 = 1 << 32;

fn parse_len(line: &[u8]) -> Result<i64, ProtocolError> {
    let text = std::str::from_utf8(line).map_err(|_| ProtocolError("non-ASCII length".into()))?;
    let n: i64 = text
        .parse()
        .map_err(|_| ProtocolError(format!("bad length '{text}'")))?;
    if !(-1..=AGGREGATE_LEN_MAX).contains(&n) {
        return Err(ProtocolError(format!("length out of range: {n}")));
    }
    Ok(n)
}

/// Scan one complete reply at the start of `buf`. Returns its length in bytes and kind,
/// `Ok(None)` if more bytes are needed, or an error on malformed input.
pub fn scan_reply(buf: &[u8]) -> Result<Option<(usize, ReplyKind)>, ProtocolError> {
    let mut pos = 0usize;
    // Replies still to scan: the top one plus announced aggregate elements.
    let mut pending: u64 = 1;
    let mut top: Option<ReplyKind> = None;
    while pending > 0 {
        let Some(nl) = buf[pos..].iter().position(|&b| b == b'\n') else {
            return Ok(None);
        };
        if nl < 2 || buf[pos + nl - 1] != b'\r' {
            return Err(ProtocolError("line without CRLF or type".into()));
        }
        let kind_byte = buf[pos];
        let line = &buf[pos + 1..pos + nl - 1];
        pos += nl + 1;
        pending -= 1;
        let kind = match kind_byte {
            b'+' | b':' | b',' | b'#' | b'(' => ReplyKind::Value,
            b'-' => ReplyKind::Error,
            b'_' => ReplyKind::Nil,
            b'$' | b'=' | b'!' => {
                let n = parse_len(line)?;
                if n < 0 {
                    ReplyKind::Nil
                } else {
                    let end = pos + n as usize;
                    if buf.len() < end + 2 {
                        return Ok(None);
                    }
                    if &buf[end..end + 2] != b"\r\n" {
                        return Err(ProtocolError("bulk string not followed by CRLF".into()));
                    }
                    pos = end + 2;
                    if kind_byte == b'!' {
                        ReplyKind::Error
                    } else {
                        ReplyKind::Value
                    }
                }
            }
            b'*' | b'~' | b'>' | b'%' | b'|' => {
                let n = parse_len(line)?;
                if n < 0 {
                    ReplyKind::Nil
                } else {
                    let per_entry = if matches!(kind_byte, b'%' | b'|') {
                        2
                    } else {
                        1
                    };
                    pending += n as u64 * per_entry;
                    // An attribute precedes the real reply, which is still to come.
                    if kind_byte == b'|' {
                        pending += 1;
                        continue;
                    }
                    ReplyKind::Value
                }
            }
            other => {
                return Err(ProtocolError(format!(
                    "unknown reply type byte 0x{other:02x}"
                )));
            }
        };
        top.get_or_insert(kind);
    }
    Ok(Some((pos, top.unwrap_or(ReplyKind::Value))))
}

/// Append a RESP array of bulk strings (used for one-off commands like DBSIZE).
pub fn encode_command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    /// Pre-encoded bytes (array header, literal arguments, the whole data argument).
    Bytes(Vec<u8>),
    /// The key: `$len\r\n<prefix><number>\r\n`, filled per request.
    Key,
    /// `__rand__`: a random decimal number (no prefix), fresh for every request.
    Rand,
}

/// A request shape compiled once, e.g. `SET __key__ __data__`.
#[derive(Clone, Debug)]
pub struct RequestTemplate {
    segments: Vec<Segment>,
    uses_key: bool,
    /// Commands in one request (`;` separates them): replies to wait for.
    commands: u32,
}

impl RequestTemplate {
    /// `__key__` and `__data__` must be whole arguments, as in memtier. `__rand__` (not a
    /// memtier placeholder) becomes a random number per request, e.g. a new PFADD element.
    /// A `;` argument (not memtier's) ends one command and starts the next: the request is
    /// all of them, sent back to back, and it is answered once the last one's reply has
    /// arrived (`MULTI ; SET __key__ __data__ ; EXEC` is one request of three commands).
    pub fn compile(args: &[String], data: &[u8]) -> Self {
        let mut segments = Vec::new();
        let mut bytes = Vec::new();
        let mut uses_key = false;
        let groups: Vec<&[String]> = args.split(|a| a == ";").filter(|g| !g.is_empty()).collect();
        let commands = groups.len().max(1) as u32;
        for group in &groups {
            write_len(&mut bytes, b'*', group.len());
            for arg in group.iter() {
                match arg.as_str() {
                    "__key__" => {
                        segments.push(Segment::Bytes(std::mem::take(&mut bytes)));
                        segments.push(Segment::Key);
                        uses_key = true;
                    }
                    "__rand__" => {
                        segments.push(Segment::Bytes(std::mem::take(&mut bytes)));
                        segments.push(Segment::Rand);
                    }
                    "__data__" => encode_bulk(&mut bytes, data),
                    literal => encode_bulk(&mut bytes, literal.as_bytes()),
                }
            }
        }
        if groups.is_empty() {
            write_len(&mut bytes, b'*', 0);
        }
        segments.push(Segment::Bytes(bytes));
        segments.retain(|s| !matches!(s, Segment::Bytes(b) if b.is_empty()));
        Self {
            segments,
            uses_key,
            commands,
        }
    }

    pub fn uses_key(&self) -> bool {
        self.uses_key
    }

    /// Commands (and so replies) per request: 1 unless the template has `;`.
    pub fn commands(&self) -> u32 {
        self.commands
    }

    /// Append one request for key number `key` to `out`; returns the bytes appended.
    /// Every `__key__` gets the same key (memtier's behaviour); `__rand__` gets 0.
    #[cfg(test)]
    pub fn encode(&self, out: &mut Vec<u8>, prefix: &[u8], key: u64) -> usize {
        self.encode_with(out, prefix, || key, || 0)
    }

    /// Append one request, taking each `__key__`'s number from `next_key` (called once per
    /// placeholder, in argument order) and each `__rand__` from `next_rand`.
    pub fn encode_with(
        &self,
        out: &mut Vec<u8>,
        prefix: &[u8],
        mut next_key: impl FnMut() -> u64,
        mut next_rand: impl FnMut() -> u64,
    ) -> usize {
        let before = out.len();
        for s in &self.segments {
            let mut digits = [0u8; 20];
            match s {
                Segment::Bytes(b) => out.extend_from_slice(b),
                Segment::Key => {
                    let number = format_u64(next_key(), &mut digits);
                    write_len(out, b'$', prefix.len() + number.len());
                    out.extend_from_slice(prefix);
                    out.extend_from_slice(number);
                    out.extend_from_slice(b"\r\n");
                }
                Segment::Rand => {
                    let number = format_u64(next_rand(), &mut digits);
                    write_len(out, b'$', number.len());
                    out.extend_from_slice(number);
                    out.extend_from_slice(b"\r\n");
                }
            }
        }
        out.len() - before
    }
}

fn encode_bulk(out: &mut Vec<u8>, arg: &[u8]) {
    write_len(out, b'$', arg.len());
    out.extend_from_slice(arg);
    out.extend_from_slice(b"\r\n");
}

fn write_len(out: &mut Vec<u8>, kind: u8, len: usize) {
    let mut digits = [0u8; 20];
    out.push(kind);
    out.extend_from_slice(format_u64(len as u64, &mut digits));
    out.extend_from_slice(b"\r\n");
}

/// Decimal digits of `n` without allocating (this is on the hot path).
fn format_u64(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| a.to_string()).collect()
    }

    // Proves a SET template encodes to the exact RESP bytes redis-cli would send.
    #[test]
    fn encodes_set_exactly() {
        let t = RequestTemplate::compile(&strings(&["SET", "__key__", "__data__"]), b"xyz");
        let mut out = Vec::new();
        let n = t.encode(&mut out, b"memtier-", 42);
        let want = b"*3\r\n$3\r\nSET\r\n$10\r\nmemtier-42\r\n$3\r\nxyz\r\n";
        assert_eq!(out, want);
        assert_eq!(n, want.len());
        assert!(t.uses_key());
    }

    // Proves encode_with draws one key per __key__ in order and a number per __rand__,
    // while encode repeats the one key as memtier does.
    #[test]
    fn encodes_distinct_keys_and_rand() {
        let t =
            RequestTemplate::compile(&strings(&["MGET", "__key__", "__key__", "__rand__"]), b"");
        let mut out = Vec::new();
        let mut next = 6;
        let n = t.encode_with(
            &mut out,
            b"k",
            || {
                next += 1;
                next
            },
            || 99,
        );
        let want = b"*4\r\n$4\r\nMGET\r\n$2\r\nk7\r\n$2\r\nk8\r\n$2\r\n99\r\n";
        assert_eq!(out, want);
        assert_eq!(n, want.len());
        out.clear();
        t.encode(&mut out, b"k", 5);
        assert_eq!(
            out,
            b"*4\r\n$4\r\nMGET\r\n$2\r\nk5\r\n$2\r\nk5\r\n$1\r\n0\r\n"
        );
    }

    // Proves `;` splits a template into back-to-back commands of one request, each with
    // its own array header, keys drawn in order, and commands() counting them.
    #[test]
    fn encodes_a_transaction_as_one_request() {
        let t = RequestTemplate::compile(
            &strings(&[
                "MULTI", ";", "SET", "__key__", "__data__", ";", "INCR", "__key__", ";", "EXEC",
            ]),
            b"v",
        );
        assert_eq!(t.commands(), 4);
        let mut out = Vec::new();
        let mut next = 0;
        t.encode_with(
            &mut out,
            b"k",
            || {
                next += 1;
                next
            },
            || 0,
        );
        let want: &[u8] = b"*1\r\n$5\r\nMULTI\r\n*3\r\n$3\r\nSET\r\n$2\r\nk1\r\n$1\r\nv\r\n\
*2\r\n$4\r\nINCR\r\n$2\r\nk2\r\n*1\r\n$4\r\nEXEC\r\n";
        assert_eq!(out, want);
        assert_eq!(
            RequestTemplate::compile(&strings(&["GET", "__key__"]), b"").commands(),
            1
        );
    }

    // Proves key 0 and u64::MAX are formatted correctly.
    #[test]
    fn encodes_extreme_keys() {
        let t = RequestTemplate::compile(&strings(&["GET", "__key__"]), b"");
        let mut out = Vec::new();
        t.encode(&mut out, b"", 0);
        assert_eq!(out, b"*2\r\n$3\r\nGET\r\n$1\r\n0\r\n");
        out.clear();
        t.encode(&mut out, b"k", u64::MAX);
        assert_eq!(out, b"*2\r\n$3\r\nGET\r\n$21\r\nk18446744073709551615\r\n");
    }

    // Proves the scanner classifies each RESP2/RESP3 reply type and measures its length.
    #[test]
    fn scans_known_replies() {
        let cases: &[(&[u8], ReplyKind)] = &[
            (b"+OK\r\n", ReplyKind::Value),
            (b"-ERR wrong\r\n", ReplyKind::Error),
            (b":1000\r\n", ReplyKind::Value),
            (b"$-1\r\n", ReplyKind::Nil),
            (b"$5\r\nhe\r\nl\r\n", ReplyKind::Value),
            (b"$0\r\n\r\n", ReplyKind::Value),
            (b"*-1\r\n", ReplyKind::Nil),
            (b"*2\r\n$1\r\na\r\n*1\r\n:1\r\n", ReplyKind::Value),
            (b"_\r\n", ReplyKind::Nil),
            (b"%1\r\n+k\r\n$1\r\nv\r\n", ReplyKind::Value),
            (b"!3\r\nbad\r\n", ReplyKind::Error),
            (b"|1\r\n+a\r\n+b\r\n:7\r\n", ReplyKind::Value),
        ];
        for (bytes, kind) in cases {
            let mut buf = bytes.to_vec();
            buf.extend_from_slice(b"+NEXT\r\n");
            assert_eq!(
                scan_reply(&buf),
                Ok(Some((bytes.len(), *kind))),
                "{bytes:?}"
            );
        }
    }

    // Proves every strict prefix of a valid reply is "need more", never an error or a reply.
    #[test]
    fn truncated_is_incomplete() {
        let full = b"*3\r\n$3\r\nfoo\r\n$-1\r\n:12\r\n";
        for cut in 0..full.len() {
            assert_eq!(scan_reply(&full[..cut]), Ok(None), "cut at {cut}");
        }
        assert_eq!(scan_reply(full), Ok(Some((full.len(), ReplyKind::Value))));
    }

    // Proves malformed input is an error rather than a hang or a panic.
    #[test]
    fn malformed_is_error() {
        for bad in [
            &b"?what\r\n"[..],
            b"$abc\r\n",
            b"$3\r\nabcd\r\n",
            b"*-5\r\n",
            b"+OK\n",
            b"\r\n",
        ] {
            assert!(scan_reply(bad).is_err(), "{bad:?}");
        }
    }
}
