//! NVM Express structures, mirroring the specification byte for byte.
//!
//! Section numbers refer to the NVM Express Base Specification revision 1.4 (the layouts
//! used here are unchanged in 2.0, where the NVM command set moved to its own document).
//! Every structure has its size and the offsets of the fields we use asserted at compile
//! time; bit fields are accessor methods; opcodes and status codes are enums with an
//! `Unknown` arm so a hostile or newer controller cannot make decoding panic.
//! Spec mnemonics (CAP, CC, CSTS, ...) are used here only, expanded in the doc comments.
use std::mem::{offset_of, size_of};

// ---------------------------------------------------------------------------------------
// §3.1 Controller registers (memory mapped through BAR0)
// ---------------------------------------------------------------------------------------

/// Byte offsets of the controller registers in BAR0 (§3.1, Figure "Controller Registers").
pub mod reg {
    /// CAP, Controller Capabilities, 64 bit.
    pub const CAP: usize = 0x00;
    /// VS, Version, 32 bit.
    pub const VS: usize = 0x08;
    /// INTMS, Interrupt Mask Set, 32 bit.
    pub const INTMS: usize = 0x0C;
    /// INTMC, Interrupt Mask Clear, 32 bit.
    pub const INTMC: usize = 0x10;
    /// CC, Controller Configuration, 32 bit.
    pub const CC: usize = 0x14;
    /// CSTS, Controller Status, 32 bit.
    pub const CSTS: usize = 0x1C;
    /// NSSR, NVM Subsystem Reset, 32 bit.
    pub const NSSR: usize = 0x20;
    /// AQA, Admin Queue Attributes, 32 bit.
    pub const AQA: usize = 0x24;
    /// ASQ, Admin Submission Queue base address, 64 bit.
    pub const ASQ: usize = 0x28;
    /// ACQ, Admin Completion Queue base address, 64 bit.
    pub const ACQ: usize = 0x30;
    /// First doorbell register (§3.1.24/§3.1.25).
    pub const DOORBELL_BASE: usize = 0x1000;
}

/// The fixed part of the register block (§3.1), for layout documentation and asserts.
/// The driver reads registers through volatile accessors at the `reg` offsets, never by
/// dereferencing this struct.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ControllerRegisters {
    pub cap: u64,
    pub vs: u32,
    pub intms: u32,
    pub intmc: u32,
    pub cc: u32,
    pub reserved_18: u32,
    pub csts: u32,
    pub nssr: u32,
    pub aqa: u32,
    pub asq: u64,
    pub acq: u64,
}
const _: () = assert!(size_of::<ControllerRegisters>() == 0x38);
const _: () = assert!(offset_of!(ControllerRegisters, cap) == reg::CAP);
const _: () = assert!(offset_of!(ControllerRegisters, vs) == reg::VS);
const _: () = assert!(offset_of!(ControllerRegisters, intms) == reg::INTMS);
const _: () = assert!(offset_of!(ControllerRegisters, intmc) == reg::INTMC);
const _: () = assert!(offset_of!(ControllerRegisters, cc) == reg::CC);
const _: () = assert!(offset_of!(ControllerRegisters, csts) == reg::CSTS);
const _: () = assert!(offset_of!(ControllerRegisters, nssr) == reg::NSSR);
const _: () = assert!(offset_of!(ControllerRegisters, aqa) == reg::AQA);
const _: () = assert!(offset_of!(ControllerRegisters, asq) == reg::ASQ);
const _: () = assert!(offset_of!(ControllerRegisters, acq) == reg::ACQ);

/// CAP, Controller Capabilities (§3.1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities(pub u64);
impl Capabilities {
    /// MQES: maximum entries per queue (the register is 0-based; this is the count).
    pub fn max_queue_entries(self) -> u32 {
        (self.0 & 0xFFFF) as u32 + 1
    }
    /// CQR: queues must be physically contiguous.
    pub fn contiguous_queues_required(self) -> bool {
        self.0 >> 16 & 1 == 1
    }
    /// TO: worst-case time to become ready after CC.EN changes, in milliseconds
    /// (the register counts 500 ms units).
    pub fn ready_timeout_ms(self) -> u64 {
        (self.0 >> 24 & 0xFF) * 500
    }
    /// DSTRD: doorbell stride exponent; stride is `4 << DSTRD` bytes.
    pub fn doorbell_stride_bytes(self) -> usize {
        4usize << (self.0 >> 32 & 0xF)
    }
    /// CSS bit 0: the NVM command set is supported.
    pub fn supports_nvm_command_set(self) -> bool {
        self.0 >> 37 & 1 == 1
    }
    /// MPSMIN: minimum memory page size, bytes (`2^(12+MPSMIN)`).
    pub fn min_page_size_bytes(self) -> u64 {
        1u64 << (12 + (self.0 >> 48 & 0xF))
    }
    /// MPSMAX: maximum memory page size, bytes.
    pub fn max_page_size_bytes(self) -> u64 {
        1u64 << (12 + (self.0 >> 52 & 0xF))
    }
}

/// VS, Version (§3.1.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version(pub u32);
impl Version {
    pub fn major(self) -> u16 {
        (self.0 >> 16) as u16
    }
    pub fn minor(self) -> u8 {
        (self.0 >> 8) as u8
    }
    pub fn tertiary(self) -> u8 {
        self.0 as u8
    }
}

/// CC, Controller Configuration (§3.1.5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ControllerConfig(pub u32);
impl ControllerConfig {
    /// EN, bit 0.
    pub fn enabled(self) -> bool {
        self.0 & 1 == 1
    }
    pub fn with_enabled(self, on: bool) -> Self {
        Self(self.0 & !1 | on as u32)
    }
    /// CSS, bits 6:4 (0 = NVM command set).
    pub fn with_command_set(self, css: u32) -> Self {
        Self(self.0 & !(0x7 << 4) | (css & 0x7) << 4)
    }
    /// MPS, bits 10:7: memory page size is `2^(12+MPS)`.
    pub fn with_page_size_shift(self, mps: u32) -> Self {
        Self(self.0 & !(0xF << 7) | (mps & 0xF) << 7)
    }
    /// AMS, bits 13:11 (0 = round robin).
    pub fn with_arbitration(self, ams: u32) -> Self {
        Self(self.0 & !(0x7 << 11) | (ams & 0x7) << 11)
    }
    /// SHN, bits 15:14: shutdown notification.
    pub fn shutdown_notification(self) -> ShutdownNotification {
        match self.0 >> 14 & 0x3 {
            0 => ShutdownNotification::None,
            1 => ShutdownNotification::Normal,
            2 => ShutdownNotification::Abrupt,
            _ => ShutdownNotification::Reserved,
        }
    }
    pub fn with_shutdown_notification(self, shn: ShutdownNotification) -> Self {
        Self(self.0 & !(0x3 << 14) | (shn as u32) << 14)
    }
    /// IOSQES, bits 19:16: I/O submission entry size is `2^IOSQES` bytes.
    pub fn with_io_sq_entry_size_shift(self, shift: u32) -> Self {
        Self(self.0 & !(0xF << 16) | (shift & 0xF) << 16)
    }
    /// IOCQES, bits 23:20: I/O completion entry size is `2^IOCQES` bytes.
    pub fn with_io_cq_entry_size_shift(self, shift: u32) -> Self {
        Self(self.0 & !(0xF << 20) | (shift & 0xF) << 20)
    }
}

/// CC.SHN values (§3.1.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ShutdownNotification {
    None = 0,
    Normal = 1,
    Abrupt = 2,
    Reserved = 3,
}

/// CSTS, Controller Status (§3.1.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControllerStatus(pub u32);
impl ControllerStatus {
    /// RDY, bit 0.
    pub fn ready(self) -> bool {
        self.0 & 1 == 1
    }
    /// CFS, bit 1: Controller Fatal Status.
    pub fn fatal(self) -> bool {
        self.0 >> 1 & 1 == 1
    }
    /// SHST, bits 3:2: shutdown status.
    pub fn shutdown_status(self) -> ShutdownStatus {
        match self.0 >> 2 & 0x3 {
            0 => ShutdownStatus::Normal,
            1 => ShutdownStatus::Occurring,
            2 => ShutdownStatus::Complete,
            _ => ShutdownStatus::Reserved,
        }
    }
    /// A read of all ones means the device fell off the bus (surprise removal).
    pub fn is_all_ones(self) -> bool {
        self.0 == u32::MAX
    }
}

/// CSTS.SHST values (§3.1.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShutdownStatus {
    Normal,
    Occurring,
    Complete,
    Reserved,
}

/// AQA, Admin Queue Attributes (§3.1.8): both sizes 0-based, 12 bits each.
pub fn admin_queue_attributes(sq_entries: u16, cq_entries: u16) -> u32 {
    debug_assert!((2..=4096).contains(&sq_entries) && (2..=4096).contains(&cq_entries));
    (sq_entries as u32 - 1) | (cq_entries as u32 - 1) << 16
}

/// Offset in BAR0 of the submission tail doorbell of queue `qid` (§3.1.24).
pub fn sq_tail_doorbell_offset(qid: u16, stride_bytes: usize) -> usize {
    reg::DOORBELL_BASE + (2 * qid as usize) * stride_bytes
}

/// Offset in BAR0 of the completion head doorbell of queue `qid` (§3.1.25).
pub fn cq_head_doorbell_offset(qid: u16, stride_bytes: usize) -> usize {
    reg::DOORBELL_BASE + (2 * qid as usize + 1) * stride_bytes
}

// ---------------------------------------------------------------------------------------
// §4.2 Submission Queue Entry, §4.6 Completion Queue Entry
// ---------------------------------------------------------------------------------------

/// Submission Queue Entry, 64 bytes (§4.2, "Common Command Format").
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SubmissionEntry {
    /// CDW0: opcode 7:0, FUSE 9:8, PSDT 15:14, CID 31:16.
    pub cdw0: u32,
    /// NSID: namespace identifier.
    pub nsid: u32,
    pub cdw2: u32,
    pub cdw3: u32,
    /// MPTR: metadata pointer.
    pub mptr: u64,
    /// DPTR with PSDT = 0: PRP entry 1.
    pub prp1: u64,
    /// DPTR with PSDT = 0: PRP entry 2 or PRP list pointer.
    pub prp2: u64,
    pub cdw10: u32,
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    pub cdw14: u32,
    pub cdw15: u32,
}
const _: () = assert!(size_of::<SubmissionEntry>() == 64);
const _: () = assert!(offset_of!(SubmissionEntry, nsid) == 4);
const _: () = assert!(offset_of!(SubmissionEntry, mptr) == 16);
const _: () = assert!(offset_of!(SubmissionEntry, prp1) == 24);
const _: () = assert!(offset_of!(SubmissionEntry, prp2) == 32);
const _: () = assert!(offset_of!(SubmissionEntry, cdw10) == 40);
const _: () = assert!(offset_of!(SubmissionEntry, cdw15) == 60);

/// log2 of the submission entry size, for CC.IOSQES.
pub const SUBMISSION_ENTRY_SIZE_SHIFT: u32 = 6;
const _: () = assert!(1 << SUBMISSION_ENTRY_SIZE_SHIFT == size_of::<SubmissionEntry>());

impl SubmissionEntry {
    /// A command with `opcode`, no fusing, PRP data pointer (PSDT = 0), command id 0.
    pub fn new(opcode: u8, nsid: u32) -> Self {
        Self {
            cdw0: opcode as u32,
            nsid,
            ..Self::default()
        }
    }
    pub fn opcode(&self) -> u8 {
        self.cdw0 as u8
    }
    pub fn command_id(&self) -> u16 {
        (self.cdw0 >> 16) as u16
    }
    pub fn set_command_id(&mut self, cid: u16) {
        self.cdw0 = self.cdw0 & 0xFFFF | (cid as u32) << 16;
    }
}

/// Completion Queue Entry, 16 bytes (§4.6).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompletionEntry {
    /// DW0: command specific result.
    pub dw0: u32,
    /// DW1: reserved (command specific in newer revisions).
    pub dw1: u32,
    /// DW2: SQHD (submission queue head pointer) 15:0, SQID 31:16.
    pub dw2: u32,
    /// DW3: CID 15:0, P (phase tag) bit 16, status field 31:17.
    pub dw3: u32,
}
const _: () = assert!(size_of::<CompletionEntry>() == 16);
const _: () = assert!(offset_of!(CompletionEntry, dw2) == 8);
const _: () = assert!(offset_of!(CompletionEntry, dw3) == 12);

/// log2 of the completion entry size, for CC.IOCQES.
pub const COMPLETION_ENTRY_SIZE_SHIFT: u32 = 4;
const _: () = assert!(1 << COMPLETION_ENTRY_SIZE_SHIFT == size_of::<CompletionEntry>());

impl CompletionEntry {
    pub fn sq_head(&self) -> u16 {
        self.dw2 as u16
    }
    pub fn sq_id(&self) -> u16 {
        (self.dw2 >> 16) as u16
    }
    pub fn command_id(&self) -> u16 {
        self.dw3 as u16
    }
    pub fn phase(&self) -> bool {
        self.dw3 >> 16 & 1 == 1
    }
    pub fn status(&self) -> Status {
        Status::from_field((self.dw3 >> 17) as u16)
    }
    /// Builds an entry (used by the simulated controller in tests and by fuzzing).
    pub fn build(
        cid: u16,
        sq_id: u16,
        sq_head: u16,
        phase: bool,
        status_field: u16,
        dw0: u32,
    ) -> Self {
        Self {
            dw0,
            dw1: 0,
            dw2: sq_head as u32 | (sq_id as u32) << 16,
            dw3: cid as u32 | (phase as u32) << 16 | ((status_field & 0x7FFF) as u32) << 17,
        }
    }
}

// ---------------------------------------------------------------------------------------
// §4.6.1 Status field
// ---------------------------------------------------------------------------------------

/// The 15-bit status field of a completion (§4.6.1): SC 7:0, SCT 10:8, CRD 12:11,
/// M 13, DNR 14.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    pub code_type: StatusCodeType,
    pub code: u8,
    /// CRD: command retry delay index.
    pub retry_delay: u8,
    /// M: more information in the Error Information log page.
    pub more: bool,
    /// DNR: do not retry.
    pub do_not_retry: bool,
}

impl Status {
    pub fn from_field(field: u16) -> Self {
        Status {
            code: field as u8,
            code_type: StatusCodeType::from_raw((field >> 8 & 0x7) as u8),
            retry_delay: (field >> 11 & 0x3) as u8,
            more: field >> 13 & 1 == 1,
            do_not_retry: field >> 14 & 1 == 1,
        }
    }
    /// The 15-bit field, inverse of `from_field`.
    pub fn to_field(self) -> u16 {
        self.code as u16
            | (self.code_type.raw() as u16) << 8
            | ((self.retry_delay & 0x3) as u16) << 11
            | (self.more as u16) << 13
            | (self.do_not_retry as u16) << 14
    }
    pub fn is_success(self) -> bool {
        self.code_type == StatusCodeType::Generic && self.code == 0
    }
    /// The status decoded to a named code.
    pub fn decode(self) -> StatusCode {
        match self.code_type {
            StatusCodeType::Generic => StatusCode::Generic(GenericStatus::from_raw(self.code)),
            StatusCodeType::CommandSpecific => {
                StatusCode::CommandSpecific(CommandSpecificStatus::from_raw(self.code))
            }
            StatusCodeType::MediaAndDataIntegrity => {
                StatusCode::Media(MediaStatus::from_raw(self.code))
            }
            other => StatusCode::Other(other, self.code),
        }
    }
}

/// SCT, Status Code Type (§4.6.1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusCodeType {
    Generic,
    CommandSpecific,
    MediaAndDataIntegrity,
    PathRelated,
    VendorSpecific,
    Unknown(u8),
}
impl StatusCodeType {
    pub fn from_raw(v: u8) -> Self {
        match v {
            0 => Self::Generic,
            1 => Self::CommandSpecific,
            2 => Self::MediaAndDataIntegrity,
            3 => Self::PathRelated,
            7 => Self::VendorSpecific,
            v => Self::Unknown(v),
        }
    }
    pub fn raw(self) -> u8 {
        match self {
            Self::Generic => 0,
            Self::CommandSpecific => 1,
            Self::MediaAndDataIntegrity => 2,
            Self::PathRelated => 3,
            Self::VendorSpecific => 7,
            Self::Unknown(v) => v & 0x7,
        }
    }
}

/// A status decoded by type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusCode {
    Generic(GenericStatus),
    CommandSpecific(CommandSpecificStatus),
    Media(MediaStatus),
    Other(StatusCodeType, u8),
}

macro_rules! status_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident = $val:expr,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $name { $($variant,)* Unknown(u8) }
        impl $name {
            pub fn from_raw(v: u8) -> Self {
                match v { $($val => Self::$variant,)* v => Self::Unknown(v) }
            }
            pub fn raw(self) -> u8 {
                match self { $(Self::$variant => $val,)* Self::Unknown(v) => v }
            }
        }
    };
}

status_enum! {
    /// Generic command status values (§4.6.1.2.1).
    GenericStatus {
        Success = 0x00,
        InvalidOpcode = 0x01,
        InvalidField = 0x02,
        CommandIdConflict = 0x03,
        DataTransferError = 0x04,
        AbortedPowerLoss = 0x05,
        InternalError = 0x06,
        AbortRequested = 0x07,
        AbortedSqDeletion = 0x08,
        AbortedFailedFused = 0x09,
        AbortedMissingFused = 0x0A,
        InvalidNamespaceOrFormat = 0x0B,
        CommandSequenceError = 0x0C,
        InvalidPrpOffset = 0x13,
        NamespaceWriteProtected = 0x20,
        LbaOutOfRange = 0x80,
        CapacityExceeded = 0x81,
        NamespaceNotReady = 0x82,
        ReservationConflict = 0x83,
        FormatInProgress = 0x84,
    }
}

status_enum! {
    /// Command specific status values (§4.6.1.2.2), admin and NVM command set.
    CommandSpecificStatus {
        CompletionQueueInvalid = 0x00,
        InvalidQueueIdentifier = 0x01,
        InvalidQueueSize = 0x02,
        AbortCommandLimitExceeded = 0x03,
        AsyncEventRequestLimitExceeded = 0x05,
        InvalidInterruptVector = 0x08,
        InvalidLogPage = 0x09,
        InvalidFormat = 0x0A,
        InvalidQueueDeletion = 0x0C,
        ConflictingAttributes = 0x80,
        InvalidProtectionInformation = 0x81,
        WriteToReadOnlyRange = 0x82,
    }
}

status_enum! {
    /// Media and data integrity error values (§4.6.1.2.3).
    MediaStatus {
        WriteFault = 0x80,
        UnrecoveredReadError = 0x81,
        EndToEndGuardCheckError = 0x82,
        EndToEndApplicationTagCheckError = 0x83,
        EndToEndReferenceTagCheckError = 0x84,
        CompareFailure = 0x85,
        AccessDenied = 0x86,
        DeallocatedOrUnwrittenBlock = 0x87,
    }
}

// ---------------------------------------------------------------------------------------
// §5 Admin command set, §6 NVM command set: opcodes and command dwords
// ---------------------------------------------------------------------------------------

/// Admin command opcodes (§5, Figure "Opcodes for Admin Commands").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum AdminOpcode {
    DeleteIoSq = 0x00,
    CreateIoSq = 0x01,
    GetLogPage = 0x02,
    DeleteIoCq = 0x04,
    CreateIoCq = 0x05,
    Identify = 0x06,
    Abort = 0x08,
    SetFeatures = 0x09,
    GetFeatures = 0x0A,
    AsyncEventRequest = 0x0C,
}

/// NVM command set I/O opcodes (§6, Figure "Opcodes for NVM Commands").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum NvmOpcode {
    Flush = 0x00,
    Write = 0x01,
    Read = 0x02,
    WriteZeroes = 0x08,
    DatasetManagement = 0x09,
}

/// Identify CNS values (§5.15.1, CDW10 bits 7:0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum IdentifyCns {
    Namespace = 0x00,
    Controller = 0x01,
    ActiveNamespaceList = 0x02,
}

/// Feature identifiers used (§5.21.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FeatureId {
    /// Number of Queues (§5.21.1.7).
    NumberOfQueues = 0x07,
}

/// Identify (§5.15).
pub fn identify_command(cns: IdentifyCns, nsid: u32) -> SubmissionEntry {
    let mut e = SubmissionEntry::new(AdminOpcode::Identify as u8, nsid);
    e.cdw10 = cns as u32;
    e
}

/// Set Features / Number of Queues (§5.21.1.7): counts are requested 1-based here and
/// encoded 0-based (NSQR 15:0, NCQR 31:16).
pub fn set_number_of_queues_command(sq_count: u16, cq_count: u16) -> SubmissionEntry {
    debug_assert!(sq_count >= 1 && cq_count >= 1);
    let mut e = SubmissionEntry::new(AdminOpcode::SetFeatures as u8, 0);
    e.cdw10 = FeatureId::NumberOfQueues as u32;
    e.cdw11 = (sq_count as u32 - 1) | (cq_count as u32 - 1) << 16;
    e
}

/// Decodes the Number of Queues completion DW0 into 1-based (sq, cq) counts allocated.
pub fn number_of_queues_allocated(dw0: u32) -> (u32, u32) {
    ((dw0 & 0xFFFF) + 1, (dw0 >> 16) + 1)
}

/// Create I/O Completion Queue (§5.3): physically contiguous, interrupts disabled.
pub fn create_io_cq_command(qid: u16, entries: u16, base_iova: u64) -> SubmissionEntry {
    let mut e = SubmissionEntry::new(AdminOpcode::CreateIoCq as u8, 0);
    e.prp1 = base_iova;
    e.cdw10 = qid as u32 | (entries as u32 - 1) << 16;
    e.cdw11 = 1; // PC = 1, IEN = 0, IV = 0
    e
}

/// Create I/O Submission Queue (§5.4): physically contiguous, bound to completion queue
/// `cqid`, medium priority (ignored under round robin).
pub fn create_io_sq_command(qid: u16, entries: u16, base_iova: u64, cqid: u16) -> SubmissionEntry {
    let mut e = SubmissionEntry::new(AdminOpcode::CreateIoSq as u8, 0);
    e.prp1 = base_iova;
    e.cdw10 = qid as u32 | (entries as u32 - 1) << 16;
    e.cdw11 = 1 | (cqid as u32) << 16;
    e
}

/// Delete I/O Submission/Completion Queue (§5.6, §5.5).
pub fn delete_io_queue_command(opcode: AdminOpcode, qid: u16) -> SubmissionEntry {
    debug_assert!(matches!(
        opcode,
        AdminOpcode::DeleteIoSq | AdminOpcode::DeleteIoCq
    ));
    let mut e = SubmissionEntry::new(opcode as u8, 0);
    e.cdw10 = qid as u32;
    e
}

/// Read or Write (NVM command set §6.9 / §6.15): SLBA in CDW10-11, NLB 0-based in CDW12.
/// The data pointer is filled in by the queue from the PRP builder.
pub fn read_write_command(
    opcode: NvmOpcode,
    nsid: u32,
    start_lba: u64,
    block_count: u32,
) -> SubmissionEntry {
    debug_assert!(matches!(opcode, NvmOpcode::Read | NvmOpcode::Write));
    debug_assert!((1..=0x1_0000).contains(&block_count));
    let mut e = SubmissionEntry::new(opcode as u8, nsid);
    e.cdw10 = start_lba as u32;
    e.cdw11 = (start_lba >> 32) as u32;
    e.cdw12 = block_count - 1;
    e
}

/// Flush (NVM command set §6.8).
pub fn flush_command(nsid: u32) -> SubmissionEntry {
    SubmissionEntry::new(NvmOpcode::Flush as u8, nsid)
}

// ---------------------------------------------------------------------------------------
// §5.15.2 Identify data structures
// ---------------------------------------------------------------------------------------

/// Identify Controller data structure, 4096 bytes (§5.15.2.2, CNS 01h).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IdentifyController {
    /// VID: PCI vendor id.
    pub vid: u16,
    /// SSVID: PCI subsystem vendor id.
    pub ssvid: u16,
    /// SN: serial number, ASCII, space padded.
    pub sn: [u8; 20],
    /// MN: model number, ASCII, space padded.
    pub mn: [u8; 40],
    /// FR: firmware revision.
    pub fr: [u8; 8],
    /// RAB: recommended arbitration burst.
    pub rab: u8,
    /// IEEE OUI identifier.
    pub ieee: [u8; 3],
    /// CMIC: controller multi-path I/O and namespace sharing capabilities.
    pub cmic: u8,
    /// MDTS: maximum data transfer size, `2^MDTS` minimum pages; 0 = no limit.
    pub mdts: u8,
    /// CNTLID: controller id.
    pub cntlid: u16,
    /// VER: version (same encoding as VS).
    pub ver: u32,
    /// RTD3R: RTD3 resume latency, microseconds.
    pub rtd3r: u32,
    /// RTD3E: RTD3 entry latency (worst-case shutdown time), microseconds; 0 = not reported.
    pub rtd3e: u32,
    pub reserved_92: [u8; 420],
    /// SQES: required (3:0) and maximum (7:4) submission entry size, log2.
    pub sqes: u8,
    /// CQES: required (3:0) and maximum (7:4) completion entry size, log2.
    pub cqes: u8,
    /// MAXCMD: maximum outstanding commands.
    pub maxcmd: u16,
    /// NN: number of namespaces.
    pub nn: u32,
    /// ONCS: optional NVM command support.
    pub oncs: u16,
    /// FUSES: fused operation support.
    pub fuses: u16,
    /// FNA: format NVM attributes.
    pub fna: u8,
    /// VWC: volatile write cache present (bit 0).
    pub vwc: u8,
    pub reserved_526: [u8; 3570],
}
const _: () = assert!(size_of::<IdentifyController>() == 4096);
const _: () = assert!(offset_of!(IdentifyController, sn) == 4);
const _: () = assert!(offset_of!(IdentifyController, mn) == 24);
const _: () = assert!(offset_of!(IdentifyController, fr) == 64);
const _: () = assert!(offset_of!(IdentifyController, mdts) == 77);
const _: () = assert!(offset_of!(IdentifyController, cntlid) == 78);
const _: () = assert!(offset_of!(IdentifyController, ver) == 80);
const _: () = assert!(offset_of!(IdentifyController, rtd3e) == 88);
const _: () = assert!(offset_of!(IdentifyController, sqes) == 512);
const _: () = assert!(offset_of!(IdentifyController, maxcmd) == 514);
const _: () = assert!(offset_of!(IdentifyController, nn) == 516);
const _: () = assert!(offset_of!(IdentifyController, oncs) == 520);
const _: () = assert!(offset_of!(IdentifyController, vwc) == 525);

impl IdentifyController {
    /// Parses the 4096-byte structure (little endian); `None` if `bytes` is short.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let b = bytes.get(..4096)?;
        let mut s = IdentifyController {
            vid: le16(b, 0),
            ssvid: le16(b, 2),
            sn: [0; 20],
            mn: [0; 40],
            fr: [0; 8],
            rab: b[72],
            ieee: [b[73], b[74], b[75]],
            cmic: b[76],
            mdts: b[77],
            cntlid: le16(b, 78),
            ver: le32(b, 80),
            rtd3r: le32(b, 84),
            rtd3e: le32(b, 88),
            reserved_92: [0; 420],
            sqes: b[512],
            cqes: b[513],
            maxcmd: le16(b, 514),
            nn: le32(b, 516),
            oncs: le16(b, 520),
            fuses: le16(b, 522),
            fna: b[524],
            vwc: b[525],
            reserved_526: [0; 3570],
        };
        s.sn.copy_from_slice(&b[4..24]);
        s.mn.copy_from_slice(&b[24..64]);
        s.fr.copy_from_slice(&b[64..72]);
        s.reserved_92.copy_from_slice(&b[92..512]);
        s.reserved_526.copy_from_slice(&b[526..4096]);
        Some(s)
    }
    pub fn serial(&self) -> String {
        ascii_field(&self.sn)
    }
    pub fn model(&self) -> String {
        ascii_field(&self.mn)
    }
    pub fn firmware(&self) -> String {
        ascii_field(&self.fr)
    }
    /// Maximum transfer in bytes for a given controller page size; `None` = unlimited.
    pub fn max_transfer_bytes(&self, page_size_bytes: u64) -> Option<u64> {
        (self.mdts != 0).then(|| page_size_bytes << self.mdts.min(20))
    }
    /// ONCS bit 0: Compare; bit 2: Dataset Management; ... we only report the cache.
    pub fn has_volatile_write_cache(&self) -> bool {
        self.vwc & 1 == 1
    }
}

/// LBA Format data structure, 4 bytes (§5.15.2.1, in Identify Namespace).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LbaFormat(pub u32);
const _: () = assert!(size_of::<LbaFormat>() == 4);
impl LbaFormat {
    /// MS: metadata bytes per LBA.
    pub fn metadata_size_bytes(self) -> u16 {
        self.0 as u16
    }
    /// LBADS: LBA data size, log2 bytes (0 = format not available).
    pub fn data_size_shift(self) -> u8 {
        (self.0 >> 16) as u8
    }
    /// RP: relative performance (0 = best).
    pub fn relative_performance(self) -> u8 {
        (self.0 >> 24 & 0x3) as u8
    }
}

/// Identify Namespace data structure, 4096 bytes (§5.15.2.1, CNS 00h).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IdentifyNamespace {
    /// NSZE: namespace size in logical blocks.
    pub nsze: u64,
    /// NCAP: namespace capacity in logical blocks.
    pub ncap: u64,
    /// NUSE: namespace utilization in logical blocks.
    pub nuse: u64,
    /// NSFEAT: namespace features.
    pub nsfeat: u8,
    /// NLBAF: number of LBA formats, 0-based.
    pub nlbaf: u8,
    /// FLBAS: formatted LBA size; bits 3:0 index `lbaf`.
    pub flbas: u8,
    /// MC: metadata capabilities.
    pub mc: u8,
    /// DPC: end-to-end data protection capabilities.
    pub dpc: u8,
    /// DPS: end-to-end data protection type settings.
    pub dps: u8,
    pub reserved_30: [u8; 98],
    /// LBAF0..LBAF15.
    pub lbaf: [LbaFormat; 16],
    pub reserved_192: [u8; 3904],
}
const _: () = assert!(size_of::<IdentifyNamespace>() == 4096);
const _: () = assert!(offset_of!(IdentifyNamespace, ncap) == 8);
const _: () = assert!(offset_of!(IdentifyNamespace, nuse) == 16);
const _: () = assert!(offset_of!(IdentifyNamespace, nlbaf) == 25);
const _: () = assert!(offset_of!(IdentifyNamespace, flbas) == 26);
const _: () = assert!(offset_of!(IdentifyNamespace, dps) == 29);
const _: () = assert!(offset_of!(IdentifyNamespace, lbaf) == 128);

impl IdentifyNamespace {
    /// Parses the 4096-byte structure; `None` if `bytes` is short.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let b = bytes.get(..4096)?;
        let mut s = IdentifyNamespace {
            nsze: le64(b, 0),
            ncap: le64(b, 8),
            nuse: le64(b, 16),
            nsfeat: b[24],
            nlbaf: b[25],
            flbas: b[26],
            mc: b[27],
            dpc: b[28],
            dps: b[29],
            reserved_30: [0; 98],
            lbaf: [LbaFormat(0); 16],
            reserved_192: [0; 3904],
        };
        s.reserved_30.copy_from_slice(&b[30..128]);
        for (i, f) in s.lbaf.iter_mut().enumerate() {
            *f = LbaFormat(le32(b, 128 + 4 * i));
        }
        s.reserved_192.copy_from_slice(&b[192..4096]);
        Some(s)
    }
    /// The LBA format in use (FLBAS bits 3:0).
    pub fn active_lba_format(&self) -> LbaFormat {
        self.lbaf[(self.flbas & 0xF) as usize]
    }
    /// Logical block size in bytes, `None` if the format is unusable (LBADS < 9 or > 16).
    pub fn block_size_bytes(&self) -> Option<u32> {
        let shift = self.active_lba_format().data_size_shift();
        (9..=16).contains(&shift).then(|| 1u32 << shift)
    }
    /// Whether each block carries separate metadata we would have to supply.
    pub fn has_metadata(&self) -> bool {
        self.active_lba_format().metadata_size_bytes() != 0
    }
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn le64(b: &[u8], at: usize) -> u64 {
    (le32(b, at) as u64) | (le32(b, at + 4) as u64) << 32
}
fn ascii_field(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw)
        .trim_end_matches([' ', '\0'])
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves CAP decoding of a QEMU-like value: MQES 2047, CQR, TO 7.5 s, DSTRD 0, CSS NVM, MPS 4K..4K.
    #[test]
    fn capabilities_decode_known_value() {
        let cap = Capabilities(0x0000_0020_0f01_07ff);
        assert_eq!(cap.max_queue_entries(), 2048);
        assert!(cap.contiguous_queues_required());
        assert_eq!(cap.ready_timeout_ms(), 15 * 500);
        assert_eq!(cap.doorbell_stride_bytes(), 4);
        assert!(cap.supports_nvm_command_set());
        assert_eq!(cap.min_page_size_bytes(), 4096);
        let strided = Capabilities(0x3 << 32 | 0x1 << 48);
        assert_eq!(strided.doorbell_stride_bytes(), 32);
        assert_eq!(strided.min_page_size_bytes(), 8192);
    }

    // Proves doorbell offsets follow 0x1000 + (2y [+1]) * (4 << DSTRD).
    #[test]
    fn doorbell_offsets_use_stride() {
        assert_eq!(sq_tail_doorbell_offset(0, 4), 0x1000);
        assert_eq!(cq_head_doorbell_offset(0, 4), 0x1004);
        assert_eq!(sq_tail_doorbell_offset(3, 4), 0x1018);
        assert_eq!(cq_head_doorbell_offset(3, 16), 0x1000 + 7 * 16);
    }

    // Proves the CC bit fields land where §3.1.5 puts them (EN, MPS, SHN, IOSQES, IOCQES).
    #[test]
    fn controller_config_fields() {
        let cc = ControllerConfig::default()
            .with_io_sq_entry_size_shift(6)
            .with_io_cq_entry_size_shift(4)
            .with_enabled(true);
        assert_eq!(cc.0, 0x0046_0001);
        let shn = cc.with_shutdown_notification(ShutdownNotification::Normal);
        assert_eq!(shn.0, 0x0046_4001);
        assert_eq!(shn.shutdown_notification(), ShutdownNotification::Normal);
        assert!(!shn.with_enabled(false).enabled());
        assert_eq!(
            ControllerStatus(0b1001).shutdown_status(),
            ShutdownStatus::Complete
        );
        assert!(ControllerStatus(0b11).fatal());
    }

    // Proves a known completion byte image decodes cid, phase, SQ head and status.
    #[test]
    fn completion_entry_decode_known_bytes() {
        // cid 0x1234, phase 1, SCT 2 SC 0x81 (unrecovered read error), DNR set.
        let status = 0x81u32 | 2 << 8 | 1 << 14;
        let e = CompletionEntry {
            dw0: 7,
            dw1: 0,
            dw2: 5 | 1 << 16,
            dw3: 0x1234 | 1 << 16 | status << 17,
        };
        assert_eq!(e.command_id(), 0x1234);
        assert!(e.phase());
        assert_eq!(e.sq_head(), 5);
        assert_eq!(e.sq_id(), 1);
        let st = e.status();
        assert!(st.do_not_retry && !st.more);
        assert_eq!(
            st.decode(),
            StatusCode::Media(MediaStatus::UnrecoveredReadError)
        );
        assert_eq!(
            CompletionEntry::build(0x1234, 1, 5, true, st.to_field(), 7),
            e
        );
    }

    // Proves unknown status codes and types decode to Unknown without loss.
    #[test]
    fn status_unknown_round_trips() {
        for field in [0x00FFu16, 0x0542, 0x0642, 0x7FFF] {
            let s = Status::from_field(field);
            assert_eq!(s.to_field(), field & 0x7FFF);
        }
        assert_eq!(
            Status::from_field(0x0642).code_type,
            StatusCodeType::Unknown(6)
        );
        assert_eq!(GenericStatus::from_raw(0x55), GenericStatus::Unknown(0x55));
        assert_eq!(GenericStatus::LbaOutOfRange.raw(), 0x80);
    }

    // Proves the status field decodes and re-encodes losslessly for all 2^15 values.
    #[test]
    fn status_field_exhaustive_round_trip() {
        for field in 0..0x8000u16 {
            let st = Status::from_field(field);
            assert_eq!(st.to_field(), field);
            assert_eq!(st.is_success(), field & 0x7FF == 0, "{field:#x}");
        }
    }

    proptest::proptest! {
        #![proptest_config(crate::nvme::proptest_config(256))]
        // Proves building a completion entry and reading it back gives every field unchanged.
        #[test]
        fn completion_entry_round_trip(cid: u16, sqid: u16, sqhd: u16, phase: bool, status in 0u16..0x8000, dw0: u32) {
            let e = CompletionEntry::build(cid, sqid, sqhd, phase, status, dw0);
            proptest::prop_assert_eq!(
                (e.command_id(), e.sq_id(), e.sq_head(), e.phase(), e.status().to_field(), e.dw0),
                (cid, sqid, sqhd, phase, status, dw0)
            );
        }

        // Proves Identify parsing never panics on arbitrary 4096-byte images and keeps the
        // block size within 512 B..64 KiB when it reports one.
        #[test]
        fn identify_parse_arbitrary(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 4096)) {
            let ns = IdentifyNamespace::parse(&bytes).expect("4096 bytes");
            if let Some(bs) = ns.block_size_bytes() {
                proptest::prop_assert!((512..=65536).contains(&bs));
            }
            let id = IdentifyController::parse(&bytes).expect("4096 bytes");
            let _ = (id.serial(), id.model(), id.max_transfer_bytes(4096));
        }
    }

    // Proves Read/Write encode SLBA across CDW10/11 and a 0-based block count.
    #[test]
    fn read_write_command_encoding() {
        let mut e = read_write_command(NvmOpcode::Write, 1, 0x1_2345_6789, 8);
        e.set_command_id(9);
        assert_eq!(e.cdw0, 0x0009_0001);
        assert_eq!((e.cdw10, e.cdw11, e.cdw12), (0x2345_6789, 1, 7));
        let cq = create_io_cq_command(2, 64, 0x1000);
        assert_eq!((cq.cdw10, cq.cdw11, cq.prp1), (2 | 63 << 16, 1, 0x1000));
        let sq = create_io_sq_command(2, 64, 0x2000, 2);
        assert_eq!(sq.cdw11, 1 | 2 << 16);
        assert_eq!(set_number_of_queues_command(4, 4).cdw11, 0x0003_0003);
        assert_eq!(number_of_queues_allocated(0x0001_0003), (4, 2));
    }

    // Proves Identify Namespace parsing of a known image: size, FLBAS selecting a 4K format.
    #[test]
    fn identify_namespace_parse_known_image() {
        let mut img = vec![0u8; 4096];
        img[0..8].copy_from_slice(&1000u64.to_le_bytes());
        img[8..16].copy_from_slice(&900u64.to_le_bytes());
        img[25] = 1; // two formats
        img[26] = 1; // use LBAF1
        img[128..132].copy_from_slice(&(9u32 << 16).to_le_bytes());
        img[132..136].copy_from_slice(&(12u32 << 16).to_le_bytes());
        let ns = IdentifyNamespace::parse(&img).unwrap();
        assert_eq!((ns.nsze, ns.ncap), (1000, 900));
        assert_eq!(ns.block_size_bytes(), Some(4096));
        assert!(!ns.has_metadata());
        assert!(IdentifyNamespace::parse(&img[..4095]).is_none());
        img[134] = 3; // LBAF1.LBADS = 3: malformed
        assert_eq!(
            IdentifyNamespace::parse(&img).unwrap().block_size_bytes(),
            None
        );
    }

    // Proves Identify Controller parsing of a known image: strings, MDTS, NN, VWC.
    #[test]
    fn identify_controller_parse_known_image() {
        let mut img = vec![0u8; 4096];
        img[0..2].copy_from_slice(&0x1b36u16.to_le_bytes());
        img[4..24].copy_from_slice(b"lavik               ");
        img[24..30].copy_from_slice(b"QEMU N");
        img[77] = 7;
        img[512] = 0x66;
        img[513] = 0x44;
        img[516..520].copy_from_slice(&256u32.to_le_bytes());
        img[525] = 1;
        let id = IdentifyController::parse(&img).unwrap();
        assert_eq!(id.vid, 0x1b36);
        assert_eq!(id.serial(), "lavik");
        assert_eq!(id.model(), "QEMU N");
        assert_eq!(id.max_transfer_bytes(4096), Some(512 * 1024));
        assert_eq!(id.nn, 256);
        assert!(id.has_volatile_write_cache());
        assert!(IdentifyController::parse(&img[..100]).is_none());
    }
}
