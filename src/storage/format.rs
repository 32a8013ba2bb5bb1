//! The on-device format, byte for byte. `docs/storage-format.md` is the normative text; this
//! file is its executable form and the two change together. All integers are little-endian.
//!
//! Every decoder here takes untrusted bytes and never panics: it returns `None` for anything
//! short, malformed or failing its checksum.

/// Transfers, chunk starts and metadata slots are aligned to this, in bytes.
pub const CHUNK_ALIGN_BYTES: u64 = 4096;
pub const LABEL_OFFSET_BYTES: u64 = 0;
pub const META_SLOT_OFFSETS_BYTES: [u64; 2] = [4096, 8192];
pub const LABEL_MAGIC: [u8; 8] = *b"LAVIKST1";
pub const META_MAGIC: [u8; 8] = *b"LAVIKMD1";
pub const BLOCK_MAGIC: [u8; 8] = *b"LVKBLOCK";
pub const FORMAT_VERSION: u32 = 2;
/// Oldest label version this binary opens (and relabels to [`FORMAT_VERSION`]): version 1
/// stores hold no grouped records, no part records and 144-byte markers.
pub const FORMAT_VERSION_OLDEST: u32 = 1;
/// Bytes covered by the label CRC; the CRC itself sits right after them.
pub const LABEL_CRC_OFFSET: usize = 124;
pub const META_CRC_OFFSET: usize = 124;
pub const BLOCK_SIZE_MIN_BYTES: u32 = 64 * 1024;
pub const BLOCK_SIZE_MAX_BYTES: u32 = 16 * 1024 * 1024;
pub const DB_COUNT: usize = 16;
pub const RECORD_HEADER_BYTES: usize = 32;
pub const RECORD_ALIGN_BYTES: usize = 8;
pub const KEY_LEN_MAX_BYTES: usize = u16::MAX as usize;
pub const BLOCK_HEADER_PAYLOAD_BYTES: usize = 48;
pub const MARKER_PAYLOAD_BYTES: usize = 16 + 8 * DB_COUNT + 8;
/// A version-1 marker: no `decided_below` field (reads as 0).
pub const MARKER_PAYLOAD_V1_BYTES: usize = 16 + 8 * DB_COUNT;
/// The group id a GROUPED record carries after its padded key and payload.
pub const GROUP_ID_BYTES: usize = 8;
/// Space a chunk marker takes at the end of a chunk (header + payload, already 8-aligned).
pub const MARKER_RECORD_BYTES: usize = RECORD_HEADER_BYTES + MARKER_PAYLOAD_BYTES;
/// Address bits available to the index (see `index::ADDRESS_BITS`).
pub const ADDRESS_BITS: u32 = 40;
/// Largest value accepted (the same as Redis's default `proto-max-bulk-len`).
pub const VALUE_LEN_MAX_BYTES: u64 = 512 * 1024 * 1024;

const _: () = assert!(MARKER_RECORD_BYTES.is_multiple_of(RECORD_ALIGN_BYTES));
const _: () = assert!((BLOCK_SIZE_MIN_BYTES as u64).is_multiple_of(CHUNK_ALIGN_BYTES));
const _: () =
    assert!(META_SLOT_OFFSETS_BYTES[1] + CHUNK_ALIGN_BYTES <= BLOCK_SIZE_MIN_BYTES as u64);

/// Record types (byte 0 of every record header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordType {
    BlockHeader = 1,
    Put = 2,
    Tombstone = 3,
    Marker = 4,
    Fragment = 5,
    Checkpoint = 6,
    /// One shard's part of a multi-record group (`docs/atomic-writes.md`).
    GroupPart = 9,
    /// A page of a paged collection (`docs/collections.md` section 3): reachable only
    /// through its owner's PAGED root, never indexed.
    Page = 7,
}

impl RecordType {
    pub fn from_u8(v: u8) -> Option<RecordType> {
        match v {
            1 => Some(RecordType::BlockHeader),
            2 => Some(RecordType::Put),
            3 => Some(RecordType::Tombstone),
            4 => Some(RecordType::Marker),
            5 => Some(RecordType::Fragment),
            6 => Some(RecordType::Checkpoint),
            9 => Some(RecordType::GroupPart),
            7 => Some(RecordType::Page),
            _ => None,
        }
    }
}

/// Flag bit: the Put's payload is a fragment list, not the value itself.
pub const FLAG_LARGE: u8 = 1;
/// Flag bit: the record belongs to a group; its group id follows the padded payload and the
/// record counts only if the group is complete (`docs/atomic-writes.md`).
pub const FLAG_GROUPED: u8 = 2;
/// Flag bit: the Put is a paged collection's root (`src/storage/paged.rs`); its payload
/// lists directory pages, not the value.
pub const FLAG_PAGED: u8 = 4;

/// The 32-byte record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub record_type: RecordType,
    pub flags: u8,
    pub value_kind: u8,
    pub db: u8,
    pub key_len: u16,
    pub value_len: u32,
    pub crc: u32,
    pub seq: u64,
    /// 0 = no expiry.
    pub expire_at_ms: u64,
}

impl RecordHeader {
    /// Bytes the whole record occupies in a block, padding included.
    pub fn record_len(&self) -> usize {
        record_len(self.key_len as usize, self.value_len as usize) + self.group_id_len()
    }

    /// Bytes of the group id trailer (0 for a record that is not GROUPED).
    pub fn group_id_len(&self) -> usize {
        if self.flags & FLAG_GROUPED != 0 {
            GROUP_ID_BYTES
        } else {
            0
        }
    }

    pub fn encode(&self, out: &mut [u8]) {
        out[0] = self.record_type as u8;
        out[1] = self.flags;
        out[2] = self.value_kind;
        out[3] = self.db;
        out[4..6].copy_from_slice(&self.key_len.to_le_bytes());
        out[6..8].copy_from_slice(&0u16.to_le_bytes());
        out[8..12].copy_from_slice(&self.value_len.to_le_bytes());
        out[12..16].copy_from_slice(&self.crc.to_le_bytes());
        out[16..24].copy_from_slice(&self.seq.to_le_bytes());
        out[24..32].copy_from_slice(&self.expire_at_ms.to_le_bytes());
    }

    /// Parses the fixed header only (no CRC check): `None` if short or malformed.
    pub fn decode(bytes: &[u8]) -> Option<RecordHeader> {
        if bytes.len() < RECORD_HEADER_BYTES {
            return None;
        }
        let record_type = RecordType::from_u8(bytes[0])?;
        if u16::from_le_bytes([bytes[6], bytes[7]]) != 0 || bytes[3] as usize >= DB_COUNT {
            return None;
        }
        Some(RecordHeader {
            record_type,
            flags: bytes[1],
            value_kind: bytes[2],
            db: bytes[3],
            key_len: u16::from_le_bytes([bytes[4], bytes[5]]),
            value_len: u32::from_le_bytes(bytes[8..12].try_into().ok()?),
            crc: u32::from_le_bytes(bytes[12..16].try_into().ok()?),
            seq: u64::from_le_bytes(bytes[16..24].try_into().ok()?),
            expire_at_ms: u64::from_le_bytes(bytes[24..32].try_into().ok()?),
        })
    }
}

pub fn record_len(key_len: usize, value_len: usize) -> usize {
    (RECORD_HEADER_BYTES + key_len + value_len).next_multiple_of(RECORD_ALIGN_BYTES)
}

/// CRC32C over the block sequence number, the header with its CRC field zeroed, the key and
/// the payload. Seeding with `block_seq` makes a record left over from a block's previous use
/// fail its check.
pub fn record_crc(block_seq: u64, header: &[u8], key: &[u8], value: &[u8]) -> u32 {
    let mut h = [0u8; RECORD_HEADER_BYTES];
    h.copy_from_slice(&header[..RECORD_HEADER_BYTES]);
    h[12..16].fill(0);
    let mut crc = crc32c::crc32c(&block_seq.to_le_bytes());
    crc = crc32c::crc32c_append(crc, &h);
    crc = crc32c::crc32c_append(crc, key);
    crc32c::crc32c_append(crc, value)
}

/// Writes a complete record (header, key, payload, zero padding) at the start of `out`, which
/// must be at least `record_len` bytes, and returns its length.
pub fn encode_record(
    out: &mut [u8],
    block_seq: u64,
    hdr: RecordHeader,
    key: &[u8],
    value: &[u8],
) -> usize {
    debug_assert_eq!(hdr.flags & FLAG_GROUPED, 0);
    encode_record_in_group(out, block_seq, hdr, key, value, 0)
}

/// [`encode_record`] for a record that may be GROUPED: with [`FLAG_GROUPED`] set in `hdr`,
/// `group` is written after the padded payload and covered by the CRC.
pub fn encode_record_in_group(
    out: &mut [u8],
    block_seq: u64,
    mut hdr: RecordHeader,
    key: &[u8],
    value: &[u8],
    group: u64,
) -> usize {
    debug_assert_eq!(hdr.key_len as usize, key.len());
    debug_assert_eq!(hdr.value_len as usize, value.len());
    let len = hdr.record_len();
    let body = len - hdr.group_id_len();
    hdr.crc = 0;
    hdr.encode(&mut out[..RECORD_HEADER_BYTES]);
    let k_end = RECORD_HEADER_BYTES + key.len();
    out[RECORD_HEADER_BYTES..k_end].copy_from_slice(key);
    out[k_end..k_end + value.len()].copy_from_slice(value);
    out[k_end + value.len()..body].fill(0);
    let mut crc = record_crc(block_seq, &out[..RECORD_HEADER_BYTES], key, value);
    if body < len {
        out[body..len].copy_from_slice(&group.to_le_bytes());
        crc = crc32c::crc32c_append(crc, &out[body..len]);
    }
    out[12..16].copy_from_slice(&crc.to_le_bytes());
    len
}

/// A record parsed from a buffer and checked against its CRC.
#[derive(Clone, Copy, Debug)]
pub struct RecordRef<'a> {
    pub header: RecordHeader,
    pub key: &'a [u8],
    pub value: &'a [u8],
    /// The group id of a GROUPED record.
    pub group: Option<u64>,
}

/// Parses and verifies the record at the start of `bytes` for a block with `block_seq`.
pub fn decode_record(bytes: &[u8], block_seq: u64) -> Option<RecordRef<'_>> {
    let header = RecordHeader::decode(bytes)?;
    let len = header.record_len();
    if bytes.len() < len {
        return None;
    }
    let k_end = RECORD_HEADER_BYTES + header.key_len as usize;
    let v_end = k_end + header.value_len as usize;
    let key = &bytes[RECORD_HEADER_BYTES..k_end];
    let value = &bytes[k_end..v_end];
    // Key and value are adjacent: one CRC pass over both gives the same checksum as
    // two, for less call and alignment overhead (every device read verifies one).
    let key_and_value = &bytes[RECORD_HEADER_BYTES..v_end];
    let mut crc = record_crc(block_seq, &bytes[..RECORD_HEADER_BYTES], key_and_value, &[]);
    let mut group = None;
    if header.flags & FLAG_GROUPED != 0 {
        let trailer = &bytes[len - GROUP_ID_BYTES..len];
        crc = crc32c::crc32c_append(crc, trailer);
        group = Some(u64::from_le_bytes(trailer.try_into().ok()?));
    }
    if crc != header.crc {
        return None;
    }
    Some(RecordRef {
        header,
        key,
        value,
        group,
    })
}

/// Payload of the BlockHeader record that opens every block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHeaderPayload {
    pub store_uuid: [u8; 16],
    pub block_seq: u64,
    pub shard_id: u32,
    /// 0 = log block, 1 = large-value extent.
    pub block_kind: u32,
    pub global_block: u32,
}

pub const BLOCK_KIND_LOG: u32 = 0;
pub const BLOCK_KIND_EXTENT: u32 = 1;
pub const BLOCK_KIND_CHECKPOINT: u32 = 2;

impl BlockHeaderPayload {
    pub fn encode(&self) -> [u8; BLOCK_HEADER_PAYLOAD_BYTES] {
        let mut out = [0u8; BLOCK_HEADER_PAYLOAD_BYTES];
        out[0..8].copy_from_slice(&BLOCK_MAGIC);
        out[8..24].copy_from_slice(&self.store_uuid);
        out[24..32].copy_from_slice(&self.block_seq.to_le_bytes());
        out[32..36].copy_from_slice(&self.shard_id.to_le_bytes());
        out[36..40].copy_from_slice(&self.block_kind.to_le_bytes());
        out[40..44].copy_from_slice(&self.global_block.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<BlockHeaderPayload> {
        if bytes.len() != BLOCK_HEADER_PAYLOAD_BYTES || bytes[0..8] != BLOCK_MAGIC {
            return None;
        }
        if bytes[44..48] != [0; 4] {
            return None;
        }
        Some(BlockHeaderPayload {
            store_uuid: bytes[8..24].try_into().ok()?,
            block_seq: u64::from_le_bytes(bytes[24..32].try_into().ok()?),
            shard_id: u32::from_le_bytes(bytes[32..36].try_into().ok()?),
            block_kind: u32::from_le_bytes(bytes[36..40].try_into().ok()?),
            global_block: u32::from_le_bytes(bytes[40..44].try_into().ok()?),
        })
    }
}

/// Payload of the chunk marker (commit record) that ends every chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MarkerPayload {
    /// Offset in the block of the chunk's first byte.
    pub chunk_start: u32,
    /// CRC32C of block bytes `[chunk_start, marker offset)`.
    pub chunk_crc: u32,
    pub block_seq: u64,
    /// Per-db FLUSHDB watermark: records of that db with a smaller seq are dead.
    pub flush_watermarks: [u64; DB_COUNT],
    /// Every group with a smaller id is decided (0 in a version-1 marker).
    pub decided_below: u64,
}

impl MarkerPayload {
    pub fn encode(&self) -> [u8; MARKER_PAYLOAD_BYTES] {
        let mut out = [0u8; MARKER_PAYLOAD_BYTES];
        out[0..4].copy_from_slice(&self.chunk_start.to_le_bytes());
        out[4..8].copy_from_slice(&self.chunk_crc.to_le_bytes());
        out[8..16].copy_from_slice(&self.block_seq.to_le_bytes());
        for (i, w) in self.flush_watermarks.iter().enumerate() {
            out[16 + 8 * i..24 + 8 * i].copy_from_slice(&w.to_le_bytes());
        }
        out[MARKER_PAYLOAD_V1_BYTES..].copy_from_slice(&self.decided_below.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<MarkerPayload> {
        let decided_below = match bytes.len() {
            MARKER_PAYLOAD_V1_BYTES => 0,
            MARKER_PAYLOAD_BYTES => {
                u64::from_le_bytes(bytes[MARKER_PAYLOAD_V1_BYTES..].try_into().ok()?)
            }
            _ => return None,
        };
        let mut flush_watermarks = [0u64; DB_COUNT];
        for (i, w) in flush_watermarks.iter_mut().enumerate() {
            *w = u64::from_le_bytes(bytes[16 + 8 * i..24 + 8 * i].try_into().ok()?);
        }
        Some(MarkerPayload {
            chunk_start: u32::from_le_bytes(bytes[0..4].try_into().ok()?),
            chunk_crc: u32::from_le_bytes(bytes[4..8].try_into().ok()?),
            block_seq: u64::from_le_bytes(bytes[8..16].try_into().ok()?),
            flush_watermarks,
            decided_below,
        })
    }
}

/// Payload of a GroupPart record (type 9): one shard's part of group `group` — `records`
/// GROUPED records of the group in this shard, and every shard that wrote one, ascending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupPartPayload {
    pub group: u64,
    pub records: u32,
    pub shards: Vec<u32>,
}

/// Bytes of a part payload before its shard list.
pub const GROUP_PART_FIXED_BYTES: usize = 16;

impl GroupPartPayload {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(GROUP_PART_FIXED_BYTES + 4 * self.shards.len());
        out.extend_from_slice(&self.group.to_le_bytes());
        out.extend_from_slice(&self.records.to_le_bytes());
        out.extend_from_slice(&(self.shards.len() as u32).to_le_bytes());
        for s in &self.shards {
            out.extend_from_slice(&s.to_le_bytes());
        }
        out
    }

    /// `None` unless the length matches the shard count and the list is strictly ascending
    /// and not empty.
    pub fn decode(bytes: &[u8]) -> Option<GroupPartPayload> {
        if bytes.len() < GROUP_PART_FIXED_BYTES {
            return None;
        }
        let n = u32::from_le_bytes(bytes[12..16].try_into().ok()?) as usize;
        if n == 0 || bytes.len() != GROUP_PART_FIXED_BYTES + 4 * n {
            return None;
        }
        let shards: Vec<u32> = bytes[GROUP_PART_FIXED_BYTES..]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        if shards.windows(2).any(|w| w[0] >= w[1]) {
            return None;
        }
        Some(GroupPartPayload {
            group: u64::from_le_bytes(bytes[0..8].try_into().ok()?),
            records: u32::from_le_bytes(bytes[8..12].try_into().ok()?),
            shards,
        })
    }
}

/// The format version a label sector names (meaningful only for a valid label).
pub fn label_version(sector0: &[u8]) -> u32 {
    sector0
        .get(8..12)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
}

/// The device label in sector 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label {
    pub store_uuid: [u8; 16],
    pub device_index: u32,
    pub device_count: u32,
    pub shard_count: u32,
    pub block_size_bytes: u32,
    pub capacity_bytes: u64,
    pub block_count: u64,
}

/// Result of looking at sector 0 (and the rest of the reserved first block).
#[derive(Debug, PartialEq, Eq)]
pub enum LabelState {
    /// Zero-filled: may be formatted.
    Blank,
    Valid(Label),
    /// Not ours (unknown magic and not zero): never overwritten.
    Foreign,
    /// Our magic, but bad CRC, unknown version or impossible fields.
    Damaged(String),
}

impl Label {
    pub fn encode(&self) -> [u8; 128] {
        let mut out = [0u8; 128];
        out[0..8].copy_from_slice(&LABEL_MAGIC);
        out[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[12..16].copy_from_slice(&(LABEL_CRC_OFFSET as u32).to_le_bytes());
        out[16..32].copy_from_slice(&self.store_uuid);
        out[32..36].copy_from_slice(&self.device_index.to_le_bytes());
        out[36..40].copy_from_slice(&self.device_count.to_le_bytes());
        out[40..44].copy_from_slice(&self.shard_count.to_le_bytes());
        out[44..48].copy_from_slice(&self.block_size_bytes.to_le_bytes());
        out[48..52].copy_from_slice(&(CHUNK_ALIGN_BYTES as u32).to_le_bytes());
        out[56..64].copy_from_slice(&self.capacity_bytes.to_le_bytes());
        out[64..72].copy_from_slice(&self.block_count.to_le_bytes());
        let crc = crc32c::crc32c(&out[..LABEL_CRC_OFFSET]);
        out[LABEL_CRC_OFFSET..LABEL_CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Classifies the first sector of a device; `reserved_zero` says whether the rest of the
    /// reserved first block is zero (used to decide "blank").
    pub fn classify(sector0: &[u8], reserved_zero: bool) -> LabelState {
        if sector0.len() < 128 {
            return LabelState::Damaged("label sector too short".into());
        }
        if sector0[0..8] != LABEL_MAGIC {
            if reserved_zero && sector0.iter().all(|&b| b == 0) {
                return LabelState::Blank;
            }
            return LabelState::Foreign;
        }
        let crc = u32::from_le_bytes(sector0[124..128].try_into().expect("4 bytes"));
        if crc32c::crc32c(&sector0[..LABEL_CRC_OFFSET]) != crc {
            return LabelState::Damaged("label checksum mismatch".into());
        }
        let u32_at = |o: usize| u32::from_le_bytes(sector0[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(sector0[o..o + 8].try_into().expect("8 bytes"));
        let version = u32_at(8);
        if !(FORMAT_VERSION_OLDEST..=FORMAT_VERSION).contains(&version) {
            return LabelState::Damaged(format!("unsupported format version {version}"));
        }
        let label = Label {
            store_uuid: sector0[16..32].try_into().expect("16 bytes"),
            device_index: u32_at(32),
            device_count: u32_at(36),
            shard_count: u32_at(40),
            block_size_bytes: u32_at(44),
            capacity_bytes: u64_at(56),
            block_count: u64_at(64),
        };
        let bs = label.block_size_bytes;
        if !bs.is_power_of_two()
            || !(BLOCK_SIZE_MIN_BYTES..=BLOCK_SIZE_MAX_BYTES).contains(&bs)
            || label.shard_count == 0
            || label.device_index >= label.device_count
            || u64::from(u32_at(48)) != CHUNK_ALIGN_BYTES
        {
            return LabelState::Damaged("label fields out of range".into());
        }
        LabelState::Valid(label)
    }
}

/// One of the two metadata slots (A at 4096, B at 8192); the valid one with the higher
/// generation is current.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetaSlot {
    pub generation: u64,
    pub store_uuid: [u8; 16],
    /// 1 if the store was shut down cleanly and nothing was written since.
    pub clean_shutdown: bool,
    /// Non-zero: every shard wrote an index checkpoint with this id at that shutdown.
    pub checkpoint_id: u64,
}

impl MetaSlot {
    pub fn encode(&self) -> [u8; 128] {
        let mut out = [0u8; 128];
        out[0..8].copy_from_slice(&META_MAGIC);
        out[8..16].copy_from_slice(&self.generation.to_le_bytes());
        out[16..32].copy_from_slice(&self.store_uuid);
        out[32] = u8::from(self.clean_shutdown);
        out[40..48].copy_from_slice(&self.checkpoint_id.to_le_bytes());
        let crc = crc32c::crc32c(&out[..META_CRC_OFFSET]);
        out[META_CRC_OFFSET..META_CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<MetaSlot> {
        if bytes.len() < 128 || bytes[0..8] != META_MAGIC {
            return None;
        }
        let crc = u32::from_le_bytes(bytes[124..128].try_into().ok()?);
        if crc32c::crc32c(&bytes[..META_CRC_OFFSET]) != crc || bytes[32] > 1 {
            return None;
        }
        Some(MetaSlot {
            generation: u64::from_le_bytes(bytes[8..16].try_into().ok()?),
            store_uuid: bytes[16..32].try_into().ok()?,
            clean_shutdown: bytes[32] == 1,
            checkpoint_id: u64::from_le_bytes(bytes[40..48].try_into().ok()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample_header() -> RecordHeader {
        RecordHeader {
            record_type: RecordType::Put,
            flags: 0,
            value_kind: 0,
            db: 3,
            key_len: 3,
            value_len: 5,
            crc: 0,
            seq: 0x0102_0304_0506_0708,
            expire_at_ms: 0,
        }
    }

    // Proves the record header encodes to the exact bytes the format document specifies.
    #[test]
    fn record_header_known_bytes() {
        let mut out = [0u8; 32];
        sample_header().encode(&mut out);
        let expected: [u8; 32] = [
            2, 0, 0, 3, 3, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0, 0, 0, 0,
            0, 0, 0,
        ];
        assert_eq!(out, expected);
        assert_eq!(RecordHeader::decode(&expected), Some(sample_header()));
    }

    // Proves a record round-trips, and that a different block_seq or one flipped bit fails it.
    #[test]
    fn record_crc_binds_block_seq_and_content() {
        let mut buf = [0u8; 64];
        let len = encode_record(&mut buf, 7, sample_header(), b"key", b"value");
        assert_eq!(len, 40);
        let r = decode_record(&buf, 7).expect("valid");
        assert_eq!((r.key, r.value), (&b"key"[..], &b"value"[..]));
        assert!(decode_record(&buf, 8).is_none());
        buf[35] ^= 1;
        assert!(decode_record(&buf, 7).is_none());
    }

    // Proves truncated and malformed record bytes are rejected without panicking.
    #[test]
    fn record_truncated_and_malformed() {
        let mut buf = [0u8; 64];
        let len = encode_record(&mut buf, 1, sample_header(), b"key", b"value");
        assert!(decode_record(&buf[..len - 1], 1).is_none());
        assert!(decode_record(&buf[..10], 1).is_none());
        let mut bad = buf;
        bad[0] = 99;
        assert!(decode_record(&bad, 1).is_none());
        let mut bad_db = buf;
        bad_db[3] = 16;
        assert!(RecordHeader::decode(&bad_db).is_none());
    }

    // Proves label classification: blank, valid round trip, damaged CRC, foreign bytes.
    #[test]
    fn label_classification() {
        let label = Label {
            store_uuid: [9; 16],
            device_index: 0,
            device_count: 1,
            shard_count: 2,
            block_size_bytes: 1 << 20,
            capacity_bytes: 1 << 30,
            block_count: 1023,
        };
        let mut sector = vec![0u8; 4096];
        assert_eq!(Label::classify(&sector, true), LabelState::Blank);
        assert_eq!(Label::classify(&sector, false), LabelState::Foreign);
        sector[..128].copy_from_slice(&label.encode());
        assert_eq!(Label::classify(&sector, true), LabelState::Valid(label));
        sector[20] ^= 1;
        assert!(matches!(
            Label::classify(&sector, true),
            LabelState::Damaged(_)
        ));
        let mut foreign = vec![0u8; 4096];
        foreign[..4].copy_from_slice(b"\x7fELF");
        assert_eq!(Label::classify(&foreign, true), LabelState::Foreign);
    }

    // Proves metadata slots and markers round-trip and reject corruption.
    #[test]
    fn meta_and_marker_round_trip() {
        let m = MetaSlot {
            generation: 5,
            store_uuid: [1; 16],
            clean_shutdown: true,
            checkpoint_id: 5,
        };
        let mut bytes = m.encode();
        assert_eq!(MetaSlot::decode(&bytes), Some(m));
        bytes[9] ^= 1;
        assert_eq!(MetaSlot::decode(&bytes), None);
        let mk = MarkerPayload {
            chunk_start: 4096,
            chunk_crc: 77,
            block_seq: 3,
            flush_watermarks: [4; DB_COUNT],
            decided_below: 0x1122,
        };
        assert_eq!(MarkerPayload::decode(&mk.encode()), Some(mk));
        assert_eq!(MarkerPayload::decode(&mk.encode()[..10]), None);
    }

    // Proves a version-1 marker (144 bytes) still reads, with decided_below 0, and that
    // decided_below sits at bytes 144..152 of a version-2 marker.
    #[test]
    fn marker_v1_and_decided_below_bytes() {
        let mk = MarkerPayload {
            chunk_start: 0,
            chunk_crc: 1,
            block_seq: 2,
            flush_watermarks: [0; DB_COUNT],
            decided_below: 0x0102_0304_0506_0708,
        };
        let bytes = mk.encode();
        assert_eq!(bytes.len(), 152);
        assert_eq!(bytes[144..152], [8, 7, 6, 5, 4, 3, 2, 1]);
        let v1 = MarkerPayload::decode(&bytes[..MARKER_PAYLOAD_V1_BYTES]).expect("v1 marker");
        assert_eq!(v1.decided_below, 0);
        assert_eq!(v1.flush_watermarks, mk.flush_watermarks);
        assert_eq!(MarkerPayload::decode(&bytes[..148]), None);
    }

    // Proves a GROUPED record's exact layout (group id after the padded payload, length
    // +8), that the CRC covers the group id, and that truncation is rejected.
    #[test]
    fn grouped_record_known_bytes_and_crc() {
        let mut hdr = sample_header();
        hdr.flags = FLAG_GROUPED;
        let mut buf = [0u8; 64];
        let len = encode_record_in_group(&mut buf, 7, hdr, b"key", b"value", 0x0a0b);
        assert_eq!(len, 48);
        assert_eq!(buf[40..48], [0x0b, 0x0a, 0, 0, 0, 0, 0, 0]);
        assert_eq!(buf[1], FLAG_GROUPED);
        let r = decode_record(&buf, 7).expect("valid");
        assert_eq!(
            (r.key, r.value, r.group),
            (&b"key"[..], &b"value"[..], Some(0x0a0b))
        );
        assert_eq!(r.header.record_len(), 48);
        assert!(decode_record(&buf[..47], 7).is_none());
        let mut bad = buf;
        bad[41] ^= 1;
        assert!(
            decode_record(&bad, 7).is_none(),
            "the CRC covers the group id"
        );
        let mut plain = [0u8; 64];
        encode_record(&mut plain, 7, sample_header(), b"key", b"value");
        assert_eq!(decode_record(&plain, 7).expect("valid").group, None);
    }

    // Proves the part payload's bytes, its round trip, and rejection of short, unsorted and
    // empty shard lists.
    #[test]
    fn group_part_known_bytes_and_malformed() {
        let p = GroupPartPayload {
            group: 5,
            records: 3,
            shards: vec![1, 4],
        };
        let bytes = p.encode();
        assert_eq!(
            bytes,
            [5, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 4, 0, 0, 0]
        );
        assert_eq!(GroupPartPayload::decode(&bytes), Some(p));
        assert_eq!(GroupPartPayload::decode(&bytes[..20]), None);
        let mut unsorted = bytes.clone();
        unsorted[16] = 9;
        assert_eq!(GroupPartPayload::decode(&unsorted), None);
        let empty = GroupPartPayload {
            group: 1,
            records: 0,
            shards: vec![],
        };
        assert_eq!(GroupPartPayload::decode(&empty.encode()), None);
    }

    // Proves labels of version 1 and 2 are accepted and version 3 is refused as damaged.
    #[test]
    fn label_versions() {
        let label = Label {
            store_uuid: [3; 16],
            device_index: 0,
            device_count: 1,
            shard_count: 1,
            block_size_bytes: 1 << 16,
            capacity_bytes: 1 << 24,
            block_count: 255,
        };
        let mut sector = vec![0u8; 4096];
        sector[..128].copy_from_slice(&label.encode());
        assert_eq!(label_version(&sector), FORMAT_VERSION);
        for (v, ok) in [(1u32, true), (2, true), (3, false)] {
            sector[8..12].copy_from_slice(&v.to_le_bytes());
            let crc = crc32c::crc32c(&sector[..LABEL_CRC_OFFSET]);
            sector[124..128].copy_from_slice(&crc.to_le_bytes());
            let st = Label::classify(&sector, true);
            assert_eq!(matches!(st, LabelState::Valid(_)), ok, "version {v}");
        }
    }

    proptest! {
        // Proves any record (random key, value, fields) survives encode/decode unchanged.
        #[test]
        fn record_round_trip(key in proptest::collection::vec(any::<u8>(), 0..64),
                             value in proptest::collection::vec(any::<u8>(), 0..300),
                             seq in any::<u64>(), exp in any::<u64>(), db in 0u8..16, bseq in any::<u64>()) {
            let hdr = RecordHeader { record_type: RecordType::Put, flags: 0, value_kind: 0, db,
                key_len: key.len() as u16, value_len: value.len() as u32, crc: 0, seq, expire_at_ms: exp };
            let mut buf = vec![0u8; record_len(key.len(), value.len())];
            encode_record(&mut buf, bseq, hdr, &key, &value);
            let r = decode_record(&buf, bseq).unwrap();
            prop_assert_eq!(r.key, &key[..]);
            prop_assert_eq!(r.value, &value[..]);
            prop_assert_eq!(r.header.seq, seq);
            prop_assert_eq!(r.header.expire_at_ms, exp);
            prop_assert_eq!(r.group, None);
            // The same record in a group: the id comes back, the rest is unchanged.
            let hdr = RecordHeader { flags: FLAG_GROUPED, ..hdr };
            let mut buf = vec![0u8; hdr.record_len()];
            encode_record_in_group(&mut buf, bseq, hdr, &key, &value, seq ^ exp);
            let r = decode_record(&buf, bseq).unwrap();
            prop_assert_eq!((r.key, r.value, r.group), (&key[..], &value[..], Some(seq ^ exp)));
        }

        // Proves arbitrary bytes never panic the decoders.
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_record(&bytes, 0);
            let _ = Label::classify(&bytes, false);
            let _ = MetaSlot::decode(&bytes);
            let _ = MarkerPayload::decode(&bytes);
            let _ = BlockHeaderPayload::decode(&bytes);
            let _ = GroupPartPayload::decode(&bytes);
        }
    }
}
