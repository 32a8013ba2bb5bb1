//! Engine unit tests on `MemDevice`.
use super::*;
use crate::device::MemDevice;

const MIB: u64 = 1 << 20;

fn cfg(block_size_bytes: u32, fsync: FsyncPolicy) -> StoreConfig {
    StoreConfig {
        block_size_bytes,
        fsync,
        shard_count: 1,
        staging_limit_bytes: u64::from(block_size_bytes),
        ..StoreConfig::default()
    }
}

fn open_mem(dev: &Arc<MemDevice>, c: &StoreConfig) -> OpenedStore {
    open_on(vec![dev.clone() as Arc<dyn BlockDevice>], c).expect("open")
}

fn one_shard(dev: &Arc<MemDevice>, c: &StoreConfig) -> Shard {
    open_mem(dev, c).shards.pop().expect("one shard")
}

fn val(s: &mut Shard, key: &[u8], now: u64) -> Option<Vec<u8>> {
    s.get(0, key, now).unwrap().map(|v| v.bytes)
}

// Proves basic put/get/exists/overwrite/delete semantics from staging and from the device.
#[test]
fn put_get_overwrite_delete() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let mut s = one_shard(&dev, &cfg(64 * 1024, FsyncPolicy::Always));
    s.put(0, b"a", ValueKind::String, b"1", None, 0).unwrap();
    assert_eq!(val(&mut s, b"a", 0), Some(b"1".to_vec()));
    assert!(s.exists(0, b"a", 0).unwrap());
    assert!(!s.exists(1, b"a", 0).unwrap());
    s.flush().unwrap();
    s.put(0, b"a", ValueKind::String, b"22", None, 0).unwrap();
    assert_eq!(val(&mut s, b"a", 0), Some(b"22".to_vec()));
    assert_eq!(s.key_count(0), 1);
    assert!(s.delete(0, b"a", 0).unwrap());
    assert!(!s.delete(0, b"a", 0).unwrap());
    assert_eq!(val(&mut s, b"a", 0), None);
    assert_eq!(s.key_count(0), 0);
}

// Proves records spanning many blocks read back from the device after their block was sealed.
#[test]
fn many_blocks_read_back() {
    let dev = Arc::new(MemDevice::new("t", 16 * MIB));
    let mut s = one_shard(&dev, &cfg(64 * 1024, FsyncPolicy::EverySec));
    for i in 0..2000u32 {
        let v = vec![(i % 251) as u8; 100 + (i as usize % 900)];
        s.put(
            0,
            format!("k{i}").as_bytes(),
            ValueKind::String,
            &v,
            None,
            0,
        )
        .unwrap();
    }
    for i in 0..2000u32 {
        let v = vec![(i % 251) as u8; 100 + (i as usize % 900)];
        assert_eq!(val(&mut s, format!("k{i}").as_bytes(), 0), Some(v));
    }
    assert!(s.stats().device_reads > 0);
    assert_eq!(s.key_count(0), 2000);
}

// Proves flushed data survives a crash and reopen, and unflushed data is dropped.
#[test]
fn recovery_after_crash() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let c = cfg(64 * 1024, FsyncPolicy::Always);
    let mut s = one_shard(&dev, &c);
    for i in 0..300u32 {
        s.put(
            2,
            format!("k{i}").as_bytes(),
            ValueKind::String,
            &i.to_le_bytes(),
            None,
            0,
        )
        .unwrap();
    }
    s.delete(2, b"k7", 0).unwrap();
    s.flush().unwrap();
    s.put(2, b"k8", ValueKind::String, b"lost", None, 0)
        .unwrap();
    s.put(2, b"new", ValueKind::String, b"lost", None, 0)
        .unwrap();
    drop(s);
    dev.crash(None);
    let mut s = one_shard(&dev, &c);
    assert_eq!(s.key_count(2), 299);
    assert_eq!(s.get(2, b"k7", 0).unwrap(), None);
    assert_eq!(s.get(2, b"new", 0).unwrap(), None);
    assert_eq!(
        s.get(2, b"k8", 0).unwrap().unwrap().bytes,
        8u32.to_le_bytes()
    );
    assert_eq!(
        s.get(2, b"k299", 0).unwrap().unwrap().bytes,
        299u32.to_le_bytes()
    );
    // Writing after recovery continues the sequence: the new value wins after another reopen.
    s.put(2, b"k9", ValueKind::String, b"after", None, 0)
        .unwrap();
    s.flush().unwrap();
    drop(s);
    let mut s = one_shard(&dev, &c);
    assert_eq!(s.get(2, b"k9", 0).unwrap().unwrap().bytes, b"after");
}

// Proves lazy expiry hides and deletes expired keys and set_expiry changes/clears the deadline.
#[test]
fn expiry_lazy_and_set_expiry() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let c = cfg(64 * 1024, FsyncPolicy::Always);
    let mut s = one_shard(&dev, &c);
    s.put(0, b"t", ValueKind::String, b"v", Some(1000), 0)
        .unwrap();
    assert_eq!(
        s.get(0, b"t", 999).unwrap().unwrap().expire_at_ms,
        Some(1000)
    );
    assert!(s.set_expiry(0, b"t", Some(5000), 999).unwrap());
    assert!(s.exists(0, b"t", 4000).unwrap());
    assert!(s.set_expiry(0, b"t", None, 4000).unwrap());
    assert_eq!(s.get(0, b"t", 10_000).unwrap().unwrap().expire_at_ms, None);
    s.put(0, b"u", ValueKind::String, b"v", Some(1000), 0)
        .unwrap();
    assert_eq!(s.key_count(0), 2);
    assert_eq!(s.get(0, b"u", 1000).unwrap(), None);
    assert_eq!(s.key_count(0), 1);
    assert!(!s.set_expiry(0, b"u", Some(1), 1000).unwrap());
    s.flush().unwrap();
    drop(s);
    let mut s = one_shard(&dev, &c);
    assert_eq!(s.key_count(0), 1);
    assert_eq!(s.get(0, b"u", 0).unwrap(), None);
}

// Proves active expiry in `background` reaps expired keys without any access.
#[test]
fn active_expiry_reaps() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let mut s = one_shard(&dev, &cfg(64 * 1024, FsyncPolicy::Always));
    for i in 0..50u32 {
        s.put(
            0,
            format!("e{i}").as_bytes(),
            ValueKind::String,
            b"x",
            Some(1000 + u64::from(i)),
            0,
        )
        .unwrap();
    }
    s.put(0, b"keep", ValueKind::String, b"x", Some(100_000), 0)
        .unwrap();
    s.put(0, b"e3", ValueKind::String, b"x", None, 0).unwrap();
    s.background(5000, 10_000).unwrap();
    assert_eq!(s.key_count(0), 2);
    assert_eq!(s.stats().expired_keys, 49);
}

// Proves active expiry's "nothing due before T" bound follows new keys: a key added with an
// earlier expiry after a pass found nothing due is still reaped on time, in another db too.
#[test]
fn active_expiry_sees_keys_added_after_an_idle_pass() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let mut s = one_shard(&dev, &cfg(64 * 1024, FsyncPolicy::Always));
    s.put(0, b"late", ValueKind::String, b"x", Some(10_000), 0)
        .unwrap();
    s.background(10, 10_000).unwrap();
    assert_eq!(s.stats().expired_keys, 0);
    s.put(3, b"soon", ValueKind::String, b"x", Some(20), 10)
        .unwrap();
    s.background(19, 10_000).unwrap();
    assert_eq!(s.stats().expired_keys, 0);
    s.background(20, 10_000).unwrap();
    assert_eq!(s.stats().expired_keys, 1);
    assert_eq!(s.key_count(3), 0);
    assert_eq!(s.key_count(0), 1);
    s.background(10_000, 10_000).unwrap();
    assert_eq!(s.stats().expired_keys, 2);
}

// Proves FLUSHDB empties one db at once, leaves others, and is durable after flush + crash.
#[test]
fn flush_db_is_durable() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let c = cfg(64 * 1024, FsyncPolicy::Always);
    let mut s = one_shard(&dev, &c);
    for i in 0..500u32 {
        s.put(
            (i % 2) as u8,
            format!("k{i}").as_bytes(),
            ValueKind::String,
            b"v",
            None,
            0,
        )
        .unwrap();
    }
    s.flush().unwrap();
    s.flush_db(0).unwrap();
    assert_eq!(s.key_count(0), 0);
    assert_eq!(s.key_count(1), 250);
    s.put(0, b"k0", ValueKind::String, b"fresh", None, 0)
        .unwrap();
    s.flush().unwrap();
    drop(s);
    dev.crash(None);
    let mut s = one_shard(&dev, &c);
    assert_eq!(s.key_count(0), 1);
    assert_eq!(s.key_count(1), 250);
    assert_eq!(s.get(0, b"k0", 0).unwrap().unwrap().bytes, b"fresh");
    assert_eq!(s.get(0, b"k2", 0).unwrap(), None);
}

// Proves SCAN returns every key exactly once with no changes, and RANDOMKEY returns a live key.
#[test]
fn scan_and_random_key() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let mut s = one_shard(&dev, &cfg(64 * 1024, FsyncPolicy::No));
    for i in 0..321u32 {
        s.put(
            0,
            format!("k{i}").as_bytes(),
            ValueKind::String,
            b"v",
            None,
            0,
        )
        .unwrap();
    }
    let mut seen = Vec::new();
    let mut cursor = 0;
    loop {
        let (next, keys) = s.scan(0, cursor, 10, 0).unwrap();
        seen.extend(keys);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    // SCAN may repeat an entry (Redis allows it; the index's linear probing
    // makes it happen at resume points) but must visit every key.
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 321);
    let k = s.random_key(0, 0).unwrap().unwrap();
    assert!(s.exists(0, &k, 0).unwrap());
    assert_eq!(s.random_key(5, 0).unwrap(), None);
}

// Proves a value far larger than a block round-trips, survives reopen, and frees its extents
// when overwritten.
#[test]
fn large_values_span_extents() {
    let dev = Arc::new(MemDevice::new("t", 16 * MIB));
    let c = cfg(64 * 1024, FsyncPolicy::Always);
    let mut s = one_shard(&dev, &c);
    let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
    s.put(0, b"big", ValueKind::String, &big, None, 0).unwrap();
    s.flush().unwrap();
    assert_eq!(val(&mut s, b"big", 0), Some(big.clone()));
    drop(s);
    let mut s = one_shard(&dev, &c);
    assert_eq!(val(&mut s, b"big", 0), Some(big.clone()));
    let used = s.stats().blocks_used;
    s.put(0, b"big", ValueKind::String, b"small", None, 0)
        .unwrap();
    s.flush().unwrap();
    assert!(s.stats().blocks_used + 10 < used, "extents were not freed");
    drop(s);
    let mut s = one_shard(&dev, &c);
    assert_eq!(val(&mut s, b"big", 0), Some(b"small".to_vec()));
    let too_big = vec![0u8; s.value_len_max() as usize + 1];
    assert!(matches!(
        s.put(0, b"x", ValueKind::String, &too_big, None, 0),
        Err(StorageError::ValueTooLarge { .. })
    ));
}

// Proves exactness when every key has the same hash: no wrong value, overwrite or delete.
#[test]
fn forced_collisions_stay_exact() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let mut c = cfg(64 * 1024, FsyncPolicy::Always);
    c.debug_hash_mask = 0;
    let mut s = one_shard(&dev, &c);
    for i in 0..60u32 {
        s.put(
            0,
            format!("c{i}").as_bytes(),
            ValueKind::String,
            format!("v{i}").as_bytes(),
            None,
            0,
        )
        .unwrap();
    }
    s.put(0, b"c5", ValueKind::String, b"over", None, 0)
        .unwrap();
    assert!(s.delete(0, b"c9", 0).unwrap());
    assert!(!s.delete(0, b"nope", 0).unwrap());
    assert_eq!(val(&mut s, b"nope", 0), None);
    assert_eq!(s.key_count(0), 59);
    s.flush().unwrap();
    drop(s);
    let mut s = one_shard(&dev, &c);
    assert_eq!(s.key_count(0), 59);
    for i in 0..60u32 {
        let want = match i {
            5 => Some(b"over".to_vec()),
            9 => None,
            _ => Some(format!("v{i}").into_bytes()),
        };
        assert_eq!(val(&mut s, format!("c{i}").as_bytes(), 0), want, "key c{i}");
    }
}

// Proves labels: a blank device is formatted, foreign or damaged labels are refused untouched.
#[test]
fn foreign_and_damaged_labels_are_refused() {
    let c = cfg(64 * 1024, FsyncPolicy::Always);
    let dev = Arc::new(MemDevice::new("t", 4 * MIB));
    let st = open_mem(&dev, &c);
    assert!(st.info.formatted);
    drop(st);
    assert!(!open_mem(&dev, &c).info.formatted);
    dev.flip_bits(20, 1);
    let err = open_on(vec![dev.clone() as Arc<dyn BlockDevice>], &c)
        .err()
        .unwrap();
    assert!(
        matches!(err, StorageError::ForeignLabel(ref m) if m.contains("damaged")),
        "{err}"
    );
    let foreign = Arc::new(MemDevice::new("f", 4 * MIB));
    foreign.flip_bits(100_000, 1);
    let err = open_on(vec![foreign.clone() as Arc<dyn BlockDevice>], &c)
        .err()
        .unwrap();
    assert!(
        matches!(err, StorageError::ForeignLabel(ref m) if m.contains("not a lavik")),
        "{err}"
    );
    assert_eq!(
        foreign.peek(0, 8),
        vec![0u8; 8],
        "foreign device was written"
    );
}

// Proves a two-device store allocates blocks on both and reopens with devices in any order.
#[test]
fn two_devices_share_one_store() {
    let a = Arc::new(MemDevice::new("a", 4 * MIB));
    let b = Arc::new(MemDevice::new("b", 4 * MIB));
    let c = cfg(64 * 1024, FsyncPolicy::Always);
    let devs = || {
        vec![
            a.clone() as Arc<dyn BlockDevice>,
            b.clone() as Arc<dyn BlockDevice>,
        ]
    };
    let mut s = open_on(devs(), &c).unwrap().shards.pop().unwrap();
    for i in 0..400u32 {
        s.put(
            0,
            format!("k{i}").as_bytes(),
            ValueKind::String,
            &[7u8; 600],
            None,
            0,
        )
        .unwrap();
    }
    s.flush().unwrap();
    drop(s);
    assert!(a.peek(128 * 1024, 1)[0] != 0 || b.peek(128 * 1024, 1)[0] != 0);
    assert!(b.peek(64 * 1024, 1)[0] != 0, "second device unused");
    let rev = vec![
        b.clone() as Arc<dyn BlockDevice>,
        a.clone() as Arc<dyn BlockDevice>,
    ];
    let mut s = open_on(rev, &c).unwrap().shards.pop().unwrap();
    assert_eq!(s.key_count(0), 400);
    assert_eq!(val(&mut s, b"k399", 0), Some(vec![7u8; 600]));
    let err = open_on(vec![a.clone() as Arc<dyn BlockDevice>], &c)
        .err()
        .unwrap();
    assert!(matches!(err, StorageError::ForeignLabel(_)), "{err}");
}

/// Builds: block 0 = live anchors; block 1 (sealed) = 20 puts and their 20 tombstones plus
/// dead filler. Returns the shard.
fn tomb_scenario(dev: &Arc<MemDevice>, c: &StoreConfig) -> Shard {
    let mut s = one_shard(dev, c);
    for i in 0..60u32 {
        s.put(
            0,
            format!("anchor{i}").as_bytes(),
            ValueKind::String,
            &[1u8; 1000],
            None,
            0,
        )
        .unwrap();
    }
    s.put(0, b"seal", ValueKind::String, &[2u8; 10_000], None, 0)
        .unwrap();
    for i in 0..20u32 {
        s.put(
            0,
            format!("d{i}").as_bytes(),
            ValueKind::String,
            &[3u8; 100],
            None,
            0,
        )
        .unwrap();
    }
    for i in 0..20u32 {
        assert!(s.delete(0, format!("d{i}").as_bytes(), 0).unwrap());
    }
    for _ in 0..6 {
        s.put(0, b"filler", ValueKind::String, &[4u8; 20_000], None, 0)
            .unwrap();
    }
    s.flush().unwrap();
    s
}

// Proves that without the tomb raider, defrag copies tombstones forward while an older block
// exists (they might shadow something), and never drops them.
#[test]
fn defrag_keeps_tombstones_without_the_raider() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let mut c = cfg(64 * 1024, FsyncPolicy::Always);
    c.tomb_raider_interval_ms = 0;
    let mut s = tomb_scenario(&dev, &c);
    for _ in 0..20 {
        s.background(0, 1000).unwrap();
        s.flush().unwrap();
    }
    assert_eq!(s.tomb_raider_status().tombstones_dropped, 0);
    assert!(s.stats().defrag_relocated_records >= 20);
    drop(s);
    let mut s = one_shard(&dev, &c);
    assert_eq!(s.get(0, b"d3", 0).unwrap(), None);
    assert_eq!(s.key_count(0), 62);
}

// Proves the tomb raider marks tombstones that shadow nothing, defrag then drops them, and
// the deleted keys stay deleted after a reopen.
#[test]
fn tomb_raider_lets_defrag_drop_dead_tombstones() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let mut c = cfg(64 * 1024, FsyncPolicy::Always);
    c.tomb_raider_interval_ms = 0;
    c.defrag_paused = true;
    let mut s = tomb_scenario(&dev, &c);
    s.tomb_raider_start_now();
    for _ in 0..20 {
        s.background(0, 1000).unwrap();
    }
    let st = s.tomb_raider_status();
    assert_eq!(st.runs_completed, 1, "{st:?}");
    assert_eq!(st.droppable_tombstones, 20, "{st:?}");
    s.set_defrag_paused(false);
    for _ in 0..20 {
        s.background(0, 1000).unwrap();
        s.flush().unwrap();
    }
    assert_eq!(s.tomb_raider_status().tombstones_dropped, 20);
    drop(s);
    let mut s = one_shard(&dev, &c);
    for i in 0..20u32 {
        assert_eq!(s.get(0, format!("d{i}").as_bytes(), 0).unwrap(), None);
    }
    assert_eq!(s.key_count(0), 62);
}

// Proves per-key expiry state stays one entry per volatile key across overwrites, EXPIRE,
// PERSIST, delete and FLUSHDB (no stale entries pile up), including after recovery.
#[test]
fn expiry_state_does_not_accumulate() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let c = cfg(64 * 1024, FsyncPolicy::Always);
    let mut s = one_shard(&dev, &c);
    for i in 0..100u64 {
        s.put(0, b"v", ValueKind::String, b"x", Some(10_000 + i), 0)
            .unwrap();
        s.put(
            1,
            format!("w{i}").as_bytes(),
            ValueKind::String,
            b"x",
            Some(10_000),
            0,
        )
        .unwrap();
    }
    assert_eq!(s.stats().volatile_entries, 101);
    assert!(s.set_expiry(0, b"v", Some(20_000), 0).unwrap());
    assert_eq!(s.stats().volatile_entries, 101);
    s.flush().unwrap();
    drop(s);
    let mut s = one_shard(&dev, &c);
    assert_eq!(s.stats().volatile_entries, 101);
    assert!(s.set_expiry(0, b"v", None, 0).unwrap());
    assert_eq!(s.stats().volatile_entries, 100);
    s.flush_db(1).unwrap();
    assert_eq!(s.stats().volatile_entries, 0);
    s.put(0, b"v", ValueKind::String, b"x", Some(5), 0).unwrap();
    assert!(s.delete(0, b"v", 0).unwrap());
    assert_eq!(s.stats().volatile_entries, 0);
}

// Proves a mass delete does not make defrag rewrite the same needed tombstones forever:
// blocks made of tombstones that must be kept are not defrag candidates.
#[test]
fn needed_tombstones_do_not_cause_endless_defrag() {
    let dev = Arc::new(MemDevice::new("t", 16 * MIB));
    let mut c = cfg(64 * 1024, FsyncPolicy::Always);
    c.tomb_raider_interval_ms = 0;
    let mut s = one_shard(&dev, &c);
    for i in 0..60u32 {
        s.put(
            0,
            format!("anchor{i}").as_bytes(),
            ValueKind::String,
            &[1u8; 1000],
            None,
            0,
        )
        .unwrap();
    }
    for i in 0..3000u32 {
        s.put(
            0,
            format!("d{i}").as_bytes(),
            ValueKind::String,
            &[3u8; 100],
            None,
            0,
        )
        .unwrap();
    }
    for i in 0..3000u32 {
        assert!(s.delete(0, format!("d{i}").as_bytes(), 0).unwrap());
    }
    s.put(0, b"last", ValueKind::String, &[5u8; 30_000], None, 0)
        .unwrap();
    s.flush().unwrap();
    for _ in 0..300 {
        s.background(0, 1000).unwrap();
        s.flush().unwrap();
    }
    let moved = s.stats().defrag_relocated_records;
    assert!(
        moved < 6000,
        "defrag relocated {moved} records for 3000 tombstones"
    );
    drop(s);
    let mut s = one_shard(&dev, &c);
    assert_eq!(s.get(0, b"d1234", 0).unwrap(), None);
    assert_eq!(s.key_count(0), 61);
}

// Proves flush_due follows the policy: Always flushes anything staged, EverySec and No only
// after the window (or a full staging area), No without syncing; and flush clears it.
#[test]
fn flush_due_follows_the_policy() {
    for (policy, due_now, due_later) in [
        (FsyncPolicy::Always, true, true),
        (FsyncPolicy::EverySec, false, true),
        (FsyncPolicy::No, false, true),
    ] {
        let dev = Arc::new(MemDevice::new("t", 4 * MIB));
        let mut c = cfg(64 * 1024, policy);
        c.flush_max_ms = 100;
        let mut s = one_shard(&dev, &c);
        assert!(!s.flush_due(0) && !s.has_unflushed());
        s.put(0, b"k", ValueKind::String, b"v", None, 1000).unwrap();
        assert!(s.has_unflushed());
        assert_eq!(s.flush_due(1000), due_now, "{policy:?}");
        assert_eq!(s.flush_due(1100), due_later, "{policy:?}");
        s.flush().unwrap();
        assert!(!s.flush_due(5000) && !s.has_unflushed());
        let fsyncs = s.stats().fsyncs;
        assert_eq!(fsyncs > 0, policy != FsyncPolicy::No, "{policy:?}");
    }
}

fn reopen_after_shutdown(
    dev: &Arc<MemDevice>,
    c: &StoreConfig,
    s: Shard,
    checkpoint: bool,
) -> (Shard, StoreInfo) {
    s.shutdown(checkpoint).unwrap();
    let mut st = open_mem(dev, c);
    (st.shards.pop().unwrap(), st.info)
}

fn checkpoint_state(s: &mut Shard) -> Vec<Option<Value>> {
    let mut out = Vec::new();
    for db in 0..2u8 {
        for i in 0..400u32 {
            out.push(s.get(db, format!("k{i}").as_bytes(), 5).unwrap());
        }
    }
    out.push(s.get(0, b"big", 5).unwrap());
    out
}

fn checkpoint_workload(s: &mut Shard) {
    for db in 0..2u8 {
        for i in 0..400u32 {
            let ttl = (i % 3 == 0).then_some(1_000_000 + u64::from(i));
            s.put(
                db,
                format!("k{i}").as_bytes(),
                ValueKind::String,
                &value_of(i),
                ttl,
                0,
            )
            .unwrap();
        }
    }
    for i in (0..400u32).step_by(5) {
        s.delete(1, format!("k{i}").as_bytes(), 0).unwrap();
    }
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 249) as u8).collect();
    s.put(0, b"big", ValueKind::String, &big, None, 0).unwrap();
}

fn value_of(i: u32) -> Vec<u8> {
    vec![(i % 256) as u8; 50 + (i as usize * 7) % 700]
}

// Proves a clean shutdown with a checkpoint restores exactly the same state without a scan,
// and that writes after it, a crash and a scan-based reopen are still exact.
#[test]
fn checkpoint_round_trip_then_crash() {
    let dev = Arc::new(MemDevice::new("t", 16 * MIB));
    let c = cfg(64 * 1024, FsyncPolicy::Always);
    let mut s = one_shard(&dev, &c);
    checkpoint_workload(&mut s);
    let before = checkpoint_state(&mut s);
    let (counts, volatile) = ((s.key_count(0), s.key_count(1)), s.stats().volatile_entries);
    let (mut s, info) = reopen_after_shutdown(&dev, &c, s, true);
    assert!(info.checkpoint_used && info.last_shutdown_clean, "{info:?}");
    assert_eq!(checkpoint_state(&mut s), before);
    assert_eq!((s.key_count(0), s.key_count(1)), counts);
    assert_eq!(s.stats().volatile_entries, volatile);
    s.put(0, b"k1", ValueKind::String, b"after", None, 0)
        .unwrap();
    assert!(s.delete(0, b"k2", 0).unwrap());
    s.flush().unwrap();
    drop(s);
    dev.crash(None);
    let mut st = open_mem(&dev, &c);
    assert!(
        !st.info.checkpoint_used,
        "a checkpoint must not be used twice"
    );
    let mut s = st.shards.pop().unwrap();
    assert_eq!(s.get(0, b"k1", 0).unwrap().unwrap().bytes, b"after");
    assert_eq!(s.get(0, b"k2", 0).unwrap(), None);
    assert_eq!(s.get(0, b"k3", 0).unwrap().unwrap().bytes, value_of(3));
    assert_eq!(s.key_count(1), counts.1);
}

// Proves a damaged checkpoint is detected and the start falls back to a full scan with the
// same, correct result.
#[test]
fn damaged_checkpoint_falls_back_to_scan() {
    let dev = Arc::new(MemDevice::new("t", 16 * MIB));
    let c = cfg(64 * 1024, FsyncPolicy::Always);
    let mut s = one_shard(&dev, &c);
    checkpoint_workload(&mut s);
    let before = checkpoint_state(&mut s);
    s.shutdown(true).unwrap();
    let mut damaged = 0;
    for b in 0..(16 * MIB / (64 * 1024) - 1) {
        let base = (b + 1) * 64 * 1024;
        // Block kind sits at offset 32 (record header) + 36 (payload) of a block.
        if dev.peek(base, 72)[68..72] == [2, 0, 0, 0] {
            dev.flip_bits(base + 300, 8);
            damaged += 1;
        }
    }
    assert!(damaged > 0, "no checkpoint block found");
    let mut st = open_mem(&dev, &c);
    assert!(!st.info.checkpoint_used);
    let mut s = st.shards.pop().unwrap();
    assert_eq!(checkpoint_state(&mut s), before);
}

// Proves defrag honours the background budget: a block is relocated over several calls, a
// bounded number of records per call, and freed at the end with the data intact.
#[test]
fn defrag_is_incremental_under_a_small_budget() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let mut s = one_shard(&dev, &cfg(64 * 1024, FsyncPolicy::Always));
    defrag_workload(&mut s);
    s.background(0, 100).unwrap();
    let mut last = s.stats().defrag_relocated_records;
    let mut steps = 0;
    while s.stats().defrag_freed_blocks == 0 {
        s.background(0, 100).unwrap();
        s.flush().unwrap();
        let now = s.stats().defrag_relocated_records;
        assert!(
            now - last <= 10,
            "{} records relocated in one small step",
            now - last
        );
        last = now;
        steps += 1;
        assert!(steps < 500, "defrag never finished");
    }
    assert!(steps > 3, "a whole block was relocated in {steps} steps");
    for i in 0..400u32 {
        let want = if i % 4 == 0 { 0u8 } else { 1 };
        assert_eq!(
            s.get(0, format!("k{i}").as_bytes(), 0)
                .unwrap()
                .unwrap()
                .bytes,
            vec![want; 100]
        );
    }
}

// Proves a large put whose fragment barrier fails reports the error, leaves the old value in
// place, and gives the orphaned extents back at the next flush.
#[test]
fn failed_large_put_leaks_nothing() {
    let dev = Arc::new(MemDevice::new("t", 16 * MIB));
    let mut s = one_shard(&dev, &cfg(64 * 1024, FsyncPolicy::Always));
    s.put(0, b"big", ValueKind::String, b"old", None, 0)
        .unwrap();
    s.flush().unwrap();
    let used = s.stats().blocks_used;
    dev.fail_next_syncs(1);
    let big = vec![9u8; 500_000];
    assert!(matches!(
        s.put(0, b"big", ValueKind::String, &big, None, 0),
        Err(StorageError::Device(_))
    ));
    assert_eq!(val(&mut s, b"big", 0), Some(b"old".to_vec()));
    s.flush().unwrap();
    assert_eq!(s.stats().blocks_used, used);
    s.put(0, b"big", ValueKind::String, &big, None, 0).unwrap();
    assert_eq!(val(&mut s, b"big", 0), Some(big));
}

fn mix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The keyspace after the first `upto` operations of `log`.
fn state_after(
    log: &[(u8, Option<Vec<u8>>)],
    upto: usize,
) -> std::collections::BTreeMap<u8, Vec<u8>> {
    let mut m = std::collections::BTreeMap::new();
    for (k, v) in &log[..upto] {
        match v {
            Some(v) => m.insert(*k, v.clone()),
            None => m.remove(k),
        };
    }
    m
}

fn shard_state(s: &mut Shard, keys: u8) -> std::collections::BTreeMap<u8, Vec<u8>> {
    (0..keys)
        .filter_map(|k| val(s, &[k], 0).map(|v| (k, v)))
        .collect()
}

/// The bytes a chunk write hands out, as they are now.
fn chunk_bytes(io: &ChunkIo) -> Vec<u8> {
    // SAFETY: the shard keeps these bytes alive and unchanged until `flush_chunk_done`,
    // which the caller has not called yet.
    unsafe { std::slice::from_raw_parts(io.ptr, io.len) }.to_vec()
}

fn perform_write(dev: &MemDevice, io: &ChunkIo, bytes: &[u8]) {
    let mut buf = crate::device::AlignedBuf::new_zeroed(bytes.len());
    buf.as_mut_slice().copy_from_slice(bytes);
    dev.write_at(io.offset, &buf).expect("mem write");
}

// Proves writes in flight lose nothing durable, never change under the write, and survive seals, failures and crashes.
#[test]
fn async_chunk_writes_recover_a_durable_prefix() {
    const KEYS: u8 = 24;
    let mut seals_in_flight = 0u32;
    for seed in 0..30u64 {
        let dev = Arc::new(MemDevice::new("t", 16 * MIB));
        let c = cfg(64 * 1024, FsyncPolicy::Always);
        let mut s = one_shard(&dev, &c);
        let mut rng = seed;
        let mut log: Vec<(u8, Option<Vec<u8>>)> = Vec::new();
        let mut durable_at = 0usize;
        let mut inflight: Option<(ChunkIo, Vec<u8>, usize)> = None;
        for step in 0..500u32 {
            let roll = mix(&mut rng) % 100;
            match roll {
                0..=59 => {
                    let k = (mix(&mut rng) % u64::from(KEYS)) as u8;
                    let len = 200 + (mix(&mut rng) % 2800) as usize;
                    let v: Vec<u8> = (0..len).map(|i| (i as u32 ^ step) as u8).collect();
                    let blocks_before = s.blocks.len();
                    s.put(0, &[k], ValueKind::String, &v, None, 0).unwrap();
                    if inflight.is_some() && s.blocks.len() > blocks_before {
                        seals_in_flight += 1;
                    }
                    log.push((k, Some(v)));
                }
                60..=69 => {
                    let k = (mix(&mut rng) % u64::from(KEYS)) as u8;
                    s.delete(0, &[k], 0).unwrap();
                    log.push((k, None));
                }
                70..=79 => {
                    if inflight.is_none() {
                        if let Some(io) = s.flush_chunk_begin_any().unwrap() {
                            let bytes = chunk_bytes(&io);
                            inflight = Some((io, bytes, log.len()));
                        }
                    }
                }
                80..=89 => {
                    if let Some((io, bytes, at)) = inflight.take() {
                        assert_eq!(chunk_bytes(&io), bytes, "bytes changed under a write");
                        let res = if mix(&mut rng).is_multiple_of(6) {
                            -libc::EIO // lost: the shard must write them itself
                        } else {
                            perform_write(&dev, &io, &bytes);
                            io.len as i32
                        };
                        // A device without a descriptor is synced inside.
                        assert!(s.flush_chunk_done(res).unwrap().is_empty());
                        durable_at = durable_at.max(at);
                    }
                }
                90..=94 => {
                    s.flush().unwrap();
                    durable_at = log.len();
                }
                _ => {
                    if let Some((io, bytes, _)) = inflight.take() {
                        if mix(&mut rng).is_multiple_of(2) {
                            perform_write(&dev, &io, &bytes); // landed, not synced
                        }
                    }
                    drop(s);
                    dev.crash_random(seed * 1000 + u64::from(step));
                    s = one_shard(&dev, &c);
                    // Each key holds its value as of some point at or after the last durable
                    // one (unacknowledged writes may be lost, not only as a suffix: a later
                    // unsynced chunk can survive an earlier one, and recovery applies it).
                    let got = shard_state(&mut s, KEYS);
                    let states: Vec<_> = (durable_at..=log.len())
                        .map(|p| state_after(&log, p))
                        .collect();
                    for k in 0..KEYS {
                        assert!(
                            states.iter().any(|st| st.get(&k) == got.get(&k)),
                            "seed {seed} step {step}: key {k} recovered as {:?} bytes, not a \
                             value it had at or after the last durable point",
                            got.get(&k).map(Vec::len)
                        );
                    }
                    // Recovered data is durable: continue from it.
                    log = got.into_iter().map(|(k, v)| (k, Some(v))).collect();
                    durable_at = log.len();
                    continue;
                }
            }
            if step % 7 == 0 {
                assert_eq!(
                    shard_state(&mut s, KEYS),
                    state_after(&log, log.len()),
                    "seed {seed} step {step}: reads disagree with the model"
                );
            }
        }
        if let Some((io, bytes, _)) = inflight.take() {
            perform_write(&dev, &io, &bytes);
            s.flush_chunk_done(io.len as i32).unwrap();
        }
    }
    assert!(
        seals_in_flight > 0,
        "no block was sealed under a write in flight"
    );
}

// Proves a chunk write failing twice stops the shard's writes with a clear error; reads and durable data survive.
#[test]
fn chunk_write_failing_twice_refuses_writes() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let c = cfg(64 * 1024, FsyncPolicy::Always);
    let mut s = one_shard(&dev, &c);
    s.put(0, b"safe", ValueKind::String, b"1", None, 0).unwrap();
    s.flush().unwrap();
    s.put(0, b"doomed", ValueKind::String, b"2", None, 0)
        .unwrap();
    let _io = s.flush_chunk_begin_any().unwrap().expect("staged");
    dev.fail_next_writes(1);
    let err = s.flush_chunk_done(-libc::EIO).unwrap_err();
    assert!(matches!(err, StorageError::WriteFailed(_)), "{err}");
    let err = s
        .put(0, b"more", ValueKind::String, b"3", None, 0)
        .unwrap_err();
    assert!(err.to_string().contains("writes refused"), "{err}");
    assert!(s.flush().is_err());
    assert_eq!(val(&mut s, b"safe", 0), Some(b"1".to_vec()));
    drop(s);
    dev.crash(None);
    let mut s = one_shard(&dev, &c);
    assert_eq!(val(&mut s, b"safe", 0), Some(b"1".to_vec()));
    assert_eq!(val(&mut s, b"doomed", 0), None);
}

/// Fills `s` so that its first blocks are mostly dead (defrag candidates).
fn defrag_workload(s: &mut Shard) {
    for round in 0..2u8 {
        for i in 0..400u32 {
            if round == 0 || i % 4 != 0 {
                s.put(
                    0,
                    format!("k{i}").as_bytes(),
                    ValueKind::String,
                    &[round; 100],
                    None,
                    0,
                )
                .unwrap();
            }
        }
    }
    s.flush().unwrap();
}

// Proves --defrag-record-sleep-us relocates at most one record per interval, whatever the budget.
#[test]
fn defrag_record_sleep_paces_relocations() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let mut c = cfg(64 * 1024, FsyncPolicy::Always);
    c.defrag_record_sleep_us = 1_000_000;
    let mut s = one_shard(&dev, &c);
    defrag_workload(&mut s);
    let start = std::time::Instant::now();
    let mut calls = 0;
    while start.elapsed() < std::time::Duration::from_millis(50) {
        s.background(0, 1_000_000).unwrap();
        calls += 1;
    }
    let moved = s.stats().defrag_relocated_records;
    assert_eq!(
        moved, 1,
        "{moved} records relocated in 50 ms ({calls} calls)"
    );
    std::thread::sleep(std::time::Duration::from_millis(1050));
    s.background(0, 1_000_000).unwrap();
    assert_eq!(s.stats().defrag_relocated_records, 2);
}

// Proves --defrag-max-active-per-device 1 lets only one shard of a device defrag at a time.
#[test]
fn defrag_jobs_limited_per_device() {
    let dev = Arc::new(MemDevice::new("t", 16 * MIB));
    let mut c = cfg(64 * 1024, FsyncPolicy::Always);
    c.shard_count = 2;
    c.defrag_max_active_per_device = 1;
    let mut shards = open_mem(&dev, &c).shards;
    for s in shards.iter_mut() {
        defrag_workload(s);
    }
    // A small budget: a job takes several calls.
    shards[0].background(0, 600).unwrap();
    shards[1].background(0, 600).unwrap();
    assert!(
        shards[0].defrag_job.is_some(),
        "first shard did not start a job"
    );
    assert!(
        shards[1].defrag_job.is_none(),
        "second shard started a job beside the first"
    );
    let mut steps = 0;
    while shards[1].defrag_job.is_none() && shards[1].stats().defrag_freed_blocks == 0 {
        shards[0].background(0, 600).unwrap();
        shards[0].flush().unwrap();
        shards[1].background(0, 600).unwrap();
        assert!(
            shards[0].defrag_job.is_none() || shards[1].defrag_job.is_none(),
            "two jobs at once"
        );
        steps += 1;
        assert!(steps < 1000, "second shard never got to defrag");
    }
}

// Proves the "no defrag candidate" memo does not hide a candidate that appears later at the
// same `now`: overwrites that empty a sealed block get it freed by the next background steps.
#[test]
fn defrag_finds_a_candidate_made_after_an_idle_scan() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let mut s = one_shard(&dev, &cfg(64 * 1024, FsyncPolicy::Always));
    let value = [7u8; 1000];
    // About three blocks of records: the first ones get sealed.
    for i in 0..180u32 {
        s.put(
            0,
            format!("k{i}").as_bytes(),
            ValueKind::String,
            &value,
            None,
            0,
        )
        .unwrap();
    }
    s.flush().unwrap();
    for _ in 0..5 {
        s.background(0, 1000).unwrap();
    }
    assert!(
        s.defrag_idle.is_some(),
        "an all-live store has no candidate"
    );
    assert_eq!(s.stats().defrag_freed_blocks, 0);
    // Overwrite the keys of the first block: it is now all dead.
    for i in 0..60u32 {
        s.put(
            0,
            format!("k{i}").as_bytes(),
            ValueKind::String,
            b"x",
            None,
            0,
        )
        .unwrap();
    }
    s.flush().unwrap();
    for _ in 0..20 {
        s.background(0, 1000).unwrap();
        s.flush().unwrap();
    }
    assert!(s.stats().defrag_freed_blocks >= 1, "{:?}", s.stats());
    for i in 0..180u32 {
        let want: &[u8] = if i < 60 { b"x" } else { &value };
        assert_eq!(
            val(&mut s, format!("k{i}").as_bytes(), 0).as_deref(),
            Some(want)
        );
    }
}

// Proves every write path touches a watched key: put, set_expiry, delete, lazy and active
// expiry, flush_db (only when the key exists); reads and other keys do not.
#[test]
fn watched_keys_are_touched_by_every_write_path() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let mut s = one_shard(&dev, &cfg(64 * 1024, FsyncPolicy::EverySec));
    let put = |s: &mut Shard, k: &[u8], exp: Option<u64>| {
        s.put(0, k, ValueKind::String, b"v", exp, 0).unwrap()
    };
    put(&mut s, b"k", None);
    type Write = fn(&mut Shard);
    let writes: &[(&str, Write)] = &[
        ("put", |s| {
            s.put(0, b"k", ValueKind::String, b"w", None, 0).unwrap()
        }),
        ("set_expiry", |s| {
            assert!(s.set_expiry(0, b"k", Some(5_000), 0).unwrap())
        }),
        ("delete", |s| assert!(s.delete(0, b"k", 0).unwrap())),
        ("flush_db", |s| s.flush_db(0).unwrap()),
    ];
    for (what, write) in writes {
        put(&mut s, b"k", None);
        let mark = s.watch_register(0, b"k", 0).unwrap();
        let _ = s.get(0, b"k", 0).unwrap();
        put(&mut s, b"other", None);
        assert!(
            !s.watch_changed(0, b"k", mark, 0).unwrap(),
            "{what}: untouched"
        );
        write(&mut s);
        assert!(
            s.watch_changed(0, b"k", mark, 0).unwrap(),
            "{what}: touched"
        );
        s.watch_release(0, b"k");
    }
    assert_eq!(s.watched_key_count(), 0);
    // A flush does not touch a watched key that does not exist.
    s.delete(0, b"k", 0).unwrap();
    let mark = s.watch_register(0, b"k", 0).unwrap();
    s.flush_db(0).unwrap();
    assert!(!s.watch_changed(0, b"k", mark, 0).unwrap());
    s.watch_release(0, b"k");
    // Expiry: a live key that expires after WATCH is a change before and after reaping.
    put(&mut s, b"e", Some(100));
    let mark = s.watch_register(0, b"e", 50).unwrap();
    assert!(!s.watch_changed(0, b"e", mark, 50).unwrap());
    assert!(s.watch_changed(0, b"e", mark, 150).unwrap());
    assert_eq!(val(&mut s, b"e", 150), None);
    assert!(s.watch_changed(0, b"e", mark, 150).unwrap());
    s.watch_release(0, b"e");
    // Already expired at WATCH: its deletion by active expiry is forgiven, a new put is not.
    put(&mut s, b"x", Some(100));
    let mark = s.watch_register(0, b"x", 200).unwrap();
    assert!(mark.expired);
    s.background(200, 10_000).unwrap();
    assert_eq!(s.key_count(0), 0);
    assert!(!s.watch_changed(0, b"x", mark, 200).unwrap());
    put(&mut s, b"x", None);
    assert!(s.watch_changed(0, b"x", mark, 200).unwrap());
}

// Proves that one command's records in ONE shard are all-or-nothing on a crash: a two-key
// write whose second record seals the open block does not leave the first key's new version
// behind without the second's (the command scope moves the first record into the new block).
#[test]
fn a_block_seal_does_not_split_one_command() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let c = cfg(64 * 1024, FsyncPolicy::Always);
    let mut s = one_shard(&dev, &c);
    let value = |v: u32| {
        let mut b = v.to_le_bytes().to_vec();
        b.resize(1500, b'.');
        b
    };
    let mut split_at = None;
    for v in 1..200u32 {
        // One command (an MSET a b): its records are written inside a command scope.
        s.command_begin();
        s.put(0, b"a", ValueKind::String, &value(v), None, 0)
            .unwrap();
        let before = dev.unsynced_writes();
        s.put(0, b"b", ValueKind::String, &value(v), None, 0)
            .unwrap();
        s.command_end();
        if dev.unsynced_writes() > before && v > 1 {
            split_at = Some(v);
            break;
        }
        // Group commits of several commands, as the server's rounds make them.
        if v % 7 == 0 {
            s.flush().unwrap();
        }
    }
    let v = split_at.expect("some pair straddles a block boundary");
    drop(s);
    // Power loss that keeps the sealed block's write whole and nothing after it.
    dev.crash(Some(crate::device::TearLastWrite {
        keep_sectors: u32::MAX,
    }));
    let mut s = one_shard(&dev, &c);
    let version = |s: &mut Shard, k: &[u8]| {
        let b = val(s, k, 0).expect("key recovered");
        u32::from_le_bytes(b[..4].try_into().unwrap())
    };
    let (a, b) = (version(&mut s, b"a"), version(&mut s, b"b"));
    assert_eq!(a, b, "pair {v}: one command's two records recovered apart");
}

// Proves that a write to two shards is all-or-nothing on a crash. It replays the server's
// coordinated pass under `appendfsync always` with the old order of flushes (the lent shard
// flushed and synced, the coordinator's own shard not yet) and a crash in between: the
// group's part on shard 0 is missing, so neither part is applied.
#[test]
fn a_two_shard_write_is_all_or_nothing() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let c = StoreConfig {
        shard_count: 2,
        ..cfg(64 * 1024, FsyncPolicy::Always)
    };
    let mut shards = open_mem(&dev, &c).shards;
    for (i, s) in shards.iter_mut().enumerate() {
        s.put(
            0,
            format!("k{i}").as_bytes(),
            ValueKind::String,
            b"old",
            None,
            0,
        )
        .unwrap();
        s.flush().unwrap();
    }
    // One MSET k0 new k1 new: a part on each shard, in one write scope (a group).
    let mut slots: Vec<Option<Shard>> = shards.into_iter().map(Some).collect();
    let mut groups = crate::storage::WriteGroups::default();
    groups.begin(&mut slots, vec![0, 1]);
    for (i, s) in slots.iter_mut().flatten().enumerate() {
        s.put(
            0,
            format!("k{i}").as_bytes(),
            ValueKind::String,
            b"new",
            None,
            0,
        )
        .unwrap();
    }
    groups.end(&mut slots).unwrap();
    let mut shards: Vec<Shard> = slots.into_iter().flatten().collect();
    // The end of the coordinated pass: the lent shard (1) is made durable ...
    shards[1].flush().unwrap();
    // ... and the process dies before the coordinator's epoch writes shard 0.
    drop(shards);
    dev.crash(None);
    let mut shards = open_mem(&dev, &c).shards;
    let k0 = val(&mut shards[0], b"k0", 0);
    let k1 = val(&mut shards[1], b"k1", 0);
    assert_eq!(k0, k1, "the two parts of one write recovered apart");
    assert_eq!(
        k0.as_deref(),
        Some(&b"old"[..]),
        "the incomplete group is dropped"
    );
    // The decision is stable: a second crash and recovery (decided_below now past the
    // aborted group) still finds the old values.
    drop(shards);
    dev.crash(None);
    let mut shards = open_mem(&dev, &c).shards;
    assert_eq!(val(&mut shards[1], b"k1", 0).as_deref(), Some(&b"old"[..]));
    assert_eq!(val(&mut shards[0], b"k0", 0).as_deref(), Some(&b"old"[..]));
}

// Proves a settled group (every part written and synced, then decided) survives a crash
// whole, and keeps surviving once decided_below passes it and defrag-free paths run.
#[test]
fn a_settled_two_shard_write_survives_whole() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let c = StoreConfig {
        shard_count: 2,
        ..cfg(64 * 1024, FsyncPolicy::Always)
    };
    let shards = open_mem(&dev, &c).shards;
    let mut slots: Vec<Option<Shard>> = shards.into_iter().map(Some).collect();
    let mut groups = crate::storage::WriteGroups::default();
    groups.begin(&mut slots, vec![0, 1]);
    for (i, s) in slots.iter_mut().flatten().enumerate() {
        s.put(
            0,
            format!("k{i}").as_bytes(),
            ValueKind::String,
            b"v1",
            None,
            0,
        )
        .unwrap();
        s.delete(0, b"absent", 0).unwrap();
    }
    groups.end(&mut slots).unwrap();
    assert!(groups.unsettled());
    groups.settle(&mut slots).unwrap();
    let writes = dev.unsynced_writes();
    assert_eq!(writes, 0, "settling synced every part");
    drop(slots);
    dev.crash(None);
    for _ in 0..2 {
        let mut shards = open_mem(&dev, &c).shards;
        assert_eq!(val(&mut shards[0], b"k0", 0).as_deref(), Some(&b"v1"[..]));
        assert_eq!(val(&mut shards[1], b"k1", 0).as_deref(), Some(&b"v1"[..]));
        // A later plain write on one shard flushes a marker whose decided_below passes the
        // group; recovery then takes the group as decided.
        shards[0]
            .put(0, b"other", ValueKind::String, b"x", None, 0)
            .unwrap();
        shards[0].flush().unwrap();
        drop(shards);
        dev.crash(None);
    }
}

/// One write of the group-atomicity model: keys (indexes into `MODEL_KEYS`) and the value
/// each gets (`None`: deleted).
#[derive(Clone, Debug)]
struct ModelOp {
    writes: Vec<(usize, Option<Vec<u8>>)>,
}

const MODEL_KEYS: usize = 12;

fn model_key(k: usize) -> Vec<u8> {
    format!("m{k}").into_bytes()
}

/// A random run: multi-key MSETs (values big enough that block seals fall inside them),
/// multi-key DELs and one-key SETs, some of them batched like a coordinated pass.
fn model_ops(seed: u64, n: usize) -> Vec<(ModelOp, bool)> {
    let mut rng = seed | 1;
    let mut next = move |m: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % m
    };
    let mut out = Vec::new();
    for j in 0..n {
        let kind = next(10);
        let count = match kind {
            0..=5 => 2 + next(3) as usize,
            6..=7 => 2 + next(2) as usize,
            _ => 1,
        };
        let mut keys: Vec<usize> = Vec::new();
        while keys.len() < count {
            let k = next(MODEL_KEYS as u64) as usize;
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        let writes = keys
            .into_iter()
            .map(|k| {
                let v = (!(6..=7).contains(&kind)).then(|| {
                    let mut v = format!("op{j}:{k}:").into_bytes();
                    v.resize(500 + next(6000) as usize, b'.');
                    v
                });
                (k, v)
            })
            .collect();
        // `true`: this op ends a batch (the pass settles after it).
        out.push((ModelOp { writes }, next(3) != 0));
    }
    out
}

/// Runs `ops` on a store of three shards (each multi-key op in a write scope, as the
/// server does). Returns per op the keys it actually wrote and the journal position after
/// which it is durable (its settle, or its shard's flush for a one-key write).
fn model_run(
    dev: &Arc<MemDevice>,
    c: &StoreConfig,
    ops: &[(ModelOp, bool)],
) -> Vec<(Vec<usize>, Option<usize>)> {
    let shards = open_mem(dev, c).shards;
    let mut slots: Vec<Option<Shard>> = shards.into_iter().map(Some).collect();
    let mut groups = crate::storage::WriteGroups::default();
    let shard_of =
        |k: usize| crate::storage::shard_of_slot(crate::storage::key_slot(&model_key(k)), 3);
    let mut done: Vec<(Vec<usize>, Option<usize>)> = Vec::new();
    let mut unacked: Vec<usize> = Vec::new();
    let mut in_batch = false;
    for (op, ends_batch) in ops {
        let mut ids: Vec<u32> = op.writes.iter().map(|(k, _)| shard_of(*k)).collect();
        ids.sort_unstable();
        ids.dedup();
        let scoped = op.writes.len() > 1;
        if !ends_batch && !in_batch {
            // A coordinated pass: one group over every shard around its commands.
            groups.begin(&mut slots, vec![0, 1, 2]);
            in_batch = true;
        }
        if scoped {
            groups.begin(&mut slots, ids.clone());
        }
        let mut wrote = Vec::new();
        for (k, v) in &op.writes {
            let s = slots[shard_of(*k) as usize].as_mut().unwrap();
            match v {
                Some(v) => {
                    s.put(0, &model_key(*k), ValueKind::String, v, None, 0)
                        .unwrap();
                    wrote.push(*k);
                }
                None => {
                    if s.delete(0, &model_key(*k), 0).unwrap() {
                        wrote.push(*k);
                    }
                }
            }
        }
        done.push((wrote, None));
        unacked.push(done.len() - 1);
        if scoped {
            groups.end(&mut slots).unwrap();
        }
        if *ends_batch {
            if in_batch {
                groups.end(&mut slots).unwrap();
                in_batch = false;
            }
            groups.settle(&mut slots).unwrap();
            if !scoped {
                slots[ids[0] as usize].as_mut().unwrap().flush().unwrap();
            }
            // Every op so far is written (a one-key op staged earlier on a shard not flushed
            // here may still be staged: flush them all, as the next epoch would).
            for s in slots.iter_mut().flatten() {
                s.flush().unwrap();
            }
            let at = dev.recorded_writes();
            for j in unacked.drain(..) {
                done[j].1 = Some(at);
            }
        }
    }
    // Ops of an unfinished batch: their records written, not synced (a settle that dies
    // before its sync).
    if in_batch {
        groups.end(&mut slots).unwrap();
    }
    for s in slots.iter_mut().flatten() {
        s.group_flush_write().unwrap();
    }
    done
}

/// Checks a recovered store against the model: every op wholly present or wholly absent,
/// every value one some op wrote, and every op durable at `cut` present.
fn model_check(
    shards: &mut [Shard],
    ops: &[(ModelOp, bool)],
    done: &[(Vec<usize>, Option<usize>)],
    cut: usize,
) -> Vec<Option<Vec<u8>>> {
    let shard_of = |k: usize| {
        crate::storage::shard_of_slot(crate::storage::key_slot(&model_key(k)), 3) as usize
    };
    let got: Vec<Option<Vec<u8>>> = (0..MODEL_KEYS)
        .map(|k| val(&mut shards[shard_of(k)], &model_key(k), 0))
        .collect();
    // Per key: the op indexes its recovered value is consistent with (-1: never written).
    let consistent: Vec<Vec<i64>> = (0..MODEL_KEYS)
        .map(|k| {
            let mut v: Vec<i64> = Vec::new();
            if got[k].is_none() {
                v.push(-1);
            }
            for (j, (op, _)) in ops.iter().enumerate() {
                if !done[j].0.contains(&k) {
                    continue;
                }
                let w = op.writes.iter().find(|(x, _)| *x == k).map(|(_, w)| w);
                if w == Some(&got[k]) {
                    v.push(j as i64);
                }
            }
            assert!(
                !v.is_empty(),
                "cut {cut}: key m{k} holds a value no op wrote"
            );
            v
        })
        .collect();
    for (j, (wrote, acked)) in done.iter().enumerate() {
        let j = j as i64;
        // A key holding exactly op j's value shows it present; a key holding only values
        // older than op j shows it absent (no later write of the key survived either). A
        // later op's value says nothing about op j.
        let after = |k: &usize| consistent[*k].iter().any(|&x| x >= j);
        let shows_present = wrote.iter().any(|k| consistent[*k] == [j]);
        let shows_absent = wrote.iter().any(|k| !after(k));
        assert!(
            !(shows_present && shows_absent),
            "cut {cut}: op {j} recovered in part ({:?})",
            ops[j as usize]
                .0
                .writes
                .iter()
                .map(|(k, _)| k)
                .collect::<Vec<_>>()
        );
        if acked.is_some_and(|a| a <= cut) {
            assert!(wrote.iter().all(after), "cut {cut}: durable op {j} lost");
        }
    }
    got
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3))]
    // Proves the engine against a model: random runs of multi-shard MSET/DEL groups (some
    // batched like a coordinated pass, block seals inside them) cut after every single
    // device write recover with every op wholly present or wholly absent, every durable op
    // present, and the same state again after a second crash and recovery.
    #[test]
    fn groups_survive_a_cut_after_every_write(seed in proptest::prelude::any::<u64>()) {
        let c = StoreConfig {
            shard_count: 3,
            ..cfg(64 * 1024, FsyncPolicy::Always)
        };
        let dev = Arc::new(MemDevice::new("t", 4 * MIB));
        dev.record_writes();
        let ops = model_ops(seed, 24);
        let done = model_run(&dev, &c, &ops);
        let total = dev.recorded_writes();
        for cut in 0..=total {
            let cut_dev = Arc::new(dev.replay_first(cut));
            let Ok(mut opened) = open_on(vec![cut_dev.clone() as Arc<dyn BlockDevice>], &c) else {
                // Cut before the label and first metadata slot were written: nothing to check.
                proptest::prop_assert!(cut < 8, "cut {} does not open", cut);
                continue;
            };
            let first = model_check(&mut opened.shards, &ops, &done, cut);
            drop(opened);
            cut_dev.crash(None);
            let mut again = open_mem(&cut_dev, &c);
            let second = model_check(&mut again.shards, &ops, &done, cut);
            proptest::prop_assert_eq!(first, second, "cut {}: a second recovery differs", cut);
        }
    }

    // Proves that a power loss dropping, keeping or tearing each unsynced write on its own
    // (reordering the shards' chunk writes) never recovers a group in part.
    #[test]
    fn groups_survive_reordered_power_loss(seed in proptest::prelude::any::<u64>()) {
        let c = StoreConfig {
            shard_count: 3,
            ..cfg(64 * 1024, FsyncPolicy::Always)
        };
        let dev = Arc::new(MemDevice::new("t", 4 * MIB));
        let mut ops = model_ops(seed, 16);
        // The last ops stay in one unsettled batch: their writes are in flight at the crash.
        let n = ops.len();
        for op in &mut ops[n - 4..] {
            op.1 = false;
        }
        let done = model_run(&dev, &c, &ops);
        // Their records written, not synced, as a settle that dies before its sync leaves them.
        dev.crash_random(seed);
        let mut opened = open_mem(&dev, &c);
        model_check(&mut opened.shards, &ops, &done, 0);
    }
}

// Proves the cost of a two-shard write: each record 8 bytes longer, one part record per
// shard, one chunk write per participant and one sync for the whole group; and that a
// one-record write outside a scope is byte for byte what it was (no group id, no part).
#[test]
fn multi_shard_write_cost() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let c = StoreConfig {
        shard_count: 2,
        ..cfg(64 * 1024, FsyncPolicy::Always)
    };
    let shards = open_mem(&dev, &c).shards;
    let mut slots: Vec<Option<Shard>> = shards.into_iter().map(Some).collect();
    let before: Vec<(u64, u64)> = slots
        .iter()
        .flatten()
        .map(|s| (s.stats().device_writes, s.stats().fsyncs))
        .collect();
    let mut groups = crate::storage::WriteGroups::default();
    groups.begin(&mut slots, vec![0, 1]);
    for (i, s) in slots.iter_mut().flatten().enumerate() {
        s.put(
            0,
            format!("k{i}").as_bytes(),
            ValueKind::String,
            b"v",
            None,
            0,
        )
        .unwrap();
        assert_eq!(s.group_records(), 1);
    }
    groups.end(&mut slots).unwrap();
    // Staged per shard: the block header (80), the GROUPED put (32 + 2 + 1 -> 40, + 8) and
    // the part record (32 + 16 + 4 * 2 = 56).
    for s in slots.iter().flatten() {
        assert_eq!(s.staged_bytes_for_tests(), 80 + 48 + 56);
    }
    groups.settle(&mut slots).unwrap();
    let after: Vec<(u64, u64)> = slots
        .iter()
        .flatten()
        .map(|s| (s.stats().device_writes, s.stats().fsyncs))
        .collect();
    let writes: u64 = after.iter().zip(&before).map(|(a, b)| a.0 - b.0).sum();
    let syncs: u64 = after.iter().zip(&before).map(|(a, b)| a.1 - b.1).sum();
    assert_eq!((writes, syncs), (2, 1));
    // A plain one-record write: header-only record, no part.
    let s = slots[0].as_mut().unwrap();
    s.put(0, b"k0", ValueKind::String, b"w", None, 0).unwrap();
    assert_eq!(s.staged_bytes_for_tests(), 40);
}

// Proves a store labelled format version 1 opens (its data intact) and is relabelled
// version 2, so a version-1 binary would refuse it from then on.
#[test]
fn a_version_1_label_opens_and_becomes_version_2() {
    let dev = Arc::new(MemDevice::new("t", 8 * MIB));
    let c = cfg(64 * 1024, FsyncPolicy::Always);
    let mut s = one_shard(&dev, &c);
    s.put(0, b"k", ValueKind::String, b"v", None, 0).unwrap();
    s.flush().unwrap();
    drop(s);
    let mut sector = dev.peek(0, 4096);
    sector[8..12].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32c::crc32c(&sector[..format::LABEL_CRC_OFFSET]);
    sector[124..128].copy_from_slice(&crc.to_le_bytes());
    let mut buf = crate::device::AlignedBuf::new_zeroed(4096);
    buf.as_mut_slice().copy_from_slice(&sector);
    dev.write_at(0, &buf).unwrap();
    dev.sync().unwrap();
    assert_eq!(format::label_version(&dev.peek(0, 4096)), 1);
    let mut s = one_shard(&dev, &c);
    assert_eq!(val(&mut s, b"k", 0).as_deref(), Some(&b"v"[..]));
    assert_eq!(format::label_version(&dev.peek(0, 4096)), 2);
}

mod scoped_pages {
    use super::*;
    use crate::storage::collection::{HashEncoding, HashValue};
    use crate::storage::paged;
    use std::collections::BTreeMap;

    fn load_hash(s: &mut Shard, key: &[u8]) -> Option<HashValue> {
        match s.get_collection(0, key, 0).unwrap()? {
            Collection::Whole(v) => Some(HashValue::decode(&v.bytes).unwrap()),
            Collection::Paged { root, .. } => {
                let root = paged::Root::decode(&root).unwrap();
                let (pairs, tree) = paged::load(s, 0, key, &root, true).unwrap();
                Some(HashValue::from_paged(pairs, tree))
            }
        }
    }

    fn store_hash(s: &mut Shard, key: &[u8], h: &HashValue) {
        let ht = h.encoding() == HashEncoding::Hashtable;
        let enc = h.encoding_byte();
        let r = match h.paged_tree() {
            Some(t) if h.body_bytes() >= paged::DEMOTE_BYTES => {
                paged::update(s, 0, key, ValueKind::Hash, enc, h.pairs(), t, None, 0)
            }
            None if ht && h.body_bytes() > paged::PROMOTE_BYTES => {
                paged::build(s, 0, key, ValueKind::Hash, enc, h.pairs(), None, 0)
            }
            _ => s.put(0, key, ValueKind::Hash, &h.encode(), None, 0),
        };
        r.unwrap();
    }

    fn live_total(s: &Shard) -> u64 {
        s.blocks
            .values()
            .filter(|i| i.kind == format::BLOCK_KIND_LOG)
            .map(|i| i.live_total())
            .sum()
    }

    /// What the index and the roots reach, in record bytes.
    fn reachable(s: &mut Shard, keys: &[&[u8]]) -> u64 {
        let mut want = 0u64;
        for k in keys {
            let h = s.hash(0, k);
            let Some(f) = s.find(0, k, h).unwrap() else {
                continue;
            };
            want += f.rec.header.record_len() as u64;
            if paged::is_root(f.rec.header.flags) {
                for (_, len) in paged::pages_of_stored(s, &f.rec).unwrap() {
                    want += format::record_len(k.len(), len as usize) as u64;
                }
            }
        }
        want
    }

    // Proves that paged hashes written inside command scopes (as SMOVE, EXEC and scripts
    // write them; each key twice in a scope, and one written and deleted) read back whole and
    // keep exact live bytes when block seals move a scope's staged records (pages, directory
    // pages, roots; a queued page release) into a new block, through a crash and a reopen.
    #[test]
    fn a_block_seal_inside_a_scope_keeps_paged_collections_whole() {
        let dev = Arc::new(MemDevice::new("t", 64 * MIB));
        let c = cfg(256 * 1024, FsyncPolicy::Always);
        let mut s = one_shard(&dev, &c);
        let keys: [&[u8]; 2] = [b"a", b"b"];
        let mut models: Vec<BTreeMap<Vec<u8>, Vec<u8>>> = vec![BTreeMap::new(); 2];
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let moves_before = s.counters.scope_moves;
        for round in 0..120u64 {
            s.command_begin();
            // Each key twice: pages written in the scope are replaced in the same scope,
            // before and after a seal.
            for i in [0usize, 1, 0, 1] {
                let key = keys[i];
                let mut h = load_hash(&mut s, key).unwrap_or_default();
                h.prepare_write(40, 1);
                for _ in 0..40 {
                    let r = next();
                    let f = format!("field-{}", r % 2500).into_bytes();
                    if round < 40 || r % 3 != 0 {
                        let v = format!("value-{}-{round}", r % 1000).into_bytes();
                        h.set(&f, &v);
                        models[i].insert(f, v);
                    } else {
                        h.remove(&f);
                        models[i].remove(&f);
                    }
                }
                store_hash(&mut s, key, &h);
                if i == 1 && round % 3 == 0 {
                    // A paged hash written and deleted inside the scope: its release is
                    // queued while its pages are staged, and a later seal may move them.
                    let mut c = HashValue::default();
                    c.prepare_write(400, 1);
                    for n in 0..400 {
                        c.set(format!("c-{n}").as_bytes(), &[b'c'; 60]);
                    }
                    store_hash(&mut s, b"c", &c);
                    s.delete(0, b"c", 0).unwrap();
                }
            }
            s.command_end();
            if round % 5 == 4 {
                s.flush().unwrap();
            }
            for (i, key) in keys.iter().enumerate() {
                let back: BTreeMap<_, _> = load_hash(&mut s, key)
                    .map(|h| h.pairs().iter().cloned().collect())
                    .unwrap_or_default();
                assert_eq!(back, models[i], "round {round}, key {i}");
            }
            paged::release_all(&mut s);
            assert_eq!(
                live_total(&s),
                reachable(&mut s, &keys),
                "live bytes, round {round}"
            );
        }
        assert!(
            s.counters.scope_moves > moves_before,
            "some seal moved a scope's records"
        );
        s.flush().unwrap();
        drop(s);
        dev.crash(None);
        let mut s = one_shard(&dev, &c);
        for (i, key) in keys.iter().enumerate() {
            let back: BTreeMap<_, _> = load_hash(&mut s, key)
                .map(|h| h.pairs().iter().cloned().collect())
                .unwrap_or_default();
            assert_eq!(back, models[i], "after the crash, key {i}");
        }
        paged::release_all(&mut s);
        assert_eq!(
            live_total(&s),
            reachable(&mut s, &keys),
            "live bytes after the crash"
        );
    }
}

// ---- blind overwrites (`docs/index.md`, "Blind overwrites") ---------------------------

fn blind_cfg(mask: u64) -> StoreConfig {
    let mut c = cfg(64 * 1024, FsyncPolicy::Always);
    c.blind_writes = true;
    c.debug_hash_mask = mask;
    c
}

/// Seals the open block with db-1 filler, so db-0 records written before are only on the
/// device (not in staging).
fn seal_with_filler(s: &mut Shard, round: u32) {
    for i in 0..30u32 {
        let key = format!("filler{i}");
        let v = vec![(round % 251) as u8; 3000];
        s.put(1, key.as_bytes(), ValueKind::String, &v, None, 0)
            .unwrap();
    }
    s.flush().unwrap();
}

fn blind(s: &mut Shard, key: &[u8], v: &[u8], ttl: Option<u64>, now: u64) {
    s.put_blind(0, key, ValueKind::String, v, ttl, now).unwrap();
    s.flush().unwrap();
}

fn exact_count(s: &mut Shard) -> u64 {
    s.settle_blind_all().unwrap();
    assert_eq!(s.stats().blind_pending, 0);
    s.key_count(0)
}

// Proves the forced-collision scenario: two keys sharing an index position (mask 0),
// written blindly over each other's records; SET both, overwrite both, DEL one, expire one,
// a crash, a restart with and without the checkpoint, defrag: every read and DBSIZE exact,
// and the blind path (no read of the old record) was really taken where expected.
#[test]
fn blind_overwrites_with_forced_collisions() {
    let dev = Arc::new(MemDevice::new("t", 16 * MIB));
    let c = blind_cfg(0);
    let mut s = one_shard(&dev, &c);
    let bw = |s: &Shard| s.stats().blind_writes;
    // SET both: b goes blindly over a's entry (a different key).
    blind(&mut s, b"a", b"a1", None, 0);
    seal_with_filler(&mut s, 0);
    blind(&mut s, b"b", b"b1", None, 0);
    assert_eq!((bw(&s), s.stats().blind_pending), (1, 1));
    assert_eq!(val(&mut s, b"b", 0), Some(b"b1".to_vec()));
    assert_eq!(val(&mut s, b"a", 0), Some(b"a1".to_vec()));
    assert_eq!(s.stats().blind_settled_new, 1);
    assert_eq!(exact_count(&mut s), 2);
    // Overwrite both: the position holds two entries, so these read (not blind).
    blind(&mut s, b"a", b"a2", None, 0);
    blind(&mut s, b"b", b"b2", None, 0);
    assert_eq!(bw(&s), 1);
    assert_eq!(val(&mut s, b"a", 0), Some(b"a2".to_vec()));
    assert_eq!(val(&mut s, b"b", 0), Some(b"b2".to_vec()));
    // DEL one; then a blind overwrite of the other (the same key under the entry).
    assert!(s.delete(0, b"b", 0).unwrap());
    seal_with_filler(&mut s, 1);
    blind(&mut s, b"a", b"a3", None, 0);
    assert_eq!(bw(&s), 2);
    assert_eq!(val(&mut s, b"b", 0), None);
    assert_eq!(s.stats().blind_settled_same, 1);
    assert_eq!(val(&mut s, b"a", 0), Some(b"a3".to_vec()));
    assert_eq!(exact_count(&mut s), 1);
    // Expire one: b written blindly over a with a TTL, read after it passed.
    seal_with_filler(&mut s, 2);
    blind(&mut s, b"b", b"b3", Some(100), 0);
    assert_eq!(bw(&s), 3);
    assert_eq!(val(&mut s, b"b", 200), None);
    assert_eq!(val(&mut s, b"a", 200), Some(b"a3".to_vec()));
    assert_eq!(exact_count(&mut s), 1);
    // A crash with a blind write unsettled: recovery decides from the log alone.
    seal_with_filler(&mut s, 3);
    blind(&mut s, b"a", b"a4", None, 200);
    assert_eq!((bw(&s), s.stats().blind_pending), (4, 1));
    drop(s);
    dev.crash(None);
    let mut s = one_shard(&dev, &c);
    assert_eq!(s.key_count(0), 1);
    assert_eq!(val(&mut s, b"a", 200), Some(b"a4".to_vec()));
    assert_eq!(val(&mut s, b"b", 200), None);
    // A clean shutdown with the checkpoint while a blind write over another key is unsettled.
    seal_with_filler(&mut s, 4);
    blind(&mut s, b"b", b"b5", None, 200);
    assert_eq!((bw(&s), s.stats().blind_pending), (1, 1));
    let (mut s, info) = reopen_after_shutdown(&dev, &c, s, true);
    assert!(info.checkpoint_used, "{info:?}");
    assert_eq!(s.key_count(0), 2);
    assert_eq!(val(&mut s, b"a", 200), Some(b"a4".to_vec()));
    assert_eq!(val(&mut s, b"b", 200), Some(b"b5".to_vec()));
    // Defrag with a blind write pending: old blocks full of dead filler are relocated.
    assert!(s.delete(0, b"b", 200).unwrap());
    for round in 5..12 {
        seal_with_filler(&mut s, round);
    }
    blind(&mut s, b"a", b"a6", None, 200);
    assert_eq!((bw(&s), s.stats().blind_pending), (1, 1));
    let mut rounds = 0;
    while s.stats().defrag_freed_blocks < 3 {
        s.background(200, 10_000).unwrap();
        s.flush().unwrap();
        rounds += 1;
        assert!(rounds < 2000, "defrag never freed blocks");
    }
    assert_eq!(val(&mut s, b"a", 200), Some(b"a6".to_vec()));
    assert_eq!(val(&mut s, b"b", 200), None);
    assert_eq!(exact_count(&mut s), 1);
    // A clean restart without the checkpoint (a full scan).
    let (mut s, info) = reopen_after_shutdown(&dev, &c, s, false);
    assert!(!info.checkpoint_used);
    assert_eq!(s.key_count(0), 1);
    assert_eq!(val(&mut s, b"a", 200), Some(b"a6".to_vec()));
    assert_eq!(val(&mut s, b"b", 200), None);
}

// Proves blind SETs of existing keys without collisions read nothing (no device read, the
// `lavik_overwrite_reads` counter stays 0), and that the same writes with blind writes off
// are counted there; DBSIZE is exact once the blind writes are settled.
#[test]
fn blind_overwrites_read_nothing() {
    for on in [true, false] {
        let dev = Arc::new(MemDevice::new("t", 16 * MIB));
        let mut c = blind_cfg(u64::MAX);
        c.blind_writes = on;
        let mut s = one_shard(&dev, &c);
        for i in 0..100u32 {
            blind(&mut s, format!("k{i}").as_bytes(), &[1; 500], None, 0);
        }
        seal_with_filler(&mut s, 0);
        let reads = s.stats().device_reads;
        for i in 0..100u32 {
            blind(&mut s, format!("k{i}").as_bytes(), &[2; 500], None, 0);
        }
        let st = s.stats();
        if on {
            assert_eq!(st.device_reads, reads, "a blind overwrite read the device");
            assert_eq!((st.overwrite_reads, st.blind_writes), (0, 100));
        } else {
            assert_eq!((st.overwrite_reads, st.blind_writes), (100, 0));
        }
        assert_eq!(exact_count(&mut s), 100);
        let st = s.stats();
        assert_eq!(st.blind_settled_same, if on { 100 } else { 0 });
        for i in 0..100u32 {
            assert_eq!(
                val(&mut s, format!("k{i}").as_bytes(), 0),
                Some(vec![2; 500])
            );
        }
    }
}

// Proves blind writes stay exact against a model under heavy forced collisions (16 index
// positions for 12 keys): a seeded mix of blind and reading SETs, DELs, TTLs, reads, DBSIZE,
// background work (expiry, defrag), crashes and restarts with and without the checkpoint.
#[test]
fn blind_overwrites_match_a_model() {
    use std::collections::BTreeMap;
    let dev = Arc::new(MemDevice::new("t", 32 * MIB));
    let c = blind_cfg(0xF000_0000_0000_0000);
    let mut s = one_shard(&dev, &c);
    let mut model: BTreeMap<Vec<u8>, (Vec<u8>, Option<u64>)> = BTreeMap::new();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut now = 1u64;
    let (mut blinds, mut same, mut new) = (0, 0, 0);
    let live = |m: &BTreeMap<Vec<u8>, (Vec<u8>, Option<u64>)>, k: &[u8], now: u64| {
        m.get(k)
            .filter(|(_, t)| t.is_none_or(|t| t > now))
            .map(|(v, _)| v.clone())
    };
    for op in 0..2000u32 {
        let r = mix(&mut rng);
        let key = format!("key{}", r % 12).into_bytes();
        now += (r >> 8) % 7;
        let v = format!("{op}").into_bytes();
        match (r >> 16) % 100 {
            0..=39 => {
                let ttl = (r >> 24)
                    .is_multiple_of(5)
                    .then(|| now + 1 + (r >> 32) % 150);
                blind(&mut s, &key, &v, ttl, now);
                model.insert(key, (v, ttl));
            }
            40..=47 => {
                s.put(0, &key, ValueKind::String, &v, None, now).unwrap();
                s.flush().unwrap();
                model.insert(key, (v, None));
            }
            48..=57 => {
                let want = live(&model, &key, now).is_some();
                assert_eq!(s.delete(0, &key, now).unwrap(), want, "op {op}: DEL");
                s.flush().unwrap();
                model.remove(&key);
            }
            58..=76 => {
                assert_eq!(val(&mut s, &key, now), live(&model, &key, now), "op {op}");
            }
            77..=84 => seal_with_filler(&mut s, op),
            85..=91 => {
                s.background(now, 5_000).unwrap();
                s.flush().unwrap();
            }
            92..=96 => {
                // DBSIZE: expired keys count until reaped, so read every key first.
                for i in 0..12 {
                    let k = format!("key{i}").into_bytes();
                    assert_eq!(val(&mut s, &k, now), live(&model, &k, now), "op {op}");
                }
                let n = model
                    .keys()
                    .filter(|k| live(&model, k, now).is_some())
                    .count();
                assert_eq!(exact_count(&mut s), n as u64, "op {op}: DBSIZE");
            }
            _ => {
                let st = s.stats();
                blinds += st.blind_writes;
                same += st.blind_settled_same;
                new += st.blind_settled_new;
                s = match (r >> 24) % 3 {
                    0 => {
                        drop(s);
                        dev.crash(None);
                        one_shard(&dev, &c)
                    }
                    n => reopen_after_shutdown(&dev, &c, s, n == 1).0,
                };
            }
        }
    }
    let st = s.stats();
    blinds += st.blind_writes;
    same += st.blind_settled_same;
    new += st.blind_settled_new;
    assert!(
        blinds > 50 && same > 10 && new > 10,
        "{blinds} {same} {new}"
    );
}

/// `n` keys `{p}{i}` of 500 bytes written with `put` (read path), then pushed to the device.
fn put_all(s: &mut Shard, p: &str, n: u32, byte: u8) {
    for i in 0..n {
        s.put(
            0,
            format!("{p}{i}").as_bytes(),
            ValueKind::String,
            &[byte; 500],
            None,
            0,
        )
        .unwrap();
    }
    s.flush().unwrap();
}

// Proves the exact count settles pending blind writes from one span read per block of
// `prev`s, reading neither the new records (their keys are kept) nor any record on its own:
// `sync_reads` does not grow (it grew by two per pending write when settling read `R` and
// `prev` one by one).
#[test]
fn blind_settle_all_reads_spans_not_records() {
    let dev = Arc::new(MemDevice::new("t", 16 * MIB));
    let mut s = one_shard(&dev, &blind_cfg(u64::MAX));
    put_all(&mut s, "k", 40, 1);
    seal_with_filler(&mut s, 0);
    for i in 0..40u32 {
        s.put_blind(
            0,
            format!("k{i}").as_bytes(),
            ValueKind::String,
            &[2; 500],
            None,
            0,
        )
        .unwrap();
    }
    // The new records leave staging too: settling must not need them.
    seal_with_filler(&mut s, 1);
    let st = s.stats();
    assert_eq!((st.blind_writes, st.blind_pending), (40, 40));
    let (sync0, reads0) = (s.cache_stats().sync_reads, st.device_reads);
    assert_eq!(exact_count(&mut s), 40);
    let st = s.stats();
    assert_eq!(
        s.cache_stats().sync_reads,
        sync0,
        "settling read records one by one"
    );
    assert!(
        (1..=2).contains(&st.blind_sweep_reads),
        "{} span reads for one block of prevs",
        st.blind_sweep_reads
    );
    assert_eq!(st.device_reads - reads0, st.blind_sweep_reads);
    assert_eq!(st.blind_settled_same, 40);
    for i in 0..40u32 {
        assert_eq!(
            val(&mut s, format!("k{i}").as_bytes(), 0),
            Some(vec![2; 500])
        );
    }
}

// Proves defrag settles the pending blind writes whose `prev` is in the block it reads from
// that block's image (no other read: `sync_reads` unchanged, no sweep read), and frees the
// block; pending writes below the sweep watermark stay pending until then.
#[test]
fn blind_defrag_settles_from_its_image() {
    let dev = Arc::new(MemDevice::new("t", 16 * MIB));
    let mut s = one_shard(&dev, &blind_cfg(u64::MAX));
    // One block: 40 keys that will be overwritten blindly, 60 made dead by plain puts.
    put_all(&mut s, "k", 40, 1);
    put_all(&mut s, "d", 60, 1);
    seal_with_filler(&mut s, 0);
    put_all(&mut s, "d", 60, 3);
    for i in 0..40u32 {
        s.put_blind(
            0,
            format!("k{i}").as_bytes(),
            ValueKind::String,
            &[2; 500],
            None,
            0,
        )
        .unwrap();
    }
    seal_with_filler(&mut s, 1);
    assert_eq!(s.stats().blind_pending, 40);
    let sync0 = s.cache_stats().sync_reads;
    let mut rounds = 0;
    while s.stats().blind_pending > 0 || s.stats().defrag_freed_blocks == 0 {
        s.background(0, 10_000).unwrap();
        s.flush().unwrap();
        rounds += 1;
        assert!(
            rounds < 2000,
            "defrag never settled: {:?}",
            s.stats().blind_pending
        );
    }
    let st = s.stats();
    assert_eq!(
        s.cache_stats().sync_reads,
        sync0,
        "defrag settled with record reads"
    );
    assert_eq!(st.blind_sweep_reads, 0);
    assert_eq!(st.blind_settled_same, 40);
    assert_eq!(s.key_count(0), 100);
    for i in 0..40u32 {
        assert_eq!(
            val(&mut s, format!("k{i}").as_bytes(), 0),
            Some(vec![2; 500])
        );
    }
}

// Proves DBSIZE is exact after blind overwrites with forced collisions (16 index positions,
// the hash masked to its top 4 bits: new keys written blindly over other keys' records) and
// settles them without record reads.
#[test]
fn blind_collisions_count_exactly_without_record_reads() {
    let dev = Arc::new(MemDevice::new("t", 16 * MIB));
    let mut s = one_shard(&dev, &blind_cfg(0xF000_0000_0000_0000));
    put_all(&mut s, "a", 16, 1);
    seal_with_filler(&mut s, 0);
    for i in 0..16u32 {
        s.put_blind(
            0,
            format!("b{i}").as_bytes(),
            ValueKind::String,
            &[2; 500],
            None,
            0,
        )
        .unwrap();
    }
    seal_with_filler(&mut s, 1);
    let pending = s.stats().blind_pending;
    assert!(pending >= 1, "no blind write over another key");
    let (sync0, new0) = (s.cache_stats().sync_reads, s.stats().blind_settled_new);
    assert_eq!(exact_count(&mut s), 32);
    assert_eq!(
        s.cache_stats().sync_reads,
        sync0,
        "DBSIZE settled with record reads"
    );
    assert_eq!(s.stats().blind_settled_new - new0, pending);
    for p in ["a", "b"] {
        for i in 0..16u32 {
            let want = vec![if p == "a" { 1 } else { 2 }; 500];
            assert_eq!(val(&mut s, format!("{p}{i}").as_bytes(), 0), Some(want));
        }
    }
}

// Proves active expiry settles a pending blind write whose `prev` it meets (with the record it
// read anyway) and then reaps that `prev` when it is another key's expired record: without it
// the expiry entry would be dropped as stale and the key left for lazy expiry only.
#[test]
fn blind_active_expiry_settles_a_pending_prev() {
    let dev = Arc::new(MemDevice::new("t", 16 * MIB));
    let mut s = one_shard(&dev, &blind_cfg(0));
    blind(&mut s, b"a", b"a1", Some(100), 0);
    seal_with_filler(&mut s, 0);
    blind(&mut s, b"b", b"b1", None, 0);
    seal_with_filler(&mut s, 1);
    let st = s.stats();
    assert_eq!(
        (st.blind_writes, st.blind_pending, st.expired_keys),
        (1, 1, 0)
    );
    s.background(200, 10_000).unwrap();
    let st = s.stats();
    assert_eq!((st.blind_pending, st.blind_settled_new), (0, 1));
    assert_eq!(st.expired_keys, 1, "the expired prev was not reaped");
    assert_eq!(s.key_count(0), 1);
    assert_eq!(val(&mut s, b"a", 200), None);
    assert_eq!(val(&mut s, b"b", 200), Some(b"b1".to_vec()));
}

// A key read from the device (so cached) and then written again stays cached: once its new
// record's block is sealed, a read finds the new record without the device. With the cache
// off the same sequence reads the device.
#[test]
fn a_cached_key_written_again_stays_cached() {
    for cache in [1usize << 20, 0] {
        let dev = Arc::new(MemDevice::new("t", 16 * MIB));
        let mut c = cfg(64 * 1024, FsyncPolicy::Always);
        c.cache_capacity_bytes = cache;
        let mut s = one_shard(&dev, &c);
        s.put(0, b"hot", ValueKind::String, &[1; 500], None, 0)
            .unwrap();
        seal_with_filler(&mut s, 0);
        assert_eq!(val(&mut s, b"hot", 0), Some(vec![1; 500]));
        s.put(0, b"hot", ValueKind::String, &[2; 600], None, 0)
            .unwrap();
        seal_with_filler(&mut s, 1);
        let reads = s.stats().device_reads;
        assert_eq!(val(&mut s, b"hot", 0), Some(vec![2; 600]));
        let read_again = s.stats().device_reads - reads;
        if cache > 0 {
            assert_eq!(
                read_again, 0,
                "the rewritten hot key was read from the device"
            );
        } else {
            assert!(
                read_again > 0,
                "cache off: the new record is on the device only"
            );
        }
    }
}
