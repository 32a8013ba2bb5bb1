//! Reads of a device without a file descriptor (the userspace NVMe driver) go through the
//! device's own queue, polled in the worker's round: a GET waiting on that queue does not
//! hold up another connection of the same worker. The device here is `GatedDevice`
//! (`--debug-async-device-hold`): the data file read the way an NVMe namespace is, with no
//! read completing while the hold file exists — so what the test checks does not depend
//! on timing.
mod common;
use common::Server;

const VALUE_BYTES: usize = 1000;
/// Enough 1 KB values to seal at least one block in each of the 8 shards.
const FILL_KEYS: usize = 12_000;

fn value_reply() -> Vec<u8> {
    let mut want = format!("${VALUE_BYTES}\r\n").into_bytes();
    want.extend(vec![b'v'; VALUE_BYTES]);
    want.extend_from_slice(b"\r\n");
    want
}

// While a GET's read is held on the device queue, another connection on the same (only)
// worker gets its PING and a staged key's GET answered, and INFO too; the held GET has
// no reply yet. Released, it answers the right value, read from the device queue and not
// synchronously. (With the worker reading synchronously, the PING would wait for the
// hold to go, which it never does while the test waits: the test fails on the PING's
// read timeout.)
#[test]
fn held_device_read_does_not_stall_the_worker() {
    let dir = common::temp_dir("async-device");
    let hold = dir.join("hold");
    let hold_arg = hold.display().to_string();
    let s = Server::start_in(
        dir.clone(),
        &[
            "--threads",
            "1",
            "--cache-size",
            "0",
            "--debug-async-device-hold",
            &hold_arg,
        ],
    );
    common::fill_strings(&s, FILL_KEYS, VALUE_BYTES, 500);
    let mut other = s.raw();
    other.expect(&[b"SET", b"hot", b"staged"], b"+OK\r\n");
    let sync_before = s.info_u64("stats", "lavik_sync_reads");
    let queue_before = s.info_u64("stats", "lavik_device_queue_reads");
    let parked_before = s.info_u64("stats", "lavik_parked_commands");

    std::fs::write(&hold, b"").unwrap();
    let mut slow = s.raw();
    // k0 was written first: its block is sealed, on the device.
    slow.cmd(&[b"GET", b"k0"]);
    // The GET parks on its read (INFO is served by the same worker meanwhile).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while s.info_u64("stats", "lavik_parked_commands") == parked_before {
        assert!(std::time::Instant::now() < deadline, "the GET never parked");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    other.expect(&[b"PING"], b"+PONG\r\n");
    other.expect(&[b"GET", b"hot"], b"$6\r\nstaged\r\n");
    assert!(
        slow.nothing_arrived(),
        "the GET answered while its read was held"
    );
    assert_eq!(
        s.info_u64("stats", "lavik_device_queue_reads"),
        queue_before,
        "no device-queue read completes while held"
    );

    std::fs::remove_file(&hold).unwrap();
    assert_eq!(slow.read_exact(value_reply().len()), value_reply());
    assert!(s.info_u64("stats", "lavik_device_queue_reads") > queue_before);
    assert_eq!(
        s.info_u64("stats", "lavik_sync_reads"),
        sync_before,
        "the GET read synchronously"
    );
}

// A pipeline of GETs of device-resident keys and an MGET, all held at once, complete in
// order with the right values once released; none was read synchronously.
#[test]
fn held_pipeline_completes_in_order() {
    let dir = common::temp_dir("async-device-pipe");
    let hold = dir.join("hold");
    let hold_arg = hold.display().to_string();
    let s = Server::start_in(
        dir.clone(),
        &[
            "--threads",
            "2",
            "--cache-size",
            "0",
            "--debug-async-device-hold",
            &hold_arg,
        ],
    );
    common::fill_strings(&s, FILL_KEYS, VALUE_BYTES, 500);
    let sync_before = s.info_u64("stats", "lavik_sync_reads");
    std::fs::write(&hold, b"").unwrap();
    let mut c = s.raw();
    let mut req = Vec::new();
    for k in 0..8 {
        req.extend(common::resp(&["GET", &format!("k{k}")]));
    }
    req.extend(common::resp(&["MGET", "k8", "missing", "k9"]));
    c.send(&req);
    let mut other = s.raw();
    other.expect(&[b"PING"], b"+PONG\r\n");
    assert!(c.nothing_arrived(), "a held read answered");
    std::fs::remove_file(&hold).unwrap();
    for _ in 0..8 {
        assert_eq!(c.read_exact(value_reply().len()), value_reply());
    }
    let mut mget = b"*3\r\n".to_vec();
    mget.extend(value_reply());
    mget.extend_from_slice(b"$-1\r\n");
    mget.extend(value_reply());
    assert_eq!(
        String::from_utf8_lossy(&c.read_exact(mget.len())),
        String::from_utf8_lossy(&mget)
    );
    assert_eq!(s.info_u64("stats", "lavik_sync_reads"), sync_before);
}
