//! One client connection as a worker sees it: its socket, received bytes,
//! replies in order, and per-client state (db, protocol, auth, name).

use crate::resp::{Proto, ReplyBuf};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// Where a connection's bytes go: a kernel socket served through io_uring, or a
/// connection of the worker's userspace TCP stack (`--network=dpdk`, see `dpdk.rs`).
pub enum Transport {
    Kernel(OwnedFd),
    #[cfg(feature = "dpdk")]
    Stack(tcp_stack::SocketHandle),
}

impl Transport {
    /// The kernel socket, or `None` for a userspace-stack connection.
    pub fn kernel_fd(&self) -> Option<RawFd> {
        match self {
            Transport::Kernel(fd) => Some(fd.as_raw_fd()),
            #[cfg(feature = "dpdk")]
            Transport::Stack(_) => None,
        }
    }
}

/// Replies stay in request order even when some commands ran on another
/// worker: a remote command reserves a slot, later replies queue behind it.
pub enum Slot {
    Waiting(u64),
    Ready(Vec<u8>),
}

pub struct Conn {
    pub fd: Transport,
    pub gen: u32,
    pub id: u64,
    pub addr: String,
    pub laddr: String,
    pub created_ms: u64,
    pub last_cmd_ms: u64,
    pub last_cmd: String,
    pub name: Option<Vec<u8>>,
    pub lib_name: Option<Vec<u8>>,
    pub lib_ver: Option<Vec<u8>>,
    pub db: u8,
    pub proto: Proto,
    pub authenticated: bool,
    /// The ACL user this connection runs as, and the cached copy of its rules
    /// (read at ACL generation `acl_gen`; `None` until the first command).
    pub user_name: String,
    pub user: Option<std::sync::Arc<crate::acl::User>>,
    pub acl_gen: u64,
    /// Bytes received and not yet parsed start at `in_pos`.
    pub inbuf: Vec<u8>,
    pub in_pos: usize,
    /// Replies ready to send (the in-order prefix).
    pub out: Vec<u8>,
    /// The buffer owned by the in-flight send SQE; untouched until it completes.
    pub sending: Vec<u8>,
    pub send_off: usize,
    pub send_inflight: bool,
    pub recv_armed: bool,
    pub pending: VecDeque<Slot>,
    pub next_seq: u64,
    /// The reply slot of a blocking command not answered yet: parsing stops here.
    pub blocked_seq: Option<u64>,
    /// Operations submitted to the ring and not yet completed.
    pub ops_inflight: u32,
    /// Close once the replies queued so far are sent.
    pub close_after_reply: bool,
    /// Closing: no more commands; freed when no operation is in flight.
    pub closing: bool,
    pub in_ready: bool,
    pub monitor: bool,
    /// Commands of this connection parked for device reads (`server::reads`), and how
    /// many of them write: a later command that writes, or any later keyed command while
    /// a write is parked, waits for them (the connection's order is kept; reads may run
    /// ahead of earlier parked reads, which no client can tell apart).
    pub parked: u32,
    /// Bytes of the `Slot::Ready` replies in `pending`.
    pub pending_ready_bytes: usize,
    /// Since when the unsent output has been at or over its class's soft limit.
    pub obuf_soft_since_ms: Option<u64>,
    pub parked_writes: u32,
    pub commands: u64,
    /// Replies waiting for a group-commit epoch to be durable (`appendfsync
    /// always`), oldest first, each with its epoch; they precede `out`'s bytes
    /// added later.
    pub held: VecDeque<(u64, Vec<u8>)>,
    /// Leading bytes of `out` already cleared to leave (released from `held`
    /// or produced while nothing was held); the rest is this round's.
    pub out_cleared: usize,
    /// MULTI queue and WATCHed keys (`txn.rs`).
    pub txn: super::worker::txn::TxnState,
    /// Pub/Sub subscriptions (`pubsub.rs`).
    pub subs: super::worker::pubsub::Subs,
    /// CLIENT TRACKING mode (`tracking.rs`).
    pub tracking: super::tracking::ConnTracking,
    /// The TLS session of a connection accepted on `--tls-port` (`None`: plaintext).
    /// Received bytes pass through it into `inbuf`; `out` is sealed by it into `sending`.
    pub tls: Option<Box<super::tls::TlsSession>>,
}

impl Conn {
    pub fn new(
        fd: Transport,
        gen: u32,
        id: u64,
        addr: String,
        laddr: String,
        now_ms: u64,
        authenticated: bool,
    ) -> Conn {
        Conn {
            fd,
            gen,
            id,
            addr,
            laddr,
            created_ms: now_ms,
            last_cmd_ms: now_ms,
            last_cmd: "NULL".into(),
            name: None,
            lib_name: None,
            lib_ver: None,
            db: 0,
            proto: Proto::Resp2,
            authenticated,
            user_name: "default".into(),
            user: None,
            acl_gen: 0,
            inbuf: Vec::new(),
            in_pos: 0,
            out: Vec::new(),
            sending: Vec::new(),
            send_off: 0,
            send_inflight: false,
            recv_armed: false,
            pending: VecDeque::new(),
            next_seq: 0,
            blocked_seq: None,
            ops_inflight: 0,
            close_after_reply: false,
            closing: false,
            in_ready: false,
            monitor: false,
            parked: 0,
            pending_ready_bytes: 0,
            obuf_soft_since_ms: None,
            parked_writes: 0,
            commands: 0,
            tracking: Default::default(),
            held: VecDeque::new(),
            out_cleared: 0,
            txn: Default::default(),
            subs: Default::default(),
            tls: None,
        }
    }

    /// Runs `f` with a reply sink placed correctly in the reply order.
    pub fn reply<R>(&mut self, f: impl FnOnce(&mut ReplyBuf) -> R) -> R {
        let proto = self.proto;
        if self.pending.is_empty() {
            f(&mut ReplyBuf::new(&mut self.out, proto))
        } else {
            let mut v = Vec::new();
            let r = f(&mut ReplyBuf::new(&mut v, proto));
            self.push_ready(v);
            r
        }
    }

    /// Reserves a slot for a reply that another worker will produce.
    pub fn reserve(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.pending.push_back(Slot::Waiting(seq));
        seq
    }

    /// Fills a reserved slot and moves the ready prefix to `out`.
    pub fn fill(&mut self, seq: u64, bytes: Vec<u8>) {
        for slot in self.pending.iter_mut() {
            if matches!(slot, Slot::Waiting(s) if *s == seq) {
                self.pending_ready_bytes += bytes.len();
                *slot = Slot::Ready(bytes);
                break;
            }
        }
        self.release_ready();
    }

    /// Fills a reserved slot with what `write` encodes (in `proto`, the protocol of
    /// the request). When it is the first reply the connection waits for, the bytes
    /// go straight into `out` with no buffer of their own.
    pub fn fill_with(&mut self, seq: u64, proto: Proto, write: impl FnOnce(&mut ReplyBuf)) {
        if matches!(self.pending.front(), Some(Slot::Waiting(s)) if *s == seq) {
            self.pending.pop_front();
            write(&mut ReplyBuf::new(&mut self.out, proto));
            self.release_ready();
        } else {
            let mut bytes = Vec::new();
            write(&mut ReplyBuf::new(&mut bytes, proto));
            self.fill(seq, bytes);
        }
    }

    /// The output buffer, taken so that the reply to `seq` can be written straight into
    /// it: `Some` when `seq` is the first reply the connection waits for (no buffer of the
    /// reply's own, no copy). Give it back with `put_out`.
    pub fn take_out_for(&mut self, seq: u64) -> Option<Vec<u8>> {
        if matches!(self.pending.front(), Some(Slot::Waiting(s)) if *s == seq) {
            Some(std::mem::take(&mut self.out))
        } else {
            None
        }
    }

    /// Ends `take_out_for`: `out`, with the reply appended, is the output again and the
    /// reply's slot is filled. Bytes queued to `out` meanwhile follow the reply.
    pub fn put_out(&mut self, out: Vec<u8>) {
        self.pending.pop_front();
        let meanwhile = std::mem::replace(&mut self.out, out);
        if !meanwhile.is_empty() {
            self.out.extend_from_slice(&meanwhile);
        }
        self.release_ready();
    }

    /// Moves the replies ready at the front of `pending` to `out`.
    fn release_ready(&mut self) {
        while let Some(Slot::Ready(_)) = self.pending.front() {
            if let Some(Slot::Ready(b)) = self.pending.pop_front() {
                self.pending_ready_bytes -= b.len();
                if self.out.is_empty() {
                    self.out = b;
                } else {
                    self.out.extend_from_slice(&b);
                }
            }
        }
    }

    /// Queues a ready reply behind earlier unfilled slots.
    pub fn push_ready(&mut self, bytes: Vec<u8>) {
        self.pending_ready_bytes += bytes.len();
        self.pending.push_back(Slot::Ready(bytes));
    }

    /// Reply bytes produced and not yet handed to the socket, except those held for
    /// durability: what back-pressure and the output limit look at.
    pub fn unsent_bytes(&self) -> usize {
        self.sending.len().saturating_sub(self.send_off) + self.out.len() + self.pending_ready_bytes
    }

    /// Reply bytes not yet sent: being sent, ready, waiting in order, held for durability.
    pub fn output_bytes(&self) -> usize {
        let held: usize = self.held.iter().map(|(_, b)| b.len()).sum();
        self.unsent_bytes() + held
    }

    /// Memory held by this connection's buffers (capacities), for `mem_clients_normal`.
    pub fn buffer_bytes(&self) -> usize {
        self.inbuf.capacity() + self.out.capacity() + self.sending.capacity() + self.output_bytes()
            - self.out.len()
            - self.sending.len().saturating_sub(self.send_off)
    }

    pub fn unparsed(&self) -> usize {
        self.inbuf.len().saturating_sub(self.in_pos)
    }

    /// Drops parsed bytes from the front of the input buffer.
    pub fn compact_input(&mut self) {
        if self.in_pos == self.inbuf.len() {
            self.inbuf.clear();
            self.in_pos = 0;
            if self.inbuf.capacity() > 1 << 20 {
                self.inbuf.shrink_to(64 << 10);
            }
        } else if self.in_pos > 0 && self.in_pos >= self.inbuf.len() / 2 {
            self.inbuf.drain(..self.in_pos);
            self.in_pos = 0;
        }
    }

    /// CLIENT LIST's `flags=`: Redis's letters in Redis's order (`N`: none).
    fn flags_field(&self) -> String {
        let mut f = String::from(if self.monitor {
            "O"
        } else if self.txn.in_multi {
            "x"
        } else if self.subs.active() {
            "P"
        } else {
            ""
        });
        if self.tracking.on {
            f.push('t');
            if self.tracking.redirect != 0 && super::tracking::broken_redirect(self.id) {
                f.push('R');
            }
            if self.tracking.bcast {
                f.push('B');
            }
        }
        if f.is_empty() {
            f.push('N');
        }
        f
    }

    pub fn client_info_line(&self, now_ms: u64) -> String {
        let name = self
            .name
            .as_deref()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .unwrap_or_default();
        let lib_name = self
            .lib_name
            .as_deref()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .unwrap_or_default();
        let lib_ver = self
            .lib_ver
            .as_deref()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .unwrap_or_default();
        format!(
            "id={} addr={} laddr={} fd={} name={} age={} idle={} flags={} db={} sub={} psub={} ssub={} multi={} qbuf={} qbuf-free=0 argv-mem=0 multi-mem=0 rbs={} rbp=0 obl=0 oll=0 omem={} tot-mem={} events=r cmd={} user={} redir={} resp={} lib-name={} lib-ver={}",
            self.id,
            self.addr,
            self.laddr,
            self.fd.kernel_fd().unwrap_or(-1),
            name,
            now_ms.saturating_sub(self.created_ms) / 1000,
            now_ms.saturating_sub(self.last_cmd_ms) / 1000,
            self.flags_field(),
            self.db,
            self.subs.channels.len(),
            self.subs.patterns.len(),
            self.subs.shard.len(),
            self.txn.multi_field(),
            self.unparsed(),
            self.inbuf.capacity(),
            self.out.len() + self.sending.len(),
            self.inbuf.capacity() + self.out.capacity() + self.sending.capacity(),
            self.last_cmd,
            self.user_name,
            if self.tracking.on {
                self.tracking.redirect as i64
            } else {
                -1
            },
            if self.proto == Proto::Resp3 { 3 } else { 2 },
            lib_name,
            lib_ver,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> Conn {
        let fd = OwnedFd::from(std::fs::File::open("/dev/null").expect("/dev/null"));
        let addr = "127.0.0.1:1".to_string();
        Conn::new(Transport::Kernel(fd), 1, 1, addr.clone(), addr, 0, true)
    }

    // Replies filled out of order leave in request order; the first awaited one is
    // written straight into `out`, in the protocol of its request.
    #[test]
    fn fill_with_keeps_request_order() {
        let mut c = conn();
        let first = c.reserve();
        let second = c.reserve();
        c.fill_with(second, Proto::Resp2, |r| r.bulk(b"two"));
        assert!(c.out.is_empty(), "the second reply waits for the first");
        c.fill_with(first, Proto::Resp3, |r| r.null());
        assert_eq!(c.out, b"_\r\n$3\r\ntwo\r\n");
        assert!(c.pending.is_empty());
        let third = c.reserve();
        c.fill_with(third, Proto::Resp2, |r| r.ok());
        assert_eq!(c.out, b"_\r\n$3\r\ntwo\r\n+OK\r\n");
    }
}
