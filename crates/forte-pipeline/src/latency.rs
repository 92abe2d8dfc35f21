//! Per-item latency, from the moment an item was read to the moment the sink takes it: a
//! histogram of fixed size (a daemon runs for months), whose percentiles are exact to within
//! one bucket, 9 %.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Buckets per doubling: each bucket's upper bound is 2^(1/8) = 1.09 × its lower one.
const PER_DOUBLING: f64 = 8.0;
/// From 1 µs to 2^40 µs (12 days).
const BUCKETS: usize = 40 * PER_DOUBLING as usize + 1;

/// Latencies seen, counted by bucket.
#[derive(Debug)]
pub struct Latencies {
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
}

impl Default for Latencies {
    fn default() -> Self {
        Self {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
        }
    }
}

/// Percentiles of the latencies seen, in milliseconds (each a bucket's upper bound).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct LatencySnapshot {
    pub items: u64,
    /// Of every item's latency.
    pub sum_seconds: f64,
    pub p50_ms: f64,
    pub p87_ms: f64,
    pub p99_ms: f64,
}

impl Latencies {
    pub fn record(&self, latency: Duration) {
        let micros = latency.as_micros().max(1) as u64;
        let bucket = (((micros as f64).log2() * PER_DOUBLING).ceil() as usize).min(BUCKETS - 1);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// Adds what `other` saw to this: the latencies of several pipelines together.
    pub fn add(&self, other: &Latencies) {
        for (mine, theirs) in self.counts.iter().zip(&other.counts) {
            mine.fetch_add(theirs.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        let sum = other.sum_micros.load(Ordering::Relaxed);
        self.sum_micros.fetch_add(sum, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> LatencySnapshot {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let items: u64 = counts.iter().sum();
        let percentile = |p: f64| {
            if items == 0 {
                return 0.0;
            }
            let rank = ((p * items as f64).ceil() as u64).max(1);
            let mut seen = 0;
            let bucket = counts
                .iter()
                .position(|c| {
                    seen += c;
                    seen >= rank
                })
                .unwrap_or(BUCKETS - 1);
            (bucket as f64 / PER_DOUBLING).exp2() / 1000.0
        };
        LatencySnapshot {
            items,
            sum_seconds: self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
            p50_ms: percentile(0.50),
            p87_ms: percentile(0.87),
            p99_ms: percentile(0.99),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_within_a_bucket_of_the_truth() {
        let latencies = Latencies::default();
        // 1 ms … 100 ms, one item each.
        for ms in 1..=100 {
            latencies.record(Duration::from_millis(ms));
        }
        let snap = latencies.snapshot();
        assert_eq!(snap.items, 100);
        assert_eq!(snap.sum_seconds, 5.05);
        for (got, truth) in [
            (snap.p50_ms, 50.0),
            (snap.p87_ms, 87.0),
            (snap.p99_ms, 99.0),
        ] {
            assert!(got >= truth && got <= truth * 1.095, "{got} for {truth}");
        }
        assert_eq!(Latencies::default().snapshot(), LatencySnapshot::default());
        let both = Latencies::default();
        both.add(&latencies);
        both.add(&latencies);
        assert_eq!(both.snapshot().items, 200);
        assert_eq!(both.snapshot().p87_ms, snap.p87_ms);
    }
}
