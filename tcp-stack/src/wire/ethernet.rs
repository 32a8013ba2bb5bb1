//! Ethernet II frames (IEEE 802.3 with an EtherType; no 802.1Q tags, no FCS — the NIC
//! strips and appends it).

use super::{read_u16, write_u16, MacAddr, WireError, WireResult};

/// Header length in bytes: destination, source, EtherType.
pub const HEADER_LEN_BYTES: usize = 14;

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;

/// The payload protocol of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtherType {
    /// Internet Protocol version 4.
    Ipv4,
    /// Address Resolution Protocol.
    Arp,
    /// Anything else; the frame is ignored.
    Unknown(u16),
}

impl From<u16> for EtherType {
    fn from(value: u16) -> Self {
        match value {
            ETHERTYPE_IPV4 => EtherType::Ipv4,
            ETHERTYPE_ARP => EtherType::Arp,
            other => EtherType::Unknown(other),
        }
    }
}

impl From<EtherType> for u16 {
    fn from(value: EtherType) -> u16 {
        match value {
            EtherType::Ipv4 => ETHERTYPE_IPV4,
            EtherType::Arp => ETHERTYPE_ARP,
            EtherType::Unknown(other) => other,
        }
    }
}

/// A view of an Ethernet II frame.
#[derive(Debug, Clone)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps a buffer without checking it; accessors may panic on short buffers.
    pub fn new_unchecked(buffer: T) -> Frame<T> {
        Frame { buffer }
    }

    /// Wraps a buffer after checking that it holds a whole header.
    pub fn new_checked(buffer: T) -> WireResult<Frame<T>> {
        if buffer.as_ref().len() < HEADER_LEN_BYTES {
            return Err(WireError::Truncated);
        }
        Ok(Frame { buffer })
    }

    /// Destination MAC address.
    pub fn dst_addr(&self) -> MacAddr {
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&self.buffer.as_ref()[0..6]);
        MacAddr(mac)
    }

    /// Source MAC address.
    pub fn src_addr(&self) -> MacAddr {
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&self.buffer.as_ref()[6..12]);
        MacAddr(mac)
    }

    /// EtherType of the payload.
    pub fn ethertype(&self) -> EtherType {
        EtherType::from(read_u16(self.buffer.as_ref(), 12))
    }

    /// The bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN_BYTES..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Mutable access to the bytes after the header.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN_BYTES..]
    }
}

/// The parsed header of an Ethernet II frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetRepr {
    /// Sender's MAC address.
    pub src_addr: MacAddr,
    /// Receiver's MAC address (unicast, multicast or broadcast).
    pub dst_addr: MacAddr,
    /// Payload protocol.
    pub ethertype: EtherType,
}

impl EthernetRepr {
    /// Parses a checked frame. A multicast source address is malformed.
    pub fn parse<T: AsRef<[u8]>>(frame: &Frame<T>) -> WireResult<EthernetRepr> {
        let src_addr = frame.src_addr();
        if src_addr.is_multicast() {
            return Err(WireError::Malformed);
        }
        Ok(EthernetRepr {
            src_addr,
            dst_addr: frame.dst_addr(),
            ethertype: frame.ethertype(),
        })
    }

    /// Header length in bytes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN_BYTES
    }

    /// Writes the header into the first 14 bytes of `buffer`. Panics if shorter.
    pub fn emit(&self, buffer: &mut [u8]) {
        assert!(
            buffer.len() >= HEADER_LEN_BYTES,
            "ethernet emit buffer too short"
        );
        buffer[0..6].copy_from_slice(&self.dst_addr.0);
        buffer[6..12].copy_from_slice(&self.src_addr.0);
        write_u16(buffer, 12, self.ethertype.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const FRAME: [u8; 18] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // dst broadcast
        0x02, 0x00, 0x00, 0x00, 0x00, 0x01, // src
        0x08, 0x06, // ARP
        0xaa, 0xbb, 0xcc, 0xdd, // payload
    ];

    // Proves a known frame parses into the expected fields and payload.
    #[test]
    fn parse_known_frame() {
        let frame = Frame::new_checked(&FRAME[..]).unwrap();
        let repr = EthernetRepr::parse(&frame).unwrap();
        assert_eq!(repr.dst_addr, MacAddr::BROADCAST);
        assert_eq!(repr.src_addr, MacAddr([2, 0, 0, 0, 0, 1]));
        assert_eq!(repr.ethertype, EtherType::Arp);
        assert_eq!(frame.payload(), &[0xaa, 0xbb, 0xcc, 0xdd]);
    }

    // Proves emit writes exactly the bytes of the known frame's header.
    #[test]
    fn emit_matches_known_frame() {
        let repr = EthernetRepr {
            src_addr: MacAddr([2, 0, 0, 0, 0, 1]),
            dst_addr: MacAddr::BROADCAST,
            ethertype: EtherType::Arp,
        };
        let mut buffer = [0u8; 14];
        repr.emit(&mut buffer);
        assert_eq!(buffer, FRAME[..14]);
    }

    // Proves a buffer shorter than the header is rejected as truncated.
    #[test]
    fn truncated_is_rejected() {
        assert_eq!(
            Frame::new_checked(&FRAME[..13]).unwrap_err(),
            WireError::Truncated
        );
    }

    // Proves a multicast source address is rejected as malformed.
    #[test]
    fn multicast_source_is_malformed() {
        let mut bytes = FRAME;
        bytes[6] = 0x01;
        let frame = Frame::new_checked(&bytes[..]).unwrap();
        assert_eq!(
            EthernetRepr::parse(&frame).unwrap_err(),
            WireError::Malformed
        );
    }

    proptest! {
        // Proves emit followed by parse returns the same header for any valid fields.
        #[test]
        fn round_trip(src in any::<[u8; 6]>(), dst in any::<[u8; 6]>(), ethertype in any::<u16>()) {
            let mut src = src;
            src[0] &= 0xfe;
            let repr = EthernetRepr { src_addr: MacAddr(src), dst_addr: MacAddr(dst), ethertype: ethertype.into() };
            let mut buffer = [0u8; 14];
            repr.emit(&mut buffer);
            let parsed = EthernetRepr::parse(&Frame::new_checked(&buffer[..]).unwrap()).unwrap();
            prop_assert_eq!(parsed, repr);
        }
    }
}
