//! INFO's copy counters in kernel mode (`runtime::copies`): every received byte is copied
//! once by lavik (provided buffer → `Conn::inbuf`), replies are sent from the connection's
//! own buffer (no copy of lavik's), and the DPDK fields stay 0. One connection does the
//! SETs, GETs and both INFOs, so the deltas are exact: the requests between the INFOs plus
//! the second INFO's request were received, the first INFO's reply plus the replies
//! between were sent (the client read them all before sending the second INFO).
mod common;
use common::{resp, Raw, Server};

const KEYS: usize = 50;
const VALUE_BYTES: usize = 1024;

/// `INFO stats` on `c`: the counters, and the reply's length on the wire.
fn info(c: &mut Raw) -> (Vec<(String, u64)>, usize) {
    let text = c.bulk(&[b"INFO", b"stats"]);
    let wire = format!("${}\r\n", text.len()).len() + text.len() + 2;
    let fields = text
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let k = k.strip_prefix("lavik_")?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect();
    (fields, wire)
}

fn field(fields: &[(String, u64)], name: &str) -> u64 {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no lavik_{name} in INFO stats"))
        .1
}

#[test]
fn kernel_mode_copies_each_received_byte_once_and_sends_in_place() {
    let s = Server::start("copy_counters", &[]);
    let mut c = s.raw();
    let (before, first_reply) = info(&mut c);
    let value = vec![b'v'; VALUE_BYTES];
    let (mut requests, mut replies) = (0usize, 0usize);
    for i in 0..KEYS {
        let key = format!("key:{i}");
        requests += resp(&["SET", &key, std::str::from_utf8(&value).unwrap()]).len();
        c.expect(&[b"SET", key.as_bytes(), &value], b"+OK\r\n");
        replies += 5;
    }
    let set_requests = requests;
    for i in 0..KEYS {
        let key = format!("key:{i}");
        requests += resp(&["GET", &key]).len();
        let mut reply = format!("${VALUE_BYTES}\r\n").into_bytes();
        reply.extend_from_slice(&value);
        reply.extend_from_slice(b"\r\n");
        c.expect(&[b"GET", key.as_bytes()], &reply);
        replies += reply.len();
    }
    let get_requests = requests - set_requests;
    requests += resp(&["INFO", "stats"]).len();
    let (after, _) = info(&mut c);
    let delta = |name: &str| field(&after, name) - field(&before, name);

    assert_eq!(delta("kernel_rx_bytes"), requests as u64);
    assert_eq!(delta("kernel_rx_copied_bytes"), requests as u64);
    assert_eq!(delta("kernel_tx_bytes"), (first_reply + replies) as u64);
    assert_eq!(delta("kernel_tx_copied_bytes"), 0);
    for name in [
        "dpdk_rx_bytes",
        "dpdk_rx_copied_bytes",
        "dpdk_tx_bytes",
        "dpdk_tx_copied_bytes",
        "dpdk_rx_direct_bytes",
        "dpdk_idle_waits",
    ] {
        assert_eq!(field(&after, name), 0, "{name}");
    }
    println!(
        "kernel mode, bytes copied by lavik: per SET {:.1} (request {} B), per GET {:.1} \
         (request {} B, reply {} B sent in place)",
        set_requests as f64 / KEYS as f64,
        set_requests / KEYS,
        get_requests as f64 / KEYS as f64,
        get_requests / KEYS,
        (replies - 5 * KEYS) / KEYS,
    );
}
