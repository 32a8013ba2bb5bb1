//! HyperLogLog commands (PFADD, PFCOUNT, PFMERGE, PFDEBUG, PFSELFTEST) over
//! Redis's exact byte representation.
//!
//! An HLL is an ordinary string value, so `GET` returns — and `SET` may store —
//! the very bytes Redis keeps. The layout (Redis `hyperloglog.c`):
//!
//! ```text
//! offset 0   "HYLL"                      magic
//! offset 4   encoding                    0 = dense, 1 = sparse
//! offset 5   3 bytes, unused             kept as found
//! offset 8   8 bytes, little endian      cached cardinality; bit 7 of byte 15
//!                                        set = cache invalid
//! offset 16  registers                   dense: 16384 x 6 bits, LSB first
//!                                        (12288 bytes); sparse: opcodes
//! ```
//!
//! Sparse opcodes, run-length over the 16384 registers in order:
//! `00xxxxxx` ZERO (1..=64 zero registers), `01xxxxxx yyyyyyyy` XZERO
//! (1..=16384 zero registers, 14-bit length - 1, high bits first),
//! `1vvvvvxx` VAL (value 1..=32, run 1..=4). A sparse HLL becomes dense when a
//! register needs a value above 32 or the string would grow past
//! `hll-sparse-max-bytes`.
//!
//! Invariants kept here, because byte-identity with Redis depends on them:
//! the sparse update splits and re-merges opcodes exactly as Redis does (the
//! same opcode choices, the same 5-opcode merge window); a read of the byte
//! just past the string yields 0, as Redis's sds terminator does, so
//! truncated values decode the same way; the estimator is Ertl's improved
//! one (`tau`/`sigma` over the register histogram) with the same floating
//! point operations in the same order.
//!
//! Not here: `hll-sparse-max-bytes` is the constant `SPARSE_MAX_BYTES` until
//! CONFIG learns it; keyspace notifications.

use super::string::{read_string, write_string};
use super::{eq_ic, CmdResult, Ctx};
use crate::resp::ReplyBuf;

/// Register index bits: 2^14 registers.
const INDEX_BITS: u32 = 14;
/// Hash bits left for the run of zeros.
const RUN_BITS: u32 = 64 - INDEX_BITS;
pub const REGISTER_COUNT: usize = 1 << INDEX_BITS;
const REGISTER_BITS: usize = 6;
const REGISTER_MAX: u8 = (1 << REGISTER_BITS) - 1;
pub const HEADER_BYTES: usize = 16;
pub const DENSE_BYTES: usize = HEADER_BYTES + (REGISTER_COUNT * REGISTER_BITS).div_ceil(8);
const ENCODING_OFFSET: usize = 4;
const CACHE_OFFSET: usize = 8;
const CACHE_INVALID_BIT: u8 = 0x80;
pub const ENCODING_DENSE: u8 = 0;
pub const ENCODING_SPARSE: u8 = 1;
const SPARSE_VAL_MAX_VALUE: u8 = 32;
const SPARSE_VAL_MAX_RUN: usize = 4;
const SPARSE_ZERO_MAX_RUN: usize = 64;
const SPARSE_XZERO_MAX_RUN: usize = 16384;
/// Opcodes examined for merging after a sparse update, from the one before it.
const SPARSE_MERGE_WINDOW_OPCODES: usize = 5;
/// Redis's `hll-sparse-max-bytes` default (whole string, header included).
pub const SPARSE_MAX_BYTES: usize = 3000;
/// Redis's MurmurHash64A seed for HLL elements.
const HASH_SEED: u32 = 0xadc8_3b19;
/// 0.5 / ln 2, the estimator's constant for m -> infinity.
const ALPHA_INF: f64 = 0.721_347_520_444_481_7;

const _: () = assert!(DENSE_BYTES == 12304);
const _: () = assert!(SPARSE_XZERO_MAX_RUN == REGISTER_COUNT);
const _: () = assert!(SPARSE_MAX_BYTES < DENSE_BYTES);
const _: () = assert!((SPARSE_VAL_MAX_VALUE as u32) < RUN_BITS + 1);

pub const ERR_NOT_HLL: &str = "WRONGTYPE Key is not a valid HyperLogLog string value.";
pub const ERR_CORRUPT: &str = "INVALIDOBJ Corrupted HLL object detected";

/// A sparse representation that does not describe exactly 16384 registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Corrupt;

// ---------------------------------------------------------------- hashing

/// MurmurHash2, 64-bit (MurmurHash64A), reading 8-byte words little endian
/// as Redis's endian-neutral variant does.
pub fn murmur64a(data: &[u8], seed: u32) -> u64 {
    const M: u64 = 0xc6a4_a793_5bd1_e995;
    const R: u32 = 47;
    let mut h = (seed as u64) ^ (data.len() as u64).wrapping_mul(M);
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let mut k = u64::from_le_bytes(w.try_into().expect("8-byte chunk"));
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h ^= k;
        h = h.wrapping_mul(M);
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        for (i, &b) in tail.iter().enumerate() {
            h ^= (b as u64) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> R;
    h = h.wrapping_mul(M);
    h ^= h >> R;
    h
}

/// The register an element maps to and the length of its `0...01` pattern
/// (1..=51): the low 14 hash bits pick the register, the rest give the run.
pub fn pattern_len(element: &[u8]) -> (usize, u8) {
    let hash = murmur64a(element, HASH_SEED);
    let index = (hash as usize) & (REGISTER_COUNT - 1);
    // The guard bit bounds the run at RUN_BITS + 1.
    let rest = (hash >> INDEX_BITS) | (1u64 << RUN_BITS);
    (index, rest.trailing_zeros() as u8 + 1)
}

// ---------------------------------------------------------------- estimator

/// Ertl's sigma (arXiv:1702.01284), the correction for zero registers.
fn sigma(mut x: f64) -> f64 {
    if x == 1.0 {
        return f64::INFINITY;
    }
    let mut y = 1.0;
    let mut z = x;
    loop {
        x *= x;
        let before = z;
        z += x * y;
        y += y;
        if before == z {
            return z;
        }
    }
}

/// Ertl's tau, the correction for saturated registers.
fn tau(mut x: f64) -> f64 {
    if x == 0.0 || x == 1.0 {
        return 0.0;
    }
    let mut y = 1.0;
    let mut z = 1.0 - x;
    loop {
        x = x.sqrt();
        let before = z;
        y *= 0.5;
        let d = 1.0 - x;
        z -= (d * d) * y;
        if before == z {
            return z / 3.0;
        }
    }
}

/// The cardinality estimate from a histogram of register values.
pub fn estimate(histogram: &[u32; 64]) -> u64 {
    let m = REGISTER_COUNT as f64;
    let saturated = histogram[RUN_BITS as usize + 1] as f64;
    let mut z = m * tau((m - saturated) / m);
    for j in (1..=RUN_BITS as usize).rev() {
        z += histogram[j] as f64;
        z *= 0.5;
    }
    z += m * sigma(histogram[0] as f64 / m);
    (ALPHA_INF * m * m / z).round() as u64
}

// ---------------------------------------------------------------- dense registers

fn dense_get(regs: &[u8], index: usize) -> u8 {
    let byte = index * REGISTER_BITS / 8;
    let shift = (index * REGISTER_BITS) & 7;
    let b0 = regs[byte] as u16;
    let b1 = regs.get(byte + 1).copied().unwrap_or(0) as u16;
    (((b0 >> shift) | (b1 << (8 - shift))) & REGISTER_MAX as u16) as u8
}

fn dense_put(regs: &mut [u8], index: usize, value: u8) {
    let byte = index * REGISTER_BITS / 8;
    let shift = (index * REGISTER_BITS) & 7;
    let v = value as u16;
    let mask = (REGISTER_MAX as u16) << shift;
    regs[byte] = ((regs[byte] as u16 & !mask) | (v << shift)) as u8;
    // The last register never reaches the next byte (its shift is 2).
    if let Some(next) = regs.get_mut(byte + 1) {
        let high = mask >> 8;
        *next = ((*next as u16 & !high) | (v >> (8 - shift))) as u8;
    }
}

// ---------------------------------------------------------------- sparse opcodes

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Zero(usize),
    XZero(usize),
    Val { value: u8, run: usize },
}

impl Op {
    /// Decodes the opcode at `at`; a byte past the end reads as 0.
    fn at(b: &[u8], at: usize) -> Op {
        let c = b[at];
        if c & 0xc0 == 0 {
            Op::Zero((c & 0x3f) as usize + 1)
        } else if c & 0x80 != 0 {
            Op::Val {
                value: ((c >> 2) & 0x1f) + 1,
                run: (c & 0x3) as usize + 1,
            }
        } else {
            let low = b.get(at + 1).copied().unwrap_or(0) as usize;
            Op::XZero(((((c & 0x3f) as usize) << 8) | low) + 1)
        }
    }

    fn run(self) -> usize {
        match self {
            Op::Zero(n) | Op::XZero(n) => n,
            Op::Val { run, .. } => run,
        }
    }

    fn bytes(self) -> usize {
        match self {
            Op::XZero(_) => 2,
            _ => 1,
        }
    }

    /// Appends the encoding; lengths must be in the opcode's range.
    fn push(self, out: &mut Vec<u8>) {
        match self {
            Op::Zero(n) => {
                debug_assert!((1..=SPARSE_ZERO_MAX_RUN).contains(&n));
                out.push((n - 1) as u8);
            }
            Op::XZero(n) => {
                debug_assert!((1..=SPARSE_XZERO_MAX_RUN).contains(&n));
                let l = n - 1;
                out.push(((l >> 8) as u8) | 0x40);
                out.push((l & 0xff) as u8);
            }
            Op::Val { value, run } => out.push(val_byte(value, run)),
        }
    }
}

fn val_byte(value: u8, run: usize) -> u8 {
    debug_assert!((1..=SPARSE_VAL_MAX_VALUE).contains(&value));
    debug_assert!((1..=SPARSE_VAL_MAX_RUN).contains(&run));
    0x80 | ((value - 1) << 2) | (run - 1) as u8
}

/// A zero run as Redis writes it when splitting: ZERO up to 64, else XZERO.
fn zero_run(n: usize) -> Op {
    if n > SPARSE_ZERO_MAX_RUN {
        Op::XZero(n)
    } else {
        Op::Zero(n)
    }
}

/// Walks the sparse opcodes of `ops`, calling `f(first_register, op)`.
/// Fails unless the runs cover exactly the 16384 registers.
fn sparse_walk(ops: &[u8], mut f: impl FnMut(usize, Op)) -> Result<(), Corrupt> {
    let (mut p, mut idx) = (0, 0);
    while p < ops.len() {
        let op = Op::at(ops, p);
        if idx + op.run() > REGISTER_COUNT {
            return Err(Corrupt);
        }
        f(idx, op);
        idx += op.run();
        p += op.bytes();
    }
    if idx == REGISTER_COUNT {
        Ok(())
    } else {
        Err(Corrupt)
    }
}

// ---------------------------------------------------------------- the value

/// A string value that passed Redis's HLL checks: magic, a known encoding,
/// and for the dense encoding the exact length. The sparse opcodes are only
/// checked when walked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hll {
    bytes: Vec<u8>,
}

impl Hll {
    /// An empty HLL as Redis creates it: sparse, one XZERO:16384, cache 0.
    pub fn new_sparse() -> Hll {
        let mut bytes = Vec::with_capacity(HEADER_BYTES + 2);
        bytes.extend_from_slice(b"HYLL");
        bytes.push(ENCODING_SPARSE);
        bytes.resize(HEADER_BYTES, 0);
        Op::XZero(REGISTER_COUNT).push(&mut bytes);
        Hll { bytes }
    }

    /// Accepts `bytes` if Redis would treat them as an HLL.
    pub fn from_bytes(bytes: Vec<u8>) -> Option<Hll> {
        if bytes.len() < HEADER_BYTES || &bytes[..4] != b"HYLL" {
            return None;
        }
        match bytes[ENCODING_OFFSET] {
            ENCODING_SPARSE => {}
            ENCODING_DENSE if bytes.len() == DENSE_BYTES => {}
            _ => return None,
        }
        Some(Hll { bytes })
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    pub fn is_sparse(&self) -> bool {
        self.bytes[ENCODING_OFFSET] == ENCODING_SPARSE
    }

    /// The cached cardinality, if the cache is valid.
    pub fn cached(&self) -> Option<u64> {
        let card: [u8; 8] = self.bytes[CACHE_OFFSET..HEADER_BYTES]
            .try_into()
            .expect("8 cache bytes");
        (card[7] & CACHE_INVALID_BIT == 0).then(|| u64::from_le_bytes(card))
    }

    pub fn set_cached(&mut self, card: u64) {
        self.bytes[CACHE_OFFSET..HEADER_BYTES].copy_from_slice(&card.to_le_bytes());
    }

    /// Marks the cache stale; the other cache bytes stay as they were.
    pub fn invalidate_cache(&mut self) {
        self.bytes[HEADER_BYTES - 1] |= CACHE_INVALID_BIT;
    }

    /// Adds one element; true if a register grew.
    pub fn add(&mut self, element: &[u8], sparse_max_bytes: usize) -> Result<bool, Corrupt> {
        let (index, count) = pattern_len(element);
        self.set_register(index, count, sparse_max_bytes)
    }

    /// Raises register `index` to `count` if it is lower; true if it grew.
    pub fn set_register(
        &mut self,
        index: usize,
        count: u8,
        sparse_max_bytes: usize,
    ) -> Result<bool, Corrupt> {
        debug_assert!(index < REGISTER_COUNT);
        if self.is_sparse() {
            self.sparse_set(index, count, sparse_max_bytes)
        } else {
            Ok(self.dense_set(index, count))
        }
    }

    fn dense_set(&mut self, index: usize, count: u8) -> bool {
        let regs = &mut self.bytes[HEADER_BYTES..];
        if count > dense_get(regs, index) {
            dense_put(regs, index, count);
            true
        } else {
            false
        }
    }

    /// Converts a sparse HLL to dense (header copied, cache included);
    /// true if it was sparse. A corrupt one is left unchanged.
    pub fn to_dense(&mut self) -> Result<bool, Corrupt> {
        if !self.is_sparse() {
            return Ok(false);
        }
        let mut dense = vec![0u8; DENSE_BYTES];
        dense[..HEADER_BYTES].copy_from_slice(&self.bytes[..HEADER_BYTES]);
        dense[ENCODING_OFFSET] = ENCODING_DENSE;
        let regs = &mut dense[HEADER_BYTES..];
        sparse_walk(&self.bytes[HEADER_BYTES..], |first, op| {
            if let Op::Val { value, run } = op {
                for i in first..first + run {
                    dense_put(regs, i, value);
                }
            }
        })?;
        self.bytes = dense;
        Ok(true)
    }

    /// Promotes to dense and sets the register there (the update that made
    /// the promotion necessary always raises it).
    fn promote_and_set(&mut self, index: usize, count: u8) -> Result<bool, Corrupt> {
        self.to_dense()?;
        let grew = self.dense_set(index, count);
        debug_assert!(grew, "a promotion is only for a register that grows");
        Ok(grew)
    }

    /// Redis's sparse update: find the opcode covering `index`, split it
    /// into at most three, re-merge equal neighbouring VALs, promote when
    /// the value or the size no longer fits.
    fn sparse_set(&mut self, index: usize, count: u8, max_bytes: usize) -> Result<bool, Corrupt> {
        if count > SPARSE_VAL_MAX_VALUE {
            return self.promote_and_set(index, count);
        }
        let b = &self.bytes;
        let end = b.len();
        let (mut p, mut first) = (HEADER_BYTES, 0usize);
        let mut prev: Option<usize> = None;
        let op = loop {
            if p >= end {
                return Err(Corrupt);
            }
            let op = Op::at(b, p);
            if index < first + op.run() {
                break op;
            }
            prev = Some(p);
            p += op.bytes();
            first += op.run();
        };
        let last = first + op.run() - 1;
        match op {
            Op::Val { value, .. } if value >= count => return Ok(false),
            Op::Val { run: 1, .. } | Op::Zero(1) => {
                self.bytes[p] = val_byte(count, 1);
            }
            _ => {
                let mut seq = Vec::with_capacity(5);
                match op {
                    Op::Val { value, .. } => {
                        if index != first {
                            Op::Val {
                                value,
                                run: index - first,
                            }
                            .push(&mut seq);
                        }
                        Op::Val {
                            value: count,
                            run: 1,
                        }
                        .push(&mut seq);
                        if index != last {
                            Op::Val {
                                value,
                                run: last - index,
                            }
                            .push(&mut seq);
                        }
                    }
                    _ => {
                        if index != first {
                            zero_run(index - first).push(&mut seq);
                        }
                        Op::Val {
                            value: count,
                            run: 1,
                        }
                        .push(&mut seq);
                        if index != last {
                            zero_run(last - index).push(&mut seq);
                        }
                    }
                }
                let new_len = end + seq.len() - op.bytes();
                if seq.len() > op.bytes() && new_len > max_bytes {
                    return self.promote_and_set(index, count);
                }
                // A truncated XZERO at the very end is replaced as if whole;
                // the length changes by the opcode's nominal size, as in Redis.
                let old_end = (p + op.bytes()).min(end);
                self.bytes.splice(p..old_end, seq);
                self.bytes.truncate(new_len);
            }
        }
        self.merge_vals(prev.unwrap_or(HEADER_BYTES));
        self.invalidate_cache();
        Ok(true)
    }

    /// Joins adjacent VALs of equal value (runs up to 4), scanning a window
    /// of opcodes from `from`.
    fn merge_vals(&mut self, from: usize) {
        let mut p = from;
        let mut window = SPARSE_MERGE_WINDOW_OPCODES;
        while p < self.bytes.len() && window > 0 {
            window -= 1;
            let op = Op::at(&self.bytes, p);
            let Op::Val { value, run } = op else {
                p += op.bytes();
                continue;
            };
            if p + 1 < self.bytes.len() {
                if let Op::Val { value: v2, run: r2 } = Op::at(&self.bytes, p + 1) {
                    if v2 == value && run + r2 <= SPARSE_VAL_MAX_RUN {
                        self.bytes[p + 1] = val_byte(value, run + r2);
                        self.bytes.remove(p);
                        continue;
                    }
                }
            }
            p += 1;
        }
    }

    /// The histogram of register values (index = value).
    pub fn histogram(&self) -> Result<[u32; 64], Corrupt> {
        let mut h = [0u32; 64];
        if self.is_sparse() {
            sparse_walk(&self.bytes[HEADER_BYTES..], |_, op| match op {
                Op::Val { value, run } => h[value as usize] += run as u32,
                other => h[0] += other.run() as u32,
            })?;
        } else {
            let regs = &self.bytes[HEADER_BYTES..];
            for i in 0..REGISTER_COUNT {
                h[dense_get(regs, i) as usize] += 1;
            }
        }
        Ok(h)
    }

    /// The cardinality estimate of the registers (the cache is not read).
    pub fn count(&self) -> Result<u64, Corrupt> {
        self.histogram().map(|h| estimate(&h))
    }

    /// `max[i] = max(max[i], register[i])` for every register.
    pub fn merge_into(&self, max: &mut [u8; REGISTER_COUNT]) -> Result<(), Corrupt> {
        if self.is_sparse() {
            sparse_walk(&self.bytes[HEADER_BYTES..], |first, op| {
                if let Op::Val { value, run } = op {
                    for m in &mut max[first..first + run] {
                        *m = (*m).max(value);
                    }
                }
            })
        } else {
            let regs = &self.bytes[HEADER_BYTES..];
            for (i, m) in max.iter_mut().enumerate() {
                *m = (*m).max(dense_get(regs, i));
            }
            Ok(())
        }
    }

    /// All registers, decoded (for PFDEBUG GETREG after a dense conversion).
    pub fn dense_registers(&self) -> Option<Vec<u8>> {
        if self.is_sparse() {
            return None;
        }
        let regs = &self.bytes[HEADER_BYTES..];
        Some((0..REGISTER_COUNT).map(|i| dense_get(regs, i)).collect())
    }

    /// PFDEBUG DECODE's text: `z:N`, `Z:N`, `v:VALUE,RUN` per opcode.
    /// Decodes every opcode present without checking the total.
    pub fn decode_sparse(&self) -> Option<String> {
        if !self.is_sparse() {
            return None;
        }
        let ops = &self.bytes[HEADER_BYTES..];
        let mut words = Vec::new();
        let mut p = 0;
        while p < ops.len() {
            let op = Op::at(ops, p);
            words.push(match op {
                Op::Zero(n) => format!("z:{n}"),
                Op::XZero(n) => format!("Z:{n}"),
                Op::Val { value, run } => format!("v:{value},{run}"),
            });
            p += op.bytes();
        }
        Some(words.join(" "))
    }
}

// ---------------------------------------------------------------- commands

/// Reads `key` as an HLL: `None` if missing, WRONGTYPE for other types and
/// for strings that are not HLLs. Returns the TTL with it.
fn read_hll(ctx: &mut Ctx, key: &[u8]) -> Result<Option<(Hll, Option<u64>)>, String> {
    match read_string(ctx, key)? {
        None => Ok(None),
        Some(v) => match Hll::from_bytes(v.bytes) {
            Some(h) => Ok(Some((h, v.expire_at_ms))),
            None => Err(ERR_NOT_HLL.into()),
        },
    }
}

/// PFADD key [element ...]: 1 if the key was created or a register grew.
pub fn pfadd(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let key = a[1];
    let (mut hll, ttl, mut updated) = match read_hll(ctx, key)? {
        Some((h, ttl)) => (h, ttl, false),
        None => (Hll::new_sparse(), None, true),
    };
    let mut grew = false;
    for element in &a[2..] {
        match hll.add(element, SPARSE_MAX_BYTES) {
            Ok(true) => grew = true,
            Ok(false) => {}
            Err(Corrupt) => {
                // Redis updates the value in place element by element, so
                // the registers raised before the corrupt spot stay raised.
                if grew {
                    write_string(ctx, key, hll.as_bytes(), ttl)?;
                }
                return Err(ERR_CORRUPT.into());
            }
        }
    }
    updated |= grew;
    if updated {
        hll.invalidate_cache();
        write_string(ctx, key, hll.as_bytes(), ttl)?;
        ctx.notify(super::events::STRING, "pfadd", key);
    }
    r.int(updated as i64);
    Ok(())
}

/// PFCOUNT key [key ...]: one key uses and refreshes the cached estimate;
/// several keys estimate their union and leave them untouched.
pub fn pfcount(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    if a.len() > 2 {
        let mut max = [0u8; REGISTER_COUNT];
        for key in &a[1..] {
            if let Some((hll, _)) = read_hll(ctx, key)? {
                hll.merge_into(&mut max).map_err(|_| ERR_CORRUPT)?;
            }
        }
        let mut h = [0u32; 64];
        for &v in max.iter() {
            h[v as usize] += 1;
        }
        r.int(estimate(&h) as i64);
        return Ok(());
    }
    let key = a[1];
    let Some((mut hll, ttl)) = read_hll(ctx, key)? else {
        r.int(0);
        return Ok(());
    };
    let card = match hll.cached() {
        Some(card) => card,
        None => {
            let card = hll.count().map_err(|_| ERR_CORRUPT)?;
            hll.set_cached(card);
            write_string(ctx, key, hll.as_bytes(), ttl)?;
            card
        }
    };
    r.int(card as i64);
    Ok(())
}

/// PFMERGE destkey [sourcekey ...]: destkey becomes the union (it is a
/// source too); dense if any input is dense.
pub fn pfmerge(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let mut max = [0u8; REGISTER_COUNT];
    let mut use_dense = false;
    let mut dest: Option<(Hll, Option<u64>)> = None;
    for (i, key) in a[1..].iter().enumerate() {
        let Some((hll, ttl)) = read_hll(ctx, key)? else {
            continue;
        };
        use_dense |= !hll.is_sparse();
        hll.merge_into(&mut max).map_err(|_| ERR_CORRUPT)?;
        if i == 0 {
            dest = Some((hll, ttl));
        }
    }
    let (mut hll, ttl) = dest.unwrap_or_else(|| (Hll::new_sparse(), None));
    if use_dense {
        hll.to_dense().map_err(|_| ERR_CORRUPT)?;
    }
    for (i, &v) in max.iter().enumerate() {
        if v != 0 {
            // Every input, dest included, was walked above: it cannot fail.
            let _ = hll.set_register(i, v, SPARSE_MAX_BYTES);
        }
    }
    hll.invalidate_cache();
    write_string(ctx, a[1], hll.as_bytes(), ttl)?;
    ctx.notify(super::events::STRING, "pfadd", a[1]);
    r.ok();
    Ok(())
}

/// PFDEBUG GETREG|DECODE|ENCODING|TODENSE key.
pub fn pfdebug(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (sub, key) = (a[1], a[2]);
    let Some((mut hll, ttl)) = read_hll(ctx, key)? else {
        return Err("ERR The specified key does not exist".into());
    };
    if eq_ic(sub, "getreg") {
        if hll.to_dense().map_err(|_| ERR_CORRUPT)? {
            write_string(ctx, key, hll.as_bytes(), ttl)?;
        }
        let regs = hll.dense_registers().expect("converted to dense");
        r.array(regs.len());
        for v in regs {
            r.int(v as i64);
        }
    } else if eq_ic(sub, "decode") {
        match hll.decode_sparse() {
            Some(text) => r.bulk(text.as_bytes()),
            None => return Err("ERR HLL encoding is not sparse".into()),
        }
    } else if eq_ic(sub, "encoding") {
        r.simple(if hll.is_sparse() { "sparse" } else { "dense" });
    } else if eq_ic(sub, "todense") {
        let converted = hll.to_dense().map_err(|_| ERR_CORRUPT)?;
        if converted {
            write_string(ctx, key, hll.as_bytes(), ttl)?;
        }
        r.int(converted as i64);
    } else {
        return Err(format!(
            "ERR Unknown PFDEBUG subcommand '{}'",
            String::from_utf8_lossy(sub)
        ));
    }
    Ok(())
}

/// PFSELFTEST: Redis's self test of the register accessors and of the
/// estimator's error, with dense and sparse kept in agreement.
pub fn pfselftest(ctx: &mut Ctx, _a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    /// Redis adds 10^7 elements, checking at every power of ten.
    const SELFTEST_ELEMENTS: u64 = 10_000_000;
    selftest(ctx.now_ms | 1, SELFTEST_ELEMENTS)?;
    r.ok();
    Ok(())
}

fn selftest(mut rng: u64, elements: u64) -> Result<(), String> {
    const REGISTER_CYCLES: usize = 1000;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // 1: every register keeps its own value and leaves its neighbours alone.
    let mut regs = vec![0u8; DENSE_BYTES - HEADER_BYTES];
    let mut expected = vec![0u8; REGISTER_COUNT];
    for _ in 0..REGISTER_CYCLES {
        for (i, e) in expected.iter_mut().enumerate() {
            *e = (next() as u8) & REGISTER_MAX;
            dense_put(&mut regs, i, *e);
        }
        for (i, &e) in expected.iter().enumerate() {
            let got = dense_get(&regs, i);
            if got != e {
                return Err(format!(
                    "TESTFAILED Register {i} should be {e} but is {got}"
                ));
            }
        }
    }
    // 2: the error stays within 6 standard errors at 1, 10, 100, ...
    let mut dense = Hll::new_sparse();
    dense.to_dense().expect("a fresh HLL is valid");
    let mut sparse = Hll::new_sparse();
    let relative_error = 1.04 / (REGISTER_COUNT as f64).sqrt();
    let seed = next();
    let mut checkpoint = 1u64;
    for j in 1..=elements {
        let element = (j ^ seed).to_le_bytes();
        dense
            .add(&element, SPARSE_MAX_BYTES)
            .map_err(|_| ERR_CORRUPT)?;
        sparse
            .add(&element, SPARSE_MAX_BYTES)
            .map_err(|_| ERR_CORRUPT)?;
        if j != checkpoint {
            continue;
        }
        if (j as usize) < SPARSE_MAX_BYTES / 2 && !sparse.is_sparse() {
            return Err("TESTFAILED sparse encoding not used".into());
        }
        let card = dense.count().map_err(|_| ERR_CORRUPT)?;
        if sparse.count().map_err(|_| ERR_CORRUPT)? != card {
            return Err("TESTFAILED dense/sparse disagree".into());
        }
        let abs_error = checkpoint.abs_diff(card);
        // At 10 a collision makes a larger error likely: Redis allows 1.
        let max_error = if j == 10 {
            1
        } else {
            (relative_error * 6.0 * checkpoint as f64).ceil() as u64
        };
        if abs_error > max_error {
            return Err(format!(
                "TESTFAILED Too big error. card:{checkpoint} abserr:{abs_error}"
            ));
        }
        checkpoint *= 10;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `PFADD h a b c` then `GET h` on redis-server 7.0.15.
    const ABC: &[u8] =
        b"HYLL\x01\0\0\0\0\0\0\0\0\0\0\x80\x60\xf3\x80\x50\xb1\x84\x4b\xfb\x80\x42\x5a";

    fn hll_of(prefix: &str, n: usize) -> Hll {
        let mut h = Hll::new_sparse();
        for i in 0..n {
            h.add(format!("{prefix}{i}").as_bytes(), SPARSE_MAX_BYTES)
                .unwrap();
        }
        h
    }

    // Elements land on the register and run length Redis gives them (PFDEBUG DECODE there).
    #[test]
    fn hash_and_pattern_match_redis() {
        assert_eq!(pattern_len(b"a"), (12711, 2));
        assert_eq!(pattern_len(b""), (5938, 2));
        assert_eq!(pattern_len(b"hello world!"), (8716, 3));
        assert_eq!(pattern_len(b"12345678"), (10579, 3));
        assert_eq!(pattern_len(b"foobar"), (1910, 4));
    }

    // A known sparse value from Redis parses: opcodes, histogram, estimate.
    #[test]
    fn parses_known_sparse_literal() {
        let h = Hll::from_bytes(ABC.to_vec()).unwrap();
        assert!(h.is_sparse());
        assert_eq!(h.cached(), None);
        assert_eq!(
            h.decode_sparse().unwrap(),
            "Z:8436 v:1,1 Z:4274 v:2,1 Z:3068 v:1,1 Z:603"
        );
        let hist = h.histogram().unwrap();
        assert_eq!((hist[0], hist[1], hist[2]), (16381, 2, 1));
        assert_eq!(h.count().unwrap(), 3);
    }

    // Adding the same elements emits Redis's bytes; the cache then holds 3 in little endian.
    #[test]
    fn emits_known_sparse_literal() {
        let mut h = Hll::new_sparse();
        assert_eq!(h.as_bytes(), b"HYLL\x01\0\0\0\0\0\0\0\0\0\0\0\x7f\xff");
        for e in [&b"a"[..], b"b", b"c"] {
            assert!(h.add(e, SPARSE_MAX_BYTES).unwrap());
        }
        assert!(!h.add(b"a", SPARSE_MAX_BYTES).unwrap());
        assert_eq!(h.as_bytes(), ABC);
        h.set_cached(3);
        assert_eq!(&h.as_bytes()[8..16], &[3, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(h.cached(), Some(3));
        h.invalidate_cache();
        assert_eq!(&h.as_bytes()[8..16], &[3, 0, 0, 0, 0, 0, 0, 0x80]);
    }

    // Estimates and encodings Redis gave for e0.., at sizes on both sides of the promotion.
    #[test]
    fn estimates_match_redis() {
        let small = hll_of("e", 200);
        assert!(small.is_sparse());
        assert_eq!(small.as_bytes().len(), 513);
        assert_eq!(small.count().unwrap(), 200);
        let big = hll_of("e", 10_000);
        assert!(!big.is_sparse());
        assert_eq!(big.as_bytes().len(), DENSE_BYTES);
        assert_eq!(big.count().unwrap(), 9973);
        assert_eq!(Hll::new_sparse().count().unwrap(), 0);
    }

    // The sparse form grows to at most 3000 bytes, then the next growing update promotes.
    #[test]
    fn promotes_at_sparse_max_bytes() {
        let mut h = Hll::new_sparse();
        let mut i = 0;
        while h.is_sparse() {
            assert!(h.as_bytes().len() <= SPARSE_MAX_BYTES);
            let before = h.clone();
            let grew = h.add(format!("p{i}").as_bytes(), SPARSE_MAX_BYTES).unwrap();
            if !h.is_sparse() {
                assert!(grew);
                // Same registers, one raised: dense of the old value plus that register.
                let mut expect = before;
                expect.to_dense().unwrap();
                expect
                    .add(format!("p{i}").as_bytes(), SPARSE_MAX_BYTES)
                    .unwrap();
                assert_eq!(h, expect);
            }
            i += 1;
        }
        assert!(i > 500, "promoted after only {i} elements");
    }

    // A value above 32 cannot be sparse: setting one promotes at once.
    #[test]
    fn value_above_32_promotes() {
        let mut h = hll_of("q", 10);
        assert!(h.set_register(77, 33, SPARSE_MAX_BYTES).unwrap());
        assert!(!h.is_sparse());
        assert_eq!(h.dense_registers().unwrap()[77], 33);
        assert!(!h.set_register(77, 20, SPARSE_MAX_BYTES).unwrap());
    }

    // The header checks: magic, encoding, and the dense length exactly.
    #[test]
    fn rejects_malformed_headers() {
        assert!(Hll::from_bytes(ABC[..15].to_vec()).is_none());
        assert!(Hll::from_bytes(b"HYLX\x01\0\0\0\0\0\0\0\0\0\0\0\x7f\xff".to_vec()).is_none());
        assert!(Hll::from_bytes(b"HYLL\x02\0\0\0\0\0\0\0\0\0\0\0\x7f\xff".to_vec()).is_none());
        let mut dense = hll_of("d", 5);
        dense.to_dense().unwrap();
        let mut bytes = dense.into_bytes();
        assert!(Hll::from_bytes(bytes.clone()).is_some());
        bytes.pop();
        assert!(Hll::from_bytes(bytes.clone()).is_none());
        bytes.extend_from_slice(b"ab");
        assert!(Hll::from_bytes(bytes).is_none());
        // A header alone is a (corrupt) sparse HLL, as in Redis.
        let empty = Hll::from_bytes(ABC[..16].to_vec()).unwrap();
        assert_eq!(empty.count(), Err(Corrupt));
        assert_eq!(empty.decode_sparse().unwrap(), "");
    }

    // Truncated or over-long opcode runs are corrupt for counting, merging and conversion.
    #[test]
    fn rejects_bad_coverage() {
        let truncated = Hll::from_bytes(ABC[..ABC.len() - 1].to_vec()).unwrap();
        assert_eq!(truncated.count(), Err(Corrupt));
        let mut max = [0u8; REGISTER_COUNT];
        assert_eq!(truncated.merge_into(&mut max), Err(Corrupt));
        let mut t = truncated.clone();
        assert_eq!(t.to_dense(), Err(Corrupt));
        assert_eq!(t, truncated);
        // XZERO:16384 twice covers too many registers.
        let mut over = Hll::new_sparse().into_bytes();
        over.extend_from_slice(b"\x7f\xff");
        let over = Hll::from_bytes(over).unwrap();
        assert_eq!(over.count(), Err(Corrupt));
        // Only registers 0..100 described: an element beyond them is corrupt, one in them is not.
        let mut short = ABC[..16].to_vec();
        short.extend_from_slice(b"\x40\x63");
        let mut short = Hll::from_bytes(short).unwrap();
        assert_eq!(short.set_register(5000, 3, SPARSE_MAX_BYTES), Err(Corrupt));
        assert_eq!(short.set_register(50, 3, SPARSE_MAX_BYTES), Ok(true));
        assert_eq!(short.decode_sparse().unwrap(), "z:50 v:3,1 z:49");
    }

    // A truncated XZERO reads its missing byte as 0, as Redis reads the string's terminator.
    #[test]
    fn truncated_xzero_reads_zero() {
        let mut v = ABC[..16].to_vec();
        v.push(0x7f);
        let h = Hll::from_bytes(v).unwrap();
        assert_eq!(h.decode_sparse().unwrap(), "Z:16129");
    }

    // Dense register writes never disturb a neighbour, at both ends of the array.
    #[test]
    fn dense_registers_are_independent() {
        let mut regs = vec![0u8; DENSE_BYTES - HEADER_BYTES];
        for i in [0, 1, 2, 3, 4, 5000, REGISTER_COUNT - 2, REGISTER_COUNT - 1] {
            dense_put(&mut regs, i, 63);
            dense_put(&mut regs, i, (i % 64) as u8);
        }
        for i in 0..REGISTER_COUNT {
            let want = match i {
                0..=4 | 5000 | 16382 | 16383 => (i % 64) as u8,
                _ => 0,
            };
            assert_eq!(dense_get(&regs, i), want, "register {i}");
        }
    }

    // The self test's register and error checks pass (10^5 elements here; PFSELFTEST adds 10^7).
    #[test]
    fn selftest_passes() {
        assert_eq!(selftest(0x1234_5678_9abc_def1, 100_000), Ok(()));
    }

    proptest! {
        // Any sequence of register updates gives the same registers sparse and dense, and the
        // sparse form decodes to exactly those registers.
        #[test]
        fn sparse_and_dense_agree(updates in proptest::collection::vec((0usize..REGISTER_COUNT, 1u8..=40), 0..400)) {
            let mut model = vec![0u8; REGISTER_COUNT];
            let mut sparse = Hll::new_sparse();
            let mut dense = Hll::new_sparse();
            dense.to_dense().unwrap();
            for &(i, v) in &updates {
                let grew = v > model[i];
                model[i] = model[i].max(v);
                prop_assert_eq!(sparse.set_register(i, v, SPARSE_MAX_BYTES).unwrap(), grew);
                prop_assert_eq!(dense.set_register(i, v, SPARSE_MAX_BYTES).unwrap(), grew);
            }
            prop_assert_eq!(sparse.count().unwrap(), dense.count().unwrap());
            let mut max = [0u8; REGISTER_COUNT];
            sparse.merge_into(&mut max).unwrap();
            prop_assert_eq!(&max[..], &model[..]);
            prop_assert_eq!(dense.dense_registers().unwrap(), model.clone());
            sparse.to_dense().unwrap();
            prop_assert_eq!(sparse.dense_registers().unwrap(), model);
        }
    }
}
