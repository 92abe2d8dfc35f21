//! Pacing what a client uploads: one budget of bytes per second shared by every connection,
//! whose rate may follow a weekly timetable (rclone's `--bwlimit` style).
//!
//! A paced upload slows down chunk by chunk while it runs ([`Paced`]), instead of waiting
//! before it starts or being cut off: the link carries a steady stream at the limit and no
//! request sits idle long enough to look stalled. The budget is a token bucket kept as the
//! time by which everything reserved so far has been paid for at the rate (the "theoretical
//! arrival time" of GCRA): a reservation that would run past [`BURST`] ahead of now waits the
//! difference.

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How far ahead of the rate a sender may run: a burst of this much time's worth of bytes.
pub const BURST: Duration = Duration::from_millis(50);

/// Bytes a paced body hands on per read: small against a second at any useful rate, so the
/// pacing is smooth, and large enough that reserving them costs nothing.
const CHUNK: usize = 64 << 10;

/// Minutes in a week; a timetable's clock counts them from Monday 00:00.
pub const WEEK_MINUTES: u32 = 7 * 24 * 60;

/// A weekly timetable of limits: each entry holds from its minute of the week until the
/// next one, the last wrapping around to the first. `None` is no limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Timetable {
    /// (minute of the week from Monday 00:00, bytes per second), sorted by minute.
    entries: Vec<(u32, Option<f64>)>,
}

impl Timetable {
    /// One limit at every hour (`None`: none).
    pub fn fixed(rate: Option<f64>) -> Self {
        Self {
            entries: vec![(0, rate)],
        }
    }

    /// Entries as (minute of the week, limit); at least one, each minute under a week and
    /// given once.
    pub fn new(mut entries: Vec<(u32, Option<f64>)>) -> Result<Self, String> {
        if entries.is_empty() {
            return Err("a timetable needs at least one entry".into());
        }
        if let Some((minute, _)) = entries.iter().find(|(m, _)| *m >= WEEK_MINUTES) {
            return Err(format!("minute {minute} is past the end of the week"));
        }
        if let Some((_, rate)) = entries.iter().find(|(_, r)| r.is_some_and(|r| r <= 0.0)) {
            return Err(format!(
                "a limit of {rate:?} bytes per second sends nothing; use off for none"
            ));
        }
        entries.sort_by_key(|(m, _)| *m);
        if entries.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err("it sets one time twice".into());
        }
        Ok(Self { entries })
    }

    /// The same timetable with no limit above `rate`: a target rate under a timetable.
    pub fn capped(mut self, rate: f64) -> Self {
        for (_, limit) in &mut self.entries {
            *limit = Some(limit.map_or(rate, |l| l.min(rate)));
        }
        self
    }

    /// The limit in force at `minute` of the week (0 = Monday 00:00).
    pub fn at(&self, minute: u32) -> Option<f64> {
        let before = self.entries.iter().rev().find(|(m, _)| *m <= minute);
        // Before the week's first entry the last one still holds, from the week before.
        before.or(self.entries.last()).and_then(|(_, rate)| *rate)
    }

    /// The lowest limit it ever sets, if any.
    pub fn lowest(&self) -> Option<f64> {
        self.entries
            .iter()
            .filter_map(|(_, r)| *r)
            .min_by(f64::total_cmp)
    }
}

/// The shared budget: a [`Timetable`], read through a clock of minutes of the week, and the
/// bucket it fills.
pub struct Pacer {
    timetable: Timetable,
    /// The minute of the week now; the local clock in use, one the test sets in tests.
    clock: Box<dyn Fn() -> u32 + Send + Sync>,
    state: Mutex<Bucket>,
    /// Bytes it has let go: what the link carried, counted 64 KiB at a time as it goes, where
    /// the requests the relay answered tell it a whole part at a time.
    passed: AtomicU64,
}

struct Bucket {
    /// The limit in force, and when the timetable was last looked at.
    rate: Option<f64>,
    looked: Option<Instant>,
    /// When every byte reserved so far has been paid for at the rate.
    paid_until: Instant,
}

impl Pacer {
    pub fn new(timetable: Timetable, clock: Box<dyn Fn() -> u32 + Send + Sync>) -> Self {
        Self {
            timetable,
            clock,
            state: Mutex::new(Bucket {
                rate: None,
                looked: None,
                paid_until: Instant::now(),
            }),
            passed: AtomicU64::new(0),
        }
    }

    /// The limit in force now (looking at the timetable again if a second has passed).
    pub fn rate(&self) -> Option<f64> {
        self.state.lock().rate_at(Instant::now(), self)
    }

    /// The timetable it follows.
    pub fn timetable(&self) -> &Timetable {
        &self.timetable
    }

    /// The bytes it has let go so far.
    pub fn passed(&self) -> u64 {
        self.passed.load(Ordering::Relaxed)
    }

    /// Waits until `bytes` more may go.
    pub fn take(&self, bytes: usize) {
        self.passed.fetch_add(bytes as u64, Ordering::Relaxed);
        let wait = {
            let mut bucket = self.state.lock();
            let now = Instant::now();
            let rate = bucket.rate_at(now, self);
            bucket.reserve(now, bytes as u64, rate)
        };
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
}

impl Bucket {
    fn rate_at(&mut self, now: Instant, pacer: &Pacer) -> Option<f64> {
        if self
            .looked
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
        {
            let rate = pacer.timetable.at((pacer.clock)() % WEEK_MINUTES);
            if self.looked.is_none() || rate != self.rate {
                tracing::info!(
                    limit = %rate.map_or("off".into(), |r| format!("{:.1} MB/s", r / 1e6)),
                    "upload bandwidth limit now in force"
                );
            }
            // 0 is no limit. Set at every look, so it is there once uploads have started
            // whenever the metrics endpoint was installed.
            metrics::gauge!("forte_upload_limit_bytes_per_second", "role" => "edge")
                .set(rate.unwrap_or(0.0));
            self.rate = rate;
            self.looked = Some(now);
        }
        self.rate
    }

    /// Reserves `bytes` at `rate` at `now`; returns how long to wait before sending them.
    fn reserve(&mut self, now: Instant, bytes: u64, rate: Option<f64>) -> Duration {
        let Some(rate) = rate else {
            // No limit: nothing owed, and a limit that starts later starts from now.
            self.paid_until = now;
            return Duration::ZERO;
        };
        reserve(&mut self.paid_until, now, bytes, rate)
    }
}

/// GCRA: reserves `bytes` at `rate` bytes per second at `now` against `paid_until` (when
/// everything reserved before is paid for); returns how long to wait before they go, which
/// is zero within a [`BURST`] ahead of the rate.
pub(crate) fn reserve(paid_until: &mut Instant, now: Instant, bytes: u64, rate: f64) -> Duration {
    *paid_until = (*paid_until).max(now) + Duration::from_secs_f64(bytes as f64 / rate);
    paid_until.saturating_duration_since(now + BURST)
}

/// A request body that reads its bytes out through a [`Pacer`].
pub struct Paced {
    bytes: Vec<u8>,
    sent: usize,
    pacer: Arc<Pacer>,
}

impl Paced {
    pub fn new(bytes: Vec<u8>, pacer: Arc<Pacer>) -> Self {
        Self {
            bytes,
            sent: 0,
            pacer,
        }
    }
}

impl Read for Paced {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(CHUNK).min(self.bytes.len() - self.sent);
        if n == 0 {
            return Ok(0);
        }
        self.pacer.take(n);
        buf[..n].copy_from_slice(&self.bytes[self.sent..self.sent + n]);
        self.sent += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    const MON: u32 = 0;
    const DAY: u32 = 24 * 60;

    #[test]
    fn each_entry_holds_until_the_next_and_the_last_wraps_around_the_week() {
        // Weekdays 1 MB/s from 08:00, off from 19:00; Saturday 10 MB/s all day.
        let t = Timetable::new(vec![
            (MON + 8 * 60, Some(1e6)),
            (MON + 19 * 60, None),
            (5 * DAY, Some(10e6)),
        ])
        .unwrap();
        assert_eq!(
            t.at(MON + 8 * 60 - 1),
            Some(10e6),
            "wraps from the week before"
        );
        assert_eq!(t.at(MON + 8 * 60), Some(1e6));
        assert_eq!(t.at(MON + 18 * 60 + 59), Some(1e6));
        assert_eq!(t.at(MON + 19 * 60), None);
        assert_eq!(t.at(4 * DAY + 12 * 60), None);
        assert_eq!(t.at(6 * DAY + 23 * 60), Some(10e6));
        assert_eq!(t.lowest(), Some(1e6));
        assert!(Timetable::new(vec![]).is_err());
        assert!(Timetable::new(vec![(WEEK_MINUTES, None)]).is_err());
        assert!(Timetable::new(vec![(0, Some(0.0))]).is_err());
        assert!(Timetable::new(vec![(60, None), (60, Some(1e6))]).is_err());
    }

    #[test]
    fn the_pacer_switches_limit_when_the_clock_reaches_the_entry() {
        let now = Arc::new(AtomicU32::new(MON + 8 * 60 - 1));
        let clock = now.clone();
        let pacer = Pacer::new(
            Timetable::new(vec![(MON + 8 * 60, Some(2e6)), (MON + 19 * 60, None)]).unwrap(),
            Box::new(move || clock.load(Ordering::Relaxed)),
        );
        assert_eq!(pacer.rate(), None);
        now.store(MON + 8 * 60, Ordering::Relaxed);
        // Looked at again at most once a second.
        pacer.state.lock().looked = None;
        assert_eq!(pacer.rate(), Some(2e6));
        now.store(MON + 19 * 60, Ordering::Relaxed);
        pacer.state.lock().looked = None;
        assert_eq!(pacer.rate(), None);
    }

    #[test]
    fn the_pacer_counts_the_bytes_it_lets_go() {
        let pacer = Pacer::new(Timetable::fixed(Some(100e6)), Box::new(|| MON));
        let mut body = Paced::new(vec![7; 200_000], Arc::new(pacer));
        let mut sent = vec![];
        body.read_to_end(&mut sent).unwrap();
        assert_eq!(sent.len(), 200_000);
        assert_eq!(body.pacer.passed(), 200_000);
    }

    #[test]
    fn reservations_past_the_burst_wait_for_the_rate() {
        let start = Instant::now();
        let mut bucket = Bucket {
            rate: None,
            looked: None,
            paid_until: start,
        };
        let ms = |d: Duration| d.as_millis();
        // 1 MB/s: 40 kB fit in the 50 ms burst, the next 40 kB wait 30 ms, and so on.
        assert_eq!(ms(bucket.reserve(start, 40_000, Some(1e6))), 0);
        assert_eq!(ms(bucket.reserve(start, 40_000, Some(1e6))), 30);
        assert_eq!(ms(bucket.reserve(start, 40_000, Some(1e6))), 70);
        // Half a second later what was owed is paid: a burst's worth goes at once again.
        let later = start + Duration::from_millis(500);
        assert_eq!(ms(bucket.reserve(later, 50_000, Some(1e6))), 0);
        // No limit owes nothing, and leaves nothing owed.
        assert_eq!(ms(bucket.reserve(later, 10_000_000, None)), 0);
        assert_eq!(ms(bucket.reserve(later, 40_000, Some(1e6))), 0);
    }
}
