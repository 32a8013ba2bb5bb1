//! Time as the caller tells it. The stack never reads a clock: every entry point takes
//! `now: Instant`, and timers are compared against it. Both types count microseconds.

use core::ops::{Add, AddAssign, Sub};

/// A point in time, in microseconds since an epoch the caller chooses (e.g. process start).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant {
    micros: u64,
}

/// A span of time in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration {
    micros: u64,
}

impl Instant {
    /// The epoch (time zero).
    pub const ZERO: Instant = Instant { micros: 0 };

    /// An instant `micros` microseconds after the epoch.
    pub const fn from_micros(micros: u64) -> Instant {
        Instant { micros }
    }

    /// An instant `millis` milliseconds after the epoch.
    pub const fn from_millis(millis: u64) -> Instant {
        Instant {
            micros: millis * 1000,
        }
    }

    /// Microseconds since the epoch.
    pub const fn total_micros(self) -> u64 {
        self.micros
    }

    /// Milliseconds since the epoch (truncated).
    pub const fn total_millis(self) -> u64 {
        self.micros / 1000
    }

    /// Time elapsed since `earlier`, zero if `earlier` is in the future.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        Duration {
            micros: self.micros.saturating_sub(earlier.micros),
        }
    }
}

impl Duration {
    /// Zero length.
    pub const ZERO: Duration = Duration { micros: 0 };

    /// `micros` microseconds.
    pub const fn from_micros(micros: u64) -> Duration {
        Duration { micros }
    }

    /// `millis` milliseconds.
    pub const fn from_millis(millis: u64) -> Duration {
        Duration {
            micros: millis * 1000,
        }
    }

    /// `secs` seconds.
    pub const fn from_secs(secs: u64) -> Duration {
        Duration {
            micros: secs * 1_000_000,
        }
    }

    /// Length in microseconds.
    pub const fn total_micros(self) -> u64 {
        self.micros
    }

    /// Length in milliseconds (truncated).
    pub const fn total_millis(self) -> u64 {
        self.micros / 1000
    }

    /// Multiply, saturating at the maximum representable length.
    pub const fn saturating_mul(self, factor: u64) -> Duration {
        Duration {
            micros: self.micros.saturating_mul(factor),
        }
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, rhs: Duration) -> Instant {
        Instant {
            micros: self.micros.saturating_add(rhs.micros),
        }
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}

impl Add for Duration {
    type Output = Duration;
    fn add(self, rhs: Duration) -> Duration {
        Duration {
            micros: self.micros.saturating_add(rhs.micros),
        }
    }
}

impl Sub for Duration {
    type Output = Duration;
    fn sub(self, rhs: Duration) -> Duration {
        Duration {
            micros: self.micros.saturating_sub(rhs.micros),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves instant arithmetic saturates instead of wrapping or panicking.
    #[test]
    fn instant_arithmetic_saturates() {
        let t = Instant::from_millis(5);
        assert_eq!(t + Duration::from_millis(3), Instant::from_micros(8000));
        assert_eq!(Instant::from_millis(1).saturating_since(t), Duration::ZERO);
        assert_eq!(
            t.saturating_since(Instant::from_millis(1)),
            Duration::from_millis(4)
        );
        assert_eq!(
            Instant::from_micros(u64::MAX) + Duration::from_secs(1),
            Instant::from_micros(u64::MAX)
        );
    }
}
