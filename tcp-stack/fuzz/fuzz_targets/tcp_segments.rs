//! Builds well-formed TCP segments (valid checksums) from fuzz input and aims them at a
//! live connection, so the fuzzer explores the state machine rather than the parsers.
#![no_main]

use std::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use tcp_stack::limits::MAX_FRAME_BYTES;
use tcp_stack::wire::ethernet::{EtherType, EthernetRepr};
use tcp_stack::wire::ipv4::{Ipv4Repr, PROTOCOL_TCP};
use tcp_stack::wire::tcp::TcpRepr;
use tcp_stack::{Duration, Instant, Interface, InterfaceConfig, MacAddr};

const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

fn interface(last: u8) -> Interface {
    let mut config = InterfaceConfig::new(MacAddr([2, 0, 0, 0, 0, last]), Ipv4Addr::new(10, 0, 0, last), 24);
    config.max_sockets = 8;
    config.tcp.rx_buffer_bytes = 4096;
    config.tcp.tx_buffer_bytes = 4096;
    Interface::new(config)
}

fn frame_for(repr: &TcpRepr) -> Vec<u8> {
    let mut frame = vec![0u8; 34 + repr.buffer_len()];
    let eth = EthernetRepr { src_addr: MacAddr([2, 0, 0, 0, 0, 2]), dst_addr: MacAddr([2, 0, 0, 0, 0, 1]), ethertype: EtherType::Ipv4 };
    eth.emit(&mut frame);
    let ip = Ipv4Repr { src_addr: CLIENT_IP, dst_addr: SERVER_IP, protocol: PROTOCOL_TCP, payload_len: repr.buffer_len(), ttl: 64 };
    ip.emit(&mut frame[14..]);
    repr.emit(&mut frame[34..], CLIENT_IP, SERVER_IP);
    frame
}

fuzz_target!(|data: &[u8]| {
    let mut server = interface(1);
    let mut client = interface(2);
    let mut buffer = vec![0u8; MAX_FRAME_BYTES];
    let listener = server.listen(6379, 4).unwrap();
    let mut now = Instant::from_millis(1);
    let handle = client.connect(now, SERVER_IP, 6379).unwrap();
    for _ in 0..20 {
        while let Some(len) = client.poll_transmit(now, &mut buffer) {
            server.receive(now, &buffer[..len]);
        }
        while let Some(len) = server.poll_transmit(now, &mut buffer) {
            client.receive(now, &buffer[..len]);
        }
    }
    let Some(accepted) = server.accept(listener).unwrap() else { return };
    let client_port = client.socket(handle).unwrap().tuple().local_port;
    let base_seq = client.socket(handle).unwrap().next_seq();
    let base_ack = server.socket(accepted).unwrap().next_seq();

    // Each segment takes 16 input bytes: flags, seq delta, ack delta, window, timestamp,
    // payload length, and one SACK block (left delta, length) around the server's SND.NXT.
    for chunk in data.chunks(16) {
        if chunk.len() < 16 {
            break;
        }
        let seq_delta = i32::from_le_bytes([chunk[1], chunk[2], chunk[3], chunk[4]]);
        let ack_delta = i16::from_le_bytes([chunk[5], chunk[6]]);
        let mut repr = TcpRepr::new(client_port, 6379, base_seq + 0);
        repr.seq_number = tcp_stack::wire::tcp::SeqNumber(base_seq.0.wrapping_add(seq_delta as u32));
        repr.ack_number = (chunk[0] & 0x10 != 0)
            .then(|| tcp_stack::wire::tcp::SeqNumber(base_ack.0.wrapping_add(ack_delta as i32 as u32)));
        repr.syn = chunk[0] & 1 != 0;
        repr.fin = chunk[0] & 2 != 0 && !repr.syn;
        repr.rst = chunk[0] & 4 != 0 && !repr.syn && !repr.fin;
        repr.window_len = u16::from_le_bytes([chunk[7], chunk[8]]);
        repr.timestamp = (chunk[0] & 0x20 != 0).then_some((u32::from(chunk[9]), u32::from(chunk[10])));
        let payload = vec![chunk[11]; usize::from(chunk[11] % 64)];
        repr.payload = &payload;
        if chunk[0] & 0x40 != 0 {
            let left = base_ack.0.wrapping_add(i16::from_le_bytes([chunk[12], chunk[13]]) as i32 as u32);
            let len = u32::from(u16::from_le_bytes([chunk[14], chunk[15]]));
            repr.sack_ranges[0] = Some((left, left.wrapping_add(len)));
        }
        server.receive(now, &frame_for(&repr));
        while server.poll_transmit(now, &mut buffer).is_some() {}
        let _ = server.recv(accepted, |bytes| bytes.len());
        let _ = server.send_slice(accepted, b"reply");
        now += Duration::from_millis(u64::from(chunk[9]) * 10);
    }
    now += Duration::from_secs(3600);
    while server.poll_transmit(now, &mut buffer).is_some() {}
});
