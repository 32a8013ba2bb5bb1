//! The Internet checksum (RFC 1071) and the TCP/IPv4 pseudo-header (RFC 9293 §3.1).

use std::net::Ipv4Addr;

/// One's-complement sum of `data` as big-endian 16-bit words (odd byte padded with zero),
/// folded to 16 bits but not complemented. Sums of several slices combine with [`combine`]
/// as long as every slice but the last has even length.
pub fn sum(data: &[u8]) -> u16 {
    let mut acc: u32 = 0;
    let mut chunks = data.chunks_exact(2);
    for pair in &mut chunks {
        acc += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    fold(acc)
}

/// One's-complement addition of partial sums.
pub fn combine(sums: &[u16]) -> u16 {
    fold(sums.iter().map(|&s| u32::from(s)).sum())
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// Partial sum of the IPv4 pseudo-header: source, destination, zero, protocol, length.
pub fn pseudo_header(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, length: u16) -> u16 {
    let mut header = [0u8; 12];
    header[0..4].copy_from_slice(&src.octets());
    header[4..8].copy_from_slice(&dst.octets());
    header[9] = protocol;
    header[10..12].copy_from_slice(&length.to_be_bytes());
    sum(&header)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the sum matches the worked example of RFC 1071 §3.
    #[test]
    fn rfc1071_example() {
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(sum(&data), 0xddf2);
    }

    // Proves an odd trailing byte is padded on the right, not the left.
    #[test]
    fn odd_length_pads_low_byte() {
        assert_eq!(sum(&[0x12, 0x34, 0x56]), 0x1234 + 0x5600);
    }
}
