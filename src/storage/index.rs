//! STAND-IN for the compact index (the index helper owns the real one; the lead swaps this
//! file at merge time). Same API, simple structure: a `BTreeMap` from the full 64-bit hash to
//! the addresses stored under it. It is neither compact nor fast; it only has the semantics.
use std::collections::BTreeMap;

/// Opaque device address of a record, as the storage engine encodes it (≤ ADDRESS_BITS bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Address(pub u64);
pub const ADDRESS_BITS: u32 = 40;

/// Keys are never stored: the caller hashes (db,key) to 64 bits and verifies each candidate by
/// reading the record. Exactness is the caller's job; the index must never lose an entry.
#[derive(Default)]
pub struct Index {
    map: BTreeMap<u64, Vec<Address>>,
    len: usize,
}

/// Addresses whose stored hash matches (stand-in: a small owned list).
pub struct Candidates {
    items: Vec<Address>,
    pos: usize,
}

impl Iterator for Candidates {
    type Item = Address;
    fn next(&mut self) -> Option<Address> {
        let a = self.items.get(self.pos).copied();
        self.pos += 1;
        a
    }
}

impl Index {
    pub fn new() -> Index {
        Index::default()
    }

    pub fn with_capacity(_keys: usize) -> Index {
        Index::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Approximate for the stand-in: BTreeMap node overhead estimated at 48 bytes per hash.
    pub fn memory_bytes(&self) -> usize {
        self.map.values().map(|v| 48 + v.capacity() * 8).sum()
    }

    pub fn candidates(&self, hash: u64) -> Candidates {
        Candidates {
            items: self.map.get(&hash).cloned().unwrap_or_default(),
            pos: 0,
        }
    }

    pub fn insert(&mut self, hash: u64, addr: Address) {
        debug_assert!(addr.0 < 1 << ADDRESS_BITS);
        self.map.entry(hash).or_default().push(addr);
        self.len += 1;
    }

    pub fn replace(&mut self, hash: u64, old: Address, new: Address) -> bool {
        match self
            .map
            .get_mut(&hash)
            .and_then(|v| v.iter_mut().find(|a| **a == old))
        {
            Some(slot) => {
                *slot = new;
                true
            }
            None => false,
        }
    }

    pub fn remove(&mut self, hash: u64, addr: Address) -> bool {
        let Some(v) = self.map.get_mut(&hash) else {
            return false;
        };
        let Some(pos) = v.iter().position(|a| *a == addr) else {
            return false;
        };
        v.swap_remove(pos);
        if v.is_empty() {
            self.map.remove(&hash);
        }
        self.len -= 1;
        true
    }

    /// Visits hashes in ascending order starting at `cursor`; returns the next hash to visit,
    /// or 0 when done.
    pub fn scan(&self, cursor: u64, max_entries: usize, mut f: impl FnMut(u64, Address)) -> u64 {
        let mut visited = 0;
        for (&h, addrs) in self.map.range(cursor..) {
            if visited >= max_entries.max(1) {
                return h;
            }
            for &a in addrs {
                f(h, a);
                visited += 1;
            }
            if h == u64::MAX {
                return 0;
            }
        }
        0
    }

    pub fn for_each(&self, mut f: impl FnMut(Address)) {
        for addrs in self.map.values() {
            for &a in addrs {
                f(a);
            }
        }
    }

    pub fn clear(&mut self) {
        self.map.clear();
        self.len = 0;
    }

    pub fn random_entry(&self, seed: u64) -> Option<Address> {
        let pick = |v: &Vec<Address>| v[(seed as usize) % v.len()];
        self.map
            .range(seed..)
            .next()
            .or_else(|| self.map.iter().next())
            .map(|(_, v)| pick(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves insert/replace/remove keep len and candidates exact under equal hashes.
    #[test]
    fn equal_hashes_are_kept_apart() {
        let mut ix = Index::new();
        ix.insert(5, Address(1));
        ix.insert(5, Address(2));
        assert_eq!(ix.len(), 2);
        assert!(ix.replace(5, Address(1), Address(3)));
        let mut c: Vec<_> = ix.candidates(5).collect();
        c.sort();
        assert_eq!(c, vec![Address(2), Address(3)]);
        assert!(!ix.remove(5, Address(1)));
        assert!(ix.remove(5, Address(2)));
        assert_eq!(ix.len(), 1);
    }

    // Proves a cursor scan visits every entry exactly once when nothing changes.
    #[test]
    fn scan_visits_everything() {
        let mut ix = Index::new();
        for i in 0..100u64 {
            ix.insert(i.wrapping_mul(0x9e37_79b9_7f4a_7c15), Address(i));
        }
        ix.insert(u64::MAX, Address(1000));
        let mut seen = Vec::new();
        let mut cursor = 0;
        loop {
            cursor = ix.scan(cursor, 7, |_, a| seen.push(a));
            if cursor == 0 {
                break;
            }
        }
        seen.sort();
        assert_eq!(seen.len(), 101);
        seen.dedup();
        assert_eq!(seen.len(), 101);
    }
}
