//! VFIO plumbing: the only place the driver talks to the kernel or touches raw memory.
//!
//! Owns: the container/group/device file descriptors (IOMMU type 1), the BAR0 mapping with
//! one volatile accessor per register width, the named DMA barriers, and DMA buffers
//! (hugepage-backed, or anonymous + `mlock` when hugepages are unavailable) mapped into the
//! device's IOVA space by a small first-fit IOVA allocator.
//!
//! Kernel ABI numbers come from `<linux/vfio.h>`: ioctls are `_IO(';', 100 + n)`.
//! Every `unsafe` block is one operation with a `SAFETY:` line. Lifetimes: a `DmaBuffer`
//! keeps its container alive (`Arc`) so the IOMMU mapping is removed before the memory is
//! unmapped; `Bar0` keeps the device fd alive for the same reason.
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, Mutex};

const VFIO_TYPE: u32 = b';' as u32;
const VFIO_BASE: u32 = 100;
const fn vfio_io(nr: u32) -> libc::c_ulong {
    ((VFIO_TYPE << 8) | (VFIO_BASE + nr)) as libc::c_ulong
}
const VFIO_GET_API_VERSION: libc::c_ulong = vfio_io(0);
const VFIO_CHECK_EXTENSION: libc::c_ulong = vfio_io(1);
const VFIO_SET_IOMMU: libc::c_ulong = vfio_io(2);
const VFIO_GROUP_GET_STATUS: libc::c_ulong = vfio_io(3);
const VFIO_GROUP_SET_CONTAINER: libc::c_ulong = vfio_io(4);
const VFIO_GROUP_GET_DEVICE_FD: libc::c_ulong = vfio_io(6);
const VFIO_DEVICE_GET_REGION_INFO: libc::c_ulong = vfio_io(8);
const VFIO_IOMMU_MAP_DMA: libc::c_ulong = vfio_io(13);
const VFIO_IOMMU_UNMAP_DMA: libc::c_ulong = vfio_io(14);
const _: () = assert!(VFIO_GET_API_VERSION == 0x3B64 && VFIO_IOMMU_UNMAP_DMA == 0x3B72);

const VFIO_API_VERSION: libc::c_int = 0;
const VFIO_TYPE1_IOMMU: libc::c_ulong = 1;
const VFIO_TYPE1V2_IOMMU: libc::c_ulong = 3;
const VFIO_GROUP_FLAGS_VIABLE: u32 = 1;
const VFIO_REGION_INFO_FLAG_MMAP: u32 = 1 << 2;
const VFIO_DMA_MAP_FLAG_READ: u32 = 1;
const VFIO_DMA_MAP_FLAG_WRITE: u32 = 1 << 1;
const VFIO_PCI_BAR0_REGION_INDEX: u32 = 0;
const VFIO_PCI_CONFIG_REGION_INDEX: u32 = 7;

/// PCI configuration space: Command register offset and the bits we set.
const PCI_COMMAND_OFFSET: u64 = 0x04;
const PCI_COMMAND_MEMORY: u16 = 1 << 1;
const PCI_COMMAND_BUS_MASTER: u16 = 1 << 2;

/// Hugepage size requested (`MAP_HUGE_2MB`) for hugepage-backed DMA memory.
pub const HUGEPAGE_SIZE_BYTES: usize = 2 * 1024 * 1024;
/// Where the IOVA allocator starts (low addresses are left alone) and its ceiling
/// (39-bit IOMMU address width, the smallest common one).
const IOVA_BASE: u64 = 1 << 32;
const IOVA_LIMIT: u64 = 1 << 39;

#[repr(C)]
struct GroupStatus {
    argsz: u32,
    flags: u32,
}
#[repr(C)]
#[derive(Default)]
struct RegionInfo {
    argsz: u32,
    flags: u32,
    index: u32,
    cap_offset: u32,
    size: u64,
    offset: u64,
}
#[repr(C)]
struct DmaMap {
    argsz: u32,
    flags: u32,
    vaddr: u64,
    iova: u64,
    size: u64,
}
#[repr(C)]
struct DmaUnmap {
    argsz: u32,
    flags: u32,
    iova: u64,
    size: u64,
}
const _: () = assert!(std::mem::size_of::<RegionInfo>() == 32);
const _: () = assert!(std::mem::size_of::<DmaMap>() == 32);
const _: () = assert!(std::mem::size_of::<DmaUnmap>() == 24);

/// A PCI address `domain:bus:device.function`, e.g. `0000:00:04.0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciAddress {
    pub domain: u16,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

impl std::str::FromStr for PciAddress {
    type Err = String;
    /// Accepts `DDDD:BB:DD.F` and the short `BB:DD.F` (domain 0).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("bad PCI address {s:?} (want DDDD:BB:DD.F)");
        let (rest, function) = s.rsplit_once('.').ok_or_else(bad)?;
        let parts: Vec<&str> = rest.split(':').collect();
        let (domain, bus, device) = match parts.as_slice() {
            [d, b, v] => (*d, *b, *v),
            [b, v] => ("0", *b, *v),
            _ => return Err(bad()),
        };
        let hex = |t: &str, max: u32| {
            u32::from_str_radix(t, 16)
                .ok()
                .filter(|&x| x <= max && !t.is_empty() && t.len() <= 4)
                .ok_or_else(bad)
        };
        Ok(PciAddress {
            domain: hex(domain, 0xFFFF)? as u16,
            bus: hex(bus, 0xFF)? as u8,
            device: hex(device, 0x1F)? as u8,
            function: hex(function, 0x7)? as u8,
        })
    }
}

impl std::fmt::Display for PciAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

fn ioctl_result(rc: libc::c_int, what: &str) -> io::Result<libc::c_int> {
    if rc < 0 {
        let e = io::Error::last_os_error();
        Err(io::Error::new(e.kind(), format!("{what}: {e}")))
    } else {
        Ok(rc)
    }
}

/// A VFIO container with the type-1 IOMMU set, plus the IOVA allocator of its space.
pub struct Container {
    fd: OwnedFd,
    iova: Mutex<IovaAllocator>,
}

/// An opened VFIO device: its BDF, fd, and the group/container keeping it attached.
pub struct VfioDevice {
    pub address: PciAddress,
    device: File,
    _group: File,
    pub container: Arc<Container>,
}

impl VfioDevice {
    /// Opens `address` through VFIO: container, group (must be viable: every device in
    /// it bound to vfio-pci), IOMMU type 1, device fd; enables memory decoding and bus
    /// mastering in the PCI command register.
    pub fn open(address: PciAddress) -> io::Result<VfioDevice> {
        let container = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/vfio/vfio")?;
        // SAFETY: VFIO_GET_API_VERSION takes no argument.
        let version = unsafe { libc::ioctl(container.as_raw_fd(), VFIO_GET_API_VERSION) };
        if ioctl_result(version, "VFIO_GET_API_VERSION")? != VFIO_API_VERSION {
            return Err(io::Error::other(format!(
                "unsupported VFIO API version {version}"
            )));
        }
        let iommu_type = Self::pick_iommu_type(&container)?;
        let group_path = Self::group_path(address)?;
        let group = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&group_path)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "{}: {e} (is {address} bound to vfio-pci?)",
                        group_path.display()
                    ),
                )
            })?;
        let mut status = GroupStatus {
            argsz: std::mem::size_of::<GroupStatus>() as u32,
            flags: 0,
        };
        // SAFETY: `status` is a valid vfio_group_status the kernel fills in.
        let rc = unsafe { libc::ioctl(group.as_raw_fd(), VFIO_GROUP_GET_STATUS, &mut status) };
        ioctl_result(rc, "VFIO_GROUP_GET_STATUS")?;
        if status.flags & VFIO_GROUP_FLAGS_VIABLE == 0 {
            return Err(io::Error::other(format!(
                "VFIO group {} not viable: bind every device of the group to vfio-pci",
                group_path.display()
            )));
        }
        let container_fd = container.as_raw_fd();
        // SAFETY: the argument is a pointer to a live int holding the container fd.
        let rc = unsafe { libc::ioctl(group.as_raw_fd(), VFIO_GROUP_SET_CONTAINER, &container_fd) };
        ioctl_result(rc, "VFIO_GROUP_SET_CONTAINER")?;
        // SAFETY: VFIO_SET_IOMMU takes the IOMMU type by value.
        let rc = unsafe { libc::ioctl(container_fd, VFIO_SET_IOMMU, iommu_type) };
        ioctl_result(rc, "VFIO_SET_IOMMU")?;
        let name = CString::new(address.to_string()).expect("no NUL in a PCI address");
        // SAFETY: `name` is a NUL-terminated string that outlives the call.
        let fd = unsafe { libc::ioctl(group.as_raw_fd(), VFIO_GROUP_GET_DEVICE_FD, name.as_ptr()) };
        let fd = ioctl_result(fd, "VFIO_GROUP_GET_DEVICE_FD")?;
        // SAFETY: the kernel just returned this fd to us; nothing else owns it.
        let device = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let container = Arc::new(Container {
            fd: container.into(),
            iova: Mutex::new(IovaAllocator::new()),
        });
        let dev = VfioDevice {
            address,
            device,
            _group: group,
            container,
        };
        dev.enable_bus_master()?;
        Ok(dev)
    }

    fn pick_iommu_type(container: &File) -> io::Result<libc::c_ulong> {
        for t in [VFIO_TYPE1V2_IOMMU, VFIO_TYPE1_IOMMU] {
            // SAFETY: VFIO_CHECK_EXTENSION takes the extension number by value.
            let rc = unsafe { libc::ioctl(container.as_raw_fd(), VFIO_CHECK_EXTENSION, t) };
            if ioctl_result(rc, "VFIO_CHECK_EXTENSION")? > 0 {
                return Ok(t);
            }
        }
        Err(io::Error::other(
            "VFIO: no type-1 IOMMU support (is the IOMMU enabled: intel_iommu=on?)",
        ))
    }

    fn group_path(address: PciAddress) -> io::Result<PathBuf> {
        let link = format!("/sys/bus/pci/devices/{address}/iommu_group");
        let target = std::fs::read_link(&link).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("{link}: {e} (no IOMMU group: IOMMU off?)"),
            )
        })?;
        let group = target
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| io::Error::other("bad iommu_group"))?;
        Ok(PathBuf::from(format!("/dev/vfio/{group}")))
    }

    fn region_info(&self, index: u32) -> io::Result<RegionInfo> {
        let mut info = RegionInfo {
            argsz: std::mem::size_of::<RegionInfo>() as u32,
            index,
            ..Default::default()
        };
        // SAFETY: `info` is a valid vfio_region_info with argsz set; the kernel fills it.
        let rc = unsafe {
            libc::ioctl(
                self.device.as_raw_fd(),
                VFIO_DEVICE_GET_REGION_INFO,
                &mut info,
            )
        };
        ioctl_result(rc, "VFIO_DEVICE_GET_REGION_INFO")?;
        Ok(info)
    }

    fn enable_bus_master(&self) -> io::Result<()> {
        let cfg = self.region_info(VFIO_PCI_CONFIG_REGION_INDEX)?;
        let mut raw = [0u8; 2];
        self.device
            .read_exact_at(&mut raw, cfg.offset + PCI_COMMAND_OFFSET)?;
        let cmd = u16::from_le_bytes(raw) | PCI_COMMAND_MEMORY | PCI_COMMAND_BUS_MASTER;
        self.device
            .write_all_at(&cmd.to_le_bytes(), cfg.offset + PCI_COMMAND_OFFSET)
    }

    /// Maps BAR0 (the NVMe register file) into our address space.
    pub fn map_bar0(&self) -> io::Result<Bar0> {
        let info = self.region_info(VFIO_PCI_BAR0_REGION_INDEX)?;
        if info.flags & VFIO_REGION_INFO_FLAG_MMAP == 0 || info.size < 0x2000 {
            return Err(io::Error::other(format!(
                "BAR0 not mappable (flags {:#x}, {} bytes)",
                info.flags, info.size
            )));
        }
        let len = info.size as usize;
        // SAFETY: mapping a device region the kernel described; no existing memory is
        // affected (addr NULL), the result is checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.device.as_raw_fd(),
                info.offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::new(
                io::Error::last_os_error().kind(),
                "mmap BAR0",
            ));
        }
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap BAR0 returned NULL"))?;
        Ok(Bar0 {
            ptr,
            len,
            _device: self.device.try_clone()?,
        })
    }
}

/// The mapped BAR0 register file. Each access is a single volatile load or store of the
/// register's width at an offset checked against the mapping.
pub struct Bar0 {
    ptr: NonNull<u8>,
    len: usize,
    _device: File,
}

// SAFETY: Bar0 is an MMIO window; the registers tolerate access from any thread, and
// the driver serialises use of one queue's doorbells itself.
unsafe impl Send for Bar0 {}
// SAFETY: as above; all accesses are volatile single-width operations.
unsafe impl Sync for Bar0 {}

impl Bar0 {
    fn checked(&self, offset: usize, width: usize) -> *mut u8 {
        assert!(
            offset.is_multiple_of(width) && offset + width <= self.len,
            "BAR0 access {offset:#x}/{width} out of range"
        );
        // SAFETY: offset + width <= len, so the pointer stays inside the mapping.
        unsafe { self.ptr.as_ptr().add(offset) }
    }
    /// Size of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn read32(&self, offset: usize) -> u32 {
        let p = self.checked(offset, 4).cast::<u32>();
        // SAFETY: p is an aligned, in-bounds pointer into the live BAR0 mapping.
        unsafe { p.read_volatile() }
    }
    pub fn write32(&self, offset: usize, value: u32) {
        let p = self.checked(offset, 4).cast::<u32>();
        // SAFETY: p is an aligned, in-bounds pointer into the live BAR0 mapping.
        unsafe { p.write_volatile(value) }
    }
    /// 64-bit registers are read as two dwords, low first (§3.1: allowed for every
    /// controller, unlike a single 8-byte access on some).
    pub fn read64(&self, offset: usize) -> u64 {
        self.read32(offset) as u64 | (self.read32(offset + 4) as u64) << 32
    }
    pub fn write64(&self, offset: usize, value: u64) {
        self.write32(offset, value as u32);
        self.write32(offset + 4, (value >> 32) as u32);
    }
}

impl Drop for Bar0 {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned; no references outlive self.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Orders our stores to DMA memory (submission entries, PRP lists, write data) before the
/// following doorbell MMIO store, so the controller never fetches a stale entry.
pub fn dma_write_barrier_before_doorbell() {
    fence(Ordering::SeqCst);
}

/// Orders the load of a completion's phase dword before the loads of the rest of the
/// entry and of the data it covers.
pub fn dma_read_barrier_after_phase() {
    fence(Ordering::Acquire);
}

/// First-fit allocator of IOVA ranges (page granular).
#[derive(Debug)]
pub struct IovaAllocator {
    next: u64,
    free: Vec<(u64, u64)>,
}

impl Default for IovaAllocator {
    fn default() -> Self {
        Self::new()
    }
}

impl IovaAllocator {
    pub fn new() -> Self {
        IovaAllocator {
            next: IOVA_BASE,
            free: Vec::new(),
        }
    }
    /// A range of `len` bytes aligned to `align` (a power of two).
    pub fn alloc(&mut self, len: u64, align: u64) -> Option<u64> {
        debug_assert!(align.is_power_of_two() && len > 0);
        if let Some(i) = self
            .free
            .iter()
            .position(|&(s, l)| s % align == 0 && l >= len)
        {
            let (start, l) = self.free[i];
            if l == len {
                self.free.remove(i);
            } else {
                self.free[i] = (start + len, l - len);
            }
            return Some(start);
        }
        let start = self.next.div_ceil(align) * align;
        let end = start.checked_add(len).filter(|&e| e <= IOVA_LIMIT)?;
        self.next = end;
        Some(start)
    }
    pub fn free(&mut self, start: u64, len: u64) {
        if start + len == self.next {
            self.next = start;
        } else {
            self.free.push((start, len));
        }
    }
}

/// How DMA memory is obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaBacking {
    /// `MAP_HUGETLB` 2 MiB pages (needs `vm.nr_hugepages`).
    Hugepages,
    /// Ordinary anonymous pages, locked (the `--no-huge` fallback).
    Locked4k,
}

/// Memory the device may read and write, mapped at a contiguous IOVA range.
/// Dropping it unmaps it from the IOMMU first, then from our address space.
pub struct DmaBuffer {
    ptr: NonNull<u8>,
    len: usize,
    iova: u64,
    backing: DmaBacking,
    container: Arc<Container>,
}

// SAFETY: DmaBuffer uniquely owns its mapping; access goes through &/&mut self.
unsafe impl Send for DmaBuffer {}
// SAFETY: shared access is read-only (`as_slice`, volatile reads).
unsafe impl Sync for DmaBuffer {}

impl Container {
    /// Allocates `len_bytes` (rounded up to 4 KiB, or 2 MiB for hugepages) of zeroed
    /// DMA memory, preferring `prefer`, falling back to locked 4 KiB pages.
    pub fn alloc_dma(
        self: &Arc<Self>,
        len_bytes: usize,
        prefer: DmaBacking,
    ) -> io::Result<DmaBuffer> {
        let attempt = |backing| -> io::Result<DmaBuffer> {
            let granule = if backing == DmaBacking::Hugepages {
                HUGEPAGE_SIZE_BYTES
            } else {
                4096
            };
            let len = len_bytes.max(1).div_ceil(granule) * granule;
            let ptr = map_anonymous(len, backing)?;
            let iova = match self
                .iova
                .lock()
                .expect("iova lock")
                .alloc(len as u64, granule as u64)
            {
                Some(i) => i,
                None => {
                    unmap_anonymous(ptr, len);
                    return Err(io::Error::other("IOVA space exhausted"));
                }
            };
            let buf = DmaBuffer {
                ptr,
                len,
                iova,
                backing,
                container: self.clone(),
            };
            let map = DmaMap {
                argsz: std::mem::size_of::<DmaMap>() as u32,
                flags: VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
                vaddr: ptr.as_ptr() as u64,
                iova,
                size: len as u64,
            };
            // SAFETY: `map` describes memory we own for the buffer's whole life; the
            // mapping is removed in DmaBuffer::drop before the memory is released.
            let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), VFIO_IOMMU_MAP_DMA, &map) };
            if let Err(e) = ioctl_result(rc, "VFIO_IOMMU_MAP_DMA") {
                // Release without the unmap ioctl: nothing was mapped.
                let DmaParts {
                    ptr,
                    len,
                    iova,
                    container,
                } = buf.into_parts();
                container
                    .iova
                    .lock()
                    .expect("iova lock")
                    .free(iova, len as u64);
                unmap_anonymous(ptr, len);
                return Err(e);
            }
            Ok(buf)
        };
        match prefer {
            DmaBacking::Hugepages => attempt(DmaBacking::Hugepages).or_else(|e| {
                tracing::warn!(
                    "hugepage DMA allocation failed ({e}); falling back to locked 4 KiB pages"
                );
                attempt(DmaBacking::Locked4k)
            }),
            DmaBacking::Locked4k => attempt(DmaBacking::Locked4k),
        }
    }
}

fn map_anonymous(len: usize, backing: DmaBacking) -> io::Result<NonNull<u8>> {
    let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE;
    if backing == DmaBacking::Hugepages {
        // Ask for 2 MiB pages explicitly: the system default may be 1 GiB, which would
        // not match the granule lengths are rounded to (and munmap would fail).
        flags |= libc::MAP_HUGETLB | libc::MAP_HUGE_2MB;
    }
    // SAFETY: a fresh anonymous mapping (addr NULL) affects no existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: p/len is the mapping just created; locking keeps its physical pages fixed.
    if unsafe { libc::mlock(p, len) } != 0 {
        let e = io::Error::last_os_error();
        unmap_anonymous(
            NonNull::new(p.cast()).expect("mmap success is non-null"),
            len,
        );
        return Err(e);
    }
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned NULL"))
}

fn unmap_anonymous(ptr: NonNull<u8>, len: usize) {
    // SAFETY: ptr/len came from map_anonymous and nothing references the memory anymore.
    unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
}

struct DmaParts {
    ptr: NonNull<u8>,
    len: usize,
    iova: u64,
    container: Arc<Container>,
}

impl DmaBuffer {
    fn into_parts(self) -> DmaParts {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped, so moving the Arc out leaves no double drop.
        let container = unsafe { std::ptr::read(&me.container) };
        DmaParts {
            ptr: me.ptr,
            len: me.len,
            iova: me.iova,
            container,
        }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn iova(&self) -> u64 {
        self.iova
    }
    pub fn backing(&self) -> DmaBacking {
        self.backing
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr/len is our live mapping. Callers read data only after the command
        // that filled it completed (the read barrier is in the completion path).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self means no command owns the buffer right now.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
    /// Volatile store of a `T` at byte `offset` (ring entries the device reads).
    pub fn write_volatile<T: Copy>(&mut self, offset: usize, value: T) {
        assert!(
            offset.is_multiple_of(std::mem::align_of::<T>())
                && offset + std::mem::size_of::<T>() <= self.len
        );
        // SAFETY: in bounds and aligned (checked above); memory is ours and writable.
        unsafe {
            self.ptr
                .as_ptr()
                .add(offset)
                .cast::<T>()
                .write_volatile(value)
        }
    }
    /// Volatile load of a `T` at byte `offset` (ring entries the device writes).
    pub fn read_volatile<T: Copy>(&self, offset: usize) -> T {
        assert!(
            offset.is_multiple_of(std::mem::align_of::<T>())
                && offset + std::mem::size_of::<T>() <= self.len
        );
        // SAFETY: in bounds and aligned (checked above); any bit pattern is a valid T
        // for the plain-integer types this is used with.
        unsafe { self.ptr.as_ptr().add(offset).cast::<T>().read_volatile() }
    }
}

impl Drop for DmaBuffer {
    fn drop(&mut self) {
        let unmap = DmaUnmap {
            argsz: std::mem::size_of::<DmaUnmap>() as u32,
            flags: 0,
            iova: self.iova,
            size: self.len as u64,
        };
        // SAFETY: `unmap` names exactly the range mapped in alloc_dma.
        let rc =
            unsafe { libc::ioctl(self.container.fd.as_raw_fd(), VFIO_IOMMU_UNMAP_DMA, &unmap) };
        if rc < 0 {
            // Leak rather than free memory the device might still reach.
            tracing::error!(
                "VFIO_IOMMU_UNMAP_DMA failed: {}; leaking DMA buffer",
                io::Error::last_os_error()
            );
            return;
        }
        self.container
            .iova
            .lock()
            .expect("iova lock")
            .free(self.iova, self.len as u64);
        unmap_anonymous(self.ptr, self.len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves BDF parsing accepts long and short forms and rejects out-of-range parts.
    #[test]
    fn pci_address_parse() {
        let a: PciAddress = "0000:00:04.0".parse().unwrap();
        assert_eq!(
            a,
            PciAddress {
                domain: 0,
                bus: 0,
                device: 4,
                function: 0
            }
        );
        assert_eq!(a.to_string(), "0000:00:04.0");
        assert_eq!(
            "3b:1f.7".parse::<PciAddress>().unwrap().to_string(),
            "0000:3b:1f.7"
        );
        for bad in [
            "",
            "00:04",
            "0000:00:20.0",
            "0000:00:04.8",
            "0000:100:04.0",
            "x:00:04.0",
            "0:0:0:0.0",
        ] {
            assert!(bad.parse::<PciAddress>().is_err(), "{bad}");
        }
    }

    // Proves the IOVA allocator aligns, never overlaps live ranges, and reuses freed ones.
    #[test]
    fn iova_allocator_first_fit() {
        let mut a = IovaAllocator::new();
        let x = a.alloc(4096, 4096).unwrap();
        let y = a
            .alloc(HUGEPAGE_SIZE_BYTES as u64, HUGEPAGE_SIZE_BYTES as u64)
            .unwrap();
        assert_eq!(y % HUGEPAGE_SIZE_BYTES as u64, 0);
        assert!(y >= x + 4096);
        let z = a.alloc(8192, 4096).unwrap();
        assert!(z >= y + HUGEPAGE_SIZE_BYTES as u64);
        a.free(x, 4096);
        assert_eq!(a.alloc(4096, 4096), Some(x), "freed range reused");
        a.free(z, 8192);
        assert_eq!(
            a.alloc(8192, 4096),
            Some(z),
            "top range returned to the bump pointer"
        );
        assert_eq!(a.alloc(IOVA_LIMIT, 4096), None);
    }
}
