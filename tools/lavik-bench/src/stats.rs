//! Latency histograms and counters per request kind, and the memtier-style reports.
//!
//! Latency is recorded in nanoseconds in an HDR histogram with 3 significant digits, so
//! every reported percentile is within 0.1 % of the true sample value. Histograms from all
//! threads merge losslessly. Values above `LATENCY_MAX_NS` are clamped (and still counted).

use hdrhistogram::Histogram;
use serde_json::{json, Map, Value};
use std::time::Duration;

pub const LATENCY_MAX_NS: u64 = 60_000_000_000;
const SIGNIFICANT_DIGITS: u8 = 3;

/// Counters and latency histogram for one request kind on one thread (or merged).
#[derive(Clone, Debug)]
pub struct OpStats {
    pub hist: Histogram<u64>,
    pub count: u64,
    pub hits: u64,
    pub misses: u64,
    pub error_replies: u64,
    /// Request plus reply bytes.
    pub bytes: u64,
    latency_sum_ns: u64,
}

impl Default for OpStats {
    fn default() -> Self {
        Self::new()
    }
}

impl OpStats {
    pub fn new() -> Self {
        Self {
            hist: Histogram::new_with_bounds(1, LATENCY_MAX_NS, SIGNIFICANT_DIGITS)
                .expect("constant histogram bounds are valid"),
            count: 0,
            hits: 0,
            misses: 0,
            error_replies: 0,
            bytes: 0,
            latency_sum_ns: 0,
        }
    }

    pub fn record(&mut self, latency_ns: u64) {
        self.count += 1;
        self.latency_sum_ns += latency_ns;
        self.hist
            .saturating_record(latency_ns.clamp(1, LATENCY_MAX_NS));
    }

    pub fn merge(&mut self, other: &OpStats) {
        self.hist
            .add(&other.hist)
            .expect("histograms with equal bounds always merge");
        self.count += other.count;
        self.hits += other.hits;
        self.misses += other.misses;
        self.error_replies += other.error_replies;
        self.bytes += other.bytes;
        self.latency_sum_ns += other.latency_sum_ns;
    }

    pub fn avg_ms(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.latency_sum_ns as f64 / self.count as f64 / 1e6
        }
    }

    /// Latency at `percentile` (0..=100) in milliseconds; 0 when nothing was recorded.
    pub fn percentile_ms(&self, percentile: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        self.hist.value_at_percentile(percentile) as f64 / 1e6
    }
}

/// The outcome of one run, merged over all threads.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub op_names: Vec<String>,
    pub op_is_read: Vec<bool>,
    pub ops: Vec<OpStats>,
    pub elapsed: Duration,
    pub connection_errors: u64,
    /// Requests sent but never answered (connection lost or drain timeout).
    pub unanswered: u64,
    pub start_unix_ms: u128,
    pub end_unix_ms: u128,
}

impl RunResult {
    pub fn totals(&self) -> OpStats {
        let mut t = OpStats::new();
        for s in &self.ops {
            t.merge(s);
        }
        t
    }

    fn secs(&self) -> f64 {
        self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn ops_per_sec(&self, s: &OpStats) -> f64 {
        s.count as f64 / self.secs()
    }

    /// Stats for the op named `name` ("Gets", "Sets", ...).
    pub fn op(&self, name: &str) -> Option<&OpStats> {
        self.op_names
            .iter()
            .position(|n| n == name)
            .map(|i| &self.ops[i])
    }

    fn rows(&self) -> Vec<(String, OpStats, bool)> {
        let mut rows: Vec<(String, OpStats, bool)> = self
            .op_names
            .iter()
            .zip(&self.ops)
            .zip(&self.op_is_read)
            .map(|((n, s), r)| (n.clone(), s.clone(), *r))
            .collect();
        rows.push((
            "Totals".into(),
            self.totals(),
            self.op_is_read.iter().any(|r| *r),
        ));
        rows
    }

    /// memtier's "ALL STATS" table.
    pub fn text_report(&self, percentiles: &[f64], hide_histogram: bool) -> String {
        let mut header = format!(
            "{:<12}{:>12} {:>12} {:>12} {:>15} ",
            "Type", "Ops/sec", "Hits/sec", "Misses/sec", "Avg. Latency"
        );
        for p in percentiles {
            header.push_str(&format!("{:>15} ", format!("p{} Latency", fmt_pct(*p))));
        }
        header.push_str(&format!("{:>12}", "KB/sec"));
        let rule = |c: char| c.to_string().repeat(header.len());
        let mut out = format!("\nALL STATS\n{}\n{}\n{}\n", rule('='), header, rule('-'));
        for (name, s, read) in self.rows() {
            let rate = |n: u64| n as f64 / self.secs();
            let (hits, misses) = if read {
                (
                    format!("{:.2}", rate(s.hits)),
                    format!("{:.2}", rate(s.misses)),
                )
            } else {
                ("---".into(), "---".into())
            };
            out.push_str(&format!(
                "{:<12}{:>12.2} {:>12} {:>12} {:>15.5} ",
                name,
                self.ops_per_sec(&s),
                hits,
                misses,
                s.avg_ms()
            ));
            for p in percentiles {
                out.push_str(&format!("{:>15.5} ", s.percentile_ms(*p)));
            }
            out.push_str(&format!("{:>12.2}\n", rate(s.bytes) / 1024.0));
        }
        out.push_str(&format!(
            "\nConnection errors: {}   Error replies: {}   Unanswered requests: {}   Duration: {:.3} s\n",
            self.connection_errors,
            self.totals().error_replies,
            self.unanswered,
            self.secs()
        ));
        if !hide_histogram {
            out.push_str(&self.distribution());
        }
        out
    }

    /// A compact latency distribution: cumulative percent at each histogram step.
    fn distribution(&self) -> String {
        let mut out =
            String::from("\nRequest Latency Distribution\nType     <= msec         Percent\n");
        out.push_str(&"-".repeat(40));
        out.push('\n');
        for (name, s) in self.op_names.iter().zip(&self.ops) {
            if s.count == 0 {
                continue;
            }
            for v in s.hist.iter_quantiles(1) {
                if v.count_since_last_iteration() == 0 {
                    continue;
                }
                out.push_str(&format!(
                    "{:<8} {:>12.3} {:>14.3}\n",
                    name,
                    s.hist.highest_equivalent(v.value_iterated_to()) as f64 / 1e6,
                    v.quantile_iterated_to() * 100.0
                ));
            }
        }
        out
    }

    /// memtier-like JSON: `{"ALL STATS": {"Gets": {...}, ...}, "Runtime": {...}}`.
    pub fn json(&self, percentiles: &[f64], configuration: Value) -> Value {
        let mut all = Map::new();
        for (name, s, read) in self.rows() {
            let mut pct = Map::new();
            for p in percentiles {
                pct.insert(format!("p{:.2}", p), json!(s.percentile_ms(*p)));
            }
            let rate = |n: u64| n as f64 / self.secs();
            all.insert(
                name,
                json!({
                    "Count": s.count,
                    "Ops/sec": self.ops_per_sec(&s),
                    "Hits/sec": if read { rate(s.hits) } else { 0.0 },
                    "Misses/sec": if read { rate(s.misses) } else { 0.0 },
                    "Hits": s.hits,
                    "Misses": s.misses,
                    "Error replies": s.error_replies,
                    "Latency": s.avg_ms(),
                    "Average Latency": s.avg_ms(),
                    "Min Latency": if s.count == 0 { 0.0 } else { s.hist.min() as f64 / 1e6 },
                    "Max Latency": if s.count == 0 { 0.0 } else { s.hist.max() as f64 / 1e6 },
                    "KB/sec": rate(s.bytes) / 1024.0,
                    "Percentile Latencies": pct,
                }),
            );
        }
        json!({
            "configuration": configuration,
            "ALL STATS": all,
            "Runtime": {
                "Start time": self.start_unix_ms as u64,
                "Finish time": self.end_unix_ms as u64,
                "Total duration": self.elapsed.as_millis() as u64,
                "Time unit": "MILLISECONDS",
            },
            "Errors": {
                "Connection errors": self.connection_errors,
                "Unanswered requests": self.unanswered,
            },
        })
    }
}

/// "99.9" stays "99.9", "50" stays "50" (no trailing ".0").
fn fmt_pct(p: f64) -> String {
    let s = format!("{p}");
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// True when `got` is within HDR's 3-significant-digit resolution of `want`.
    fn close(got: f64, want: f64) -> bool {
        (got - want).abs() <= want * 0.001 + 1e-9
    }

    // Proves percentiles over 1..=100_000 µs land on the exact order statistics (±0.1 %).
    #[test]
    fn percentiles_of_uniform_samples() {
        let mut s = OpStats::new();
        for us in 1..=100_000u64 {
            s.record(us * 1000);
        }
        assert_eq!(s.count, 100_000);
        assert!(
            close(s.percentile_ms(50.0), 50.0),
            "{}",
            s.percentile_ms(50.0)
        );
        assert!(
            close(s.percentile_ms(99.0), 99.0),
            "{}",
            s.percentile_ms(99.0)
        );
        assert!(
            close(s.percentile_ms(99.9), 99.9),
            "{}",
            s.percentile_ms(99.9)
        );
        assert!(
            close(s.percentile_ms(99.99), 99.99),
            "{}",
            s.percentile_ms(99.99)
        );
        assert!(close(s.avg_ms(), 50.0005));
    }

    // Proves a 0.15 % slow tail shows at p99.9 but not p99.8, and merging threads keeps it.
    #[test]
    fn tail_survives_merge() {
        let mut fast = OpStats::new();
        for _ in 0..9_985 {
            fast.record(100_000); // 0.1 ms
        }
        let mut slow = OpStats::new();
        for _ in 0..15 {
            slow.record(20_000_000); // 20 ms
        }
        fast.merge(&slow);
        assert_eq!(fast.count, 10_000);
        assert!(close(fast.percentile_ms(99.0), 0.1));
        assert!(close(fast.percentile_ms(99.8), 0.1));
        assert!(close(fast.percentile_ms(99.9), 20.0));
        assert!(close(fast.percentile_ms(100.0), 20.0));
    }

    // Proves out-of-range latencies are clamped and counted, not dropped.
    #[test]
    fn extreme_latencies_are_counted() {
        let mut s = OpStats::new();
        s.record(0);
        s.record(u64::MAX / 4);
        assert_eq!(s.count, 2);
        assert_eq!(s.hist.len(), 2);
        assert!(s.percentile_ms(100.0) >= LATENCY_MAX_NS as f64 / 1e6 * 0.999);
    }

    // Proves the report names every op plus Totals, with hits/misses only for reads.
    #[test]
    fn report_shape() {
        let mut gets = OpStats::new();
        gets.record(1_000_000);
        gets.hits = 1;
        let r = RunResult {
            op_names: vec!["Sets".into(), "Gets".into()],
            op_is_read: vec![false, true],
            ops: vec![OpStats::new(), gets],
            elapsed: Duration::from_secs(1),
            connection_errors: 0,
            unanswered: 0,
            start_unix_ms: 0,
            end_unix_ms: 1000,
        };
        let text = r.text_report(&[50.0, 99.9], true);
        assert!(text.contains("p99.9 Latency") && text.contains("p50 Latency"));
        let gets_line = text.lines().find(|l| l.starts_with("Gets")).unwrap();
        assert!(gets_line.contains("1.00"), "{gets_line}");
        let j = r.json(&[50.0, 99.9], json!({}));
        assert_eq!(j["ALL STATS"]["Gets"]["Count"], 1);
        assert_eq!(j["ALL STATS"]["Totals"]["Count"], 1);
        assert!(close(
            j["ALL STATS"]["Gets"]["Percentile Latencies"]["p99.90"]
                .as_f64()
                .unwrap(),
            1.0
        ));
    }
}
