//! PLACEHOLDER engine with the storage contract's API, kept only until the
//! real engine (issue 3, values on the device) is merged. It keeps values in
//! RAM and persists nothing; the server must not be called done on it.
use std::collections::HashMap;

pub type Db = u8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsyncPolicy {
    Always,
    EverySec,
    No,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueKind {
    String,
}

#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub data_files: Vec<std::path::PathBuf>,
    pub create_size_bytes: u64,
    pub shard_count: u32,
    pub fsync: FsyncPolicy,
    pub flush_max_ms: u64,
    pub staging_limit_bytes: u64,
    pub direct_io: bool,
    pub tomb_raider_interval_ms: u64,
    pub defrag_paused: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            data_files: vec!["lavik.data".into()],
            create_size_bytes: 1 << 30,
            shard_count: 8,
            fsync: FsyncPolicy::EverySec,
            flush_max_ms: 100,
            staging_limit_bytes: 1 << 20,
            direct_io: true,
            tomb_raider_interval_ms: 86_400_000,
            defrag_paused: false,
        }
    }
}

pub struct OpenedStore {
    pub shards: Vec<Shard>,
    pub info: StoreInfo,
}

pub struct StoreInfo {
    pub shard_count: u32,
    pub recovered_keys: u64,
    pub recovery_ms: u64,
}

pub struct Value {
    pub kind: ValueKind,
    pub bytes: Vec<u8>,
    pub expire_at_ms: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("device full")]
    DeviceFull,
    #[error("value too large")]
    ValueTooLarge,
}

#[derive(Debug, Default, Clone)]
pub struct ShardStats {
    pub keys: u64,
    pub index_bytes: u64,
}

pub fn open(cfg: &StoreConfig) -> Result<OpenedStore, StorageError> {
    let shards = (0..cfg.shard_count)
        .map(|id| Shard {
            id,
            dbs: (0..16).map(|_| HashMap::new()).collect(),
        })
        .collect();
    Ok(OpenedStore {
        shards,
        info: StoreInfo {
            shard_count: cfg.shard_count,
            recovered_keys: 0,
            recovery_ms: 0,
        },
    })
}

pub struct Shard {
    id: u32,
    #[allow(clippy::type_complexity)]
    dbs: Vec<HashMap<Vec<u8>, (Vec<u8>, Option<u64>)>>,
}

impl Shard {
    pub fn id(&self) -> u32 {
        self.id
    }
    fn live(&mut self, db: Db, key: &[u8], now_ms: u64) -> Option<&mut (Vec<u8>, Option<u64>)> {
        let m = &mut self.dbs[db as usize];
        if m.get(key).is_some_and(|v| v.1.is_some_and(|e| e <= now_ms)) {
            m.remove(key);
        }
        m.get_mut(key)
    }
    pub fn get(&mut self, db: Db, key: &[u8], now_ms: u64) -> Result<Option<Value>, StorageError> {
        Ok(self.live(db, key, now_ms).map(|v| Value {
            kind: ValueKind::String,
            bytes: v.0.clone(),
            expire_at_ms: v.1,
        }))
    }
    pub fn exists(&mut self, db: Db, key: &[u8], now_ms: u64) -> Result<bool, StorageError> {
        Ok(self.live(db, key, now_ms).is_some())
    }
    pub fn put(
        &mut self,
        db: Db,
        key: &[u8],
        _kind: ValueKind,
        bytes: &[u8],
        expire_at_ms: Option<u64>,
        _now_ms: u64,
    ) -> Result<(), StorageError> {
        self.dbs[db as usize].insert(key.to_vec(), (bytes.to_vec(), expire_at_ms));
        Ok(())
    }
    pub fn delete(&mut self, db: Db, key: &[u8], now_ms: u64) -> Result<bool, StorageError> {
        let had = self.live(db, key, now_ms).is_some();
        self.dbs[db as usize].remove(key);
        Ok(had)
    }
    pub fn set_expiry(
        &mut self,
        db: Db,
        key: &[u8],
        expire_at_ms: Option<u64>,
        now_ms: u64,
    ) -> Result<bool, StorageError> {
        match self.live(db, key, now_ms) {
            Some(v) => {
                v.1 = expire_at_ms;
                Ok(true)
            }
            None => Ok(false),
        }
    }
    pub fn key_count(&self, db: Db) -> u64 {
        self.dbs[db as usize].len() as u64
    }
    pub fn flush_db(&mut self, db: Db) -> Result<(), StorageError> {
        self.dbs[db as usize].clear();
        Ok(())
    }
    pub fn scan(
        &mut self,
        db: Db,
        cursor: u64,
        count: usize,
        _now_ms: u64,
    ) -> Result<(u64, Vec<Vec<u8>>), StorageError> {
        let mut keys: Vec<Vec<u8>> = self.dbs[db as usize].keys().cloned().collect();
        keys.sort();
        let start = cursor as usize;
        let end = (start + count.max(1)).min(keys.len());
        let next = if end >= keys.len() { 0 } else { end as u64 };
        Ok((
            next,
            keys.get(start..end).map(|s| s.to_vec()).unwrap_or_default(),
        ))
    }
    pub fn random_key(&mut self, db: Db, _now_ms: u64) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.dbs[db as usize].keys().next().cloned())
    }
    pub fn has_unflushed(&self) -> bool {
        false
    }
    pub fn flush_due(&self, _now_ms: u64) -> bool {
        false
    }
    pub fn flush(&mut self) -> Result<(), StorageError> {
        Ok(())
    }
    pub fn background(&mut self, _now_ms: u64, _budget_us: u64) -> Result<(), StorageError> {
        Ok(())
    }
    pub fn stats(&self) -> ShardStats {
        ShardStats {
            keys: self.dbs.iter().map(|d| d.len() as u64).sum(),
            index_bytes: 0,
        }
    }
    pub fn shutdown(self, _write_checkpoint: bool) -> Result<(), StorageError> {
        Ok(())
    }
}

/// CRC16/XMODEM as Redis Cluster uses it, over the `{hash tag}` if present.
pub fn key_slot(key: &[u8]) -> u16 {
    let mut k = key;
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                k = &key[open + 1..open + 1 + len];
            }
        }
    }
    crc16(k) % 16384
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

pub fn shard_of_slot(slot: u16, shard_count: u32) -> u32 {
    slot as u32 % shard_count
}
