//! Adapting the zstd level to whichever of CPU and link is slower, as `zstd --adapt` does,
//! judged on both at once.
//!
//! When parts pile up before the sink (the link cannot take them faster) and the CPU budget
//! has time to spare, one level up buys a better ratio, so more raw data crosses the same
//! link. When the link waits for parts (none wait before the sink) while the CPU budget is
//! used up, compression starves the link: one level down. When the link waits and the CPU is
//! idle too (reading bounds the pass), a better ratio costs nothing: one level up. Decisions
//! are taken every few parts, one step at a time (two up while the link is behind and the CPU
//! idles), between the configured bounds.
//!
//! The CPU's share is the larger of two, between two decisions: the busy time of the
//! pipeline's computing stages over the wall time times the CPU budget, and the share of the
//! whole machine busy (`/proc/stat`), whoever keeps it busy. The queues alone could not tell:
//! on two cores the read and hash stages compete with compression for the same tokens, so a
//! CPU-bound pass kept the compress queue short and the level at 3, 12 % slower than level 1
//! end to end. The budget's share alone could not either: with the relay and the puller on
//! the same two cores, auto stayed near level 2, 11 % slower than level 1.

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

/// Parts between two decisions: at 4, a link-bound A–N run (10 MB/s) spent 40 % of its parts
/// climbing from level 3 and ended 4 % behind level 9.
const PARTS_PER_STEP: u32 = 2;
/// Share of the CPU budget in use from which the CPU is the bottleneck.
const CPU_BOUND: f64 = 0.9;
/// Share under which the CPU is idle enough that a better ratio is free.
const CPU_IDLE: f64 = 0.6;

/// How full the queue before the sink is, as a fraction of what may wait there, and the
/// computing stages' busy seconds so far.
#[derive(Debug, Clone, Copy)]
pub struct Pressure {
    pub waiting_for_sink: f64,
    pub cpu_busy_seconds: f64,
}

/// What was read at a decision.
#[derive(Debug)]
struct Reading {
    at: Instant,
    /// The computing stages' busy seconds so far.
    cpu_busy_seconds: f64,
    /// The machine's CPU ticks (busy, total), if readable.
    machine: Option<(u64, u64)>,
}

#[derive(Debug)]
pub struct LevelControl {
    level: AtomicI32,
    bounds: Option<(i32, i32)>,
    parts: AtomicU32,
    /// The CPU budget, and what was read at the last decision.
    cpu: usize,
    last: Mutex<Option<Reading>>,
}

impl LevelControl {
    /// `start` throughout when `bounds` is `None`; else adapted within `bounds` on a CPU
    /// budget of `cpu` workers.
    pub fn new(start: i32, bounds: Option<(i32, i32)>, cpu: usize) -> Self {
        let start = bounds.map_or(start, |(lo, hi)| start.clamp(lo, hi));
        Self {
            level: AtomicI32::new(start),
            bounds,
            parts: AtomicU32::new(0),
            cpu: cpu.max(1),
            last: Mutex::new(None),
        }
    }

    fn is_adaptive(&self) -> bool {
        self.bounds.is_some()
    }

    pub fn current(&self) -> i32 {
        self.level.load(Ordering::Relaxed)
    }

    /// Called after each compressed part; `pressure` reads the pipeline's state, and it and
    /// the machine's CPU are read only when a decision is due.
    pub fn observe(&self, pressure: impl FnOnce() -> Pressure) {
        if !self.is_adaptive()
            || self.parts.fetch_add(1, Ordering::Relaxed) % PARTS_PER_STEP != PARTS_PER_STEP - 1
        {
            return;
        }
        self.decide(Instant::now(), pressure(), forte_usage::cpu_ticks().ok());
    }

    /// One decision at `now`, from the pipeline's state and the machine's CPU ticks.
    fn decide(&self, now: Instant, pressure: Pressure, machine: Option<(u64, u64)>) {
        let Some((lo, hi)) = self.bounds else { return };
        let before = self.last.lock().replace(Reading {
            at: now,
            cpu_busy_seconds: pressure.cpu_busy_seconds,
            machine,
        });
        // The first decision only starts the clock of the CPU's share.
        let Some(Reading {
            at: then,
            cpu_busy_seconds: busy_then,
            machine: machine_then,
        }) = before
        else {
            return;
        };
        let wall = (now - then).as_secs_f64() * self.cpu as f64;
        if wall <= 0.0 {
            return;
        }
        let budget_share = (pressure.cpu_busy_seconds - busy_then) / wall;
        let machine_share = match (machine_then, machine) {
            (Some((busy0, total0)), Some((busy1, total1))) if total1 > total0 => {
                busy1.saturating_sub(busy0) as f64 / (total1 - total0) as f64
            }
            _ => 0.0,
        };
        let cpu = budget_share.max(machine_share);
        let level = self.current();
        self.level.store(
            next_level(level, lo, hi, pressure.waiting_for_sink, cpu),
            Ordering::Relaxed,
        );
    }
}

/// How full a queue holding `depth` parts is, against the most parts that can wait in it:
/// its capacity, or the memory budget's `parts_in_flight` when that is smaller (it usually
/// is, so against the capacity alone a queue would never look full).
pub fn fill(depth: usize, capacity: usize, parts_in_flight: usize) -> f64 {
    let room = capacity.min(parts_in_flight).max(1);
    (depth as f64 / room as f64).min(1.0)
}

/// The next level from how full the queue before the sink is and the CPU budget's share in
/// use since the last decision. Two steps up while the link is behind and the CPU idles: the
/// climb from the start level to the top takes half the parts (measured: it did not change
/// what a link-bound run at 10 MB/s puts on the link, 300 MB against level 9's 288).
fn next_level(level: i32, lo: i32, hi: i32, waiting_for_sink: f64, cpu: f64) -> i32 {
    let link_behind = waiting_for_sink >= 0.5;
    let link_waits = waiting_for_sink < 0.25;
    if link_behind && cpu < CPU_IDLE {
        (level + 2).min(hi)
    } else if (link_behind && cpu < CPU_BOUND) || (link_waits && cpu < CPU_IDLE) {
        (level + 1).min(hi)
    } else if link_waits && cpu >= CPU_BOUND {
        (level - 1).max(lo)
    } else {
        level
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_level_follows_the_bottleneck_within_bounds() {
        // The link is behind and the CPU has room: more compression; two steps while the CPU
        // idles.
        assert_eq!(next_level(3, 1, 9, 1.0, 0.7), 4);
        assert_eq!(next_level(3, 1, 9, 1.0, 0.5), 5);
        assert_eq!(next_level(8, 1, 9, 1.0, 0.5), 9);
        assert_eq!(next_level(9, 1, 9, 1.0, 0.5), 9);
        // The link waits and the CPU is used up: less.
        assert_eq!(next_level(3, 1, 9, 0.0, 0.95), 2);
        assert_eq!(next_level(1, 1, 9, 0.0, 1.0), 1);
        // The link waits and the CPU idles (reading bounds the pass): a better ratio is free.
        assert_eq!(next_level(3, 1, 9, 0.0, 0.3), 4);
        // Both busy, or in between: stay.
        assert_eq!(next_level(3, 1, 9, 1.0, 0.95), 3);
        assert_eq!(next_level(3, 1, 9, 0.3, 0.7), 3);
        assert_eq!(next_level(3, 1, 9, 0.0, 0.75), 3);
    }

    #[test]
    fn fill_counts_against_what_the_memory_budget_lets_wait() {
        // 4 parts waiting in a queue of 12 with 6 parts in flight: more than half of what can
        // wait.
        assert!(fill(4, 12, 6) > 0.5);
        assert_eq!(fill(4, 12, 6), 4.0 / 6.0);
        assert_eq!(fill(3, 4, 100), 0.75);
        assert_eq!(fill(20, 12, 6), 1.0);
    }

    /// Three decisions a second apart with the link waiting, the pipeline's computing stages
    /// busy `busy_per_second` seconds a second and the machine `machine` ticks busy of 200
    /// a second (none: unreadable); the level after them.
    fn after_three_decisions(busy_per_second: f64, machine: Option<u64>) -> i32 {
        let control = LevelControl::new(5, Some((1, 9)), 2);
        let start = Instant::now();
        for second in 0..3u32 {
            control.decide(
                start + Duration::from_secs(second.into()),
                Pressure {
                    waiting_for_sink: 0.0,
                    cpu_busy_seconds: busy_per_second * f64::from(second),
                },
                machine.map(|busy| (busy * u64::from(second), 200 * u64::from(second))),
            );
        }
        control.current()
    }

    #[test]
    fn each_decision_is_judged_on_the_cpu_share_since_the_last() {
        // Two workers busy 1.9 s of each second (95 %), the link waiting: down a step per
        // decision after the first, which only starts the clock.
        assert_eq!(after_three_decisions(1.9, None), 3);
        // The budget half used but the machine busy (other processes on its cores): down too.
        assert_eq!(after_three_decisions(1.0, Some(190)), 3);
        // Neither busy: a better ratio is free.
        assert_eq!(after_three_decisions(0.2, Some(40)), 7);
    }

    #[test]
    fn a_decision_every_few_parts_and_none_when_fixed() {
        let read = std::cell::Cell::new(0);
        let adaptive = LevelControl::new(5, Some((1, 9)), 2);
        let fixed = LevelControl::new(3, None, 2);
        for _ in 0..PARTS_PER_STEP * 3 {
            for control in [&adaptive, &fixed] {
                control.observe(|| {
                    read.set(read.get() + 1);
                    Pressure {
                        waiting_for_sink: 1.0,
                        cpu_busy_seconds: 0.0,
                    }
                });
            }
        }
        // The pipeline was read once per decision of the adaptive control only.
        assert_eq!(read.get(), 3);
        assert_eq!(fixed.current(), 3);
    }
}
