//! ICMPv4 echo request and reply (RFC 792). Other ICMP types parse as `Unsupported`:
//! path MTU discovery and error reporting are deliberately not handled.

use super::{checksum, read_u16, write_u16, WireError, WireResult};

/// Length of the echo header (type, code, checksum, identifier, sequence) in bytes.
pub const ECHO_HEADER_LEN_BYTES: usize = 8;

const TYPE_ECHO_REPLY: u8 = 0;
const TYPE_ECHO_REQUEST: u8 = 8;

/// A view of an ICMPv4 message.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer after checking it holds the 8-byte header.
    pub fn new_checked(buffer: T) -> WireResult<Packet<T>> {
        if buffer.as_ref().len() < ECHO_HEADER_LEN_BYTES {
            return Err(WireError::Truncated);
        }
        Ok(Packet { buffer })
    }

    fn bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Message type.
    pub fn msg_type(&self) -> u8 {
        self.bytes()[0]
    }

    /// Message code.
    pub fn msg_code(&self) -> u8 {
        self.bytes()[1]
    }

    /// Echo identifier.
    pub fn echo_ident(&self) -> u16 {
        read_u16(self.bytes(), 4)
    }

    /// Echo sequence number.
    pub fn echo_seq(&self) -> u16 {
        read_u16(self.bytes(), 6)
    }

    /// Echo data after the header.
    pub fn data(&self) -> &[u8] {
        &self.bytes()[ECHO_HEADER_LEN_BYTES..]
    }

    /// True when the checksum over the whole message verifies.
    pub fn verify_checksum(&self) -> bool {
        checksum::sum(self.bytes()) == 0xffff
    }
}

/// A parsed echo message; `data` borrows from the received packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcmpRepr<'a> {
    /// Echo request ("ping").
    EchoRequest {
        /// Identifier chosen by the sender.
        ident: u16,
        /// Sequence number chosen by the sender.
        seq_no: u16,
        /// Opaque data to echo back.
        data: &'a [u8],
    },
    /// Echo reply.
    EchoReply {
        /// Identifier copied from the request.
        ident: u16,
        /// Sequence number copied from the request.
        seq_no: u16,
        /// Data copied from the request.
        data: &'a [u8],
    },
}

impl<'a> IcmpRepr<'a> {
    /// Parses a checked message.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&'a T>) -> WireResult<IcmpRepr<'a>> {
        if !packet.verify_checksum() {
            return Err(WireError::Checksum);
        }
        if packet.msg_code() != 0 {
            return Err(WireError::Malformed);
        }
        let data = &packet.buffer.as_ref()[ECHO_HEADER_LEN_BYTES..];
        let (ident, seq_no) = (packet.echo_ident(), packet.echo_seq());
        match packet.msg_type() {
            TYPE_ECHO_REQUEST => Ok(IcmpRepr::EchoRequest {
                ident,
                seq_no,
                data,
            }),
            TYPE_ECHO_REPLY => Ok(IcmpRepr::EchoReply {
                ident,
                seq_no,
                data,
            }),
            _ => Err(WireError::Unsupported),
        }
    }

    /// Message length in bytes.
    pub fn buffer_len(&self) -> usize {
        match self {
            IcmpRepr::EchoRequest { data, .. } | IcmpRepr::EchoReply { data, .. } => {
                ECHO_HEADER_LEN_BYTES + data.len()
            }
        }
    }

    /// Writes the message and its checksum. Panics if `buffer` is shorter than `buffer_len`.
    pub fn emit(&self, buffer: &mut [u8]) {
        let len = self.buffer_len();
        assert!(buffer.len() >= len, "icmp emit buffer too short");
        let (msg_type, ident, seq_no, data) = match *self {
            IcmpRepr::EchoRequest {
                ident,
                seq_no,
                data,
            } => (TYPE_ECHO_REQUEST, ident, seq_no, data),
            IcmpRepr::EchoReply {
                ident,
                seq_no,
                data,
            } => (TYPE_ECHO_REPLY, ident, seq_no, data),
        };
        buffer[0] = msg_type;
        buffer[1] = 0;
        write_u16(buffer, 2, 0);
        write_u16(buffer, 4, ident);
        write_u16(buffer, 6, seq_no);
        buffer[ECHO_HEADER_LEN_BYTES..len].copy_from_slice(data);
        let sum = !checksum::sum(&buffer[..len]);
        write_u16(buffer, 2, sum);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Echo request, ident 0x1234, seq 1, data "hi"; checksum computed by hand.
    const REQUEST: [u8; 10] = [0x08, 0x00, 0x7d, 0x61, 0x12, 0x34, 0x00, 0x01, b'h', b'i'];

    // Proves a known echo request parses with its identifier, sequence and data.
    #[test]
    fn parse_known_request() {
        let packet = Packet::new_checked(&REQUEST[..]).unwrap();
        assert_eq!(
            IcmpRepr::parse(&packet).unwrap(),
            IcmpRepr::EchoRequest {
                ident: 0x1234,
                seq_no: 1,
                data: b"hi"
            }
        );
    }

    // Proves emit reproduces the known request, checksum included.
    #[test]
    fn emit_matches_known_request() {
        let mut buffer = [0u8; 10];
        IcmpRepr::EchoRequest {
            ident: 0x1234,
            seq_no: 1,
            data: b"hi",
        }
        .emit(&mut buffer);
        assert_eq!(buffer, REQUEST);
    }

    // Proves a message shorter than the echo header is truncated.
    #[test]
    fn truncated_is_rejected() {
        assert_eq!(
            Packet::new_checked(&REQUEST[..7]).unwrap_err(),
            WireError::Truncated
        );
    }

    // Proves bad checksums and codes are rejected and other types are unsupported.
    #[test]
    fn malformed_is_rejected() {
        let mut bytes = REQUEST;
        bytes[9] ^= 0xff;
        assert_eq!(
            IcmpRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Err(WireError::Checksum)
        );
        let mut bytes = REQUEST;
        bytes[1] = 1;
        write_u16(&mut bytes, 2, 0);
        let sum = !checksum::sum(&bytes);
        write_u16(&mut bytes, 2, sum);
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert!(packet.verify_checksum());
        assert_eq!(IcmpRepr::parse(&packet), Err(WireError::Malformed));
        let mut bytes = [0u8; 8];
        bytes[0] = 3; // destination unreachable
        let sum = !checksum::sum(&bytes);
        write_u16(&mut bytes, 2, sum);
        assert_eq!(
            IcmpRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Err(WireError::Unsupported)
        );
    }

    proptest! {
        // Proves emit followed by parse is the identity for any echo message.
        #[test]
        fn round_trip(reply in any::<bool>(), ident in any::<u16>(), seq_no in any::<u16>(),
                      data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let repr = if reply {
                IcmpRepr::EchoReply { ident, seq_no, data: &data }
            } else {
                IcmpRepr::EchoRequest { ident, seq_no, data: &data }
            };
            let mut buffer = vec![0u8; repr.buffer_len()];
            repr.emit(&mut buffer);
            prop_assert_eq!(IcmpRepr::parse(&Packet::new_checked(&buffer[..]).unwrap()).unwrap(), repr);
        }
    }
}
