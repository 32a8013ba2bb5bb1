//! `FileDevice`: a regular file or a raw block device, `O_DIRECT` when possible.
//!
//! Transfers use `pread`/`pwrite` for now; the io_uring path will replace them behind the same
//! trait. When the filesystem refuses `O_DIRECT` (tmpfs, some overlay setups) the file is
//! reopened buffered and a warning is logged: durability still comes from `fdatasync`.
use super::{check_access, check_range, AlignedBuf, BlockDevice, DeviceError};
use std::fs::{File, OpenOptions};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub struct FileDevice {
    file: File,
    /// A second descriptor of the same file holding the exclusive `flock`. Kept apart
    /// from `file` because io_uring requests pin `file` for a while after the process
    /// dies (its ring is torn down asynchronously); this one closes at exit at once.
    _lock: File,
    path: PathBuf,
    /// Grows (`grow_to`) while other threads read and write below it.
    capacity_bytes: AtomicU64,
    sector_size_bytes: u32,
    direct: bool,
    is_block_device: bool,
}

/// `BLKGETSIZE64` from `<linux/fs.h>`: `_IOR(0x12, 114, size_t)`.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
/// `BLKSSZGET` from `<linux/fs.h>`: `_IO(0x12, 104)`, logical sector size as `int`.
const BLKSSZGET: libc::c_ulong = 0x1268;

impl FileDevice {
    /// Opens `path`. If it does not exist and `create_size_bytes` is `Some`, creates it with
    /// that size; an existing empty regular file is also sized. `direct` asks for `O_DIRECT`.
    pub fn open(
        path: &Path,
        direct: bool,
        create_size_bytes: Option<u64>,
    ) -> Result<FileDevice, DeviceError> {
        let exists = path.exists();
        if !exists && create_size_bytes.is_none() {
            return Err(DeviceError::Io(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{}: no such file", path.display()),
            )));
        }
        let (file, direct) = open_file(path, direct, !exists)?;
        // One process per data file: a second lavik on the same file would corrupt it.
        let lock = File::open(path)?;
        // SAFETY: plain syscall on a descriptor we own; the lock lives as long as `lock`.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            let msg = if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                format!("{}: in use by another process (locked)", path.display())
            } else {
                format!("{}: cannot lock: {e}", path.display())
            };
            return Err(DeviceError::Io(std::io::Error::new(e.kind(), msg)));
        }
        let meta = file.metadata()?;
        let is_block_device = meta.file_type().is_block_device();
        let (mut capacity_bytes, sector_size_bytes) = if is_block_device {
            block_device_geometry(&file)?
        } else {
            (meta.len(), 4096)
        };
        if !is_block_device && capacity_bytes == 0 {
            if let Some(size) = create_size_bytes {
                allocate_file(&file, path, size)?;
                capacity_bytes = size;
            }
        }
        // Only whole 4096-byte units are addressable.
        capacity_bytes -= capacity_bytes % super::IO_ALIGN_BYTES as u64;
        Ok(FileDevice {
            file,
            _lock: lock,
            path: path.to_path_buf(),
            capacity_bytes: AtomicU64::new(capacity_bytes),
            sector_size_bytes,
            direct,
            is_block_device,
        })
    }

    fn capacity(&self) -> u64 {
        self.capacity_bytes.load(Ordering::Acquire)
    }

    /// Whether the file is open with `O_DIRECT`.
    pub fn is_direct(&self) -> bool {
        self.direct
    }
}

/// Gives a new data file its whole size for real: reserved with `fallocate` (so a full
/// file system shows now, not as a failed write later) and then written with zeros once,
/// so that later writes land in allocated, written extents: a write into a hole or an
/// unwritten extent changes file-system metadata, and every `fdatasync` after it must
/// commit that metadata too (measured: 12-16 % more `appendfsync always` SETs per second
/// on a zero-filled file than on a sparse one). About 1 s per GiB here.
fn allocate_file(file: &File, path: &Path, size: u64) -> Result<(), DeviceError> {
    // SAFETY: plain syscall on a descriptor we own.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size as libc::off_t) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOSPC) {
            let _ = file.set_len(0);
            return Err(DeviceError::Io(std::io::Error::new(
                e.kind(),
                format!(
                    "{}: not enough free space for a {size}-byte data file",
                    path.display()
                ),
            )));
        }
        // No fallocate on this file system: a sparse file, zero-filled below.
        file.set_len(size)?;
    }
    tracing::info!(
        path = %path.display(),
        size_bytes = size,
        "zero-filling the new data file once"
    );
    const STEP: usize = 8 << 20;
    let zeros = AlignedBuf::new_zeroed(STEP);
    // Only whole 4096-byte units are ever addressed (and `O_DIRECT` needs them).
    let end = size - size % super::IO_ALIGN_BYTES as u64;
    let mut off = 0u64;
    while off < end {
        let len = STEP.min((end - off) as usize);
        let mut done = 0;
        while done < len {
            // SAFETY: writes from a live, 4096-aligned buffer of at least `len - done`
            // bytes at `done`; offsets and lengths stay multiples of 4096 unless a short
            // write splits one, which only buffered files allow.
            let n = unsafe {
                libc::pwrite(
                    file.as_raw_fd(),
                    zeros.as_slice()[done..].as_ptr().cast(),
                    len - done,
                    (off + done as u64) as libc::off_t,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e.into());
            }
            if n == 0 {
                return Err(DeviceError::Io(std::io::Error::other(
                    "zero-filling the data file made no progress",
                )));
            }
            done += n as usize;
        }
        off += len as u64;
    }
    file.sync_data()?;
    Ok(())
}

fn open_file(path: &Path, direct: bool, create: bool) -> Result<(File, bool), DeviceError> {
    let mut opts = OpenOptions::new();
    opts.read(true).write(true).create(create);
    if direct {
        let mut direct_opts = opts.clone();
        direct_opts.custom_flags(libc::O_DIRECT);
        match direct_opts.open(path) {
            Ok(f) => return Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(
                    path = %path.display(),
                    "filesystem refuses O_DIRECT; using buffered I/O with fdatasync"
                );
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok((opts.open(path)?, false))
}

fn block_device_geometry(file: &File) -> Result<(u64, u32), DeviceError> {
    use std::os::unix::io::AsRawFd;
    let fd = file.as_raw_fd();
    let mut size_bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points to a live local.
    let rc = unsafe { libc::ioctl(fd, BLKGETSIZE64, &mut size_bytes as *mut u64) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let mut sector: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which points to a live local.
    let rc = unsafe { libc::ioctl(fd, BLKSSZGET, &mut sector as *mut libc::c_int) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok((size_bytes, sector.clamp(512, 4096) as u32))
}

impl BlockDevice for FileDevice {
    fn sector_size_bytes(&self) -> u32 {
        self.sector_size_bytes
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity()
    }

    fn read_at(&self, offset_bytes: u64, buf: &mut AlignedBuf) -> Result<(), DeviceError> {
        check_access(offset_bytes, buf.len(), self.capacity())?;
        self.file.read_exact_at(buf.as_mut_slice(), offset_bytes)?;
        Ok(())
    }

    fn write_at(&self, offset_bytes: u64, buf: &AlignedBuf) -> Result<(), DeviceError> {
        check_access(offset_bytes, buf.len(), self.capacity())?;
        self.file.write_all_at(buf.as_slice(), offset_bytes)?;
        Ok(())
    }

    fn write_range_at(
        &self,
        offset_bytes: u64,
        buf: &AlignedBuf,
        range: Range<usize>,
    ) -> Result<(), DeviceError> {
        check_range(&range, buf.len())?;
        check_access(offset_bytes, range.len(), self.capacity())?;
        self.file
            .write_all_at(&buf.as_slice()[range], offset_bytes)?;
        Ok(())
    }

    fn read_range_at(
        &self,
        offset_bytes: u64,
        buf: &mut AlignedBuf,
        range: Range<usize>,
    ) -> Result<(), DeviceError> {
        check_range(&range, buf.len())?;
        check_access(offset_bytes, range.len(), self.capacity())?;
        self.file
            .read_exact_at(&mut buf.as_mut_slice()[range], offset_bytes)?;
        Ok(())
    }

    fn sync(&self) -> Result<(), DeviceError> {
        self.file.sync_data()?;
        Ok(())
    }

    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(std::os::fd::AsRawFd::as_raw_fd(&self.file))
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn can_grow(&self) -> bool {
        !self.is_block_device
    }

    fn reserve_to(&self, capacity_bytes: u64) -> Result<(), DeviceError> {
        if self.is_block_device {
            return Err(DeviceError::Io(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                format!("{}: a block device keeps its size", self.path.display()),
            )));
        }
        let len_before = self.file.metadata()?.len();
        if capacity_bytes <= len_before {
            return Ok(());
        }
        // Mode 0 from offset 0: allocates whatever is not yet allocated below
        // `capacity_bytes` and extends the file; the bytes read as zeros until written.
        match rustix::fs::fallocate(
            &self.file,
            rustix::fs::FallocateFlags::empty(),
            0,
            capacity_bytes,
        ) {
            Ok(()) => Ok(()),
            Err(e) if e == rustix::io::Errno::NOSPC => {
                // Give back what a partial allocation took beyond the addressable end.
                let _ = self.file.set_len(len_before.max(self.capacity()));
                Err(DeviceError::Io(std::io::Error::new(
                    std::io::ErrorKind::StorageFull,
                    format!(
                        "{}: not enough free space to grow to {capacity_bytes} bytes",
                        self.path.display()
                    ),
                )))
            }
            // No fallocate on this file system: extend it sparse; `grow_to` writes it.
            Err(e) if e == rustix::io::Errno::OPNOTSUPP => {
                self.file.set_len(capacity_bytes)?;
                Ok(())
            }
            Err(e) => Err(DeviceError::Io(e.into())),
        }
    }

    fn grow_to(&self, capacity_bytes: u64) -> Result<(), DeviceError> {
        let start = self.capacity();
        let end = capacity_bytes - capacity_bytes % super::IO_ALIGN_BYTES as u64;
        if end <= start {
            return Ok(());
        }
        if self.is_block_device {
            return self.reserve_to(capacity_bytes);
        }
        // The same zero-fill a new file gets (see `allocate_file`), over the new range only.
        const STEP_BYTES: usize = 8 << 20;
        let zeros = AlignedBuf::new_zeroed(STEP_BYTES);
        let mut off = start;
        while off < end {
            let len = STEP_BYTES.min((end - off) as usize);
            self.file.write_all_at(&zeros.as_slice()[..len], off)?;
            off += len as u64;
        }
        self.file.sync_data()?;
        self.capacity_bytes.store(end, Ordering::Release);
        Ok(())
    }

    fn free_space_bytes(&self) -> Option<u64> {
        if self.is_block_device {
            return None;
        }
        let st = rustix::fs::fstatvfs(&self.file).ok()?;
        Some(st.f_bavail.saturating_mul(st.f_frsize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("lavik-filedev-{}-{}", std::process::id(), name))
    }

    // Proves a created file gets the requested size and returns what was written, at an offset.
    #[test]
    fn create_write_read_round_trip() {
        let path = temp_path("rt");
        let _ = std::fs::remove_file(&path);
        let dev = FileDevice::open(&path, true, Some(1 << 20)).unwrap();
        assert_eq!(dev.capacity_bytes(), 1 << 20);
        let mut w = AlignedBuf::new_zeroed(8192);
        w.as_mut_slice()[..5].copy_from_slice(b"hello");
        w.as_mut_slice()[8191] = 9;
        dev.write_at(65536, &w).unwrap();
        dev.sync().unwrap();
        let mut r = AlignedBuf::new_zeroed(8192);
        dev.read_at(65536, &mut r).unwrap();
        assert_eq!(r.as_slice(), w.as_slice());
        assert!(dev.read_at(1 << 20, &mut r).is_err());
        let mut part = AlignedBuf::new_zeroed(12288);
        dev.read_range_at(65536, &mut part, 4096..12288).unwrap();
        assert_eq!(&part.as_slice()[4096..], w.as_slice());
        dev.write_range_at(0, &part, 8192..12288).unwrap();
        dev.read_at(0, &mut r).unwrap();
        assert_eq!(&r.as_slice()[..4096], &w.as_slice()[4096..]);
        drop(dev);
        std::fs::remove_file(&path).unwrap();
    }

    // Proves a device asked for O_DIRECT works on tmpfs, whether the kernel grants O_DIRECT
    // there (Linux >= 6.6) or the open falls back to buffered I/O.
    #[test]
    fn direct_io_request_works_on_tmpfs() {
        let dir = Path::new("/dev/shm");
        if !dir.is_dir() {
            return;
        }
        let path = dir.join(format!("lavik-filedev-{}-shm", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let dev = FileDevice::open(&path, true, Some(1 << 20)).unwrap();
        let mut w = AlignedBuf::new_zeroed(4096);
        w.as_mut_slice()[0] = 42;
        dev.write_at(4096, &w).unwrap();
        dev.sync().unwrap();
        let mut r = AlignedBuf::new_zeroed(4096);
        dev.read_at(4096, &mut r).unwrap();
        assert_eq!(r.as_slice()[0], 42);
        drop(dev);
        std::fs::remove_file(&path).unwrap();
    }

    // Proves a file grows in two steps (reserve, then zero-fill) and keeps its old bytes;
    // reads beyond the capacity fail until the zero-fill makes the range addressable.
    #[test]
    fn regular_file_grows_and_keeps_its_data() {
        let path = temp_path("grow");
        let _ = std::fs::remove_file(&path);
        let dev = FileDevice::open(&path, true, Some(1 << 20)).unwrap();
        assert!(dev.can_grow());
        assert!(dev.free_space_bytes().unwrap() > 0);
        let mut w = AlignedBuf::new_zeroed(4096);
        w.as_mut_slice()[0] = 7;
        dev.write_at(4096, &w).unwrap();
        dev.reserve_to(3 << 20).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 3 << 20);
        assert_eq!(dev.capacity_bytes(), 1 << 20);
        let mut r = AlignedBuf::new_zeroed(4096);
        assert!(dev.read_at(2 << 20, &mut r).is_err());
        dev.grow_to(3 << 20).unwrap();
        assert_eq!(dev.capacity_bytes(), 3 << 20);
        dev.read_at((3 << 20) - 4096, &mut r).unwrap();
        assert!(r.as_slice().iter().all(|&b| b == 0));
        dev.write_at(2 << 20, &w).unwrap();
        dev.read_at(4096, &mut r).unwrap();
        assert_eq!(r.as_slice()[0], 7);
        drop(dev);
        // Reopened, the grown file is its new size.
        let dev = FileDevice::open(&path, true, Some(1 << 20)).unwrap();
        assert_eq!(dev.capacity_bytes(), 3 << 20);
        drop(dev);
        std::fs::remove_file(&path).unwrap();
    }

    // Proves a reservation larger than the file system can hold is refused with a clear
    // error and leaves the file as it was.
    #[test]
    fn reservation_beyond_free_space_is_refused() {
        let path = temp_path("nospace");
        let _ = std::fs::remove_file(&path);
        let dev = FileDevice::open(&path, false, Some(1 << 20)).unwrap();
        let huge = dev.free_space_bytes().unwrap() + (1 << 40);
        match dev.reserve_to(huge) {
            // A file system without fallocate extends sparse files instead (no reservation).
            Ok(()) => {}
            Err(e) => {
                assert!(e.to_string().contains("not enough free space"), "{e}");
                assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 20);
            }
        }
        assert_eq!(dev.capacity_bytes(), 1 << 20);
        drop(dev);
        std::fs::remove_file(&path).unwrap();
    }

    // Proves a missing file without a create size is an error, not a silent creation.
    #[test]
    fn missing_file_without_create_is_refused() {
        let path = temp_path("missing");
        let _ = std::fs::remove_file(&path);
        assert!(FileDevice::open(&path, false, None).is_err());
        assert!(!path.exists());
    }
}
