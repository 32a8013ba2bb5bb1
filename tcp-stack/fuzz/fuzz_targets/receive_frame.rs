//! Feeds arbitrary bytes, split into frames, to an interface that has a listener and an
//! established connection, advancing time between frames. Any panic is a bug.
#![no_main]

use std::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use tcp_stack::limits::MAX_FRAME_BYTES;
use tcp_stack::{Duration, Instant, Interface, InterfaceConfig, MacAddr};

fn interface(last: u8) -> Interface {
    let mut config = InterfaceConfig::new(MacAddr([2, 0, 0, 0, 0, last]), Ipv4Addr::new(10, 0, 0, last), 24);
    config.max_sockets = 8;
    config.tcp.rx_buffer_bytes = 4096;
    config.tcp.tx_buffer_bytes = 4096;
    Interface::new(config)
}

fn exchange(a: &mut Interface, b: &mut Interface, now: Instant, buffer: &mut [u8]) {
    for _ in 0..50 {
        let mut moved = false;
        while let Some(len) = a.poll_transmit(now, buffer) {
            b.receive(now, &buffer[..len]);
            moved = true;
        }
        while let Some(len) = b.poll_transmit(now, buffer) {
            a.receive(now, &buffer[..len]);
            moved = true;
        }
        if !moved {
            return;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut server = interface(1);
    let mut client = interface(2);
    let mut buffer = vec![0u8; MAX_FRAME_BYTES];
    let listener = server.listen(6379, 4).unwrap();
    let mut now = Instant::from_millis(1);
    let handle = client.connect(now, Ipv4Addr::new(10, 0, 0, 1), 6379).unwrap();
    exchange(&mut client, &mut server, now, &mut buffer);
    let accepted = server.accept(listener).unwrap();
    let _ = client.send_slice(handle, b"hello");
    exchange(&mut client, &mut server, now, &mut buffer);

    // Frames are length-prefixed by one byte (times 8) so inputs can hold several.
    let mut rest = data;
    while let Some((&len_byte, tail)) = rest.split_first() {
        let len = (usize::from(len_byte) * 8).min(tail.len());
        let (frame, tail) = tail.split_at(len);
        server.receive(now, frame);
        while server.poll_transmit(now, &mut buffer).is_some() {}
        if let Some(accepted) = accepted {
            let _ = server.recv(accepted, |bytes| bytes.len());
        }
        now += Duration::from_millis(u64::from(len_byte));
        rest = tail;
    }
    now += Duration::from_secs(600);
    while server.poll_transmit(now, &mut buffer).is_some() {}
});
