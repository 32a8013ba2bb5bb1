//! Sans-IO queue pair logic: submission ring tail, completion ring head and phase,
//! command-id allocation with an in-flight table, per-command deadlines, PRP construction
//! and status-to-error mapping.
//!
//! Nothing here touches MMIO or DMA memory directly. Ring memory is reached through the
//! [`QueueMemory`] trait (DMA memory with volatile access on hardware, a `Vec` in tests),
//! doorbell values are *returned* to the caller, and time is passed in as `now_ns`. That is
//! what lets the tests drive it with a simulated — and hostile — controller.
//!
//! Invariants:
//! - at most `sq_entries - 1` commands are in flight (one ring slot stays empty so a full
//!   ring is distinguishable from an empty one), so writing at the tail never overwrites an
//!   entry the controller has not fetched yet;
//! - a command id is reused only after its completion was consumed or the queue was reset:
//!   a timed-out command keeps its id (and, in the driver, its DMA buffer), because the
//!   controller may still write to that memory until it completes or is reset;
//! - any completion that breaks the protocol (unknown id, second completion, wrong queue,
//!   impossible SQ head) poisons the queue; only `reset()` — after a controller reset —
//!   clears it. The driver never guesses which command such an entry belonged to.
use super::spec::{
    CompletionEntry, GenericStatus, MediaStatus, Status, StatusCode, SubmissionEntry,
};

/// Host memory page size used for PRPs and queues (CC.MPS = 0).
pub const PAGE_SIZE_BYTES: usize = 4096;
/// PRP entries in one PRP list page.
pub const PRP_LIST_ENTRIES_PER_PAGE: usize = PAGE_SIZE_BYTES / 8;
/// Largest transfer one command carries: PRP1 plus one PRP list page (no list chaining).
pub const MAX_TRANSFER_BYTES: usize = PRP_LIST_ENTRIES_PER_PAGE * PAGE_SIZE_BYTES;
/// Most entries a queue may have here (one page of 16-byte completions would be 256;
/// we allow multi-page contiguous rings up to this).
pub const QUEUE_ENTRIES_MAX: u16 = 4096;
const _: () = assert!(MAX_TRANSFER_BYTES == 2 * 1024 * 1024);

/// A command identifier (CID) on one queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CommandId(pub u16);

/// Access to the rings' memory. On hardware this is DMA memory read with volatile loads.
pub trait QueueMemory {
    /// Stores a submission entry at ring slot `index`.
    fn write_submission(&mut self, index: u16, entry: &SubmissionEntry);
    /// Loads the completion entry at ring slot `index`. Implementations must read the
    /// phase/status dword before the rest, with a read barrier in between, so a
    /// half-written entry is never taken as posted.
    fn read_completion(&self, index: u16) -> CompletionEntry;
}

/// A completion the queue could not accept: the controller broke the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolViolation {
    #[error("completion for command id {0} which was never issued")]
    UnknownCommandId(u16),
    #[error("second completion for command id {0}")]
    DuplicateCompletion(u16),
    #[error("completion names submission queue {got}, expected {expected}")]
    WrongSubmissionQueue { got: u16, expected: u16 },
    #[error("completion reports SQ head {got}, queue has {entries} entries")]
    SqHeadOutOfRange { got: u16, entries: u16 },
}

/// Why a submission was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("queue full: every command id is in flight")]
    Full,
    #[error("queue poisoned by a protocol violation; controller reset needed")]
    Poisoned,
}

/// A command that completed with an error status (§4.6.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("NVMe command failed: {:?} (dnr={})", .status.decode(), .status.do_not_retry)]
pub struct CommandError {
    pub status: Status,
}

/// Coarse classes of command failure, for the policy above the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// The addressed range is outside the namespace.
    OutOfRange,
    /// The medium could not store or return the data.
    Media,
    /// The command was aborted (deletion, power loss, abort request); may be retried.
    Aborted,
    /// The command itself was malformed: a driver bug.
    InvalidCommand,
    /// Anything else (internal error, transfer error, unknown codes).
    Device,
}

impl CommandError {
    pub fn class(&self) -> ErrorClass {
        match self.status.decode() {
            StatusCode::Generic(g) => match g {
                GenericStatus::LbaOutOfRange | GenericStatus::CapacityExceeded => {
                    ErrorClass::OutOfRange
                }
                GenericStatus::AbortedPowerLoss
                | GenericStatus::AbortRequested
                | GenericStatus::AbortedSqDeletion
                | GenericStatus::AbortedFailedFused
                | GenericStatus::AbortedMissingFused => ErrorClass::Aborted,
                GenericStatus::InvalidOpcode
                | GenericStatus::InvalidField
                | GenericStatus::CommandIdConflict
                | GenericStatus::InvalidNamespaceOrFormat
                | GenericStatus::CommandSequenceError
                | GenericStatus::InvalidPrpOffset => ErrorClass::InvalidCommand,
                _ => ErrorClass::Device,
            },
            StatusCode::Media(m) => match m {
                MediaStatus::Unknown(_) | MediaStatus::AccessDenied => ErrorClass::Device,
                _ => ErrorClass::Media,
            },
            _ => ErrorClass::Device,
        }
    }
    /// DNR clear and not a malformed command: the same command may succeed if resubmitted.
    pub fn is_retryable(&self) -> bool {
        !self.status.do_not_retry && self.class() != ErrorClass::InvalidCommand
    }
}

/// One reaped completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub cid: CommandId,
    /// DW0 on success; the typed status on failure.
    pub result: Result<u32, CommandError>,
    /// The command had already been reported as timed out; its owner only needs to
    /// release the resources it kept for it.
    pub after_timeout: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Free,
    InFlight { deadline_ns: u64 },
    TimedOut,
}

/// The host side of one submission/completion queue pair.
#[derive(Debug)]
pub struct QueuePair {
    qid: u16,
    sq_entries: u16,
    cq_entries: u16,
    sq_tail: u16,
    sq_tail_rung: u16,
    sq_head_reported: u16,
    cq_head: u16,
    cq_head_rung: u16,
    expected_phase: bool,
    slots: Vec<Slot>,
    free_ids: Vec<u16>,
    in_flight: usize,
    poisoned: Option<ProtocolViolation>,
}

impl QueuePair {
    /// A queue pair for queue id `qid` with the given ring sizes. At most
    /// `min(sq_entries - 1, inflight_max)` commands are in flight.
    pub fn new(qid: u16, sq_entries: u16, cq_entries: u16, inflight_max: u16) -> Self {
        assert!((2..=QUEUE_ENTRIES_MAX).contains(&sq_entries));
        assert!((2..=QUEUE_ENTRIES_MAX).contains(&cq_entries));
        assert!(inflight_max >= 1);
        // A CQ smaller than the in-flight count could overflow (the controller would stall).
        let ids = inflight_max.min(sq_entries - 1).min(cq_entries - 1);
        QueuePair {
            qid,
            sq_entries,
            cq_entries,
            sq_tail: 0,
            sq_tail_rung: 0,
            sq_head_reported: 0,
            cq_head: 0,
            cq_head_rung: 0,
            expected_phase: true,
            slots: vec![Slot::Free; ids as usize],
            free_ids: (0..ids).rev().collect(),
            in_flight: 0,
            poisoned: None,
        }
    }

    pub fn qid(&self) -> u16 {
        self.qid
    }
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }
    pub fn poisoned(&self) -> Option<ProtocolViolation> {
        self.poisoned
    }
    /// Next completion slot to look at, and the phase that marks it posted.
    pub fn cq_head(&self) -> (u16, bool) {
        (self.cq_head, self.expected_phase)
    }
    /// SQ head as last reported by the controller (diagnostics).
    pub fn sq_head_reported(&self) -> u16 {
        self.sq_head_reported
    }

    /// The id the next successful `submit` will use (lets the caller prepare per-id
    /// resources such as the PRP list page before submitting).
    pub fn next_command_id(&self) -> Option<CommandId> {
        if self.poisoned.is_some() {
            return None;
        }
        self.free_ids.last().map(|&id| CommandId(id))
    }

    /// Writes `cmd` at the tail with a fresh command id. The caller must then ring the
    /// tail doorbell with [`QueuePair::take_sq_doorbell`] (several submissions may share one ring).
    pub fn submit(
        &mut self,
        mem: &mut impl QueueMemory,
        mut cmd: SubmissionEntry,
        deadline_ns: u64,
    ) -> Result<CommandId, SubmitError> {
        if self.poisoned.is_some() {
            return Err(SubmitError::Poisoned);
        }
        let id = self.free_ids.pop().ok_or(SubmitError::Full)?;
        debug_assert_eq!(self.slots[id as usize], Slot::Free);
        cmd.set_command_id(id);
        mem.write_submission(self.sq_tail, &cmd);
        self.sq_tail = (self.sq_tail + 1) % self.sq_entries;
        self.slots[id as usize] = Slot::InFlight { deadline_ns };
        self.in_flight += 1;
        debug_assert!(self.in_flight < self.sq_entries as usize);
        Ok(CommandId(id))
    }

    /// The new SQ tail doorbell value if submissions happened since the last ring.
    pub fn take_sq_doorbell(&mut self) -> Option<u16> {
        (self.sq_tail != self.sq_tail_rung).then(|| {
            self.sq_tail_rung = self.sq_tail;
            self.sq_tail
        })
    }

    /// The new CQ head doorbell value if completions were consumed since the last ring.
    pub fn take_cq_doorbell(&mut self) -> Option<u16> {
        (self.cq_head != self.cq_head_rung).then(|| {
            self.cq_head_rung = self.cq_head;
            self.cq_head
        })
    }

    /// Consumes up to `max` posted completions, calling `on_completion` for each.
    /// Returns how many were consumed; stops at the first entry whose phase says it is
    /// not posted yet. A protocol violation poisons the queue and is returned.
    pub fn poll(
        &mut self,
        mem: &impl QueueMemory,
        max: usize,
        mut on_completion: impl FnMut(Completion),
    ) -> Result<usize, ProtocolViolation> {
        if let Some(v) = self.poisoned {
            return Err(v);
        }
        let mut reaped = 0;
        while reaped < max {
            let entry = mem.read_completion(self.cq_head);
            if entry.phase() != self.expected_phase {
                break;
            }
            // The entry is consumed whatever its content, so the controller can reuse it.
            self.advance_cq_head();
            let completion = self
                .accept(&entry)
                .inspect_err(|v| self.poisoned = Some(*v))?;
            reaped += 1;
            on_completion(completion);
        }
        Ok(reaped)
    }

    fn advance_cq_head(&mut self) {
        self.cq_head += 1;
        if self.cq_head == self.cq_entries {
            self.cq_head = 0;
            self.expected_phase = !self.expected_phase;
        }
    }

    fn accept(&mut self, entry: &CompletionEntry) -> Result<Completion, ProtocolViolation> {
        if entry.sq_id() != self.qid {
            return Err(ProtocolViolation::WrongSubmissionQueue {
                got: entry.sq_id(),
                expected: self.qid,
            });
        }
        if entry.sq_head() >= self.sq_entries {
            return Err(ProtocolViolation::SqHeadOutOfRange {
                got: entry.sq_head(),
                entries: self.sq_entries,
            });
        }
        let id = entry.command_id();
        let slot = self
            .slots
            .get_mut(id as usize)
            .ok_or(ProtocolViolation::UnknownCommandId(id))?;
        let after_timeout = match *slot {
            Slot::Free => return Err(ProtocolViolation::DuplicateCompletion(id)),
            Slot::InFlight { .. } => false,
            Slot::TimedOut => true,
        };
        *slot = Slot::Free;
        self.free_ids.push(id);
        self.in_flight -= 1;
        self.sq_head_reported = entry.sq_head();
        let status = entry.status();
        let result = if status.is_success() {
            Ok(entry.dw0)
        } else {
            Err(CommandError { status })
        };
        Ok(Completion {
            cid: CommandId(id),
            result,
            after_timeout,
        })
    }

    /// Marks every in-flight command whose deadline is `<= now_ns` as timed out and
    /// reports it. Its id stays allocated until a completion or `reset()`.
    pub fn expire(&mut self, now_ns: u64, mut on_timeout: impl FnMut(CommandId)) -> usize {
        let mut expired = 0;
        for (id, slot) in self.slots.iter_mut().enumerate() {
            if let Slot::InFlight { deadline_ns } = *slot {
                if deadline_ns <= now_ns {
                    *slot = Slot::TimedOut;
                    expired += 1;
                    on_timeout(CommandId(id as u16));
                }
            }
        }
        expired
    }

    /// Whether command `cid` is still owned by the controller (in flight or timed out).
    pub fn is_outstanding(&self, cid: CommandId) -> bool {
        matches!(
            self.slots.get(cid.0 as usize),
            Some(Slot::InFlight { .. } | Slot::TimedOut)
        )
    }

    /// Forgets every command and returns to the initial ring state. Only valid after
    /// the controller was reset (or the queue deleted and recreated), when it no longer
    /// owns any entry or buffer. Returns the ids that were outstanding.
    pub fn reset(&mut self) -> Vec<CommandId> {
        let lost: Vec<CommandId> = (0..self.slots.len())
            .filter(|&i| self.slots[i] != Slot::Free)
            .map(|i| CommandId(i as u16))
            .collect();
        *self = QueuePair::new(
            self.qid,
            self.sq_entries,
            self.cq_entries,
            self.slots.len() as u16,
        );
        lost
    }
}

/// Why a PRP description could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PrpError {
    #[error("transfer of {0} bytes is empty or exceeds one PRP list")]
    BadLength(usize),
    #[error("data address {0:#x} is not dword aligned")]
    Misaligned(u64),
    #[error("a PRP list is needed but none was supplied")]
    ListMissing,
}

/// The data pointer of a command using PRPs (§4.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrpPointers {
    pub prp1: u64,
    pub prp2: u64,
    /// Entries written into the PRP list page (0 when no list is used).
    pub list_entries: usize,
}

/// Builds PRP1/PRP2 for `len_bytes` of IOVA-contiguous memory starting at `data_iova`.
/// One page: PRP2 unused. Two pages: PRP2 is the second page. More: PRP2 points at
/// `list` (IOVA `list_iova`), filled with the page addresses after the first.
pub fn build_prps(
    data_iova: u64,
    len_bytes: usize,
    list: Option<(u64, &mut [u64; PRP_LIST_ENTRIES_PER_PAGE])>,
) -> Result<PrpPointers, PrpError> {
    let page = PAGE_SIZE_BYTES as u64;
    if len_bytes == 0 || len_bytes > MAX_TRANSFER_BYTES {
        return Err(PrpError::BadLength(len_bytes));
    }
    if !data_iova.is_multiple_of(4) {
        return Err(PrpError::Misaligned(data_iova));
    }
    let offset_in_page = data_iova % page;
    let pages = (offset_in_page + len_bytes as u64).div_ceil(page) as usize;
    let first_page = data_iova - offset_in_page;
    match pages {
        1 => Ok(PrpPointers {
            prp1: data_iova,
            prp2: 0,
            list_entries: 0,
        }),
        2 => Ok(PrpPointers {
            prp1: data_iova,
            prp2: first_page + page,
            list_entries: 0,
        }),
        _ => {
            let (list_iova, entries) = list.ok_or(PrpError::ListMissing)?;
            debug_assert_eq!(list_iova % page, 0, "PRP list must be page aligned here");
            let count = pages - 1;
            // Guaranteed by the length check: count <= PRP_LIST_ENTRIES_PER_PAGE.
            for (i, e) in entries.iter_mut().take(count).enumerate() {
                *e = first_page + (i as u64 + 1) * page;
            }
            Ok(PrpPointers {
                prp1: data_iova,
                prp2: list_iova,
                list_entries: count,
            })
        }
    }
}

#[cfg(test)]
pub(crate) mod sim {
    //! A simulated controller over in-memory rings, with knobs for hostile behaviour.
    use super::*;
    use crate::nvme::spec::StatusCodeType;

    pub struct SimMemory {
        pub sq: Vec<SubmissionEntry>,
        pub cq: Vec<CompletionEntry>,
    }
    impl QueueMemory for SimMemory {
        fn write_submission(&mut self, index: u16, entry: &SubmissionEntry) {
            self.sq[index as usize] = *entry;
        }
        fn read_completion(&self, index: u16) -> CompletionEntry {
            self.cq[index as usize]
        }
    }

    /// The device side: fetches from the SQ up to the rung tail, posts completions.
    pub struct SimController {
        pub mem: SimMemory,
        pub qid: u16,
        pub sq_head: u16,
        pub sq_tail_doorbell: u16,
        pub cq_tail: u16,
        pub cq_head_doorbell: u16,
        pub phase: bool,
        /// Status field to put in the next completions (0 = success).
        pub next_status: u16,
        pub fetched: Vec<SubmissionEntry>,
    }

    impl SimController {
        pub fn new(qid: u16, sq_entries: u16, cq_entries: u16) -> Self {
            SimController {
                mem: SimMemory {
                    sq: vec![SubmissionEntry::default(); sq_entries as usize],
                    cq: vec![CompletionEntry::default(); cq_entries as usize],
                },
                qid,
                sq_head: 0,
                sq_tail_doorbell: 0,
                cq_tail: 0,
                cq_head_doorbell: 0,
                phase: true,
                next_status: 0,
                fetched: Vec::new(),
            }
        }
        /// Fetches every submitted command (up to the doorbell) without completing.
        pub fn fetch_all(&mut self) {
            while self.sq_head != self.sq_tail_doorbell {
                self.fetched.push(self.mem.sq[self.sq_head as usize]);
                self.sq_head = (self.sq_head + 1) % self.mem.sq.len() as u16;
            }
        }
        /// Completes up to `n` fetched commands in fetch order (or reversed), as a
        /// well-behaved controller would. Returns how many were posted.
        pub fn complete(&mut self, n: usize, reverse: bool) -> usize {
            self.fetch_all();
            let mut done = 0;
            while done < n && !self.fetched.is_empty() && !self.cq_full() {
                let cmd = if reverse {
                    self.fetched.pop().unwrap()
                } else {
                    self.fetched.remove(0)
                };
                let status = self.next_status;
                self.post_raw(
                    cmd.command_id(),
                    self.qid,
                    self.sq_head,
                    self.phase,
                    status,
                    cmd.cdw10,
                );
                done += 1;
            }
            done
        }
        pub fn cq_full(&self) -> bool {
            (self.cq_tail + 1) % self.mem.cq.len() as u16 == self.cq_head_doorbell
        }
        /// Posts an arbitrary entry at the CQ tail (hostile tests choose every field).
        pub fn post_raw(
            &mut self,
            cid: u16,
            sqid: u16,
            sqhd: u16,
            phase: bool,
            status: u16,
            dw0: u32,
        ) {
            self.mem.cq[self.cq_tail as usize] =
                CompletionEntry::build(cid, sqid, sqhd, phase, status, dw0);
            self.cq_tail += 1;
            if self.cq_tail as usize == self.mem.cq.len() {
                self.cq_tail = 0;
                self.phase = !self.phase;
            }
        }
        pub fn ring(&mut self, host: &mut QueuePair) {
            if let Some(t) = host.take_sq_doorbell() {
                self.sq_tail_doorbell = t;
            }
            if let Some(h) = host.take_cq_doorbell() {
                self.cq_head_doorbell = h;
            }
        }
    }

    pub fn status_field(sct: StatusCodeType, sc: u8, dnr: bool) -> u16 {
        Status {
            code_type: sct,
            code: sc,
            retry_delay: 0,
            more: false,
            do_not_retry: dnr,
        }
        .to_field()
    }
}

#[cfg(test)]
mod tests {
    use super::sim::*;
    use super::*;
    use crate::nvme::spec::{flush_command, StatusCodeType};
    use proptest::prelude::*;

    fn setup(sq: u16, cq: u16, inflight: u16) -> (QueuePair, SimController) {
        (
            QueuePair::new(1, sq, cq, inflight),
            SimController::new(1, sq, cq),
        )
    }

    fn collect(
        q: &mut QueuePair,
        c: &SimController,
        max: usize,
    ) -> Result<Vec<Completion>, ProtocolViolation> {
        let mut out = Vec::new();
        q.poll(&c.mem, max, |x| out.push(x))?;
        Ok(out)
    }

    // Proves a basic submit → doorbell → complete → poll round trip returns DW0 and frees the id.
    #[test]
    fn round_trip_single_command() {
        let (mut q, mut c) = setup(8, 8, 64);
        let mut cmd = flush_command(1);
        cmd.cdw10 = 42;
        let cid = q.submit(&mut c.mem, cmd, 100).unwrap();
        assert_eq!(q.take_sq_doorbell(), Some(1));
        assert_eq!(q.take_sq_doorbell(), None, "doorbell rung once per batch");
        c.sq_tail_doorbell = 1;
        assert_eq!(c.complete(1, false), 1);
        let got = collect(&mut q, &c, 8).unwrap();
        assert_eq!(
            got,
            vec![Completion {
                cid,
                result: Ok(42),
                after_timeout: false
            }]
        );
        assert_eq!(q.in_flight(), 0);
        assert_eq!(q.take_cq_doorbell(), Some(1));
        assert!(!q.is_outstanding(cid));
    }

    // Proves capacity is sq_entries-1 and that Full is reported instead of overwriting.
    #[test]
    fn full_queue_refuses() {
        let (mut q, mut c) = setup(4, 16, 64);
        assert_eq!(q.capacity(), 3);
        for _ in 0..3 {
            q.submit(&mut c.mem, flush_command(1), 0).unwrap();
        }
        assert_eq!(
            q.submit(&mut c.mem, flush_command(1), 0),
            Err(SubmitError::Full)
        );
    }

    // Proves phase tracking across many ring wraps with out-of-order completion and batching.
    #[test]
    fn phase_flips_across_wraps() {
        let (mut q, mut c) = setup(5, 3, 64);
        let mut completed = 0u32;
        for round in 0..50u32 {
            let n = q.capacity();
            for i in 0..n {
                let mut cmd = flush_command(1);
                cmd.cdw10 = round * 10 + i as u32;
                q.submit(&mut c.mem, cmd, u64::MAX).unwrap();
            }
            c.ring(&mut q);
            let mut seen = Vec::new();
            while seen.len() < n {
                c.complete(1, round % 2 == 1);
                q.poll(&c.mem, 1, |x| seen.push(x.result.unwrap())).unwrap();
                c.ring(&mut q);
            }
            seen.sort();
            let want: Vec<u32> = (0..n as u32).map(|i| round * 10 + i).collect();
            assert_eq!(seen, want);
            completed += n as u32;
        }
        assert_eq!(completed, 100);
        assert_eq!(q.in_flight(), 0);
    }

    // Proves an entry carrying the stale phase is not consumed (it is "not yet posted").
    #[test]
    fn stale_phase_is_not_consumed() {
        let (mut q, mut c) = setup(8, 8, 64);
        let cid = q.submit(&mut c.mem, flush_command(1), 0).unwrap();
        c.ring(&mut q);
        c.post_raw(cid.0, 1, 1, false, 0, 0); // wrong phase for the first pass
        assert_eq!(collect(&mut q, &c, 8).unwrap(), vec![]);
        assert_eq!(q.in_flight(), 1);
        assert_eq!(q.take_cq_doorbell(), None);
    }

    // Proves a completion for a never-issued id poisons the queue and blocks submissions.
    #[test]
    fn unknown_command_id_poisons() {
        let (mut q, mut c) = setup(8, 8, 4);
        q.submit(&mut c.mem, flush_command(1), 0).unwrap();
        c.post_raw(200, 1, 1, true, 0, 0);
        assert_eq!(
            collect(&mut q, &c, 8),
            Err(ProtocolViolation::UnknownCommandId(200))
        );
        assert_eq!(
            q.submit(&mut c.mem, flush_command(1), 0),
            Err(SubmitError::Poisoned)
        );
        assert_eq!(q.reset(), vec![CommandId(0)]);
        assert!(q.poisoned().is_none());
    }

    // Proves a second completion for the same id is caught, not delivered twice.
    #[test]
    fn duplicate_completion_detected() {
        let (mut q, mut c) = setup(8, 8, 4);
        let a = q.submit(&mut c.mem, flush_command(1), 0).unwrap();
        let _b = q.submit(&mut c.mem, flush_command(1), 0).unwrap();
        c.post_raw(a.0, 1, 2, true, 0, 0);
        c.post_raw(a.0, 1, 2, true, 0, 0);
        let mut delivered = 0;
        let r = q.poll(&c.mem, 8, |_| delivered += 1);
        assert_eq!(r, Err(ProtocolViolation::DuplicateCompletion(a.0)));
        assert_eq!(delivered, 1);
    }

    // Proves completions naming another SQ or an impossible SQ head are rejected.
    #[test]
    fn wrong_queue_and_bad_sq_head_rejected() {
        let (mut q, mut c) = setup(8, 8, 4);
        let a = q.submit(&mut c.mem, flush_command(1), 0).unwrap();
        c.post_raw(a.0, 2, 1, true, 0, 0);
        assert_eq!(
            collect(&mut q, &c, 8),
            Err(ProtocolViolation::WrongSubmissionQueue {
                got: 2,
                expected: 1
            })
        );
        let (mut q, mut c) = setup(8, 8, 4);
        let a = q.submit(&mut c.mem, flush_command(1), 0).unwrap();
        c.post_raw(a.0, 1, 8, true, 0, 0);
        assert_eq!(
            collect(&mut q, &c, 8),
            Err(ProtocolViolation::SqHeadOutOfRange { got: 8, entries: 8 })
        );
    }

    // Proves error statuses come back typed and classified (media, range, aborted, invalid).
    #[test]
    fn error_statuses_are_typed() {
        let cases = [
            (
                status_field(StatusCodeType::MediaAndDataIntegrity, 0x81, true),
                ErrorClass::Media,
                false,
            ),
            (
                status_field(StatusCodeType::Generic, 0x80, true),
                ErrorClass::OutOfRange,
                false,
            ),
            (
                status_field(StatusCodeType::Generic, 0x08, false),
                ErrorClass::Aborted,
                true,
            ),
            (
                status_field(StatusCodeType::Generic, 0x01, false),
                ErrorClass::InvalidCommand,
                false,
            ),
            (
                status_field(StatusCodeType::Generic, 0x06, false),
                ErrorClass::Device,
                true,
            ),
            (
                status_field(StatusCodeType::Unknown(5), 0x33, false),
                ErrorClass::Device,
                true,
            ),
        ];
        for (field, class, retry) in cases {
            let (mut q, mut c) = setup(8, 8, 4);
            q.submit(&mut c.mem, flush_command(1), 0).unwrap();
            c.ring(&mut q);
            c.next_status = field;
            c.complete(1, false);
            let got = collect(&mut q, &c, 8).unwrap();
            let err = got[0].result.unwrap_err();
            assert_eq!(err.status.to_field(), field);
            assert_eq!(
                (err.class(), err.is_retryable()),
                (class, retry),
                "status {field:#x}"
            );
        }
    }

    // Proves timeouts: expiry reports only overdue commands, keeps their ids, and a late
    // completion releases the id flagged `after_timeout`.
    #[test]
    fn timeouts_keep_id_until_late_completion() {
        let (mut q, mut c) = setup(8, 8, 2);
        let a = q.submit(&mut c.mem, flush_command(1), 100).unwrap();
        let b = q.submit(&mut c.mem, flush_command(1), 200).unwrap();
        let mut expired = Vec::new();
        assert_eq!(q.expire(99, |id| expired.push(id)), 0);
        assert_eq!(q.expire(150, |id| expired.push(id)), 1);
        assert_eq!(expired, vec![a]);
        assert!(q.is_outstanding(a));
        assert_eq!(
            q.submit(&mut c.mem, flush_command(1), 0),
            Err(SubmitError::Full)
        );
        assert_eq!(
            q.expire(1000, |_| {}),
            1,
            "a is not reported twice, b now is"
        );
        c.ring(&mut q);
        c.complete(2, false);
        let got = collect(&mut q, &c, 8).unwrap();
        assert!(got.iter().all(|x| x.after_timeout));
        assert_eq!(got.iter().map(|x| x.cid).collect::<Vec<_>>(), vec![a, b]);
        assert_eq!(q.in_flight(), 0);
    }

    // Proves the per-poll cap is honoured and the remainder is reaped on the next poll.
    #[test]
    fn poll_cap_is_respected() {
        let (mut q, mut c) = setup(32, 32, 64);
        for _ in 0..20 {
            q.submit(&mut c.mem, flush_command(1), 0).unwrap();
        }
        c.ring(&mut q);
        c.complete(20, false);
        assert_eq!(q.poll(&c.mem, 8, |_| {}), Ok(8));
        assert_eq!(q.poll(&c.mem, 8, |_| {}), Ok(8));
        assert_eq!(q.poll(&c.mem, 8, |_| {}), Ok(4));
        assert_eq!(q.poll(&c.mem, 8, |_| {}), Ok(0));
    }

    // Proves PRP construction for one page, two pages, a list, offsets and bounds.
    #[test]
    fn prp_shapes() {
        let mut list = [0u64; PRP_LIST_ENTRIES_PER_PAGE];
        assert_eq!(
            build_prps(0x10000, 4096, None),
            Ok(PrpPointers {
                prp1: 0x10000,
                prp2: 0,
                list_entries: 0
            })
        );
        assert_eq!(build_prps(0x10000, 8192, None).unwrap().prp2, 0x11000);
        assert_eq!(
            build_prps(0x10200, 4096, None).unwrap().prp2,
            0x11000,
            "offset spills into page 2"
        );
        assert_eq!(build_prps(0x10000, 12288, None), Err(PrpError::ListMissing));
        let p = build_prps(0x10000, 16384, Some((0x90000, &mut list))).unwrap();
        assert_eq!(
            p,
            PrpPointers {
                prp1: 0x10000,
                prp2: 0x90000,
                list_entries: 3
            }
        );
        assert_eq!(&list[..3], &[0x11000, 0x12000, 0x13000]);
        let p = build_prps(0x10000, MAX_TRANSFER_BYTES, Some((0x90000, &mut list))).unwrap();
        assert_eq!(p.list_entries, PRP_LIST_ENTRIES_PER_PAGE - 1);
        assert_eq!(
            list[PRP_LIST_ENTRIES_PER_PAGE - 2],
            0x10000 + (MAX_TRANSFER_BYTES as u64 - 4096)
        );
        assert_eq!(build_prps(0x10000, 0, None), Err(PrpError::BadLength(0)));
        assert_eq!(
            build_prps(0x10000, MAX_TRANSFER_BYTES + 1, None),
            Err(PrpError::BadLength(MAX_TRANSFER_BYTES + 1))
        );
        assert_eq!(
            build_prps(0x10002, 512, None),
            Err(PrpError::Misaligned(0x10002))
        );
    }

    proptest! {
        #![proptest_config(crate::nvme::proptest_config(256))]
        // Proves PRPs cover exactly the requested byte range, page by page, for any layout.
        #[test]
        fn prp_covers_range(page_index in 0u64..1000, offset_dw in 0u64..1024, len in 1usize..MAX_TRANSFER_BYTES) {
            let iova = page_index * 4096 + offset_dw * 4;
            let mut list = [0u64; PRP_LIST_ENTRIES_PER_PAGE];
            let r = build_prps(iova, len, Some((0x4000_0000, &mut list)));
            let pages = ((iova % 4096) as usize + len).div_ceil(4096);
            prop_assert!(r.is_ok() || pages > PRP_LIST_ENTRIES_PER_PAGE + 1);
            if let Ok(p) = r {
                let mut addrs = vec![p.prp1];
                match pages {
                    1 => prop_assert_eq!(p.prp2, 0),
                    2 => addrs.push(p.prp2),
                    _ => { prop_assert_eq!(p.prp2, 0x4000_0000); addrs.extend_from_slice(&list[..p.list_entries]); }
                }
                prop_assert_eq!(addrs.len(), pages);
                for (i, a) in addrs.iter().enumerate().skip(1) {
                    prop_assert_eq!(*a, (iova & !4095) + i as u64 * 4096);
                }
            }
        }

        // Proves random interleavings of submit/complete/poll/expire keep the in-flight
        // accounting exact and deliver each command exactly once.
        #[test]
        fn random_schedule_delivers_each_once(ops in proptest::collection::vec(0u8..4, 1..300), sq in 2u16..10, cq in 2u16..10) {
            let (mut q, mut c) = setup(sq, cq, 64);
            let mut issued = std::collections::BTreeSet::new();
            let mut delivered = Vec::new();
            let mut next_tag = 0u32;
            for (t, op) in ops.into_iter().enumerate() {
                match op {
                    0 => {
                        let mut cmd = flush_command(1);
                        cmd.cdw10 = next_tag;
                        if q.submit(&mut c.mem, cmd, t as u64 + 20).is_ok() { issued.insert(next_tag); next_tag += 1; }
                    }
                    1 => { c.ring(&mut q); c.complete(2, t % 3 == 0); }
                    2 => { q.poll(&c.mem, 3, |x| delivered.push(x.result.unwrap())).unwrap(); c.ring(&mut q); }
                    _ => { q.expire(t as u64, |_| {}); }
                }
            }
            loop {
                c.ring(&mut q);
                c.complete(usize::MAX, false);
                let n = q.poll(&c.mem, 64, |x| delivered.push(x.result.unwrap())).unwrap();
                if n == 0 && q.in_flight() == 0 { break; }
            }
            let mut sorted = delivered.clone();
            sorted.sort();
            sorted.dedup();
            prop_assert_eq!(sorted.len(), delivered.len(), "no duplicates");
            prop_assert_eq!(sorted, issued.into_iter().collect::<Vec<_>>());
        }

        // Fuzz-style: arbitrary completion entries written into the CQ never panic the
        // queue, never deliver an id that was not outstanding, and never over-free.
        #[test]
        fn arbitrary_completions_never_panic(entries in proptest::collection::vec(any::<[u32; 4]>(), 1..64), submits in 0usize..7) {
            let (mut q, mut c) = setup(8, 8, 8);
            let mut outstanding = std::collections::BTreeSet::new();
            for _ in 0..submits { outstanding.insert(q.submit(&mut c.mem, flush_command(1), 5).unwrap()); }
            q.expire(5, |_| {});
            for (i, e) in entries.iter().enumerate().take(8) {
                c.mem.cq[i] = CompletionEntry { dw0: e[0], dw1: e[1], dw2: e[2], dw3: e[3] };
            }
            for _ in 0..4 {
                let mut got = Vec::new();
                let r = q.poll(&c.mem, 16, |x| got.push(x.cid));
                for id in &got { prop_assert!(outstanding.remove(id), "delivered {:?} not outstanding", id); }
                prop_assert_eq!(q.in_flight(), outstanding.len());
                if r.is_err() { prop_assert!(q.poisoned().is_some()); break; }
            }
        }
    }
}
