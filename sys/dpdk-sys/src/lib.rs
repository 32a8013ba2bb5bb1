//! DPDK 22.11 for lavik's appliance mode: raw bindings plus a small safe wrapper.
//!
//! What this crate owns:
//! - [`raw`]: bindgen output for an allowlisted slice of `rte_eal.h`, `rte_ethdev.h`,
//!   `rte_mbuf.h`, `rte_mempool.h`, `rte_lcore.h`, plus `lvk_*` functions from `csrc/shim.c`
//!   that make DPDK's `static inline` fast path (`rte_eth_rx_burst`, `rte_pktmbuf_alloc`, ...)
//!   callable. DPDK itself is linked statically (see `build.rs` and `docs/dpdk.md`).
//! - A safe layer: [`Eal`] (initialized once per process), [`Mempool`], [`Mbuf`] (an owned
//!   single-segment packet buffer, freed on drop) and [`Port`] (configure, queue setup, start,
//!   burst RX/TX).
//!
//! Invariants the types enforce by lifetimes: a pool cannot outlive the EAL, and an mbuf or a
//! port cannot outlive the pool its buffers come from. An mbuf handed to `tx_burst` is owned by
//! the driver from then on (it is consumed), so it cannot be touched again.
//!
//! Deliberately missing: multi-segment mbufs (all accessors look at the first segment only and
//! `Mbuf::data` says so), offload configuration, multi-process, secondary lcores. The types are
//! `!Send` because mempool caches are per lcore; lavik runs one port queue per worker thread.

use std::ffi::{CStr, CString};
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};

/// Bindgen output over `csrc/wrapper.h` (DPDK declarations and the `lvk_*` shim).
#[allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    missing_docs,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
pub mod raw {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}

/// Most packets one `rx_burst`/`tx_burst` call moves (a stack array of this many pointers).
pub const BURST_MAX_PACKETS: usize = 64;

/// A failed DPDK call: which operation, and the (positive) errno DPDK reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The DPDK function that failed.
    pub op: &'static str,
    /// Positive errno value (DPDK returns `-errno` or sets `rte_errno`).
    pub errno: i32,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SAFETY: rte_strerror accepts any int and returns a pointer to a static or per-lcore
        // NUL-terminated string that stays valid until the next call on this thread.
        let msg = unsafe { CStr::from_ptr(raw::rte_strerror(self.errno)) };
        write!(
            f,
            "{} failed: {} (errno {})",
            self.op,
            msg.to_string_lossy(),
            self.errno
        )
    }
}

impl std::error::Error for Error {}

/// Maps DPDK's "negative errno on failure" convention to a `Result`.
fn check(op: &'static str, ret: i32) -> Result<i32, Error> {
    if ret < 0 {
        Err(Error { op, errno: -ret })
    } else {
        Ok(ret)
    }
}

/// Reads `rte_errno` (thread-local in DPDK, so it needs the shim).
fn last_errno() -> i32 {
    // SAFETY: lvk_rte_errno only reads this thread's rte_errno variable.
    unsafe { raw::lvk_rte_errno() }
}

static EAL_INITIALIZED: AtomicBool = AtomicBool::new(false);

/// The initialized DPDK environment abstraction layer. At most one per process, ever: DPDK
/// cannot be initialized again even after `rte_eal_cleanup`.
pub struct Eal {
    // EAL state is tied to the main lcore thread, so the handle is neither Send nor Sync.
    _not_send: PhantomData<*mut ()>,
}

impl Eal {
    /// Runs `rte_eal_init` with `args` (the program name first, as in `argv`).
    ///
    /// Fails with `EALREADY` if the EAL was already initialized in this process.
    pub fn init(args: &[&str]) -> Result<Eal, Error> {
        let owned: Vec<CString> = args
            .iter()
            .map(|a| {
                CString::new(*a).map_err(|_| Error {
                    op: "rte_eal_init",
                    errno: libc::EINVAL,
                })
            })
            .collect::<Result<_, _>>()?;
        // Checked after argument validation so a rejected argument list leaves init possible.
        if EAL_INITIALIZED.swap(true, Ordering::SeqCst) {
            return Err(Error {
                op: "rte_eal_init",
                errno: libc::EALREADY,
            });
        }
        // EAL may keep pointers into argv (it reorders it and some drivers keep kvargs), so
        // the strings live for the rest of the process; this happens once.
        let owned: &'static [CString] = Vec::leak(owned);
        let mut argv: Vec<*mut libc::c_char> = owned
            .iter()
            .map(|s| s.as_ptr() as *mut libc::c_char)
            .collect();
        let argc = i32::try_from(argv.len()).expect("argument count fits in an int");
        // SAFETY: argv holds argc valid NUL-terminated strings that live for the process;
        // EAL may permute the pointer array, which we own and do not read afterwards.
        let ret = unsafe { raw::rte_eal_init(argc, argv.as_mut_ptr()) };
        if ret < 0 {
            return Err(Error {
                op: "rte_eal_init",
                errno: last_errno(),
            });
        }
        std::mem::forget(argv);
        Ok(Eal {
            _not_send: PhantomData,
        })
    }

    /// Number of usable Ethernet ports (physical and virtual devices that probed).
    pub fn port_count(&self) -> u16 {
        // SAFETY: the EAL is initialized (self exists); the call only reads ethdev state.
        unsafe { raw::rte_eth_dev_count_avail() }
    }

    /// Port id of the ethdev named `name` (e.g. the vdev name `net_tap0`).
    pub fn port_by_name(&self, name: &str) -> Result<u16, Error> {
        let cname = CString::new(name).map_err(|_| Error {
            op: "rte_eth_dev_get_port_by_name",
            errno: libc::EINVAL,
        })?;
        let mut port_id: u16 = 0;
        // SAFETY: cname is NUL-terminated and port_id is a valid out-pointer for the call.
        let ret = unsafe { raw::rte_eth_dev_get_port_by_name(cname.as_ptr(), &mut port_id) };
        check("rte_eth_dev_get_port_by_name", ret)?;
        Ok(port_id)
    }

    /// NUMA socket of the calling thread (use it for pools and queues).
    pub fn socket_id(&self) -> i32 {
        // SAFETY: reads this lcore's socket id; valid after EAL init.
        let socket = unsafe { raw::rte_socket_id() };
        i32::try_from(socket).unwrap_or(raw::SOCKET_ID_ANY)
    }
}

impl Drop for Eal {
    fn drop(&mut self) {
        // Pools and ports borrow the Eal, so they are gone by now.
        // SAFETY: called once, after every DPDK object created through this handle was freed.
        let ret = unsafe { raw::rte_eal_cleanup() };
        debug_assert!(ret == 0, "rte_eal_cleanup returned {ret}");
    }
}

/// A pool of packet buffers (`rte_pktmbuf_pool_create`), freed on drop.
///
/// A pool cannot be freed while one of its buffers is alive (this must not compile):
///
/// ```compile_fail,E0505
/// fn f(eal: &dpdk_sys::Eal) {
///     let pool = dpdk_sys::Mempool::create(eal, "p", 63, 0, 2176).unwrap();
///     let m = pool.alloc().unwrap();
///     drop(pool);
///     drop(m);
/// }
/// ```
///
/// nor while a port whose receive rings it fills is open:
///
/// ```compile_fail,E0505
/// fn f(eal: &dpdk_sys::Eal) {
///     let pool = dpdk_sys::Mempool::create(eal, "p", 63, 0, 2176).unwrap();
///     let port = dpdk_sys::Port::configure(0, &Default::default(), &pool).unwrap();
///     drop(pool);
///     drop(port);
/// }
/// ```
pub struct Mempool<'eal> {
    pool: *mut raw::rte_mempool,
    _eal: PhantomData<&'eal Eal>,
}

impl<'eal> Mempool<'eal> {
    /// Creates a pool of `buffers` mbufs with `data_room_bytes` each (headroom included;
    /// `raw::RTE_MBUF_DEFAULT_BUF_SIZE` fits a standard frame) and a per-lcore cache.
    pub fn create(
        eal: &'eal Eal,
        name: &str,
        buffers: u32,
        cache_buffers: u32,
        data_room_bytes: u16,
    ) -> Result<Self, Error> {
        let cname = CString::new(name).map_err(|_| Error {
            op: "rte_pktmbuf_pool_create",
            errno: libc::EINVAL,
        })?;
        // SAFETY: cname is NUL-terminated (DPDK copies it); the EAL is initialized.
        let pool = unsafe {
            raw::rte_pktmbuf_pool_create(
                cname.as_ptr(),
                buffers,
                cache_buffers,
                0,
                data_room_bytes,
                eal.socket_id(),
            )
        };
        if pool.is_null() {
            return Err(Error {
                op: "rte_pktmbuf_pool_create",
                errno: last_errno(),
            });
        }
        Ok(Mempool {
            pool,
            _eal: PhantomData,
        })
    }

    /// Takes one empty buffer from the pool, or `None` when the pool is exhausted.
    pub fn alloc(&self) -> Option<Mbuf<'_>> {
        // SAFETY: self.pool is a live pktmbuf pool.
        let m = unsafe { raw::lvk_rte_pktmbuf_alloc(self.pool) };
        // SAFETY: m is null or a freshly allocated mbuf owned by nobody else.
        unsafe { Mbuf::from_raw(m) }
    }

    /// Buffers currently free in the pool (including per-lcore caches).
    pub fn available(&self) -> u32 {
        // SAFETY: self.pool is a live mempool; the call only reads counters.
        unsafe { raw::rte_mempool_avail_count(self.pool) }
    }

    /// The raw pool pointer, for queue setup and FFI calls not wrapped here.
    pub fn as_ptr(&self) -> *mut raw::rte_mempool {
        self.pool
    }
}

impl Drop for Mempool<'_> {
    fn drop(&mut self) {
        // SAFETY: every Mbuf and Port borrowing this pool has been dropped (lifetimes), so no
        // buffer of it is referenced from Rust; the pool pointer is live and freed only here.
        unsafe { raw::rte_mempool_free(self.pool) }
    }
}

/// An owned packet buffer; returned to its pool on drop.
pub struct Mbuf<'pool> {
    m: *mut raw::rte_mbuf,
    _pool: PhantomData<&'pool Mempool<'pool>>,
}

impl<'pool> Mbuf<'pool> {
    /// Wraps a raw mbuf; `None` for null.
    ///
    /// # Safety
    /// `m` must be null or a valid mbuf that the caller owns exclusively and that comes from a
    /// pool living at least as long as `'pool`.
    pub unsafe fn from_raw(m: *mut raw::rte_mbuf) -> Option<Self> {
        (!m.is_null()).then_some(Mbuf {
            m,
            _pool: PhantomData,
        })
    }

    /// Gives up ownership; the caller must free or transmit the returned mbuf.
    pub fn into_raw(self) -> *mut raw::rte_mbuf {
        let m = self.m;
        std::mem::forget(self);
        m
    }

    /// Bytes in the first segment (the whole packet unless [`Mbuf::segments`] > 1).
    pub fn len(&self) -> usize {
        // SAFETY: self.m is a valid mbuf we own.
        usize::from(unsafe { raw::lvk_rte_pktmbuf_data_len(self.m) })
    }

    /// True when the first segment holds no data.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total packet length over all segments.
    pub fn packet_len(&self) -> usize {
        // SAFETY: self.m is a valid mbuf we own.
        unsafe { raw::lvk_rte_pktmbuf_pkt_len(self.m) as usize }
    }

    /// Number of chained segments.
    pub fn segments(&self) -> u16 {
        // SAFETY: self.m is a valid mbuf we own.
        unsafe { raw::lvk_rte_pktmbuf_nb_segs(self.m) }
    }

    /// Free bytes after the data in the first segment.
    pub fn tailroom(&self) -> usize {
        // SAFETY: self.m is a valid mbuf we own.
        usize::from(unsafe { raw::lvk_rte_pktmbuf_tailroom(self.m) })
    }

    /// The data of the first segment.
    pub fn data(&self) -> &[u8] {
        // SAFETY: self.m is a valid mbuf we own; mtod points at data_len initialized bytes of
        // its buffer, which nothing else accesses while we hold &self.
        unsafe {
            std::slice::from_raw_parts(raw::lvk_rte_pktmbuf_mtod(self.m).cast::<u8>(), self.len())
        }
    }

    /// The data of the first segment, writable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        let len = self.len();
        // SAFETY: as in `data`, and &mut self gives exclusive access to the buffer.
        unsafe {
            std::slice::from_raw_parts_mut(raw::lvk_rte_pktmbuf_mtod(self.m).cast::<u8>(), len)
        }
    }

    /// Grows the packet by `len` bytes at the tail and returns them (zeroed), or `None` if the
    /// last segment has not enough tailroom.
    pub fn append(&mut self, len: u16) -> Option<&mut [u8]> {
        // SAFETY: self.m is a valid mbuf we own exclusively.
        let p = unsafe { raw::lvk_rte_pktmbuf_append(self.m, len) };
        if p.is_null() {
            return None;
        }
        // SAFETY: append returned a pointer to `len` bytes inside the mbuf's buffer that now
        // belong to the packet; we zero them so the slice is initialized before it is read.
        unsafe {
            std::ptr::write_bytes(p.cast::<u8>(), 0, usize::from(len));
            Some(std::slice::from_raw_parts_mut(
                p.cast::<u8>(),
                usize::from(len),
            ))
        }
    }

    /// Removes `len` bytes from the tail; `false` if the packet is shorter.
    pub fn trim(&mut self, len: u16) -> bool {
        // SAFETY: self.m is a valid mbuf we own exclusively.
        unsafe { raw::lvk_rte_pktmbuf_trim(self.m, len) == 0 }
    }

    /// Removes `len` bytes from the front (e.g. a parsed header); `false` if too short.
    pub fn adj(&mut self, len: u16) -> bool {
        // SAFETY: self.m is a valid mbuf we own exclusively.
        !unsafe { raw::lvk_rte_pktmbuf_adj(self.m, len) }.is_null()
    }

    /// Empties the packet (length 0, default headroom) so the buffer can be refilled.
    pub fn reset(&mut self) {
        // SAFETY: self.m is a valid mbuf we own exclusively.
        unsafe { raw::lvk_rte_pktmbuf_reset(self.m) }
    }
}

impl Drop for Mbuf<'_> {
    fn drop(&mut self) {
        // SAFETY: we own self.m exclusively and it is freed exactly once, here.
        unsafe { raw::lvk_rte_pktmbuf_free(self.m) }
    }
}

/// Queue counts and ring sizes for [`Port::configure`].
#[derive(Debug, Clone, Copy)]
pub struct PortConfig {
    /// Receive queues (one per worker).
    pub rx_queues: u16,
    /// Transmit queues (one per worker).
    pub tx_queues: u16,
    /// Descriptors per receive ring.
    pub rx_ring_descriptors: u16,
    /// Descriptors per transmit ring.
    pub tx_ring_descriptors: u16,
}

impl Default for PortConfig {
    fn default() -> Self {
        PortConfig {
            rx_queues: 1,
            tx_queues: 1,
            rx_ring_descriptors: 1024,
            tx_ring_descriptors: 1024,
        }
    }
}

/// A configured Ethernet port whose receive queues fill from one pool. Stopped and closed on
/// drop.
pub struct Port<'pool> {
    port_id: u16,
    started: bool,
    _pool: PhantomData<&'pool Mempool<'pool>>,
}

impl<'pool> Port<'pool> {
    /// Configures `port_id` with default device settings and sets up every queue of `config`,
    /// receive queues drawing buffers from `pool`. Call [`Port::start`] next.
    pub fn configure(
        port_id: u16,
        config: &PortConfig,
        pool: &'pool Mempool<'_>,
    ) -> Result<Self, Error> {
        let conf = raw::rte_eth_conf::default();
        // SAFETY: conf is a valid zeroed rte_eth_conf (default settings) read during the call.
        let ret = unsafe {
            raw::rte_eth_dev_configure(port_id, config.rx_queues, config.tx_queues, &conf)
        };
        check("rte_eth_dev_configure", ret)?;
        // Constructed now so that a failing queue setup still closes the port on drop.
        let port = Port {
            port_id,
            started: false,
            _pool: PhantomData,
        };
        // SAFETY: the port id was just accepted by rte_eth_dev_configure.
        let socket = unsafe { raw::rte_eth_dev_socket_id(port_id) };
        let socket = u32::try_from(socket).unwrap_or(raw::SOCKET_ID_ANY as u32);
        for queue in 0..config.rx_queues {
            // SAFETY: the port is configured; null rxconf means driver defaults; the pool
            // outlives the port ('pool), so the ring's buffers stay valid.
            let ret = unsafe {
                raw::rte_eth_rx_queue_setup(
                    port_id,
                    queue,
                    config.rx_ring_descriptors,
                    socket,
                    std::ptr::null(),
                    pool.as_ptr(),
                )
            };
            check("rte_eth_rx_queue_setup", ret)?;
        }
        for queue in 0..config.tx_queues {
            // SAFETY: the port is configured; null txconf means driver defaults.
            let ret = unsafe {
                raw::rte_eth_tx_queue_setup(
                    port_id,
                    queue,
                    config.tx_ring_descriptors,
                    socket,
                    std::ptr::null(),
                )
            };
            check("rte_eth_tx_queue_setup", ret)?;
        }
        Ok(port)
    }

    /// Starts the port (links up the device, arms the queues).
    pub fn start(&mut self) -> Result<(), Error> {
        // SAFETY: the port and all its queues are configured.
        check("rte_eth_dev_start", unsafe {
            raw::rte_eth_dev_start(self.port_id)
        })?;
        self.started = true;
        Ok(())
    }

    /// The DPDK port id.
    pub fn id(&self) -> u16 {
        self.port_id
    }

    /// The port's Ethernet address.
    pub fn mac_addr(&self) -> Result<[u8; 6], Error> {
        let mut addr = raw::rte_ether_addr::default();
        // SAFETY: addr is a valid out-pointer for one rte_ether_addr.
        check("rte_eth_macaddr_get", unsafe {
            raw::rte_eth_macaddr_get(self.port_id, &mut addr)
        })?;
        Ok(addr.addr_bytes)
    }

    /// Accepts frames for any destination address.
    pub fn enable_promiscuous(&self) -> Result<(), Error> {
        // SAFETY: the port is configured; the call takes only the id.
        check("rte_eth_promiscuous_enable", unsafe {
            raw::rte_eth_promiscuous_enable(self.port_id)
        })?;
        Ok(())
    }

    /// Receives up to `BURST_MAX_PACKETS` frames from `queue`, appending them to `out`;
    /// returns how many arrived.
    pub fn rx_burst(&self, queue: u16, out: &mut Vec<Mbuf<'pool>>) -> usize {
        assert!(self.started, "rx_burst on a port that is not started");
        let mut pkts = [std::ptr::null_mut::<raw::rte_mbuf>(); BURST_MAX_PACKETS];
        // SAFETY: the port is started; pkts has room for BURST_MAX_PACKETS pointers.
        let n = unsafe {
            raw::lvk_rte_eth_rx_burst(
                self.port_id,
                queue,
                pkts.as_mut_ptr(),
                BURST_MAX_PACKETS as u16,
            )
        };
        let n = usize::from(n);
        assert!(n <= BURST_MAX_PACKETS);
        for &m in &pkts[..n] {
            // SAFETY: rx_burst hands us ownership of n valid mbufs from this port's pool.
            out.push(unsafe { Mbuf::from_raw(m) }.expect("rx_burst returned a null mbuf"));
        }
        n
    }

    /// Queues the front of `pkts` (at most `BURST_MAX_PACKETS`) for transmission on `queue`.
    /// Sent mbufs are removed from `pkts` (the driver owns them now); the rest stay for a
    /// retry. Returns how many were sent.
    ///
    /// The mbufs must come from a pool that outlives the port (`'pool`): the driver may hold
    /// sent ones in its ring until the port is closed, and returns them to their pool then.
    pub fn tx_burst(&self, queue: u16, pkts: &mut Vec<Mbuf<'pool>>) -> usize {
        assert!(self.started, "tx_burst on a port that is not started");
        let count = pkts.len().min(BURST_MAX_PACKETS);
        let mut raw_pkts = [std::ptr::null_mut::<raw::rte_mbuf>(); BURST_MAX_PACKETS];
        for (slot, m) in raw_pkts.iter_mut().zip(pkts.iter()) {
            *slot = m.m;
        }
        // SAFETY: the port is started; raw_pkts[..count] are valid mbufs we own.
        let sent = unsafe {
            raw::lvk_rte_eth_tx_burst(self.port_id, queue, raw_pkts.as_mut_ptr(), count as u16)
        };
        let sent = usize::from(sent);
        assert!(sent <= count);
        for m in pkts.drain(..sent) {
            // Ownership passed to the driver, which frees the mbuf after sending.
            let _ = m.into_raw();
        }
        sent
    }
}

impl Drop for Port<'_> {
    fn drop(&mut self) {
        if self.started {
            // SAFETY: the port is started; stopping it is allowed once.
            let _ = unsafe { raw::rte_eth_dev_stop(self.port_id) };
        }
        // SAFETY: the port is stopped (or never started); closing releases its queues, whose
        // buffers go back to the pool that still lives ('pool).
        let _ = unsafe { raw::rte_eth_dev_close(self.port_id) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // DPDK's "negative errno" return convention becomes Err with the positive errno.
    #[test]
    fn check_maps_negative_returns_to_errno() {
        assert_eq!(check("op", 3), Ok(3));
        assert_eq!(check("op", 0), Ok(0));
        assert_eq!(
            check("op", -libc::ENODEV),
            Err(Error {
                op: "op",
                errno: libc::ENODEV
            })
        );
    }

    // Error text names the failing call and DPDK's message for the errno (no EAL needed).
    #[test]
    fn error_display_names_op_and_message() {
        let text = Error {
            op: "rte_eth_dev_start",
            errno: libc::EINVAL,
        }
        .to_string();
        assert!(text.starts_with("rte_eth_dev_start failed: "), "{text}");
        assert!(
            text.contains("Invalid argument") && text.ends_with("(errno 22)"),
            "{text}"
        );
    }

    // An argument with a NUL byte is rejected before DPDK is touched, and init stays possible.
    #[test]
    fn eal_init_rejects_nul_without_consuming_the_one_shot() {
        let err = Eal::init(&["prog", "--no\0huge"])
            .err()
            .expect("NUL must be rejected");
        assert_eq!(err.errno, libc::EINVAL);
        assert!(!EAL_INITIALIZED.load(Ordering::SeqCst));
    }
}
