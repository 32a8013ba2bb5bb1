//! `long double` arithmetic the way Redis does it (INCRBYFLOAT, HINCRBYFLOAT): parse with
//! `strtold`, add in extended precision, format with `%.17Lf` and trailing zeros dropped.
//! Rust has no `long double`, so a small C file does the arithmetic.

use std::os::raw::{c_char, c_int};

extern "C" {
    fn lavik_ld_incr(
        old: *const c_char,
        old_len: usize,
        incr: *const c_char,
        incr_len: usize,
        out: *mut c_char,
        cap: usize,
    ) -> c_int;
    fn lavik_ld_check(s: *const c_char, len: usize) -> c_int;
}

/// Whether `s` parses as Redis's `string2ld` accepts it: `Some(true)` finite,
/// `Some(false)` an infinity, `None` not a valid float.
pub fn check(s: &[u8]) -> Option<bool> {
    // SAFETY: `s` is a live buffer of `s.len()` bytes; the C side only reads it.
    match unsafe { lavik_ld_check(s.as_ptr().cast(), s.len()) } {
        1 => Some(true),
        0 => Some(false),
        _ => None,
    }
}

/// Output buffer for a formatted result (Redis's `MAX_LONG_DOUBLE_CHARS`).
const OUT_CAP_BYTES: usize = 5 * 1024;

#[derive(Debug, PartialEq, Eq)]
pub enum IncrError {
    /// The stored value or the increment is not a valid float.
    NotAFloat,
    /// The sum is NaN or infinite.
    NanOrInfinity,
    /// The formatted sum would not fit Redis's buffer.
    TooLong,
}

/// `old` (or 0 when the key is missing) plus `incr`, formatted as Redis replies it.
pub fn incr(old: Option<&[u8]>, incr: &[u8]) -> Result<String, IncrError> {
    let mut out = vec![0u8; OUT_CAP_BYTES];
    let (old_ptr, old_len) = match old {
        Some(o) => (o.as_ptr().cast::<c_char>(), o.len()),
        None => (std::ptr::null(), 0),
    };
    // SAFETY: every pointer names a live buffer of the length passed with it (or is null
    // with length 0 for `old`); the C side writes at most `cap` bytes into `out` and
    // keeps no pointer after returning.
    let n = unsafe {
        lavik_ld_incr(
            old_ptr,
            old_len,
            incr.as_ptr().cast(),
            incr.len(),
            out.as_mut_ptr().cast(),
            out.len(),
        )
    };
    match n {
        -1 => Err(IncrError::NotAFloat),
        -2 => Err(IncrError::NanOrInfinity),
        n if n < 0 => Err(IncrError::TooLong),
        n => {
            out.truncate(n as usize);
            Ok(String::from_utf8(out).expect("printf output is ASCII"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Extended precision and Redis's formatting: 1000 + 0.1 is not 1000.1.
    #[test]
    fn matches_redis_formatting() {
        assert_eq!(
            incr(Some(b"1000"), b"0.1").unwrap(),
            "1000.09999999999999998"
        );
        assert_eq!(incr(None, b"3.0e3").unwrap(), "3000");
        assert_eq!(incr(Some(b"10.5"), b"0.1").unwrap(), "10.6");
        assert_eq!(incr(Some(b"-1"), b"1").unwrap(), "0");
        assert_eq!(incr(Some(b"5"), b"-5.5").unwrap(), "-0.5");
    }

    // `check` tells finite, infinite and invalid input apart.
    #[test]
    fn check_classes() {
        assert_eq!(check(b"1.5"), Some(true));
        assert_eq!(check(b"-inf"), Some(false));
        assert_eq!(check(b"nan"), None);
        assert_eq!(check(b"1x"), None);
    }

    // Invalid input and non-finite results give the errors Redis distinguishes.
    #[test]
    fn errors() {
        assert_eq!(incr(Some(b"abc"), b"1"), Err(IncrError::NotAFloat));
        assert_eq!(incr(Some(b" 1"), b"1"), Err(IncrError::NotAFloat));
        assert_eq!(incr(Some(b"1"), b""), Err(IncrError::NotAFloat));
        assert_eq!(incr(Some(b"1"), b"nan"), Err(IncrError::NotAFloat));
        assert_eq!(incr(Some(b"42\0\x001"), b"1"), Err(IncrError::NotAFloat));
        assert_eq!(incr(Some(b"inf"), b"-inf"), Err(IncrError::NanOrInfinity));
        assert_eq!(
            incr(Some(b"1e4932"), b"1e4932"),
            Err(IncrError::NanOrInfinity)
        );
    }
}
