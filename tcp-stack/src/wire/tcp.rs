//! TCP segments (RFC 9293 §3.1) with the options this stack understands: MSS (RFC 9293
//! §3.2), window scale and timestamps (RFC 7323), SACK-permitted and SACK blocks (RFC 2018),
//! NOP and EOL. Unknown options are skipped by their length. The checksum covers the
//! IPv4 pseudo-header, so parsing and emitting take both addresses.

use core::cmp::Ordering;
use core::fmt;
use core::ops::{Add, Sub};
use std::net::Ipv4Addr;

use super::{checksum, ipv4, read_u16, read_u32, write_u16, write_u32, WireError, WireResult};

/// Length of a header without options, in bytes.
pub const HEADER_LEN_BYTES: usize = 20;
/// Largest header (data offset 15), in bytes.
pub const MAX_HEADER_LEN_BYTES: usize = 60;
/// Largest window-scale shift (RFC 7323 §2.3); larger received values are clamped.
pub const MAX_WINDOW_SCALE_SHIFT: u8 = 14;
/// SACK blocks kept from a received segment (more are ignored).
pub const MAX_SACK_BLOCKS: usize = 3;

const FLAG_FIN: u16 = 0x001;
const FLAG_SYN: u16 = 0x002;
const FLAG_RST: u16 = 0x004;
const FLAG_PSH: u16 = 0x008;
const FLAG_ACK: u16 = 0x010;

const OPTION_END: u8 = 0;
const OPTION_NOP: u8 = 1;
const OPTION_MSS: u8 = 2;
const OPTION_WINDOW_SCALE: u8 = 3;
const OPTION_SACK_PERMITTED: u8 = 4;
const OPTION_SACK: u8 = 5;
const OPTION_TIMESTAMPS: u8 = 8;

/// A TCP sequence number: 32-bit modular arithmetic (RFC 9293 §3.4). Ordering compares
/// the signed distance, which is meaningful for numbers less than 2^31 apart.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SeqNumber(pub u32);

impl SeqNumber {
    /// The larger of two numbers under modular ordering.
    pub fn max(self, other: SeqNumber) -> SeqNumber {
        if self > other {
            self
        } else {
            other
        }
    }

    /// The smaller of two numbers under modular ordering.
    pub fn min(self, other: SeqNumber) -> SeqNumber {
        if self < other {
            self
        } else {
            other
        }
    }
}

impl fmt::Debug for SeqNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Add<usize> for SeqNumber {
    type Output = SeqNumber;
    fn add(self, rhs: usize) -> SeqNumber {
        // Sequence space wraps at 2^32 by definition; truncation is the arithmetic.
        SeqNumber(self.0.wrapping_add(rhs as u32))
    }
}

impl Sub<usize> for SeqNumber {
    type Output = SeqNumber;
    fn sub(self, rhs: usize) -> SeqNumber {
        SeqNumber(self.0.wrapping_sub(rhs as u32))
    }
}

impl Sub for SeqNumber {
    type Output = usize;
    /// Distance from `rhs` up to `self`. Panics if `rhs` is after `self` (a caller bug:
    /// callers order-check first).
    fn sub(self, rhs: SeqNumber) -> usize {
        let distance = self.0.wrapping_sub(rhs.0) as i32;
        assert!(
            distance >= 0,
            "sequence subtraction underflow: {self:?} - {rhs:?}"
        );
        distance as usize
    }
}

impl PartialOrd for SeqNumber {
    fn partial_cmp(&self, other: &SeqNumber) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for SeqNumber {
    fn cmp(&self, other: &SeqNumber) -> Ordering {
        (self.0.wrapping_sub(other.0) as i32).cmp(&0)
    }
}

/// A view of a TCP segment.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer after checking the data offset is sane and the header fits.
    /// The whole buffer is the segment: pass exactly the IPv4 payload.
    pub fn new_checked(buffer: T) -> WireResult<Packet<T>> {
        let bytes = buffer.as_ref();
        if bytes.len() < HEADER_LEN_BYTES {
            return Err(WireError::Truncated);
        }
        let header_len = usize::from(bytes[12] >> 4) * 4;
        if header_len < HEADER_LEN_BYTES {
            return Err(WireError::Malformed);
        }
        if bytes.len() < header_len {
            return Err(WireError::Truncated);
        }
        Ok(Packet { buffer })
    }

    fn bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        read_u16(self.bytes(), 0)
    }

    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        read_u16(self.bytes(), 2)
    }

    /// Sequence number.
    pub fn seq_number(&self) -> SeqNumber {
        SeqNumber(read_u32(self.bytes(), 4))
    }

    /// Acknowledgment number (meaningful only with ACK set).
    pub fn ack_number(&self) -> SeqNumber {
        SeqNumber(read_u32(self.bytes(), 8))
    }

    /// Header length in bytes, options included.
    pub fn header_len(&self) -> usize {
        usize::from(self.bytes()[12] >> 4) * 4
    }

    fn flags(&self) -> u16 {
        read_u16(self.bytes(), 12) & 0x01ff
    }

    /// Window field, unscaled.
    pub fn window_len(&self) -> u16 {
        read_u16(self.bytes(), 14)
    }

    /// The option bytes between the fixed header and the data.
    pub fn options(&self) -> &[u8] {
        &self.bytes()[HEADER_LEN_BYTES..self.header_len()]
    }

    /// The data after the header.
    pub fn payload(&self) -> &[u8] {
        &self.bytes()[self.header_len()..]
    }

    /// True when the checksum over pseudo-header and segment verifies.
    pub fn verify_checksum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        let Ok(length) = u16::try_from(self.bytes().len()) else {
            return false;
        };
        let pseudo = checksum::pseudo_header(src, dst, ipv4::PROTOCOL_TCP, length);
        checksum::combine(&[pseudo, checksum::sum(self.bytes())]) == 0xffff
    }
}

/// A parsed TCP segment; `payload` borrows from the received bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpRepr<'a> {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Sequence number of the first octet (or of the SYN/FIN).
    pub seq_number: SeqNumber,
    /// Acknowledgment number, present when the ACK flag is set.
    pub ack_number: Option<SeqNumber>,
    /// SYN flag.
    pub syn: bool,
    /// FIN flag.
    pub fin: bool,
    /// RST flag.
    pub rst: bool,
    /// PSH flag.
    pub psh: bool,
    /// Window field as sent (scale it with the negotiated shift).
    pub window_len: u16,
    /// Maximum segment size option.
    pub max_seg_size: Option<u16>,
    /// Window scale option (shift count, clamped to 14).
    pub window_scale: Option<u8>,
    /// SACK-permitted option.
    pub sack_permitted: bool,
    /// SACK blocks (left edge, right edge), first `MAX_SACK_BLOCKS` only.
    pub sack_ranges: [Option<(u32, u32)>; MAX_SACK_BLOCKS],
    /// Timestamps option: (TSval, TSecr).
    pub timestamp: Option<(u32, u32)>,
    /// Segment data.
    pub payload: &'a [u8],
}

impl<'a> TcpRepr<'a> {
    /// A plain segment with no flags, options or data; fill in what you need.
    pub fn new(src_port: u16, dst_port: u16, seq_number: SeqNumber) -> TcpRepr<'static> {
        TcpRepr {
            src_port,
            dst_port,
            seq_number,
            ack_number: None,
            syn: false,
            fin: false,
            rst: false,
            psh: false,
            window_len: 0,
            max_seg_size: None,
            window_scale: None,
            sack_permitted: false,
            sack_ranges: [None; MAX_SACK_BLOCKS],
            timestamp: None,
            payload: &[],
        }
    }

    /// Parses a checked segment received from `src` to `dst`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        packet: &Packet<&'a T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
    ) -> WireResult<TcpRepr<'a>> {
        if !packet.verify_checksum(src, dst) {
            return Err(WireError::Checksum);
        }
        if packet.src_port() == 0 || packet.dst_port() == 0 {
            return Err(WireError::Malformed);
        }
        let flags = packet.flags();
        let syn = flags & FLAG_SYN != 0;
        let fin = flags & FLAG_FIN != 0;
        let rst = flags & FLAG_RST != 0;
        if (syn && (fin || rst)) || (rst && fin) {
            return Err(WireError::Malformed);
        }
        let mut repr = TcpRepr::new(packet.src_port(), packet.dst_port(), packet.seq_number());
        repr.syn = syn;
        repr.fin = fin;
        repr.rst = rst;
        repr.psh = flags & FLAG_PSH != 0;
        repr.ack_number = (flags & FLAG_ACK != 0).then(|| packet.ack_number());
        repr.window_len = packet.window_len();
        repr.parse_options(packet.options())?;
        repr.payload = &packet.buffer.as_ref()[packet.header_len()..];
        Ok(repr)
    }

    fn parse_options(&mut self, mut options: &[u8]) -> WireResult<()> {
        while let Some(&kind) = options.first() {
            match kind {
                OPTION_END => break,
                OPTION_NOP => {
                    options = &options[1..];
                    continue;
                }
                _ => {}
            }
            let len = usize::from(*options.get(1).ok_or(WireError::Malformed)?);
            if len < 2 || len > options.len() {
                return Err(WireError::Malformed);
            }
            let body = &options[2..len];
            match (kind, len) {
                (OPTION_MSS, 4) => self.max_seg_size = Some(read_u16(body, 0)),
                (OPTION_WINDOW_SCALE, 3) => {
                    self.window_scale = Some(body[0].min(MAX_WINDOW_SCALE_SHIFT))
                }
                (OPTION_SACK_PERMITTED, 2) => self.sack_permitted = true,
                (OPTION_TIMESTAMPS, 10) => {
                    self.timestamp = Some((read_u32(body, 0), read_u32(body, 4)))
                }
                (OPTION_SACK, _) if (len - 2) % 8 == 0 && len > 2 => {
                    for (slot, block) in self.sack_ranges.iter_mut().zip(body.chunks_exact(8)) {
                        *slot = Some((read_u32(block, 0), read_u32(block, 4)));
                    }
                }
                (
                    OPTION_MSS
                    | OPTION_WINDOW_SCALE
                    | OPTION_SACK_PERMITTED
                    | OPTION_TIMESTAMPS
                    | OPTION_SACK,
                    _,
                ) => return Err(WireError::Malformed),
                _ => {}
            }
            options = &options[len..];
        }
        Ok(())
    }

    fn options_len(&self) -> usize {
        let mut len = 0;
        if self.max_seg_size.is_some() {
            len += 4;
        }
        if self.window_scale.is_some() {
            len += 4; // NOP + 3
        }
        if self.sack_permitted {
            len += 4; // NOP NOP + 2
        }
        if self.timestamp.is_some() {
            len += 12; // NOP NOP + 10
        }
        let blocks = self.sack_ranges.iter().flatten().count();
        if blocks > 0 {
            len += 4 + 8 * blocks; // NOP NOP + 2 + blocks
        }
        len
    }

    /// Header length this repr emits, options included, in bytes.
    pub fn header_len(&self) -> usize {
        HEADER_LEN_BYTES + self.options_len()
    }

    /// Segment length this repr emits (header and payload), in bytes.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload.len()
    }

    /// Sequence space the segment occupies: data plus one for SYN and one for FIN.
    pub fn segment_len(&self) -> usize {
        self.payload.len() + usize::from(self.syn) + usize::from(self.fin)
    }

    /// Writes header and options for a segment carrying `payload_len` data bytes, which
    /// the caller writes at `buffer[header_len()..]` before calling [`fill_checksum`].
    /// Panics if the options do not fit in 40 bytes (a caller bug).
    pub fn emit_header(&self, buffer: &mut [u8]) {
        let header_len = self.header_len();
        assert!(
            header_len <= MAX_HEADER_LEN_BYTES,
            "tcp options exceed 40 bytes"
        );
        assert!(buffer.len() >= header_len, "tcp emit buffer too short");
        write_u16(buffer, 0, self.src_port);
        write_u16(buffer, 2, self.dst_port);
        write_u32(buffer, 4, self.seq_number.0);
        write_u32(buffer, 8, self.ack_number.map_or(0, |ack| ack.0));
        let mut flags = 0;
        flags |= if self.fin { FLAG_FIN } else { 0 };
        flags |= if self.syn { FLAG_SYN } else { 0 };
        flags |= if self.rst { FLAG_RST } else { 0 };
        flags |= if self.psh { FLAG_PSH } else { 0 };
        flags |= if self.ack_number.is_some() {
            FLAG_ACK
        } else {
            0
        };
        write_u16(buffer, 12, ((header_len as u16 / 4) << 12) | flags);
        write_u16(buffer, 14, self.window_len);
        write_u16(buffer, 16, 0);
        write_u16(buffer, 18, 0);
        self.emit_options(&mut buffer[HEADER_LEN_BYTES..header_len]);
    }

    fn emit_options(&self, out: &mut [u8]) {
        let mut at = 0;
        if let Some(mss) = self.max_seg_size {
            out[at..at + 2].copy_from_slice(&[OPTION_MSS, 4]);
            write_u16(out, at + 2, mss);
            at += 4;
        }
        if let Some(shift) = self.window_scale {
            out[at..at + 4].copy_from_slice(&[OPTION_NOP, OPTION_WINDOW_SCALE, 3, shift]);
            at += 4;
        }
        if self.sack_permitted {
            out[at..at + 4].copy_from_slice(&[OPTION_NOP, OPTION_NOP, OPTION_SACK_PERMITTED, 2]);
            at += 4;
        }
        if let Some((value, echo)) = self.timestamp {
            out[at..at + 4].copy_from_slice(&[OPTION_NOP, OPTION_NOP, OPTION_TIMESTAMPS, 10]);
            write_u32(out, at + 4, value);
            write_u32(out, at + 8, echo);
            at += 12;
        }
        let blocks = self.sack_ranges.iter().flatten().count();
        if blocks > 0 {
            out[at..at + 4].copy_from_slice(&[
                OPTION_NOP,
                OPTION_NOP,
                OPTION_SACK,
                2 + 8 * blocks as u8,
            ]);
            at += 4;
            for &(left, right) in self.sack_ranges.iter().flatten() {
                write_u32(out, at, left);
                write_u32(out, at + 4, right);
                at += 8;
            }
        }
        debug_assert_eq!(at, out.len());
    }

    /// Writes the whole segment, payload and checksum included.
    pub fn emit(&self, buffer: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr) {
        let header_len = self.header_len();
        let len = self.buffer_len();
        assert!(buffer.len() >= len, "tcp emit buffer too short");
        self.emit_header(buffer);
        buffer[header_len..len].copy_from_slice(self.payload);
        fill_checksum(&mut buffer[..len], src, dst);
    }
}

/// Computes and stores the checksum of a whole emitted segment (`segment` is exactly the
/// header and data).
pub fn fill_checksum(segment: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr) {
    let length = u16::try_from(segment.len()).expect("tcp segment longer than 64 KiB");
    write_u16(segment, 16, 0);
    let pseudo = checksum::pseudo_header(src, dst, ipv4::PROTOCOL_TCP, length);
    let sum = !checksum::combine(&[pseudo, checksum::sum(segment)]);
    write_u16(segment, 16, sum);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SRC: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const DST: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    // SYN 40000 -> 6379, seq 0x01020304, window 64240, MSS 1460, WS 7, SACK-permitted,
    // TS (1, 0). Checksum computed by hand over the pseudo-header.
    const SYN: [u8; 44] = [
        0x9c, 0x40, 0x18, 0xeb, 0x01, 0x02, 0x03, 0x04, 0x00, 0x00, 0x00, 0x00, 0xb0, 0x02, 0xfa,
        0xf0, 0x6d, 0xd4, 0x00, 0x00, 0x02, 0x04, 0x05, 0xb4, 0x01, 0x03, 0x03, 0x07, 0x01, 0x01,
        0x04, 0x02, 0x01, 0x01, 0x08, 0x0a, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
    ];

    fn syn_repr() -> TcpRepr<'static> {
        let mut repr = TcpRepr::new(40000, 6379, SeqNumber(0x0102_0304));
        repr.syn = true;
        repr.window_len = 64240;
        repr.max_seg_size = Some(1460);
        repr.window_scale = Some(7);
        repr.sack_permitted = true;
        repr.timestamp = Some((1, 0));
        repr
    }

    // Proves a known SYN with all supported options parses into the expected repr.
    #[test]
    fn parse_known_syn() {
        let packet = Packet::new_checked(&SYN[..]).unwrap();
        assert_eq!(TcpRepr::parse(&packet, SRC, DST).unwrap(), syn_repr());
        assert_eq!(syn_repr().segment_len(), 1);
    }

    // Proves emit reproduces the known SYN, options and checksum included.
    #[test]
    fn emit_matches_known_syn() {
        let mut buffer = [0u8; 44];
        syn_repr().emit(&mut buffer, SRC, DST);
        assert_eq!(buffer, SYN);
    }

    // Proves short buffers and data offsets beyond the buffer are truncated.
    #[test]
    fn truncated_is_rejected() {
        assert_eq!(
            Packet::new_checked(&SYN[..19]).unwrap_err(),
            WireError::Truncated
        );
        assert_eq!(
            Packet::new_checked(&SYN[..43]).unwrap_err(),
            WireError::Truncated
        );
    }

    // Proves bad checksums, data offsets, option lengths and flag combinations are rejected.
    #[test]
    fn malformed_is_rejected() {
        let mut bytes = SYN;
        bytes[43] ^= 1;
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(TcpRepr::parse(&packet, SRC, DST), Err(WireError::Checksum));
        let mut bytes = SYN;
        bytes[12] = 0x40;
        assert_eq!(
            Packet::new_checked(&bytes[..]).unwrap_err(),
            WireError::Malformed
        );
        let mut bytes = SYN;
        bytes[21] = 3; // MSS option with length 3
        fill_checksum(&mut bytes, SRC, DST);
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(TcpRepr::parse(&packet, SRC, DST), Err(WireError::Malformed));
        let mut bytes = SYN;
        bytes[13] |= 0x01; // SYN+FIN
        fill_checksum(&mut bytes, SRC, DST);
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(TcpRepr::parse(&packet, SRC, DST), Err(WireError::Malformed));
    }

    // Proves sequence comparison and distance work across the 2^32 wrap.
    #[test]
    fn seq_number_wraps() {
        let near_end = SeqNumber(u32::MAX - 1);
        let wrapped = near_end + 4;
        assert_eq!(wrapped, SeqNumber(2));
        assert!(wrapped > near_end);
        assert_eq!(wrapped - near_end, 4);
        assert_eq!(near_end.max(wrapped), wrapped);
    }

    fn sack_strategy() -> impl Strategy<Value = [Option<(u32, u32)>; 3]> {
        (0usize..=3, any::<[(u32, u32); 3]>()).prop_map(|(count, blocks)| {
            let mut out = [None; 3];
            for (slot, block) in out.iter_mut().zip(blocks).take(count) {
                *slot = Some(block);
            }
            out
        })
    }

    proptest! {
        // Proves emit followed by parse is the identity for any header and option mix
        // that fits in 40 option bytes.
        #[test]
        fn round_trip(src_port in 1u16.., dst_port in 1u16.., seq in any::<u32>(), ack in any::<Option<u32>>(),
                      flag in 0u8..4, psh in any::<bool>(), window in any::<u16>(),
                      mss in any::<Option<u16>>(), ws in proptest::option::of(0u8..=14), sack_permitted in any::<bool>(),
                      sack_ranges in sack_strategy(), timestamp in any::<Option<(u32, u32)>>(),
                      payload in proptest::collection::vec(any::<u8>(), 0..100)) {
            let mut repr = TcpRepr::new(src_port, dst_port, SeqNumber(seq));
            repr.ack_number = ack.map(SeqNumber);
            repr.syn = flag == 1;
            repr.fin = flag == 2;
            repr.rst = flag == 3;
            repr.psh = psh;
            repr.window_len = window;
            repr.max_seg_size = mss;
            repr.window_scale = ws;
            repr.sack_permitted = sack_permitted;
            repr.sack_ranges = sack_ranges;
            repr.timestamp = timestamp;
            repr.payload = &payload;
            prop_assume!(repr.header_len() <= MAX_HEADER_LEN_BYTES);
            let mut buffer = vec![0u8; repr.buffer_len()];
            repr.emit(&mut buffer, SRC, DST);
            let packet = Packet::new_checked(&buffer[..]).unwrap();
            prop_assert_eq!(TcpRepr::parse(&packet, SRC, DST).unwrap(), repr);
        }
    }
}
