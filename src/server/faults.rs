//! Test-only link faults between the DPDK port and the userspace TCP stack.
//!
//! The development kernel has no `tc netem`, so the end-to-end test makes the link lossy
//! on our side: every frame crossing between the NIC and `tcp-stack` (both directions)
//! may be dropped, duplicated, or held back for `delay_us` so that later frames overtake
//! it (reordering). Decisions come from a seeded RNG, so a seed names one fault pattern
//! for a given frame sequence.
//!
//! Enabled only by the environment variable [`FAULTS_ENV`] (for example
//! `LAVIK_DPDK_FAULTS="seed=7,loss=2,dup=1,reorder=3,delay_us=200"`, percentages may be
//! fractional). When it is unset the worker holds `None` and the frame path has one
//! untaken branch. Held frames are bounded by [`HELD_FRAMES_MAX`] per direction; a frame
//! that would exceed it passes through unheld.

use std::collections::VecDeque;

/// The environment variable that turns the fault layer on.
pub const FAULTS_ENV: &str = "LAVIK_DPDK_FAULTS";
/// Frames held back at once per direction; beyond it frames are not delayed.
pub const HELD_FRAMES_MAX: usize = 1024;
/// Longest hold a configuration may ask for (a larger one is a typo, not a test).
pub const DELAY_MAX_US: u64 = 1_000_000;

/// Fault rates in percent of frames, per direction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultConfig {
    pub seed: u64,
    pub loss_percent: f64,
    pub duplicate_percent: f64,
    pub reorder_percent: f64,
    /// How long a reordered frame is held back.
    pub delay_us: u64,
}

impl FaultConfig {
    /// Parses `key=value` pairs separated by commas: `seed`, `loss`, `dup`, `reorder`
    /// (percent, 0-100) and `delay_us`. Unknown keys and bad values are errors.
    pub fn parse(text: &str) -> Result<FaultConfig, String> {
        let mut config = FaultConfig {
            seed: 1,
            loss_percent: 0.0,
            duplicate_percent: 0.0,
            reorder_percent: 0.0,
            delay_us: 200,
        };
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| format!("{FAULTS_ENV}: '{item}' is not key=value"))?;
            let percent = || -> Result<f64, String> {
                value
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=100.0).contains(p))
                    .ok_or_else(|| format!("{FAULTS_ENV}: {key} takes a percentage, got '{value}'"))
            };
            match key {
                "seed" => {
                    config.seed = value
                        .parse()
                        .map_err(|_| format!("{FAULTS_ENV}: seed takes an integer"))?
                }
                "loss" => config.loss_percent = percent()?,
                "dup" => config.duplicate_percent = percent()?,
                "reorder" => config.reorder_percent = percent()?,
                "delay_us" => {
                    config.delay_us = value
                        .parse()
                        .ok()
                        .filter(|&d| d <= DELAY_MAX_US)
                        .ok_or_else(|| format!("{FAULTS_ENV}: delay_us takes 0-{DELAY_MAX_US}"))?
                }
                other => return Err(format!("{FAULTS_ENV}: unknown key '{other}'")),
            }
        }
        let total = config.loss_percent + config.duplicate_percent + config.reorder_percent;
        if total > 100.0 {
            return Err(format!("{FAULTS_ENV}: rates add up to {total} % (> 100)"));
        }
        Ok(config)
    }
}

/// What to do with one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Drop,
    /// Deliver it twice.
    Duplicate,
    /// Hold it back ([`Direction::hold`]); later frames overtake it.
    Hold,
}

/// Counters of what the layer did, per direction.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FaultStats {
    pub frames: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub held: u64,
}

/// One direction of the link: its RNG stream, held frames and counters.
pub struct Direction {
    config: FaultConfig,
    rng: SplitMix64,
    held: VecDeque<(u64, Vec<u8>)>,
    pub stats: FaultStats,
}

impl Direction {
    /// `stream` separates the directions' random sequences under one seed.
    pub fn new(config: FaultConfig, stream: u64) -> Direction {
        Direction {
            config,
            rng: SplitMix64(config.seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            held: VecDeque::new(),
            stats: FaultStats::default(),
        }
    }

    /// Decides the fate of the next frame.
    pub fn judge(&mut self) -> Verdict {
        self.stats.frames += 1;
        // Uniform in [0, 100): one draw picks at most one fault.
        let roll = (self.rng.next() >> 11) as f64 / (1u64 << 53) as f64 * 100.0;
        let c = &self.config;
        let verdict = if roll < c.loss_percent {
            Verdict::Drop
        } else if roll < c.loss_percent + c.duplicate_percent {
            Verdict::Duplicate
        } else if roll < c.loss_percent + c.duplicate_percent + c.reorder_percent
            && self.held.len() < HELD_FRAMES_MAX
        {
            Verdict::Hold
        } else {
            Verdict::Pass
        };
        match verdict {
            Verdict::Drop => self.stats.dropped += 1,
            Verdict::Duplicate => self.stats.duplicated += 1,
            Verdict::Hold => self.stats.held += 1,
            Verdict::Pass => {}
        }
        verdict
    }

    /// Keeps a copy of `frame` until `now_us + delay_us`.
    pub fn hold(&mut self, now_us: u64, frame: &[u8]) {
        debug_assert!(self.held.len() < HELD_FRAMES_MAX);
        self.held
            .push_back((now_us + self.config.delay_us, frame.to_vec()));
    }

    /// The oldest held frame whose time has come (frames leave in the order held).
    pub fn release_due(&mut self, now_us: u64) -> Option<Vec<u8>> {
        match self.held.front() {
            Some(&(due_us, _)) if due_us <= now_us => self.held.pop_front().map(|(_, f)| f),
            _ => None,
        }
    }

    /// Frames currently held back.
    pub fn held_frames(&self) -> usize {
        self.held.len()
    }
}

/// Both directions of the faulty link.
pub struct FaultLayer {
    /// NIC → stack.
    pub rx: Direction,
    /// Stack → NIC.
    pub tx: Direction,
}

impl FaultLayer {
    pub fn new(config: FaultConfig) -> FaultLayer {
        FaultLayer {
            rx: Direction::new(config, 1),
            tx: Direction::new(config, 2),
        }
    }

    /// The layer configured by [`FAULTS_ENV`], `Ok(None)` when it is unset.
    pub fn from_env() -> Result<Option<FaultLayer>, String> {
        match std::env::var(FAULTS_ENV) {
            Ok(text) => Ok(Some(FaultLayer::new(FaultConfig::parse(&text)?))),
            Err(_) => Ok(None),
        }
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, and good enough to pick faults.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(loss: f64, dup: f64, reorder: f64) -> FaultConfig {
        FaultConfig {
            seed: 7,
            loss_percent: loss,
            duplicate_percent: dup,
            reorder_percent: reorder,
            delay_us: 200,
        }
    }

    // The documented spec string parses into the rates it names; defaults fill the rest.
    #[test]
    fn parses_the_documented_form() {
        let c = FaultConfig::parse("seed=7,loss=2,dup=1,reorder=3,delay_us=200").unwrap();
        assert_eq!(c, config(2.0, 1.0, 3.0));
        let c = FaultConfig::parse("loss=0.5").unwrap();
        assert_eq!(c.loss_percent, 0.5);
        assert_eq!((c.seed, c.delay_us, c.reorder_percent), (1, 200, 0.0));
    }

    // Typos and impossible rates are refused rather than silently ignored.
    #[test]
    fn refuses_bad_specs() {
        for bad in [
            "loss",
            "loss=x",
            "loss=101",
            "loss=-1",
            "lose=2",
            "loss=60,dup=50",
            "delay_us=5000000",
            "seed=abc",
        ] {
            assert!(FaultConfig::parse(bad).is_err(), "{bad}");
        }
    }

    // The same seed gives the same verdicts; the two directions draw different streams.
    #[test]
    fn seeded_and_deterministic() {
        let run = |stream| {
            let mut d = Direction::new(config(10.0, 10.0, 10.0), stream);
            (0..1000).map(|_| d.judge()).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    // Over many frames each fault occurs at roughly its configured rate.
    #[test]
    fn rates_are_respected() {
        let mut d = Direction::new(config(2.0, 1.0, 3.0), 1);
        let n = 100_000u64;
        for _ in 0..n {
            if d.judge() == Verdict::Hold {
                // Keep the held queue from filling, which would turn holds into passes.
                d.release_due(u64::MAX);
            }
        }
        let near = |count: u64, percent: f64| {
            let expected = n as f64 * percent / 100.0;
            (count as f64 - expected).abs() < expected * 0.15
        };
        assert_eq!(d.stats.frames, n);
        assert!(near(d.stats.dropped, 2.0), "{:?}", d.stats);
        assert!(near(d.stats.duplicated, 1.0), "{:?}", d.stats);
        assert!(near(d.stats.held, 3.0), "{:?}", d.stats);
        let mut off = Direction::new(config(0.0, 0.0, 0.0), 1);
        assert!((0..10_000).all(|_| off.judge() == Verdict::Pass));
    }

    // A held frame comes back only after its delay, in the order frames were held.
    #[test]
    fn held_frames_return_after_the_delay_in_order() {
        let mut d = Direction::new(config(0.0, 0.0, 100.0), 1);
        d.hold(1000, b"first");
        d.hold(1100, b"second");
        assert_eq!(d.release_due(1199), None);
        assert_eq!(d.release_due(1200).as_deref(), Some(&b"first"[..]));
        assert_eq!(d.release_due(1250), None);
        assert_eq!(d.release_due(1300).as_deref(), Some(&b"second"[..]));
        assert_eq!(d.held_frames(), 0);
    }

    // When the held queue is full, frames pass instead of growing it without bound.
    #[test]
    fn holding_is_bounded() {
        let mut d = Direction::new(config(0.0, 0.0, 100.0), 1);
        for _ in 0..HELD_FRAMES_MAX {
            assert_eq!(d.judge(), Verdict::Hold);
            d.hold(0, b"x");
        }
        assert_eq!(d.judge(), Verdict::Pass);
        assert_eq!(d.held_frames(), HELD_FRAMES_MAX);
    }
}
