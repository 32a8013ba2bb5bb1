//! Wire formats: zero-copy packet views and validated representations.
//!
//! Each protocol has a `Packet<T: AsRef<[u8]>>` (or `Frame`) view over caller-owned bytes
//! and a `Repr` holding the parsed, validated fields. `new_checked` checks lengths so that
//! every accessor of a checked view is in bounds; `Repr::parse` checks semantics (version,
//! checksum, supported options). `Repr::emit` writes into a view that is at least
//! `Repr::buffer_len()` bytes long. No function here panics on any received input; emit
//! functions assert their documented buffer-size precondition (a caller bug).

pub mod arp;
pub mod checksum;
pub mod ethernet;
pub mod icmp;
pub mod ipv4;
pub mod tcp;

use core::fmt;

/// Why a received packet was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// The buffer is shorter than the header or the length fields claim.
    Truncated,
    /// A field holds a value that is invalid for this protocol.
    Malformed,
    /// The checksum does not verify.
    Checksum,
    /// Valid but a feature this stack deliberately does not handle (e.g. an ARP for
    /// another hardware type, ICMP types other than echo).
    Unsupported,
    /// An IPv4 fragment: dropped, this stack does not reassemble.
    Fragment,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            WireError::Truncated => "truncated packet",
            WireError::Malformed => "malformed packet",
            WireError::Checksum => "checksum mismatch",
            WireError::Unsupported => "unsupported packet",
            WireError::Fragment => "IPv4 fragment",
        };
        f.write_str(text)
    }
}

impl std::error::Error for WireError {}

/// Result of parsing received bytes.
pub type WireResult<T> = Result<T, WireError>;

/// A 48-bit IEEE 802 MAC address.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The broadcast address ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

    /// True for addresses with the group bit set (broadcast and multicast).
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 != 0
    }

    /// True for an address a host may use as its own source address.
    pub fn is_unicast(&self) -> bool {
        !self.is_multicast() && self.0 != [0; 6]
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

pub(crate) fn read_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([bytes[at], bytes[at + 1]])
}

pub(crate) fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

pub(crate) fn write_u16(bytes: &mut [u8], at: usize, value: u16) {
    bytes[at..at + 2].copy_from_slice(&value.to_be_bytes());
}

pub(crate) fn write_u32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_be_bytes());
}
