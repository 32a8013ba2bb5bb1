//! `client-output-buffer-limit`: Redis's per-class limits on a client's unsent replies.
//!
//! Syntax (CONFIG SET, config file, `--client-output-buffer-limit`): one or more groups of
//! `<class> <hard> <soft> <soft-seconds>`, class `normal`, `replica` (alias `slave`) or
//! `pubsub`, sizes as memory values (`64mb`, `0` = no limit). A client is closed as soon as
//! its output reaches the hard limit, or once it has stayed at or above the soft limit for
//! `soft-seconds`. Defaults are Redis's: normal clients unlimited (lavik still stops parsing
//! a client's input while 64 MiB of its replies are unsent, so an unlimited client is
//! back-pressured, not buffered without bound), replicas 256mb/64mb/60, pubsub 32mb/8mb/60.

use super::parse_memory;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ClassLimit {
    pub hard_bytes: u64,
    pub soft_bytes: u64,
    pub soft_seconds: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputLimits {
    pub normal: ClassLimit,
    pub replica: ClassLimit,
    pub pubsub: ClassLimit,
}

impl Default for OutputLimits {
    fn default() -> Self {
        OutputLimits {
            normal: ClassLimit::default(),
            replica: ClassLimit {
                hard_bytes: 256 << 20,
                soft_bytes: 64 << 20,
                soft_seconds: 60,
            },
            pubsub: ClassLimit {
                hard_bytes: 32 << 20,
                soft_bytes: 8 << 20,
                soft_seconds: 60,
            },
        }
    }
}

/// What a client's output size means under a class limit, at `now_ms`, given since when
/// (`soft_since_ms`) it has been at or above the soft limit.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Fine,
    /// At or over the soft limit since this time (not yet for long enough).
    OverSoft(u64),
    Close,
}

impl ClassLimit {
    pub fn judge(&self, bytes: u64, soft_since_ms: Option<u64>, now_ms: u64) -> Verdict {
        if self.hard_bytes > 0 && bytes >= self.hard_bytes {
            return Verdict::Close;
        }
        if self.soft_bytes > 0 && bytes >= self.soft_bytes {
            let since = soft_since_ms.unwrap_or(now_ms);
            if now_ms.saturating_sub(since) >= self.soft_seconds * 1000 && soft_since_ms.is_some() {
                return Verdict::Close;
            }
            return Verdict::OverSoft(since);
        }
        Verdict::Fine
    }
}

impl OutputLimits {
    /// Applies `text` (one or more class groups) on top of `self`, or Redis's error text.
    pub fn apply(&mut self, text: &str) -> Result<(), &'static str> {
        let words: Vec<&str> = text.split_whitespace().collect();
        if words.is_empty() || !words.len().is_multiple_of(4) {
            return Err("Wrong number of arguments in buffer limit configuration.");
        }
        let mut next = *self;
        for g in words.chunks(4) {
            let slot = match g[0].to_ascii_lowercase().as_str() {
                "normal" => &mut next.normal,
                "replica" | "slave" => &mut next.replica,
                "pubsub" => &mut next.pubsub,
                _ => return Err("Invalid client class specified in buffer limit configuration."),
            };
            let bad = "Error in hard, soft or soft_seconds setting in buffer limit configuration.";
            let hard = parse_memory(g[1]).ok_or(bad)?;
            let soft = parse_memory(g[2]).ok_or(bad)?;
            let secs: u64 = g[3].parse().map_err(|_| bad)?;
            *slot = ClassLimit {
                hard_bytes: hard,
                soft_bytes: soft,
                soft_seconds: secs,
            };
        }
        *self = next;
        Ok(())
    }

    /// CONFIG GET's form (Redis names the replica class `slave` there).
    pub fn render(&self) -> String {
        let g = |name: &str, c: &ClassLimit| {
            format!(
                "{name} {} {} {}",
                c.hard_bytes, c.soft_bytes, c.soft_seconds
            )
        };
        format!(
            "{} {} {}",
            g("normal", &self.normal),
            g("slave", &self.replica),
            g("pubsub", &self.pubsub)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Redis's defaults render as CONFIG GET shows them; a group changes only its class.
    #[test]
    fn defaults_and_apply() {
        let mut l = OutputLimits::default();
        assert_eq!(
            l.render(),
            "normal 0 0 0 slave 268435456 67108864 60 pubsub 33554432 8388608 60"
        );
        l.apply("normal 10mb 5mb 2").unwrap();
        assert_eq!(l.normal.hard_bytes, 10 << 20);
        assert_eq!(l.normal.soft_seconds, 2);
        assert_eq!(l.pubsub, OutputLimits::default().pubsub);
        l.apply("replica 1gb 0 0 pubsub 0 0 0").unwrap();
        assert_eq!(l.replica.hard_bytes, 1 << 30);
        assert_eq!(l.pubsub, ClassLimit::default());
    }

    // Malformed settings are refused whole, with Redis's texts.
    #[test]
    fn errors() {
        let mut l = OutputLimits::default();
        assert!(l
            .apply("normal 0 0")
            .unwrap_err()
            .starts_with("Wrong number"));
        assert!(l
            .apply("bogus 0 0 0")
            .unwrap_err()
            .starts_with("Invalid client class"));
        assert!(l
            .apply("normal 1 2 x")
            .unwrap_err()
            .starts_with("Error in hard"));
        assert!(l.apply("normal 1mb 1mb 1 pubsub x 0 0").is_err());
        assert_eq!(l, OutputLimits::default(), "nothing applied on error");
    }

    // Hard closes at once; soft closes only after staying over it for its seconds.
    #[test]
    fn judge() {
        let c = ClassLimit {
            hard_bytes: 100,
            soft_bytes: 50,
            soft_seconds: 2,
        };
        assert_eq!(c.judge(10, None, 1000), Verdict::Fine);
        assert_eq!(c.judge(100, None, 1000), Verdict::Close);
        assert_eq!(c.judge(60, None, 1000), Verdict::OverSoft(1000));
        assert_eq!(c.judge(60, Some(1000), 2500), Verdict::OverSoft(1000));
        assert_eq!(c.judge(60, Some(1000), 3000), Verdict::Close);
        assert_eq!(
            ClassLimit::default().judge(u64::MAX, None, 0),
            Verdict::Fine
        );
    }
}
