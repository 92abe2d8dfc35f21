//! The send's tuner, FStream's idea in forte: how many uploads are in flight is chosen from
//! the link at the start and then turned while the pass runs, on the goodput it measures.
//!
//! The starting point is FStream's heuristic: enough uploads that their bytes cover the
//! bandwidth-delay product (the round trip measured on an open connection, the link rate
//! from the history of this relay or a generous guess), counted in the mean size of one
//! request of this queue (a part, a bundle, a small file), plus two so that the relay's
//! commit and a slow request do not leave the link idle. A run that has history for this
//! relay, size cluster and hour starts where that run ended instead.
//!
//! Then, every [`PROBE`] (longer until [`MIN_REQUESTS`] requests went out), a hill climb on
//! Falcon's utility: U = T / K^n − T·B·loss, where T is the goodput (bytes per second the
//! relay acknowledged, or from a 50 ms round trip on the bytes the uploads' connections took,
//! counted as they go), n the uploads in flight,
//! K the cost of one more stream and loss the share of requests retried. A step that
//! raised U is followed by a larger one the same way (Falcon's accelerating gradient); one
//! that lowered it is undone and the direction turned; once settled it probes one small
//! step every few intervals, which follows a link whose spare bandwidth changes. It never
//! grows when the uploads are not all busy (the pipeline is short of work, not of link) and
//! holds while a bandwidth limit already binds.

use std::time::Duration;

/// How long each setting is measured before the next decision, at least.
pub const PROBE: Duration = Duration::from_secs(2);
/// Requests an interval must see go out before it is judged, so that the share of them
/// retried (the utility's loss) is a share of enough. An interval lasts until then, or
/// [`LONGEST_INTERVAL`]. On a long round trip, goodput itself is counted as the connections
/// take the bytes (see `COUNT_AS_SENT_FROM` in the tuner).
pub const MIN_REQUESTS: u64 = 8;
pub const LONGEST_INTERVAL: Duration = Duration::from_secs(10);

/// Bounds of the uploads in flight under `--connections auto`.
pub const MIN_UPLOADS: usize = 2;
pub use forte_daemon::settings::MAX_UPLOADS;

/// The link rate assumed for the starting point when no run to this relay has measured one:
/// more than the site links forte is built for, so the first guess errs towards enough
/// uploads and the climb comes down from there.
pub const GUESSED_LINK: f64 = 100e6;

/// The cost of one more upload in flight in Falcon's utility. Falcon's 1.04 is for a few
/// streams; at the dozens of uploads a 200 ms link of small files wants, 1.04^32 would
/// outweigh any gain. 1.01 asks 16 → 32 uploads to pay with about 17 % more goodput.
const K: f64 = 1.01;
/// Falcon's penalty on the share of requests that had to be retried.
const B: f64 = 10.0;
/// Changes of utility smaller than this are noise on a shared, bursty link.
const NOISE: f64 = 0.05;
/// Mean busy uploads over an interval, as a share of the limit, under which the pipeline
/// (not the link) is what is short.
const BUSY: f64 = 0.75;
/// What the link carried at this share of a bandwidth limit or more means the limit binds:
/// 16 MiB parts at 30 MB/s measure 28.2 MB/s of goodput through a limit held to 1 %. Where the
/// sender's own limit paces the uploads, the bytes through it are what is compared: goodput
/// is counted as requests finish, a part at a time, and through a limit of 5 MB/s binding all
/// along it read 3.6 to 6.5 MB/s in 3-to-5-s intervals, so the climb took the low ones for a
/// link with room and probed (docs/benchmarks/log/2026-11.md, the dashboard's ETA).
const LIMIT_BINDS: f64 = 0.9;
/// A change of goodput at a settled setting, as a share of it, that means the link changed.
const MOVED: f64 = 0.2;
/// Intervals between two probes once the climb has settled.
const SETTLED_PROBE_EVERY: u32 = 4;

/// FStream's starting point: uploads whose requests cover the bandwidth-delay product, enough
/// times over that the round trip each request waits for its answer costs the link no more
/// than a tenth.
///
/// An upload sends its request (S bytes, at its share of the link) and then waits a round trip
/// for the answer before its next, so N uploads keep a link of rate L busy a share
/// N·S / (N·S + L·RTT) of the time. Covering the product once, FStream's rule, leaves the
/// link idle a third of the time or more (measured: 5 uploads of 7 MB at +200 ms put 45 of
/// 65 MB/s on the link); nine times gives 90 %. Two more cover the relay's commit and a slow
/// request. The climb corrects the rest; the memory budget bounds what is really in flight.
///
/// `round_trip` from a request on an open connection, `link` in bytes per second,
/// `request_bytes` the mean bytes of one request.
pub fn starting_point(round_trip: Duration, link: f64, request_bytes: f64) -> usize {
    let in_flight = link * round_trip.as_secs_f64();
    let uploads = 2.0 + (9.0 * in_flight / request_bytes.max(1.0)).ceil();
    (uploads as usize).clamp(MIN_UPLOADS, MAX_UPLOADS)
}

/// What was measured over one interval at one setting.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Bytes per second the relay acknowledged, or the uploads' connections took (the link's
    /// rate, retries included) from a 50 ms round trip.
    pub goodput: f64,
    /// Mean uploads holding a request over the interval.
    pub busy: f64,
    /// Requests that went out, and retries, in the interval.
    pub requests: u64,
    pub retries: u64,
    /// The bandwidth limit in force, if any.
    pub limit: Option<f64>,
    /// Bytes per second that went through the sender's own bandwidth limit, if it has one.
    pub paced: Option<f64>,
}

impl Sample {
    /// No request finished and no upload was busy.
    pub fn is_idle(&self) -> bool {
        self.requests == 0 && self.busy < 0.05
    }
}

/// A change of setting and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub uploads: usize,
    pub reason: String,
}

/// The hill climb's state.
#[derive(Debug)]
pub struct Climb {
    uploads: usize,
    /// The setting measured before this one and its utility.
    previous: Option<(usize, f64)>,
    /// +1 up, -1 down.
    direction: i32,
    /// How far the next move goes, as a factor of the uploads.
    step: f64,
    /// Intervals held since the climb last settled.
    settled_for: Option<u32>,
    /// The goodput when it settled: a change larger than [`MOVED`] from it is a link that
    /// changed, probed at once rather than at the next scheduled probe.
    settled_goodput: Option<f64>,
    /// The best utility measured and its setting: what history keeps.
    best: Option<Best>,
}

/// The setting of the best utility measured so far.
#[derive(Debug, Clone, Copy)]
struct Best {
    uploads: usize,
    /// Falcon's utility measured at it.
    utility: f64,
    /// The goodput measured with it, in bytes per second.
    goodput: f64,
}

impl Climb {
    pub fn new(uploads: usize) -> Self {
        Self {
            uploads: uploads.clamp(MIN_UPLOADS, MAX_UPLOADS),
            previous: None,
            direction: 1,
            step: 1.5,
            settled_for: None,
            settled_goodput: None,
            best: None,
        }
    }

    pub fn uploads(&self) -> usize {
        self.uploads
    }

    /// The setting of the best utility measured, with its goodput.
    pub fn best(&self) -> Option<(usize, f64)> {
        self.best.map(|best| (best.uploads, best.goodput))
    }

    /// Takes one interval's measurement of the current setting; returns the next setting if
    /// it changes.
    pub fn observe(&mut self, s: Sample) -> Option<Change> {
        let n = self.uploads;
        if s.is_idle() {
            // Nothing was sent (a daemon between batches): nothing to judge, and the setting
            // stays for the next batch rather than coming down to none busy.
            self.previous = None;
            return None;
        }
        if s.busy < BUSY * n as f64 && s.retries == 0 {
            return self.come_down_to_busy(s);
        }
        let utility = self.utility(s);
        let carried = s.paced.unwrap_or(s.goodput);
        if s.limit.is_some_and(|limit| carried >= LIMIT_BINDS * limit) {
            // The limit, not the uploads, sets the rate: these uploads are enough for it.
            self.previous = None;
            return None;
        }
        let Some((before, before_utility)) = self.previous else {
            // The first measurement of a setting: probe next to it.
            return self.settle_or_probe(utility, s.goodput);
        };
        let gain = (utility - before_utility) / before_utility.abs().max(1.0);
        if gain > NOISE {
            self.go_further(utility, before, s.goodput)
        } else if gain < -NOISE {
            self.go_back(before, s.goodput)
        } else {
            self.keep_the_cheaper(before, s.goodput)
        }
    }

    /// Uploads waited for work: more of them cannot help. Forget the comparison, which
    /// was not of the link, and come down to one more than were busy, so that the
    /// setting says what is used (a limit of 11 where the memory budget let 6 work
    /// kept a second sender on the same link at a third of the share) and the next
    /// probe starts from there.
    fn come_down_to_busy(&mut self, s: Sample) -> Option<Change> {
        let n = self.uploads;
        self.previous = None;
        self.settled_for = Some(0);
        let used = (s.busy.ceil() as usize + 1).max(MIN_UPLOADS);
        (used < n)
            .then(|| {
                self.direction = 1;
                self.set(used, format!("{:.1} of {n} uploads were busy", s.busy))
            })
            .flatten()
    }

    /// Falcon's utility of the current setting measured as `s`, kept as the best if it is.
    fn utility(&mut self, s: Sample) -> f64 {
        let n = self.uploads;
        let loss = s.retries as f64 / s.requests.max(1) as f64;
        let utility = s.goodput / K.powi(n as i32) - s.goodput * B * loss;
        if self.best.is_none_or(|best| utility > best.utility) {
            self.best = Some(Best {
                uploads: n,
                utility,
                goodput: s.goodput,
            });
        }
        utility
    }

    /// The move from `before` paid: go on the same way, further (Falcon's accelerating step).
    fn go_further(&mut self, utility: f64, before: usize, goodput: f64) -> Option<Change> {
        let n = self.uploads;
        self.step = (self.step * 1.5).min(3.0);
        self.settled_for = None;
        self.move_by(
            utility,
            format!(
                "{before} → {n} uploads raised goodput to {:.1} MB/s",
                goodput / 1e6
            ),
        )
    }

    /// The move from `before` cost: back to where it was, and the next probe goes the other
    /// way.
    fn go_back(&mut self, before: usize, goodput: f64) -> Option<Change> {
        let n = self.uploads;
        self.direction = -self.direction;
        self.step = 1.25;
        self.previous = None;
        self.settled_for = Some(0);
        self.set(
            before,
            format!(
                "{before} → {n} uploads lowered goodput to {:.1} MB/s; back",
                goodput / 1e6
            ),
        )
    }

    /// No difference: the move from `before` was not worth its cost; keep the cheaper of the
    /// two and settle there.
    fn keep_the_cheaper(&mut self, before: usize, goodput: f64) -> Option<Change> {
        let n = self.uploads;
        self.previous = None;
        self.settled_for = Some(0);
        self.step = 1.25;
        if n > before {
            self.direction = -1;
            self.set(
                before,
                format!(
                    "{before} → {n} uploads did not raise goodput ({:.1} MB/s); back",
                    goodput / 1e6
                ),
            )
        } else {
            self.direction = 1;
            None
        }
    }

    /// After a first measurement at a setting: move now if the climb is moving, or count the
    /// intervals until the next probe when it has settled.
    fn settle_or_probe(&mut self, utility: f64, goodput: f64) -> Option<Change> {
        if let Some(held) = self.settled_for.as_mut() {
            *held += 1;
            let settled = *self.settled_goodput.get_or_insert(goodput);
            let moved = (goodput - settled).abs() > MOVED * settled;
            if *held < SETTLED_PROBE_EVERY && !moved {
                return None;
            }
            if moved {
                // Less goodput at the same setting: a narrower link wants fewer uploads
                // first; more: a wider one, more.
                self.direction = if goodput < settled { -1 } else { 1 };
            }
            self.settled_for = None;
        }
        self.settled_goodput = None;
        self.move_by(utility, format!("probing from {:.1} MB/s", goodput / 1e6))
    }

    /// Moves one step in the current direction, remembering this setting's utility.
    fn move_by(&mut self, utility: f64, reason: String) -> Option<Change> {
        let n = self.uploads;
        let next = if self.direction > 0 {
            ((n as f64 * self.step).round() as usize).max(n + 1)
        } else {
            ((n as f64 / self.step).round() as usize).min(n.saturating_sub(1))
        }
        .clamp(MIN_UPLOADS, MAX_UPLOADS);
        if next == n {
            // At a bound: turn around for the next probe.
            self.direction = -self.direction;
            self.previous = None;
            self.settled_for = Some(0);
            return None;
        }
        self.previous = Some((n, utility));
        self.set(next, reason)
    }

    fn set(&mut self, uploads: usize, reason: String) -> Option<Change> {
        if uploads == self.uploads {
            return None;
        }
        self.uploads = uploads;
        Some(Change { uploads, reason })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link of `capacity` bytes per second where each upload carries at most `per_upload`.
    fn link(capacity: f64, per_upload: f64) -> impl Fn(usize) -> f64 {
        move |n| (n as f64 * per_upload).min(capacity)
    }

    fn sample(goodput: f64, busy: f64) -> Sample {
        Sample {
            goodput,
            busy,
            requests: 100,
            retries: 0,
            limit: None,
            paced: None,
        }
    }

    /// Runs the climb for `intervals` on `rate`, all uploads busy; returns the settings.
    fn run(climb: &mut Climb, intervals: usize, rate: impl Fn(usize) -> f64) -> Vec<usize> {
        (0..intervals)
            .map(|_| {
                let n = climb.uploads();
                climb.observe(sample(rate(n), n as f64));
                climb.uploads()
            })
            .collect()
    }

    #[test]
    fn the_starting_point_covers_the_bandwidth_delay_product() {
        // 65 MB/s at 200 ms is 13 MB in flight, nine times over 117 MB: 4 MB bundles want
        // 30 + 2 uploads.
        assert_eq!(starting_point(Duration::from_millis(200), 65e6, 4e6), 32);
        // At 20 ms, 7 MB parts want 2 + 2.
        assert_eq!(starting_point(Duration::from_millis(20), 65e6, 7e6), 4);
        // 64 kB files at 100 ms want all there may be.
        assert_eq!(
            starting_point(Duration::from_millis(100), 65e6, 64e3),
            MAX_UPLOADS
        );
        // On loopback, the least.
        assert_eq!(starting_point(Duration::from_micros(100), 65e6, 16e6), 3);
    }

    #[test]
    fn it_climbs_to_the_knee_of_a_link_and_stays_near_it() {
        // 65 MB/s; each upload carries 2 MB/s (a long round trip): the knee is at 33.
        let rate = link(65e6, 2e6);
        let mut climb = Climb::new(4);
        let path = run(&mut climb, 30, &rate);
        // Within 15 intervals (30 s) it is there, and on average it stays there, probes and
        // all.
        assert!(
            path[..15].iter().any(|&n| rate(n) >= 0.9 * 65e6),
            "{path:?}"
        );
        let mean = path[10..].iter().map(|&n| rate(n)).sum::<f64>() / 20.0;
        assert!(mean >= 0.9 * 65e6, "{mean}: {path:?}");
        let mut settled = path[10..].to_vec();
        settled.sort();
        assert!(settled[10] <= 48, "keeps uploads that do not pay: {path:?}");
    }

    #[test]
    fn it_comes_down_from_uploads_that_do_not_pay() {
        // Each upload fills the link alone: 64 uploads cost more than they bring.
        let rate = link(65e6, 65e6);
        let mut climb = Climb::new(64);
        let path = run(&mut climb, 20, &rate);
        assert!(*path.last().unwrap() <= 8, "{path:?}");
    }

    #[test]
    fn it_never_grows_when_the_uploads_wait_for_work_and_comes_down_to_what_is_used() {
        let mut climb = Climb::new(8);
        let change = climb
            .observe(sample(20e6, 3.0))
            .expect("down to what is used");
        assert_eq!(change.uploads, 4);
        assert_eq!(climb.uploads(), 4);
        // Busy at 3 of 4: not all, and one more than were busy already.
        for _ in 0..10 {
            assert_eq!(climb.observe(sample(20e6, 2.9)), None);
        }
        assert_eq!(climb.uploads(), 4);
    }

    #[test]
    fn an_idle_interval_changes_nothing() {
        let mut climb = Climb::new(12);
        let idle = Sample {
            requests: 0,
            ..sample(0.0, 0.0)
        };
        for _ in 0..10 {
            assert_eq!(climb.observe(idle), None);
        }
        assert_eq!(climb.uploads(), 12);
        assert_eq!(climb.best(), None);
    }

    #[test]
    fn it_holds_while_a_bandwidth_limit_binds() {
        let mut climb = Climb::new(8);
        for _ in 0..10 {
            let s = Sample {
                limit: Some(30e6),
                ..sample(29.5e6, 8.0)
            };
            assert_eq!(climb.observe(s), None);
        }
        assert_eq!(climb.best(), Some((8, 29.5e6)), "kept as history");
    }

    #[test]
    fn it_holds_while_its_own_limit_binds_whatever_the_goodput_of_an_interval() {
        // The goodput of a 5 MB/s limit binding all along, interval by interval, as a run of
        // bench/dashboard.py counted it (requests finishing a part at a time), while the
        // sender's pacer let 5 MB/s go in each.
        let mut climb = Climb::new(3);
        for goodput in [
            5.46e6, 4.46e6, 5.15e6, 3.83e6, 3.64e6, 6.0e6, 3.77e6, 4.42e6,
        ] {
            let s = Sample {
                limit: Some(5e6),
                paced: Some(4.98e6),
                ..sample(goodput, 3.0)
            };
            assert_eq!(climb.observe(s), None, "at {goodput}");
        }
        assert_eq!(climb.uploads(), 3);
        // Its pacer letting through less than the limit: the link, not the limit, holds the
        // rate, and the climb probes.
        let s = Sample {
            limit: Some(5e6),
            paced: Some(3.0e6),
            ..sample(3.0e6, 3.0)
        };
        assert!(climb.observe(s).is_some());
    }

    #[test]
    fn it_follows_a_bandwidth_step_down_and_up() {
        let mut climb = Climb::new(4);
        run(&mut climb, 20, link(65e6, 2e6));
        run(&mut climb, 20, link(20e6, 2e6));
        let narrow = run(&mut climb, 20, link(20e6, 2e6));
        let after = run(&mut climb, 20, link(65e6, 2e6));
        let rate = link(65e6, 2e6);
        // Back within 15 intervals (30 s) and no window of 30 s below 80 % after that.
        let back = after.iter().position(|&n| rate(n) >= 0.9 * 65e6);
        assert!(back.is_some_and(|i| i < 15), "{narrow:?} then {after:?}");
        let mean = |w: &[usize]| w.iter().map(|&n| rate(n)).sum::<f64>() / w.len() as f64;
        assert!(
            after[back.unwrap()..]
                .windows(15)
                .all(|w| mean(w) >= 0.8 * 65e6),
            "{after:?}"
        );
    }

    #[test]
    fn retries_count_against_a_setting() {
        let mut climb = Climb::new(16);
        let mut s = sample(60e6, 16.0);
        climb.observe(s);
        assert_eq!(climb.uploads(), 24);
        // The larger setting brings the same goodput but a tenth of its requests retried.
        s.busy = 24.0;
        s.retries = 10;
        let change = climb.observe(s).expect("back down");
        assert_eq!(change.uploads, 16);
    }
}
