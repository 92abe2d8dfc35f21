//! What the `send` and `pull` daemons show of themselves on `--http ADDR`: the dashboard and
//! JSON API (`forte-view`, over the daemon's catalogue and the live view below) and Prometheus
//! metrics at `GET /metrics` (the relay serves its own on its HTTPS port too).
//!
//! Names: `forte_stage_*{role,stage}` for each pipeline stage (queue depth, bytes and items
//! through it, busy seconds, service rate), read from the running pipelines at each scrape,
//! so a queue shows how full it is now and busy time grows while an item is worked on;
//! `forte_queue_*{role}` for the work admitted and not finished,
//! `forte_batches_total{role,outcome}`, `forte_failures_total{role}`,
//! `forte_retries_total{role,operation}`, the settings the send tunes (`forte_tuned_uploads`, with
//! `forte_upload_goodput_bytes_per_second`, from `edge::tuning`; `forte_zstd_level`), and with
//! `send --bwlimit` the limit in force, `forte_upload_limit_bytes_per_second{role="edge"}` (0:
//! none; set by `forte_relay::pace`).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use anyhow::{Context, Result};
use forte_catalog::{BatchKey, BatchState, Catalog, Role};
use forte_format::ObjectId;
use forte_pipeline::{Latencies, Pipeline, StageSnapshot};
use forte_prepare::Compressibility;
use forte_view::{QueueView, StageView, WireView};
use metrics::{counter, describe_counter, describe_gauge, gauge, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use parking_lot::Mutex;

use crate::retry::Operation;
use crate::settings::HttpServe;

/// How the dashboard counts a daemon's progress: in parts of this size (files, at the core),
/// with batches in the order the queue's policy serves them.
pub struct Progress {
    pub part_size: u64,
    pub order: forte_view::model::Order,
}

/// Starts `role`'s daemon's dashboard, JSON API and metrics on `addr` (a thread of its own),
/// reading `catalog` through a handle of its own, with every metric family described and every
/// counter whose labels are known in advance present from the start, at 0: an alert on a
/// counter's rate needs the series before the first event. The pipeline stages' families are
/// read at each scrape (see [`stage_families`]).
pub fn serve(http: HttpServe, role: Role, catalog: &Catalog, progress: Progress) -> Result<()> {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .context("cannot record metrics")?;
    let view = forte_view::View {
        server: match role {
            Role::Edge => forte_view::Server::Edge,
            Role::Core => forte_view::Server::Core,
        },
        catalogs: vec![catalog.reader()],
        live: Some(Box::new(Daemon { handle })),
        progress: forte_view::model::Progress::new(progress.part_size, progress.order),
    };
    let bound = forte_view::start(http.addr, http.access, view)?;
    describe();
    let outcomes: &[BatchState] = match role {
        Role::Edge => &[BatchState::Sent, BatchState::Failed],
        Role::Core => &[
            BatchState::Delivered,
            BatchState::Quarantined,
            BatchState::Failed,
        ],
    };
    for outcome in outcomes {
        let labels = [("role", role.as_str()), ("outcome", outcome.as_str())];
        counter!("forte_batches_total", &labels).absolute(0);
    }
    counter!("forte_failures_total", "role" => role.as_str()).absolute(0);
    for operation in Operation::ALL.into_iter().filter(|o| o.role() == role) {
        operation.retries().absolute(0);
    }
    queue(role, 0, 0, 0);
    println!("dashboard: http://{bound}/  metrics: http://{bound}/metrics");
    Ok(())
}

/// What a daemon shows of itself beside its catalogue: its stages and batch queue now, and
/// its metrics.
struct Daemon {
    handle: PrometheusHandle,
}

impl forte_view::Live for Daemon {
    fn stages(&self) -> Vec<StageView> {
        let mut running = vec![];
        if let Some(stages) = STAGES.lock().as_ref() {
            stages.add_running(&mut running);
        }
        running
            .into_iter()
            .map(|((role, stage), t)| StageView {
                role: Role::parse(role).expect("a role's own text"),
                stage,
                item: t.item,
                workers: t.workers,
                queue_depth: t.queue_depth,
                queue_capacity: t.queue_capacity,
                fill: if t.queue_capacity > 0 {
                    (t.queue_depth as f64 / t.queue_capacity as f64).min(1.0)
                } else {
                    0.0
                },
                items: t.items,
                bytes_in: t.bytes_in,
                bytes_out: t.bytes_out,
                busy_s: t.busy_seconds,
                service_rate_bytes_per_second: t.service_rate(),
            })
            .collect()
    }

    fn queue(&self) -> Option<QueueView> {
        *QUEUE.lock()
    }

    fn metrics(&self) -> Option<String> {
        let mut text = self.handle.render();
        text.push_str(&stage_families());
        text.push_str(&task_families());
        Some(text)
    }

    fn wire(&self) -> Option<WireView> {
        let wire = WIRE.lock();
        let wire = wire.as_ref()?;
        let mut view = wire.view.clone();
        view.waiting = wire
            .waiting
            .values()
            .map(|part| forte_view::WaitingPart {
                batch: part.batch.clone(),
                seq: part.seq,
                sealed: part.sealed,
                sending: part.sending,
            })
            .collect();
        view.waiting.sort_by_key(|part| part.seq);
        Some(view)
    }
}

/// The edge's sealed bytes sent and ready for the link (kept once a part is prepared).
static WIRE: Mutex<Option<Wire>> = Mutex::new(None);

#[derive(Default)]
struct Wire {
    view: WireView,
    /// The parts prepared and not yet sent.
    waiting: HashMap<(ObjectId, u32), Waiting>,
    /// The place in the prepare order the next part prepared takes.
    next_seq: u64,
    /// Per running batch: its objects' estimated compressed bytes per raw byte.
    estimates: HashMap<String, HashMap<ObjectId, f64>>,
}

/// A part prepared and not yet sent.
struct Waiting {
    batch: String,
    /// Its place in the prepare order.
    seq: u64,
    raw: u64,
    sealed: u64,
    /// While it is being uploaded: the bytes its connection has taken.
    sending: Option<u64>,
}

impl Wire {
    /// Takes a waiting part out of its batch's waiting bytes.
    fn unwait(&mut self, part: (ObjectId, u32)) {
        let Some(part) = self.waiting.remove(&part) else {
            return;
        };
        if let Some(batch) = self.view.batches.get_mut(&part.batch) {
            batch.waiting_raw = batch.waiting_raw.saturating_sub(part.raw);
        }
    }
}

/// Part `index` of object `id` of the edge's `batch` is sealed and waits for the link.
pub fn part_prepared(batch: &BatchKey, id: ObjectId, index: u32, raw: u64, sealed: u64) {
    let mut wire = WIRE.lock();
    let wire = wire.get_or_insert_with(Wire::default);
    // Prepared again (its file retried): counted once.
    wire.unwait((id, index));
    if wire.waiting.is_empty() {
        wire.view.resumed = Some((forte_catalog::now_us(), wire.view.sent));
    }
    let key = batch.to_string();
    let seq = wire.next_seq;
    wire.next_seq += 1;
    wire.view.prepared_raw += raw;
    wire.view.prepared_sealed += sealed;
    let estimate = wire
        .estimates
        .get(&key)
        .and_then(|objects| objects.get(&id))
        .map(|per_raw| (raw as f64 * per_raw) as u64);
    let mine = wire.view.batches.entry(key.clone()).or_default();
    mine.prepared_raw += raw;
    mine.prepared_sealed += sealed;
    mine.waiting_raw += raw;
    if let Some(estimate) = estimate {
        let left = &mut mine.estimated_left;
        *left = (left.0.saturating_sub(raw), left.1.saturating_sub(estimate));
        for prepared in [
            &mut mine.estimated_prepared,
            &mut wire.view.estimated_prepared,
        ] {
            *prepared = (prepared.0 + estimate, prepared.1 + sealed);
        }
    }
    wire.waiting.insert(
        (id, index),
        Waiting {
            batch: key,
            seq,
            raw,
            sealed,
            sending: None,
        },
    );
}

/// The edge's `batch` will prepare `objects`, estimated to compress so (see
/// [`forte_prepare::probe`]).
pub fn batch_probed(batch: &BatchKey, objects: &[Compressibility]) {
    if objects.is_empty() {
        return;
    }
    let mut wire = WIRE.lock();
    let wire = wire.get_or_insert_with(Wire::default);
    let key = batch.to_string();
    let raw = objects.iter().map(|o| o.raw).sum();
    let estimate = objects
        .iter()
        .map(|o| o.raw as f64 * o.per_raw)
        .sum::<f64>();
    let mine = wire.view.batches.entry(key.clone()).or_default();
    mine.estimated_left = (raw, estimate as u64);
    let per_raw = objects.iter().map(|o| (o.id, o.per_raw)).collect();
    wire.estimates.insert(key, per_raw);
}

/// An attempt to upload part `index` of object `id` begins.
pub fn part_sending(id: ObjectId, index: u32) {
    let mut wire = WIRE.lock();
    let Some(wire) = wire.as_mut() else { return };
    if let Some(part) = wire.waiting.get_mut(&(id, index)) {
        // A retried upload sends from the start again.
        part.sending = Some(0);
    }
}

/// The connection uploading part `index` of object `id` took `bytes` more of it (see
/// [`forte_relay::client::RelayClient::telling_sent`]).
pub fn part_sending_bytes(id: ObjectId, index: u32, bytes: u64) {
    let mut wire = WIRE.lock();
    let wire = wire.get_or_insert_with(Wire::default);
    wire.view.sent += bytes;
    if let Some(sending) = wire
        .waiting
        .get_mut(&(id, index))
        .and_then(|part| part.sending.as_mut())
    {
        *sending += bytes;
    }
}

/// Part `index` of object `id` is at the relay.
pub fn part_sent(id: ObjectId, index: u32) {
    let mut wire = WIRE.lock();
    let wire = wire.get_or_insert_with(Wire::default);
    wire.unwait((id, index));
}

/// The edge's `batch` ended: it has nothing more for the link.
pub fn batch_ended(batch: &BatchKey) {
    if let Some(wire) = WIRE.lock().as_mut() {
        let key = batch.to_string();
        wire.view.batches.remove(&key);
        wire.estimates.remove(&key);
        wire.waiting.retain(|_, part| part.batch != key);
    }
}

/// The batch queue as last published by [`queue`].
static QUEUE: Mutex<Option<QueueView>> = Mutex::new(None);

/// A stage of a role: (role, stage).
type StageKey = (&'static str, &'static str);

/// The pipelines running now, and the totals of those that ended, per role and stage.
#[derive(Default)]
struct Stages {
    running: Vec<(u64, Role, Pipeline)>,
    next: u64,
    ended: BTreeMap<StageKey, StageTotals>,
    /// Per role: the items' latencies and the pool workers replaced, of the pipelines that
    /// ended.
    ended_pools: BTreeMap<&'static str, (Latencies, u64)>,
}

impl Stages {
    /// Adds the running pipelines' stages, read now, to `totals`: pipelines of one role
    /// running at once add up stage by stage, and a stage not in `totals` yet comes after
    /// those that are, in pipeline order.
    fn add_running(&self, totals: &mut Vec<(StageKey, StageTotals)>) {
        for (_, role, pipeline) in &self.running {
            for st in pipeline.snapshot() {
                let key = (role.as_str(), st.name);
                let at = match totals.iter().position(|(k, _)| *k == key) {
                    Some(at) => at,
                    None => {
                        totals.push((key, StageTotals::default()));
                        totals.len() - 1
                    }
                };
                totals[at].1.add(&st, true);
            }
        }
    }

    /// Per role, of every pipeline, ended or running: the items' latencies and the pool
    /// workers replaced.
    fn pools(&self) -> BTreeMap<&'static str, (Latencies, u64)> {
        let mut pools: BTreeMap<&'static str, (Latencies, u64)> = BTreeMap::new();
        let ended = self.ended_pools.iter().map(|(r, (l, n))| (*r, l, *n));
        let running = self
            .running
            .iter()
            .map(|(_, role, p)| (role.as_str(), p.latencies(), p.workers_replaced()));
        for (role, latencies, replaced) in ended.chain(running) {
            let pool = pools.entry(role).or_default();
            pool.0.add(latencies);
            pool.1 += replaced;
        }
        pools
    }
}

/// What a stage did, summed over its pipelines.
#[derive(Default, Clone, Copy)]
struct StageTotals {
    /// What the stage's items are (`object`, `part`).
    item: &'static str,
    /// Of the running pipelines only: their workers and queues now.
    workers: usize,
    queue_depth: usize,
    queue_capacity: usize,
    items: u64,
    bytes_in: u64,
    bytes_out: u64,
    busy_seconds: f64,
}

impl StageTotals {
    fn add(&mut self, st: &StageSnapshot, running: bool) {
        self.item = st.item;
        if running {
            self.workers += st.workers;
            self.queue_depth += st.queue_depth;
            self.queue_capacity += st.queue_capacity;
        }
        self.items += st.items_in;
        self.bytes_in += st.bytes_in;
        self.bytes_out += st.bytes_out;
        self.busy_seconds += st.busy_seconds;
    }

    /// Input bytes per busy second of one worker.
    fn service_rate(&self) -> f64 {
        if self.busy_seconds > 0.0 {
            self.bytes_in as f64 / self.busy_seconds
        } else {
            0.0
        }
    }
}

static STAGES: Mutex<Option<Stages>> = Mutex::new(None);

/// A stage family: its name, type, help text, and its value of a stage's totals.
type StageFamily = (
    &'static str,
    &'static str,
    &'static str,
    fn(&StageTotals) -> f64,
);

/// The stages' families in Prometheus' text format, read now: queue depths as they are, and
/// busy time with the work under way (in seconds).
fn stage_families() -> String {
    let mut totals = vec![];
    let mut pools = BTreeMap::new();
    if let Some(stages) = STAGES.lock().as_ref() {
        totals.extend(stages.ended.iter().map(|(key, t)| (*key, *t)));
        stages.add_running(&mut totals);
        pools = stages.pools();
    }
    let families: [StageFamily; 6] = [
        (
            "forte_stage_queue_depth",
            "gauge",
            "Items waiting in a pipeline stage's input queue",
            |t| t.queue_depth as f64,
        ),
        (
            "forte_stage_items_total",
            "counter",
            "Items that entered a pipeline stage, in the unit its label item says (object: a file or a bundle; part)",
            |t| t.items as f64,
        ),
        (
            "forte_stage_bytes_in_total",
            "counter",
            "Bytes that entered a pipeline stage",
            |t| t.bytes_in as f64,
        ),
        (
            "forte_stage_bytes_out_total",
            "counter",
            "Bytes a pipeline stage passed on",
            |t| t.bytes_out as f64,
        ),
        (
            "forte_stage_busy_seconds_total",
            "counter",
            "Time a stage's workers spent on items, summed over workers, work under way included",
            |t| t.busy_seconds,
        ),
        (
            "forte_stage_service_rate_bytes_per_second",
            "gauge",
            "Input bytes a stage handles per busy second of one worker",
            StageTotals::service_rate,
        ),
    ];
    let mut text = String::new();
    for (name, kind, help, value) in families {
        if totals.is_empty() {
            break;
        }
        text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for ((role, stage), t) in &totals {
            // The items' unit goes with their count.
            let item = match name {
                "forte_stage_items_total" => format!(",item=\"{}\"", t.item),
                _ => String::new(),
            };
            text.push_str(&format!(
                "{name}{{role=\"{role}\",stage=\"{stage}\"{item}}} {}\n",
                value(t)
            ));
        }
    }
    pool_families(&pools, &mut text);
    text
}

/// The latency from read to sink of every part of `role`'s pipelines in this process so far.
pub fn item_latency(role: Role) -> forte_catalog::ItemLatency {
    let pools = STAGES
        .lock()
        .as_ref()
        .map(Stages::pools)
        .unwrap_or_default();
    pools
        .get(role.as_str())
        .map_or_else(Default::default, |(latencies, _)| {
            let l = latencies.snapshot();
            forte_catalog::ItemLatency {
                items: l.items as i64,
                p50_ms: l.p50_ms,
                p87_ms: l.p87_ms,
                p99_ms: l.p99_ms,
            }
        })
}

/// The items' latency from read to sink (a summary: p50, p87, p99) and the pool workers
/// replaced, per role.
fn pool_families(pools: &BTreeMap<&'static str, (Latencies, u64)>, text: &mut String) {
    if pools.is_empty() {
        return;
    }
    let name = "forte_item_latency_seconds";
    text.push_str(&format!(
        "# HELP {name} Time from an item's (a part's) read to the sink taking it\n# TYPE {name} summary\n"
    ));
    for (role, (latencies, _)) in pools {
        let l = latencies.snapshot();
        for (quantile, ms) in [("0.5", l.p50_ms), ("0.87", l.p87_ms), ("0.99", l.p99_ms)] {
            let seconds = ms / 1e3;
            text.push_str(&format!(
                "{name}{{role=\"{role}\",quantile=\"{quantile}\"}} {seconds}\n"
            ));
        }
        text.push_str(&format!(
            "{name}_sum{{role=\"{role}\"}} {}\n",
            l.sum_seconds
        ));
        text.push_str(&format!("{name}_count{{role=\"{role}\"}} {}\n", l.items));
    }
    let name = "forte_pool_workers_replaced_total";
    text.push_str(&format!(
        "# HELP {name} Pool workers that died (a panic in a stage) and were replaced\n# TYPE {name} counter\n"
    ));
    for (role, (_, replaced)) in pools {
        text.push_str(&format!("{name}{{role=\"{role}\"}} {replaced}\n"));
    }
}

/// The `# HELP` text and unit of every family the send and pull daemons publish.
fn describe() {
    describe_gauge!(
        "forte_queue_batches",
        Unit::Count,
        "Batches admitted and not finished"
    );
    describe_gauge!(
        "forte_queue_files",
        Unit::Count,
        "Files of admitted batches not finished"
    );
    describe_gauge!(
        "forte_queue_bytes",
        Unit::Bytes,
        "Bytes of admitted batches not finished"
    );
    describe_counter!(
        "forte_batches_total",
        Unit::Count,
        "Batches that ended, by outcome"
    );
    describe_counter!(
        "forte_failures_total",
        Unit::Count,
        "Failures reported (each also a failure event in the catalogue and the log)"
    );
    describe_counter!(
        "forte_retries_total",
        Unit::Count,
        "Requests to the relay tried again after a transient failure, by operation"
    );
    describe_gauge!(
        "forte_tuned_uploads",
        Unit::Count,
        "Uploads in flight the sender's tuner chose"
    );
    describe_gauge!(
        "forte_upload_goodput_bytes_per_second",
        "Sealed bytes the relay acknowledged per second, as the tuner measured them"
    );
    describe_gauge!(
        "forte_upload_limit_bytes_per_second",
        "The upload limit in force (--bwlimit or the relay's share; 0: none)"
    );
    describe_gauge!(
        "forte_zstd_level",
        Unit::Count,
        "The zstd level parts are compressed at now"
    );
}

/// Runs `work` while `pipeline`'s stages are read at each scrape, and `also` publishes once
/// a second (and once more at the end). What the pipeline did stays counted after it ends.
pub fn while_running<R>(
    role: Role,
    pipeline: &Pipeline,
    also: impl Fn() + Sync,
    work: impl FnOnce() -> R,
) -> R {
    let id = {
        let mut stages = STAGES.lock();
        let stages = stages.get_or_insert_with(Stages::default);
        stages.next += 1;
        stages.running.push((stages.next, role, pipeline.clone()));
        stages.next
    };
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let result = std::thread::scope(|s| {
        let also = &also;
        s.spawn(move || loop {
            let last = finished.recv_timeout(Duration::from_secs(1))
                != Err(std::sync::mpsc::RecvTimeoutError::Timeout);
            also();
            if last {
                break;
            }
        });
        let result = work();
        drop(done);
        result
    });
    let mut stages = STAGES.lock();
    let stages = stages.get_or_insert_with(Stages::default);
    stages.running.retain(|(running, _, _)| *running != id);
    for st in pipeline.snapshot() {
        let key = (role.as_str(), st.name);
        stages.ended.entry(key).or_default().add(&st, false);
    }
    let pool = stages.ended_pools.entry(role.as_str()).or_default();
    pool.0.add(pipeline.latencies());
    pool.1 += pipeline.workers_replaced();
    result
}

/// The batch queue of `role`: batches in flight, files and bytes waiting.
pub fn queue(role: Role, batches: usize, files: usize, bytes: u64) {
    *QUEUE.lock() = Some(QueueView {
        role,
        batches,
        files,
        bytes,
    });
    let role = role.as_str();
    gauge!("forte_queue_batches", "role" => role).set(batches as f64);
    gauge!("forte_queue_files", "role" => role).set(files as f64);
    gauge!("forte_queue_bytes", "role" => role).set(bytes as f64);
}

/// The zstd level parts are compressed at now (`--level auto` turns it).
pub fn zstd_level(level: i32) {
    gauge!("forte_zstd_level", "role" => "edge").set(f64::from(level));
}

/// A batch ended: `outcome` is `sent`, `delivered` or `failed`.
pub fn batch_done(role: Role, outcome: BatchState) {
    counter!("forte_batches_total", "role" => role.as_str(), "outcome" => outcome.as_str())
        .increment(1);
}

/// A try of the site's task `task` ended with `outcome`, after waiting `queued` seconds for a
/// slot and running `busy`.
pub fn task_try(task: &str, outcome: forte_catalog::TaskOutcome, queued: f64, busy: f64) {
    let mut tasks = TASKS.lock();
    let totals = tasks.entry(task.to_owned()).or_default();
    *totals.tries.entry(outcome.as_str()).or_default() += 1;
    totals.queued_seconds += queued.max(0.0);
    totals.busy_seconds += busy.max(0.0);
}

/// Per site task: its tries by outcome, and the seconds they waited for a slot and ran.
#[derive(Default)]
struct TaskTotals {
    tries: BTreeMap<&'static str, u64>,
    queued_seconds: f64,
    busy_seconds: f64,
}

static TASKS: Mutex<BTreeMap<String, TaskTotals>> = Mutex::new(BTreeMap::new());

/// A task family: its name, help text, and its value of a task's totals.
type TaskFamily = (&'static str, &'static str, fn(&TaskTotals) -> f64);

/// The site's tasks' families in Prometheus' text format (seconds are fractional, which the
/// metrics crate's counters are not).
fn task_families() -> String {
    let tasks = TASKS.lock();
    if tasks.is_empty() {
        return String::new();
    }
    let mut text = String::new();
    let name = "forte_task_tries_total";
    let help = "Tries of the site's own tasks ([[task]]), by outcome";
    text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
    for (task, t) in tasks.iter() {
        for (outcome, n) in &t.tries {
            text.push_str(&format!(
                "{name}{{task=\"{task}\",outcome=\"{outcome}\"}} {n}\n"
            ));
        }
    }
    let seconds: [TaskFamily; 2] = [
        (
            "forte_task_queue_seconds_total",
            "Time the tries of a site's own task waited for one of its slots",
            |t| t.queued_seconds,
        ),
        (
            "forte_task_busy_seconds_total",
            "Time the tries of a site's own task ran",
            |t| t.busy_seconds,
        ),
    ];
    for (name, help, value) in seconds {
        text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
        for (task, t) in tasks.iter() {
            text.push_str(&format!("{name}{{task=\"{task}\"}} {}\n", value(t)));
        }
    }
    text
}

pub fn failure(role: Role) {
    counter!("forte_failures_total", "role" => role.as_str()).increment(1);
}
