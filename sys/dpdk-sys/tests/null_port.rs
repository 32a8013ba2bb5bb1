//! Wrapper test on DPDK's net_null PMD (no root, no kernel networking): EAL init once, pool
//! accounting through alloc/drop/tx/rx, mbuf data operations, and port RX/TX bursts.
//!
//! Runs without the libtest harness because the EAL initializes once per process.
//! Run: `cargo test -p dpdk-sys --test null_port`

use dpdk_sys::{Eal, Mempool, Port, PortConfig, BURST_MAX_PACKETS};
use std::time::Instant;

const POOL_BUFFERS: u32 = 511;
/// No per-lcore cache, so `available()` moves by exactly one per buffer.
const POOL_CACHE_BUFFERS: u32 = 0;
const DATA_ROOM_BYTES: u16 = 2048 + 128;
/// Frame size net_null generates on receive (its `size` devarg).
const NULL_RX_FRAME_BYTES: usize = 96;

fn main() {
    let started = Instant::now();
    let eal = Eal::init(&[
        "null-port",
        "-l",
        "0",
        "--no-huge",
        "--no-pci",
        "--no-shconf",
        "-m",
        "128",
        "--log-level=notice",
        &format!("--vdev=net_null0,size={NULL_RX_FRAME_BYTES}"),
    ])
    .unwrap_or_else(|e| panic!("EAL init: {e}"));
    // A second init in the same process is refused by the wrapper, not passed to DPDK.
    assert_eq!(
        Eal::init(&["again"]).err().map(|e| e.errno),
        Some(libc::EALREADY)
    );
    // The vdev registered: the static link kept net_null's constructor.
    assert_eq!(eal.port_count(), 1);
    let port_id = eal
        .port_by_name("net_null0")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        eal.port_by_name("net_null9").is_err(),
        "unknown port name must fail"
    );

    let pool = Mempool::create(
        &eal,
        "null_port",
        POOL_BUFFERS,
        POOL_CACHE_BUFFERS,
        DATA_ROOM_BYTES,
    )
    .unwrap_or_else(|e| panic!("pool: {e}"));
    mbuf_operations(&pool);
    pool_exhaustion(&pool);
    port_bursts(port_id, &pool);
    drop(pool);
    drop(eal);
    println!("null_port test passed in {:.2?}", started.elapsed());
}

/// Append, write, trim, adj and reset keep length and contents consistent; drop frees.
fn mbuf_operations(pool: &Mempool<'_>) {
    let before = pool.available();
    let mut m = pool.alloc().expect("alloc");
    assert_eq!(pool.available(), before - 1);
    assert!(m.is_empty() && m.segments() == 1);
    let room = m.tailroom();
    let body = m.append(10).expect("append");
    assert_eq!(body, &[0u8; 10]);
    body.copy_from_slice(b"0123456789");
    assert_eq!(m.data(), b"0123456789");
    assert_eq!((m.len(), m.packet_len(), m.tailroom()), (10, 10, room - 10));
    assert!(m.trim(2));
    assert!(m.adj(3));
    assert_eq!(m.data(), b"34567");
    m.data_mut()[0] = b'x';
    assert_eq!(m.data(), b"x4567");
    assert!(!m.trim(6), "trimming more than the packet must fail");
    assert!(!m.adj(6), "removing more than the packet must fail");
    let too_big = u16::try_from(m.tailroom() + 1).expect("tailroom fits u16");
    assert!(
        m.append(too_big).is_none(),
        "append beyond tailroom must fail"
    );
    assert_eq!(m.len(), 5);
    m.reset();
    assert!(m.is_empty());
    assert_eq!(m.tailroom(), room);
    drop(m);
    assert_eq!(pool.available(), before);
}

/// Every buffer can be taken, the next alloc reports exhaustion, dropping returns them all.
fn pool_exhaustion(pool: &Mempool<'_>) {
    let held: Vec<_> = std::iter::from_fn(|| pool.alloc()).collect();
    assert_eq!(held.len(), POOL_BUFFERS as usize);
    assert_eq!(pool.available(), 0);
    drop(held);
    assert_eq!(pool.available(), POOL_BUFFERS);
}

/// TX hands mbufs to the driver (net_null frees them); RX yields frames of the configured size.
fn port_bursts(port_id: u16, pool: &Mempool<'_>) {
    let config = PortConfig {
        rx_ring_descriptors: 64,
        tx_ring_descriptors: 64,
        ..PortConfig::default()
    };
    let mut port =
        Port::configure(port_id, &config, pool).unwrap_or_else(|e| panic!("configure: {e}"));
    port.start().unwrap_or_else(|e| panic!("start: {e}"));
    let baseline = pool.available();

    let frames = BURST_MAX_PACKETS + 6;
    let mut tx: Vec<_> = (0..frames)
        .map(|i| {
            let mut m = pool.alloc().expect("tx alloc");
            m.append(60).expect("append")[0] = i as u8;
            m
        })
        .collect();
    assert_eq!(pool.available(), baseline - frames as u32);
    let sent = port.tx_burst(0, &mut tx);
    assert_eq!(
        sent, BURST_MAX_PACKETS,
        "one burst sends at most BURST_MAX_PACKETS"
    );
    assert_eq!(tx.len(), 6, "unsent mbufs stay with the caller");
    assert_eq!(
        tx[0].data()[0],
        BURST_MAX_PACKETS as u8,
        "the unsent ones are the tail"
    );
    assert_eq!(port.tx_burst(0, &mut tx), 6);
    assert!(tx.is_empty());
    assert_eq!(
        pool.available(),
        baseline,
        "net_null freed every transmitted mbuf"
    );

    let mut rx = Vec::new();
    let received = port.rx_burst(0, &mut rx);
    assert!(
        received > 0 && received <= BURST_MAX_PACKETS,
        "received {received}"
    );
    assert_eq!(rx.len(), received);
    assert!(rx.iter().all(|m| m.len() == NULL_RX_FRAME_BYTES));
    assert_eq!(pool.available(), baseline - received as u32);
    drop(rx);
    assert_eq!(pool.available(), baseline);
    drop(port);
}
