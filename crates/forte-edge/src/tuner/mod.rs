//! `--connections auto`: the tuner ([`crate::tuner::climb`]) run beside a send pass. It
//! picks the starting point (this relay's history for the queue's size cluster and the hour,
//! else FStream's heuristic from a measured round trip), turns the uploads in flight every
//! [`PROBE`] or more, and says so: a log line per change with its reason, the gauges
//! `forte_tuned_uploads` and `forte_upload_goodput_bytes_per_second`, and one catalogue row per
//! interval (`forte report --charts` draws them). The best setting of the pass is kept as
//! history for the next run as soon as it is found: a daemon's pass lasts as long as the
//! daemon, which may end with SIGKILL or a power cut, and a pass's end was the only time
//! history was written.

pub mod climb;
pub mod tail;

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use forte_catalog::{now_us, Role, TunedRow, TuningSample};
use forte_pipeline::Gate;
use forte_prepare::Prepare;
use forte_relay::client::RelayClient;

use climb::{starting_point, Climb, Sample, GUESSED_LINK, LONGEST_INTERVAL, MIN_REQUESTS, PROBE};
use forte_daemon::record::{node, note, Catalog};
use forte_daemon::retry::retries_so_far;
use forte_daemon::schedule::QueueTotals;

/// The round trip from which goodput is counted as the connections take the bytes, not as
/// requests finish. An upload's request takes about ten round trips (the starting point covers
/// the bandwidth-delay product nine times): from 50 ms that is half a second or more, and
/// counted a request at a time, 39 uploads of 7 MB at 300 ms read 6.7 to 26 MB/s on a 25 MB/s
/// link from one 2-s interval to the next. Below, requests finish many times an interval, and
/// counting as they go would cost the edge 8 % more CPU (reqwest reads such a body 8 KiB at a
/// time) where CPU is what bounds it.
const COUNT_AS_SENT_FROM: Duration = Duration::from_millis(50);

/// Requests smaller than this on average make a queue of small files (bundles and small
/// objects); larger, of large ones. The two want very different settings.
const SMALL_REQUEST: f64 = 4.0 * 1024.0 * 1024.0;

/// What the tuner needs of the send.
pub(super) struct Tuning<'a> {
    pub client: &'a RelayClient,
    pub catalog: &'a Catalog,
    pub prepare: &'a Prepare<'a>,
    pub gate: &'a Gate,
    /// The queue at the start of the pass: objects and their bytes.
    pub queued: QueueTotals,
    pub part_size: u64,
}

impl Tuning<'_> {
    /// Tunes until `stop` is dropped.
    pub fn run(&self, stop: Receiver<()>) {
        let request = self.mean_request();
        let cluster = if request < SMALL_REQUEST {
            "small"
        } else {
            "large"
        };
        let relay = self.client.base_url().to_string();
        let hour = local_hour();
        let history = self.catalog.tuned(&relay).unwrap_or_else(|e| {
            tracing::warn!("no tuning history: {e:#}");
            Vec::new()
        });
        let of_cluster = history.iter().filter(|r| r.cluster == cluster);
        let round_trip = self.client.round_trip().ok();
        if round_trip.is_some_and(|t| t >= COUNT_AS_SENT_FROM) {
            self.client.count_sent();
        }
        let start = match nearest_hour(of_cluster, hour) {
            Some(row) => Start::from_history(row, &relay, cluster),
            None => self.measured_start(round_trip, &history, request),
        };
        let mut climb = Climb::new(start.uploads);
        self.set(climb.uploads(), &format!("start: {}", start.why));
        self.climb_until_stopped(&mut climb, stop, &relay, cluster);
    }

    /// The mean bytes of one request of the queue at the start of the pass.
    fn mean_request(&self) -> f64 {
        let QueueTotals {
            items: objects,
            bytes,
        } = self.queued;
        // A daemon's pass may start with nothing queued: then its requests are taken to be
        // parts, the largest there are, which asks for the fewest uploads.
        if objects == 0 {
            self.part_size as f64
        } else {
            (bytes as f64 / objects as f64).min(self.part_size as f64)
        }
    }

    /// Where the climb starts without history for the cluster: FStream's heuristic from a
    /// measured round trip, the fastest link in this relay's `history` and the mean `request`.
    fn measured_start(
        &self,
        round_trip: Option<Duration>,
        history: &[TunedRow],
        request: f64,
    ) -> Start {
        // Without one, the pass's own requests will say what is wrong; start from the guess.
        let round_trip = round_trip.unwrap_or(PROBE / 10);
        // The fastest this relay was ever seen to go (with the other cluster) is a
        // better guess at its link than none.
        let link = history
            .iter()
            .map(|r| r.goodput)
            .fold(GUESSED_LINK, f64::max);
        Start {
            uploads: starting_point(round_trip, link, request),
            why: format!(
                "round trip {:.0} ms, link {:.0} MB/s, {:.0} kB per request",
                round_trip.as_secs_f64() * 1e3,
                link / 1e6,
                request / 1e3
            ),
        }
    }

    /// Measures an interval at a time until `stop` is dropped, turns the uploads as `climb`
    /// says, and keeps its best setting as this relay's history for `cluster`.
    fn climb_until_stopped(
        &self,
        climb: &mut Climb,
        stop: Receiver<()>,
        relay: &str,
        cluster: &str,
    ) {
        let node = node(Role::Edge);
        let mut last = self.reading();
        // The first interval holds the pass's start (connections opening, the pipeline
        // filling): its goodput says nothing of the setting, and judged as a first
        // measurement it made the next one look like a gain of half.
        let mut warming_up = true;
        let mut kept = None;
        while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(PROBE / 4) {
            let now = self.reading();
            if !now.long_enough_after(&last) {
                continue;
            }
            let sample = now.since(&last, self.client.upload_limit());
            last = now;
            if std::mem::take(&mut warming_up) || sample.is_idle() {
                // Not judged, and an idle daemon's intervals are not worth a row each.
                continue;
            }
            self.judge_interval(climb, sample, &node);
            if climb.best() != kept {
                kept = climb.best();
                if let Some((uploads, goodput)) = kept {
                    self.keep_history(relay, cluster, uploads, goodput);
                }
            }
        }
    }

    /// Has `climb` judge one interval's `sample`, sets the uploads if it changes them, and
    /// says so: the goodput gauge and a catalogue row for the interval.
    fn judge_interval(&self, climb: &mut Climb, sample: Sample, node: &str) {
        let uploads = climb.uploads();
        let change = climb.observe(sample);
        metrics::gauge!("forte_upload_goodput_bytes_per_second", "role" => "edge")
            .set(sample.goodput);
        if let Some(change) = &change {
            self.set(change.uploads, &change.reason);
        }
        note(
            "a tuning sample",
            self.catalog.record_tuning_sample(TuningSample {
                node: node.to_owned(),
                at: now_us(),
                uploads: uploads as i64,
                level: i64::from(self.prepare.totals.level.load(Ordering::Relaxed)),
                goodput: sample.goodput,
                reason: change.map(|c| c.reason),
            }),
        );
    }

    /// Keeps the best setting, `uploads` with its `goodput`, as this relay's history for
    /// `cluster` at this hour.
    fn keep_history(&self, relay: &str, cluster: &str, uploads: usize, goodput: f64) {
        note(
            "the tuning history",
            self.catalog.record_tuned(TunedRow {
                relay: relay.to_string(),
                cluster: cluster.into(),
                hour: i64::from(local_hour()),
                uploads: uploads as i64,
                goodput,
                at: now_us(),
            }),
        );
    }

    fn set(&self, uploads: usize, reason: &str) {
        let uploads = self.gate.set_limit(uploads);
        metrics::gauge!("forte_tuned_uploads", "role" => "edge").set(uploads as f64);
        tracing::info!(uploads, reason, "uploads in flight");
    }

    fn reading(&self) -> Reading {
        Reading {
            at: Instant::now(),
            bytes: self
                .client
                .sent_bytes()
                .unwrap_or_else(|| self.prepare.totals.sealed_bytes.load(Ordering::Relaxed)),
            working_seconds: self.gate.working_seconds(),
            requests: self.gate.taken(),
            retries: retries_so_far(),
            paced: self.client.paced_bytes(),
        }
    }
}

/// Where the climb starts: the uploads in flight, and why.
struct Start {
    uploads: usize,
    why: String,
}

impl Start {
    /// Where the run at the hour of `row` ended, with `relay` and requests of `cluster`.
    fn from_history(row: &TunedRow, relay: &str, cluster: &str) -> Start {
        Start {
            uploads: row.uploads as usize,
            why: format!(
                "history of {relay} for {cluster} requests at {:02}:00: {:.1} MB/s",
                row.hour,
                row.goodput / 1e6
            ),
        }
    }
}

/// Counters at one moment, whose differences make a [`Sample`].
struct Reading {
    at: Instant,
    bytes: u64,
    working_seconds: f64,
    requests: u64,
    retries: u64,
    /// Bytes sent through the sender's own bandwidth limit, if it has one.
    paced: Option<u64>,
}

impl Reading {
    /// Whether the interval from `before` to this reading may be judged: [`PROBE`] long and
    /// [`MIN_REQUESTS`] requests, or [`LONGEST_INTERVAL`] long.
    fn long_enough_after(&self, before: &Reading) -> bool {
        self.at - before.at >= PROBE
            && (self.requests - before.requests >= MIN_REQUESTS
                || self.at - before.at >= LONGEST_INTERVAL)
    }

    fn since(&self, before: &Reading, limit: Option<f64>) -> Sample {
        let seconds = (self.at - before.at).as_secs_f64().max(1e-3);
        Sample {
            goodput: self.bytes.saturating_sub(before.bytes) as f64 / seconds,
            busy: (self.working_seconds - before.working_seconds) / seconds,
            requests: self.requests.saturating_sub(before.requests),
            retries: self.retries.saturating_sub(before.retries),
            limit,
            paced: self
                .paced
                .zip(before.paced)
                .map(|(now, then)| now.saturating_sub(then) as f64 / seconds),
        }
    }
}

/// The history row of the hour of the day nearest `hour` (23:00 is next to 00:00).
fn nearest_hour<'a>(
    rows: impl IntoIterator<Item = &'a TunedRow>,
    hour: u32,
) -> Option<&'a TunedRow> {
    let distance = |h: i64| {
        let d = (h - i64::from(hour)).rem_euclid(24);
        d.min(24 - d)
    };
    rows.into_iter().min_by_key(|r| distance(r.hour))
}

/// The hour of the day in local time, as the history is kept.
fn local_hour() -> u32 {
    forte_daemon::settings::local_minute_of_week() % (24 * 60) / 60
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(hour: i64, uploads: i64) -> TunedRow {
        TunedRow {
            relay: "r".into(),
            cluster: "small".into(),
            hour,
            uploads,
            goodput: 1.0,
            at: 0,
        }
    }

    #[test]
    fn history_starts_from_the_nearest_hour_round_midnight() {
        let rows = [row(1, 10), row(12, 20), row(22, 30)];
        assert_eq!(nearest_hour(&rows, 23).unwrap().uploads, 30);
        assert_eq!(nearest_hour(&rows, 0).unwrap().uploads, 10);
        assert_eq!(nearest_hour(&rows, 14).unwrap().uploads, 20);
        assert!(nearest_hour(&[], 3).is_none());
    }
}
