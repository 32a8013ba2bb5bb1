//! IPv4 headers (RFC 791). Options are accepted and skipped on receive, never emitted.
//! Fragments (MF set or a non-zero offset) parse as [`WireError::Fragment`]: this stack
//! does not reassemble, and the interface counts and drops them.

use std::net::Ipv4Addr;

use super::{checksum, read_u16, write_u16, WireError, WireResult};

/// Length of a header without options, in bytes.
pub const HEADER_LEN_BYTES: usize = 20;
/// Protocol number of ICMP.
pub const PROTOCOL_ICMP: u8 = 1;
/// Protocol number of TCP.
pub const PROTOCOL_TCP: u8 = 6;
/// TTL of packets this stack emits.
pub const DEFAULT_TTL: u8 = 64;

const FLAG_DONT_FRAGMENT: u16 = 0x4000;
const FLAG_MORE_FRAGMENTS: u16 = 0x2000;
const FRAGMENT_OFFSET_MASK: u16 = 0x1fff;

/// A view of an IPv4 packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer after checking that the header and the total length fit in it.
    /// Bytes beyond the total length (Ethernet padding) are allowed and ignored.
    pub fn new_checked(buffer: T) -> WireResult<Packet<T>> {
        let bytes = buffer.as_ref();
        if bytes.len() < HEADER_LEN_BYTES {
            return Err(WireError::Truncated);
        }
        let header_len = usize::from(bytes[0] & 0x0f) * 4;
        let total_len = usize::from(read_u16(bytes, 2));
        if header_len < HEADER_LEN_BYTES || total_len < header_len {
            return Err(WireError::Malformed);
        }
        if bytes.len() < header_len || bytes.len() < total_len {
            return Err(WireError::Truncated);
        }
        Ok(Packet { buffer })
    }

    fn bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// IP version field (4 for IPv4).
    pub fn version(&self) -> u8 {
        self.bytes()[0] >> 4
    }

    /// Header length in bytes, options included.
    pub fn header_len(&self) -> usize {
        usize::from(self.bytes()[0] & 0x0f) * 4
    }

    /// Total length (header and payload) in bytes.
    pub fn total_len(&self) -> usize {
        usize::from(read_u16(self.bytes(), 2))
    }

    /// Identification field.
    pub fn ident(&self) -> u16 {
        read_u16(self.bytes(), 4)
    }

    /// True when the Don't Fragment flag is set.
    pub fn dont_fragment(&self) -> bool {
        read_u16(self.bytes(), 6) & FLAG_DONT_FRAGMENT != 0
    }

    /// True when the packet is a fragment (More Fragments set or a non-zero offset).
    pub fn is_fragment(&self) -> bool {
        let field = read_u16(self.bytes(), 6);
        field & FLAG_MORE_FRAGMENTS != 0 || field & FRAGMENT_OFFSET_MASK != 0
    }

    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.bytes()[8]
    }

    /// Payload protocol number.
    pub fn protocol(&self) -> u8 {
        self.bytes()[9]
    }

    /// Source address.
    pub fn src_addr(&self) -> Ipv4Addr {
        let b = self.bytes();
        Ipv4Addr::new(b[12], b[13], b[14], b[15])
    }

    /// Destination address.
    pub fn dst_addr(&self) -> Ipv4Addr {
        let b = self.bytes();
        Ipv4Addr::new(b[16], b[17], b[18], b[19])
    }

    /// True when the header checksum verifies.
    pub fn verify_checksum(&self) -> bool {
        checksum::sum(&self.bytes()[..self.header_len()]) == 0xffff
    }

    /// The payload: bytes between the header and the total length.
    pub fn payload(&self) -> &[u8] {
        &self.bytes()[self.header_len()..self.total_len()]
    }
}

/// A parsed IPv4 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr {
    /// Source address.
    pub src_addr: Ipv4Addr,
    /// Destination address.
    pub dst_addr: Ipv4Addr,
    /// Payload protocol number.
    pub protocol: u8,
    /// Payload length in bytes.
    pub payload_len: usize,
    /// Time to live.
    pub ttl: u8,
}

impl Ipv4Repr {
    /// Parses a checked packet: version 4, verified checksum, not a fragment.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> WireResult<Ipv4Repr> {
        if packet.version() != 4 {
            return Err(WireError::Malformed);
        }
        if !packet.verify_checksum() {
            return Err(WireError::Checksum);
        }
        if packet.is_fragment() {
            return Err(WireError::Fragment);
        }
        Ok(Ipv4Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            protocol: packet.protocol(),
            payload_len: packet.total_len() - packet.header_len(),
            ttl: packet.ttl(),
        })
    }

    /// Length of the header this repr emits (no options), in bytes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN_BYTES
    }

    /// Writes a 20-byte header with Don't Fragment set and identification 0 (RFC 6864
    /// allows that for atomic datagrams). Panics if `buffer` is shorter than 20 bytes or
    /// the total length does not fit in 16 bits.
    pub fn emit(&self, buffer: &mut [u8]) {
        assert!(
            buffer.len() >= HEADER_LEN_BYTES,
            "ipv4 emit buffer too short"
        );
        let total_len =
            u16::try_from(HEADER_LEN_BYTES + self.payload_len).expect("ipv4 payload too long");
        buffer[0] = 0x45;
        buffer[1] = 0;
        write_u16(buffer, 2, total_len);
        write_u16(buffer, 4, 0);
        write_u16(buffer, 6, FLAG_DONT_FRAGMENT);
        buffer[8] = self.ttl;
        buffer[9] = self.protocol;
        write_u16(buffer, 10, 0);
        buffer[12..16].copy_from_slice(&self.src_addr.octets());
        buffer[16..20].copy_from_slice(&self.dst_addr.octets());
        let sum = !checksum::sum(&buffer[..HEADER_LEN_BYTES]);
        write_u16(buffer, 10, sum);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // 10.0.0.1 -> 10.0.0.2, TCP, 4 payload bytes, DF, TTL 64; checksum computed by hand.
    const PACKET: [u8; 24] = [
        0x45, 0x00, 0x00, 0x18, 0x00, 0x00, 0x40, 0x00, 0x40, 0x06, 0x26, 0xde, 10, 0, 0, 1, 10, 0,
        0, 2, 0xde, 0xad, 0xbe, 0xef,
    ];

    fn repr() -> Ipv4Repr {
        Ipv4Repr {
            src_addr: Ipv4Addr::new(10, 0, 0, 1),
            dst_addr: Ipv4Addr::new(10, 0, 0, 2),
            protocol: PROTOCOL_TCP,
            payload_len: 4,
            ttl: 64,
        }
    }

    // Proves a known packet parses, verifies its checksum and exposes its payload.
    #[test]
    fn parse_known_packet() {
        let packet = Packet::new_checked(&PACKET[..]).unwrap();
        assert_eq!(Ipv4Repr::parse(&packet).unwrap(), repr());
        assert_eq!(packet.payload(), &[0xde, 0xad, 0xbe, 0xef]);
        assert!(packet.dont_fragment());
    }

    // Proves emit reproduces the known header, checksum included.
    #[test]
    fn emit_matches_known_packet() {
        let mut buffer = [0u8; 20];
        repr().emit(&mut buffer);
        assert_eq!(buffer, PACKET[..20]);
    }

    // Proves short buffers and total lengths beyond the buffer are truncated.
    #[test]
    fn truncated_is_rejected() {
        assert_eq!(
            Packet::new_checked(&PACKET[..19]).unwrap_err(),
            WireError::Truncated
        );
        assert_eq!(
            Packet::new_checked(&PACKET[..23]).unwrap_err(),
            WireError::Truncated
        );
    }

    // Proves bad header length, version and checksum are rejected, fragments flagged.
    #[test]
    fn malformed_is_rejected() {
        let mut bytes = PACKET;
        bytes[0] = 0x44;
        assert_eq!(
            Packet::new_checked(&bytes[..]).unwrap_err(),
            WireError::Malformed
        );
        let mut bytes = PACKET;
        bytes[0] = 0x65;
        assert_eq!(
            Ipv4Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Err(WireError::Malformed)
        );
        let mut bytes = PACKET;
        bytes[11] ^= 1;
        assert_eq!(
            Ipv4Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Err(WireError::Checksum)
        );
        let mut fragment = repr();
        fragment.payload_len = 0;
        let mut buffer = [0u8; 20];
        fragment.emit(&mut buffer);
        buffer[6] = 0x20; // More Fragments, offset 0
        buffer[10] = 0;
        buffer[11] = 0;
        let sum = !checksum::sum(&buffer);
        write_u16(&mut buffer, 10, sum);
        assert_eq!(
            Ipv4Repr::parse(&Packet::new_checked(&buffer[..]).unwrap()),
            Err(WireError::Fragment)
        );
    }

    proptest! {
        // Proves emit followed by parse is the identity for any addresses and sizes.
        #[test]
        fn round_trip(src in any::<[u8; 4]>(), dst in any::<[u8; 4]>(), protocol in any::<u8>(),
                      payload_len in 0usize..1480, ttl in any::<u8>()) {
            let repr = Ipv4Repr { src_addr: src.into(), dst_addr: dst.into(), protocol, payload_len, ttl };
            let mut buffer = vec![0u8; 20 + payload_len];
            repr.emit(&mut buffer);
            let packet = Packet::new_checked(&buffer[..]).unwrap();
            prop_assert_eq!(Ipv4Repr::parse(&packet).unwrap(), repr);
        }
    }
}
