//! ARP for IPv4 over Ethernet (RFC 826). Only hardware type 1 (Ethernet) with protocol
//! type 0x0800 (IPv4) is supported; other combinations parse as `Unsupported`.

use std::net::Ipv4Addr;

use super::{read_u16, write_u16, MacAddr, WireError, WireResult};

/// Length of an Ethernet/IPv4 ARP packet in bytes.
pub const PACKET_LEN_BYTES: usize = 28;

const HARDWARE_ETHERNET: u16 = 1;
const PROTOCOL_IPV4: u16 = 0x0800;
const OPERATION_REQUEST: u16 = 1;
const OPERATION_REPLY: u16 = 2;

/// A view of an ARP packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer after checking it holds a whole Ethernet/IPv4-sized packet.
    /// Trailing bytes (Ethernet padding) are allowed.
    pub fn new_checked(buffer: T) -> WireResult<Packet<T>> {
        if buffer.as_ref().len() < PACKET_LEN_BYTES {
            return Err(WireError::Truncated);
        }
        Ok(Packet { buffer })
    }

    fn bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Hardware type (1 = Ethernet).
    pub fn hardware_type(&self) -> u16 {
        read_u16(self.bytes(), 0)
    }

    /// Protocol type (0x0800 = IPv4).
    pub fn protocol_type(&self) -> u16 {
        read_u16(self.bytes(), 2)
    }

    /// Hardware address length.
    pub fn hardware_len(&self) -> u8 {
        self.bytes()[4]
    }

    /// Protocol address length.
    pub fn protocol_len(&self) -> u8 {
        self.bytes()[5]
    }

    /// Operation code (1 request, 2 reply).
    pub fn operation(&self) -> u16 {
        read_u16(self.bytes(), 6)
    }

    fn mac_at(&self, at: usize) -> MacAddr {
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&self.bytes()[at..at + 6]);
        MacAddr(mac)
    }

    fn ip_at(&self, at: usize) -> Ipv4Addr {
        let b = &self.bytes()[at..at + 4];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }
}

/// ARP operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArpOperation {
    /// Who has `target_ip`?
    Request,
    /// `source_ip` is at `source_mac`.
    Reply,
}

/// A parsed Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpRepr {
    /// Request or reply.
    pub operation: ArpOperation,
    /// Sender hardware address.
    pub source_mac: MacAddr,
    /// Sender protocol address.
    pub source_ip: Ipv4Addr,
    /// Target hardware address (zero in requests).
    pub target_mac: MacAddr,
    /// Target protocol address.
    pub target_ip: Ipv4Addr,
}

impl ArpRepr {
    /// Parses a checked packet.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> WireResult<ArpRepr> {
        if packet.hardware_type() != HARDWARE_ETHERNET || packet.protocol_type() != PROTOCOL_IPV4 {
            return Err(WireError::Unsupported);
        }
        if packet.hardware_len() != 6 || packet.protocol_len() != 4 {
            return Err(WireError::Malformed);
        }
        let operation = match packet.operation() {
            OPERATION_REQUEST => ArpOperation::Request,
            OPERATION_REPLY => ArpOperation::Reply,
            _ => return Err(WireError::Malformed),
        };
        Ok(ArpRepr {
            operation,
            source_mac: packet.mac_at(8),
            source_ip: packet.ip_at(14),
            target_mac: packet.mac_at(18),
            target_ip: packet.ip_at(24),
        })
    }

    /// Packet length in bytes.
    pub const fn buffer_len(&self) -> usize {
        PACKET_LEN_BYTES
    }

    /// Writes the packet into the first 28 bytes of `buffer`. Panics if shorter.
    pub fn emit(&self, buffer: &mut [u8]) {
        assert!(
            buffer.len() >= PACKET_LEN_BYTES,
            "arp emit buffer too short"
        );
        write_u16(buffer, 0, HARDWARE_ETHERNET);
        write_u16(buffer, 2, PROTOCOL_IPV4);
        buffer[4] = 6;
        buffer[5] = 4;
        let operation = match self.operation {
            ArpOperation::Request => OPERATION_REQUEST,
            ArpOperation::Reply => OPERATION_REPLY,
        };
        write_u16(buffer, 6, operation);
        buffer[8..14].copy_from_slice(&self.source_mac.0);
        buffer[14..18].copy_from_slice(&self.source_ip.octets());
        buffer[18..24].copy_from_slice(&self.target_mac.0);
        buffer[24..28].copy_from_slice(&self.target_ip.octets());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const REQUEST: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, // eth/ipv4, request
        0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 10, 0, 0, 1, // sender
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 10, 0, 0, 2, // target
    ];

    fn request_repr() -> ArpRepr {
        ArpRepr {
            operation: ArpOperation::Request,
            source_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            source_ip: Ipv4Addr::new(10, 0, 0, 1),
            target_mac: MacAddr([0; 6]),
            target_ip: Ipv4Addr::new(10, 0, 0, 2),
        }
    }

    // Proves a known request parses into the expected fields.
    #[test]
    fn parse_known_request() {
        let packet = Packet::new_checked(&REQUEST[..]).unwrap();
        assert_eq!(ArpRepr::parse(&packet).unwrap(), request_repr());
    }

    // Proves emit reproduces the known request byte for byte.
    #[test]
    fn emit_matches_known_request() {
        let mut buffer = [0u8; 28];
        request_repr().emit(&mut buffer);
        assert_eq!(buffer, REQUEST);
    }

    // Proves a packet one byte short is rejected as truncated.
    #[test]
    fn truncated_is_rejected() {
        assert_eq!(
            Packet::new_checked(&REQUEST[..27]).unwrap_err(),
            WireError::Truncated
        );
    }

    // Proves bad address lengths and opcodes are malformed; other protocols unsupported.
    #[test]
    fn malformed_is_rejected() {
        let mut bytes = REQUEST;
        bytes[4] = 8;
        assert_eq!(
            ArpRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Err(WireError::Malformed)
        );
        let mut bytes = REQUEST;
        bytes[7] = 9;
        assert_eq!(
            ArpRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Err(WireError::Malformed)
        );
        let mut bytes = REQUEST;
        bytes[3] = 0xdd;
        assert_eq!(
            ArpRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Err(WireError::Unsupported)
        );
    }

    proptest! {
        // Proves emit followed by parse is the identity for any addresses and operation.
        #[test]
        fn round_trip(reply in any::<bool>(), smac in any::<[u8; 6]>(), sip in any::<[u8; 4]>(),
                      tmac in any::<[u8; 6]>(), tip in any::<[u8; 4]>()) {
            let repr = ArpRepr {
                operation: if reply { ArpOperation::Reply } else { ArpOperation::Request },
                source_mac: MacAddr(smac),
                source_ip: sip.into(),
                target_mac: MacAddr(tmac),
                target_ip: tip.into(),
            };
            let mut buffer = [0u8; 28];
            repr.emit(&mut buffer);
            prop_assert_eq!(ArpRepr::parse(&Packet::new_checked(&buffer[..]).unwrap()).unwrap(), repr);
        }
    }
}
