//! The ETAs of a node's running batches: its rate, and the bytes that leave it before each
//! batch is done, in the order it serves them. At the edge those are sealed bytes (`sealed`:
//! what a batch's bytes not prepared yet will seal to; `link`: how the uploads share the link).

mod link;
mod sealed;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet, VecDeque};

use forte_catalog::{BatchState, Role};
use parking_lot::Mutex;

use super::Batch;
use crate::live::WireView;
use link::{sealed_before, StillToPrepare, Uploads};
use sealed::unprepared_sealed;

/// How far running batches have come, as this server saw them lately: their rates and ETAs.
///
/// A node works its running batches through one pipeline whose uploads (or downloads) leave in
/// the order their parts were prepared, which its queue policy decides file by file ([`Order`]),
/// so a batch is done when the bytes left of it, and of the batches served before it, have gone
/// at the node's rate: its ETA is that sum over the node's rate (the slope, over the last
/// [`RATE_WINDOW_US`], of its running batches' done bytes plus the bytes of every batch that
/// ended done: read from the catalogue at each look, so that batches that came and went between
/// two looks count). Each batch's own rate is the slope of its
/// done bytes over that window from the last moment it had not moved yet (its stage starts
/// when its first file is read, which may be long before its bytes go out). Until a slope can
/// be told (a server just started) the rate is the mean over the stage so far and the ETA the
/// batch's own rest at it.
pub struct Progress {
    /// Raw bytes per part at the edge: an upload's progress is counted in parts.
    pub part_size: u64,
    /// The order the node serves its running batches in.
    pub order: Order,
    /// Whether running batches show the ETA their node published (every view but the
    /// publisher's own, which works it out).
    shows_published: bool,
    /// When this server began counting the bytes of batches that ended done (µs): those that
    /// ended before are in no look's total, so none reads all of history.
    pub counted_from_us: i64,
    seen: Mutex<Seen>,
}

/// The order in which a node's running batches get its link, as its queue policy decides: the
/// batches "ahead" of one in its ETA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Smallest remaining bytes first (`sjf`, `sjf-aging`: the default policy).
    LeastRemaining,
    /// In the order they began (`fifo`, and the policies that mix sizes).
    AsBegun,
}

/// What this server saw at its earlier looks, which rates are slopes over.
#[derive(Default)]
struct Seen {
    /// Each running batch's done bytes over time.
    batches: HashMap<String, Series>,
    /// Per role: its done total (running batches' done bytes, and the bytes of every batch
    /// that ended done) over time.
    nodes: HashMap<Role, NodeTotal>,
    /// The last ETA worked out per running batch (for answers about one batch).
    etas: HashMap<String, NotedEta>,
}

/// An ETA worked out over all running batches, and when.
struct NotedEta {
    at: i64,
    eta_s: f64,
}

/// A node's done total over time.
#[derive(Default)]
struct NodeTotal {
    /// What the done total lost when batches failed after they had moved.
    failed: i64,
    /// The done total last seen, with `failed`.
    last: i64,
    series: Series,
}

/// Per role: the bytes of the batches that ended with their work done since the server began
/// counting ([`Progress::counted_from_us`]). A node's done total is these and its running
/// batches' done bytes, so a batch that began and ended between two looks counts too.
pub(super) type EndedBytes = HashMap<Role, i64>;

/// A quantity that only grows, sampled over time; its slope over the last window.
#[derive(Default)]
struct Series(VecDeque<(i64, i64)>);

impl Series {
    /// Notes `value` at `at`, a moment after the last look known from elsewhere.
    fn note(&mut self, at: i64, value: i64) {
        if self.0.back().is_none_or(|(t, _)| *t < at) {
            self.0.push_back((at, value));
        }
    }

    /// Notes `value` at `now`; the slope per second over the window, from the last moment the
    /// value had not moved from where the window begins, if it spans long enough to tell.
    fn observe(&mut self, now: i64, value: i64) -> Option<f64> {
        let samples = &mut self.0;
        if samples.back().is_some_and(|(t, _)| *t >= now) {
            samples.pop_back();
        }
        samples.push_back((now, value));
        // Keep one sample older than the window, so that the window is spanned whole.
        while samples.len() > 2 && samples[1].0 <= now - RATE_WINDOW_US {
            samples.pop_front();
        }
        let first = samples.front()?.1;
        let (t0, v0) = samples
            .iter()
            .take_while(|(_, v)| *v == first)
            .last()
            .copied()?;
        (now - t0 >= RATE_MIN_SPAN_US && value > v0)
            .then(|| (value - v0) as f64 / ((now - t0) as f64 / 1e6))
    }
}

/// How far back a running batch's rate looks.
pub const RATE_WINDOW_US: i64 = 30_000_000;
/// The shortest span a windowed rate is taken over.
const RATE_MIN_SPAN_US: i64 = 2_000_000;
/// How long an ETA worked out over all running batches stands for answers about one.
const ETA_FRESH_US: i64 = 10_000_000;

/// How long a published ETA is shown: its node publishes every [`PUBLISH_EVERY`].
pub const PUBLISHED_FRESH_US: i64 = 10_000_000;
/// How often a daemon publishes its running batches' ETAs.
pub const PUBLISH_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

impl Progress {
    pub fn new(part_size: u64, order: Order) -> Self {
        Self {
            part_size,
            order,
            shows_published: true,
            counted_from_us: forte_catalog::now_us(),
            seen: Mutex::default(),
        }
    }

    /// The progress of the node that publishes its running batches' ETAs: it works them out
    /// rather than reading them back.
    pub fn publisher(part_size: u64, order: Order) -> Self {
        Self {
            shows_published: false,
            ..Self::new(part_size, order)
        }
    }

    /// Gives each running batch of `batches` the ETA its node published in `catalog` within
    /// [`PUBLISHED_FRESH_US`], counted down to `now`: every view shows that one estimate.
    /// One published longer ago (its node stopped, or publishes no more) is not shown; the
    /// view's own estimate stays.
    pub(in crate::model) fn show_published(
        &self,
        catalog: &forte_catalog::Catalog,
        batches: &mut [Batch],
        now: i64,
    ) -> anyhow::Result<()> {
        if !self.shows_published || !batches.iter().any(|b| b.running) {
            return Ok(());
        }
        let published = catalog.published_etas()?;
        for b in batches.iter_mut().filter(|b| b.running) {
            if let Some(p) = published.get(&b.key) {
                if now - p.at <= PUBLISHED_FRESH_US {
                    b.eta_s = Some((p.eta_s - (now - p.at) as f64 / 1e6).max(0.0));
                }
            }
        }
        Ok(())
    }

    /// Notes that the running batch `key` had `done` bytes at `now`; its rate over the window,
    /// if one can be told yet.
    pub(super) fn windowed_rate(&self, key: &str, now: i64, done: i64) -> Option<f64> {
        let mut seen = self.seen.lock();
        seen.batches
            .entry(key.to_owned())
            .or_default()
            .observe(now, done)
    }

    /// The ETA last worked out for the running batch `key`, counted down to `now`.
    pub(super) fn recent_eta(&self, key: &str, now: i64) -> Option<f64> {
        let seen = self.seen.lock();
        let &NotedEta { at, eta_s: eta } = seen.etas.get(key)?;
        (now - at <= ETA_FRESH_US).then(|| (eta - (now - at) as f64 / 1e6).max(0.0))
    }

    /// Works out the ETAs of every running batch (`in_flight`: all of them, of every role) at
    /// `now` from its node's rate and the batches ahead of it; forgets batches that ended.
    /// With the edge's `wire` (its daemon's), the edge's work is counted in sealed bytes.
    pub(super) fn queue_etas(
        &self,
        in_flight: &mut [Batch],
        ended: &EndedBytes,
        wire: Option<&WireView>,
        now: i64,
    ) {
        let mut seen = self.seen.lock();
        let running: HashSet<String> = in_flight.iter().map(|b| b.key.clone()).collect();
        seen.batches.retain(|key, _| running.contains(key));
        seen.etas.clear();
        let unprepared = wire.map(|wire| Unprepared::of(in_flight, wire));
        for role in [Role::Edge, Role::Core] {
            let mut mine: Vec<&mut Batch> = in_flight
                .iter_mut()
                .filter(|b| b.role == role && b.state != BatchState::Queued)
                .collect();
            let node = seen.nodes.entry(role).or_default();
            let wire = wire.filter(|_| role == Role::Edge);
            let total = done_total(role, &mine, ended, wire);
            let Some(rate) = node.rate(total, wire, now) else {
                continue;
            };
            // Their parts leave in the order the policy serves the batches.
            self.order.sort(&mut mine);
            let mut ahead = Ahead::of(wire, unprepared.as_ref());
            for b in mine {
                let eta = ahead.before_done(b) / rate;
                b.eta_s = Some(eta);
                seen.etas.insert(
                    b.key.clone(),
                    NotedEta {
                        at: now,
                        eta_s: eta,
                    },
                );
            }
        }
    }
}

impl Order {
    /// Puts `batches` in the order the node serves them.
    fn sort(self, batches: &mut [&mut Batch]) {
        match self {
            Order::LeastRemaining => {
                batches.sort_by_key(|b| (b.bytes - b.done_bytes, b.started_us))
            }
            Order::AsBegun => batches.sort_by_key(|b| b.started_us.unwrap_or(i64::MAX)),
        }
    }
}

/// A node's done total: at the edge (with its daemon's `wire`), the sealed bytes its uploads
/// have sent; elsewhere, the bytes of the batches of `role` that ended done and the done bytes
/// of its running ones, `mine`.
fn done_total(role: Role, mine: &[&mut Batch], ended: &EndedBytes, wire: Option<&WireView>) -> i64 {
    match wire {
        Some(wire) => wire.sent as i64,
        None => {
            ended.get(&role).copied().unwrap_or(0) + mine.iter().map(|b| b.done_bytes).sum::<i64>()
        }
    }
}

impl NodeTotal {
    /// Notes the node's done `total` at `now` (and, at the edge, when its link last got busy);
    /// its rate, if one can be told yet.
    fn rate(&mut self, total: i64, wire: Option<&WireView>, now: i64) -> Option<f64> {
        // A batch that failed takes its done bytes out of the sum; the sum is kept from
        // shrinking (so a failure costs at most an underestimated rate for a window).
        self.failed = self.failed.max(self.last - total);
        self.last = total + self.failed;
        if let Some((at, sent)) = wire.and_then(|w| w.resumed) {
            self.series.note(at, sent as i64);
        }
        self.series.observe(now, self.last)
    }
}

/// What the edge's running batches have still to prepare, queued ones too, in sealed bytes:
/// parts that will join the uploads as slots free up.
struct Unprepared {
    /// Per batch (its key).
    by_batch: HashMap<String, f64>,
    /// All of it.
    all: f64,
}

impl Unprepared {
    fn of(in_flight: &[Batch], wire: &WireView) -> Self {
        let edge = in_flight.iter().filter(|b| b.role == Role::Edge);
        let by_batch: HashMap<String, f64> = edge
            .map(|b| (b.key.clone(), unprepared_sealed(b, wire)))
            .collect();
        let all = by_batch.values().sum();
        Self { by_batch, all }
    }
}

/// What leaves a node before each of its batches is done, the batches taken in the order it
/// serves them.
enum Ahead<'w> {
    /// In raw bytes: what is left of the batches taken so far.
    Raw(f64),
    /// At the edge, in sealed bytes ([`sealed_before`]): its uploads now, what its batches
    /// have still to prepare, and of that, what the batches taken so far have (`taken`).
    Sealed {
        wire: &'w WireView,
        uploads: Uploads<'w>,
        unprepared: &'w Unprepared,
        taken: f64,
    },
}

impl<'w> Ahead<'w> {
    /// In sealed bytes given the edge's `wire` and what its batches have still to prepare;
    /// else in raw bytes.
    fn of(wire: Option<&'w WireView>, unprepared: Option<&'w Unprepared>) -> Self {
        match (wire, unprepared) {
            (Some(wire), Some(unprepared)) => Self::Sealed {
                wire,
                uploads: Uploads::of(wire),
                unprepared,
                taken: 0.0,
            },
            _ => Self::Raw(0.0),
        }
    }

    /// The bytes that leave before `b`, the batch served next, is done.
    fn before_done(&mut self, b: &Batch) -> f64 {
        match self {
            Self::Raw(ahead) => {
                *ahead += (b.bytes - b.done_bytes).max(0) as f64;
                *ahead
            }
            Self::Sealed {
                wire,
                uploads,
                unprepared,
                taken,
            } => {
                let own = unprepared.by_batch.get(&b.key).copied().unwrap_or(0.0);
                *taken += own;
                let prepared_none = wire.batches.get(&b.key).is_none_or(|w| w.prepared_raw == 0);
                let still = StillToPrepare {
                    preparing: own > 0.0 || prepared_none,
                    ahead: *taken,
                    all: unprepared.all,
                };
                sealed_before(&b.key, uploads, still)
            }
        }
    }
}
