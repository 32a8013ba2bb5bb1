//! Glob-style pattern matching with Redis's exact semantics (`stringmatchlen` in
//! Redis's `util.c`) in time bounded by pattern length × subject length.
//!
//! KEYS, SCAN MATCH and every later user of patterns take the pattern from any client,
//! so the matcher is a security boundary: a naive recursive matcher is exponential in
//! the number of `*` (`a*a*a*…b` against a long run of `a` spins a worker forever).
//! Here the pattern is first compiled into tokens — a star, or a one-byte predicate
//! (literal, `?`, or a `[...]` class evaluated into a 256-bit table) — and the subject is
//! then matched by greedy star backtracking: on a mismatch only the most recent star
//! absorbs one more byte. Earlier stars never need revisiting (anything they could
//! absorb, the later star can), so a match visits at most
//! `tokens × (subject + 1)` (token, position) states. Compiling is linear in the pattern.
//!
//! The semantics reproduced, including Redis's quirks (all checked against
//! `redis-server` in `tests/glob.rs`):
//! - `*` any run of bytes, `?` one byte, `\x` the byte `x` (a trailing `\` is literal);
//! - `[...]` one byte from a set: `^` first negates, `a-z` ranges (ends in either
//!   order), `\x` inside escapes `x` (case-sensitively even in the `nocase` variant),
//!   an unterminated `[` takes the rest of the pattern as the set;
//! - range ends compare as C `char`, which is signed on the platforms Redis ships for:
//!   bytes `0x80..=0xff` sort *below* ASCII (`[a-\xff]` does not match `b`);
//! - the empty subject matches only the empty pattern (`*` does not match `""`; KEYS
//!   and SCAN special-case the pattern `*` before calling the matcher);
//! - Redis gives up after 1000 nested stars: a pattern whose 1001st star group is
//!   followed by more pattern matches no non-empty subject.
//! - `nocase` folds ASCII letters only (the C locale's `tolower`).

/// Redis's recursion limit: a star group nested deeper than this never matches.
const STAR_NESTING_MAX: usize = 1000;

/// Indexes into `Glob::classes`.
type ClassId = u32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    /// One or more consecutive `*`.
    Star,
    /// `?`: any one byte.
    Any,
    /// One byte equal to this one (already folded when `nocase`).
    Byte(u8),
    /// One byte in the 256-bit table `classes[id]`.
    Class(ClassId),
}

/// A compiled pattern. Compile once, match many subjects (KEYS, SCAN).
#[derive(Clone, Debug)]
pub struct Glob {
    tokens: Vec<Token>,
    classes: Vec<[u64; 4]>,
    nocase: bool,
    pattern_empty: bool,
    /// The pattern nests stars past Redis's limit: no non-empty subject matches.
    nesting_exceeded: bool,
}

fn fold(c: u8, nocase: bool) -> u8 {
    if nocase {
        c.to_ascii_lowercase()
    } else {
        c
    }
}

/// A byte as C's signed `char`, as Redis's range test sees it.
fn as_c_char(c: u8) -> i32 {
    c as i8 as i32
}

/// One element of a `[...]` set.
#[derive(Clone, Copy)]
enum ClassItem {
    Escaped(u8),
    Range(u8, u8),
    Literal(u8),
}

impl ClassItem {
    fn matches(self, c: u8, nocase: bool) -> bool {
        match self {
            ClassItem::Escaped(e) => e == c,
            ClassItem::Literal(l) => fold(l, nocase) == fold(c, nocase),
            ClassItem::Range(a, b) => {
                let (lo, hi) = (as_c_char(a), as_c_char(b));
                let (lo, hi) = if lo > hi { (hi, lo) } else { (lo, hi) };
                // Folding happens after the swap, as in Redis: `[Z-a]` with nocase
                // becomes the empty range `z..=a`.
                let f = |v: i32| {
                    if nocase && (b'A' as i32..=b'Z' as i32).contains(&v) {
                        v + 32
                    } else {
                        v
                    }
                };
                (f(lo)..=f(hi)).contains(&f(as_c_char(c)))
            }
        }
    }
}

/// Parses the set starting just after a `[` at `pat[start]`; returns the items, whether
/// it is negated, and the index of its last pattern byte (the `]`, or the last byte of
/// the pattern when unterminated).
fn parse_class(pat: &[u8], start: usize) -> (Vec<ClassItem>, bool, usize) {
    let mut j = start;
    let negated = pat.get(j) == Some(&b'^');
    if negated {
        j += 1;
    }
    let mut items = Vec::new();
    loop {
        let left = pat.len().saturating_sub(j);
        if left >= 2 && pat[j] == b'\\' {
            items.push(ClassItem::Escaped(pat[j + 1]));
            j += 2;
        } else if left == 0 {
            // Unterminated: the set ends with the pattern.
            return (items, negated, pat.len() - 1);
        } else if pat[j] == b']' {
            return (items, negated, j);
        } else if left >= 3 && pat[j + 1] == b'-' {
            // Note `[a-]`: the range is `a..=]` and the set goes on (Redis does the same).
            items.push(ClassItem::Range(pat[j], pat[j + 2]));
            j += 3;
        } else {
            items.push(ClassItem::Literal(pat[j]));
            j += 1;
        }
    }
}

impl Glob {
    /// Compiles `pat` for case-sensitive matching (KEYS, SCAN).
    pub fn new(pat: &[u8]) -> Glob {
        Glob::compile(pat, false)
    }

    /// Compiles `pat` for ASCII case-insensitive matching (Redis's `nocase` users,
    /// e.g. CONFIG GET).
    pub fn new_nocase(pat: &[u8]) -> Glob {
        Glob::compile(pat, true)
    }

    fn compile(pat: &[u8], nocase: bool) -> Glob {
        let mut tokens = Vec::new();
        let mut classes: Vec<[u64; 4]> = Vec::new();
        let mut i = 0;
        while i < pat.len() {
            match pat[i] {
                b'*' => {
                    while i + 1 < pat.len() && pat[i + 1] == b'*' {
                        i += 1;
                    }
                    tokens.push(Token::Star);
                }
                b'?' => tokens.push(Token::Any),
                b'[' => {
                    let (items, negated, last) = parse_class(pat, i + 1);
                    let mut table = [0u64; 4];
                    for c in 0..=255u8 {
                        let hit = items.iter().any(|it| it.matches(c, nocase));
                        if hit != negated {
                            table[(c >> 6) as usize] |= 1 << (c & 63);
                        }
                    }
                    let id = classes.len() as ClassId;
                    classes.push(table);
                    tokens.push(Token::Class(id));
                    i = last;
                }
                b'\\' if i + 1 < pat.len() => {
                    i += 1;
                    tokens.push(Token::Byte(fold(pat[i], nocase)));
                }
                c => tokens.push(Token::Byte(fold(c, nocase))),
            }
            i += 1;
        }
        let stars: Vec<usize> = (0..tokens.len())
            .filter(|&t| tokens[t] == Token::Star)
            .collect();
        // The (limit+1)-th star group recurses past the limit unless it ends the
        // pattern (a trailing star matches at once, without recursing).
        let nesting_exceeded = stars
            .get(STAR_NESTING_MAX)
            .is_some_and(|&t| t + 1 < tokens.len());
        Glob {
            tokens,
            classes,
            nocase,
            pattern_empty: pat.is_empty(),
            nesting_exceeded,
        }
    }

    fn token_matches(&self, t: Token, c: u8) -> bool {
        match t {
            Token::Star => false,
            Token::Any => true,
            Token::Byte(b) => b == fold(c, self.nocase),
            Token::Class(id) => self.classes[id as usize][(c >> 6) as usize] >> (c & 63) & 1 == 1,
        }
    }

    /// Whether `s` matches, with Redis's semantics; O(tokens × len(s)) at worst.
    pub fn matches(&self, s: &[u8]) -> bool {
        if s.is_empty() {
            return self.pattern_empty;
        }
        if self.nesting_exceeded {
            return false;
        }
        let toks = &self.tokens;
        let (mut t, mut i) = (0usize, 0usize);
        // The token after the most recent star, and where in `s` that star's run ends.
        let mut resume: Option<(usize, usize)> = None;
        while i < s.len() {
            match toks.get(t) {
                Some(Token::Star) => {
                    resume = Some((t + 1, i));
                    t += 1;
                    continue;
                }
                Some(&tok) if self.token_matches(tok, s[i]) => {
                    t += 1;
                    i += 1;
                    continue;
                }
                _ => {}
            }
            match resume {
                Some((after_star, run_end)) => {
                    // The most recent star absorbs one more byte; retry after it.
                    resume = Some((after_star, run_end + 1));
                    t = after_star;
                    i = run_end + 1;
                }
                None => return false,
            }
        }
        toks[t..].iter().all(|&tok| tok == Token::Star)
    }
}

/// Whether `s` matches the glob `pat` (Redis's `stringmatchlen`, case-sensitive).
pub fn glob_match(pat: &[u8], s: &[u8]) -> bool {
    Glob::new(pat).matches(s)
}

/// The same, folding ASCII case (Redis's `nocase` flag).
pub fn glob_match_nocase(pat: &[u8], s: &[u8]) -> bool {
    Glob::new_nocase(pat).matches(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A direct, exponential rendering of Redis's recursive matcher: the pattern is
    /// walked with C's view of it (a NUL past the end), stars recurse with a nesting
    /// count. Only for short patterns.
    fn reference(pat: &[u8], s: &[u8], nocase: bool) -> bool {
        fn at(p: &[u8], i: usize) -> u8 {
            p.get(i).copied().unwrap_or(0)
        }
        fn lower(c: i32) -> i32 {
            if (b'A' as i32..=b'Z' as i32).contains(&c) {
                c + 32
            } else {
                c
            }
        }
        fn eq(a: u8, b: u8, nocase: bool) -> bool {
            if nocase {
                lower(a as i8 as i32) == lower(b as i8 as i32)
            } else {
                a == b
            }
        }
        fn go(p: &[u8], mut pi: usize, s: &[u8], mut si: usize, nocase: bool, nest: usize) -> bool {
            if nest > 1000 {
                return false;
            }
            while pi < p.len() && si < s.len() {
                match p[pi] {
                    b'*' => {
                        while pi < p.len() && at(p, pi + 1) == b'*' {
                            pi += 1;
                        }
                        if p.len() - pi == 1 {
                            return true;
                        }
                        return (si..s.len()).any(|k| go(p, pi + 1, s, k, nocase, nest + 1));
                    }
                    b'?' => si += 1,
                    b'[' => {
                        pi += 1;
                        let not = at(p, pi) == b'^';
                        if not {
                            pi += 1;
                        }
                        let mut hit = false;
                        loop {
                            let left = p.len() - pi.min(p.len());
                            if at(p, pi) == b'\\' && left >= 2 {
                                pi += 1;
                                hit |= p[pi] == s[si];
                            } else if at(p, pi) == b']' {
                                break;
                            } else if left == 0 {
                                pi -= 1;
                                break;
                            } else if left >= 3 && p[pi + 1] == b'-' {
                                let (mut a, mut b) = (p[pi] as i8 as i32, p[pi + 2] as i8 as i32);
                                if a > b {
                                    std::mem::swap(&mut a, &mut b);
                                }
                                let mut c = s[si] as i8 as i32;
                                if nocase {
                                    a = lower(a);
                                    b = lower(b);
                                    c = lower(c);
                                }
                                pi += 2;
                                hit |= c >= a && c <= b;
                            } else {
                                hit |= eq(p[pi], s[si], nocase);
                            }
                            pi += 1;
                        }
                        if hit == not {
                            return false;
                        }
                        si += 1;
                    }
                    c => {
                        let c = if c == b'\\' && p.len() - pi >= 2 {
                            pi += 1;
                            p[pi]
                        } else {
                            c
                        };
                        if !eq(c, s[si], nocase) {
                            return false;
                        }
                        si += 1;
                    }
                }
                pi += 1;
                if si == s.len() {
                    while at(p, pi) == b'*' {
                        pi += 1;
                    }
                    break;
                }
            }
            pi >= p.len() && si == s.len()
        }
        go(pat, 0, s, 0, nocase, 0)
    }

    // Stars, question marks and literals behave as in Redis.
    #[test]
    fn stars_and_singles() {
        assert!(glob_match(b"*", b"anything"));
        assert!(glob_match(b"h?llo", b"hello"));
        assert!(!glob_match(b"h?llo", b"hllo"));
        assert!(glob_match(b"h*llo", b"heeeello"));
        assert!(glob_match(b"h*llo", b"hllo"));
        assert!(glob_match(b"a**b", b"axxb"));
        assert!(glob_match(b"*a*b*", b"xxaxxbxx"));
        assert!(!glob_match(b"a*b", b"acd"));
        assert!(glob_match(b"abc", b"abc"));
        assert!(!glob_match(b"abc", b"abcd"));
        assert!(!glob_match(b"abcd", b"abc"));
        assert!(glob_match(b"a*", b"a"));
        assert!(glob_match(b"a***", b"a"));
    }

    // The empty subject matches only the empty pattern, as in Redis (`*` included).
    #[test]
    fn empty_subject() {
        assert!(glob_match(b"", b""));
        assert!(!glob_match(b"*", b""));
        assert!(!glob_match(b"**", b""));
        assert!(!glob_match(b"", b"a"));
        assert!(!glob_match(b"[", b""));
    }

    // Classes: sets, ranges in either order, negation, escapes, `]` and `-` handling.
    #[test]
    fn classes() {
        assert!(glob_match(b"h[ae]llo", b"hallo"));
        assert!(!glob_match(b"h[ae]llo", b"hillo"));
        assert!(glob_match(b"h[^e]llo", b"hallo"));
        assert!(!glob_match(b"h[^e]llo", b"hello"));
        assert!(glob_match(b"h[a-b]llo", b"hbllo"));
        assert!(glob_match(b"h[b-a]llo", b"hallo"));
        assert!(!glob_match(b"h[a-b]llo", b"hcllo"));
        assert!(glob_match(b"[\\]]", b"]"));
        assert!(glob_match(b"[\\-]", b"-"));
        assert!(glob_match(b"[a\\-z]", b"-"));
        assert!(!glob_match(b"[a\\-z]", b"m"));
        assert!(glob_match(b"[-a]", b"-"));
        // `[]` is the empty set; `[^]` therefore matches any byte.
        assert!(!glob_match(b"[]", b"]"));
        assert!(glob_match(b"[^]", b"x"));
        assert!(!glob_match(b"[]x", b"x"));
        // `[a-]x`: `a-]` is the range `]..=a`, so the set is unterminated and `x` joins it.
        assert!(glob_match(b"[a-]x", b"]"));
        assert!(glob_match(b"[a-]x", b"_"));
        assert!(glob_match(b"[a-]x", b"x"));
        assert!(!glob_match(b"[a-]x", b"b"));
    }

    // An unterminated `[` takes the rest of the pattern as its set.
    #[test]
    fn unterminated_class() {
        assert!(glob_match(b"[abc", b"b"));
        assert!(!glob_match(b"[abc", b"d"));
        assert!(!glob_match(b"[abc", b"ab"));
        // A lone `[` is an empty set, `[^` its negation.
        assert!(!glob_match(b"x[", b"x["));
        assert!(!glob_match(b"[", b"a"));
        assert!(glob_match(b"[^", b"a"));
        assert!(glob_match(b"[a\\", b"\\"));
    }

    // Escapes: `\*` is a literal star, a trailing backslash is a literal backslash.
    #[test]
    fn escapes() {
        assert!(glob_match(b"key:\\*", b"key:*"));
        assert!(!glob_match(b"key:\\*", b"key:a"));
        assert!(glob_match(b"\\?", b"?"));
        assert!(!glob_match(b"\\?", b"x"));
        assert!(glob_match(b"a\\", b"a\\"));
        assert!(glob_match(b"\\\\", b"\\"));
    }

    // Range ends compare as signed C chars: bytes >= 0x80 sort below ASCII.
    #[test]
    fn signed_ranges() {
        assert!(glob_match(b"[a-\xff]", b"a"));
        assert!(!glob_match(b"[a-\xff]", b"b"));
        assert!(glob_match(b"[a-\xff]", b"\x00"));
        assert!(glob_match(b"[a-\xff]", b"\xff"));
        assert!(!glob_match(b"[a-\xff]", b"\x80"));
        assert!(glob_match(b"[\x80-\xff]", b"\xe9"));
        assert!(!glob_match(b"[\x80-\xff]", b"e"));
    }

    // The nocase variant folds ASCII letters, except an escaped byte inside a set.
    #[test]
    fn nocase() {
        assert!(glob_match_nocase(b"HeLLo", b"hello"));
        assert!(glob_match_nocase(b"h*O", b"HELLO"));
        assert!(glob_match_nocase(b"[A-C]x", b"bX"));
        assert!(glob_match_nocase(b"[abc]", b"B"));
        assert!(!glob_match_nocase(b"[\\a]", b"A"));
        assert!(glob_match_nocase(b"\\A", b"a"));
        assert!(!glob_match_nocase(b"[Z-a]", b"z"));
        assert!(!glob_match_nocase(b"\xe9", b"\xc9"));
        assert!(!glob_match(b"HeLLo", b"hello"));
    }

    // Redis stops after 1000 nested stars; a pattern needing the 1001st matches nothing.
    #[test]
    fn star_nesting_limit() {
        let subject = vec![b'a'; 3000];
        let thousand = b"*?".repeat(1000);
        assert!(glob_match(&thousand, &subject));
        let past = b"*?".repeat(1001);
        assert!(!glob_match(&past, &subject));
        // A trailing 1001st star matches without recursing.
        let mut trailing = thousand.clone();
        trailing.push(b'*');
        assert!(glob_match(&trailing, &subject));
        // The Redis test suite's case: 50000 groups against 50000 bytes.
        assert!(!glob_match(&b"*?".repeat(50_000), &vec![b'a'; 50_000]));
    }

    // The pathological pattern against a long subject finishes (O(p*s) states).
    #[test]
    fn pathological_is_polynomial() {
        let pat = format!("{}b", "a*".repeat(40));
        let s = vec![b'a'; 20_000];
        let start = std::time::Instant::now();
        assert!(!glob_match(pat.as_bytes(), &s));
        let mut hit = s.clone();
        hit.push(b'b');
        assert!(glob_match(pat.as_bytes(), &hit));
        // Not a timing assertion on the result: a generous bound only to catch a
        // return of exponential behaviour (that would take longer than the universe).
        assert!(start.elapsed() < std::time::Duration::from_secs(60));
    }

    // The reference matcher itself agrees with the Redis cases measured by hand.
    #[test]
    fn reference_sanity() {
        assert!(reference(b"h*llo", b"hello", false));
        assert!(!reference(b"*", b"", false));
        assert!(!reference(b"[a-\xff]", b"b", false));
        assert!(reference(b"[abc", b"c", false));
    }

    fn pattern_byte() -> impl Strategy<Value = u8> {
        prop::sample::select(vec![
            b'a', b'b', b'A', b'*', b'*', b'?', b'[', b']', b'^', b'-', b'\\', 0xe9, b'z',
        ])
    }

    fn subject_byte() -> impl Strategy<Value = u8> {
        prop::sample::select(vec![
            b'a', b'b', b'A', b'B', b']', b'-', b'^', b'\\', 0xe9, b'*', b'z',
        ])
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]
        // The compiled matcher agrees with the reference on short random patterns.
        #[test]
        fn agrees_with_reference(
            pat in prop::collection::vec(pattern_byte(), 0..9),
            s in prop::collection::vec(subject_byte(), 0..8),
            nocase in any::<bool>(),
        ) {
            let got = if nocase { glob_match_nocase(&pat, &s) } else { glob_match(&pat, &s) };
            prop_assert_eq!(got, reference(&pat, &s, nocase));
        }
    }
}
