//! Key choice: the S/R/G/P patterns and a small deterministic random source.
//!
//! Invariants: every key number is within `[min, max]`; the P pattern splits the range into
//! one contiguous slice per client (client index counted across all threads), the slices
//! tile the range exactly, and `--requests=allkeys` gives each client its slice length, so
//! a fill with P covers every key exactly once. Random sequences depend only on the seed,
//! so runs are reproducible.

use crate::options::KeyPattern;

/// SplitMix64: tiny, fast, good enough statistically for choosing keys (not for crypto).
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (Lemire's multiply-high; the tiny bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "empty range");
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `(0, 1]`.
    fn unit_open0(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal sample (Box–Muller, one of the pair).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.unit_open0();
        let u2 = self.unit_open0();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// The seed for one client. Without `--distinct-client-seed` all clients share a seed (and
/// so a random key sequence), as memtier does.
pub fn client_seed(base_seed: u64, client_index: u64, distinct: bool) -> u64 {
    if distinct {
        base_seed ^ (client_index + 1).wrapping_mul(0xA24B_AED4_963E_E407)
    } else {
        base_seed
    }
}

/// Client `index` of `clients`' slice of `[min, max]`, inclusive bounds. Slices differ in
/// length by at most one and tile the range in order.
pub fn parallel_slice(min: u64, max: u64, index: u64, clients: u64) -> (u64, u64) {
    assert!(index < clients && min <= max);
    let len = u128::from(max - min) + 1;
    let start = u128::from(min) + len * u128::from(index) / u128::from(clients);
    let end = u128::from(min) + len * u128::from(index + 1) / u128::from(clients);
    assert!(
        end > start,
        "a client got an empty slice: fewer keys than clients"
    );
    (start as u64, (end - 1) as u64)
}

/// Per-client, per-command key chooser.
#[derive(Clone, Debug)]
pub struct KeyGen {
    pattern: KeyPattern,
    /// Walk bounds for S (whole range) and P (own slice), inclusive.
    low: u64,
    high: u64,
    next: u64,
    /// Whole range, for R and G.
    min: u64,
    max: u64,
    median: f64,
    stddev: f64,
    rng: Rng,
}

/// Parameters a [`KeyGen`] needs, copied out of the options.
#[derive(Clone, Copy, Debug)]
pub struct KeySpace {
    pub min: u64,
    pub max: u64,
    pub median: f64,
    pub stddev: f64,
}

impl KeyGen {
    pub fn new(pattern: KeyPattern, space: KeySpace, client: u64, clients: u64, seed: u64) -> Self {
        let (low, high) = match pattern {
            KeyPattern::Parallel => parallel_slice(space.min, space.max, client, clients),
            _ => (space.min, space.max),
        };
        Self {
            pattern,
            low,
            high,
            next: low,
            min: space.min,
            max: space.max,
            median: space.median,
            stddev: space.stddev,
            rng: Rng::new(seed),
        }
    }

    /// How many keys this generator walks before repeating (S and P).
    #[cfg(test)]
    pub fn walk_len(&self) -> u64 {
        self.high - self.low + 1
    }

    pub fn next_key(&mut self) -> u64 {
        match self.pattern {
            KeyPattern::Sequential | KeyPattern::Parallel => {
                let key = self.next;
                self.next = if key == self.high { self.low } else { key + 1 };
                key
            }
            KeyPattern::Random => self.min + self.rng.below(self.max - self.min + 1),
            KeyPattern::Gaussian => {
                let x = (self.median + self.stddev * self.rng.normal()).round();
                x.clamp(self.min as f64, self.max as f64) as u64
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(min: u64, max: u64) -> KeySpace {
        KeySpace {
            min,
            max,
            median: (min + max) as f64 / 2.0,
            stddev: (max - min + 1) as f64 / 6.0,
        }
    }

    // Proves P:P with allkeys covers 1..=N exactly once across all clients of all threads,
    // including ranges that do not divide evenly.
    #[test]
    fn parallel_covers_range_exactly_once() {
        for (n, threads, clients_per_thread) in [(1000u64, 3u64, 7u64), (10, 2, 5), (97, 4, 3)] {
            let clients = threads * clients_per_thread;
            let mut seen = vec![0u32; n as usize + 1];
            for t in 0..threads {
                for c in 0..clients_per_thread {
                    let index = t * clients_per_thread + c;
                    let mut g = KeyGen::new(KeyPattern::Parallel, space(1, n), index, clients, 9);
                    for _ in 0..g.walk_len() {
                        seen[g.next_key() as usize] += 1;
                    }
                }
            }
            assert_eq!(seen[0], 0, "key 0 is outside 1..=N");
            assert!(seen[1..].iter().all(|&k| k == 1), "n={n}: {seen:?}");
        }
    }

    // Proves S walks the range in order and wraps to the minimum.
    #[test]
    fn sequential_wraps() {
        let mut g = KeyGen::new(KeyPattern::Sequential, space(5, 7), 3, 4, 1);
        let keys: Vec<u64> = (0..7).map(|_| g.next_key()).collect();
        assert_eq!(keys, vec![5, 6, 7, 5, 6, 7, 5]);
    }

    // Proves R stays in range, reaches both ends, and is roughly uniform.
    #[test]
    fn random_is_in_range_and_spread() {
        let mut g = KeyGen::new(KeyPattern::Random, space(10, 19), 0, 1, 42);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            let k = g.next_key();
            assert!((10..=19).contains(&k));
            counts[(k - 10) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
    }

    // Proves G concentrates around the median (~68 % within one stddev) and stays in range.
    #[test]
    fn gaussian_centres_on_median() {
        let mut g = KeyGen::new(KeyPattern::Gaussian, space(0, 5999), 0, 1, 7);
        let (median, sd) = (2999.5, 1000.0);
        let mut within = 0;
        for _ in 0..50_000 {
            let k = g.next_key();
            assert!(k <= 5999);
            if (k as f64 - median).abs() <= sd {
                within += 1;
            }
        }
        let share = within as f64 / 50_000.0;
        assert!((0.66..0.70).contains(&share), "share within 1 sd = {share}");
    }

    // Proves seeds are shared by default and distinct with --distinct-client-seed.
    #[test]
    fn client_seeds() {
        assert_eq!(client_seed(5, 0, false), client_seed(5, 3, false));
        assert_ne!(client_seed(5, 0, true), client_seed(5, 1, true));
        let mut a = KeyGen::new(KeyPattern::Random, space(0, 1 << 40), 0, 2, 11);
        let mut b = KeyGen::new(KeyPattern::Random, space(0, 1 << 40), 1, 2, 11);
        assert_eq!(a.next_key(), b.next_key(), "same seed, same sequence");
    }
}
