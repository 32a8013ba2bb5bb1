//! Key hashing: the 64-bit index hash of (db, key) and the Redis Cluster slot (CRC16/XMODEM
//! with `{hash tags}`).

/// 64-bit hash of (db, key) for the index. Not cryptographic; fixed across runs and releases
/// (a checkpoint may store it). Built from 64-bit multiply-xorshift rounds over 8-byte words.
pub fn key_hash(db: u8, key: &[u8]) -> u64 {
    const K1: u64 = 0x9e37_79b9_7f4a_7c15;
    const K2: u64 = 0xc2b2_ae3d_27d4_eb4f;
    let mut h: u64 = (u64::from(db) << 56) ^ (key.len() as u64).wrapping_mul(K2) ^ K1;
    let mut chunks = key.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        h = (h ^ mix(w)).wrapping_mul(K1).rotate_left(29);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut tail = [0u8; 8];
        tail[..rest.len()].copy_from_slice(rest);
        h = (h ^ mix(u64::from_le_bytes(tail)))
            .wrapping_mul(K1)
            .rotate_left(29);
    }
    mix(h)
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const SLOT_COUNT: u16 = 16384;

/// CRC16/XMODEM of each byte value alone: one table step per key byte instead of
/// eight shift-and-xor steps (every keyed command computes its key's slot).
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// CRC16/XMODEM (poly 0x1021, init 0), as Redis Cluster uses.
fn crc16_xmodem(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ b)]
    })
}

/// Redis Cluster slot of a key: CRC16 of the key, or of the first non-empty `{...}` section.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16_xmodem(hashed) % SLOT_COUNT
}

pub fn shard_of_slot(slot: u16, shard_count: u32) -> u32 {
    u32::from(slot) % shard_count
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the CRC16 matches the XMODEM check value and Redis Cluster's documented slots.
    #[test]
    fn crc16_and_slots_match_redis() {
        assert_eq!(crc16_xmodem(b"123456789"), 0x31c3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(
            key_slot(b"{user1000}.following"),
            key_slot(b"{user1000}.followers")
        );
        assert_eq!(key_slot(b"foo{}{bar}"), crc16_xmodem(b"foo{}{bar}") % 16384);
        assert_eq!(key_slot(b"foo{{bar}}zap"), crc16_xmodem(b"{bar") % 16384);
    }

    /// The textbook bit-at-a-time CRC16/XMODEM, to check the table-driven one against.
    fn crc16_bitwise(bytes: &[u8]) -> u16 {
        let mut crc: u16 = 0;
        for &b in bytes {
            crc ^= u16::from(b) << 8;
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

    proptest::proptest! {
        // The table-driven CRC16 equals the bitwise definition on any bytes.
        #[test]
        fn crc16_table_matches_bitwise(bytes: Vec<u8>) {
            proptest::prop_assert_eq!(crc16_xmodem(&bytes), crc16_bitwise(&bytes));
        }
    }

    // Proves the index hash separates dbs and keys that differ only in length or tail.
    #[test]
    fn key_hash_separates_db_and_tails() {
        assert_ne!(key_hash(0, b"a"), key_hash(1, b"a"));
        assert_ne!(key_hash(0, b"a"), key_hash(0, b"a\0"));
        assert_ne!(key_hash(0, b"12345678"), key_hash(0, b"12345679"));
        assert_eq!(key_hash(2, b"same"), key_hash(2, b"same"));
    }
}
