//! The storage engine on real files through `storage::open`: creation and sizing, reopen,
//! refusal of foreign files, and the write/recovery rates printed for `docs/storage.md`.
use lavik::storage::{self, FsyncPolicy, StorageError, StoreConfig, ValueKind};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

fn temp_path(name: &str) -> PathBuf {
    let dir = std::env::var_os("LAVIK_TEST_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    dir.join(format!("lavik-storage-{}-{name}.data", std::process::id()))
}

fn cfg(path: &Path, fsync: FsyncPolicy) -> StoreConfig {
    StoreConfig {
        data_files: vec![path.to_path_buf()],
        create_size_bytes: 64 << 20,
        shard_count: 2,
        fsync,
        ..StoreConfig::default()
    }
}

// Proves a missing data file is created fully allocated, then written, reopened cleanly and read back.
#[test]
fn create_write_reopen_on_a_file() {
    let path = temp_path("reopen");
    let _ = std::fs::remove_file(&path);
    let c = cfg(&path, FsyncPolicy::Always);
    let st = storage::open(&c).unwrap();
    assert!(st.info.formatted);
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), 64 << 20);
    // Allocated for real (not a sparse file): later writes need no file-system allocation
    // and a full file system shows at creation.
    use std::os::unix::fs::MetadataExt;
    assert!(
        meta.blocks() * 512 >= 64 << 20,
        "data file is sparse: {} of {} bytes allocated",
        meta.blocks() * 512,
        64 << 20
    );
    let mut shards = st.shards;
    for i in 0..1000u32 {
        let key = format!("key:{i}");
        let sh = storage::shard_of_slot(storage::key_slot(key.as_bytes()), 2) as usize;
        shards[sh]
            .put(
                0,
                key.as_bytes(),
                ValueKind::String,
                &i.to_le_bytes(),
                None,
                0,
            )
            .unwrap();
    }
    for s in shards {
        s.shutdown(false).unwrap();
    }
    let progress = Arc::new(storage::RecoveryProgress::default());
    let mut c2 = c.clone();
    c2.recovery_progress = Some(progress.clone());
    let st = storage::open(&c2).unwrap();
    let done = progress.blocks_done.load(Ordering::Relaxed);
    assert!(done > 0 && done == progress.blocks_total.load(Ordering::Relaxed));
    assert!(!st.info.formatted);
    assert!(st.info.last_shutdown_clean);
    assert_eq!(st.info.recovered_keys, 1000);
    let mut shards = st.shards;
    for i in (0..1000u32).step_by(37) {
        let key = format!("key:{i}");
        let sh = storage::shard_of_slot(storage::key_slot(key.as_bytes()), 2) as usize;
        assert_eq!(
            shards[sh].get(0, key.as_bytes(), 0).unwrap().unwrap().bytes,
            i.to_le_bytes()
        );
    }
    drop(shards);
    std::fs::remove_file(&path).unwrap();
}

// Proves an existing file with foreign contents is refused with a clear message and left
// byte-for-byte untouched.
#[test]
fn foreign_file_is_refused_untouched() {
    let path = temp_path("foreign");
    let content: Vec<u8> = (0..(2 << 20)).map(|i: u32| (i % 256) as u8).collect();
    std::fs::write(&path, &content).unwrap();
    let err = storage::open(&cfg(&path, FsyncPolicy::Always))
        .err()
        .expect("must refuse");
    assert!(
        matches!(err, StorageError::ForeignLabel(ref m) if m.contains("not a lavik")),
        "{err}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), content);
    std::fs::remove_file(&path).unwrap();
}

/// Resident set size of this process, from /proc (0 if unavailable).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

// Measures (does not assert) write throughput with Always/EverySec-style group commits and
// recovery time on this machine's disk; run with --ignored --nocapture for docs/storage.md.
#[test]
#[ignore]
fn measure_write_and_recovery_rates() {
    for (policy, batch) in [
        (FsyncPolicy::Always, 64usize),
        (FsyncPolicy::EverySec, 4096),
    ] {
        let path = temp_path("measure");
        let _ = std::fs::remove_file(&path);
        let mut c = cfg(&path, policy);
        c.shard_count = 1;
        c.create_size_bytes = 2 << 30;
        let mut s = storage::open(&c).unwrap().shards.pop().unwrap();
        let n = 400_000u32;
        let v = vec![7u8; 1024];
        let t = Instant::now();
        for i in 0..n {
            s.put(
                0,
                format!("key:{i:012}").as_bytes(),
                ValueKind::String,
                &v,
                None,
                0,
            )
            .unwrap();
            if (i as usize + 1).is_multiple_of(batch) {
                s.flush().unwrap();
            }
        }
        s.flush().unwrap();
        let secs = t.elapsed().as_secs_f64();
        let st = s.stats();
        println!("  process RSS after the load: {} MiB", rss_kib() / 1024);
        println!(
            "{policy:?} batch {batch}: {n} x 1 KiB puts in {secs:.2}s = {:.0} puts/s, {:.0} MiB/s, {} fsyncs, index {} B/key",
            f64::from(n) / secs,
            st.device_write_bytes as f64 / secs / 1048576.0,
            st.fsyncs,
            st.index_bytes / u64::from(n)
        );
        drop(s);
        let t = Instant::now();
        let st = storage::open(&c).unwrap();
        println!(
            "  recovery: {} keys in {:.2}s",
            st.info.recovered_keys,
            t.elapsed().as_secs_f64()
        );
        let mut s = st.shards.into_iter().next().unwrap();
        let gets = 50_000u32;
        let before = s.stats().device_reads;
        let t = Instant::now();
        let mut x = 0x9e37_79b9u32;
        for _ in 0..gets {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let key = format!("key:{:012}", x % n);
            let v = s.get(0, key.as_bytes(), 0).unwrap().unwrap();
            assert_eq!(v.bytes.len(), 1024);
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "  random GETs (one thread, synchronous O_DIRECT pread): {:.0}/s, {:.2} device reads per GET",
            f64::from(gets) / secs,
            (s.stats().device_reads - before) as f64 / f64::from(gets)
        );
        let t = Instant::now();
        s.shutdown(true).unwrap();
        let shutdown_secs = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let st = storage::open(&c).unwrap();
        assert!(st.info.checkpoint_used);
        println!(
            "  shutdown with checkpoint {:.2}s; restart from checkpoint: {} keys in {:.2}s",
            shutdown_secs,
            st.info.recovered_keys,
            t.elapsed().as_secs_f64()
        );
        drop(st);
        std::fs::remove_file(&path).unwrap();
    }
}
