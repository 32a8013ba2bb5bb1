//! Benchmarks of the compact key index (`src/storage/index.rs`).
//!
//! Run with `cargo bench -p lavik --bench index`. Before the timed groups it prints a
//! memory sweep (bytes of RAM per key from 100 k to 10 M keys, as `memory_bytes()`
//! reports them) so the number the product is judged on is recorded next to the
//! speeds. Results go to `docs/index.md`; nothing here is asserted.
use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use lavik::storage::index::{Address, Index};

/// Lookups per timed iteration, so one iteration is long enough to time well.
const BATCH_KEYS: usize = 1024;

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn hashes(seed: u64, count: usize) -> Vec<u64> {
    let mut state = seed;
    (0..count).map(|_| splitmix64(&mut state)).collect()
}

fn filled(keys: &[u64]) -> Index {
    let mut index = Index::new();
    for (i, &h) in keys.iter().enumerate() {
        index.insert(h, Address(i as u64));
    }
    index
}

/// Prints bytes/key at many sizes, with the worst and mean over the sweep.
fn memory_sweep() {
    let keys = hashes(1, 10_000_000);
    let mut index = Index::new();
    let mut worst = 0.0f64;
    let mut sum = 0.0;
    let mut points = 0;
    let mut next_print = 100_000;
    for (i, &h) in keys.iter().enumerate() {
        index.insert(h, Address(i as u64));
        let n = i + 1;
        if n >= 100_000 && n % 50_000 == 0 {
            let per_key = index.memory_bytes() as f64 / n as f64;
            worst = worst.max(per_key);
            sum += per_key;
            points += 1;
            if n == next_print {
                println!("index memory: {n:>9} keys: {per_key:.2} bytes/key");
                next_print = if n < 1_000_000 {
                    next_print * 10
                } else {
                    next_print + 3_000_000
                };
                next_print = next_print.min(10_000_000);
            }
        }
    }
    println!(
        "index memory sweep 100k..10M step 50k: worst {worst:.2}, mean {:.2} bytes/key; at 10M {:?}",
        sum / points as f64,
        index.shape()
    );
}

fn bench_insert(c: &mut Criterion) {
    let keys = hashes(2, 1_000_000);
    let mut group = c.benchmark_group("index_insert");
    group.sample_size(10);
    group.throughput(Throughput::Elements(keys.len() as u64));
    group.bench_function("fresh_1M", |b| b.iter(|| black_box(filled(&keys)).len()));
    group.bench_function("presized_1M", |b| {
        b.iter_batched(
            || Index::with_capacity(keys.len()),
            |mut index| {
                for (i, &h) in keys.iter().enumerate() {
                    index.insert(h, Address(i as u64));
                }
                index.len()
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

fn bench_lookup(c: &mut Criterion) {
    let mut group = c.benchmark_group("index_lookup");
    group.throughput(Throughput::Elements(BATCH_KEYS as u64));
    for size in [1_000_000usize, 10_000_000] {
        let keys = hashes(3, size);
        let index = filled(&keys);
        let probes: Vec<u64> = hashes(4, BATCH_KEYS * 64)
            .into_iter()
            .map(|r| keys[(r % size as u64) as usize])
            .collect();
        let misses = hashes(5, BATCH_KEYS * 64);
        let mut round = 0usize;
        group.bench_function(format!("hit_{}M", size / 1_000_000), |b| {
            b.iter(|| {
                round = (round + 1) % 64;
                let batch = &probes[round * BATCH_KEYS..(round + 1) * BATCH_KEYS];
                batch
                    .iter()
                    .map(|&h| index.candidates(h).count())
                    .sum::<usize>()
            })
        });
        group.bench_function(format!("miss_{}M", size / 1_000_000), |b| {
            b.iter(|| {
                round = (round + 1) % 64;
                let batch = &misses[round * BATCH_KEYS..(round + 1) * BATCH_KEYS];
                batch
                    .iter()
                    .map(|&h| index.candidates(h).count())
                    .sum::<usize>()
            })
        });
    }
    group.finish();
}

fn bench_churn(c: &mut Criterion) {
    let keys = hashes(6, 1_000_000);
    let mut index = filled(&keys);
    let mut group = c.benchmark_group("index_churn");
    group.throughput(Throughput::Elements(BATCH_KEYS as u64));
    let mut next = 0usize;
    group.bench_function("remove_insert_1M", |b| {
        b.iter(|| {
            for _ in 0..BATCH_KEYS {
                let i = next % keys.len();
                assert!(index.remove(keys[i], Address(i as u64)));
                index.insert(keys[i], Address(i as u64));
                next += 7919;
            }
        })
    });
    group.bench_function("replace_1M", |b| {
        b.iter(|| {
            for _ in 0..BATCH_KEYS {
                let i = next % keys.len();
                assert!(index.replace(keys[i], Address(i as u64), Address(i as u64)));
                next += 7919;
            }
        })
    });
    group.finish();
}

fn bench_scan(c: &mut Criterion) {
    let keys = hashes(7, 1_000_000);
    let index = filled(&keys);
    let mut group = c.benchmark_group("index_scan");
    group.sample_size(10);
    group.throughput(Throughput::Elements(keys.len() as u64));
    group.bench_function("full_scan_1M_count_100", |b| {
        b.iter(|| {
            let mut cursor = 0;
            let mut seen = 0usize;
            loop {
                cursor = index.scan(cursor, 100, |_, _| seen += 1);
                if cursor == 0 {
                    return seen;
                }
            }
        })
    });
    group.finish();
}

fn memory(_: &mut Criterion) {
    memory_sweep();
}

criterion_group!(
    benches,
    memory,
    bench_insert,
    bench_lookup,
    bench_churn,
    bench_scan
);
criterion_main!(benches);
