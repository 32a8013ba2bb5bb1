//! Hostile input: arbitrary bytes, mutated valid frames, and well-formed but arbitrary
//! TCP segments aimed at live connections must never panic the interface.
//! (The same inputs drive the cargo-fuzz targets under `fuzz/`.)

use std::net::Ipv4Addr;

use proptest::prelude::*;
use tcp_stack::limits::MAX_FRAME_BYTES;
use tcp_stack::wire::checksum;
use tcp_stack::wire::ethernet::{EtherType, EthernetRepr};
use tcp_stack::wire::ipv4::{Ipv4Repr, PROTOCOL_TCP};
use tcp_stack::wire::tcp::{SeqNumber, TcpRepr};
use tcp_stack::{Duration, Instant, Interface, InterfaceConfig, MacAddr, SocketHandle, State};

const SERVER_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const CLIENT_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const PORT: u16 = 6379;

fn interface(mac: MacAddr, ip: Ipv4Addr) -> Interface {
    let mut config = InterfaceConfig::new(mac, ip, 24);
    config.max_sockets = 8;
    config.tcp.rx_buffer_bytes = 4096;
    config.tcp.tx_buffer_bytes = 4096;
    Interface::new(config)
}

fn exchange(a: &mut Interface, b: &mut Interface, now: Instant) {
    let mut buffer = vec![0u8; MAX_FRAME_BYTES];
    for _ in 0..50 {
        let mut moved = false;
        while let Some(len) = a.poll_transmit(now, &mut buffer) {
            b.receive(now, &buffer[..len]);
            moved = true;
        }
        while let Some(len) = b.poll_transmit(now, &mut buffer) {
            a.receive(now, &buffer[..len]);
            moved = true;
        }
        if !moved {
            return;
        }
    }
}

/// A server with a listener and one established, accepted connection.
fn live_server() -> (Interface, Interface, SocketHandle, SocketHandle) {
    let mut server = interface(SERVER_MAC, SERVER_IP);
    let mut client = interface(CLIENT_MAC, CLIENT_IP);
    let listener = server.listen(PORT, 4).unwrap();
    let now = Instant::from_millis(1);
    let handle = client.connect(now, SERVER_IP, PORT).unwrap();
    exchange(&mut client, &mut server, now);
    let accepted = server
        .accept(listener)
        .unwrap()
        .expect("handshake completed");
    assert_eq!(client.state(handle).unwrap(), State::Established);
    client.send_slice(handle, b"hello").unwrap();
    server.send_slice(accepted, b"world").unwrap();
    exchange(&mut client, &mut server, now);
    (server, client, accepted, handle)
}

fn tcp_frame(repr: &TcpRepr) -> Vec<u8> {
    let mut frame = vec![0u8; 34 + repr.buffer_len()];
    EthernetRepr {
        src_addr: CLIENT_MAC,
        dst_addr: SERVER_MAC,
        ethertype: EtherType::Ipv4,
    }
    .emit(&mut frame);
    let ip = Ipv4Repr {
        src_addr: CLIENT_IP,
        dst_addr: SERVER_IP,
        protocol: PROTOCOL_TCP,
        payload_len: repr.buffer_len(),
        ttl: 64,
    };
    ip.emit(&mut frame[14..]);
    repr.emit(&mut frame[34..], CLIENT_IP, SERVER_IP);
    frame
}

fn drain(iface: &mut Interface, now: Instant) {
    let mut buffer = vec![0u8; MAX_FRAME_BYTES];
    let mut count = 0;
    while iface.poll_transmit(now, &mut buffer).is_some() {
        count += 1;
        assert!(count < 10_000, "poll_transmit never runs dry");
    }
}

/// Recomputes IPv4 and TCP checksums of a mutated frame so the mutation reaches TCP.
fn fix_checksums(frame: &mut [u8]) {
    if frame.len() < 34 || frame[12..14] != [0x08, 0x00] {
        return;
    }
    let header_len = usize::from(frame[14] & 0x0f) * 4;
    if header_len < 20 || frame.len() < 14 + header_len {
        return;
    }
    frame[24] = 0;
    frame[25] = 0;
    let sum = !checksum::sum(&frame[14..14 + header_len]);
    frame[24..26].copy_from_slice(&sum.to_be_bytes());
    let total = usize::from(u16::from_be_bytes([frame[16], frame[17]]));
    let start = 14 + header_len;
    if frame[23] != PROTOCOL_TCP || total < header_len + 20 || frame.len() < 14 + total {
        return;
    }
    let segment = &mut frame[start..14 + total];
    segment[16] = 0;
    segment[17] = 0;
    let src = Ipv4Addr::new(frame[26], frame[27], frame[28], frame[29]);
    let dst = Ipv4Addr::new(frame[30], frame[31], frame[32], frame[33]);
    let segment = &mut frame[start..14 + total];
    let pseudo = checksum::pseudo_header(src, dst, PROTOCOL_TCP, segment.len() as u16);
    let sum = !checksum::combine(&[pseudo, checksum::sum(segment)]);
    segment[16..18].copy_from_slice(&sum.to_be_bytes());
}

fn client_next_seq(client: &Interface, handle: SocketHandle) -> SeqNumber {
    client.socket(handle).unwrap().next_seq()
}

/// Destination port, sequence offset, acknowledgment offset, flags, window, payload,
/// whether to send window scale, its shift, and SACK blocks as (left, length) offsets
/// from the server's next sequence number.
type SegmentSpec = (
    u16,
    i64,
    Option<i64>,
    u8,
    u16,
    Vec<u8>,
    bool,
    Option<u8>,
    Vec<(i32, u16)>,
);

fn segment_strategy() -> impl Strategy<Value = SegmentSpec> {
    (
        prop_oneof![Just(PORT), any::<u16>().prop_filter("nonzero", |p| *p != 0)],
        prop_oneof![-70_000i64..70_000, -8i64..8],
        proptest::option::of(prop_oneof![-70_000i64..70_000, -8i64..8]),
        0u8..16,
        any::<u16>(),
        proptest::collection::vec(any::<u8>(), 0..64),
        any::<bool>(),
        proptest::option::of(0u8..20),
        proptest::collection::vec((-5000i32..5000, any::<u16>()), 0..4),
    )
}

proptest! {
    // Proves arbitrary bytes are rejected without panicking.
    #[test]
    fn arbitrary_bytes_never_panic(frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 1..8)) {
        let (mut server, _client, _, _) = live_server();
        let now = Instant::from_millis(2);
        let before = server.stats().rx_frames;
        for frame in &frames {
            server.receive(now, frame);
            drain(&mut server, now);
        }
        prop_assert_eq!(server.stats().rx_frames, before + frames.len() as u64);
    }

    // Proves valid frames with random byte overwrites (checksums repaired, so they reach
    // the TCP state machine) never panic and never corrupt the connection table.
    #[test]
    fn mutated_frames_never_panic(edits in proptest::collection::vec((0usize..80, any::<u8>()), 1..6), fix in any::<bool>()) {
        let (mut server, _client, _, _) = live_server();
        let mut syn = TcpRepr::new(40000, PORT, SeqNumber(1));
        syn.syn = true;
        syn.max_seg_size = Some(1460);
        syn.timestamp = Some((1, 0));
        let mut frame = tcp_frame(&syn);
        for (at, value) in edits {
            if let Some(byte) = frame.get_mut(at) {
                *byte = value;
            }
        }
        if fix {
            fix_checksums(&mut frame);
        }
        let now = Instant::from_millis(2);
        server.receive(now, &frame);
        drain(&mut server, now);
        prop_assert!(server.sockets_in_use() <= 8);
    }

    // Proves well-formed segments with arbitrary flags, sequence and acknowledgment
    // numbers near the live connection's, window and options, delivered over simulated
    // time, never panic the stack, and the application API keeps working.
    #[test]
    fn arbitrary_segments_on_live_connection(segments in proptest::collection::vec(segment_strategy(), 1..24)) {
        let (mut server, client, accepted, client_handle) = live_server();
        let client_port = client.socket(client_handle).unwrap().tuple().local_port;
        let mut now = Instant::from_millis(2);
        // Offsets are taken around the client's real next sequence number so many
        // segments land in or near the window.
        let base_seq = client_next_seq(&client, client_handle);
        let base_ack = server.socket(accepted).unwrap().next_seq();
        for (dst_port, seq_offset, ack_offset, flags, window, payload, scaled, ws, sacks) in segments {
            let mut repr = TcpRepr::new(client_port, dst_port, base_seq + seq_offset.rem_euclid(1 << 32) as usize);
            repr.ack_number = ack_offset.map(|offset| base_ack + offset.rem_euclid(1 << 32) as usize);
            repr.syn = flags & 1 != 0;
            repr.fin = flags & 2 != 0 && !repr.syn;
            repr.rst = flags & 4 != 0 && !repr.syn && !repr.fin;
            repr.psh = flags & 8 != 0;
            repr.window_len = window;
            repr.window_scale = ws.filter(|_| scaled).map(|shift| shift.min(14));
            repr.payload = &payload;
            for (slot, (left, len)) in repr.sack_ranges.iter_mut().zip(sacks) {
                let left = SeqNumber(base_ack.0.wrapping_add(left as u32));
                *slot = Some((left.0, (left + usize::from(len)).0));
            }
            if repr.header_len() > 60 {
                repr.timestamp = None;
                repr.window_scale = None;
            }
            server.receive(now, &tcp_frame(&repr));
            drain(&mut server, now);
            let _ = server.recv(accepted, |data| data.len());
            let _ = server.send_slice(accepted, b"x");
            now += Duration::from_millis(150);
        }
        // Run the timers to completion: every connection must end or stay usable.
        for _ in 0..40 {
            now += Duration::from_secs(30);
            drain(&mut server, now);
        }
        prop_assert!(server.sockets_in_use() <= 8);
    }
}

// Proves segments aimed exactly at the live connection's sequence space (the case random
// offsets rarely hit) are handled: data is accepted and a RST at rcv_nxt resets it.
#[test]
fn exact_sequence_segments_are_handled() {
    let (mut server, mut client, accepted, handle) = live_server();
    let now = Instant::from_millis(3);
    let mut buffer = [0u8; 16];
    assert_eq!(server.recv_slice(accepted, &mut buffer).unwrap(), 5);
    assert_eq!(&buffer[..5], b"hello");
    assert_eq!(client.recv_slice(handle, &mut buffer).unwrap(), 5);
    assert_eq!(&buffer[..5], b"world");
    client.abort(handle).unwrap();
    exchange(&mut client, &mut server, now);
    assert_eq!(server.state(accepted).unwrap(), State::Closed);
}
