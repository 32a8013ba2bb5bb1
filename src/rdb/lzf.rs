//! LZF, the compression of RDB strings (Redis vendors liblzf 3.6). `decompress` accepts
//! any valid stream; `compress` follows liblzf's `lzf_compress` in Redis's configuration
//! (HLOG 16, VERY_FAST, hash slots as offsets, starting from an empty table) step by step,
//! so DUMP output is byte-identical to Redis's for the same string.

const HASH_LOG: u32 = 16;
const HASH_SIZE: usize = 1 << HASH_LOG;
/// A literal run carries at most 32 bytes.
const LITERAL_RUN_MAX: usize = 1 << 5;
/// A back reference reaches at most 8 KiB back.
const OFFSET_MAX: usize = 1 << 13;
/// A back reference copies at most 264 + 2 bytes.
const REFERENCE_MAX: usize = (1 << 8) + (1 << 3);

fn first(b: &[u8], at: usize) -> u32 {
    (u32::from(b[at]) << 8) | u32::from(b[at + 1])
}

fn next(h: u32, b: &[u8], at: usize) -> u32 {
    (h << 8) | u32::from(b[at + 2])
}

fn slot(h: u32) -> usize {
    ((h >> (3 * 8 - HASH_LOG)).wrapping_sub(h.wrapping_mul(5)) as usize) & (HASH_SIZE - 1)
}

/// Compresses `input` into at most `out_max` bytes; `None` when it does not fit (Redis then
/// stores the string verbatim). Redis calls it with `out_max = len - 4`.
pub fn compress(input: &[u8], out_max: usize) -> Option<Vec<u8>> {
    let n = input.len();
    if n < 3 || out_max == 0 {
        // Redis never compresses strings this short (it needs more than 20 bytes).
        return None;
    }
    // Slot value 0 means "empty": position 0 is never a usable reference (`ref > in_data`).
    let mut table = vec![0u32; HASH_SIZE];
    let mut out = vec![0u8; out_max + 4];
    let (mut ip, mut op, mut lit) = (0usize, 1usize, 0usize);
    let mut h = first(input, 0);
    while ip + 2 < n {
        h = next(h, input, ip);
        let s = slot(h);
        let reference = table[s] as usize;
        table[s] = ip as u32;
        let off = ip.wrapping_sub(reference).wrapping_sub(1);
        if reference < ip
            && off < OFFSET_MAX
            && reference > 0
            && input[reference + 2] == input[ip + 2]
            && input[reference..reference + 2] == input[ip..ip + 2]
        {
            let mut len = 2usize;
            let maxlen = (n - ip - len).min(REFERENCE_MAX);
            if op + 4 >= out_max && op - usize::from(lit == 0) + 4 >= out_max {
                return None;
            }
            out[op - lit - 1] = (lit as u8).wrapping_sub(1);
            op -= usize::from(lit == 0);
            len = match_length(input, reference, ip, len, maxlen);
            len -= 2;
            ip += 1;
            if len < 7 {
                out[op] = ((off >> 8) + (len << 5)) as u8;
                op += 1;
            } else {
                out[op] = ((off >> 8) + (7 << 5)) as u8;
                out[op + 1] = (len - 7) as u8;
                op += 2;
            }
            out[op] = off as u8;
            op += 1;
            lit = 0;
            op += 1;
            ip += len + 1;
            if ip + 2 >= n {
                break;
            }
            ip -= 2;
            h = first(input, ip);
            for _ in 0..2 {
                h = next(h, input, ip);
                table[slot(h)] = ip as u32;
                ip += 1;
            }
        } else {
            if op >= out_max {
                return None;
            }
            out[op] = input[ip];
            (lit, op, ip) = (lit + 1, op + 1, ip + 1);
            if lit == LITERAL_RUN_MAX {
                out[op - lit - 1] = (lit - 1) as u8;
                lit = 0;
                op += 1;
            }
        }
    }
    if op + 3 > out_max {
        return None;
    }
    while ip < n {
        out[op] = input[ip];
        (lit, op, ip) = (lit + 1, op + 1, ip + 1);
        if lit == LITERAL_RUN_MAX {
            out[op - lit - 1] = (lit - 1) as u8;
            lit = 0;
            op += 1;
        }
    }
    out[op - lit - 1] = (lit as u8).wrapping_sub(1);
    op -= usize::from(lit == 0);
    out.truncate(op);
    Some(out)
}

/// liblzf's match extension: 16 unchecked steps when far from the end, then step by step
/// up to `maxlen`; returns the index of the first byte past the match.
fn match_length(b: &[u8], reference: usize, ip: usize, mut len: usize, maxlen: usize) -> usize {
    if maxlen > 16 {
        for _ in 0..16 {
            len += 1;
            if b[reference + len] != b[ip + len] {
                return len;
            }
        }
    }
    loop {
        len += 1;
        if !(len < maxlen && b[reference + len] == b[ip + len]) {
            return len;
        }
    }
}

/// Decompresses `input` that must expand to exactly `expected_len` bytes.
pub fn decompress(input: &[u8], expected_len: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(expected_len);
    let mut ip = 0;
    while ip < input.len() {
        let ctrl = usize::from(input[ip]);
        ip += 1;
        if ctrl < 32 {
            let run = ctrl + 1;
            let lits = input.get(ip..ip + run)?;
            if out.len() + run > expected_len {
                return None;
            }
            out.extend_from_slice(lits);
            ip += run;
        } else {
            let mut len = ctrl >> 5;
            if len == 7 {
                len += usize::from(*input.get(ip)?);
                ip += 1;
            }
            let back = ((ctrl & 0x1f) << 8) + usize::from(*input.get(ip)?) + 1;
            ip += 1;
            len += 2;
            if back > out.len() || out.len() + len > expected_len {
                return None;
            }
            let start = out.len() - back;
            for i in 0..len {
                out.push(out[start + i]);
            }
        }
    }
    (out.len() == expected_len).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // 53 'a's compress to the bytes Redis 7.0.15's DUMP carries for them.
    #[test]
    fn compress_matches_redis() {
        let s = [b'a'; 53];
        let c = compress(&s, s.len() - 4).unwrap();
        assert_eq!(c, b"\x01aa\xe0(\x00\x01aa");
        assert_eq!(decompress(&c, 53).unwrap(), s);
    }

    // Incompressible input does not fit in len - 4 bytes.
    #[test]
    fn incompressible_is_none() {
        let s: Vec<u8> = (0..40u8).collect();
        assert_eq!(compress(&s, s.len() - 4), None);
    }

    // A reference before the start, a short stream or a wrong length is rejected.
    #[test]
    fn decompress_rejects_malformed() {
        assert_eq!(decompress(b"\x20\x05", 3), None);
        assert_eq!(decompress(b"\x05ab", 6), None);
        assert_eq!(decompress(b"\x01ab", 3), None);
        assert_eq!(decompress(b"\x01ab\x20", 4), None);
    }

    proptest! {
        // Whatever compresses decompresses to the input.
        #[test]
        fn round_trip(s in proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), any::<u8>()], 21..3000)) {
            if let Some(c) = compress(&s, s.len() - 4) {
                prop_assert!(c.len() <= s.len() - 4);
                prop_assert_eq!(decompress(&c, s.len()), Some(s));
            }
        }
    }
}
