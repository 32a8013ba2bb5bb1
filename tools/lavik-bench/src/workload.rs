//! What each client sends: the request kinds, their weights and keys, and when to stop.
//!
//! Weights are applied as a fixed cycle (for `--ratio=1:10`: one SET, then ten GETs), so a
//! client's sequence is deterministic for a given seed.

use crate::keys::{client_seed, parallel_slice, KeyGen, KeySpace, Rng};
use crate::options::{BenchOptions, KeyPattern, Requests};
use crate::resp::RequestTemplate;

/// One kind of request in the mix.
#[derive(Clone, Debug)]
pub struct OpSpec {
    /// Report name ("Sets", "Gets", or the custom command's name).
    pub name: String,
    pub template: RequestTemplate,
    pub pattern: KeyPattern,
    pub weight: u32,
    /// Nil replies count as misses, other values as hits.
    pub is_read: bool,
    /// Each `__key__` of a request draws its own key (otherwise all share one).
    pub distinct_keys: bool,
}

/// Everything shared by all clients of a run.
#[derive(Clone, Debug)]
pub struct Workload {
    pub ops: Vec<OpSpec>,
    pub key_prefix: Vec<u8>,
    pub space: KeySpace,
    pub total_clients: u64,
    pub requests: Requests,
    /// When true, clients stop on the clock, not on a request count.
    pub timed: bool,
    pub base_seed: u64,
    pub distinct_client_seed: bool,
}

/// Seed used unless `--randomize` is given, so runs repeat exactly.
const DEFAULT_SEED: u64 = 0x6C61_7669_6B21;

impl Workload {
    pub fn from_options(o: &BenchOptions) -> Self {
        let data = vec![b'x'; o.data_size_bytes];
        let strings = |s: &[&str]| s.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let ops = if o.commands.is_empty() {
            vec![
                OpSpec {
                    name: "Sets".into(),
                    template: RequestTemplate::compile(
                        &strings(&["SET", "__key__", "__data__"]),
                        &data,
                    ),
                    pattern: o.key_pattern_set,
                    weight: o.ratio_set,
                    is_read: false,
                    distinct_keys: false,
                },
                OpSpec {
                    name: "Gets".into(),
                    template: RequestTemplate::compile(&strings(&["GET", "__key__"]), &data),
                    pattern: o.key_pattern_get,
                    weight: o.ratio_get,
                    is_read: true,
                    distinct_keys: false,
                },
            ]
        } else {
            o.commands
                .iter()
                .map(|c| OpSpec {
                    name: c.display_name(),
                    template: RequestTemplate::compile(&c.args, &data),
                    pattern: c.key_pattern,
                    weight: c.ratio,
                    is_read: c.is_read,
                    distinct_keys: c.distinct_keys,
                })
                .collect()
        };
        let base_seed = if o.randomize {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(DEFAULT_SEED)
        } else {
            DEFAULT_SEED
        };
        Self {
            ops,
            key_prefix: o.key_prefix.as_bytes().to_vec(),
            space: KeySpace {
                min: o.key_minimum,
                max: o.key_maximum,
                median: o.median(),
                stddev: o.stddev(),
            },
            total_clients: o.total_clients(),
            requests: o.requests,
            timed: o.test_time_secs.is_some(),
            base_seed,
            distinct_client_seed: o.distinct_client_seed,
        }
    }

    /// Requests client `index` will send (None: unbounded, stopped by the clock).
    pub fn requests_for(&self, index: u64) -> Option<u64> {
        if self.timed {
            return None;
        }
        Some(match self.requests {
            Requests::PerClient(n) => n,
            Requests::AllKeys => {
                let (lo, hi) =
                    parallel_slice(self.space.min, self.space.max, index, self.total_clients);
                hi - lo + 1
            }
        })
    }

    /// Sum of `requests_for` over all clients (None when timed).
    pub fn total_requests(&self) -> Option<u64> {
        (0..self.total_clients).map(|i| self.requests_for(i)).sum()
    }
}

/// One client's request sequence.
#[derive(Clone, Debug)]
pub struct ClientGen {
    keygens: Vec<KeyGen>,
    /// Source of `__rand__` numbers.
    rand: Rng,
    /// Cumulative weights; op `i` owns cycle positions `cum[i-1]..cum[i]`.
    cumulative: Vec<u64>,
    position: u64,
    remaining: Option<u64>,
}

impl ClientGen {
    pub fn new(w: &Workload, index: u64) -> Self {
        let seed = client_seed(w.base_seed, index, w.distinct_client_seed);
        let keygens = w
            .ops
            .iter()
            .enumerate()
            .map(|(i, op)| {
                let op_seed = seed.wrapping_add((i as u64).wrapping_mul(0x9E37_79B9));
                KeyGen::new(op.pattern, w.space, index, w.total_clients, op_seed)
            })
            .collect();
        let mut cumulative = Vec::with_capacity(w.ops.len());
        let mut sum = 0u64;
        for op in &w.ops {
            sum += u64::from(op.weight);
            cumulative.push(sum);
        }
        assert!(
            sum > 0,
            "options validation guarantees a positive total weight"
        );
        Self {
            keygens,
            rand: Rng::new(seed ^ 0x5241_4E44),
            cumulative,
            position: 0,
            remaining: w.requests_for(index),
        }
    }

    pub fn exhausted(&self) -> bool {
        self.remaining == Some(0)
    }

    /// Append the next request to `out`. Returns (op index, bytes), or None when done.
    pub fn next_request(&mut self, w: &Workload, out: &mut Vec<u8>) -> Option<(usize, usize)> {
        if let Some(left) = self.remaining.as_mut() {
            *left = left.checked_sub(1)?;
        }
        let total = *self.cumulative.last().expect("at least one op");
        let op = self
            .cumulative
            .iter()
            .position(|&c| self.position < c)
            .expect("position is below the total weight");
        self.position = (self.position + 1) % total;
        let spec = &w.ops[op];
        let keygen = &mut self.keygens[op];
        let rand = &mut self.rand;
        let next_rand = || rand.below(1 << 32);
        let bytes = if spec.distinct_keys {
            spec.template
                .encode_with(out, &w.key_prefix, || keygen.next_key(), next_rand)
        } else {
            let key = if spec.template.uses_key() {
                keygen.next_key()
            } else {
                0
            };
            spec.template
                .encode_with(out, &w.key_prefix, || key, next_rand)
        };
        Some((op, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::{parse, Parsed};

    fn workload(args: &[&str]) -> Workload {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        match parse(&args).unwrap() {
            Parsed::Run(o) => Workload::from_options(&o),
            Parsed::Help => unreachable!(),
        }
    }

    // Proves --ratio=1:3 yields exactly one SET then three GETs, repeating, and that
    // the request count per client is honoured.
    #[test]
    fn ratio_cycle_and_count() {
        let w = workload(&["--ratio=1:3", "-n", "8", "-t", "1", "-c", "1"]);
        let mut g = ClientGen::new(&w, 0);
        let mut out = Vec::new();
        let ops: Vec<usize> =
            std::iter::from_fn(|| g.next_request(&w, &mut out).map(|r| r.0)).collect();
        assert_eq!(ops, vec![0, 1, 1, 1, 0, 1, 1, 1]);
        assert!(g.exhausted());
    }

    // Proves a P:P allkeys fill over 2 threads x 3 clients SETs every key 1..=50 exactly
    // once, checked on the encoded request bytes themselves.
    #[test]
    fn allkeys_fill_sets_each_key_once() {
        let w = workload(&[
            "--ratio=1:0",
            "--key-pattern=P:P",
            "--requests=allkeys",
            "-t",
            "2",
            "-c",
            "3",
            "--key-minimum=1",
            "--key-maximum=50",
            "--key-prefix=k",
            "-d",
            "1",
        ]);
        assert_eq!(w.total_requests(), Some(50));
        let mut keys = Vec::new();
        for client in 0..6 {
            let mut g = ClientGen::new(&w, client);
            let mut out = Vec::new();
            while g.next_request(&w, &mut out).is_some() {}
            let text = String::from_utf8(out).unwrap();
            for part in text.split("*3\r\n$3\r\nSET\r\n").filter(|p| !p.is_empty()) {
                let key = part.split("\r\n").nth(1).unwrap();
                keys.push(key.trim_start_matches('k').parse::<u64>().unwrap());
            }
        }
        keys.sort_unstable();
        assert_eq!(keys, (1..=50).collect::<Vec<_>>());
    }

    // Proves --command-distinct-keys gives each __key__ of one MGET its own sequential key,
    // while without it all placeholders repeat one key.
    #[test]
    fn distinct_keys_per_placeholder() {
        let base = [
            "--command=MGET __key__ __key__ __key__",
            "--command-key-pattern=S",
            "--key-minimum=1",
            "--key-maximum=100",
            "--key-prefix=k",
            "-n",
            "1",
            "-t",
            "1",
            "-c",
            "1",
        ];
        let encode = |extra: Option<&str>| {
            let mut args = base.to_vec();
            args.extend(extra);
            let w = workload(&args);
            let mut g = ClientGen::new(&w, 0);
            let mut out = Vec::new();
            g.next_request(&w, &mut out).unwrap();
            String::from_utf8(out).unwrap()
        };
        let want = "*4\r\n$4\r\nMGET\r\n$2\r\nk1\r\n$2\r\nk2\r\n$2\r\nk3\r\n";
        assert_eq!(encode(Some("--command-distinct-keys")), want);
        let same = "*4\r\n$4\r\nMGET\r\n$2\r\nk1\r\n$2\r\nk1\r\n$2\r\nk1\r\n";
        assert_eq!(encode(None), same);
    }

    // Proves a timed run has no request limit.
    #[test]
    fn timed_is_unbounded() {
        let w = workload(&["--test-time=1", "-n", "5"]);
        assert_eq!(w.requests_for(0), None);
        assert_eq!(w.total_requests(), None);
    }
}
