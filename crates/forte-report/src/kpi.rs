//! The KPIs of FORTE §2.2, from what the edge's and the core's catalogues recorded.
//!
//! A batch passes two tasks: `send` on the edge (prepare and upload; it starts when the
//! batch's first file leaves the queue and ends when the batch is sealed at the relay) and
//! `pull` on the core (download, verify, deliver; it starts when the core takes the batch).
//! Its queueing before `send` runs from its arrival (when the edge found it ready) to the start
//! of `send`; its queueing before `pull` is its time at the relay. So
//!
//! ```text
//! l_b = q_send + t_send + q_pull + t_pull = pull end − arrival,   R_b = size(b) / l_b
//! R_P = Σ size(b) / (last pull end − first send start)
//! ```
//!
//! When the core fetches a batch ahead (its first files while the edge still sends the rest),
//! `pull` counts from the end of `send`.
//!
//! A file that appears in a batch directory after the batch was sent goes as a follow-up,
//! sealed into the same batch, and the catalogue widens the batch's `send` and `pull` stages
//! to cover it. The batch's KPIs are those of its first delivery: `send` ends at the batch's
//! first `sent`, `pull` at the core's last record before any late file (the first delivery's
//! acknowledgement, or a site task after it), and its size leaves the late files out. Each
//! late file is reported on its own ([`LateFile`]): how long after the send it was found, and
//! how long it then took to be delivered.
//!
//! The site's own tasks (`[[task]]`) run inside `send` at the edge (before the batch is
//! prepared) and inside `pull` at the core (between the batch's landing and its promotion, or
//! after it): each is reported as its span (its first try queued to its last try's end) and
//! that span's share of l_b.
//!
//! Times come from two machines' clocks when edge and core are separate; they must be
//! synchronised (NTP) for the queueing at the relay to be meaningful.

use std::collections::BTreeMap;

use forte_catalog::{
    BatchKey, BatchRow, BatchState, Catalog, FollowUpRow, ItemLatency, Role, Stage, StageRow,
    TaskRunRow, UsageRow,
};
use serde::Serialize;

/// One task of one batch: queued from `queued_from`, worked on from `started` to `ended`
/// (microseconds since the Unix epoch).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StageSpan {
    pub stage: Stage,
    pub queued_from: i64,
    pub started: i64,
    pub ended: i64,
}

impl StageSpan {
    pub fn queueing_s(&self) -> f64 {
        seconds(self.started - self.queued_from)
    }

    pub fn processing_s(&self) -> f64 {
        seconds(self.ended - self.started)
    }
}

/// A site task's time on one batch: from its first try's queueing to its last try's end
/// (per file, the tries of all files).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TaskSpan {
    pub task: String,
    /// Where it ran: the edge (before `send` prepared the batch) or the core (inside `pull`).
    pub role: Role,
    pub queued_from: i64,
    pub started: i64,
    pub ended: i64,
    pub tries: usize,
    /// Seconds from its first try's queueing to its last try's end over l_b; `None` while the
    /// batch is not delivered.
    pub share_of_latency: Option<f64>,
}

impl TaskSpan {
    pub fn queueing_s(&self) -> f64 {
        seconds(self.started - self.queued_from)
    }

    pub fn processing_s(&self) -> f64 {
        seconds(self.ended - self.started)
    }

    /// Each task's span over `runs` (one batch's), in the order the tasks first ran.
    fn of(runs: &[TaskRunRow], latency_s: Option<f64>) -> Vec<Self> {
        let mut spans: Vec<Self> = Vec::new();
        for r in runs {
            let role = r.batch_key.role();
            match spans
                .iter_mut()
                .find(|s| s.task == r.task && s.role == role)
            {
                Some(s) => {
                    s.queued_from = s.queued_from.min(r.queued_at);
                    s.started = s.started.min(r.started_at);
                    s.ended = s.ended.max(r.ended_at);
                    s.tries += 1;
                }
                None => spans.push(Self {
                    task: r.task.clone(),
                    role,
                    queued_from: r.queued_at,
                    started: r.started_at,
                    ended: r.ended_at,
                    tries: 1,
                    share_of_latency: None,
                }),
            }
        }
        for s in &mut spans {
            s.share_of_latency = latency_s
                .filter(|l| *l > 0.0)
                .map(|l| seconds(s.ended - s.queued_from) / l);
        }
        spans
    }
}

/// A file that appeared in a batch after the batch was sent, and went as a follow-up: not part
/// of the batch's KPIs, reported on its own.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LateFile {
    /// Its path in the batch.
    pub path: String,
    pub object_id: String,
    pub bytes: u64,
    /// When the edge found it (µs since the epoch).
    pub found: i64,
    /// Seconds from the end of the batch's first send to when the edge found it.
    pub after_sent_s: f64,
    /// When the core delivered it; `None` while it is not delivered.
    pub delivered: Option<i64>,
    /// Seconds from when the edge found it to its delivery.
    pub delivered_in_s: Option<f64>,
}

impl LateFile {
    /// `FILE of BATCH arrived N s after its batch was sent, delivered in T s`.
    pub fn sentence(&self, batch: &str) -> String {
        let delivered = self
            .delivered_in_s
            .map_or("not delivered yet".to_owned(), |t| {
                format!("delivered in {t:.1} s")
            });
        format!(
            "{} of {batch} arrived {:.1} s after its batch was sent, {delivered}",
            self.path, self.after_sent_s
        )
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BatchKpi {
    pub name: String,
    pub site: String,
    /// The opaque id the relay knows the batch by.
    pub batch_id: String,
    /// Files and raw bytes of its first delivery (late files left out).
    pub files: i64,
    pub raw_bytes: u64,
    /// Bytes on the wire (sealed parts and manifests); 0 when the core's record is missing.
    pub sealed_bytes: u64,
    pub arrived: i64,
    pub stages: Vec<StageSpan>,
    /// The site's tasks at the core, inside `pull`.
    pub tasks: Vec<TaskSpan>,
    /// l_b in seconds; `None` while the batch is not delivered.
    pub latency_s: Option<f64>,
    pub queueing_s: f64,
    pub processing_s: f64,
    /// R_b in MB/s (decimal).
    pub rate_mb_s: Option<f64>,
    /// Files that appeared in it after it was sent (follow-ups), in the order they were found.
    pub late: Vec<LateFile>,
}

impl BatchKpi {
    /// The batch as a chart labels it: `site/name`, or the name where no core row says the
    /// site.
    pub fn label(&self) -> String {
        if self.site.is_empty() {
            self.name.clone()
        } else {
            format!("{}/{}", self.site, self.name)
        }
    }

    /// The share of the batch's latency spent queueing.
    pub fn queueing_share(&self) -> Option<f64> {
        self.latency_s
            .filter(|l| *l > 0.0)
            .map(|l| self.queueing_s / l)
    }

    pub fn delivered_at(&self) -> Option<i64> {
        self.latency_s
            .and_then(|_| self.stages.last().map(|s| s.ended))
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunKpi {
    pub batches: usize,
    pub delivered: usize,
    pub raw_bytes: u64,
    pub sealed_bytes: u64,
    /// Late files of the delivered batches (follow-ups), and their bytes: left out of the
    /// figures here, reported on their own.
    pub late_files: usize,
    pub late_bytes: u64,
    /// Pipeline start: the first batch begins its first task.
    pub started: i64,
    /// Pipeline end: the last delivered batch finishes its last task.
    pub ended: i64,
    pub seconds: f64,
    /// R_P in MB/s over delivered batches, from the first start to the last delivery: the
    /// offered load when batches came slower than the pipeline could take them.
    pub rate_mb_s: f64,
    /// R_P × 86 400 s, in bytes: what arrived per day at this pace.
    pub offered_bytes_per_day: f64,
    /// Seconds in which at least one delivered batch was being sent or pulled.
    pub busy_seconds: f64,
    /// Raw MB per busy second: what the pipeline delivers while it has work.
    pub capacity_mb_s: f64,
    /// The capacity × 86 400 s, in bytes.
    pub daily_capacity_bytes: f64,
    /// Raw bytes over bytes on the wire.
    pub compression_ratio: f64,
    pub mean_latency_s: f64,
    pub max_latency_s: f64,
}

/// A batch row with its stages, the tries of the site's tasks on it, and the files that came to
/// it late (follow-ups).
pub type BatchRecords = (BatchRow, Vec<StageRow>, Vec<TaskRunRow>, Vec<FollowUpRow>);

/// Which batches a report covers: those changed in a window, of one site or all.
#[derive(Debug, Clone, Default)]
pub struct ReportWindow {
    /// Changed at or after this time (µs since the epoch).
    pub since: Option<i64>,
    /// Changed at or before this time (µs since the epoch).
    pub until: Option<i64>,
    /// Of this site only: its core rows, and the edge rows of the same batches.
    pub site: Option<String>,
}

/// The batch rows of `catalog` that `window` covers, with their stages, task tries and late
/// files: what [`batches`] takes, one catalogue's share. The site is applied by
/// [`of_site`] once every catalogue is read: an edge's rows name no site.
pub fn batch_rows(catalog: &Catalog, window: &ReportWindow) -> anyhow::Result<Vec<BatchRecords>> {
    let follow_ups = catalog.follow_ups()?;
    let filter = forte_catalog::Filter {
        since: window.since,
        until: window.until,
        ..Default::default()
    };
    let mut rows = vec![];
    for b in catalog.batches_matching(&filter)? {
        let stages = catalog.stages(&b.batch_key)?;
        let tasks = catalog.task_runs(Some(&b.batch_key))?;
        let late = follow_ups
            .iter()
            .filter(|f| f.batch_key == b.batch_key)
            .cloned()
            .collect();
        rows.push((b, stages, tasks, late));
    }
    Ok(rows)
}

/// The rows of `site`'s batches: its core rows, and the edge rows of the same batch ids.
pub fn of_site(rows: Vec<BatchRecords>, site: &str) -> Vec<BatchRecords> {
    let ids: std::collections::HashSet<String> = rows
        .iter()
        .filter(|(b, ..)| b.role == Role::Core && b.site == site)
        .map(|(b, ..)| b.batch_key.batch().to_owned())
        .collect();
    rows.into_iter()
        .filter(|(b, ..)| ids.contains(b.batch_key.batch()))
        .filter(|(b, ..)| b.role == Role::Edge || b.site == site)
        .collect()
}

/// Batch KPIs from every batch row (any role, any number of catalogues) with its stages.
/// Edge rows carry arrival, size and `send`; core rows (keyed `site/id`) carry `pull` and the
/// site's tasks.
pub fn batches(rows: &[BatchRecords]) -> Vec<BatchKpi> {
    // The core's row of each batch id, found by hash: a year holds tens of thousands.
    let by_id: std::collections::HashMap<&str, &BatchRecords> = rows
        .iter()
        .filter(|(b, ..)| b.role == Role::Core)
        .map(|r| (r.0.batch_key.batch(), r))
        .collect();
    let core = |edge: &BatchKey| by_id.get(edge.batch()).copied();
    let mut out: Vec<BatchKpi> = rows
        .iter()
        .filter(|(b, ..)| b.role == Role::Edge)
        .map(|(edge, edge_stages, edge_runs, edge_late)| {
            let core = core(&edge.batch_key);
            let spans = spans_of(edge, edge_stages, edge_late, core);
            // A batch a site task held back in quarantine came, but was not delivered.
            let quarantined = core.is_some_and(|(b, ..)| b.state == BatchState::Quarantined);
            let delivered = spans.len() == 2 && !quarantined;
            let latency_s = delivered.then(|| seconds(spans[1].ended - edge.created_at));
            let delivered_at = latency_s.map(|_| spans[1].ended);
            let core_late = core.map_or(&[][..], |(.., late)| late);
            let late = late_files(edge_late, core_late, delivered_at);
            let late_bytes: u64 = late.iter().map(|f| f.bytes).sum();
            let raw_bytes = (edge.bytes.max(0) as u64).saturating_sub(late_bytes);
            let core_runs = core.map_or(&[][..], |(_, _, runs, _)| runs);
            let runs: Vec<TaskRunRow> = edge_runs.iter().chain(core_runs).cloned().collect();
            let tasks = TaskSpan::of(&runs, latency_s);
            BatchKpi {
                name: edge.name.clone(),
                site: core.map(|(b, ..)| b.site.clone()).unwrap_or_default(),
                batch_id: edge.batch_key.batch().to_owned(),
                files: (edge.files - late.len() as i64).max(0),
                raw_bytes,
                sealed_bytes: core.map_or(0, |(b, ..)| b.bytes.max(0) as u64),
                tasks,
                arrived: edge.created_at,
                queueing_s: spans.iter().map(StageSpan::queueing_s).sum(),
                processing_s: spans.iter().map(StageSpan::processing_s).sum(),
                rate_mb_s: latency_s
                    .filter(|l| *l > 0.0)
                    .map(|l| raw_bytes as f64 / 1e6 / l),
                latency_s,
                stages: spans,
                late,
            }
        })
        .collect();
    out.sort_by_key(|b| (b.arrived, b.name.clone()));
    out
}

/// The stage `name` of `stages`, if it ended.
fn ended_stage(stages: &[StageRow], name: Stage) -> Option<Interval> {
    stages.iter().find(|s| s.stage == name).and_then(|s| {
        Some(Interval {
            started: s.started_at,
            ended: s.ended_at?,
        })
    })
}

/// A batch's send (to its first `sent`: a follow-up widened the stage) and, once the core has
/// it, its pull to its first delivery.
fn spans_of(
    edge: &BatchRow,
    edge_stages: &[StageRow],
    edge_late: &[FollowUpRow],
    core: Option<&BatchRecords>,
) -> Vec<StageSpan> {
    let mut spans = Vec::new();
    let Some(Interval { started, ended }) = ended_stage(edge_stages, Stage::Send) else {
        return spans;
    };
    let ended = edge_late
        .first()
        .map_or(ended, |f| ended.min(f.batch_done_at).max(started));
    spans.push(StageSpan {
        stage: Stage::Send,
        queued_from: edge.created_at.min(started),
        started,
        ended,
    });
    let pull = core
        .and_then(|(row, stages, runs, late)| first_delivery(pull_span(row, stages)?, runs, late));
    if let Some(Interval {
        started: pull_started,
        ended: pull_ended,
    }) = pull
    {
        // The core fetches a batch's first files while the edge still sends the rest; that
        // overlap counts as the edge's task, so the tasks stay in sequence and l_b stays
        // their sum.
        spans.push(StageSpan {
            stage: Stage::Pull,
            queued_from: ended,
            started: pull_started.max(ended),
            ended: pull_ended.max(ended),
        });
    }
    spans
}

/// When a stage of a batch started and ended (µs since the epoch).
struct Interval {
    started: i64,
    ended: i64,
}

/// A core batch's pull stage: its start and end, or, for a batch recorded delivered (or
/// quarantined) whose puller was stopped before it recorded the stage's end, that record's
/// time: the stage ended no later.
fn pull_span(core: &BatchRow, stages: &[StageRow]) -> Option<Interval> {
    let pull = stages.iter().find(|s| s.stage == Stage::Pull)?;
    let kept = matches!(core.state, BatchState::Delivered | BatchState::Quarantined);
    let ended = pull.ended_at.or(kept.then_some(core.updated_at))?;
    Some(Interval {
        started: pull.started_at,
        ended: ended.max(pull.started_at),
    })
}

/// A core batch's pull cut to its first delivery: when files came to the batch after it (a
/// follow-up pulled later widened the stage), the pull ended with the batch's last record
/// before them (its acknowledgement), or with a site task that ran after that delivery.
fn first_delivery(pull: Interval, runs: &[TaskRunRow], late: &[FollowUpRow]) -> Option<Interval> {
    let Some(first_late) = late.iter().map(|f| f.first_at).min() else {
        return Some(pull);
    };
    let before = late.iter().find_map(|f| f.before_late);
    let tasks = runs
        .iter()
        .filter(|r| r.ended_at < first_late)
        .map(|r| r.ended_at)
        .max();
    let Some(ended) = before.max(tasks) else {
        return Some(pull);
    };
    Some(Interval {
        started: pull.started,
        ended: pull.ended.min(ended).max(pull.started),
    })
}

/// A batch's late files, as the edge found them (`edge`), each with its delivery: the core's
/// record of it when a later pull delivered it (`core`); else, found before the batch's
/// delivery (`delivered_at`), it went with it.
fn late_files(
    edge: &[FollowUpRow],
    core: &[FollowUpRow],
    delivered_at: Option<i64>,
) -> Vec<LateFile> {
    edge.iter()
        .map(|f| {
            let later = core
                .iter()
                .find(|c| c.object_id == f.object_id)
                .and_then(|c| c.delivered_at);
            let with_batch = delivered_at.filter(|at| *at >= f.first_at);
            let delivered = later.or(with_batch);
            LateFile {
                path: f.path.clone(),
                object_id: f.object_id.clone(),
                bytes: f.size.max(0) as u64,
                found: f.first_at,
                after_sent_s: seconds(f.first_at - f.batch_done_at),
                delivered,
                delivered_in_s: delivered.map(|at| seconds(at - f.first_at).max(0.0)),
            }
        })
        .collect()
}

/// The run's KPIs over the delivered batches; `None` when none was delivered.
pub fn run(batches: &[BatchKpi]) -> Option<RunKpi> {
    let delivered: Vec<&BatchKpi> = batches.iter().filter(|b| b.latency_s.is_some()).collect();
    let started = delivered
        .iter()
        .filter_map(|b| b.stages.first().map(|s| s.started))
        .min()?;
    let ended = delivered.iter().filter_map(|b| b.delivered_at()).max()?;
    let raw_bytes: u64 = delivered.iter().map(|b| b.raw_bytes).sum();
    let sealed_bytes: u64 = delivered.iter().map(|b| b.sealed_bytes).sum();
    let secs = seconds(ended - started);
    let rate = if secs > 0.0 {
        raw_bytes as f64 / secs
    } else {
        0.0
    };
    let busy = busy_seconds(delivered.iter().flat_map(|b| &b.stages));
    let capacity = if busy > 0.0 {
        raw_bytes as f64 / busy
    } else {
        0.0
    };
    let latencies: Vec<f64> = delivered.iter().filter_map(|b| b.latency_s).collect();
    let late = delivered.iter().flat_map(|b| &b.late);
    Some(RunKpi {
        batches: batches.len(),
        delivered: delivered.len(),
        raw_bytes,
        sealed_bytes,
        late_files: late.clone().count(),
        late_bytes: late.map(|f| f.bytes).sum(),
        started,
        ended,
        seconds: secs,
        rate_mb_s: rate / 1e6,
        offered_bytes_per_day: rate * 86_400.0,
        busy_seconds: busy,
        capacity_mb_s: capacity / 1e6,
        daily_capacity_bytes: capacity * 86_400.0,
        compression_ratio: if sealed_bytes > 0 {
            raw_bytes as f64 / sealed_bytes as f64
        } else {
            0.0
        },
        mean_latency_s: latencies.iter().sum::<f64>() / latencies.len() as f64,
        max_latency_s: latencies.iter().copied().fold(0.0, f64::max),
    })
}

/// How busy the edge's link was while batches waited for it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LinkUse {
    pub link_rate_bytes_s: f64,
    /// One-second samples lying wholly within a time when some batch had arrived and was not
    /// yet sent.
    pub samples: usize,
    /// The share of those samples sending at ≥ 90 % of the link rate.
    pub share_at_90_percent: f64,
    pub min_share_of_link: f64,
    pub median_share_of_link: f64,
    pub mean_share_of_link: f64,
}

/// The edge's network send rate (from its utilisation samples, nodes named `edge@…`) while any
/// batch waited to be sent, against `link_rate` bytes per second.
pub fn link_use(batches: &[BatchKpi], usage: &[UsageRow], link_rate: f64) -> Option<LinkUse> {
    let busy: Vec<(i64, i64)> = batches
        .iter()
        .filter_map(|b| b.stages.first().map(|s| (b.arrived, s.ended)))
        .collect();
    let waiting = |from: i64, to: i64| {
        // Some batch is waiting at every moment of [from, to]: the union of the busy
        // intervals covers it.
        let mut covered = from;
        let mut spans: Vec<&(i64, i64)> =
            busy.iter().filter(|(a, e)| *e > from && *a < to).collect();
        spans.sort();
        for (a, e) in spans {
            if *a > covered {
                return false;
            }
            covered = covered.max(*e);
        }
        covered >= to
    };
    let mut shares: Vec<f64> = usage
        .iter()
        .filter(|u| u.node.starts_with("edge@"))
        .filter(|u| waiting(u.at - (u.seconds * 1e6) as i64, u.at))
        .map(|u| u.net_tx_bps / link_rate)
        .collect();
    if shares.is_empty() {
        return None;
    }
    shares.sort_by(f64::total_cmp);
    let n = shares.len();
    Some(LinkUse {
        link_rate_bytes_s: link_rate,
        samples: n,
        share_at_90_percent: shares.iter().filter(|s| **s >= 0.9).count() as f64 / n as f64,
        min_share_of_link: shares[0],
        median_share_of_link: shares[n / 2],
        mean_share_of_link: shares.iter().sum::<f64>() / n as f64,
    })
}

/// A node's parts' latency from read to sink over the run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NodeLatency {
    pub node: String,
    #[serde(flatten)]
    pub latency: ItemLatency,
}

/// Per node, its parts' latency from read to sink as its last utilisation sample up to the
/// run's end says (percentiles over the sampling process's life, which a daemon started for the
/// run spends on it).
pub fn item_latency(run: &RunKpi, usage: &[UsageRow]) -> Vec<NodeLatency> {
    let mut last: BTreeMap<&str, ItemLatency> = BTreeMap::new();
    let of_run = |u: &&UsageRow| (run.started..=run.ended + SAMPLE_SLACK_US).contains(&u.at);
    for u in usage
        .iter()
        .filter(of_run)
        .filter(|u| u.item_latency.items > 0)
    {
        last.insert(&u.node, u.item_latency);
    }
    last.into_iter()
        .map(|(node, latency)| NodeLatency {
            node: node.to_owned(),
            latency,
        })
        .collect()
}

/// A utilisation sample taken this long after the run's end still belongs to it (samples come
/// once a second).
const SAMPLE_SLACK_US: i64 = 2_000_000;

/// The time covered by at least one of `spans` (their union): a pipeline's busy time, its
/// idle minutes between batches left out.
fn busy_seconds<'a>(spans: impl Iterator<Item = &'a StageSpan>) -> f64 {
    let mut spans: Vec<(i64, i64)> = spans.map(|s| (s.started, s.ended)).collect();
    spans.sort_unstable();
    let mut busy = 0;
    let mut covered_to = i64::MIN;
    for (started, ended) in spans {
        let from = started.max(covered_to);
        if ended > from {
            busy += ended - from;
            covered_to = ended;
        }
    }
    seconds(busy)
}

/// Whether a daily capacity sustains a nominal rate (bytes per day), in words with numbers.
pub fn verdict(daily_capacity_bytes: f64, nominal_bytes_per_day: f64) -> String {
    let tb = |b: f64| b / 1e12;
    if daily_capacity_bytes >= nominal_bytes_per_day {
        format!(
            "sustainable: {:.2} TB/day of capacity for {:.2} TB/day nominal ({:.1}× headroom)",
            tb(daily_capacity_bytes),
            tb(nominal_bytes_per_day),
            daily_capacity_bytes / nominal_bytes_per_day
        )
    } else {
        format!(
            "NOT sustainable: {:.2} TB/day of capacity for {:.2} TB/day nominal, short by {:.2} TB/day ({:.0} %)",
            tb(daily_capacity_bytes),
            tb(nominal_bytes_per_day),
            tb(nominal_bytes_per_day - daily_capacity_bytes),
            100.0 * (1.0 - daily_capacity_bytes / nominal_bytes_per_day)
        )
    }
}

fn seconds(us: i64) -> f64 {
    us as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: BatchKey, name: &str, bytes: i64, created: i64) -> BatchRow {
        BatchRow {
            role: key.role(),
            site: key.site().into(),
            batch_key: key,
            name: name.into(),
            state: forte_catalog::BatchState::Sent,
            files: 2,
            bytes,
            created_at: created,
            updated_at: created,
        }
    }

    fn stage(name: Stage, s: i64, e: i64) -> StageRow {
        StageRow {
            stage: name,
            started_at: s * 1_000_000,
            ended_at: Some(e * 1_000_000),
        }
    }

    #[test]
    fn latency_is_queueing_plus_processing_across_both_nodes() {
        let rows = vec![
            (
                row(BatchKey::edge("b1"), "A", 100_000_000, 0),
                vec![stage(Stage::Send, 2, 6)],
                vec![],
                vec![],
            ),
            (
                row(BatchKey::core("mine", "b1"), "", 40_000_000, 7_000_000),
                vec![stage(Stage::Pull, 7, 10)],
                vec![],
                vec![],
            ),
            (
                row(BatchKey::edge("b2"), "B", 50_000_000, 1_000_000),
                vec![stage(Stage::Send, 6, 8)],
                vec![],
                vec![],
            ),
        ];
        let kpis = batches(&rows);
        let a = &kpis[0];
        assert_eq!(a.latency_s, Some(10.0));
        assert_eq!(a.queueing_s, 2.0 + 1.0);
        assert_eq!(a.processing_s, 4.0 + 3.0);
        assert_eq!(a.rate_mb_s, Some(10.0));
        assert_eq!(a.queueing_share(), Some(0.3));
        // B is not delivered: no latency, and not counted in R_P.
        assert_eq!(kpis[1].latency_s, None);
        let run = run(&kpis).unwrap();
        assert_eq!((run.delivered, run.batches), (1, 2));
        assert_eq!(run.seconds, 8.0);
        assert_eq!(run.rate_mb_s, 12.5);
        assert_eq!(run.offered_bytes_per_day, 12.5e6 * 86_400.0);
        // Busy 2–6 s (send) and 7–10 s (pull): 7 of the 8 s.
        assert_eq!(run.busy_seconds, 7.0);
        assert_eq!(run.daily_capacity_bytes, 100e6 / 7.0 * 86_400.0);
        assert_eq!(run.compression_ratio, 2.5);
    }

    #[test]
    fn a_site_task_is_its_span_and_its_share_of_the_batch_latency() {
        // Pulled from 7 s to 10 s; inside it a per-file check ran on two files at once, 8–9 s,
        // one of them tried twice (its first try crashed), queued from 7.5 s.
        let core = BatchKey::core("mine", "b1");
        let run = |try_number: i64, queued: f64, started: f64, ended: f64| TaskRunRow {
            batch_key: core.clone(),
            task: "check".into(),
            object_id: Some("o".into()),
            try_number,
            queued_at: (queued * 1e6) as i64,
            started_at: (started * 1e6) as i64,
            ended_at: (ended * 1e6) as i64,
            outcome: forte_catalog::TaskOutcome::Passed,
            detail: None,
        };
        let rows = vec![
            (
                row(BatchKey::edge("b1"), "A", 100_000_000, 0),
                vec![stage(Stage::Send, 2, 6)],
                vec![],
                vec![],
            ),
            (
                row(core.clone(), "", 40_000_000, 7_000_000),
                vec![stage(Stage::Pull, 7, 10)],
                vec![
                    run(1, 7.5, 8.0, 8.5),
                    run(1, 7.5, 8.0, 8.2),
                    run(2, 8.2, 8.2, 9.0),
                ],
                vec![],
            ),
        ];
        let kpi = &batches(&rows)[0];
        assert_eq!(kpi.tasks.len(), 1);
        let check = &kpi.tasks[0];
        assert_eq!((check.task.as_str(), check.tries), ("check", 3));
        assert_eq!(check.role, Role::Core);
        assert_eq!((check.queueing_s(), check.processing_s()), (0.5, 1.0));
        // 1.5 s of the batch's 10 s.
        assert_eq!(check.share_of_latency, Some(0.15));
    }

    #[test]
    fn a_batch_delivered_by_a_puller_stopped_before_it_ended_the_stage_is_delivered() {
        // The puller recorded the batch delivered at 9 s and was killed before the pull
        // stage's end: the batch counts, to its delivery.
        let mut core = row(BatchKey::core("mine", "b1"), "", 40_000_000, 7_000_000);
        core.state = forte_catalog::BatchState::Delivered;
        core.updated_at = 9_000_000;
        let open = StageRow {
            stage: Stage::Pull,
            started_at: 7_000_000,
            ended_at: None,
        };
        let rows = vec![
            (
                row(BatchKey::edge("b1"), "A", 100_000_000, 0),
                vec![stage(Stage::Send, 2, 6)],
                vec![],
                vec![],
            ),
            (core.clone(), vec![open.clone()], vec![], vec![]),
        ];
        assert_eq!(batches(&rows)[0].latency_s, Some(9.0));
        // Still pulling: not delivered.
        core.state = forte_catalog::BatchState::Pulling;
        let rows = vec![rows[0].clone(), (core, vec![open], vec![], vec![])];
        assert_eq!(batches(&rows)[0].latency_s, None);
    }

    #[test]
    fn capacity_leaves_out_the_idle_time_between_batches() {
        // Two batches an hour apart, each sent in 2 s and pulled in 2 s.
        let batch = |id: &str, at: i64| {
            [
                (
                    row(BatchKey::edge(id), id, 100_000_000, at * 1_000_000),
                    vec![stage(Stage::Send, at, at + 2)],
                    vec![],
                    vec![],
                ),
                (
                    row(BatchKey::core("mine", id), "", 50_000_000, at * 1_000_000),
                    vec![stage(Stage::Pull, at + 2, at + 4)],
                    vec![],
                    vec![],
                ),
            ]
        };
        let rows: Vec<_> = batch("b1", 0)
            .into_iter()
            .chain(batch("b2", 3_600))
            .collect();
        let run = run(&batches(&rows)).unwrap();
        assert_eq!(run.busy_seconds, 8.0);
        assert_eq!(run.capacity_mb_s, 25.0, "200 MB in 8 busy seconds");
        assert_eq!(run.daily_capacity_bytes, 25e6 * 86_400.0);
        // The offered load is what came in that hour, stated apart.
        assert_eq!(run.seconds, 3_604.0);
        assert!((run.offered_bytes_per_day - 200e6 / 3_604.0 * 86_400.0).abs() < 1.0);
    }

    /// The operator's run: a batch sent in 2 s and pulled by 5 s, then a file found in it
    /// 8 minutes after it was sent, sent and pulled as a follow-up (the stages widened to
    /// 483 s and 484 s). The batch's KPIs and the run's are those of the first delivery, and
    /// the late file is reported on its own.
    #[test]
    fn a_follow_up_is_a_late_arrival_and_does_not_stretch_the_batch() {
        let rows = |send_end: i64, pull_end: i64, late: bool| {
            let follow_up =
                |key: BatchKey, done: f64, first: f64, delivered: Option<f64>| FollowUpRow {
                    batch_key: key,
                    object_id: "late".into(),
                    path: "bags/late.bag".into(),
                    size: 1_000_000,
                    batch_done_at: (done * 1e6) as i64,
                    first_at: (first * 1e6) as i64,
                    delivered_at: delivered.map(|d| (d * 1e6) as i64),
                    before_late: Some(5_000_000),
                };
            let (edge_late, core_late) = if late {
                (
                    vec![follow_up(BatchKey::edge("b1"), 2.0, 482.0, None)],
                    vec![follow_up(
                        BatchKey::core("mine", "b1"),
                        4.8,
                        483.5,
                        Some(483.6),
                    )],
                )
            } else {
                (vec![], vec![])
            };
            let extra = if late { 1_000_000 } else { 0 };
            vec![
                (
                    row(BatchKey::edge("b1"), "A", 100_000_000 + extra, 0),
                    vec![stage(Stage::Send, 0, send_end)],
                    vec![],
                    edge_late,
                ),
                (
                    row(BatchKey::core("mine", "b1"), "", 50_000_000, 3_000_000),
                    vec![stage(Stage::Pull, 3, pull_end)],
                    vec![],
                    core_late,
                ),
            ]
        };
        let alone = batches(&rows(2, 5, false));
        let followed = batches(&rows(483, 484, true));
        let b = &followed[0];
        assert_eq!(
            b.stages, alone[0].stages,
            "the follow-up stretched the stages"
        );
        assert_eq!((b.latency_s, b.rate_mb_s), (Some(5.0), Some(20.0)));
        assert_eq!((b.raw_bytes, b.files), (100_000_000, 1));
        assert_eq!(b.late.len(), 1);
        let late = &b.late[0];
        assert_eq!((late.after_sent_s, late.bytes), (480.0, 1_000_000));
        assert!((late.delivered_in_s.unwrap() - 1.6).abs() < 1e-9);
        assert_eq!(
            late.sentence("A"),
            "bags/late.bag of A arrived 480.0 s after its batch was sent, delivered in 1.6 s"
        );
        let (alone, followed) = (run(&alone).unwrap(), run(&followed).unwrap());
        assert_eq!(followed.daily_capacity_bytes, alone.daily_capacity_bytes);
        assert_eq!(followed.rate_mb_s, alone.rate_mb_s);
        assert_eq!((followed.late_files, followed.late_bytes), (1, 1_000_000));
    }

    /// A site's report keeps its core rows and the edge rows of the same batches, and no other
    /// site's; the edge row joins its core row whatever the order of the catalogues.
    #[test]
    fn a_sites_report_is_its_batches_from_both_nodes() {
        let records = |b: BatchRow| (b, vec![], vec![], vec![]);
        let rows = vec![
            records(row(BatchKey::core("a", "e1"), "run-1", 10, 1)),
            records(row(BatchKey::edge("e1"), "run-1", 10, 1)),
            records(row(BatchKey::edge("e2"), "run-2", 10, 2)),
            records(row(BatchKey::core("b", "e2"), "run-2", 10, 2)),
        ];
        let all = batches(&rows);
        let labels: Vec<String> = all.iter().map(BatchKpi::label).collect();
        assert_eq!(labels, ["a/run-1", "b/run-2"]);
        let of_a = of_site(rows, "a");
        assert_eq!(of_a.len(), 2);
        let labels: Vec<String> = batches(&of_a).iter().map(BatchKpi::label).collect();
        assert_eq!(labels, ["a/run-1"]);
    }

    #[test]
    fn verdict_says_by_how_much() {
        assert!(verdict(4e12, 3.36e12).starts_with("sustainable"));
        let short = verdict(2.16e12, 3.36e12);
        assert!(short.contains("short by 1.20 TB/day (36 %)"), "{short}");
    }
}
