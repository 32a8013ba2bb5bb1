//! `lavik --check-data-file`: the offline integrity check against stores written by the
//! engine (clean, a flipped byte, a torn tail, two files), a foreign file and a locked store.
use lavik::storage::{self, FsyncPolicy, StoreConfig, ValueKind};
use std::path::{Path, PathBuf};
use std::process::Command;

const BLOCK: u64 = 64 << 10;

fn temp_path(name: &str) -> PathBuf {
    let dir = std::env::var_os("LAVIK_TEST_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let p = dir.join(format!("lavik-check-{}-{name}.data", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn cfg(paths: &[PathBuf]) -> StoreConfig {
    StoreConfig {
        data_files: paths.to_vec(),
        create_size_bytes: 4 << 20,
        shard_count: 1,
        block_size_bytes: BLOCK as u32,
        fsync: FsyncPolicy::Always,
        direct_io: false,
        ..StoreConfig::default()
    }
}

/// Writes `n` keys `k:i` (every 3rd with an expiry), deletes `deleted` of them, then the
/// extra keys given (after a flush), and shuts down cleanly.
fn fill(paths: &[PathBuf], n: u32, deleted: u32, extra: &[(&[u8], Vec<u8>)]) {
    fill_with(paths, n, deleted, extra, false)
}

/// `fill`, with a flush after each extra key (one chunk each) if `flush_each`.
fn fill_with(
    paths: &[PathBuf],
    n: u32,
    deleted: u32,
    extra: &[(&[u8], Vec<u8>)],
    flush_each: bool,
) {
    let st = storage::open(&cfg(paths)).unwrap();
    let mut shards = st.shards;
    let sh = &mut shards[0];
    for i in 0..n {
        let exp = (i % 3 == 0).then_some(4_000_000_000_000);
        let v = format!("value-{i}-{}", "x".repeat(40));
        sh.put(
            0,
            format!("k:{i}").as_bytes(),
            ValueKind::String,
            v.as_bytes(),
            exp,
            1,
        )
        .unwrap();
    }
    for i in 0..deleted {
        assert!(sh.delete(0, format!("k:{i}").as_bytes(), 1).unwrap());
    }
    // The extra keys go in a chunk of their own.
    sh.flush().unwrap();
    for (k, v) in extra {
        sh.put(0, k, ValueKind::String, v, None, 1).unwrap();
        if flush_each {
            sh.flush().unwrap();
        }
    }
    for s in shards {
        s.shutdown(false).unwrap();
    }
}

fn check(paths: &[&Path]) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lavik"));
    for p in paths {
        cmd.arg("--check-data-file").arg(p);
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code().unwrap(), text)
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("value is in the file")
}

// Proves a cleanly written store checks out with exit 0 and the right key, tombstone and expiry counts.
#[test]
fn clean_store() {
    let p = temp_path("clean");
    fill(std::slice::from_ref(&p), 300, 10, &[]);
    let (code, text) = check(&[&p]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("label ok"), "{text}");
    assert!(text.contains("shut down cleanly"), "{text}");
    assert!(
        text.contains("records: 300 puts (0 large), 10 tombstones"),
        "{text}"
    );
    // k:0..k:9 deleted; of k:10..k:299 every third (i % 3 == 0) has an expiry: 96.
    assert!(
        text.contains("index: 290 live keys (96 with an expiry, expired or not), 10 tombstones"),
        "{text}"
    );
    assert!(text.contains("damaged chunks: 0"), "{text}");
    assert!(text.ends_with("result: clean\n"), "{text}");
    let _ = std::fs::remove_file(&p);
}

// Proves one flipped byte inside a record among verifying neighbours is damage: exit 1, block and offset named.
#[test]
fn flipped_byte_is_damage() {
    let p = temp_path("flip");
    let marker = b"FLIP-ME-0123456789".to_vec();
    fill(
        std::slice::from_ref(&p),
        50,
        0,
        &[(b"victim", marker.clone())],
    );
    let mut bytes = std::fs::read(&p).unwrap();
    let at = find(&bytes, &marker);
    // The victim's record: 32-byte header, key "victim", value; the next record follows.
    let rec = at - 32 - b"victim".len();
    let block = rec as u64 / BLOCK - 1;
    let off = rec as u64 % BLOCK;
    bytes[at + 3] ^= 0x20;
    std::fs::write(&p, &bytes).unwrap();
    let (code, text) = check(&[&p]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains(&format!("DAMAGE: block {block} (")), "{text}");
    assert!(
        text.contains(&format!("record at block offset {off} ")),
        "{text}"
    );
    // The victim's chunk is the last one: recovery ignores it and the rest of the block.
    assert!(text.contains("recovery ignores it"), "{text}");
    assert!(text.ends_with("result: DAMAGED\n"), "{text}");
    let _ = std::fs::remove_file(&p);
}

// Proves damage in a chunk followed by a committed one is named and said to lose only that chunk's records.
#[test]
fn damage_before_a_later_chunk() {
    let p = temp_path("flip-mid");
    let extra: &[(&[u8], Vec<u8>)] = &[
        (b"victim", b"VICTIM-VALUE".to_vec()),
        (b"after", b"later chunk".to_vec()),
    ];
    fill_with(std::slice::from_ref(&p), 50, 0, extra, true);
    let mut bytes = std::fs::read(&p).unwrap();
    let at = find(&bytes, b"VICTIM-VALUE");
    let rec = at - 32 - b"victim".len();
    let block = rec as u64 / BLOCK - 1;
    let off = rec as u64 % BLOCK;
    bytes[at] ^= 1;
    std::fs::write(&p, &bytes).unwrap();
    let (code, text) = check(&[&p]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains(&format!("DAMAGE: block {block} (")), "{text}");
    assert!(
        text.contains(&format!("record at block offset {off} ")),
        "{text}"
    );
    assert!(text.contains("recovery skips this chunk"), "{text}");
    // The 50 keys before and the key after are left to recovery; "victim" is lost.
    assert!(text.contains("index: 51 live keys"), "{text}");
    let _ = std::fs::remove_file(&p);
}

// Proves a flipped byte in a block's first chunk makes the whole block free, as recovery does.
#[test]
fn damage_in_a_first_chunk_frees_the_block() {
    let p = temp_path("flip-first");
    let extra: &[(&[u8], Vec<u8>)] = &[(b"after", b"later chunk".to_vec())];
    fill(std::slice::from_ref(&p), 50, 0, extra);
    let mut bytes = std::fs::read(&p).unwrap();
    let at = find(&bytes, b"value-7-x");
    bytes[at] ^= 1;
    std::fs::write(&p, &bytes).unwrap();
    let (code, text) = check(&[&p]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("recovery treats the whole block as free"),
        "{text}"
    );
    assert!(text.contains("index: 0 live keys"), "{text}");
    let _ = std::fs::remove_file(&p);
}

// Proves a chunk cut at a sector boundary (a crash mid-write) is reported as torn, not damage: exit 0.
#[test]
fn torn_tail_is_not_damage() {
    let p = temp_path("torn");
    let big = [b"BIG-VALUE-START".to_vec(), vec![b'b'; 9000]].concat();
    fill(
        std::slice::from_ref(&p),
        50,
        0,
        &[(b"small", b"s".to_vec()), (b"big", big.clone())],
    );
    let mut bytes = std::fs::read(&p).unwrap();
    let at = find(&bytes, &big[..15]);
    // Sectors after the one where the big value starts never reached the device.
    let cut = (at as u64 + 1).next_multiple_of(4096);
    let block_end = (cut / BLOCK + 1) * BLOCK;
    bytes[cut as usize..block_end as usize].fill(0);
    std::fs::write(&p, &bytes).unwrap();
    let (code, text) = check(&[&p]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("torn chunks (normal after a crash, ignored by recovery): 1"),
        "{text}"
    );
    assert!(text.contains("torn chunk at block offset"), "{text}");
    assert!(text.contains("damaged chunks: 0"), "{text}");
    // "small" and "big" were in the torn chunk: recovery does not have them.
    assert!(text.contains("index: 50 live keys"), "{text}");
    let _ = std::fs::remove_file(&p);
}

// Proves a store of two files is checked as one (both labels, keys from both).
#[test]
fn two_file_store() {
    let a = temp_path("two-a");
    let b = temp_path("two-b");
    fill(&[a.clone(), b.clone()], 3000, 0, &[]);
    let (code, text) = check(&[&b, &a]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("device 0 of 2") && text.contains("device 1 of 2"),
        "{text}"
    );
    assert!(text.contains("index: 3000 live keys"), "{text}");
    // One of the two files alone is an incomplete store: cannot check.
    let (code, text) = check(&[&a]);
    assert_eq!(code, 2, "{text}");
    let _ = std::fs::remove_file(&a);
    let _ = std::fs::remove_file(&b);
}

// Proves a foreign file, a missing file and a store in use (locked) cannot be checked: exit 2.
#[test]
fn foreign_missing_and_locked() {
    let f = temp_path("foreign");
    let mut junk = vec![0u8; 2 << 20];
    junk[..4].copy_from_slice(b"\x7fELF");
    std::fs::write(&f, &junk).unwrap();
    let (code, text) = check(&[&f]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("not a lavik data file"), "{text}");
    let _ = std::fs::remove_file(&f);

    let missing = temp_path("missing");
    let (code, text) = check(&[&missing]);
    assert_eq!(code, 2, "{text}");
    assert!(!missing.exists(), "the check must not create a file");

    let l = temp_path("locked");
    let st = storage::open(&cfg(std::slice::from_ref(&l))).unwrap();
    let (code, text) = check(&[&l]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("locked"), "{text}");
    for s in st.shards {
        s.shutdown(false).unwrap();
    }
    let (code, text) = check(&[&l]);
    assert_eq!(code, 0, "{text}");
    let _ = std::fs::remove_file(&l);
}
