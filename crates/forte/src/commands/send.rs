//! `forte send`: the ready batches of an inbox, prepared and uploaded to the relay in one
//! streaming pass, in the order of the queue policy, each sealed at the relay as soon as its
//! last file is.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use forte_format::{EdgeKey, Inventory, InventoryEntry, ObjectId, Recipients};
use forte_prepare::{
    discover, FileOutcome, JobQueue, Prepare, PrepareConfig, PrepareJob, SourceFile,
};
use forte_relay::client::RelayClient;
use serde::Serialize;

use super::pack::{prepare_with_progress, PrepareArgs, SealArgs};
use super::{mb_per_s, Daemon, Output};
use crate::config::Config;
use crate::hook::Failures;
use crate::record::{note, Catalog};
use crate::schedule::{BatchQueue, Policy, ScheduleArgs};
use crate::transfer::retry::Retry;
use crate::transfer::upload::{at_relay, AtRelay, UploadSink};
use crate::transfer::{connect, RelayArgs};
use crate::units::human;
use forte_catalog::{
    now_us, BatchKey, BatchRecord, BatchState, FileRecord, FileState, Role, Stage,
};

/// The marker file that declares a batch complete without waiting for it to settle.
pub const READY_MARKER: &str = ".ready";

#[derive(clap::Args)]
pub struct Args {
    /// Inbox directory: each subdirectory is one batch.
    inbox: PathBuf,
    #[command(flatten)]
    relay: RelayArgs,
    #[command(flatten)]
    seal: SealArgs,
    #[command(flatten)]
    prepare: PrepareArgs,
    /// Seconds without any change after which a batch without a .ready marker is complete.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    settle: u64,
    /// Concurrent uploads to the relay.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// With --watch: delete a batch's source files once the core acknowledged every one.
    #[arg(long, requires = "watch")]
    delete_after_ack: bool,
    /// Cancel this batch (a directory name of the inbox; repeatable) instead of sending: the
    /// relay deletes what it holds of it that the core has not taken, so the core never gets
    /// it, and later runs skip it. The source is untouched; touch its .ready marker to send it
    /// again. For a batch too large for the relay, or sent by mistake.
    #[arg(long, value_name = "BATCH", conflicts_with_all = ["watch", "delete_after_ack"])]
    cancel: Vec<String>,
    #[command(flatten)]
    schedule: ScheduleArgs,
    #[command(flatten)]
    daemon: Daemon,
    #[command(flatten)]
    output: Output,
}

/// What happened to one batch.
#[derive(Debug, Serialize)]
pub struct BatchReport {
    pub batch: String,
    pub files: usize,
    pub sent: usize,
    /// Sealed at the relay or delivered by an earlier run: nothing to send.
    pub already_at_relay: usize,
    pub failed: usize,
    pub raw_bytes: u64,
    pub sealed_bytes: u64,
    pub seconds: f64,
    pub errors: Vec<String>,
}

#[derive(Serialize)]
struct Summary {
    command: &'static str,
    batches: Vec<BatchReport>,
    waiting: Vec<String>,
}

pub fn run(args: Args, config: &Config, catalog: &Catalog) -> Result<bool> {
    let endpoint = args.relay.endpoint(config)?;
    let _usage = crate::record::sample_usage(catalog, Role::Edge);
    let client = connect(&endpoint, &args.relay)?;
    let (recipients, key) = args.seal.load(config)?;
    let mut settings = args.prepare.settings(config)?;
    settings.sink_workers = args.connections.max(1);
    let policy = args.schedule.policy(&config.schedule)?;
    let edge = Edge {
        client: &client,
        key: &key,
        recipients: &recipients,
        retry: if args.daemon.watch {
            Retry::forever()
        } else {
            Retry::one_shot()
        },
        catalog,
        queue: BatchQueue::new(policy.clone()),
        policy,
        failures: Failures {
            role: Role::Edge,
            command: args.daemon.on_failure.clone(),
        },
        print_each: args.daemon.watch,
        batch_of: Mutex::default(),
        in_flight: Mutex::default(),
        finished: Mutex::default(),
    };
    if !args.cancel.is_empty() {
        return edge.cancel(&args.inbox, &args.cancel);
    }
    if let Some(addr) = args.daemon.metrics {
        crate::monitor::serve(addr)?;
    }
    let settle = Duration::from_secs(args.settle);
    if !args.daemon.watch {
        let started = Instant::now();
        let Inbox { mut ready, waiting } = ready_batches(&args.inbox, settle)?;
        ready.retain(|b| {
            let skip = edge.cancelled(b);
            if skip {
                println!(
                    "batch {}: cancelled; touch its {READY_MARKER} marker to send it again",
                    b.name
                );
            }
            !skip
        });
        edge.admit(&ready);
        edge.queue.close();
        let quiet = args.output.quiet || args.output.json;
        edge.send_queued(&settings, &recipients, quiet);
        let mut batches = edge
            .finished
            .into_inner()
            .unwrap_or_else(|e| e.into_inner());
        // Report in inbox order, whatever order the policy finished them in.
        batches.sort_by(|a, b| a.batch.cmp(&b.batch));
        if !args.output.json {
            batches.iter().for_each(print_report);
            let seconds = started.elapsed().as_secs_f64();
            let raw: u64 = batches.iter().map(|b| b.raw_bytes).sum();
            let sealed: u64 = batches.iter().map(|b| b.sealed_bytes).sum();
            println!(
                "sent {} batches: {} raw as {} sealed in {seconds:.1} s ({:.1} MB/s raw)",
                batches.len(),
                human(raw),
                human(sealed),
                mb_per_s(raw, seconds)
            );
            for name in &waiting {
                println!("batch {name}: not ready (changed in the last {} s and no {READY_MARKER} marker)", args.settle);
            }
        }
        let ok = batches.iter().all(|b| b.failed == 0);
        if args.output.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&Summary {
                    command: "send",
                    batches,
                    waiting
                })?
            );
        }
        return Ok(ok);
    }
    println!(
        "watching {} every {} s (Ctrl-C stops; a restart resumes where this left off)",
        args.inbox.display(),
        args.daemon.interval
    );
    let interval = Duration::from_secs(args.daemon.interval);
    std::thread::scope(|s| {
        let edge = &edge;
        let inbox = &args.inbox;
        s.spawn(move || loop {
            match ready_batches(inbox, settle) {
                Ok(found) => {
                    let todo: Vec<Batch> = found
                        .ready
                        .into_iter()
                        .filter(|b| edge.needs_sending(b))
                        .collect();
                    edge.admit(&todo);
                }
                Err(e) => edge.failures.report("", None, &format!("{e:#}")),
            }
            if args.delete_after_ack {
                edge.delete_acknowledged(inbox);
            }
            lock(&edge.finished).clear();
            std::thread::sleep(interval);
        });
        // The queue never closes: a pass ends only when a failure stops it, and then its
        // unfinished batches are admitted again by the next scan.
        loop {
            edge.send_queued(&settings, &recipients, true);
            std::thread::sleep(interval);
        }
    })
}

fn print_report(report: &BatchReport) {
    println!(
        "batch {}: sent {} of {} files ({} sent before, {} failed), {} raw as {} sealed",
        report.batch,
        report.sent,
        report.files,
        report.already_at_relay,
        report.failed,
        human(report.raw_bytes),
        human(report.sealed_bytes),
    );
    // Failures were logged as they happened (one JSON line each, `Failures::report`); only
    // the skipped files, which are not failures of the transfer, are listed here.
    for e in report.errors.iter().filter(|e| e.starts_with("skipped ")) {
        eprintln!("batch {}: {e}", report.batch);
    }
}

/// A batch directory of the inbox.
pub struct Batch {
    pub name: String,
    pub dir: PathBuf,
}

/// The inbox at one moment: batches ready to send, and names of those still changing.
#[derive(Default)]
pub struct Inbox {
    pub ready: Vec<Batch>,
    pub waiting: Vec<String>,
}

/// Batches (subdirectories of the inbox, except hidden ones) that are complete: marked ready, or unchanged for
/// `settle`. Returns them in name order, and the names of those still changing.
pub fn ready_batches(inbox: &Path, settle: Duration) -> Result<Inbox> {
    let mut entries: Vec<_> = std::fs::read_dir(inbox)
        .with_context(|| format!("cannot list inbox {}", inbox.display()))?
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("cannot list inbox {}", inbox.display()))?;
    entries.sort_by_key(|e| e.file_name());
    let mut inbox = Inbox::default();
    for entry in entries {
        let dir = entry.path();
        if !entry.file_type()?.is_dir() {
            continue;
        }
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            eprintln!("skipping {}: batch names must be UTF-8", dir.display());
            continue;
        };
        // Hidden directories are where tools (forte ingest among them) write before they
        // rename a finished batch into place.
        if name.starts_with('.') {
            continue;
        }
        let quiet_since = newest_change(&dir)?
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .unwrap_or(Duration::MAX);
        if dir.join(READY_MARKER).exists() || quiet_since >= settle {
            inbox.ready.push(Batch { name, dir });
        } else {
            inbox.waiting.push(name);
        }
    }
    Ok(inbox)
}

fn newest_change(dir: &Path) -> Result<Option<SystemTime>> {
    let mut newest = std::fs::symlink_metadata(dir)?.modified().ok();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        let t = if meta.is_dir() {
            newest_change(&entry.path())?
        } else {
            meta.modified().ok()
        };
        newest = newest.max(t);
    }
    Ok(newest)
}

/// The object id of a file: derived from the edge's secret and the file's identity, so a
/// second run finds what the first one left at the relay.
fn object_id(key: &EdgeKey, batch: &str, file: &SourceFile) -> ObjectId {
    ObjectId::derive(
        key.0.as_bytes(),
        &[
            b"object",
            batch.as_bytes(),
            file.path.as_bytes(),
            &file.size.to_be_bytes(),
            &file.mtime_s.to_be_bytes(),
            &file.mtime_ns.to_be_bytes(),
        ],
    )
}

/// The batch's key: its id, which is what the relay sees (opaque, stable across runs).
fn batch_id(key: &EdgeKey, batch: &str) -> BatchKey {
    BatchKey::edge(ObjectId::derive(key.0.as_bytes(), &[b"batch", batch.as_bytes()]).to_string())
}

/// A batch between its admission to the queue and its seal at the relay.
struct InFlight {
    report: BatchReport,
    name: String,
    /// Raw bytes of every file of the batch, as discovered (sent now, before, or not at all).
    bytes: u64,
    /// Every object of the batch not yet delivered, sent now or before: the batch's seal
    /// lists them all.
    members: Vec<ObjectId>,
    /// The inventory entry of each member stored at the relay so far (sealed by an earlier
    /// run, or sent by this one): the batch is sealed with the signed list of exactly these.
    entries: Vec<InventoryEntry>,
    /// Files handed to the prepare pass or still queued, not yet finished.
    pending: usize,
    admitted: Instant,
    /// When its first file left the queue.
    started_at: Option<i64>,
}

/// What every batch of a `send` run shares: the relay, the queue and the batches in flight.
/// Batches are admitted while earlier ones are being sent, the queue's policy decides which
/// file goes next, and each batch is sealed at the relay the moment its last file is.
struct Edge<'a> {
    client: &'a RelayClient,
    key: &'a EdgeKey,
    /// The core's keys, to which each batch's inventory is encrypted.
    recipients: &'a Recipients,
    retry: Retry,
    catalog: &'a Catalog,
    policy: Policy,
    failures: Failures,
    /// Print each batch's report as it finishes (daemon mode).
    print_each: bool,
    queue: BatchQueue<PrepareJob>,
    batch_of: Mutex<HashMap<ObjectId, BatchKey>>,
    in_flight: Mutex<HashMap<BatchKey, InFlight>>,
    finished: Mutex<Vec<BatchReport>>,
}

impl JobQueue for Edge<'_> {
    fn next(&self) -> Option<PrepareJob> {
        let job = self.queue.next()?;
        let key = batch_id(self.key, &job.batch);
        let mut flights = lock(&self.in_flight);
        if let Some(flight) = flights.get_mut(&key).filter(|f| f.started_at.is_none()) {
            let now = now_us();
            flight.started_at = Some(now);
            let (files, bytes) = (flight.report.files as u64, flight.bytes);
            self.record_batch(&key, &flight.name, files, bytes, BatchState::Sending);
            note("a stage", self.catalog.stage(&key, Stage::Send, now, None));
        }
        Some(job)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Edge<'_> {
    /// Records a batch's state and totals (the batch's, not this run's).
    fn record_batch(&self, key: &BatchKey, name: &str, files: u64, bytes: u64, state: BatchState) {
        let record = BatchRecord {
            key,
            name,
            files,
            bytes,
            state,
        };
        note("a batch", self.catalog.batch_state(&record));
    }

    /// Queues every batch not already in flight: discovers its files, asks the relay what it
    /// holds, and records the batch as queued (its arrival). A batch with nothing left to send
    /// is finished at once.
    fn admit(&self, batches: &[Batch]) {
        let (catalog, key) = (self.catalog, self.key);
        for Batch { name, dir } in batches {
            let batch_key = batch_id(key, name);
            if lock(&self.in_flight).contains_key(&batch_key) {
                continue;
            }
            let admitted = Instant::now();
            let mut flight = InFlight {
                report: BatchReport {
                    batch: name.clone(),
                    files: 0,
                    sent: 0,
                    already_at_relay: 0,
                    failed: 0,
                    raw_bytes: 0,
                    sealed_bytes: 0,
                    seconds: 0.0,
                    errors: Vec::new(),
                },
                name: name.clone(),
                bytes: 0,
                members: Vec::new(),
                entries: Vec::new(),
                pending: 0,
                admitted,
                started_at: None,
            };
            let mut jobs = Vec::new();
            match discover(dir) {
                Ok(mut found) => {
                    found.files.retain(|f| f.path != READY_MARKER);
                    let report = &mut flight.report;
                    report.files = found.files.len();
                    let (files, bytes) = (found.files.len() as u64, found.total_bytes());
                    flight.bytes = bytes;
                    self.record_batch(&batch_key, name, files, bytes, BatchState::Queued);
                    report.errors.extend(
                        found
                            .rejected
                            .iter()
                            .map(|(p, why)| format!("skipped {}: {why}", p.display())),
                    );
                    let ids: Vec<ObjectId> = found
                        .files
                        .iter()
                        .map(|f| object_id(key, name, f))
                        .collect();
                    let mut at = match at_relay(self.client, &self.retry, &ids) {
                        Ok(at) => at,
                        Err(e) => {
                            let error = format!("cannot ask the relay what it holds: {e:#}");
                            self.failures.report(name, None, &error);
                            report.errors.push(error);
                            report.failed += found.files.len();
                            Default::default()
                        }
                    };
                    // What this catalogue already knows of the batch's files (from earlier
                    // runs), so that what a re-run learns is recorded once.
                    let known: HashMap<String, forte_catalog::FileRow> = catalog
                        .files(&batch_key)
                        .map(|files| {
                            files
                                .into_iter()
                                .map(|f| (f.object_id.clone(), f))
                                .collect()
                        })
                        .unwrap_or_default();
                    for (source, id) in found.files.into_iter().zip(ids) {
                        let object = id.to_string();
                        let record = |state: FileState, detail: Option<&str>| {
                            let (path, size) = (&source.path, source.size);
                            let file = FileRecord::new(&batch_key, &object, path, size, state);
                            note("a file", catalog.file_state(&FileRecord { detail, ..file }));
                        };
                        record(FileState::Discovered, None);
                        let held = match at.remove(&id) {
                            Some(AtRelay::Delivered) => {
                                // The relay reports it delivered: the core acknowledged it.
                                if known.get(&object).map(|f| f.state)
                                    != Some(FileState::Acknowledged)
                                {
                                    record(
                                        FileState::Acknowledged,
                                        Some("the relay reports it acknowledged by the core"),
                                    );
                                }
                                report.already_at_relay += 1;
                                continue;
                            }
                            Some(AtRelay::Sealed) => {
                                record(FileState::AtRelay, Some("sealed by an earlier run"));
                                report.already_at_relay += 1;
                                flight.members.push(id);
                                let recorded =
                                    known.get(&object).and_then(|f| f.raw_sha256.clone());
                                match sealed_entry(&source, id, recorded) {
                                    Ok(entry) => flight.entries.push(entry),
                                    Err(e) => {
                                        let error = format!("{e:#}");
                                        self.failures.report(name, Some(&source.path), &error);
                                        report.errors.push(error);
                                        report.failed += 1;
                                    }
                                }
                                continue;
                            }
                            Some(AtRelay::Nothing) => Default::default(),
                            Some(AtRelay::Parts(held)) => held,
                            // The relay could not be asked: already counted as failed above.
                            None => continue,
                        };
                        lock(&self.batch_of).insert(id, batch_key.clone());
                        flight.members.push(id);
                        let size = source.size;
                        jobs.push((
                            PrepareJob {
                                source,
                                id,
                                batch: name.clone(),
                                held,
                            },
                            size,
                        ));
                    }
                }
                Err(e) => {
                    let error = format!("{e:#}");
                    self.failures.report(name, None, &error);
                    flight.report.errors.push(error);
                    flight.report.failed += 1;
                }
            }
            flight.pending = jobs.len();
            if jobs.is_empty() {
                self.finish(&batch_key, flight);
                continue;
            }
            let priority = self.policy.priority_of(name, Some(&dir.join(READY_MARKER)));
            lock(&self.in_flight).insert(batch_key, flight);
            self.queue.admit(admitted, priority, jobs);
        }
    }

    /// Books one finished file (sent or failed) to its batch, and finishes the batch when it
    /// was the last.
    fn file_done(&self, outcome: &FileOutcome, sealed_bytes: u64) {
        let Some(batch_key) = lock(&self.batch_of).remove(&outcome.id) else {
            return;
        };
        let mut flights = lock(&self.in_flight);
        let Some(flight) = flights.get_mut(&batch_key) else {
            return;
        };
        let report = &mut flight.report;
        report.sealed_bytes += sealed_bytes;
        match &outcome.error {
            None => {
                report.sent += 1;
                report.raw_bytes += outcome.size;
                flight.entries.extend(outcome.inventory_entry());
            }
            Some(e) => {
                self.failures.report(&report.batch, Some(&outcome.path), e);
                let object = outcome.id.to_string();
                let (path, size) = (&outcome.path, outcome.size);
                let file = FileRecord::new(&batch_key, &object, path, size, FileState::Failed);
                let file = FileRecord {
                    detail: Some(e),
                    ..file
                };
                note("a failed file", self.catalog.file_state(&file));
                report.errors.push(format!("{}: {e}", outcome.path));
                report.failed += 1;
            }
        }
        flight.pending -= 1;
        if flight.pending == 0 {
            let flight = flights.remove(&batch_key).expect("looked up above");
            drop(flights);
            self.finish(&batch_key, flight);
        }
    }

    /// Seals a batch whose every file is at the relay (only a whole batch is offered to the
    /// core) and records how it ended.
    fn finish(&self, batch_key: &BatchKey, flight: InFlight) {
        let InFlight {
            mut report,
            bytes,
            members,
            entries,
            admitted,
            started_at,
            ..
        } = flight;
        report.seconds = admitted.elapsed().as_secs_f64();
        // A batch whose every object was delivered before has nothing left to offer.
        if report.failed == 0 && !members.is_empty() {
            let inventory = Inventory::new(&report.batch, entries);
            debug_assert_eq!(inventory.objects.len(), members.len());
            let sealed = inventory.seal(self.key, self.recipients);
            let what = format!("seal of batch {}", report.batch);
            if let Err(e) = self.retry.run(&what, || {
                self.client.seal_batch(batch_key.batch(), &members, &sealed)
            }) {
                let error = format!("cannot seal the batch at the relay: {e}");
                self.failures.report(&report.batch, None, &error);
                report.errors.push(error);
                report.failed += 1;
            }
        }
        let state = if report.failed == 0 {
            BatchState::Sent
        } else {
            BatchState::Failed
        };
        crate::monitor::batch_done(Role::Edge, state);
        // The batch's totals, not this run's: a re-run that finds its files at the relay
        // sends none of them, and the batch is no smaller for it.
        self.record_batch(batch_key, &report.batch, report.files as u64, bytes, state);
        // Only a run that sent files did the send stage: one that found them all at the relay
        // leaves the stage as the run that sent them recorded it.
        if let Some(started_at) = started_at {
            note(
                "a stage",
                self.catalog
                    .stage(batch_key, Stage::Send, started_at, Some(now_us())),
            );
        }
        if self.print_each {
            print_report(&report);
        }
        lock(&self.finished).push(report);
    }

    /// After a prepare pass ended early (a sink failure stops it): every batch still queued
    /// or unfinished fails, to be admitted again by a later scan or run.
    fn abandon_unfinished(&self) {
        while let Some(job) = self.queue.take_any() {
            lock(&self.batch_of).remove(&job.id);
        }
        let flights: Vec<(BatchKey, InFlight)> = lock(&self.in_flight).drain().collect();
        for (key, mut flight) in flights {
            let error = format!(
                "{} files not sent: an earlier failure stopped the pass",
                flight.pending
            );
            flight.report.failed += flight.pending;
            self.failures.report(&flight.report.batch, None, &error);
            flight.report.errors.push(error);
            self.finish(&key, flight);
        }
    }

    /// Sends until the queue is closed and empty, each batch sealed as it completes.
    fn send_queued(&self, settings: &PrepareConfig, recipients: &Recipients, quiet: bool) {
        let prepare = Prepare::new(settings.clone(), recipients, self.key);
        let sink = UploadSink {
            client: self.client,
            batch_of: &self.batch_of,
            retry: self.retry,
            catalog: self.catalog,
            sealed: Default::default(),
            on_done: &|outcome, sealed| self.file_done(outcome, sealed),
        };
        let (files, bytes) = self.queue.totals();
        let publish_queue = || {
            let (files, bytes) = self.queue.totals();
            crate::monitor::queue(Role::Edge, lock(&self.in_flight).len(), files, bytes);
        };
        crate::monitor::while_running(Role::Edge, &prepare.pipeline, publish_queue, || {
            prepare_with_progress(&prepare, files, bytes, quiet, || {
                prepare.run_from(self, &sink)
            })
        });
        self.abandon_unfinished();
    }

    /// Whether a ready batch has anything to send: it was never sent, its last send failed, or
    /// files appeared in it after it was sent (they go as a follow-up, sealed into the same
    /// batch). Said once per batch and scan when it is a follow-up.
    fn needs_sending(&self, batch: &Batch) -> bool {
        let batch_key = batch_id(self.key, &batch.name);
        if self.cancelled(batch) {
            return false;
        }
        let state = self
            .catalog
            .batch(&batch_key)
            .ok()
            .flatten()
            .map(|b| b.state);
        if !matches!(
            state,
            Some(BatchState::Sent | BatchState::SourceKept | BatchState::SourceDeleted)
        ) {
            return true;
        }
        let Ok(found) = discover(&batch.dir) else {
            return false;
        };
        let known: std::collections::HashSet<String> = self
            .catalog
            .files(&batch_key)
            .map(|files| files.into_iter().map(|f| f.object_id).collect())
            .unwrap_or_default();
        let late: Vec<&str> = found
            .files
            .iter()
            .filter(|f| f.path != READY_MARKER)
            .filter(|f| !known.contains(&object_id(self.key, &batch.name, f).to_string()))
            .map(|f| f.path.as_str())
            .collect();
        if late.is_empty() {
            return false;
        }
        println!(
            "batch {}: {} file(s) appeared or changed after it was sent ({}); sending them as a follow-up",
            batch.name,
            late.len(),
            late.join(", ")
        );
        true
    }

    /// Whether a batch was cancelled (`send --cancel`) and its ready marker not touched since.
    fn cancelled(&self, batch: &Batch) -> bool {
        let row = self
            .catalog
            .batch(&batch_id(self.key, &batch.name))
            .ok()
            .flatten();
        row.filter(|b| b.state == BatchState::Cancelled)
            .is_some_and(|b| marker_time_us(&batch.dir).is_none_or(|t| t <= b.updated_at))
    }

    /// Cancels batches of the inbox at the relay (`send --cancel`): deletes what the relay holds
    /// of each that the core has not taken, and records them as cancelled so that later runs
    /// skip them. The source files are not touched.
    fn cancel(&self, inbox: &Path, names: &[String]) -> Result<bool> {
        let mut ok = true;
        for name in names {
            let dir = inbox.join(name);
            let found = discover(&dir).with_context(|| {
                format!("cannot cancel batch {name}: cannot read {}", dir.display())
            })?;
            let ids: Vec<ObjectId> = found
                .files
                .iter()
                .filter(|f| f.path != READY_MARKER)
                .map(|f| object_id(self.key, name, f))
                .collect();
            let batch_key = batch_id(self.key, name);
            let what = format!("cancellation of batch {name}");
            match self
                .retry
                .run(&what, || self.client.cancel_batch(batch_key.batch(), &ids))
            {
                Ok(cancelled) => {
                    let (files, bytes) = (ids.len() as u64, found.total_bytes());
                    self.record_batch(&batch_key, name, files, bytes, BatchState::Cancelled);
                    println!(
                        "batch {name}: cancelled; the relay deleted {} objects ({}); the source is untouched (touch {}/{READY_MARKER} to send it again)",
                        cancelled.objects,
                        human(cancelled.bytes),
                        dir.display()
                    );
                }
                Err(e) => {
                    let error = format!("cannot cancel the batch at the relay: {e}");
                    self.failures.report(name, None, &error);
                    ok = false;
                }
            }
        }
        Ok(ok)
    }

    /// Deletes, in every sent batch, each source file whose object the core has acknowledged
    /// (the relay reports it delivered) and which is unchanged since (its derived object id is
    /// the same), and nothing else: a file that was skipped, failed, changed or appeared later
    /// stays, with its batch directory. A batch left with only files that can never be sent is
    /// reported once, through the failure hook.
    fn delete_acknowledged(&self, inbox: &Path) {
        let Ok(batches) = self.catalog.batches() else {
            return;
        };
        for b in batches
            .into_iter()
            .filter(|b| b.role == Role::Edge && b.state == BatchState::Sent)
        {
            if lock(&self.in_flight).contains_key(&b.batch_key) {
                continue;
            }
            let dir = inbox.join(&b.name);
            let Ok(found) = discover(&dir) else { continue };
            let files: Vec<(SourceFile, ObjectId)> = found
                .files
                .into_iter()
                .filter(|f| f.path != READY_MARKER)
                .map(|f| {
                    let id = object_id(self.key, &b.name, &f);
                    (f, id)
                })
                .collect();
            let ids: Vec<ObjectId> = files.iter().map(|(_, id)| *id).collect();
            let Ok(known) = self.client.statuses(&ids) else {
                continue;
            };
            let delivered = |id: &ObjectId| {
                known
                    .get(id)
                    .is_some_and(|s| s.state == forte_relay::api::ObjectState::Delivered)
            };
            let mut deleted = 0;
            let mut kept: Vec<String> = found
                .rejected
                .iter()
                .map(|(p, why)| format!("{}: never sent ({why})", p.display()))
                .collect();
            let mut waiting = 0;
            // Files first, deepest directories last, so a delivered empty directory is
            // removed only once what it held is gone.
            let mut order: Vec<&(SourceFile, ObjectId)> = files.iter().collect();
            order.sort_by_key(|(f, _)| {
                (
                    f.kind == forte_format::Kind::Dir,
                    std::cmp::Reverse(f.path.len()),
                )
            });
            for (file, id) in order {
                if !delivered(id) {
                    waiting += 1;
                    continue;
                }
                let removed = match file.kind {
                    forte_format::Kind::File => std::fs::remove_file(&file.local),
                    forte_format::Kind::Dir => std::fs::remove_dir(&file.local),
                };
                match removed {
                    Ok(()) => deleted += 1,
                    Err(e) => kept.push(format!("{}: cannot delete: {e}", file.local.display())),
                }
            }
            prune_empty_dirs(&dir);
            let only_marker = std::fs::read_dir(&dir)
                .map(|mut d| d.all(|e| e.is_ok_and(|e| e.file_name() == READY_MARKER)))
                .unwrap_or(false);
            let (files_n, bytes) = (b.files as u64, b.bytes as u64);
            if kept.is_empty() && waiting == 0 && only_marker {
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => {
                        let deleted = BatchState::SourceDeleted;
                        self.record_batch(&b.batch_key, &b.name, files_n, bytes, deleted);
                        println!("batch {}: acknowledged by the core; source deleted", b.name);
                    }
                    Err(e) => self.failures.report(
                        &b.name,
                        None,
                        &format!("cannot delete {}: {e}", dir.display()),
                    ),
                }
            } else if waiting == 0 && !kept.is_empty() {
                // Everything sendable is acknowledged and deleted; what is left never will be.
                let kept_state = BatchState::SourceKept;
                self.record_batch(&b.batch_key, &b.name, files_n, bytes, kept_state);
                self.failures.report(
                    &b.name,
                    None,
                    &format!(
                        "{deleted} acknowledged file(s) deleted; {} kept in {} and not deleted: {}",
                        kept.len(),
                        dir.display(),
                        kept.join("; ")
                    ),
                );
            }
        }
    }
}

/// The inventory entry of a file an earlier run sealed at the relay: its SHA-256 as the
/// catalogue `recorded` it then, or else read from the file again (the object id names its
/// size and modification time, so the file is the one that was sealed unless it was rewritten
/// in place within the same second and size, which `read` would have caught).
fn sealed_entry(
    source: &SourceFile,
    id: ObjectId,
    recorded: Option<String>,
) -> Result<InventoryEntry> {
    let sha256 = match recorded {
        Some(sha) => sha,
        None if source.kind == forte_format::Kind::Dir => forte_format::seal::sha256_hex(b""),
        None => forte_format::seal::sha256_file(&source.local).with_context(|| {
            format!(
                "{}: sealed at the relay by an earlier run; cannot read it again for the batch's inventory",
                source.local.display()
            )
        })?,
    };
    Ok(InventoryEntry {
        id,
        path: source.path.clone(),
        size: source.size,
        sha256,
    })
}

/// When the batch's ready marker was last touched, in microseconds since the epoch.
fn marker_time_us(dir: &Path) -> Option<i64> {
    let modified = std::fs::metadata(dir.join(READY_MARKER))
        .ok()?
        .modified()
        .ok()?;
    let since = modified.duration_since(std::time::UNIX_EPOCH).ok()?;
    i64::try_from(since.as_micros()).ok()
}

/// Removes the empty directories under `dir` (not `dir` itself), deepest first.
fn prune_empty_dirs(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            prune_empty_dirs(&entry.path());
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}
