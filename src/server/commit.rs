//! Group commit that never stalls the worker (see `docs/architecture.md`, "Durability of
//! replies"): flush epochs whose chunk writes and `fdatasync`s run on the worker's ring,
//! replies held until the epoch that covers them is durable, and the synchronous flushes
//! for `appendfsync no` and for devices without a file descriptor.
//!
//! A child of `worker`: these are `Worker` methods and use its fields directly; the loop
//! calls `flush_storage` once a round and routes chunk-write and sync completions here.

use super::Worker;
use crate::runtime::ring::{file_target, push_sqe, FileTarget};
use crate::runtime::{user_data, OpKind};
use crate::server::Msg;
use crate::storage::FsyncPolicy;
use io_uring::{opcode, types};
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Group commit that does not stall the worker: a flush *epoch* writes every
/// shard's staged records (one device write each) and then syncs the data files
/// with `fdatasync` submitted on the worker's ring. While it runs the worker
/// goes on serving; replies that acknowledge (or reveal) writes not yet durable
/// are held, tagged with the epoch that covers them, and leave when it ends.
/// Up to `EPOCHS_INFLIGHT_MAX` epochs are in flight; their writes are issued
/// in order (each completes before the next starts) and they become durable in
/// order, so a reply never leaves before every earlier write is durable.
#[derive(Default)]
pub(super) struct GroupCommit {
    /// Epochs started; epochs whose syncs all completed (`durable <= issued`).
    pub(super) issued: u64,
    pub(super) durable: u64,
    /// Epochs started and not yet durable, oldest first.
    pub(super) inflight: VecDeque<Epoch>,
    /// A write ran after the newest epoch started: the next must cover it.
    pub(super) wanted: bool,
    /// Chunk writes on the ring (all belong to the newest epoch).
    pub(super) writes_inflight: u32,
    /// Held replies tagged with an epoch up to this one must not leave (the
    /// epoch failed); with the message they get instead.
    pub(super) failed_upto: u64,
    pub(super) failed_text: String,
}

pub(super) struct Epoch {
    pub(super) id: u64,
    /// Its chunk writes still in flight; its syncs are issued when none is left.
    pub(super) writes_left: u32,
    /// The data files to sync once its writes are done.
    pub(super) fds: Vec<RawFd>,
    /// Its `fdatasync`s that have not completed.
    pub(super) syncs_left: u32,
    /// Its first error (its write or one of its syncs).
    pub(super) error: Option<String>,
    pub(super) started: Instant,
    /// When its writes were done and its syncs issued.
    pub(super) synced_from: Option<Instant>,
}

/// Group-commit epochs whose `fdatasync` may be in flight at once. More than
/// one lets a write that arrives during a sync start its own sync at once
/// instead of waiting for the one in flight to end.
const EPOCHS_INFLIGHT_MAX: usize = 8;

/// Records one shard's part of an epoch: the files it needs synced, or its error.
fn note_flush(epoch: &mut Epoch, shard: u32, r: Result<Vec<RawFd>, crate::storage::StorageError>) {
    match r {
        Ok(list) => {
            for fd in list {
                if !epoch.fds.contains(&fd) {
                    epoch.fds.push(fd);
                }
            }
        }
        Err(e) => {
            tracing::error!("shard {shard} flush failed: {e}");
            epoch.error.get_or_insert(e.to_string());
        }
    }
}

impl Worker {
    pub(super) fn flush_storage(&mut self, now: u64) {
        // The round's coalesced lists become records before the epoch takes them, so an
        // `always` reply still waits for everything it acknowledged (collections 5a).
        self.store_coalesced(now);
        self.round_need = 0;
        match self.fsync {
            FsyncPolicy::No => self.flush_storage_sync(now),
            FsyncPolicy::Always => {
                // Records staged by background work alone (defrag relocations,
                // expiry tombstones) acknowledge nothing: they wait for the
                // flush-max-ms window instead of costing a sync every round.
                if std::mem::take(&mut self.round_writes) {
                    self.commit.wanted = true;
                }
                if self.can_start_epoch() {
                    let window_over = now.saturating_sub(self.last_background_flush_ms)
                        >= self.shared.settings.cli.flush_max_ms;
                    let background = window_over && self.shards.held().any(|s| s.has_unflushed());
                    if self.commit.wanted || background {
                        self.start_epoch(now);
                    }
                }
                self.round_need = self.commit.issued + u64::from(self.commit.wanted);
            }
            FsyncPolicy::EverySec => {
                self.round_writes = false;
                if self.commit.inflight.is_empty() && self.shards.held().any(|s| s.flush_due(now)) {
                    self.start_epoch(now);
                }
            }
        }
    }

    /// A new epoch may start: fewer than the maximum in flight, and the newest
    /// one's chunk writes are done (a shard has at most one write in flight, and
    /// an epoch's writes are issued after the previous epoch's have completed).
    pub(super) fn can_start_epoch(&self) -> bool {
        self.commit.inflight.len() < EPOCHS_INFLIGHT_MAX
            && self
                .commit
                .inflight
                .back()
                .is_none_or(|e| e.writes_left == 0)
    }

    /// Starts a group-commit epoch: every shard with staged records (all of
    /// them with `always`, those whose window is over with `everysec`) hands
    /// its chunk to a write on the ring, and the worker goes on serving; when
    /// the epoch's writes have completed, one `fdatasync` per data file goes on
    /// the ring (`on_chunk_write`).
    pub(super) fn start_epoch(&mut self, now: u64) {
        let always = self.fsync == FsyncPolicy::Always;
        let id = self.commit.issued + 1;
        let mut epoch = Epoch {
            id,
            writes_left: 0,
            fds: Vec::new(),
            syncs_left: 0,
            error: self.coalesce_error.take(),
            started: Instant::now(),
            synced_from: None,
        };
        for shard in self.shards.held() {
            let due = if always {
                shard.has_unflushed()
            } else {
                shard.flush_due(now)
            };
            if !due {
                continue;
            }
            let sid = shard.id();
            let r = match shard.flush_chunk_begin() {
                Ok(Some(io)) => {
                    let sqe = match file_target(&self.fixed_files, io.fd) {
                        FileTarget::Fixed(f) => {
                            opcode::Write::new(types::Fixed(f), io.ptr, io.len as u32)
                                .offset(io.offset)
                                .build()
                        }
                        FileTarget::Fd(fd) => {
                            opcode::Write::new(types::Fd(fd), io.ptr, io.len as u32)
                                .offset(io.offset)
                                .build()
                        }
                    }
                    .user_data(user_data(OpKind::ChunkWrite, u64::from(sid)));
                    push_sqe(&mut self.ring, &sqe);
                    epoch.writes_left += 1;
                    self.commit.writes_inflight += 1;
                    Ok(Vec::new())
                }
                Ok(None) => shard.flush_write(),
                Err(e) => Err(e),
            };
            note_flush(&mut epoch, sid, r);
        }
        self.commit.issued = id;
        self.commit.wanted = false;
        self.last_background_flush_ms = now;
        let writes = epoch.writes_left;
        self.commit.inflight.push_back(epoch);
        if writes == 0 {
            self.issue_syncs(now);
        }
        // Start the device work now rather than at the end of the round.
        let _ = self.ring.submit();
    }

    /// The newest epoch's writes are done: its syncs go on the ring (or, with
    /// none to do, it may be durable already).
    pub(super) fn issue_syncs(&mut self, now: u64) {
        let Some(epoch) = self.commit.inflight.back_mut() else {
            return;
        };
        let id = epoch.id;
        epoch.synced_from = Some(Instant::now());
        epoch.syncs_left = epoch.fds.len() as u32;
        for fd in std::mem::take(&mut epoch.fds) {
            let sqe = match file_target(&self.fixed_files, fd) {
                FileTarget::Fixed(f) => opcode::Fsync::new(types::Fixed(f)),
                FileTarget::Fd(fd) => opcode::Fsync::new(types::Fd(fd)),
            }
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .user_data(user_data(OpKind::Fsync, id));
            push_sqe(&mut self.ring, &sqe);
        }
        if self
            .commit
            .inflight
            .back()
            .is_some_and(|e| e.syncs_left == 0)
        {
            self.advance_epochs(now);
        } else {
            let _ = self.ring.submit();
        }
    }

    /// A shard's chunk write completed: the shard retries a failed one itself;
    /// the epoch's syncs start when its last write is done.
    pub(super) fn on_chunk_write(&mut self, shard_id: u64, res: i32, now: u64) {
        self.commit.writes_inflight = self.commit.writes_inflight.saturating_sub(1);
        let r = match self
            .shards
            .slots
            .get_mut(shard_id as usize)
            .and_then(|s| s.as_mut())
        {
            Some(shard) => shard.flush_chunk_done(res),
            None => Err(crate::storage::StorageError::Corrupt(format!(
                "chunk write completion for shard {shard_id}, which this worker does not hold"
            ))),
        };
        // Only the newest epoch can have writes in flight.
        let Some(epoch) = self.commit.inflight.back_mut() else {
            tracing::error!("chunk write completion outside an epoch");
            return;
        };
        note_flush(epoch, shard_id as u32, r);
        epoch.writes_left = epoch.writes_left.saturating_sub(1);
        if epoch.writes_left == 0 {
            self.issue_syncs(now);
        }
    }

    pub(super) fn on_fsync(&mut self, id: u64, res: i32, now: u64) {
        let delay = self.shared.settings.cli.debug_sync_delay_ms;
        if delay > 0 {
            self.delayed_syncs
                .push_back((Instant::now() + Duration::from_millis(delay), id, res));
            return;
        }
        self.fsync_done(id, res, now);
    }

    /// `--debug-sync-delay-ms`: syncs whose delay is over count as completed now.
    pub(super) fn release_delayed_syncs(&mut self, now: u64) {
        while self
            .delayed_syncs
            .front()
            .is_some_and(|d| d.0 <= Instant::now())
        {
            if let Some((_, id, res)) = self.delayed_syncs.pop_front() {
                self.fsync_done(id, res, now);
            }
        }
    }

    pub(super) fn fsync_done(&mut self, id: u64, res: i32, now: u64) {
        let Some(epoch) = self.commit.inflight.iter_mut().find(|e| e.id == id) else {
            tracing::error!("fdatasync completion for unknown epoch {id}");
            return;
        };
        if res < 0 {
            let e = std::io::Error::from_raw_os_error(-res);
            tracing::error!("fdatasync of a data file failed: {e}");
            epoch.error.get_or_insert(e.to_string());
        }
        epoch.syncs_left = epoch.syncs_left.saturating_sub(1);
        self.advance_epochs(now);
    }

    /// Epochs at the front whose syncs all ended are durable: their held
    /// replies may leave (or, if one failed, must not); writes made meanwhile
    /// start the next epoch at once.
    pub(super) fn advance_epochs(&mut self, now: u64) {
        // Durable: every write done, its syncs issued and all of them completed (an
        // epoch still writing has no syncs counted yet: it is not durable).
        while self
            .commit
            .inflight
            .front()
            .is_some_and(|e| e.writes_left == 0 && e.synced_from.is_some() && e.syncs_left == 0)
        {
            let Some(epoch) = self.commit.inflight.pop_front() else {
                break;
            };
            self.commit.durable = epoch.id;
            let end = Instant::now();
            let synced_from = epoch.synced_from.unwrap_or(end);
            let st = &self.shared.stats;
            st.commit_epochs.fetch_add(1, Ordering::Relaxed);
            self.shared.cmdstats.latency.add_if_needed(
                "lavik-commit",
                end.duration_since(epoch.started).as_millis() as u64,
            );
            st.commit_write_us.fetch_add(
                synced_from.duration_since(epoch.started).as_micros() as u64,
                Ordering::Relaxed,
            );
            st.commit_sync_us.fetch_add(
                end.duration_since(synced_from).as_micros() as u64,
                Ordering::Relaxed,
            );
            if let Some(err) = epoch.error {
                self.shared
                    .stats
                    .flush_failures
                    .fetch_add(1, Ordering::Relaxed);
                if self.fsync == FsyncPolicy::Always {
                    self.commit.failed_upto = epoch.id;
                    self.commit.failed_text =
                        format!("-ERR storage flush failed, write not acknowledged: {err}\r\n");
                }
            }
        }
        if self.commit.wanted && self.fsync == FsyncPolicy::Always && self.can_start_epoch() {
            self.start_epoch(now);
        }
    }

    /// Flushes with the sync done in place (`appendfsync no` writes without
    /// syncing, so nothing waits).
    pub(super) fn flush_storage_sync(&mut self, now: u64) {
        // Nothing waits for a sync under `no`: a failed store of coalesced lists was
        // logged and counted, and must not fail a later epoch if the policy changes.
        self.coalesce_error = None;
        let mut failed: Option<String> = None;
        // With `always`, a round that ran a write flushes every shard with staged
        // records before any reply leaves. Records staged by background work
        // alone (defrag relocations, expiry tombstones) acknowledge nothing, so
        // they wait for the flush-max-ms window instead of costing an fsync on
        // every round.
        let always = self.fsync == FsyncPolicy::Always;
        let window_over = now.saturating_sub(self.last_background_flush_ms)
            >= self.shared.settings.cli.flush_max_ms;
        let foreground = std::mem::take(&mut self.round_writes);
        let mut flushed_background = false;
        for shard in self.shards.held() {
            let due = if always {
                shard.has_unflushed() && (foreground || window_over)
            } else {
                shard.flush_due(now)
            };
            if due {
                flushed_background |= !foreground;
                if let Err(e) = shard.flush() {
                    tracing::error!("shard {} flush failed: {e}", shard.id());
                    failed = Some(e.to_string());
                }
            }
        }
        if flushed_background {
            self.last_background_flush_ms = now;
        }
        let Some(err) = failed else { return };
        self.shared
            .stats
            .flush_failures
            .fetch_add(1, Ordering::Relaxed);
        if self.fsync == FsyncPolicy::No {
            return;
        }
        // Replies of this round may acknowledge writes that are not durable:
        // none of them leave. Local clients lose the connection (no false
        // OK); remote requesters get an error in place of their reply.
        let text = format!("-ERR storage flush failed, write not acknowledged: {err}\r\n");
        for slot in 0..self.conns.len() as u32 {
            let unsent = matches!(self.conns[slot as usize].as_ref(), Some(c) if !c.out.is_empty() && !c.closing);
            if unsent {
                if let Some(c) = self.conns[slot as usize].as_mut() {
                    c.out.clear();
                }
                self.begin_close(slot);
                self.maybe_free(slot);
            }
        }
        for msgs in self.outbox.iter_mut() {
            for m in msgs.iter_mut() {
                if let Msg::Reply { bytes, .. } = m {
                    *bytes = text.clone().into_bytes();
                }
            }
        }
    }

    /// Group commit: this round's replies wait for the epoch that makes them
    /// true, behind any older held ones; those whose epoch ended may leave.
    /// Runs before anything is sent, whatever the connection's transport.
    pub(super) fn gate_replies(&mut self) {
        let need = self.round_need;
        let durable = self.commit.durable;
        // Nothing to hold and nothing held (the common case without `always`): no
        // pass over the connections. Bytes left unsent from such rounds may be held
        // once gating resumes, which only delays them, in order.
        if need <= durable && !self.any_held {
            return;
        }
        let mut any_held = false;
        for slot in 0..self.conns.len() {
            let Some(conn) = self.conns[slot].as_mut() else {
                continue;
            };
            if conn.closing {
                continue;
            }
            // Group commit: this round's replies wait for the epoch that makes
            // them true, behind any older held ones; those whose epoch ended go.
            let cleared = conn.out_cleared.min(conn.out.len());
            if conn.out.len() > cleared && (need > durable || !conn.held.is_empty()) {
                let tag = need.max(conn.held.back().map_or(0, |h| h.0));
                let bytes = conn.out.split_off(cleared);
                match conn.held.back_mut() {
                    Some((t, b)) if *t == tag => b.extend_from_slice(&bytes),
                    _ => conn.held.push_back((tag, bytes)),
                }
            }
            if conn
                .held
                .front()
                .is_some_and(|h| h.0 <= self.commit.failed_upto)
            {
                // Their epoch failed: no false acknowledgement leaves.
                conn.held.clear();
                conn.out.clear();
                self.begin_close(slot as u32);
                self.maybe_free(slot as u32);
                continue;
            }
            while conn.held.front().is_some_and(|h| h.0 <= durable) {
                if let Some((_, b)) = conn.held.pop_front() {
                    conn.out.extend_from_slice(&b);
                }
            }
            conn.out_cleared = conn.out.len();
            any_held |= !conn.held.is_empty();
        }
        self.any_held = any_held;
    }
}
