//! Controller bring-up, admin commands, I/O queue pairs, reset and shutdown.
//!
//! Bring-up follows §7.6.1 (controller initialization): disable and wait for CSTS.RDY=0,
//! program the admin queues (AQA/ASQ/ACQ), write CC with EN=1 and wait for RDY=1 bounded
//! by CAP.TO, Identify Controller, Set Features / Number of Queues, then create I/O
//! completion and submission queues. Shutdown follows §7.6.2 (CC.SHN = normal, wait for
//! CSTS.SHST = complete). After a fatal status (CSTS.CFS), a protocol violation or a
//! timeout, `reset` disables the controller — which aborts every outstanding command and
//! releases all host memory it owned — and redoes the bring-up, recreating the I/O queues
//! in place.
//!
//! No interrupts are used: queues are created with IEN=0 and completions are polled.
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::queue::{
    build_prps, CommandError, CommandId, QueueMemory, QueuePair, SubmitError, PAGE_SIZE_BYTES,
    PRP_LIST_ENTRIES_PER_PAGE,
};
use super::spec::{
    self, admin_queue_attributes, reg, AdminOpcode, Capabilities, CompletionEntry,
    ControllerConfig, ControllerStatus, IdentifyCns, IdentifyController, IdentifyNamespace,
    NvmOpcode, ShutdownNotification, ShutdownStatus, SubmissionEntry, Version,
};
use super::vfio::{
    dma_read_barrier_after_phase, dma_write_barrier_before_doorbell, Bar0, DmaBacking, DmaBuffer,
    VfioDevice,
};
use super::NvmeError;

/// Admin queue size (entries).
pub const ADMIN_QUEUE_ENTRIES: u16 = 32;
/// Deadline for one admin command.
pub const ADMIN_TIMEOUT_MS: u64 = 10_000;
/// Deadline for the shutdown handshake when the controller gives no hint.
pub const SHUTDOWN_TIMEOUT_MS: u64 = 10_000;
/// How often waiting loops re-check CSTS for a fatal status.
const STATUS_CHECK_INTERVAL: Duration = Duration::from_millis(1);

/// Monotonic nanoseconds since the first call: the `now` the sans-IO queue needs.
pub fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Ring memory of one queue pair in DMA buffers.
struct DmaRings {
    sq: DmaBuffer,
    cq: DmaBuffer,
}

impl QueueMemory for DmaRings {
    fn write_submission(&mut self, index: u16, entry: &SubmissionEntry) {
        self.sq.write_volatile(
            index as usize * std::mem::size_of::<SubmissionEntry>(),
            *entry,
        );
    }
    fn read_completion(&self, index: u16) -> CompletionEntry {
        let base = index as usize * std::mem::size_of::<CompletionEntry>();
        let dw3: u32 = self.cq.read_volatile(base + 12);
        dma_read_barrier_after_phase();
        CompletionEntry {
            dw0: self.cq.read_volatile(base),
            dw1: self.cq.read_volatile(base + 4),
            dw2: self.cq.read_volatile(base + 8),
            dw3,
        }
    }
}

/// A queue pair bound to hardware: sans-IO state + DMA rings + doorbell offsets.
struct HwQueue {
    qp: QueuePair,
    rings: DmaRings,
    bar: Arc<Bar0>,
    sq_doorbell: usize,
    cq_doorbell: usize,
}

impl HwQueue {
    fn new(
        vfio: &VfioDevice,
        bar: Arc<Bar0>,
        qid: u16,
        entries: u16,
        stride: usize,
        backing: DmaBacking,
    ) -> Result<HwQueue, NvmeError> {
        let cq_doorbell = spec::cq_head_doorbell_offset(qid, stride);
        if cq_doorbell + 4 > bar.len() {
            return Err(NvmeError::Unsupported(format!(
                "doorbells of queue {qid} (stride {stride}) lie outside BAR0 ({} bytes)",
                bar.len()
            )));
        }
        let sq = vfio.container.alloc_dma(entries as usize * 64, backing)?;
        let cq = vfio.container.alloc_dma(entries as usize * 16, backing)?;
        Ok(HwQueue {
            qp: QueuePair::new(qid, entries, entries, entries - 1),
            rings: DmaRings { sq, cq },
            bar,
            sq_doorbell: spec::sq_tail_doorbell_offset(qid, stride),
            cq_doorbell,
        })
    }

    fn ring_sq(&mut self) {
        if let Some(tail) = self.qp.take_sq_doorbell() {
            dma_write_barrier_before_doorbell();
            self.bar.write32(self.sq_doorbell, tail as u32);
        }
    }

    fn poll(
        &mut self,
        max: usize,
        f: impl FnMut(super::queue::Completion),
    ) -> Result<usize, super::queue::ProtocolViolation> {
        let r = self.qp.poll(&self.rings, max, f);
        if let Some(head) = self.qp.take_cq_doorbell() {
            self.bar.write32(self.cq_doorbell, head as u32);
        }
        r
    }

    /// Back to the power-on ring state; only after the controller was disabled.
    fn reset_after_disable(&mut self) -> Vec<CommandId> {
        self.rings.sq.as_mut_slice().fill(0);
        self.rings.cq.as_mut_slice().fill(0);
        self.qp.reset()
    }
}

/// Bring-up options.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// I/O queue pairs to request (one per worker).
    pub io_queue_pairs: u16,
    /// Entries per I/O queue (clamped to CAP.MQES).
    pub io_queue_entries: u16,
    pub dma_backing: DmaBacking,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            io_queue_pairs: 1,
            io_queue_entries: 64,
            dma_backing: DmaBacking::Hugepages,
        }
    }
}

/// Namespace facts from Identify Namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub nsid: u32,
    pub block_size_bytes: u32,
    pub block_count: u64,
}

/// An initialised controller with its admin queue.
pub struct Controller {
    bar: Arc<Bar0>,
    pub capabilities: Capabilities,
    pub version: Version,
    pub identify: IdentifyController,
    admin: HwQueue,
    scratch: DmaBuffer,
    options: ControllerOptions,
    io_queue_pairs_allocated: u16,
    /// Declared last so it drops last: closing the group detaches the container's IOMMU,
    /// after which the DMA buffers above could no longer be unmapped (EINVAL, leaked).
    vfio: VfioDevice,
}

/// Buffers and tags of the commands one queue had outstanding at a reset.
pub type LostCommands = Vec<(Option<DmaBuffer>, u64)>;

/// What an I/O command does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoOp {
    Read,
    Write,
    Flush,
}

/// A completed I/O command with its buffer handed back.
pub struct IoCompletion {
    pub cid: CommandId,
    pub result: Result<u32, CommandError>,
    pub after_timeout: bool,
    pub buffer: Option<DmaBuffer>,
    /// The `tag` passed at submission.
    pub tag: u64,
}

/// One I/O queue pair. Buffers handed to `submit` are owned by the in-flight slot until
/// their completion returns them (or `Controller::reset` does, once the device is off).
pub struct IoQueue {
    hw: HwQueue,
    prp_lists: DmaBuffer,
    in_flight: Vec<Option<(Option<DmaBuffer>, u64)>>,
    pub namespace: NamespaceInfo,
    max_transfer_bytes: usize,
}

impl Controller {
    /// Opens the PCI function through VFIO and brings the controller up (§7.6.1).
    pub fn open(vfio: VfioDevice, options: ControllerOptions) -> Result<Controller, NvmeError> {
        let bar = Arc::new(vfio.map_bar0()?);
        let capabilities = Capabilities(bar.read64(reg::CAP));
        let version = Version(bar.read32(reg::VS));
        if !capabilities.supports_nvm_command_set() {
            return Err(NvmeError::Unsupported(
                "controller lacks the NVM command set".into(),
            ));
        }
        if capabilities.min_page_size_bytes() > PAGE_SIZE_BYTES as u64 {
            return Err(NvmeError::Unsupported(format!(
                "controller minimum page size {} > 4096",
                capabilities.min_page_size_bytes()
            )));
        }
        if capabilities.max_queue_entries() < 2 {
            return Err(NvmeError::Unsupported(
                "CAP.MQES allows fewer than 2 queue entries".into(),
            ));
        }
        let stride = capabilities.doorbell_stride_bytes();
        let admin_entries =
            ADMIN_QUEUE_ENTRIES.min(capabilities.max_queue_entries().min(4096) as u16);
        let admin = HwQueue::new(
            &vfio,
            bar.clone(),
            0,
            admin_entries,
            stride,
            options.dma_backing,
        )?;
        let scratch = vfio
            .container
            .alloc_dma(PAGE_SIZE_BYTES, DmaBacking::Locked4k)?;
        let placeholder = IdentifyController::parse(&[0u8; 4096]).expect("4096 bytes");
        let mut c = Controller {
            vfio,
            bar,
            capabilities,
            version,
            identify: placeholder,
            admin,
            scratch,
            options,
            io_queue_pairs_allocated: 0,
        };
        c.bring_up()?;
        Ok(c)
    }

    fn bring_up(&mut self) -> Result<(), NvmeError> {
        self.disable()?;
        self.admin.reset_after_disable();
        let entries = self.admin.qp.capacity() as u16 + 1;
        self.bar
            .write32(reg::AQA, admin_queue_attributes(entries, entries));
        self.bar.write64(reg::ASQ, self.admin.rings.sq.iova());
        self.bar.write64(reg::ACQ, self.admin.rings.cq.iova());
        let cc = ControllerConfig::default()
            .with_command_set(0)
            .with_page_size_shift(0)
            .with_arbitration(0)
            .with_io_sq_entry_size_shift(spec::SUBMISSION_ENTRY_SIZE_SHIFT)
            .with_io_cq_entry_size_shift(spec::COMPLETION_ENTRY_SIZE_SHIFT);
        enable_controller(&*self.bar, cc, self.ready_limit_ms())?;
        self.identify = self.identify_controller()?;
        let want = self.options.io_queue_pairs.max(1);
        let dw0 = self.admin_command(spec::set_number_of_queues_command(want, want), false)?;
        let (sq, cq) = spec::number_of_queues_allocated(dw0);
        self.io_queue_pairs_allocated = sq.min(cq).min(want as u32) as u16;
        tracing::info!(
            "nvme {}: {} {} fw {} NVMe {}.{}, {} I/O queue pairs",
            self.vfio.address,
            self.identify.model(),
            self.identify.serial(),
            self.identify.firmware(),
            self.version.major(),
            self.version.minor(),
            self.io_queue_pairs_allocated
        );
        Ok(())
    }

    /// DMA memory mapped for this controller (data buffers for `IoQueue::submit`).
    pub fn alloc_dma(&self, len_bytes: usize, backing: DmaBacking) -> Result<DmaBuffer, NvmeError> {
        Ok(self.vfio.container.alloc_dma(len_bytes, backing)?)
    }

    pub fn address(&self) -> super::vfio::PciAddress {
        self.vfio.address
    }
    pub fn io_queue_pairs_allocated(&self) -> u16 {
        self.io_queue_pairs_allocated
    }
    /// The register window, for status polling without holding the controller.
    pub fn registers(&self) -> Arc<Bar0> {
        self.bar.clone()
    }
    pub fn status(&self) -> ControllerStatus {
        ControllerStatus(self.bar.read32(reg::CSTS))
    }

    /// Clears CC.EN and waits for CSTS.RDY = 0 (bounded by CAP.TO).
    fn disable(&mut self) -> Result<(), NvmeError> {
        disable_controller(&*self.bar, self.ready_limit_ms())
    }

    fn ready_limit_ms(&self) -> u64 {
        self.capabilities
            .ready_timeout_ms()
            .max(READY_TIMEOUT_MIN_MS)
    }

    /// Runs one admin command to completion; `with_scratch` points PRP1 at the 4 KiB scratch
    /// page (Identify). Returns completion DW0.
    fn admin_command(
        &mut self,
        mut cmd: SubmissionEntry,
        with_scratch: bool,
    ) -> Result<u32, NvmeError> {
        if with_scratch {
            cmd.prp1 = self.scratch.iova();
        }
        let opcode = cmd.opcode();
        let deadline = now_ns() + ADMIN_TIMEOUT_MS * 1_000_000;
        let cid = self.admin.qp.submit(&mut self.admin.rings, cmd, deadline)?;
        self.admin.ring_sq();
        let mut last_status_check = Instant::now();
        loop {
            let mut result = None;
            self.admin.poll(1, |c| {
                if c.cid == cid {
                    result = Some(c.result);
                }
            })?;
            if let Some(r) = result {
                return r.map_err(|source| NvmeError::Command { opcode, source });
            }
            if self.admin.qp.expire(now_ns(), |_| {}) > 0 {
                return Err(NvmeError::Timeout {
                    opcode,
                    timeout_ms: ADMIN_TIMEOUT_MS,
                });
            }
            if last_status_check.elapsed() >= STATUS_CHECK_INTERVAL {
                last_status_check = Instant::now();
                if self.status().fatal() {
                    return Err(NvmeError::ControllerFatal);
                }
            }
            std::hint::spin_loop();
        }
    }

    fn identify_controller(&mut self) -> Result<IdentifyController, NvmeError> {
        self.admin_command(spec::identify_command(IdentifyCns::Controller, 0), true)?;
        IdentifyController::parse(self.scratch.as_slice())
            .ok_or_else(|| NvmeError::Invalid("short identify".into()))
    }

    /// Identify Namespace `nsid` (§5.15.2.1).
    pub fn identify_namespace(&mut self, nsid: u32) -> Result<NamespaceInfo, NvmeError> {
        if nsid == 0 || nsid > self.identify.nn {
            return Err(NvmeError::Invalid(format!(
                "namespace {nsid} not in 1..={}",
                self.identify.nn
            )));
        }
        self.admin_command(spec::identify_command(IdentifyCns::Namespace, nsid), true)?;
        let ns = IdentifyNamespace::parse(self.scratch.as_slice())
            .ok_or_else(|| NvmeError::Invalid("short identify".into()))?;
        if ns.nsze == 0 {
            return Err(NvmeError::Invalid(format!("namespace {nsid} is inactive")));
        }
        if ns.has_metadata() {
            return Err(NvmeError::Unsupported(format!(
                "namespace {nsid} is formatted with per-block metadata"
            )));
        }
        let block_size_bytes = ns.block_size_bytes().ok_or_else(|| {
            NvmeError::Unsupported(format!("namespace {nsid}: unusable LBA format"))
        })?;
        Ok(NamespaceInfo {
            nsid,
            block_size_bytes,
            block_count: ns.nsze,
        })
    }

    /// Largest transfer one command may carry: MDTS, the PRP list limit, at least a page.
    pub fn max_transfer_bytes(&self) -> usize {
        let mdts = self
            .identify
            .max_transfer_bytes(self.capabilities.min_page_size_bytes());
        let prp_limit = super::queue::MAX_TRANSFER_BYTES;
        mdts.map_or(prp_limit, |m| (m as usize).min(prp_limit))
            .max(PAGE_SIZE_BYTES)
    }

    /// Creates I/O queue pair `qid` (1-based, ≤ allocated) for namespace `ns` (§5.3, §5.4).
    pub fn create_io_queue(&mut self, qid: u16, ns: NamespaceInfo) -> Result<IoQueue, NvmeError> {
        if qid == 0 || qid > self.io_queue_pairs_allocated {
            return Err(NvmeError::Invalid(format!(
                "I/O queue {qid} not in 1..={}",
                self.io_queue_pairs_allocated
            )));
        }
        let entries = self
            .options
            .io_queue_entries
            .clamp(2, self.capabilities.max_queue_entries().min(4096) as u16);
        let stride = self.capabilities.doorbell_stride_bytes();
        let hw = HwQueue::new(
            &self.vfio,
            self.bar.clone(),
            qid,
            entries,
            stride,
            self.options.dma_backing,
        )?;
        let capacity = hw.qp.capacity();
        let prp_lists = self
            .vfio
            .container
            .alloc_dma(capacity * PAGE_SIZE_BYTES, self.options.dma_backing)?;
        let mut q = IoQueue {
            hw,
            prp_lists,
            in_flight: (0..capacity).map(|_| None).collect(),
            namespace: ns,
            max_transfer_bytes: self.max_transfer_bytes(),
        };
        self.register_io_queue(&mut q)?;
        Ok(q)
    }

    fn register_io_queue(&mut self, q: &mut IoQueue) -> Result<(), NvmeError> {
        let qid = q.hw.qp.qid();
        let entries = q.hw.qp.capacity() as u16 + 1;
        self.admin_command(
            spec::create_io_cq_command(qid, entries, q.hw.rings.cq.iova()),
            false,
        )?;
        self.admin_command(
            spec::create_io_sq_command(qid, entries, q.hw.rings.sq.iova(), qid),
            false,
        )?;
        Ok(())
    }

    /// Controller reset: disable (aborting everything), redo bring-up, recreate `queues`.
    /// Returns, per queue in the order given, the buffers and tags of the commands that
    /// were outstanding: the device no longer owns them.
    pub fn reset(&mut self, queues: &mut [&mut IoQueue]) -> Result<Vec<LostCommands>, NvmeError> {
        tracing::warn!(
            "nvme {}: controller reset (CSTS {:#x})",
            self.vfio.address,
            self.status().0
        );
        // If the controller does not acknowledge the disable, every buffer stays owned by
        // its queue (it may still be written); the error goes up.
        self.disable()?;
        let mut lost = Vec::with_capacity(queues.len());
        for q in queues.iter_mut() {
            q.hw.reset_after_disable();
            lost.push(q.in_flight.iter_mut().filter_map(Option::take).collect());
        }
        self.bring_up()?;
        for q in queues.iter_mut() {
            self.register_io_queue(q)?;
        }
        Ok(lost)
    }

    /// Deletes an I/O queue pair on the controller (SQ first, §5.6, then CQ, §5.5).
    /// Deleting the SQ aborts its outstanding commands, so its ring and buffer memory
    /// may be released afterwards. On failure the queue is handed back (not freed).
    pub fn delete_io_queue(&mut self, q: IoQueue) -> Result<(), Box<(NvmeError, IoQueue)>> {
        let qid = q.hw.qp.qid();
        let sq = spec::delete_io_queue_command(AdminOpcode::DeleteIoSq, qid);
        let cq = spec::delete_io_queue_command(AdminOpcode::DeleteIoCq, qid);
        match self
            .admin_command(sq, false)
            .and_then(|_| self.admin_command(cq, false))
        {
            Ok(_) => Ok(()),
            Err(e) => Err(Box::new((e, q))),
        }
    }

    /// Normal shutdown (§7.6.2): delete I/O queues, CC.SHN = 01b, wait SHST = complete.
    /// Memory of queues that could not be deleted is released only after that.
    pub fn shutdown(mut self, queues: Vec<IoQueue>) -> Result<(), NvmeError> {
        let mut kept = Vec::new();
        for q in queues {
            if let Err(failed) = self.delete_io_queue(q) {
                let (e, q) = *failed;
                tracing::warn!(
                    "nvme {}: deleting I/O queue {}: {e}",
                    self.vfio.address,
                    q.qid()
                );
                kept.push(q);
            }
        }
        let cc = ControllerConfig(self.bar.read32(reg::CC));
        self.bar.write32(
            reg::CC,
            cc.with_shutdown_notification(ShutdownNotification::Normal)
                .0,
        );
        let start = Instant::now();
        let limit_ms = match self.identify.rtd3e {
            0 => SHUTDOWN_TIMEOUT_MS,
            us => (us as u64 / 1000).max(1000),
        };
        loop {
            if self.status().shutdown_status() == ShutdownStatus::Complete {
                break;
            }
            if start.elapsed().as_millis() as u64 > limit_ms {
                return Err(NvmeError::ReadyTimeout {
                    waited_ms: limit_ms,
                    want: false,
                });
            }
            std::thread::sleep(STATUS_CHECK_INTERVAL);
        }
        drop(kept);
        Ok(())
    }
}

/// Register access the bring-up steps need; `Bar0` on hardware, a fake in tests.
pub trait RegisterFile {
    fn read32(&self, offset: usize) -> u32;
    fn write32(&self, offset: usize, value: u32);
}

impl RegisterFile for Bar0 {
    fn read32(&self, offset: usize) -> u32 {
        Bar0::read32(self, offset)
    }
    fn write32(&self, offset: usize, value: u32) {
        Bar0::write32(self, offset, value)
    }
}

/// Floor on the ready wait when CAP.TO reads 0.
const READY_TIMEOUT_MIN_MS: u64 = 500;

/// Waits until CSTS.RDY equals `want`, at most `limit_ms`. A fatal status while waiting
/// for ready, or all-ones reads (device gone), end the wait with an error.
fn wait_ready(regs: &impl RegisterFile, want: bool, limit_ms: u64) -> Result<(), NvmeError> {
    let start = Instant::now();
    loop {
        let csts = ControllerStatus(regs.read32(reg::CSTS));
        if csts.is_all_ones() {
            return Err(NvmeError::Unsupported(
                "controller reads all ones: device gone".into(),
            ));
        }
        if csts.ready() == want {
            return Ok(());
        }
        if want && csts.fatal() {
            return Err(NvmeError::ControllerFatal);
        }
        let waited_ms = start.elapsed().as_millis() as u64;
        if waited_ms > limit_ms {
            return Err(NvmeError::ReadyTimeout { waited_ms, want });
        }
        std::thread::sleep(STATUS_CHECK_INTERVAL);
    }
}

/// Disables the controller (§7.6.1 step 1): clear CC.EN, wait for CSTS.RDY = 0.
fn disable_controller(regs: &impl RegisterFile, limit_ms: u64) -> Result<(), NvmeError> {
    let cc = ControllerConfig(regs.read32(reg::CC));
    let csts = ControllerStatus(regs.read32(reg::CSTS));
    if cc.enabled() && !csts.ready() && !csts.fatal() {
        // An EN 1 → 0 change while RDY is still 0 has undefined results; let the earlier
        // enable finish first (a fatal controller never gets there, so skip it then).
        wait_ready(regs, true, limit_ms)?;
    }
    regs.write32(reg::CC, cc.with_enabled(false).0);
    wait_ready(regs, false, limit_ms)
}

/// Enables the controller with configuration `cc` (§7.6.1 step 4): the fields are written
/// with EN = 0 first, then EN = 1, then CSTS.RDY = 1 is awaited.
fn enable_controller(
    regs: &impl RegisterFile,
    cc: ControllerConfig,
    limit_ms: u64,
) -> Result<(), NvmeError> {
    regs.write32(reg::CC, cc.with_enabled(false).0);
    regs.write32(reg::CC, cc.with_enabled(true).0);
    wait_ready(regs, true, limit_ms)
}

impl IoQueue {
    pub fn qid(&self) -> u16 {
        self.hw.qp.qid()
    }
    /// Commands the queue can hold in flight.
    pub fn capacity(&self) -> usize {
        self.hw.qp.capacity()
    }
    pub fn in_flight(&self) -> usize {
        self.hw.qp.in_flight()
    }
    pub fn max_transfer_bytes(&self) -> usize {
        self.max_transfer_bytes
    }

    /// Queues a command (not yet visible to the device: call `ring`). For Read/Write,
    /// `buffer` must hold at least `blocks × block size` bytes; it is handed back in the
    /// completion. On refusal the buffer comes back with the error.
    pub fn submit(
        &mut self,
        op: IoOp,
        start_lba: u64,
        blocks: u32,
        buffer: Option<DmaBuffer>,
        tag: u64,
        deadline_ns: u64,
    ) -> Result<CommandId, (NvmeError, Option<DmaBuffer>)> {
        let ns = self.namespace;
        let mut cmd = match op {
            IoOp::Flush => spec::flush_command(ns.nsid),
            IoOp::Read | IoOp::Write => {
                let len = blocks as usize * ns.block_size_bytes as usize;
                let fits = buffer.as_ref().is_some_and(|b| b.len() >= len);
                let in_range = start_lba
                    .checked_add(blocks as u64)
                    .is_some_and(|end| end <= ns.block_count);
                if blocks == 0 || !fits || len > self.max_transfer_bytes || !in_range {
                    let why = format!("bad I/O: lba {start_lba} + {blocks} blocks, buffer fits {fits}, max {} bytes", self.max_transfer_bytes);
                    return Err((NvmeError::Invalid(why), buffer));
                }
                let opcode = if op == IoOp::Read {
                    NvmOpcode::Read
                } else {
                    NvmOpcode::Write
                };
                spec::read_write_command(opcode, ns.nsid, start_lba, blocks)
            }
        };
        let Some(next) = self.hw.qp.next_command_id() else {
            return Err((NvmeError::Submit(SubmitError::Full), buffer));
        };
        if let (Some(buf), IoOp::Read | IoOp::Write) = (&buffer, op) {
            let len = blocks as usize * ns.block_size_bytes as usize;
            let list_offset = next.0 as usize * PAGE_SIZE_BYTES;
            let list_iova = self.prp_lists.iova() + list_offset as u64;
            let mut entries = [0u64; PRP_LIST_ENTRIES_PER_PAGE];
            let prps = build_prps(buf.iova(), len, Some((list_iova, &mut entries)))
                .map_err(|e| NvmeError::Invalid(e.to_string()));
            let prps = match prps {
                Ok(p) => p,
                Err(e) => return Err((e, buffer)),
            };
            for (i, e) in entries.iter().take(prps.list_entries).enumerate() {
                self.prp_lists.write_volatile(list_offset + i * 8, *e);
            }
            cmd.prp1 = prps.prp1;
            cmd.prp2 = prps.prp2;
        }
        match self.hw.qp.submit(&mut self.hw.rings, cmd, deadline_ns) {
            Ok(cid) => {
                debug_assert_eq!(cid, next);
                self.in_flight[cid.0 as usize] = Some((buffer, tag));
                Ok(cid)
            }
            Err(e) => Err((NvmeError::Submit(e), buffer)),
        }
    }

    /// Makes every queued command visible to the device (one doorbell write).
    pub fn ring(&mut self) {
        self.hw.ring_sq();
    }

    /// Reaps up to `max` completions. A protocol violation means: reset the controller.
    pub fn poll(
        &mut self,
        max: usize,
        mut f: impl FnMut(IoCompletion),
    ) -> Result<usize, NvmeError> {
        let in_flight = &mut self.in_flight;
        let n = self.hw.poll(max, |c| {
            let (buffer, tag) = in_flight[c.cid.0 as usize].take().unwrap_or((None, 0));
            f(IoCompletion {
                cid: c.cid,
                result: c.result,
                after_timeout: c.after_timeout,
                buffer,
                tag,
            });
        })?;
        Ok(n)
    }

    /// Reports commands past their deadline (their buffers stay owned by the queue).
    pub fn expire(&mut self, now_ns: u64, f: impl FnMut(CommandId)) -> usize {
        self.hw.qp.expire(now_ns, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};

    /// A register file whose CSTS reacts to CC.EN after `latency_reads` CSTS reads,
    /// or misbehaves as configured.
    #[derive(Default)]
    struct FakeRegs {
        cc: Cell<u32>,
        rdy: Cell<bool>,
        fatal_on_enable: bool,
        never_ready: bool,
        all_ones: bool,
        latency_reads: u32,
        pending_reads: Cell<u32>,
        writes: RefCell<Vec<u32>>,
        rdy_when_written: RefCell<Vec<bool>>,
    }

    impl RegisterFile for FakeRegs {
        fn read32(&self, offset: usize) -> u32 {
            match offset {
                reg::CC => self.cc.get(),
                reg::CSTS if self.all_ones => u32::MAX,
                reg::CSTS => {
                    let en = ControllerConfig(self.cc.get()).enabled();
                    if en != self.rdy.get() && !(en && self.never_ready) {
                        if self.pending_reads.get() == 0 {
                            self.rdy.set(en);
                        } else {
                            self.pending_reads.set(self.pending_reads.get() - 1);
                        }
                    }
                    let fatal = self.fatal_on_enable && en;
                    self.rdy.get() as u32 | (fatal as u32) << 1
                }
                _ => 0,
            }
        }
        fn write32(&self, offset: usize, value: u32) {
            assert_eq!(offset, reg::CC, "bring-up steps only write CC");
            self.writes.borrow_mut().push(value);
            self.rdy_when_written.borrow_mut().push(self.rdy.get());
            self.cc.set(value);
            self.pending_reads.set(self.latency_reads);
        }
    }

    // Proves disable clears EN and returns once RDY drops, after a few polls.
    #[test]
    fn disable_waits_for_not_ready() {
        let regs = FakeRegs {
            latency_reads: 3,
            ..Default::default()
        };
        regs.cc.set(1);
        regs.rdy.set(true);
        disable_controller(&regs, 500).unwrap();
        assert_eq!(*regs.writes.borrow(), vec![0]);
        assert!(!regs.rdy.get());
    }

    // Proves disable during an unfinished enable (EN=1, RDY=0) first waits for RDY=1
    // (no EN 1→0 edge while RDY=0), then disables.
    #[test]
    fn disable_lets_pending_enable_finish() {
        let regs = FakeRegs {
            latency_reads: 2,
            ..Default::default()
        };
        regs.cc.set(1);
        regs.pending_reads.set(2);
        disable_controller(&regs, 500).unwrap();
        assert_eq!(*regs.writes.borrow(), vec![0]);
        assert_eq!(
            *regs.rdy_when_written.borrow(),
            vec![true],
            "EN cleared only once RDY=1"
        );
        assert!(!regs.rdy.get());
    }

    // Proves enable writes the configuration with EN=0 then EN=1 and waits for RDY.
    #[test]
    fn enable_writes_config_then_en() {
        let regs = FakeRegs {
            latency_reads: 2,
            ..Default::default()
        };
        let cc = ControllerConfig::default()
            .with_io_sq_entry_size_shift(6)
            .with_io_cq_entry_size_shift(4);
        enable_controller(&regs, cc, 500).unwrap();
        assert_eq!(*regs.writes.borrow(), vec![0x0046_0000, 0x0046_0001]);
        assert!(regs.rdy.get());
    }

    // Proves a controller that never becomes ready is given up on after the CAP.TO bound.
    #[test]
    fn enable_times_out_on_never_ready() {
        let regs = FakeRegs {
            never_ready: true,
            ..Default::default()
        };
        let start = Instant::now();
        let err = enable_controller(&regs, ControllerConfig::default(), 60).unwrap_err();
        assert!(
            matches!(err, NvmeError::ReadyTimeout { want: true, .. }),
            "{err}"
        );
        assert!(start.elapsed() >= Duration::from_millis(60));
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    // Proves CSTS.CFS during enable ends the wait with ControllerFatal at once.
    #[test]
    fn enable_reports_fatal_status() {
        let regs = FakeRegs {
            fatal_on_enable: true,
            never_ready: true,
            ..Default::default()
        };
        let err = enable_controller(&regs, ControllerConfig::default(), 10_000).unwrap_err();
        assert!(matches!(err, NvmeError::ControllerFatal), "{err}");
    }

    // Proves all-ones register reads (surprise removal) are an error, not a hang.
    #[test]
    fn all_ones_means_device_gone() {
        let regs = FakeRegs {
            all_ones: true,
            ..Default::default()
        };
        let err = disable_controller(&regs, 10_000).unwrap_err();
        assert!(matches!(err, NvmeError::Unsupported(_)), "{err}");
    }
}
