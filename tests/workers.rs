//! Cross-worker requests and the wake-up protocol (`docs/architecture.md`, "Waking a
//! worker"): a worker signals another's eventfd only while that one is parked, so a wake-up
//! lost to a race between the sender's look at `parked` and the receiver's last look at
//! its mailbox would leave a request (or its reply) unanswered. The servers here park for
//! an hour when idle (`--debug-idle-wait-ms`), so such a loss is a hang — the harness's
//! 60 s read timeout fails the test — instead of a 100 ms delay.

mod common;

use common::diff::Rng;
use common::{Raw, Server};
use std::collections::HashMap;

/// An idle park long enough that only a signal ends it within the test.
const IDLE_WAIT_HOUR_MS: &str = "3600000";
/// Requests per client; about half of them hop to the other worker and back.
const REQUESTS_PER_CLIENT: usize = 400;
/// Keys per client (each client has its own, so its model is exact).
const KEYS_PER_CLIENT: u64 = 64;

fn start(busy_poll_us: &str) -> Server {
    Server::start(
        "workers-wake",
        &[
            "--threads",
            "2",
            "--busy-poll-us",
            busy_poll_us,
            "--debug-idle-wait-ms",
            IDLE_WAIT_HOUR_MS,
        ],
    )
}

/// One client's run: SETs and GETs on its own keys over two connections (accepted by
/// either worker), with idle gaps of 0-3 ms after a third of the requests so both workers
/// park between them; every reply is checked against a model.
fn client_run(port: u16, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut conns = [Raw::connect(port), Raw::connect(port)];
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    for i in 0..REQUESTS_PER_CLIENT {
        let c = &mut conns[rng.below(2) as usize];
        let k = rng.below(KEYS_PER_CLIENT);
        let key = format!("wake:{seed}:{k}");
        if rng.chance(50) {
            let value = format!("v{i}-{}", rng.below(1 << 20)).into_bytes();
            c.cmd(&[b"SET", key.as_bytes(), &value]);
            assert_eq!(c.read_exact(5), b"+OK\r\n", "SET {key}");
            model.insert(k, value);
        } else {
            c.cmd(&[b"GET", key.as_bytes()]);
            let want = match model.get(&k) {
                Some(v) => {
                    let mut w = format!("${}\r\n", v.len()).into_bytes();
                    w.extend_from_slice(v);
                    w.extend_from_slice(b"\r\n");
                    w
                }
                None => b"$-1\r\n".to_vec(),
            };
            assert_eq!(
                String::from_utf8_lossy(&c.read_exact(want.len())),
                String::from_utf8_lossy(&want),
                "GET {key}"
            );
        }
        if rng.chance(33) {
            std::thread::sleep(std::time::Duration::from_micros(rng.below(3000)));
        }
    }
}

/// Runs `clients` clients at once and checks the server did hop and signal.
fn hops_all_answered(busy_poll_us: &str, clients: u64) {
    let s = start(busy_poll_us);
    let port = s.port;
    let runs: Vec<_> = (0..clients)
        .map(|seed| std::thread::spawn(move || client_run(port, seed + 1)))
        .collect();
    for r in runs {
        r.join().expect("a client's replies were all right");
    }
    // The run exercised the protocol: requests crossed workers and parked workers were
    // woken by a signal.
    assert!(
        s.info_u64("stats", "lavik_hops") > 0,
        "no cross-worker request"
    );
    assert!(
        s.info_u64("stats", "lavik_wake_signals") > 0,
        "no signal sent"
    );
}

// Proves a lone client's cross-worker requests, each after an idle gap in which both
// workers park (no busy-poll), are all answered: every hop's signal reaches a parked worker.
#[test]
fn lone_client_hops_after_idle_gaps_never_lost() {
    hops_all_answered("0", 1);
}

// Proves concurrent clients' hops are never lost when workers busy-poll before parking
// (a worker busy-polling is not signalled and must find its mailbox on its own).
#[test]
fn concurrent_hops_with_busy_poll_never_lost() {
    hops_all_answered("20", 4);
}

// Proves concurrent clients' hops are never lost when workers park at once (no busy-poll):
// senders race the receiver's look at its mailbox before it blocks.
#[test]
fn concurrent_hops_without_busy_poll_never_lost() {
    hops_all_answered("0", 4);
}
