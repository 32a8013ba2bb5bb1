//! Groups: crash atomicity of a write that spans several shards (`docs/atomic-writes.md`).
//!
//! A multi-shard command takes one group id from the store's [`GroupTable`]; every put and
//! tombstone it appends in each shard is GROUPED (flag bit 1, the id after the payload), and
//! at its end each shard that wrote appends a part record naming how many records it wrote
//! and every shard that took part. Recovery applies a group's records only when the group is
//! complete (every named shard's part and all of its records are in committed chunks) or
//! when a marker says it was decided; otherwise none of them.
//!
//! A group is *decided* once all its parts are durable (the server flushes and syncs the
//! participants before it lets anything else see them, `Shard::group_flush_write`). Every
//! marker carries `decided_below` D: all groups with a smaller id are decided, so their
//! GROUPED records and parts may be dropped or freed like any other superseded record
//! without making the group look incomplete later. D only grows.
//!
//! Invariant: D is never above an undecided group. Allocation does not move D (the new id
//! is the old `next`), deciding may raise it; markers read it without a lock.
use super::format::GroupPartPayload;
use super::{FsyncPolicy, Shard, StorageError};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The store-wide group counter and the groups not yet decided.
#[derive(Debug, Default)]
pub(crate) struct GroupTable {
    state: Mutex<GroupState>,
    /// `min(undecided ∪ {next})`, published for markers.
    decided_below: AtomicU64,
}

#[derive(Debug, Default)]
struct GroupState {
    next: u64,
    undecided: BTreeSet<u64>,
}

impl GroupTable {
    /// After recovery: ids start at `next`; D is `decided_below` until [`GroupTable::open`]
    /// (recovery first makes aborted groups harmless, then lets D pass them).
    pub(crate) fn start(&self, next: u64, decided_below: u64) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.next = next.max(1);
        st.undecided.clear();
        self.decided_below
            .store(decided_below.min(st.next), Ordering::Release);
    }

    /// Every group allocated so far is decided (recovery finished neutralising).
    pub(crate) fn open(&self) {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.publish(&st);
    }

    fn publish(&self, st: &GroupState) {
        let d = st.undecided.first().copied().unwrap_or(st.next);
        self.decided_below.fetch_max(d, Ordering::AcqRel);
    }

    pub(crate) fn alloc(&self) -> u64 {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let g = st.next.max(1);
        st.next = g + 1;
        st.undecided.insert(g);
        g
    }

    /// All parts of `g` are durable.
    pub(crate) fn decide(&self, g: u64) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.undecided.remove(&g);
        self.publish(&st);
    }

    pub(crate) fn decided_below(&self) -> u64 {
        self.decided_below.load(Ordering::Acquire)
    }

    pub(crate) fn next(&self) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).next
    }

    /// A checkpoint says ids below `next` were used: allocate above them.
    pub(crate) fn raise_next(&self, next: u64) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.next = st.next.max(next);
    }
}

/// One thread's write scopes over the shards it holds (`ShardSet::groups`): the server opens
/// one around every command that may write several records (several keys, a script, an
/// EXEC), over the shards of its keys. Over one shard it is a command scope (a block seal
/// does not split the command, `Shard::command_begin`); over several it is a group. Scopes
/// nest (EXEC, then its commands): only the outermost allocates and ends a group.
#[derive(Debug, Default)]
pub struct WriteGroups {
    open: Vec<OpenScope>,
    /// Groups ended and not yet settled: (id, shards that wrote records of it).
    ended: Vec<(u64, Vec<u32>)>,
    /// A coordinated pass runs: its groups are settled once, when it ends.
    pub in_pass: bool,
}

#[derive(Debug)]
struct OpenScope {
    /// The group this scope allocated (`None`: a command scope, or nested in a group).
    group: Option<u64>,
    shards: Vec<u32>,
}

impl WriteGroups {
    /// A scope is open (a multi-record command, a script, EXEC, a coordinated pass).
    pub fn is_open(&self) -> bool {
        !self.open.is_empty() || self.in_pass
    }

    /// Opens a scope over `shards` (ascending, distinct; every one held in `slots`).
    pub fn begin(&mut self, slots: &mut [Option<Shard>], shards: Vec<u32>) {
        let outer = self.open.iter().rev().find_map(|s| s.group);
        let group = match outer {
            // A group is settled with a synchronous flush and sync of its shards when it ends.
            // Under `appendfsync always` a reply waits for a sync anyway; under everysec/no
            // that sync per multi-shard command cost 15-70x of MSET's rate (measured,
            // docs/atomic-writes.md "Cost"), so there the shards get command scopes only
            // (no block seal splits a command in one shard) until settling is batched.
            None if shards.len() > 1 => slots[shards[0] as usize]
                .as_ref()
                .filter(|s| s.fsync_policy() == FsyncPolicy::Always)
                .map(|s| s.group_alloc()),
            _ => None,
        };
        for &id in &shards {
            if let Some(s) = slots[id as usize].as_mut() {
                match group.or(outer) {
                    Some(g) => s.group_begin(g),
                    None => s.command_begin(),
                }
            }
        }
        if let (Some(_), None) = (outer, group) {
            // Nested in a group: the outermost scope ends it on these shards too.
            if let Some(owner) = self.open.iter_mut().rev().find(|s| s.group.is_some()) {
                for &id in &shards {
                    if let Err(at) = owner.shards.binary_search(&id) {
                        owner.shards.insert(at, id);
                    }
                }
            }
        }
        self.open.push(OpenScope { group, shards });
    }

    /// Closes the innermost scope. Ending a group appends each writing shard's part record;
    /// the group then waits for [`WriteGroups::settle`].
    pub fn end(&mut self, slots: &mut [Option<Shard>]) -> Result<(), StorageError> {
        let Some(scope) = self.open.pop() else {
            return Ok(());
        };
        let Some(group) = scope.group else {
            for &id in &scope.shards {
                if let Some(s) = slots[id as usize].as_mut() {
                    s.command_end();
                }
            }
            return Ok(());
        };
        let wrote: Vec<u32> = scope
            .shards
            .iter()
            .copied()
            .filter(|&id| {
                slots[id as usize]
                    .as_ref()
                    .is_some_and(|s| s.group_records() > 0)
            })
            .collect();
        let mut result = Ok(());
        let mut any = None;
        for &id in &scope.shards {
            if let Some(s) = slots[id as usize].as_mut() {
                let r = s.group_end(&wrote);
                if result.is_ok() {
                    result = r;
                }
                any = Some(id);
            }
        }
        if wrote.is_empty() {
            // Nothing was written anywhere: nothing to wait for.
            if let Some(s) = any.and_then(|id| slots[id as usize].as_ref()) {
                s.group_decide(group);
            }
        } else {
            self.ended.push((group, wrote));
        }
        result
    }

    /// Whether groups wait to be settled.
    pub fn unsettled(&self) -> bool {
        !self.ended.is_empty()
    }

    /// Makes every ended group durable and decided: writes each participant's chunk, syncs
    /// the store's devices once (not under `appendfsync no`), then lets markers say the
    /// groups are decided. On an error the groups stay undecided (recovery then judges them
    /// by their parts).
    pub fn settle(&mut self, slots: &mut [Option<Shard>]) -> Result<(), StorageError> {
        if self.ended.is_empty() {
            return Ok(());
        }
        let mut ids: Vec<u32> = self
            .ended
            .iter()
            .flat_map(|(_, w)| w.iter().copied())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let mut last = None;
        for &id in &ids {
            if let Some(s) = slots[id as usize].as_mut() {
                s.group_flush_write()?;
                last = Some(id);
            }
        }
        let Some(s) = last.and_then(|id| slots[id as usize].as_mut()) else {
            return Ok(());
        };
        if s.fsync_policy() != FsyncPolicy::No {
            s.sync_store_devices()?;
        }
        for (g, _) in self.ended.drain(..) {
            s.group_decide(g);
        }
        Ok(())
    }
}

/// What one shard's scan found of groups.
#[derive(Debug, Default)]
pub(crate) struct ScannedGroups {
    /// Per group: the distinct sequence numbers of its GROUPED records in this shard.
    pub records: HashMap<u64, BTreeSet<u64>>,
    /// Part records found (a part may appear once per group and shard).
    pub parts: Vec<GroupPartPayload>,
    /// The highest `decided_below` of this shard's committed markers.
    pub decided_below: u64,
    pub max_group: u64,
}

/// The store-wide decision: which groups recovery applies. `shards[i]` is shard `i`'s scan.
/// A group is complete if it is below the highest D of any marker, or if every shard named
/// by its parts has exactly one part naming the same shard set and holds exactly that
/// part's number of distinct records of it.
pub(crate) fn complete_groups(shards: &[&ScannedGroups]) -> (BTreeSet<u64>, u64) {
    let d_max = shards.iter().map(|s| s.decided_below).max().unwrap_or(0);
    let mut all: BTreeSet<u64> = BTreeSet::new();
    for s in shards {
        all.extend(s.records.keys().copied());
        all.extend(s.parts.iter().map(|p| p.group));
    }
    let mut complete = BTreeSet::new();
    for g in all {
        if g < d_max || parts_complete(shards, g) {
            complete.insert(g);
        }
    }
    (complete, d_max)
}

fn parts_complete(shards: &[&ScannedGroups], g: u64) -> bool {
    let mut set: Option<&Vec<u32>> = None;
    for s in shards {
        for p in s.parts.iter().filter(|p| p.group == g) {
            if set.is_some_and(|x| *x != p.shards) {
                return false;
            }
            set = Some(&p.shards);
        }
    }
    let Some(set) = set else {
        return false;
    };
    set.iter().all(|&id| {
        let Some(s) = shards.get(id as usize) else {
            return false;
        };
        let mut parts = s.parts.iter().filter(|p| p.group == g);
        let (Some(p), None) = (parts.next(), parts.next()) else {
            return false;
        };
        s.records.get(&g).map_or(0, |r| r.len()) == p.records as usize
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(records: &[(u64, &[u64])], parts: &[(u64, u32, &[u32])], d: u64) -> ScannedGroups {
        ScannedGroups {
            records: records
                .iter()
                .map(|(g, seqs)| (*g, seqs.iter().copied().collect()))
                .collect(),
            parts: parts
                .iter()
                .map(|(g, m, s)| GroupPartPayload {
                    group: *g,
                    records: *m,
                    shards: s.to_vec(),
                })
                .collect(),
            decided_below: d,
            max_group: 0,
        }
    }

    // Proves the completeness rule: all parts and counts present → complete; a missing
    // part, a missing record, or disagreeing shard sets → not; D passing a group → complete.
    #[test]
    fn completeness_rule() {
        let a = scan(&[(7, &[1, 2])], &[(7, 2, &[0, 1])], 0);
        let b = scan(&[(7, &[5])], &[(7, 1, &[0, 1])], 0);
        assert!(complete_groups(&[&a, &b]).0.contains(&7));
        let b_no_part = scan(&[(7, &[5])], &[], 0);
        assert!(!complete_groups(&[&a, &b_no_part]).0.contains(&7));
        let a_short = scan(&[(7, &[1])], &[(7, 2, &[0, 1])], 0);
        assert!(!complete_groups(&[&a_short, &b]).0.contains(&7));
        let b_other = scan(&[(7, &[5])], &[(7, 1, &[1])], 0);
        assert!(!complete_groups(&[&a, &b_other]).0.contains(&7));
        let b_decided = scan(&[], &[], 8);
        assert!(complete_groups(&[&a_short, &b_decided]).0.contains(&7));
    }

    // Proves D never passes an undecided group and only grows.
    #[test]
    fn decided_below_tracks_the_oldest_undecided() {
        let t = GroupTable::default();
        t.start(10, 4);
        assert_eq!(t.decided_below(), 4);
        t.open();
        assert_eq!(t.decided_below(), 10);
        let (g1, g2) = (t.alloc(), t.alloc());
        assert_eq!(t.decided_below(), 10);
        t.decide(g2);
        assert_eq!(t.decided_below(), g1);
        t.decide(g1);
        assert_eq!(t.decided_below(), 12);
    }
}
