//! Which sockets need attention, without scanning the socket table.
//!
//! A socket is either *ready* (it has a segment to send now) or waiting for its earliest
//! *timer*, or both, or neither. Ready sockets sit in a FIFO, each at most once, which
//! gives round-robin fairness between busy connections. Timers sit in a min-heap with
//! lazy deletion: `scheduled[index]` holds the one deadline that is current for a slot,
//! and heap entries that no longer match it are dropped when they surface. The heap is
//! rebuilt from `scheduled` when stale entries pile up, so it never holds more than
//! `timers_max` entries and stops allocating once warm.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::time::Instant;

/// Stale heap entries allowed per socket slot before the heap is rebuilt.
const STALE_TIMERS_PER_SLOT: usize = 4;

#[derive(Debug)]
pub(crate) struct Scheduler {
    ready: VecDeque<u32>,
    in_ready: Vec<bool>,
    timers: BinaryHeap<Reverse<(Instant, u32)>>,
    scheduled: Vec<Option<Instant>>,
    timers_max: usize,
}

impl Scheduler {
    pub(crate) fn new(slots: usize) -> Scheduler {
        let timers_max = slots * STALE_TIMERS_PER_SLOT + 16;
        Scheduler {
            ready: VecDeque::with_capacity(slots),
            in_ready: vec![false; slots],
            timers: BinaryHeap::with_capacity(timers_max + 1),
            scheduled: vec![None; slots],
            timers_max,
        }
    }

    /// Records what slot `index` needs: to send now (`ready`) and its next timer.
    pub(crate) fn update(&mut self, index: u32, ready: bool, timer: Option<Instant>) {
        let slot = index as usize;
        if ready && !self.in_ready[slot] {
            self.in_ready[slot] = true;
            self.ready.push_back(index);
        }
        if timer != self.scheduled[slot] {
            self.scheduled[slot] = timer;
            if let Some(at) = timer {
                if self.timers.len() >= self.timers_max {
                    self.rebuild();
                }
                self.timers.push(Reverse((at, index)));
            }
        }
        debug_assert!(self.ready.len() <= self.in_ready.len());
    }

    /// The slot was freed: its timer no longer counts. A queued ready entry is left to
    /// surface and be skipped (or to serve the slot's next occupant, which is harmless).
    pub(crate) fn forget(&mut self, index: u32) {
        self.scheduled[index as usize] = None;
    }

    /// Moves due timers to the ready queue and pops the next ready slot.
    pub(crate) fn next_ready(&mut self, now: Instant) -> Option<u32> {
        while let Some(&Reverse((at, index))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            let slot = index as usize;
            if self.scheduled[slot] == Some(at) {
                self.scheduled[slot] = None;
                if !self.in_ready[slot] {
                    self.in_ready[slot] = true;
                    self.ready.push_back(index);
                }
            }
        }
        let index = self.ready.pop_front()?;
        self.in_ready[index as usize] = false;
        Some(index)
    }

    /// When attention is next needed: `now` if anything is ready, else the earliest
    /// timer (possibly a stale one — an early wake-up, never a late one).
    pub(crate) fn next_wake(&self, now: Instant) -> Option<Instant> {
        if !self.ready.is_empty() {
            return Some(now);
        }
        self.timers.peek().map(|Reverse((at, _))| *at)
    }

    fn rebuild(&mut self) {
        self.timers.clear();
        for (index, at) in self.scheduled.iter().enumerate() {
            if let Some(at) = at {
                self.timers.push(Reverse((*at, index as u32)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves ready slots come out in FIFO order once each, and due timers join them.
    #[test]
    fn ready_fifo_and_timers() {
        let mut scheduler = Scheduler::new(4);
        let now = Instant::from_millis(10);
        scheduler.update(2, true, None);
        scheduler.update(1, true, Some(Instant::from_millis(50)));
        scheduler.update(2, true, None);
        scheduler.update(3, false, Some(Instant::from_millis(5)));
        assert_eq!(scheduler.next_wake(now), Some(now));
        assert_eq!(scheduler.next_ready(now), Some(2));
        assert_eq!(scheduler.next_ready(now), Some(1));
        assert_eq!(scheduler.next_ready(now), Some(3));
        assert_eq!(scheduler.next_ready(now), None);
        assert_eq!(scheduler.next_wake(now), Some(Instant::from_millis(50)));
        assert_eq!(scheduler.next_ready(Instant::from_millis(50)), Some(1));
    }

    // Proves a moved or forgotten timer does not fire, and the heap stays bounded.
    #[test]
    fn stale_timers_are_ignored_and_bounded() {
        let mut scheduler = Scheduler::new(2);
        for step in 0..1000 {
            scheduler.update(0, false, Some(Instant::from_millis(100 + step)));
        }
        assert!(scheduler.timers.len() <= scheduler.timers_max);
        scheduler.update(1, false, Some(Instant::from_millis(10)));
        scheduler.forget(1);
        assert_eq!(scheduler.next_ready(Instant::from_millis(500)), None);
        assert_eq!(scheduler.next_ready(Instant::from_millis(1099)), Some(0));
    }
}
