//! Fuzz entry point for completion handling: the bytes a controller writes into a
//! completion queue are untrusted input, so `QueuePair` must never panic, never deliver a
//! command that is not outstanding, never deliver one twice, and keep its in-flight count
//! exact, whatever the entries contain.
//!
//! `completion_handling` interprets arbitrary bytes as a schedule of host operations and
//! controller writes (both well-formed entries at the expected slot, to reach deep, and
//! raw 16-byte entries anywhere) and checks those properties against a model with
//! `assert!`. It runs under proptest in the unit tests; a `cargo fuzz` target is the
//! one-liner `fuzz_target!(|d: &[u8]| lavik::nvme::fuzz::completion_handling(d))`.
use std::collections::BTreeSet;

use super::queue::{CommandId, QueueMemory, QueuePair, SubmitError};
use super::spec::{flush_command, CompletionEntry, SubmissionEntry};

struct Rings {
    sq: Vec<SubmissionEntry>,
    cq: Vec<CompletionEntry>,
}

impl QueueMemory for Rings {
    fn write_submission(&mut self, index: u16, entry: &SubmissionEntry) {
        self.sq[index as usize] = *entry;
    }
    fn read_completion(&self, index: u16) -> CompletionEntry {
        self.cq[index as usize]
    }
}

/// Byte cursor that yields zeros once the input is exhausted.
struct Input<'a>(&'a [u8]);
impl Input<'_> {
    fn u8(&mut self) -> u8 {
        let (first, rest) = self.0.split_first().map_or((0, &[][..]), |(f, r)| (*f, r));
        self.0 = rest;
        first
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

/// Runs one fuzz case; panics (via `assert!`) only if a queue property is broken.
pub fn completion_handling(data: &[u8]) {
    let mut input = Input(data);
    let sq_entries = 2 + (input.u8() % 15) as u16;
    let cq_entries = 2 + (input.u8() % 15) as u16;
    let inflight_max = 1 + (input.u8() % 16) as u16;
    let qid = (input.u8() % 3) as u16;
    let mut q = QueuePair::new(qid, sq_entries, cq_entries, inflight_max);
    let mut mem = Rings {
        sq: vec![SubmissionEntry::default(); sq_entries as usize],
        cq: vec![CompletionEntry::default(); cq_entries as usize],
    };
    let mut outstanding: BTreeSet<CommandId> = BTreeSet::new();
    let mut now = 0u64;
    while !input.done() {
        match input.u8() % 6 {
            0 => match q.submit(&mut mem, flush_command(1), now + input.u8() as u64) {
                Ok(cid) => assert!(outstanding.insert(cid), "id {cid:?} handed out twice"),
                Err(SubmitError::Full) => assert_eq!(outstanding.len(), q.capacity()),
                Err(SubmitError::Poisoned) => assert!(q.poisoned().is_some()),
            },
            1 => {
                let slot = input.u8() as usize % mem.cq.len();
                mem.cq[slot] = CompletionEntry {
                    dw0: input.u32(),
                    dw1: input.u32(),
                    dw2: input.u32(),
                    dw3: input.u32(),
                };
            }
            2 => {
                // A plausible entry at the slot the host reads next: right phase, right
                // queue, a command id near the live range, arbitrary status.
                let (head, phase) = q.cq_head();
                let cid = (input.u8() % 20) as u16;
                let sq_head = input.u16() % (sq_entries + 1);
                let status = input.u16();
                mem.cq[head as usize] = CompletionEntry::build(cid, qid, sq_head, phase, status, 0);
            }
            3 => {
                let max = input.u8() as usize % 8;
                let mut delivered = Vec::new();
                let r = q.poll(&mem, max, |c| delivered.push(c.cid));
                assert!(delivered.len() <= max);
                for cid in delivered {
                    assert!(
                        outstanding.remove(&cid),
                        "delivered {cid:?} which was not outstanding"
                    );
                }
                if r.is_err() {
                    assert!(q.poisoned().is_some());
                    assert!(q.next_command_id().is_none());
                }
            }
            4 => {
                now += input.u8() as u64;
                q.expire(now, |cid| {
                    assert!(outstanding.contains(&cid), "expired unknown {cid:?}")
                });
            }
            _ => {
                let lost: BTreeSet<CommandId> = q.reset().into_iter().collect();
                assert_eq!(
                    lost, outstanding,
                    "reset must return exactly the outstanding ids"
                );
                outstanding.clear();
                mem.cq
                    .iter_mut()
                    .for_each(|e| *e = CompletionEntry::default());
            }
        }
        assert_eq!(q.in_flight(), outstanding.len());
        assert!(q.in_flight() <= q.capacity() && q.capacity() < sq_entries as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Proves fixed seed inputs (empty, all-ones, a submit/post/poll schedule) run clean.
    #[test]
    fn corpus_runs_clean() {
        completion_handling(&[]);
        completion_handling(&[0xFF; 256]);
        // sq 4, cq 4, 4 ids, qid 1; submit, submit, post cid 0 success, poll 4, reset.
        completion_handling(&[2, 2, 3, 1, 0, 9, 0, 9, 2, 0, 1, 0, 0, 0, 3, 4, 5]);
    }

    // Proves the property checker is live: a schedule that polls a forged completion for
    // an id never issued must poison the queue rather than deliver it.
    #[test]
    fn forged_completion_poisons() {
        let mut q = QueuePair::new(1, 4, 4, 4);
        let mem = Rings {
            sq: vec![SubmissionEntry::default(); 4],
            cq: vec![CompletionEntry::build(3, 1, 0, true, 0, 0); 4],
        };
        assert!(q.poll(&mem, 4, |_| panic!("must not deliver")).is_err());
    }

    proptest! {
        #![proptest_config(crate::nvme::proptest_config(2000))]
        // Proves the completion-handling properties hold for arbitrary byte schedules.
        #[test]
        fn arbitrary_schedules(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            completion_handling(&data);
        }
    }
}
