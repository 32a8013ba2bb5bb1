//! Sans-IO Ethernet/ARP/IPv4/ICMP/TCP stack for lavik's appliance mode (issue 5).
//!
//! What it owns: parsing and emitting frames ([`wire`]), one interface's ARP cache and
//! ICMP echo ([`iface`]), and TCP connections ([`socket`]) with their send and receive
//! rings. What it never does: read a clock (every call takes [`time::Instant`]), perform
//! I/O (the caller hands in received frames and a buffer for each frame to send), or
//! allocate per packet (rings and tables are sized when created).
//!
//! The per-core worker loop drives it:
//!
//! ```text
//! for frame in nic.rx_burst()        { iface.receive(now, frame) }
//! while let Some(h) = iface.poll_event() { accept / recv / send / close on h }
//!   recv: iface.recv(h, |bytes| parse_resp(bytes))   (zero-copy, returns consumed)
//!   send: iface.send(h, |buf| encode(buf))           (writes into the tx ring)
//! while let Some(len) = iface.poll_transmit(now, mbuf) { nic.tx(mbuf[..len]) }
//! sleep/poll until min(next rx, iface.poll_at(now))
//! ```
//!
//! Invariants every module keeps: no panic on any received byte sequence (fuzzed), all
//! limits in [`limits`], no `unsafe`. See `docs/tcp-stack.md` for what is deliberately
//! missing.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod iface;
pub mod limits;
mod schedule;
pub mod socket;
mod storage;
pub mod time;
pub mod wire;

pub use iface::{Interface, InterfaceConfig, SocketError, SocketHandle, Stats};
pub use socket::{CloseReason, State, TcpConfig};
pub use time::{Duration, Instant};
pub use wire::MacAddr;
