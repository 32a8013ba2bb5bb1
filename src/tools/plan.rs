//! `lavik plan --keys N --value-bytes V [--key-bytes K] [--ttl-share P] [--devices D]
//! [--threads T] [--cache-size BYTES] [--block-size BYTES]`: what a data set costs in RAM and on
//! the device with this build, and what the same data costs in Redis's RAM.
//!
//! Every figure comes from the constants below, each named after the measurement it comes
//! from; change them together with the benchmark that produced them.
use crate::storage::format::{
    record_len, BLOCK_HEADER_PAYLOAD_BYTES, CHUNK_ALIGN_BYTES, MARKER_RECORD_BYTES,
    RECORD_HEADER_BYTES,
};
use std::fmt::Write as _;

/// Index bytes per key: `lavik_index_bytes` / keys at 10M keys x 1 KiB,
/// `docs/benchmarks/storage-10m/README.md` (113,103,488 B / 10,000,000 = 11.31 B/key; the
/// table itself counts 9.58 B/key in `docs/index.md`, the rest is growth slack).
pub const INDEX_BYTES_PER_KEY: f64 = 11.31;
/// Expiry state per key with a TTL: delta-encoded (expire-at, address) chunks.
/// `docs/benchmarks/plan-vs-measure/README.md`: 10M keys x 1 KiB loaded with
/// `SET k v EX 1000000` (16 pipelined connections) used 22,853,200 B more `used_memory` than
/// the same load without TTLs, 2.29 B/key (1M keys `SET k v EX 86400` gave 1.45,
/// `docs/benchmarks/ttl-state/`; random deadlines cost up to ~8, `docs/index.md` "TTL state").
pub const TTL_BYTES_PER_VOLATILE_KEY: f64 = 2.3;
/// Block table bytes per data block in use (`docs/storage.md`: ~130 B per block).
pub const BLOCK_TABLE_BYTES_PER_BLOCK: f64 = 130.0;
/// Per shard: the staging buffer (one block, 1 MiB by default) plus an 8 KiB read buffer
/// (`docs/storage.md`); the staging buffer is a block, so it scales with `--block-size`.
pub const READ_BUFFER_BYTES_PER_SHARD: u64 = 8 << 10;
/// Staging buffers per shard once it has taken writes: the one being filled, plus the spare
/// a shard keeps after a block filled while the ring was still writing from its buffer
/// (`Shard::spare_staging`). `docs/benchmarks/plan-vs-measure/README.md`: after the 10M-key
/// load `used_memory` held 8.3 MB (8 shards x 1 MiB) more than the plan counted with one.
pub const STAGING_BUFFERS_PER_SHARD: u64 = 2;
/// The rest of `used_memory` (command table, catalogs, allocator slack) plus, per worker,
/// its ring buffers and connection state. Two points measured by hand on a debug build of
/// commit 27806f1 with 200k keys x 1 KiB after a restart (no clients, cache empty):
/// `--threads 1` used_memory 41,847,104, `--threads 2` 52,450,240 B, each minus the index
/// (20,976,000), 8 shards x (1 MiB + 8 KiB) staging and read buffers and the block table:
/// 12.4 MB at one worker, +10.6 MB per further worker. The 10M-key release run of
/// `docs/benchmarks/plan-vs-measure` (one worker, commit 51391bc) leaves 11.9 MB once its
/// two staging buffers per shard are counted.
pub const BASELINE_BYTES: u64 = 1_800_000;
pub const PER_WORKER_BYTES: u64 = 10_600_000;
/// The index's floor per shard: each shard's db-0 index measured 2,621,2xx-2,622,656 B
/// with 19k and 25k keys (same runs), so small stores pay this, not the per-key figure.
pub const INDEX_MIN_BYTES_PER_SHARD: u64 = 2_621_440;
/// A data file's first block: label, metadata slots.
pub const RESERVED_BYTES_PER_DEVICE: u64 = 1 << 20;
/// The docs' defrag headroom: under overwrites defrag keeps the space used near twice the
/// live data (`docs/storage.md`, "A data file that grows").
pub const DEFRAG_HEADROOM: f64 = 2.0;

/// Redis 7's RAM per string key, modelled on its allocations with jemalloc's size classes:
/// the key's sds, the value's robj + sds (one allocation, embstr, up to 44 bytes), a dict
/// entry, the main dict's bucket array (a power of two of 8-byte pointers), and for a key
/// with a TTL a second dict entry plus buckets in `expires`. Checked against
/// `docs/benchmarks/storage-10m-vs-redis` (Debian's redis-server 7.0.15, 10M keys
/// `memtier-N` x 1 KiB: used_memory 13,083.8 MiB = 1,372 B/key; the model: 1,373; and by
/// hand at 200k keys with and without TTLs, see the tests).
pub fn redis_bytes(keys: u64, key_bytes: u64, value_bytes: u64, volatile: u64) -> u64 {
    let sds = |len: u64| {
        let hdr = if len < 32 {
            1
        } else if len < 256 {
            3
        } else if len < 65536 {
            5
        } else {
            9
        };
        hdr + len + 1
    };
    const ROBJ: u64 = 16;
    const DICT_ENTRY: u64 = 24;
    let value = if value_bytes <= 44 {
        jemalloc_class(ROBJ + 3 + value_bytes + 1)
    } else {
        jemalloc_class(ROBJ) + jemalloc_class(sds(value_bytes))
    };
    let per_key = jemalloc_class(sds(key_bytes)) + value + jemalloc_class(DICT_ENTRY);
    let buckets = |n: u64| if n == 0 { 0 } else { 8 * n.next_power_of_two() };
    keys * per_key + buckets(keys) + volatile * jemalloc_class(DICT_ENTRY) + buckets(volatile)
}

/// jemalloc's size class for `n` bytes: 8, 16, then steps of 16 to 128, then four classes
/// per doubling (160, 192, 224, 256, 320, ...).
pub fn jemalloc_class(n: u64) -> u64 {
    if n <= 8 {
        return 8;
    }
    if n <= 128 {
        return n.next_multiple_of(16);
    }
    let pow = n.next_power_of_two();
    let step = pow / 8;
    n.next_multiple_of(step.max(16))
}

/// Inputs of a plan.
#[derive(Clone, Debug)]
pub struct PlanInput {
    pub keys: u64,
    pub value_bytes: u64,
    pub key_bytes: u64,
    /// Share of keys with a TTL, 0..=1.
    pub ttl_share: f64,
    pub devices: u64,
    pub threads: u64,
    pub cache_bytes: u64,
    pub block_bytes: u64,
}

/// Outputs of a plan, in bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub shards: u64,
    pub record_bytes: u64,
    pub blocks: u64,
    pub ram_index: u64,
    pub ram_ttl: u64,
    pub ram_block_table: u64,
    pub ram_buffers: u64,
    pub ram_cache: u64,
    pub ram_baseline: u64,
    pub ram_total: u64,
    pub device_live: u64,
    pub device_recommended: u64,
    pub redis_ram: u64,
}

pub fn plan(i: &PlanInput) -> Plan {
    // As `main`: shards = max(workers, 8).
    let shards = i.threads.max(8);
    let record_bytes = record_len(i.key_bytes as usize, i.value_bytes as usize) as u64;
    // A block holds its header record and, per chunk, a marker padded to 4 KiB; a load
    // writes large chunks (one per flush), so one marker and one page of padding per block.
    let header = (RECORD_HEADER_BYTES + BLOCK_HEADER_PAYLOAD_BYTES) as u64;
    let usable = i.block_bytes - header - MARKER_RECORD_BYTES as u64 - CHUNK_ALIGN_BYTES;
    let per_block = (usable / record_bytes).max(1);
    // Records larger than a block go to extents; count them by bytes.
    let blocks = if record_bytes > usable {
        i.keys * record_bytes.div_ceil(i.block_bytes)
    } else {
        i.keys.div_ceil(per_block)
    } + shards; // one open, partly filled block per shard
    let volatile = (i.keys as f64 * i.ttl_share).round() as u64;
    let per_shard = (i.keys.div_ceil(shards) as f64 * INDEX_BYTES_PER_KEY).round() as u64;
    let ram_index = shards * per_shard.max(INDEX_MIN_BYTES_PER_SHARD);
    let ram_ttl = (volatile as f64 * TTL_BYTES_PER_VOLATILE_KEY).round() as u64;
    let ram_block_table = (blocks as f64 * BLOCK_TABLE_BYTES_PER_BLOCK).round() as u64;
    let ram_buffers =
        shards * (STAGING_BUFFERS_PER_SHARD * i.block_bytes + READ_BUFFER_BYTES_PER_SHARD);
    let ram_cache = i.cache_bytes;
    let ram_baseline = BASELINE_BYTES + i.threads * PER_WORKER_BYTES;
    let ram_total = ram_index + ram_ttl + ram_block_table + ram_buffers + ram_cache + ram_baseline;
    let device_live = blocks * i.block_bytes + i.devices * RESERVED_BYTES_PER_DEVICE;
    let device_recommended = (blocks as f64 * DEFRAG_HEADROOM).ceil() as u64 * i.block_bytes
        + i.devices * RESERVED_BYTES_PER_DEVICE;
    Plan {
        shards,
        record_bytes,
        blocks,
        ram_index,
        ram_ttl,
        ram_block_table,
        ram_buffers,
        ram_cache,
        ram_baseline,
        ram_total,
        device_live,
        device_recommended,
        redis_ram: redis_bytes(i.keys, i.key_bytes, i.value_bytes, volatile),
    }
}

fn human(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < U.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{b} bytes ({v:.1} {})", U[u])
}

/// The printed report.
pub fn render(i: &PlanInput, p: &Plan) -> String {
    let mut t = String::new();
    let ttl_keys = (i.keys as f64 * i.ttl_share).round() as u64;
    let _ = writeln!(
        t,
        "lavik plan: {} keys of {} bytes, values of {} bytes, {} with a TTL; {} workers, {} shards, {} device(s), blocks of {} bytes",
        i.keys, i.key_bytes, i.value_bytes, ttl_keys, i.threads, p.shards, i.devices, i.block_bytes
    );
    let _ = writeln!(t, "RAM (lavik):");
    let _ = writeln!(
        t,
        "  index ({INDEX_BYTES_PER_KEY} B/key, at least {INDEX_MIN_BYTES_PER_SHARD} per shard) {}",
        human(p.ram_index)
    );
    let _ = writeln!(
        t,
        "  TTL state ({TTL_BYTES_PER_VOLATILE_KEY} B/volatile key) {}",
        human(p.ram_ttl)
    );
    let _ = writeln!(t, "  block table            {}", human(p.ram_block_table));
    let _ = writeln!(t, "  buffers (per shard)    {}", human(p.ram_buffers));
    let _ = writeln!(t, "  record cache (budget)  {}", human(p.ram_cache));
    let _ = writeln!(t, "  baseline + per worker  {}", human(p.ram_baseline));
    let _ = writeln!(t, "  total                  {}", human(p.ram_total));
    // What INFO's used_memory reports; the process's RSS adds the binary, thread stacks,
    // rings and allocator slack (31.7 / 44.3 MB at 10M keys, one worker, without / with
    // TTLs: docs/benchmarks/plan-vs-measure).
    let _ = writeln!(t, "  (RSS: about 30-50 MiB more for the process itself)");
    let _ = writeln!(t, "device (lavik):");
    let _ = writeln!(
        t,
        "  record size            {} bytes (32-byte header + key + value, 8-aligned)",
        p.record_bytes
    );
    let _ = writeln!(t, "  blocks after a load    {}", p.blocks);
    let _ = writeln!(t, "  data after a load      {}", human(p.device_live));
    let _ = writeln!(
        t,
        "  recommended capacity   {} (defrag keeps the total near {DEFRAG_HEADROOM}x live)",
        human(p.device_recommended)
    );
    let per_dev = p.device_recommended.div_ceil(i.devices.max(1));
    let _ = writeln!(t, "  per device             {}", human(per_dev));
    let _ = writeln!(
        t,
        "Redis 7 RAM for the same data (jemalloc model): {}",
        human(p.redis_ram)
    );
    let _ = writeln!(
        t,
        "  lavik uses {:.1}x less RAM",
        p.redis_ram as f64 / p.ram_total.max(1) as f64
    );
    t
}

fn parse_bytes(s: &str) -> Option<u64> {
    let l = s.to_ascii_lowercase();
    let (num, mul) = [
        ("gb", 1u64 << 30),
        ("mb", 1 << 20),
        ("kb", 1 << 10),
        ("g", 1 << 30),
        ("m", 1 << 20),
        ("k", 1 << 10),
        ("b", 1),
    ]
    .iter()
    .find_map(|(suf, m)| l.strip_suffix(suf).map(|n| (n.to_string(), *m)))
    .unwrap_or((l.clone(), 1));
    num.trim().parse::<u64>().ok().map(|n| n * mul)
}

/// Parses the arguments after `plan`, prints the plan; exit code 0, or 2 on bad arguments.
pub fn main(args: &[String]) -> i32 {
    match parse(args) {
        Ok(i) => {
            print!("{}", render(&i, &plan(&i)));
            0
        }
        Err(e) => {
            eprintln!("lavik plan: {e}");
            eprintln!(
                "usage: lavik plan --keys N --value-bytes V [--key-bytes K] [--ttl-share 0..1] [--devices D] [--threads T] [--cache-size BYTES] [--block-size BYTES]"
            );
            2
        }
    }
}

fn parse(args: &[String]) -> Result<PlanInput, String> {
    let mut i = PlanInput {
        keys: 0,
        value_bytes: 0,
        key_bytes: 16,
        ttl_share: 0.0,
        devices: 1,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
        cache_bytes: 64 << 20,
        block_bytes: 1 << 20,
    };
    let (mut have_keys, mut have_value) = (false, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (a.as_str(), None),
        };
        let v = match inline {
            Some(v) => v,
            None => it
                .next()
                .ok_or_else(|| format!("{name} needs a value"))?
                .clone(),
        };
        let bytes = || parse_bytes(&v).ok_or_else(|| format!("{name}: invalid size '{v}'"));
        match name {
            "--keys" => {
                i.keys = v
                    .parse()
                    .map_err(|_| format!("--keys: invalid number '{v}'"))?;
                have_keys = true;
            }
            "--value-bytes" => {
                i.value_bytes = bytes()?;
                have_value = true;
            }
            "--key-bytes" => i.key_bytes = bytes()?,
            "--ttl-share" => {
                let p: f64 = v
                    .trim_end_matches('%')
                    .parse()
                    .map_err(|_| format!("--ttl-share: invalid '{v}'"))?;
                i.ttl_share = if v.ends_with('%') { p / 100.0 } else { p };
                if !(0.0..=1.0).contains(&i.ttl_share) {
                    return Err("--ttl-share must be between 0 and 1 (or 0% and 100%)".into());
                }
            }
            "--devices" => {
                i.devices = v
                    .parse()
                    .map_err(|_| format!("--devices: invalid number '{v}'"))?;
                if i.devices == 0 {
                    return Err("--devices must be at least 1".into());
                }
            }
            "--threads" => {
                i.threads = v
                    .parse()
                    .map_err(|_| format!("--threads: invalid number '{v}'"))?;
            }
            "--cache-size" => i.cache_bytes = bytes()?,
            "--block-size" => {
                i.block_bytes = bytes()?;
                if !i.block_bytes.is_power_of_two()
                    || !(64 << 10..=16 << 20).contains(&i.block_bytes)
                {
                    return Err("--block-size must be a power of two from 64kb to 16mb".into());
                }
            }
            other => return Err(format!("unknown option '{other}'")),
        }
    }
    if !have_keys || !have_value {
        return Err("--keys and --value-bytes are required".into());
    }
    if i.key_bytes > u64::from(u16::MAX) {
        return Err("--key-bytes: at most 65535".into());
    }
    Ok(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(keys: u64, ttl: f64) -> PlanInput {
        PlanInput {
            keys,
            value_bytes: 1024,
            // memtier-1 .. memtier-10000000: 15.9 bytes on average.
            key_bytes: 16,
            ttl_share: ttl,
            devices: 1,
            threads: 1,
            cache_bytes: 0,
            block_bytes: 1 << 20,
        }
    }

    fn within(got: u64, want: u64, pct: f64) -> bool {
        (got as f64 - want as f64).abs() <= want as f64 * pct / 100.0
    }

    // Proves the plan for 10M x 1 KiB matches the recorded loads (docs/benchmarks/plan-vs-measure, storage-10m-vs-redis)
    // within 2 %: used_memory minus the record cache's bytes, and the blocks in use that `--check-data-file` counted.
    #[test]
    fn plan_matches_the_10m_measurement() {
        let p = plan(&input(10_000_000, 0.0));
        assert!(within(p.ram_index, 113_103_488, 1.0), "{p:?}");
        assert!(within(p.ram_total, 143_301_168 - 110_849, 2.0), "{p:?}");
        assert!(within(p.device_live, 10_277 << 20, 2.0), "{p:?}");
        let t = plan(&input(10_000_000, 1.0));
        assert!(within(t.ram_total, 166_154_368 - 110_849, 2.0), "{t:?}");
        assert!(within(t.device_live, 10_273 << 20, 2.0), "{t:?}");
        // Redis: used_memory 13083.8 MiB.
        assert!(
            within(p.redis_ram, (13083.8 * 1048576.0) as u64, 5.0),
            "{p:?}"
        );
    }

    // Proves the plan for 200k x 1 KiB matches the hand-measured load (see BASELINE_BYTES) within 10 %, one and two workers;
    // those stores were measured after a restart, so without the spare staging buffer per shard that writes add.
    #[test]
    fn plan_matches_the_200k_measurement() {
        let mut i = input(200_000, 0.0);
        let p = plan(&i);
        let spare = p.shards * i.block_bytes;
        assert!(within(p.ram_index, 20_976_000, 1.0), "{p:?}");
        assert!(within(p.ram_total - spare, 41_847_104, 10.0), "{p:?}");
        i.threads = 2;
        assert!(
            within(plan(&i).ram_total - spare, 52_450_240, 10.0),
            "{p:?}"
        );
    }

    // Proves the Redis model against Debian's redis-server 7.0.15 measured by hand: 200k keys `memtier-%08d` x 1 KiB
    // (used_memory 275,062,912 B), then EXPIRE on every second key (279,360,864 B); within 1 %.
    #[test]
    fn redis_model_matches_redis_at_200k() {
        assert!(within(redis_bytes(200_000, 16, 1024, 0), 275_062_912, 1.0));
        assert!(within(
            redis_bytes(200_000, 16, 1024, 100_000),
            279_360_864,
            1.0
        ));
    }

    // Proves TTLs add RAM on both sides and nothing on lavik's device.
    #[test]
    fn ttls_cost_ram_not_device() {
        let a = plan(&input(1_000_000, 0.0));
        let b = plan(&input(1_000_000, 0.5));
        assert_eq!(b.ram_ttl, 1_150_000);
        assert_eq!(a.device_live, b.device_live);
        assert!(b.redis_ram > a.redis_ram + 16_000_000);
    }

    // Proves jemalloc size classes as Redis's used_memory sees them.
    #[test]
    fn jemalloc_classes() {
        let got: Vec<u64> = [1, 8, 9, 17, 24, 129, 160, 161, 1028, 1280, 1281, 4097]
            .iter()
            .map(|&n| jemalloc_class(n))
            .collect();
        assert_eq!(
            got,
            [8, 8, 16, 32, 32, 160, 160, 192, 1280, 1280, 1536, 5120]
        );
    }

    // Proves the argument parser: required options, units, percentages, errors.
    #[test]
    fn parses_arguments() {
        let a = |v: &[&str]| parse(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let i = a(&[
            "--keys",
            "5",
            "--value-bytes",
            "1kb",
            "--ttl-share",
            "25%",
            "--devices=2",
        ])
        .unwrap();
        assert_eq!(
            (i.keys, i.value_bytes, i.ttl_share, i.devices),
            (5, 1024, 0.25, 2)
        );
        assert!(a(&["--keys", "5"]).is_err());
        assert!(a(&["--keys", "5", "--value-bytes", "1", "--ttl-share", "2"]).is_err());
        assert!(a(&["--keys", "x", "--value-bytes", "1"]).is_err());
        assert!(a(&["--keys", "1", "--value-bytes", "1", "--bogus", "1"]).is_err());
    }
}
