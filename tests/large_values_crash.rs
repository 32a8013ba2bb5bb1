//! LARGE values (stored over extents) under crashes, restarts and space reuse: a seeded
//! model test of the storage engine against a `BTreeMap`, on a small in-memory device so
//! that freed extents and log blocks are reused constantly.
mod common;
use common::{Raw, Server};
use lavik::device::{AlignedBuf, BlockDevice, MemDevice};
use lavik::storage::format::{
    decode_record, encode_record, record_len, RecordHeader, BLOCK_HEADER_PAYLOAD_BYTES,
    BLOCK_KIND_EXTENT, RECORD_HEADER_BYTES,
};
use lavik::storage::{self, FsyncPolicy, Shard, StorageError, StoreConfig, ValueKind};
use std::collections::BTreeMap;
use std::sync::Arc;

const BLOCK: u32 = 64 * 1024;
const SHARDS: u32 = 4;

fn cfg(cache_bytes: usize) -> StoreConfig {
    StoreConfig {
        shard_count: SHARDS,
        fsync: FsyncPolicy::Always,
        block_size_bytes: BLOCK,
        staging_limit_bytes: u64::from(BLOCK),
        cache_capacity_bytes: cache_bytes,
        ..StoreConfig::default()
    }
}

fn open(dev: &Arc<MemDevice>, cache_bytes: usize) -> Vec<Shard> {
    storage::open_on(vec![dev.clone() as Arc<dyn BlockDevice>], &cfg(cache_bytes))
        .expect("open")
        .shards
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The value with identity `id` and length `len` (every byte depends on both).
fn value(id: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(id.wrapping_mul(31).wrapping_add(len as u64));
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&r.next().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Value lengths around the LARGE threshold of a 64 KiB block and over several extents.
fn big_len(r: &mut Rng) -> usize {
    let b = BLOCK as usize;
    match r.below(6) {
        0 => b - 400 + r.below(300) as usize, // inline, just below the threshold
        1 => b - 100 + r.below(200) as usize, // either side of it
        2 => b + r.below(64) as usize,        // two fragments, the second tiny
        3 => 2 * b + r.below(4096) as usize,  // three fragments
        4 => 3 * b - 300,                     // three nearly full fragments
        _ => b / 2 + r.below(1000) as usize,  // inline, half a block
    }
}

type Model = BTreeMap<Vec<u8>, Option<(u64, usize)>>;

fn shard_of(key: &[u8]) -> usize {
    storage::shard_of_slot(storage::key_slot(key), SHARDS) as usize
}

/// Every key of `model` reads back byte for byte (or is absent when it should be).
fn verify(shards: &mut [Shard], model: &Model, what: &str) {
    for (k, want) in model {
        let got = shards[shard_of(k)].get(0, k, 0);
        let got = match got {
            Ok(v) => v.map(|v| v.bytes),
            Err(e) => panic!("{what}: GET {} failed: {e}", String::from_utf8_lossy(k)),
        };
        let want = want.map(|(id, len)| value(id, len));
        if got != want {
            let first_diff = match (&got, &want) {
                (Some(g), Some(w)) if g.len() == w.len() => {
                    g.iter().zip(w).position(|(a, b)| a != b)
                }
                _ => None,
            };
            panic!(
                "{what}: {} differs: got {:?} bytes, want {:?}, first difference at {first_diff:?}",
                String::from_utf8_lossy(k),
                got.map(|g| g.len()),
                want.map(|w| w.len())
            );
        }
    }
}

/// One seeded run: rounds of writes (big and small SETs, overwrites, DELs, defrag steps,
/// flushes), each ended by a crash (SIGKILL-like: written data stays; or a power loss:
/// unsynced writes dropped, the last one possibly torn), then recovery and a full check.
fn run(seed: u64, rounds: u32, device_mib: u64) {
    let dev = Arc::new(MemDevice::new("large", device_mib << 20));
    let mut r = Rng(seed);
    let mut acked: Model = BTreeMap::new();
    let mut next_id = seed << 32;
    for round in 0..rounds {
        // The record cache on and off: with it off, every read comes from the device.
        let cache = if round % 2 == 0 { 0 } else { 256 * 1024 };
        let mut shards = open(&dev, cache);
        verify(
            &mut shards,
            &acked,
            &format!("seed {seed} round {round} after recovery"),
        );
        // Unflushed writes per key, in order: a crash may keep any of them (a sealed block
        // is written before the flush that acknowledges it).
        let mut unflushed: BTreeMap<Vec<u8>, Vec<Option<(u64, usize)>>> = BTreeMap::new();
        let ops = 30 + r.below(60);
        for op in 0..ops {
            let key = match r.below(10) {
                0..=4 => format!("big:{}", r.below(8)),
                _ => format!("small:{}", r.below(64)),
            }
            .into_bytes();
            let s = shard_of(&key);
            let roll = r.below(20);
            let res = if roll < 3 {
                unflushed.entry(key.clone()).or_default().push(None);
                shards[s].delete(0, &key, 0).map(|_| ())
            } else {
                next_id += 1;
                let len = if key.starts_with(b"big") {
                    big_len(&mut r)
                } else {
                    1 + r.below(2000) as usize
                };
                unflushed
                    .entry(key.clone())
                    .or_default()
                    .push(Some((next_id, len)));
                shards[s].put(0, &key, ValueKind::String, &value(next_id, len), None, 0)
            };
            match res {
                Ok(()) => {}
                Err(StorageError::DeviceFull) => {
                    // Not applied: the key keeps its previous state.
                    if let Some(vs) = unflushed.get_mut(&key) {
                        vs.pop();
                    }
                }
                Err(e) => panic!("seed {seed} round {round} op {op}: {e}"),
            }
            for sh in shards.iter_mut() {
                sh.background(0, 2000).expect("background");
            }
            if r.below(4) == 0 {
                for sh in shards.iter_mut() {
                    sh.flush().expect("flush");
                }
                for (k, vs) in std::mem::take(&mut unflushed) {
                    if let Some(&v) = vs.last() {
                        acked.insert(k, v);
                    }
                }
            }
            // Without a restart and, in even rounds, without the cache: reads from the
            // device must be exact too.
            if r.below(8) == 0 {
                let mut now = acked.clone();
                now.extend(
                    unflushed
                        .iter()
                        .filter_map(|(k, vs)| Some((k.clone(), *vs.last()?))),
                );
                verify(
                    &mut shards,
                    &now,
                    &format!("seed {seed} round {round} op {op} live"),
                );
            }
        }
        // The crash: acknowledged (flushed) writes must survive; the rest may or may not.
        let power_loss = r.below(3) == 0;
        drop(shards);
        if power_loss {
            dev.crash_random(r.next());
        }
        let mut shards = open(&dev, 0);
        for (k, vs) in unflushed {
            let got = shards[shard_of(&k)].get(0, &k, 0).expect("get unflushed");
            let got = got.map(|g| g.bytes);
            let old = acked.get(&k).copied().flatten();
            if got == old.map(|(id, len)| value(id, len)) {
                continue;
            }
            let Some(&v) = vs
                .iter()
                .rev()
                .find(|v| v.map(|(id, len)| value(id, len)) == got)
            else {
                panic!(
                    "seed {seed} round {round}: unacknowledged {} is none of its values",
                    String::from_utf8_lossy(&k)
                );
            };
            acked.insert(k, v);
        }
        verify(
            &mut shards,
            &acked,
            &format!("seed {seed} round {round} after crash"),
        );
    }
}

// Proves LARGE values written among small writes, overwrites and deletes on a device small
// enough that extents and blocks are reused read back byte for byte after every crash and
// restart, with the record cache off and on.
#[test]
fn large_values_survive_crashes_and_space_reuse() {
    // LAVIK_LARGE_SEEDS=N runs seeds 1..=N instead (a longer hunt by hand).
    let seeds = std::env::var("LAVIK_LARGE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3u64);
    for seed in 1..=seeds {
        run(seed, 12, 6);
    }
}

/// (block, block_seq, fragment header, fragment payload) of every extent on `dev`.
fn extents(dev: &MemDevice, blocks: u64) -> Vec<(u64, u64, RecordHeader, Vec<u8>)> {
    let block = u64::from(BLOCK);
    let frag_off = record_len(0, BLOCK_HEADER_PAYLOAD_BYTES);
    let mut out = Vec::new();
    for b in 0..blocks {
        let img = dev.peek((b + 1) * block, BLOCK as usize);
        // Block header payload: block_seq at 24, block kind at 36.
        let p = &img[RECORD_HEADER_BYTES..];
        let block_seq = u64::from_le_bytes(p[24..32].try_into().unwrap());
        let kind = u32::from_le_bytes(p[36..40].try_into().unwrap());
        if &p[..8] != b"LVKBLOCK" || kind != BLOCK_KIND_EXTENT {
            continue;
        }
        if let Some(r) = decode_record(&img[frag_off..], block_seq) {
            out.push((b, block_seq, r.header, r.value.to_vec()));
        }
    }
    out
}

// Proves a large value whose extent holds another value's bytes, in a fragment record that
// itself verifies (right CRC, type, sequence number and length), is reported as corrupt on
// GET instead of being returned as wrong bytes of the right length.
#[test]
fn swapped_extent_contents_are_an_error_not_a_wrong_value() {
    let dev = Arc::new(MemDevice::new("swap", 4 << 20));
    let mut shards = open(&dev, 0);
    let len = 2 * BLOCK as usize + 100;
    let (a, b) = (value(1, len), value(2, len));
    let s = &mut shards[shard_of(b"a")];
    s.put(0, b"a", ValueKind::String, &a, None, 0).unwrap();
    let s = &mut shards[shard_of(b"b")];
    s.put(0, b"b", ValueKind::String, &b, None, 0).unwrap();
    for sh in shards.iter_mut() {
        sh.flush().unwrap();
    }
    let found = extents(&dev, 60);
    let first = |v: &[u8]| {
        found
            .iter()
            .find(|e| e.3.len() > 1000 && v.starts_with(&e.3))
            .cloned()
            .expect("first fragment on the device")
    };
    let (a_block, a_seq, a_hdr, _) = first(&a);
    let (_, _, _, b_payload) = first(&b);
    // Rewrite a's first fragment with b's first fragment bytes, re-sealed for a's extent.
    let frag_off = record_len(0, BLOCK_HEADER_PAYLOAD_BYTES);
    let mut img = dev.peek((a_block + 1) * u64::from(BLOCK), BLOCK as usize);
    encode_record(&mut img[frag_off..], a_seq, a_hdr, &[], &b_payload);
    let mut buf = AlignedBuf::new_zeroed(BLOCK as usize);
    buf.as_mut_slice().copy_from_slice(&img);
    dev.write_at((a_block + 1) * u64::from(BLOCK), &buf)
        .unwrap();
    match shards[shard_of(b"a")].get(0, b"a", 0) {
        Err(StorageError::Corrupt(_)) => {}
        Ok(v) => panic!(
            "a read back {:?} bytes (equal to its value: {})",
            v.as_ref().map(|v| v.bytes.len()),
            v.is_some_and(|v| v.bytes == a)
        ),
        Err(e) => panic!("unexpected error {e}"),
    }
    let got = shards[shard_of(b"b")].get(0, b"b", 0).unwrap().unwrap();
    assert!(got.bytes == b, "b must be untouched");
}

/// GET `key` must reply with exactly `want` (a nil reply for `None`).
fn expect_value(c: &mut Raw, key: &[u8], want: Option<&[u8]>, what: &str) {
    let reply = match want {
        Some(v) => {
            let mut r = format!("${}\r\n", v.len()).into_bytes();
            r.extend_from_slice(v);
            r.extend_from_slice(b"\r\n");
            r
        }
        None => b"$-1\r\n".to_vec(),
    };
    c.cmd(&[b"GET", key]);
    let got = c.read_exact(reply.len());
    if got != reply {
        let first = got.iter().zip(&reply).position(|(a, b)| a != b);
        panic!(
            "{what}: GET {} differs from byte {first:?} of {}",
            String::from_utf8_lossy(key),
            reply.len()
        );
    }
}

fn set_threads(s: &mut Server, threads: &str) {
    let i = s.args.iter().position(|a| a == "--threads").unwrap();
    s.args[i + 1] = threads.to_string();
}

// Proves, through the real server, that 1 MiB-class values (either side of the LARGE
// threshold of a 1 MiB block) written among small writes, overwrites and deletes read back
// byte for byte from the device (no record cache), and again after SIGKILL and restarts
// with a different number of workers (shards move between workers).
#[test]
fn server_large_values_survive_sigkill_and_thread_change() {
    let mut s = Server::start(
        "large-kill",
        &[
            "--threads",
            "1",
            "--appendfsync",
            "always",
            "--cache-size",
            "0",
        ],
    );
    let mut r = Rng(7);
    let mut model: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
    let sizes = [
        1_048_200,
        1_048_280,
        1_048_300,
        1 << 20,
        2 * (1 << 20) + 17,
        600_000,
    ];
    for (round, threads) in ["3", "2"].iter().enumerate() {
        let mut c = s.raw();
        for i in 0..40u64 {
            let key = if i % 3 == 0 {
                format!("big:{}", r.below(5))
            } else {
                format!("small:{}", r.below(50))
            }
            .into_bytes();
            if r.below(8) == 0 {
                c.cmd(&[b"DEL", &key]);
                let _ = c.read_exact(4); // ":0\r\n" or ":1\r\n"
                model.insert(key, None);
                continue;
            }
            let len = if key.starts_with(b"big") {
                sizes[r.below(sizes.len() as u64) as usize]
            } else {
                1 + r.below(3000) as usize
            };
            let v = value(r.next(), len);
            c.cmd(&[b"SET", &key, &v]);
            assert_eq!(c.read_exact(5), b"+OK\r\n");
            model.insert(key, Some(v));
        }
        for (k, v) in &model {
            expect_value(
                &mut c,
                k,
                v.as_deref(),
                &format!("round {round} before the kill"),
            );
        }
        set_threads(&mut s, threads);
        s.restart_after_kill();
        let mut c = s.raw();
        for (k, v) in &model {
            expect_value(
                &mut c,
                k,
                v.as_deref(),
                &format!("round {round} after restart"),
            );
        }
    }
}
