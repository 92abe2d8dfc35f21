//! Adapting the zstd level to whichever of CPU and sink is slower, as `zstd --adapt` does.
//!
//! When parts pile up before the sink (the link cannot take them faster) and none wait to be
//! compressed, the CPU has time to spare: one level up buys a better ratio, so more raw data
//! crosses the same link. When parts wait to be compressed while the sink's queue is empty,
//! compression starves the link: one level down. Decisions are taken every few parts, one
//! step at a time, between the configured bounds.

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

/// Parts between two decisions.
const PARTS_PER_STEP: u32 = 4;

/// How full two queues are, as fractions of their capacity.
#[derive(Debug, Clone, Copy)]
pub struct Pressure {
    pub waiting_to_compress: f64,
    pub waiting_for_sink: f64,
}

#[derive(Debug)]
pub struct LevelControl {
    level: AtomicI32,
    bounds: Option<(i32, i32)>,
    parts: AtomicU32,
}

impl LevelControl {
    /// `start` throughout when `bounds` is `None`; else adapted within `bounds`.
    pub fn new(start: i32, bounds: Option<(i32, i32)>) -> Self {
        let start = bounds.map_or(start, |(lo, hi)| start.clamp(lo, hi));
        Self {
            level: AtomicI32::new(start),
            bounds,
            parts: AtomicU32::new(0),
        }
    }

    pub fn is_adaptive(&self) -> bool {
        self.bounds.is_some()
    }

    pub fn current(&self) -> i32 {
        self.level.load(Ordering::Relaxed)
    }

    /// Called after each compressed part with the queues' state at that moment.
    pub fn observe(&self, pressure: Pressure) {
        let Some((lo, hi)) = self.bounds else { return };
        if self.parts.fetch_add(1, Ordering::Relaxed) % PARTS_PER_STEP != PARTS_PER_STEP - 1 {
            return;
        }
        let level = self.current();
        self.level
            .store(next_level(level, lo, hi, pressure), Ordering::Relaxed);
    }
}

/// How full a queue holding `depth` parts is, against the most parts that can wait in it:
/// its capacity, or the memory budget's `parts_in_flight` when that is smaller (it usually
/// is, so against the capacity alone a queue would never look full).
pub fn fill(depth: usize, capacity: usize, parts_in_flight: usize) -> f64 {
    let room = capacity.min(parts_in_flight).max(1);
    (depth as f64 / room as f64).min(1.0)
}

fn next_level(level: i32, lo: i32, hi: i32, p: Pressure) -> i32 {
    if p.waiting_for_sink >= 0.5 && p.waiting_to_compress < 0.25 {
        (level + 1).min(hi)
    } else if p.waiting_to_compress >= 0.5 && p.waiting_for_sink < 0.25 {
        (level - 1).max(lo)
    } else {
        level
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(compress: f64, sink: f64) -> Pressure {
        Pressure {
            waiting_to_compress: compress,
            waiting_for_sink: sink,
        }
    }

    #[test]
    fn the_level_follows_the_bottleneck_within_bounds() {
        // The link is the bottleneck: more compression.
        assert_eq!(next_level(3, 1, 9, p(0.0, 1.0)), 4);
        assert_eq!(next_level(9, 1, 9, p(0.0, 1.0)), 9);
        // Compression is the bottleneck: less.
        assert_eq!(next_level(3, 1, 9, p(1.0, 0.0)), 2);
        assert_eq!(next_level(1, 1, 9, p(1.0, 0.0)), 1);
        // Balanced, or both full: stay.
        assert_eq!(next_level(3, 1, 9, p(0.3, 0.3)), 3);
        assert_eq!(next_level(3, 1, 9, p(1.0, 1.0)), 3);
    }

    #[test]
    fn fill_counts_against_what_the_memory_budget_lets_wait() {
        // 4 parts waiting in a queue of 12 with 6 parts in flight (2 cores): more than half of
        // what can wait, so compression is the bottleneck and the level may step down.
        assert!(fill(4, 12, 6) > 0.5);
        assert_eq!(fill(4, 12, 6), 4.0 / 6.0);
        assert_eq!(fill(3, 4, 100), 0.75);
        assert_eq!(fill(20, 12, 6), 1.0);
        assert_eq!(next_level(3, 1, 9, p(fill(4, 12, 6), 0.0)), 2);
    }

    #[test]
    fn one_step_every_few_parts_and_none_when_fixed() {
        let adaptive = LevelControl::new(3, Some((1, 9)));
        for _ in 0..PARTS_PER_STEP * 2 {
            adaptive.observe(p(0.0, 1.0));
        }
        assert_eq!(adaptive.current(), 5);
        let fixed = LevelControl::new(3, None);
        for _ in 0..PARTS_PER_STEP * 2 {
            fixed.observe(p(0.0, 1.0));
        }
        assert_eq!(fixed.current(), 3);
    }
}
