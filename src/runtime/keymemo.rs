//! The running command's first key, with its cluster slot and index hash computed once.
//!
//! A keyed command's key is hashed on many steps: routing (which shard, which worker),
//! planning its device reads, the handler's `ShardSet::for_key` and `Shard` lookup, and
//! the keyspace-hit count after the handler (`server::keystats::settle`). Each step
//! computed the CRC16 slot and the 64-bit index hash of the same bytes again. The worker
//! now names the command's first declared key for the span of those steps (`enter`), and
//! `ShardSet::shard_id` and `Shard::hash` take the slot and the hash from here when they
//! are asked about that very slice (same address and length); any other key is computed
//! as before.
//!
//! Why an address compare is enough: the named slice is borrowed immutably by the caller
//! for the whole span (`Entered` is dropped before the borrow ends, and restores the
//! previous name, so nested spans — a script's `redis.call` — work), so no other bytes
//! can lie at that address meanwhile, and equal address and length mean equal bytes.
//! Nothing is ever read through the stored address. The hash is kept with the db it was
//! computed for; a lookup in another db computes its own.
//!
//! What it costs: one thread-local compare per `shard_id` / `hash` call.

use std::cell::Cell;

/// No slot computed yet.
const NO_SLOT: u32 = u32::MAX;
/// No hash computed yet (dbs are 0..=255).
const NO_DB: u16 = u16::MAX;

#[derive(Clone, Copy)]
struct Memo {
    /// The named key's address (0: none); compared, never dereferenced.
    addr: usize,
    len: usize,
    slot: u32,
    hash_db: u16,
    hash: u64,
}

const EMPTY: Memo = Memo {
    addr: 0,
    len: 0,
    slot: NO_SLOT,
    hash_db: NO_DB,
    hash: 0,
};

thread_local! {
    static MEMO: Cell<Memo> = const { Cell::new(EMPTY) };
}

/// The span in which `key` is the named key; dropping it restores the previous one.
#[must_use = "the key is named only while this lives"]
pub struct Entered {
    prev: Memo,
}

impl Drop for Entered {
    fn drop(&mut self) {
        MEMO.with(|m| m.set(self.prev));
    }
}

/// Names `key` (borrowed by the caller for at least the returned span) as the running
/// command's key.
#[inline]
pub fn enter(key: &[u8]) -> Entered {
    let memo = Memo {
        addr: key.as_ptr() as usize,
        len: key.len(),
        ..EMPTY
    };
    Entered {
        prev: MEMO.with(|m| m.replace(memo)),
    }
}

#[inline]
fn is_named(m: &Memo, key: &[u8]) -> bool {
    m.addr != 0 && m.addr == key.as_ptr() as usize && m.len == key.len()
}

/// `storage::key_slot(key)`, computed once per span for the named key.
#[inline]
pub fn key_slot(key: &[u8]) -> u16 {
    MEMO.with(|c| {
        let mut m = c.get();
        if !is_named(&m, key) {
            return crate::storage::key_slot(key);
        }
        if m.slot == NO_SLOT {
            m.slot = u32::from(crate::storage::key_slot(key));
            c.set(m);
        }
        m.slot as u16
    })
}

/// `storage::key_hash(db, key)`, computed once per span for the named key.
#[inline]
pub fn key_hash(db: u8, key: &[u8]) -> u64 {
    MEMO.with(|c| {
        let mut m = c.get();
        if !is_named(&m, key) {
            return crate::storage::key_hash(db, key);
        }
        if m.hash_db != u16::from(db) {
            m.hash = crate::storage::key_hash(db, key);
            m.hash_db = u16::from(db);
            c.set(m);
        }
        m.hash
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // The memo answers exactly what the plain functions answer, for the named key (in
    // any db, and nested spans) and for every other key, equal bytes or not.
    #[test]
    fn memo_matches_plain_hashing() {
        let key = b"{user}:1".to_vec();
        let other = b"{user}:1".to_vec(); // same bytes, another address
        let diff = b"memtier-42".to_vec();
        let plain =
            |db: u8, k: &[u8]| (crate::storage::key_slot(k), crate::storage::key_hash(db, k));
        let memo = |db: u8, k: &[u8]| (key_slot(k), key_hash(db, k));
        {
            let _span = enter(&key);
            for _ in 0..2 {
                assert_eq!(memo(0, &key), plain(0, &key));
                assert_eq!(memo(3, &key), plain(3, &key));
                assert_eq!(memo(0, &other), plain(0, &other));
                assert_eq!(memo(0, &diff), plain(0, &diff));
                assert_eq!(memo(0, &key[..4]), plain(0, &key[..4]));
            }
            {
                let _inner = enter(&diff);
                assert_eq!(memo(5, &diff), plain(5, &diff));
                assert_eq!(memo(0, &key), plain(0, &key));
            }
            // The outer span is back, with what it had computed.
            let m = MEMO.with(|c| c.get());
            assert!(is_named(&m, &key));
            assert_eq!(memo(3, &key), plain(3, &key));
        }
        assert_eq!(MEMO.with(|c| c.get()).addr, 0);
        assert_eq!(memo(0, &key), plain(0, &key));
    }
}
