//! Counters of the bytes lavik itself copies between network buffers and connection
//! buffers, per transport, so "bytes copied per GET / per SET" can be read from INFO
//! (`# Stats`, the `lavik_kernel_*` and `lavik_dpdk_*` fields).
//!
//! What is counted, per direction, is payload bytes moved by a `memcpy` in lavik's own
//! code (including the userspace TCP stack), not by the kernel:
//!
//! - kernel sockets, receive: the kernel copies the socket's data into a provided buffer
//!   (not counted: kernel CPU), lavik copies that buffer into `Conn::inbuf` (counted once
//!   per byte);
//! - kernel sockets, send: the kernel copies `Conn::sending` into its socket buffers (not
//!   counted); lavik hands the buffer itself to the send (nothing counted);
//! - DPDK, receive: a segment that arrives in order on a connection with nothing buffered
//!   in the stack is copied once, straight from the mbuf into `Conn::inbuf`
//!   (`lavik_dpdk_rx_direct_bytes`); any other segment is copied into the stack's receive
//!   ring and from there into `Conn::inbuf` (twice);
//! - DPDK, send: `Conn::sending` into the socket's send ring (kept for retransmission),
//!   then from the ring into the transmit mbuf (twice; a retransmission copies again).
//!
//! Building the reply itself (a value from the cache or a device read's buffer into
//! `Conn::out`) is the same in both modes and is not counted here.
//!
//! The counters are relaxed atomics in `Stats`: each worker adds to them once per event.
use std::sync::atomic::{AtomicU64, Ordering};

/// One transport's counters.
#[derive(Default)]
pub struct TransportCopies {
    /// Payload bytes received from clients.
    pub rx_bytes: AtomicU64,
    /// Bytes lavik copied on the receive path (each copy of a byte counts).
    pub rx_copied_bytes: AtomicU64,
    /// Payload bytes handed to the transport for clients.
    pub tx_bytes: AtomicU64,
    /// Bytes lavik copied on the send path (each copy of a byte counts).
    pub tx_copied_bytes: AtomicU64,
}

impl TransportCopies {
    /// `bytes` received, each copied `copies` times by lavik.
    pub fn received(&self, bytes: u64, copies: u64) {
        if bytes == 0 {
            return;
        }
        self.rx_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.rx_copied_bytes
            .fetch_add(bytes * copies, Ordering::Relaxed);
    }

    /// `bytes` handed to the transport for sending.
    pub fn sent(&self, bytes: u64) {
        self.tx_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// `bytes` copied on the send path (into a send ring, into a frame).
    pub fn tx_copied(&self, bytes: u64) {
        self.tx_copied_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// Both transports' counters, and the DPDK loop's own.
#[derive(Default)]
pub struct CopyCounters {
    pub kernel: TransportCopies,
    pub dpdk: TransportCopies,
    /// Of `dpdk.rx_bytes`: bytes copied once, straight from the mbuf into `Conn::inbuf`.
    pub dpdk_rx_direct_bytes: AtomicU64,
    /// Times the DPDK loop backed off (slept in the ring) because it was idle, and the
    /// microseconds it asked to sleep in total.
    pub dpdk_idle_waits: AtomicU64,
    pub dpdk_idle_wait_us: AtomicU64,
}

impl CopyCounters {
    /// The INFO lines (`# Stats`), each ending in CRLF.
    pub fn info_lines(&self) -> String {
        let v = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = String::new();
        for (name, t) in [("kernel", &self.kernel), ("dpdk", &self.dpdk)] {
            out.push_str(&format!(
                "lavik_{name}_rx_bytes:{}\r\nlavik_{name}_rx_copied_bytes:{}\r\nlavik_{name}_tx_bytes:{}\r\nlavik_{name}_tx_copied_bytes:{}\r\n",
                v(&t.rx_bytes),
                v(&t.rx_copied_bytes),
                v(&t.tx_bytes),
                v(&t.tx_copied_bytes),
            ));
        }
        out.push_str(&format!(
            "lavik_dpdk_rx_direct_bytes:{}\r\nlavik_dpdk_idle_waits:{}\r\nlavik_dpdk_idle_wait_us:{}\r\n",
            v(&self.dpdk_rx_direct_bytes),
            v(&self.dpdk_idle_waits),
            v(&self.dpdk_idle_wait_us),
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_copy() {
        let c = CopyCounters::default();
        c.kernel.received(100, 1);
        c.dpdk.received(10, 2);
        c.dpdk.received(0, 2);
        c.dpdk.sent(7);
        c.dpdk.tx_copied(14);
        let info = c.info_lines();
        assert!(info.contains("lavik_kernel_rx_bytes:100\r\n"));
        assert!(info.contains("lavik_kernel_rx_copied_bytes:100\r\n"));
        assert!(info.contains("lavik_dpdk_rx_bytes:10\r\n"));
        assert!(info.contains("lavik_dpdk_rx_copied_bytes:20\r\n"));
        assert!(info.contains("lavik_dpdk_tx_bytes:7\r\n"));
        assert!(info.contains("lavik_dpdk_tx_copied_bytes:14\r\n"));
        assert!(info.contains("lavik_kernel_tx_copied_bytes:0\r\n"));
    }
}
