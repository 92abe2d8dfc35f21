//! The API's answers, built from catalogue rows and the daemon's live counters: what
//! docs/api.md documents, field by field. They are types of their own rather than the
//! catalogue's rows serialised: the API is versioned, so a column renamed or added in the
//! catalogue must not change an answer, and its names follow the API's conventions (`_us` for
//! times).

use std::collections::{HashMap, HashSet, VecDeque};

use anyhow::Result;
use forte_catalog::{
    BatchKey, BatchRow, BatchState, Catalog, Event, Failure, FileRow, FileState, Filter, PartRow,
    Role, Stage, StageRow, UsageRow,
};
use parking_lot::Mutex;
use serde::Serialize;

use crate::live::{sealed_per_raw, BatchWire, QueueView, StageView, WaitingPart, WireView};

/// A batch as the API shows it: its row, how far it has come, its rate and ETA.
#[derive(Debug, Clone, Serialize)]
pub struct Batch {
    pub key: String,
    pub role: Role,
    pub site: String,
    pub name: String,
    pub state: BatchState,
    pub files: i64,
    pub bytes: i64,
    pub done_bytes: i64,
    pub progress: f64,
    pub arrived_us: i64,
    pub started_us: Option<i64>,
    pub ended_us: Option<i64>,
    pub updated_us: i64,
    pub rate_bytes_per_second: Option<f64>,
    pub eta_s: Option<f64>,
    pub running: bool,
    pub error: Option<String>,
}

/// Whether a batch in `state` is being worked on (or waits for it) on its node.
pub fn running(state: BatchState) -> bool {
    matches!(
        state,
        BatchState::Queued | BatchState::Sending | BatchState::Pulling | BatchState::Checking
    )
}

/// Whether a batch in `state` ended with all its work done on its node (a quarantined batch's
/// bytes all came; a task held it back).
fn finished(state: BatchState) -> bool {
    matches!(
        state,
        BatchState::Sent
            | BatchState::Delivered
            | BatchState::Quarantined
            | BatchState::SourceDeleted
    )
}

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

#[derive(Default)]
struct Seen {
    /// Each running batch's done bytes over time.
    batches: HashMap<String, Series>,
    /// Per role: its done total (running batches' done bytes, and the bytes of every batch
    /// that ended done) over time.
    nodes: HashMap<Role, NodeTotal>,
    /// The last ETA worked out per running batch, and when (for answers about one batch).
    etas: HashMap<String, (i64, f64)>,
}

#[derive(Default)]
struct NodeTotal {
    /// What the done total lost when batches failed after they had moved.
    failed: i64,
    /// The done total last seen, with `failed`.
    last: i64,
    series: Series,
}

/// Per role: the bytes of the batches that ended with their work done, however long ago. A
/// node's done total is these and its running batches' done bytes, so a batch that began and
/// ended between two looks counts too.
type EndedBytes = HashMap<Role, i64>;

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

impl Progress {
    pub fn new(part_size: u64, order: Order) -> Self {
        Self {
            part_size,
            order,
            seen: Mutex::default(),
        }
    }

    /// Notes that the running batch `key` had `done` bytes at `now`; its rate over the window,
    /// if one can be told yet.
    fn windowed_rate(&self, key: &str, now: i64, done: i64) -> Option<f64> {
        let mut seen = self.seen.lock();
        seen.batches
            .entry(key.to_owned())
            .or_default()
            .observe(now, done)
    }

    /// The ETA last worked out for the running batch `key`, counted down to `now`.
    fn recent_eta(&self, key: &str, now: i64) -> Option<f64> {
        let seen = self.seen.lock();
        let (at, eta) = *seen.etas.get(key)?;
        (now - at <= ETA_FRESH_US).then(|| (eta - (now - at) as f64 / 1e6).max(0.0))
    }

    /// Works out the ETAs of every running batch (`in_flight`: all of them, of every role) at
    /// `now` from its node's rate and the batches ahead of it; forgets batches that ended.
    /// With the edge's `wire` (its daemon's), the edge's work is counted in sealed bytes.
    fn queue_etas(
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
        // What each edge batch has still to prepare, queued ones too, and all of it: parts
        // that will join the uploads as slots free up.
        let unprepared: HashMap<String, f64> = wire.map_or_else(HashMap::new, |wire| {
            let edge = in_flight.iter().filter(|b| b.role == Role::Edge);
            edge.map(|b| (b.key.clone(), unprepared_sealed(b, wire)))
                .collect()
        });
        let to_prepare: f64 = unprepared.values().sum();
        for role in [Role::Edge, Role::Core] {
            let mut mine: Vec<&mut Batch> = in_flight
                .iter_mut()
                .filter(|b| b.role == role && b.state != BatchState::Queued)
                .collect();
            let node = seen.nodes.entry(role).or_default();
            let wire = wire.filter(|_| role == Role::Edge);
            let total = match wire {
                Some(wire) => wire.sent as i64,
                None => {
                    ended.get(&role).copied().unwrap_or(0)
                        + mine.iter().map(|b| b.done_bytes).sum::<i64>()
                }
            };
            // A batch that failed takes its done bytes out of the sum; the sum is kept from
            // shrinking (so a failure costs at most an underestimated rate for a window).
            node.failed = node.failed.max(node.last - total);
            node.last = total + node.failed;
            if let Some((at, sent)) = wire.and_then(|w| w.resumed) {
                node.series.note(at, sent as i64);
            }
            let Some(rate) = node.series.observe(now, node.last) else {
                continue;
            };
            // Their parts leave in the order the policy serves the batches.
            match self.order {
                Order::LeastRemaining => {
                    mine.sort_by_key(|b| (b.bytes - b.done_bytes, b.started_us))
                }
                Order::AsBegun => mine.sort_by_key(|b| b.started_us.unwrap_or(i64::MAX)),
            }
            // What leaves before each batch is done: in raw bytes, what is left of it and of
            // the batches served before it; at the edge, in sealed bytes (`sealed_before`).
            let edge = wire.map(|wire| (wire, Uploads::of(wire)));
            let mut ahead = 0.0;
            let mut etas = vec![];
            for b in mine {
                let before_done = match &edge {
                    Some((wire, uploads)) => {
                        let own = unprepared.get(&b.key).copied().unwrap_or(0.0);
                        ahead += own;
                        let prepared_none =
                            wire.batches.get(&b.key).is_none_or(|w| w.prepared_raw == 0);
                        sealed_before(
                            &b.key,
                            uploads,
                            (own > 0.0 || prepared_none, ahead, to_prepare),
                        )
                    }
                    None => {
                        ahead += (b.bytes - b.done_bytes).max(0) as f64;
                        ahead
                    }
                };
                let eta = before_done / rate;
                b.eta_s = Some(eta);
                etas.push((b.key.clone(), (now, eta)));
            }
            seen.etas.extend(etas);
        }
    }
}

/// The sealed bytes a running edge batch will be once its raw bytes not prepared yet are.
fn unprepared_sealed(b: &Batch, wire: &WireView) -> f64 {
    let mine = wire.batches.get(&b.key).copied().unwrap_or_default();
    (b.bytes - b.done_bytes - mine.waiting_raw as i64).max(0) as f64 * per_raw_left(&mine, wire)
}

/// Sealed bytes per raw byte of what a batch has not prepared yet: the estimate made before
/// it was prepared, scaled by how its parts prepared so far sealed against theirs, drawn
/// towards the node's scale while it has prepared little ([`SCALE_PRIOR`]); without an
/// estimate, its compression so far (the node's, before it has any).
fn per_raw_left(mine: &BatchWire, wire: &WireView) -> f64 {
    let so_far = sealed_per_raw(mine.prepared_raw, mine.prepared_sealed)
        .or_else(|| sealed_per_raw(wire.prepared_raw, wire.prepared_sealed));
    let (raw, estimated) = mine.estimated_left;
    let Some(left) = sealed_per_raw(raw, estimated) else {
        return so_far.unwrap_or(1.0);
    };
    let (estimate, sealed) = mine.estimated_prepared;
    let node = sealed_per_raw(wire.estimated_prepared.0, wire.estimated_prepared.1);
    let scale = match node {
        Some(node) => Some((sealed as f64 + SCALE_PRIOR * node) / (estimate as f64 + SCALE_PRIOR)),
        None => sealed_per_raw(estimate, sealed),
    };
    match scale {
        Some(scale) => left * scale,
        None => so_far.unwrap_or(left),
    }
}

/// How much of a batch's estimate the node's scale counts as, in sealed bytes, when a batch's
/// scale is worked out from its parts prepared so far. A batch's first two or three parts are
/// a poor guide to the rest: the test set's N sealed its first 32 MB to 1.37 × the estimate
/// and the rest to 1.02 ×, and scaled by its first parts alone its ETA read 22 % long 3.5 s
/// in (docs/benchmarks/log/2026-11.md). Drawn towards the node's scale by a few parts' worth,
/// its own takes over as it prepares more.
const SCALE_PRIOR: f64 = 8e6;

/// The edge's parts waiting for the link at a look, in the order the uploads take them: those
/// under way first, then the others in the order they were prepared.
struct Uploads<'w> {
    /// Each part's batch and its sealed bytes left (of an upload under way, those its
    /// connection has not taken yet).
    parts: Vec<(&'w str, f64)>,
    /// Uploads under way (at least one): how many parts share the link at once.
    slots: usize,
    /// The mean sealed bytes of a waiting part: the size of the parts to come.
    part: f64,
}

impl<'w> Uploads<'w> {
    fn of(wire: &'w WireView) -> Self {
        let left = |p: &'w WaitingPart| {
            let sent = p.sending.unwrap_or(0).min(p.sealed);
            (p.batch.as_str(), (p.sealed - sent) as f64)
        };
        let (sending, queued): (Vec<_>, Vec<_>) =
            wire.waiting.iter().partition(|p| p.sending.is_some());
        let slots = sending.len().max(1);
        let waiting = wire.waiting.len().max(1) as f64;
        Self {
            parts: sending.into_iter().chain(queued).map(left).collect(),
            slots,
            part: wire.waiting.iter().map(|p| p.sealed as f64).sum::<f64>() / waiting,
        }
    }
}

/// The sealed bytes that leave the edge before batch `key` is done (its time, at the node's
/// rate), given whether it has parts still to prepare (or has prepared none), the unprepared
/// bytes of the batches served before it and its own, and all the edge has still to prepare.
/// The uploads take the parts in their order, as many at once as are under way now, and
/// share the link evenly. A batch with parts still to prepare is done once every part waiting
/// now has gone, and the unprepared bytes of the batches served before it and its own, and
/// what its last part shares the link with while it is sent ([`beside_a_part`]), at most what
/// the batches served after it have still to prepare. One prepared whole is done when the last
/// of its parts waiting now is sent, worked out part by part ([`link_bytes_until_sent`]); as
/// slots free up, parts of what the edge has still to prepare take them, as large as those
/// waiting now.
fn sealed_before(key: &str, uploads: &Uploads, (preparing, ahead, all): (bool, f64, f64)) -> f64 {
    if preparing {
        let waiting: f64 = uploads.parts.iter().map(|(_, left)| left).sum();
        let after = (all - ahead).max(0.0);
        return waiting + ahead + beside_a_part(uploads.slots, uploads.part).min(after);
    }
    let parts = uploads
        .parts
        .iter()
        .map(|&(batch, left)| (batch == key, left));
    link_bytes_until_sent(parts, uploads.slots, (all, uploads.part))
}

/// The bytes that parts taken after one of `size` get while it is sent, `slots` uploads
/// sharing the link evenly, all of them full: in the time it gets its bytes each slot gets as
/// many, `slots` × `size` in all, of which the parts under way when it began had half a part
/// each left on average (they began at random moments of their own sending). So a part sent
/// beside seven others takes the link for 3.5 parts' worth beyond its own and those before it:
/// counted alone, the last parts of a batch still being prepared read 20-28 % short at 8
/// uploads at once (docs/benchmarks/log/2026-11.md).
fn beside_a_part(slots: usize, size: f64) -> f64 {
    slots.saturating_sub(1) as f64 / 2.0 * size
}

/// The link's bytes that pass until the last of the `parts` marked is sent, `parts` (whether
/// it is one of those, its sealed bytes left) taken in their order, `slots` at a time, each
/// of those under way getting an even share of the link, and once they are all taken, parts of
/// `more` (bytes, in parts of a size) in the slots that free up. Shared so, a part takes longer
/// than its own bytes at the link's rate: the parts beside it take their share (at 5 MB/s, a
/// 4-MB part started beside seven others as large is sent 6.4 s later, not 0.8 s).
fn link_bytes_until_sent(
    parts: impl Iterator<Item = (bool, f64)>,
    slots: usize,
    (mut more, size): (f64, f64),
) -> f64 {
    let mut queued: VecDeque<(bool, f64)> = parts.collect();
    let mut marked = queued.iter().filter(|(mine, _)| *mine).count();
    let mut under_way: Vec<(bool, f64)> = Vec::with_capacity(slots);
    let mut passed = 0.0;
    while marked > 0 {
        while under_way.len() < slots {
            match queued.pop_front() {
                Some(part) => under_way.push(part),
                None if more > 0.0 && size > 0.0 => {
                    under_way.push((false, size.min(more)));
                    more -= size;
                }
                None => break,
            }
        }
        // The part with the fewest bytes left ends first; until then each got as many.
        let fewest =
            (0..under_way.len()).min_by(|&a, &b| under_way[a].1.total_cmp(&under_way[b].1));
        let Some(first) = fewest else { break };
        let (mine, least) = under_way.swap_remove(first);
        passed += least * (under_way.len() + 1) as f64;
        for part in &mut under_way {
            part.1 -= least;
        }
        marked -= usize::from(mine);
    }
    passed
}

/// Raw bytes of a batch's files that are done on its node. At the edge: files at the relay or
/// further, and of the others the parts uploaded (`part_size` each, a file's last one
/// smaller). At the core (whose batch `bytes` are the sealed bytes on the wire): the share of
/// the files' raw bytes verified or further.
fn done_bytes(catalog: &Catalog, row: &BatchRow, part_size: u64) -> Result<i64> {
    if finished(row.state) {
        return Ok(row.bytes);
    }
    let files = catalog.progress(&row.batch_key)?;
    let past = |state: FileState, first: FileState| {
        let order = [
            FileState::Discovered,
            FileState::AtRelay,
            FileState::Sealed,
            FileState::Verified,
            FileState::Delivered,
            FileState::Acknowledged,
        ];
        let rank = |s| order.iter().position(|o| *o == s);
        matches!((rank(state), rank(first)), (Some(s), Some(f)) if s >= f)
    };
    Ok(match row.role {
        Role::Edge => files
            .iter()
            .map(|f| {
                if past(f.state, FileState::AtRelay) {
                    f.size
                } else {
                    f.size.min(f.parts_done.saturating_mul(part_size as i64))
                }
            })
            .sum(),
        Role::Core => {
            let all: i64 = files.iter().map(|f| f.size).sum();
            let verified: i64 = files
                .iter()
                .filter(|f| past(f.state, FileState::Verified))
                .map(|f| f.size)
                .sum();
            if all > 0 {
                (row.bytes as f64 * verified as f64 / all as f64) as i64
            } else {
                0
            }
        }
    })
}

/// The stage a batch's row times on its node.
fn own_stage(role: Role) -> Stage {
    match role {
        Role::Edge => Stage::Send,
        Role::Core => Stage::Pull,
    }
}

impl Batch {
    /// `row` with its progress at `now` (µs), reading its stages and files.
    pub fn of(catalog: &Catalog, row: BatchRow, progress: &Progress, now: i64) -> Result<Self> {
        let stages = catalog.stages(&row.batch_key)?;
        Self::with_stages(catalog, row, &stages, progress, now)
    }

    fn with_stages(
        catalog: &Catalog,
        row: BatchRow,
        stages: &[StageRow],
        progress: &Progress,
        now: i64,
    ) -> Result<Self> {
        let stage = stages.iter().find(|s| s.stage == own_stage(row.role));
        let started_us = stage.map(|s| s.started_at);
        let ended_us = stage.and_then(|s| s.ended_at);
        let done = done_bytes(catalog, &row, progress.part_size)?.clamp(0, row.bytes.max(0));
        let running = running(row.state);
        let share = if row.bytes > 0 {
            done as f64 / row.bytes as f64
        } else if finished(row.state) {
            1.0
        } else {
            0.0
        };
        // Over the stage; for a running batch, over its last moments where known.
        let mean = started_us
            .map(|start| (ended_us.unwrap_or(now) - start) as f64 / 1e6)
            .filter(|seconds| *seconds > 0.0 && done > 0)
            .map(|seconds| done as f64 / seconds);
        let key = row.batch_key.to_string();
        let rate = if running {
            progress.windowed_rate(&key, now, done).or(mean)
        } else {
            mean
        };
        let eta_s = if running {
            progress.recent_eta(&key, now).or_else(|| {
                rate.filter(|_| row.bytes > 0)
                    .map(|rate| (row.bytes - done) as f64 / rate)
            })
        } else {
            None
        };
        let held_back = [
            BatchState::Failed,
            BatchState::Quarantined,
            BatchState::SourceKept,
        ];
        let error = if running || held_back.contains(&row.state) {
            let last = catalog
                .failures(Some(&row.batch_key), 1)?
                .into_iter()
                .next();
            // A running batch's old failure (a retry that then worked) is history, not news.
            last.filter(|f| !running || started_us.is_some_and(|s| f.at >= s))
                .map(|f| f.error)
        } else {
            None
        };
        Ok(Self {
            key,
            role: row.role,
            site: row.site,
            name: row.name,
            state: row.state,
            files: row.files,
            bytes: row.bytes,
            done_bytes: done,
            progress: share,
            // At the core a batch is first recorded once its pull is under way, which may
            // be after its fetch ahead began: it arrived no later than that.
            arrived_us: started_us.map_or(row.created_at, |s| s.min(row.created_at)),
            started_us,
            ended_us,
            updated_us: row.updated_at,
            rate_bytes_per_second: rate,
            eta_s,
            running,
            error,
        })
    }
}

/// A file as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct File {
    pub object_id: String,
    pub batch_key: String,
    pub path: String,
    pub size: i64,
    pub state: FileState,
    pub sha256: Option<String>,
    pub delivered_to: Option<String>,
    pub carrier: Option<String>,
    pub updated_us: i64,
    /// Its parts done on its node so far (uploaded at the edge, verified at the core); counted
    /// in a batch's files only.
    pub parts_done: i64,
}

impl From<FileRow> for File {
    fn from(f: FileRow) -> Self {
        Self {
            object_id: f.object_id,
            batch_key: f.batch_key.to_string(),
            path: f.path,
            size: f.size,
            state: f.state,
            sha256: f.raw_sha256,
            delivered_to: f.delivered_to,
            carrier: f.carrier,
            updated_us: f.updated_at,
            parts_done: 0,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct StageSpan {
    pub stage: Stage,
    pub started_us: i64,
    pub ended_us: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FailureView {
    pub at_us: i64,
    pub task: String,
    pub batch_key: String,
    pub object_id: Option<String>,
    pub part: Option<i64>,
    pub error: String,
}

impl From<Failure> for FailureView {
    fn from(f: Failure) -> Self {
        Self {
            at_us: f.at,
            task: f.task,
            batch_key: f.batch_key.to_string(),
            object_id: f.object_id,
            part: f.part,
            error: f.error,
        }
    }
}

/// A batch's files, each with its parts done.
fn files_with_progress(catalog: &Catalog, key: &BatchKey) -> Result<Vec<File>> {
    let done: HashMap<String, i64> = catalog
        .progress(key)?
        .into_iter()
        .map(|p| (p.object_id, p.parts_done))
        .collect();
    let files = catalog.files(key)?.into_iter().map(File::from);
    Ok(files
        .map(|f| File {
            parts_done: done.get(&f.object_id).copied().unwrap_or(0),
            ..f
        })
        .collect())
}

/// One batch, whole: `GET /api/v1/batches/{key}`.
#[derive(Debug, Clone, Serialize)]
pub struct BatchDetail {
    pub batch: Batch,
    pub stages: Vec<StageSpan>,
    pub files: Vec<File>,
    pub failures: Vec<FailureView>,
}

impl BatchDetail {
    pub fn read(catalog: &Catalog, key: &BatchKey, progress: &Progress) -> Result<Option<Self>> {
        let Some(row) = catalog.batch(key)? else {
            return Ok(None);
        };
        let stages = catalog.stages(key)?;
        let batch = Batch::with_stages(catalog, row, &stages, progress, forte_catalog::now_us())?;
        Ok(Some(Self {
            batch,
            stages: stages
                .into_iter()
                .map(|s| StageSpan {
                    stage: s.stage,
                    started_us: s.started_at,
                    ended_us: s.ended_at,
                })
                .collect(),
            files: files_with_progress(catalog, key)?,
            failures: catalog
                .failures(Some(key), 100)?
                .into_iter()
                .map(FailureView::from)
                .collect(),
        }))
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PartView {
    pub index: i64,
    pub state: forte_catalog::PartState,
    pub raw_sha256: Option<String>,
    pub ciphertext_sha256: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct EventView {
    pub at_us: i64,
    pub batch_key: String,
    pub object_id: Option<String>,
    pub part: Option<i64>,
    pub state: String,
    pub detail: Option<String>,
}

impl From<Event> for EventView {
    fn from(e: Event) -> Self {
        Self {
            at_us: e.at,
            batch_key: e.batch_key.to_string(),
            object_id: e.object_id,
            part: e.part,
            state: e.state,
            detail: e.detail,
        }
    }
}

impl From<PartRow> for PartView {
    fn from(p: PartRow) -> Self {
        Self {
            index: p.index,
            state: p.state,
            raw_sha256: p.raw_sha256,
            ciphertext_sha256: p.ciphertext_sha256,
        }
    }
}

/// A file's lineage over every catalogue: `GET /api/v1/files/{object_id}`.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Lineage {
    pub files: Vec<File>,
    pub parts: Vec<PartView>,
    pub events: Vec<EventView>,
    /// The name of each batch the rows and events name, by batch key (keys are opaque ids).
    pub batch_names: std::collections::BTreeMap<String, String>,
}

impl Lineage {
    pub fn read(catalogs: &[Catalog], object_id: &str) -> Result<Self> {
        let mut lineage = Self::default();
        for catalog in catalogs {
            let rows = catalog.files_of_object(object_id)?;
            lineage.files.extend(rows.into_iter().map(File::from));
            lineage
                .parts
                .extend(catalog.parts(object_id)?.into_iter().map(PartView::from));
            lineage
                .events
                .extend(catalog.lineage(object_id)?.into_iter().map(EventView::from));
        }
        lineage.events.sort_by_key(|e| e.at_us);
        let keys: std::collections::BTreeSet<&String> = lineage
            .files
            .iter()
            .map(|f| &f.batch_key)
            .chain(lineage.events.iter().map(|e| &e.batch_key))
            .collect();
        for key in keys {
            let parsed = BatchKey::parse(key);
            for catalog in catalogs {
                if let Some(row) = catalog.batch(&parsed)?.filter(|r| !r.name.is_empty()) {
                    lineage.batch_names.insert(key.clone(), row.name);
                    break;
                }
            }
        }
        Ok(lineage)
    }

    /// The batch `key`'s name, where a catalogue knows it, else the key.
    pub fn batch_name<'a>(&'a self, key: &'a str) -> &'a str {
        self.batch_names.get(key).map_or(key, String::as_str)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct UsageView {
    pub node: String,
    pub at_us: i64,
    pub seconds: f64,
    pub cpu_percent: f64,
    pub memory_used: i64,
    pub own_cpu_percent: f64,
    pub own_memory: i64,
    pub disk_read_bps: f64,
    pub disk_write_bps: f64,
    pub net_rx_bps: f64,
    pub net_tx_bps: f64,
}

impl From<UsageRow> for UsageView {
    fn from(u: UsageRow) -> Self {
        Self {
            node: u.node,
            at_us: u.at,
            seconds: u.seconds,
            cpu_percent: u.cpu_percent,
            memory_used: u.memory_used,
            own_cpu_percent: u.own_cpu_percent,
            own_memory: u.own_memory,
            disk_read_bps: u.disk_read_bps,
            disk_write_bps: u.disk_write_bps,
            net_rx_bps: u.net_rx_bps,
            net_tx_bps: u.net_tx_bps,
        }
    }
}

/// Something that needs a look.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Alert {
    pub level: AlertLevel,
    pub text: String,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AlertLevel {
    Warning,
    Critical,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct Totals {
    pub batches: usize,
    /// Sent by the edge (its rows): sent, and perhaps their sources deleted since.
    pub sent: usize,
    pub delivered: usize,
    pub failed: usize,
    pub bytes: i64,
}

/// The front page in one answer: `GET /api/v1/overview`, and each server-sent event.
#[derive(Debug, Clone, Serialize)]
pub struct Overview {
    pub at_us: i64,
    pub in_flight: Vec<Batch>,
    pub recent: Vec<Batch>,
    pub stages: Vec<StageView>,
    pub queue: Option<QueueView>,
    pub failures: Vec<FailureView>,
    pub alerts: Vec<Alert>,
    pub totals: Totals,
}

/// A stage's queue is red from this fill on (NiFi's back-pressure colours), yellow from
/// [`FILL_WARNING`].
pub const FILL_CRITICAL: f64 = 0.85;
pub const FILL_WARNING: f64 = 0.6;
/// A running batch that has not changed for this long is stalled.
const STALLED_US: i64 = 5 * 60 * 1_000_000;
const HOUR_US: i64 = 3_600 * 1_000_000;

impl Overview {
    pub fn read(
        catalogs: &[Catalog],
        stages: Vec<StageView>,
        queue: Option<QueueView>,
        wire: Option<WireView>,
        progress: &Progress,
    ) -> Result<Self> {
        let now = forte_catalog::now_us();
        let mut in_flight = vec![];
        let mut recent = vec![];
        let mut failures = vec![];
        let mut totals = Totals::default();
        let mut alerts = vec![];
        let mut newest_rows = vec![];
        let mut ended = EndedBytes::new();
        for catalog in catalogs {
            let rows = catalog.batches()?;
            totals.batches += rows.len();
            for row in &rows {
                if finished(row.state) {
                    *ended.entry(row.role).or_default() += row.bytes.max(0);
                }
                totals.delivered += usize::from(row.state == BatchState::Delivered);
                totals.sent += usize::from(matches!(
                    row.state,
                    BatchState::Sent | BatchState::SourceDeleted | BatchState::SourceKept
                ));
                totals.failed += usize::from(matches!(
                    row.state,
                    BatchState::Failed | BatchState::Quarantined
                ));
                totals.bytes += row.bytes.max(0);
            }
            let mut newest = rows.clone();
            newest.sort_by_key(|r| std::cmp::Reverse(r.updated_at));
            newest.truncate(20);
            newest_rows.push((catalog, newest));
            for row in rows.into_iter().filter(|r| running(r.state)) {
                let last_moved = catalog.last_event(&row.batch_key)?;
                let batch = Batch::of(catalog, row, progress, now)?;
                let idle = now - last_moved.unwrap_or(batch.updated_us);
                if batch.state != BatchState::Queued && idle > STALLED_US {
                    alerts.push(Alert {
                        level: AlertLevel::Warning,
                        text: format!(
                            "batch {} ({}) has not moved for {} minutes",
                            batch.name,
                            batch.role,
                            idle / 60_000_000
                        ),
                    });
                }
                in_flight.push(batch);
            }
            failures.extend(
                catalog
                    .failures(None, 10)?
                    .into_iter()
                    .map(FailureView::from),
            );
        }
        progress.queue_etas(&mut in_flight, &ended, wire.as_ref(), now);
        // A running batch among the newest is the one just read, with its ETA; the others are
        // read now.
        for (catalog, rows) in newest_rows {
            for row in rows {
                let key = row.batch_key.to_string();
                match in_flight.iter().find(|b| b.key == key) {
                    Some(batch) => recent.push(batch.clone()),
                    None => recent.push(Batch::of(catalog, row, progress, now)?),
                }
            }
        }
        for b in &recent {
            let held_back = matches!(b.state, BatchState::Failed | BatchState::Quarantined);
            if held_back && now - b.updated_us < HOUR_US {
                alerts.push(Alert {
                    level: AlertLevel::Critical,
                    text: format!(
                        "batch {} ({}) {}: {}",
                        b.name,
                        b.role,
                        b.state,
                        b.error.as_deref().unwrap_or("see its failures")
                    ),
                });
            }
        }
        alerts.extend(bottleneck(&stages));
        // Those under way first, in the order they began; then the queued, as they arrived.
        in_flight.sort_by_key(|b| (b.state == BatchState::Queued, b.started_us, b.arrived_us));
        recent.sort_by_key(|b| std::cmp::Reverse(b.updated_us));
        recent.truncate(20);
        failures.sort_by_key(|f| std::cmp::Reverse(f.at_us));
        failures.truncate(10);
        Ok(Self {
            at_us: now,
            in_flight,
            recent,
            stages,
            queue,
            failures,
            alerts,
            totals,
        })
    }
}

/// The stage that holds back its pipeline, if any. Back-pressure fills every queue upstream of
/// the slowest stage, so it is the last stage (in pipeline order) whose queue is nearly full. A
/// queue of one item is a hand-off, full whenever its stage waits for any reason: it tells
/// nothing.
fn bottleneck(stages: &[StageView]) -> Option<Alert> {
    let s = stages
        .iter()
        .rfind(|s| s.queue_capacity > 1 && s.fill >= FILL_CRITICAL)?;
    Some(Alert {
        level: AlertLevel::Warning,
        text: format!(
            "the {} stage ({}) holds back the pipeline: its queue is {:.0} % full",
            s.stage,
            s.role,
            100.0 * s.fill
        ),
    })
}

/// Batches over every catalogue that the filter selects, newest change first.
pub fn batches(catalogs: &[Catalog], filter: &Filter, progress: &Progress) -> Result<Vec<Batch>> {
    let now = forte_catalog::now_us();
    let mut all = vec![];
    for catalog in catalogs {
        for row in catalog.batches_matching(filter)? {
            all.push(Batch::of(catalog, row, progress, now)?);
        }
    }
    all.sort_by_key(|b| std::cmp::Reverse(b.updated_us));
    if let Some(limit) = filter.limit {
        all.truncate(limit.max(0) as usize);
    }
    Ok(all)
}

/// Files over every catalogue that the filter selects, newest change first.
pub fn files(catalogs: &[Catalog], filter: &Filter) -> Result<Vec<File>> {
    let mut all = vec![];
    for catalog in catalogs {
        all.extend(catalog.files_matching(filter)?.into_iter().map(File::from));
    }
    all.sort_by_key(|f| std::cmp::Reverse(f.updated_us));
    if let Some(limit) = filter.limit {
        all.truncate(limit.max(0) as usize);
    }
    Ok(all)
}

/// The newest failures over every catalogue.
pub fn failures(catalogs: &[Catalog], limit: i64) -> Result<Vec<FailureView>> {
    let mut all = vec![];
    for catalog in catalogs {
        all.extend(
            catalog
                .failures(None, limit)?
                .into_iter()
                .map(FailureView::from),
        );
    }
    all.sort_by_key(|f| std::cmp::Reverse(f.at_us));
    all.truncate(limit.max(0) as usize);
    Ok(all)
}

/// The first catalogue that knows the batch `key`, with its detail.
pub fn batch(
    catalogs: &[Catalog],
    key: &BatchKey,
    progress: &Progress,
) -> Result<Option<BatchDetail>> {
    for catalog in catalogs {
        if let Some(detail) = BatchDetail::read(catalog, key, progress)? {
            return Ok(Some(detail));
        }
    }
    Ok(None)
}

/// Utilisation samples since `since` (µs) over every catalogue, oldest first.
pub fn usage(catalogs: &[Catalog], since: i64) -> Result<Vec<UsageRow>> {
    let mut all = vec![];
    for catalog in catalogs {
        all.extend(
            catalog
                .usage_of(None)?
                .into_iter()
                .filter(|u| u.at >= since),
        );
    }
    all.sort_by_key(|u| u.at);
    Ok(all)
}

/// The last hour, in µs before now.
pub fn hour_ago() -> i64 {
    forte_catalog::now_us() - HOUR_US
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::{BatchWire, WaitingPart};

    fn stage(stage: &'static str, depth: usize, capacity: usize) -> StageView {
        StageView {
            role: Role::Edge,
            stage,
            item: "part",
            workers: 1,
            queue_depth: depth,
            queue_capacity: capacity,
            fill: depth as f64 / capacity as f64,
            items: 0,
            bytes_in: 0,
            bytes_out: 0,
            busy_s: 0.0,
            service_rate_bytes_per_second: 0.0,
        }
    }

    fn sending(key: &str, started: i64, bytes: i64, done: i64) -> Batch {
        Batch {
            key: key.into(),
            role: Role::Edge,
            site: String::new(),
            name: key.into(),
            state: BatchState::Sending,
            files: 1,
            bytes,
            done_bytes: done,
            progress: done as f64 / bytes as f64,
            arrived_us: 0,
            started_us: Some(started),
            ended_us: None,
            updated_us: 0,
            rate_bytes_per_second: None,
            eta_s: None,
            running: true,
            error: None,
        }
    }

    #[test]
    fn a_batch_is_done_when_it_and_the_batches_before_it_have_gone_at_the_nodes_rate() {
        let progress = Progress::new(16 << 20, Order::AsBegun);
        // A began first and uploads alone at 10 MB/s; B was read ahead and has sent nothing.
        let mut etas = (None, None);
        for t in 0..=4 {
            let mut running = [
                sending("b", 2, 100_000_000, 0),
                sending("a", 1, 100_000_000, t * 10_000_000),
            ];
            progress.queue_etas(&mut running, &EndedBytes::new(), None, t * S);
            etas = (running[1].eta_s, running[0].eta_s);
        }
        // At 4 s: A has 60 MB left (6 s), B its 100 MB after those (16 s). B's own mean rate
        // (nothing done) could tell nothing at all.
        assert_eq!(etas, (Some(6.0), Some(16.0)));
        // Served smallest remaining first, B (100 MB left) would wait for A (60 MB) all the same;
        // a smaller batch begun later would go first.
        let sjf = Progress::new(16 << 20, Order::LeastRemaining);
        for t in 0..=4 {
            let mut running = [
                sending("a", 1, 100_000_000, t * 10_000_000),
                sending("small", 3, 20_000_000, 0),
            ];
            sjf.queue_etas(&mut running, &EndedBytes::new(), None, t * S);
            etas = (running[0].eta_s, running[1].eta_s);
        }
        assert_eq!(etas, (Some(8.0), Some(2.0)));
        assert_eq!(progress.recent_eta("b", 5 * S), Some(15.0));
        // A ends at 10 s (its bytes count as done) and B goes on at the node's rate.
        for t in 5..=13 {
            let (mut running, ended) = if t < 10 {
                let running = vec![
                    sending("b", 2, 100_000_000, 0),
                    sending("a", 1, 100_000_000, t * 10_000_000),
                ];
                (running, EndedBytes::new())
            } else {
                let running = vec![sending("b", 2, 100_000_000, (t - 10) * 10_000_000)];
                (running, EndedBytes::from([(Role::Edge, 100_000_000)]))
            };
            progress.queue_etas(&mut running, &ended, None, t * S);
            etas.1 = running[0].eta_s;
        }
        assert_eq!(etas.1, Some(7.0));
    }

    #[test]
    fn batches_that_began_and_ended_between_two_looks_count_in_the_nodes_rate() {
        // As seen sending A–N: at the first look nothing was sending; 5 s later A, B and M
        // (74 MB) had come and gone and L had sent 17 MB. The node moved 91 MB in 5 s; counting
        // only the batches seen running gave 17 MB, and ETAs of 4-5× the truth.
        let progress = Progress::new(16 << 20, Order::LeastRemaining);
        progress.queue_etas(&mut [], &EndedBytes::new(), None, 0);
        let mut running = [
            sending("l", 0, 49_000_000, 17_000_000),
            sending("e", 0, 65_000_000, 0),
        ];
        let ended = EndedBytes::from([(Role::Edge, 74_000_000)]);
        progress.queue_etas(&mut running, &ended, None, 5 * S);
        let rate = 91e6 / 5.0;
        assert_eq!(running[0].eta_s, Some(32e6 / rate));
        assert_eq!(running[1].eta_s, Some(97e6 / rate));
        // L fails a second later: its 17 MB leave the sum, which does not go back below the
        // 91 MB seen (a slope over a shrinking sum would be no rate at all).
        let mut running = [sending("e", 0, 65_000_000, 10_000_000)];
        progress.queue_etas(&mut running, &ended, None, 6 * S);
        assert_eq!(running[0].eta_s, Some(55e6 / (91e6 / 6.0)));
    }

    /// A part of `batch`, `seq`-th prepared, of 5 MB sealed; being sent, its connection
    /// having taken `sent` bytes of it.
    fn part(batch: &str, seq: u64, sent: Option<u64>) -> WaitingPart {
        WaitingPart {
            batch: batch.into(),
            seq,
            sealed: 5_000_000,
            sending: sent,
        }
    }

    /// The batches' prepared bytes: (key, raw prepared, sealed prepared, raw waiting).
    fn prepared(batches: &[(&str, u64, u64, u64)]) -> HashMap<String, BatchWire> {
        batches
            .iter()
            .map(|&(key, raw, sealed, waiting_raw)| {
                let wire = BatchWire {
                    prepared_raw: raw,
                    prepared_sealed: sealed,
                    waiting_raw,
                    ..BatchWire::default()
                };
                (key.to_owned(), wire)
            })
            .collect()
    }

    /// The edge's ETAs of the `running` batches, in their order, after two looks at the edge's
    /// `wire`: at 0 s with nothing sent, and at 4 s with 20 MB sent (the link's 5 MB/s).
    fn edge_etas(
        order: Order,
        running: &[(&str, i64, i64)],
        wire: impl Fn(u64) -> WireView,
    ) -> Vec<Option<f64>> {
        let progress = Progress::new(16 << 20, order);
        let mut batches = vec![];
        for (t, sent) in [(0, 0), (4, 20_000_000)] {
            batches = running
                .iter()
                .map(|&(key, started, bytes)| sending(key, started, bytes, 0))
                .collect();
            progress.queue_etas(&mut batches, &EndedBytes::new(), Some(&wire(sent)), t * S);
        }
        batches.iter().map(|b| b.eta_s).collect()
    }

    #[test]
    fn at_the_edge_a_batch_that_compresses_less_is_timed_in_the_sealed_bytes_the_link_paces() {
        // As seen sending A–N at 5 MB/s: the first batches (100 MB raw) compressed 5x and went
        // in 4 s, 25 MB/s raw; E (60 MB) compresses 3x, its four parts prepared and waiting for
        // the link; F (30 MB) is not prepared yet.
        let wire = |sent: u64| WireView {
            sent,
            resumed: None,
            prepared_raw: 160_000_000,
            prepared_sealed: 40_000_000,
            batches: prepared(&[("e", 60_000_000, 20_000_000, 60_000_000)]),
            waiting: (0..4).map(|seq| part("e", seq, None)).collect(),
            ..WireView::default()
        };
        let running = || {
            [
                sending("e", 1, 60_000_000, 0),
                sending("f", 2, 30_000_000, 0),
            ]
        };
        let (by_sealed, by_raw) = (
            Progress::new(16 << 20, Order::AsBegun),
            Progress::new(16 << 20, Order::AsBegun),
        );
        let mut etas = (running(), running());
        for (t, sent, ended) in [(0, 0, 0), (4, 20_000_000, 100_000_000)] {
            etas = (running(), running());
            by_sealed.queue_etas(&mut etas.0, &EndedBytes::new(), Some(&wire(sent)), t * S);
            let ended = EndedBytes::from([(Role::Edge, ended)]);
            by_raw.queue_etas(&mut etas.1, &ended, None, t * S);
        }
        // E's 20 MB sealed at 5 MB/s: 4 s; then F's 30 MB raw at the node's 4x: 7.5 MB more.
        assert_eq!((etas.0[0].eta_s, etas.0[1].eta_s), (Some(4.0), Some(5.5)));
        // Counted in raw bytes at the first batches' 25 MB/s, E read 2.4 s: 40 % short.
        assert_eq!(etas.1[0].eta_s, Some(2.4));
    }

    #[test]
    fn a_batch_whose_data_changes_is_timed_by_the_estimate_of_what_it_has_not_prepared() {
        // As K of the test set: 60 MB raw, its first 20 MB prepared and sealed to 5 MB (a
        // quarter: the windows said a half at zstd's fastest level), the other 40 MB estimated
        // at 0.9 (0.45 at the level in use: 18 MB). The link carries 5 MB/s.
        let k = BatchWire {
            estimated_left: (40_000_000, 36_000_000),
            estimated_prepared: (10_000_000, 5_000_000),
            ..prepared(&[("k", 20_000_000, 5_000_000, 20_000_000)])["k"]
        };
        let wire = |sent: u64, k: BatchWire| WireView {
            sent,
            prepared_raw: 20_000_000,
            prepared_sealed: 5_000_000,
            batches: HashMap::from([("k".to_owned(), k)]),
            waiting: vec![part("k", 0, None)],
            ..WireView::default()
        };
        let eta = |k: BatchWire| {
            edge_etas(Order::AsBegun, &[("k", 1, 60_000_000)], |sent| {
                wire(sent, k)
            })[0]
        };
        // 5 MB waiting and 18 MB to come: 4.6 s.
        assert_eq!(eta(k), Some(4.6));
        // At its compression so far the 40 MB would seal to 10 MB: 3 s, a third short.
        let unestimated = BatchWire {
            estimated_left: (0, 0),
            estimated_prepared: (0, 0),
            ..k
        };
        assert_eq!(eta(unestimated), Some(3.0));
    }

    #[test]
    fn a_batchs_first_parts_are_weighed_against_the_nodes_scale_before_they_time_its_rest() {
        // N's first part (4 MB raw) sealed to 1.5 × the estimate; the node's parts so far to
        // the estimate. Its other 60 MB raw are estimated at 24 MB.
        let n = BatchWire {
            estimated_left: (60_000_000, 24_000_000),
            estimated_prepared: (4_000_000, 6_000_000),
            ..prepared(&[("n", 4_000_000, 6_000_000, 4_000_000)])["n"]
        };
        let wire = |sent: u64| WireView {
            sent,
            prepared_raw: 64_000_000,
            prepared_sealed: 64_000_000,
            estimated_prepared: (64_000_000, 64_000_000),
            batches: HashMap::from([("n".to_owned(), n)]),
            waiting: vec![part("n", 0, None)],
            ..WireView::default()
        };
        let eta = edge_etas(Order::AsBegun, &[("n", 1, 64_000_000)], wire)[0].unwrap();
        // Its scale: (6 + 8 MB at the node's 1.0) / (4 + 8 MB) = 1.17, so 28 MB to come beside
        // the 5 MB waiting: 6.6 s at 5 MB/s (at its first part's 1.5 alone, 41 MB: 8.2 s).
        assert!((eta - 6.6).abs() < 1e-9, "{eta}");
    }

    #[test]
    fn a_batch_prepared_whole_is_done_once_the_parts_prepared_before_its_last_have_gone() {
        // E's parts were prepared 1st and 3rd, F's 2nd and 4th: the uploads take them in that
        // order, so E waits for F's first part too (15 MB at 5 MB/s), F for all four.
        let wire = |sent: u64| WireView {
            sent,
            resumed: None,
            prepared_raw: 40_000_000,
            prepared_sealed: 20_000_000,
            batches: prepared(&[
                ("e", 20_000_000, 10_000_000, 20_000_000),
                ("f", 20_000_000, 10_000_000, 20_000_000),
            ]),
            waiting: [
                part("e", 0, None),
                part("f", 1, None),
                part("e", 2, None),
                part("f", 3, None),
            ]
            .into(),
            ..WireView::default()
        };
        let running = [("e", 1, 20_000_000), ("f", 1, 20_000_000)];
        let etas = edge_etas(Order::LeastRemaining, &running, wire);
        assert_eq!(etas, [Some(3.0), Some(4.0)]);
    }

    #[test]
    fn a_last_part_sent_beside_others_takes_its_share_of_the_link() {
        // E's last part (5 MB, prepared 4th) and F's next three (5 MB each) were all taken by
        // the uploads at 4 s, each getting a quarter of the 5 MB/s; F's last part waits.
        let wire = |sent: u64| WireView {
            sent,
            batches: prepared(&[
                ("e", 20_000_000, 10_000_000, 20_000_000),
                ("f", 40_000_000, 20_000_000, 40_000_000),
            ]),
            waiting: vec![
                part("e", 3, Some(0)),
                part("f", 4, Some(0)),
                part("f", 5, Some(0)),
                part("f", 6, Some(0)),
                part("f", 7, None),
            ],
            ..WireView::default()
        };
        let etas = edge_etas(
            Order::AsBegun,
            &[("e", 1, 20_000_000), ("f", 1, 40_000_000)],
            wire,
        );
        // E's part ends with the three beside it: 20 MB of the link, 4 s (counted alone, its
        // own 5 MB: 1 s). F's last part then goes alone: 1 s more.
        assert_eq!(etas, [Some(4.0), Some(5.0)]);
    }

    #[test]
    fn parts_still_to_prepare_take_the_slots_that_free_up_beside_a_batchs_last_part() {
        // E's two parts, 1 MB and 5 MB, both taken by the uploads at 4 s; G has 20 MB still to
        // prepare, whose parts (3 MB, as large as those waiting) take each slot that frees up.
        let wire = |sent: u64| WireView {
            sent,
            prepared_raw: 6_000_000,
            prepared_sealed: 6_000_000,
            batches: prepared(&[("e", 6_000_000, 6_000_000, 6_000_000)]),
            waiting: vec![
                WaitingPart {
                    sealed: 1_000_000,
                    ..part("e", 0, Some(0))
                },
                part("e", 1, Some(0)),
            ],
            ..WireView::default()
        };
        let etas = edge_etas(
            Order::AsBegun,
            &[("e", 1, 6_000_000), ("g", 2, 20_000_000)],
            wire,
        );
        // 1 MB each until the small part ends; then 4 MB left beside a 3-MB part of G, and 1 MB
        // beside the next: 10 MB of the link, 2 s (alone once the small part ended: 1.2 s).
        assert_eq!(etas[0], Some(2.0));
    }

    #[test]
    fn the_last_part_of_a_batch_still_being_prepared_shares_the_link_with_the_parts_after_it() {
        // E's four parts and F's first four (5 MB each) are all being uploaded, eight at once;
        // F has 20 MB raw still to prepare, 10 MB sealed at its compression so far, and G,
        // served after it, 100 MB.
        let wire = |sent: u64| WireView {
            sent,
            prepared_raw: 80_000_000,
            prepared_sealed: 40_000_000,
            batches: prepared(&[
                ("e", 40_000_000, 20_000_000, 40_000_000),
                ("f", 40_000_000, 20_000_000, 40_000_000),
            ]),
            waiting: (0..8)
                .map(|seq| part(if seq < 4 { "e" } else { "f" }, seq, Some(0)))
                .collect(),
            ..WireView::default()
        };
        let (e, f, g) = (
            ("e", 1, 40_000_000),
            ("f", 2, 60_000_000),
            ("g", 3, 100_000_000),
        );
        let etas = edge_etas(Order::AsBegun, &[e, f, g], wire);
        // The 40 MB waiting, F's 10 MB to come, and what the seven uploads beside its last
        // part get of G's parts while it is sent, half a part each: 67.5 MB at 5 MB/s (counted
        // alone, 50 MB: 10 s).
        assert_eq!(etas[1], Some(13.5));
        // Without G nothing is left to take the slots beside F's last part.
        assert_eq!(edge_etas(Order::AsBegun, &[e, f], wire)[1], Some(10.0));
    }

    #[test]
    fn the_edge_rate_runs_from_when_the_link_got_busy_and_uploads_under_way_count_what_they_sent() {
        // Looked at 0 s, nothing prepared; the first part prepared at 3 s; at 5 s the uploads'
        // connections have taken 10 MB (5 MB/s since 3 s, where the looks alone say 2 MB/s).
        // E waits with four 5 MB parts, the first two being uploaded: their connections have
        // taken 2.5 MB and 1.25 MB of them.
        let progress = Progress::new(16 << 20, Order::AsBegun);
        progress.queue_etas(&mut [], &EndedBytes::new(), Some(&WireView::default()), 0);
        let wire = WireView {
            sent: 10_000_000,
            resumed: Some((3 * S, 0)),
            prepared_raw: 60_000_000,
            prepared_sealed: 30_000_000,
            batches: prepared(&[("e", 40_000_000, 20_000_000, 40_000_000)]),
            waiting: vec![
                part("e", 0, Some(2_500_000)),
                part("e", 1, Some(1_250_000)),
                part("e", 2, None),
                part("e", 3, None),
            ],
            ..WireView::default()
        };
        let mut running = [sending("e", 1, 40_000_000, 0)];
        progress.queue_etas(&mut running, &EndedBytes::new(), Some(&wire), 5 * S);
        // 16.25 MB left at 5 MB/s.
        assert_eq!(running[0].eta_s, Some(3.25));
    }

    #[test]
    fn the_bottleneck_is_the_last_full_queue_and_never_a_hand_off() {
        // As seen sending A–N at 10 MB/s: the read hand-off full, the uploads' queue 11/12.
        let link_bound = [
            stage("read", 1, 1),
            stage("hash", 12, 12),
            stage("compress", 0, 12),
            stage("sink", 11, 12),
        ];
        let alert = bottleneck(&link_bound).unwrap();
        assert!(alert.text.starts_with("the sink stage"), "{}", alert.text);
        assert_eq!(
            bottleneck(&[stage("read", 1, 1), stage("sink", 10, 12)]),
            None
        );
    }

    const S: i64 = 1_000_000;

    #[test]
    fn a_running_batchs_rate_leaves_out_the_time_before_it_moved_and_follows_changes() {
        let progress = Progress::new(16 << 20, Order::AsBegun);
        // Read ahead for 10 s while the batch before it uploads: nothing done, no rate.
        for t in 0..=10 {
            assert_eq!(progress.windowed_rate("b", t * S, 0), None, "at {t} s");
        }
        // Then 10 MB/s, in bursts of 20 MB every 2 s: 10 MB/s from when it began to move,
        // where the mean since the stage began (at 0 s) says 40e6 / 14 s = 2.9 MB/s.
        let mut rate = None;
        for t in (12..=14).step_by(2) {
            rate = progress.windowed_rate("b", t * S, (t - 10) * 10_000_000);
        }
        assert_eq!(rate, Some(10e6));
        // The link slows to 5 MB/s at 20 s: 30 s later the window sees only the new rate.
        for t in 15..=50 {
            let done = if t <= 20 {
                (t - 10) * 10_000_000
            } else {
                100_000_000 + (t - 20) * 5_000_000
            };
            rate = progress.windowed_rate("b", t * S, done);
        }
        assert_eq!(rate, Some(5e6));
        // A batch that no longer runs is forgotten.
        progress.queue_etas(&mut [], &EndedBytes::new(), None, 60 * S);
        assert!(progress.seen.lock().batches.is_empty());
    }
}
