//! The edge's batch lifecycle: batches of the inbox are admitted to one queue (their files
//! discovered, the relay asked what it already holds), their files prepared and uploaded in one
//! streaming pass in the order the queue's policy picks, each batch sealed at the relay with its
//! signed inventory the moment its last file is, and, once the core has acknowledged them, its
//! source files deleted one by one.
//!
//! `admit` queues batches (`checks` runs the site's edge tasks on a batch first), `seal` books
//! finished files and seals batches, `deletion` decides what may be deleted or sent again, and
//! `inbox` finds the batches that are ready.

mod admit;
mod asked;
mod checks;
mod deletion;
pub mod dry_run;
pub mod inbox;
pub mod level_sweep;
pub mod pack;
mod seal;
pub mod send;
pub mod tuner;
mod upload;

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;

use forte_catalog::{
    now_us, BatchKey, BatchRecord, BatchState, FileRecord, FileRow, FileState, Stage,
};
use forte_format::{EdgeKey, InventoryEntry, ObjectId};
use forte_prepare::{bundle_as_before, bundle_small, JobQueue, PrepareJob, SourceFile};
use forte_relay::client::{RelayClient, RelayError};
use parking_lot::Mutex;
use serde::Serialize;

use forte_daemon::failures::{Failure, Failures};
use forte_daemon::record::{note, Catalog};
use forte_daemon::retry::Retry;
use forte_daemon::schedule::{BatchQueue, Policy};
use forte_daemon::settings::EdgeSettings;

use asked::Asked;
pub use deletion::Cancelled;
pub use inbox::{ready_batches, Batch, Inbox, InboxLock, READY_MARKER};

/// What sending one batch did.
#[derive(Debug, Serialize)]
pub struct SendReport {
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
    /// Not sealed: the relay held some of it already, sealed or delivered by a run this
    /// catalogue has no record of. Admitted again, the batch is planned from what it holds.
    #[serde(skip)]
    pub send_again: bool,
}

impl SendReport {
    /// One line for the operator: what went, what had gone before, what failed.
    pub fn text(&self) -> String {
        format!(
            "batch {}: sent {} of {} files ({} sent before, {} failed), {} raw as {} sealed",
            self.batch,
            self.sent,
            self.files,
            self.already_at_relay,
            self.failed,
            forte_daemon::units::human(self.raw_bytes),
            forte_daemon::units::human(self.sealed_bytes),
        )
    }
}

/// The object id of a file: derived from the edge's secret and the file's identity, so a
/// second run finds what the first one left at the relay.
pub(crate) fn object_id(key: &EdgeKey, batch: &str, file: &SourceFile) -> ObjectId {
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

/// The object id of a bundle of the files `members` (their object ids, in bundle order): the
/// same files bundle under the same id again, so a second run resumes the bundle.
fn bundle_id(key: &EdgeKey, batch: &str, members: &[ObjectId]) -> ObjectId {
    let ids: Vec<String> = members.iter().map(ObjectId::to_string).collect();
    let mut names: Vec<&[u8]> = vec![b"bundle", batch.as_bytes()];
    names.extend(ids.iter().map(|id| id.as_bytes()));
    ObjectId::derive(key.0.as_bytes(), &names)
}

/// Why the edge records a file acknowledged: it does not hear from the core, only the relay.
const ACKNOWLEDGED: &str = "the relay reports it acknowledged by the core";
/// Why the edge records a file sealed that this run did not seal.
const SEALED_EARLIER: &str = "sealed by an earlier run";

/// The batch's key: its id, which is what the relay sees (opaque, stable across runs).
fn batch_id(key: &EdgeKey, batch: &str) -> BatchKey {
    BatchKey::edge(ObjectId::derive(key.0.as_bytes(), &[b"batch", batch.as_bytes()]).to_string())
}

/// A batch seal sent beside the batch's last uploads: the relay's answer, and the sealed
/// inventory to seal with again if it was not yes; or why no inventory could be made (the
/// site unknown, the catalogue unwritable).
enum EarlySeal {
    Sent {
        answer: Result<(), RelayError>,
        inventory: Vec<u8>,
    },
    NoInventory(String),
}

/// A batch's totals as recorded: all its files and their raw bytes, not only what a run sent.
#[derive(Debug, Clone, Copy)]
struct Totals {
    files: u64,
    bytes: u64,
}

/// A batch between its admission to the queue and its seal at the relay.
struct InFlight {
    report: SendReport,
    name: String,
    /// Raw bytes of every file of the batch, as discovered (sent now, before, or not at all).
    bytes: u64,
    /// Every object of the batch not yet delivered, sent now or before: the batch's seal
    /// lists them all.
    members: Vec<ObjectId>,
    /// The inventory entry of each file of the members listed so far (sealed by an earlier
    /// run, or whose object's last request started in this one): the batch is sealed with the
    /// signed list of exactly these.
    entries: Vec<InventoryEntry>,
    /// Objects (files or bundles) handed to the prepare pass or still queued, not yet finished.
    pending: usize,
    /// The files of those objects.
    pending_files: usize,
    /// The raw bytes of each of those objects: what is left of the batch to send.
    pending_bytes: HashMap<ObjectId, u64>,
    /// Objects whose last request (the one that seals them) has not started, and files with
    /// no inventory entry yet: when both reach zero with nothing failed, the batch is sealed
    /// beside its last uploads instead of a round trip after them.
    unsealed: usize,
    unlisted_files: usize,
    /// The answer to that early seal.
    early_seal: Option<Receiver<EarlySeal>>,
    admitted: Instant,
    /// When its first file left the queue.
    started_at: Option<i64>,
    /// For a batch new to this catalogue, sent before the relay said what it held of it: the
    /// relay's answer, which its seal waits for.
    asked: Option<Arc<Asked>>,
    /// The relay refused an upload of it because it held the object already, sealed or
    /// delivered by a run this catalogue has no record of: the batch is sent again.
    held_before: bool,
    /// Objects of files that changed while they were read: given up at the relay once the
    /// batch is finished, so their parts do not wait there for expiry.
    abandoned: Vec<ObjectId>,
}

impl InFlight {
    fn new(name: &str, admitted: Instant) -> Self {
        Self {
            report: SendReport {
                batch: name.to_owned(),
                files: 0,
                sent: 0,
                already_at_relay: 0,
                failed: 0,
                raw_bytes: 0,
                sealed_bytes: 0,
                seconds: 0.0,
                errors: Vec::new(),
                send_again: false,
            },
            name: name.to_owned(),
            bytes: 0,
            members: Vec::new(),
            entries: Vec::new(),
            pending: 0,
            pending_files: 0,
            pending_bytes: HashMap::new(),
            unsealed: 0,
            unlisted_files: 0,
            early_seal: None,
            admitted,
            started_at: None,
            asked: None,
            held_before: false,
            abandoned: Vec::new(),
        }
    }
}

/// What an edge sends with: the relay, the keys, how to retry, where to record and report.
pub struct EdgeSetup<'a> {
    pub client: &'a RelayClient,
    /// This edge's site, signed into every inventory.
    pub site: forte_daemon::settings::EdgeSite,
    /// The core keys whose custody receipts allow deleting sources (`--receipt-pub`); without
    /// them nothing is deleted.
    pub receipts: Option<forte_format::TrustedCores>,
    /// The keys that seal objects and inventories, and how files are prepared.
    pub settings: &'a EdgeSettings,
    pub retry: Retry,
    pub catalog: &'a Catalog,
    pub policy: Policy,
    pub failures: Failures,
    /// Told of each batch's report as the batch finishes (the daemon prints it).
    pub on_finished: Option<fn(&SendReport)>,
    /// Tune the uploads in flight while each pass runs (`--connections auto`), within the
    /// prepare settings' sink gate; otherwise they stay at its limit.
    pub tune: bool,
    /// The site's tasks that check a batch before it is prepared (`at = "edge"`).
    pub tasks: forte_daemon::tasks::Tasks,
}

/// What every batch of a `send` run shares: the relay, the queue and the batches in flight.
/// Batches are admitted while earlier ones are being sent, the queue's policy decides which
/// file goes next, and each batch is sealed at the relay the moment its last file is.
pub struct Edge<'a> {
    setup: EdgeSetup<'a>,
    queue: BatchQueue<PrepareJob>,
    batch_of: Mutex<HashMap<ObjectId, BatchKey>>,
    in_flight: Mutex<HashMap<BatchKey, InFlight>>,
    finished: Mutex<Vec<SendReport>>,
    /// Objects whose upload the relay refused because it held them already (sealed or
    /// delivered), until their outcome is booked.
    refused_as_held: Mutex<HashSet<ObjectId>>,
    /// Sent batches the relay says were delivered, checked once each for the core's receipt,
    /// and not asked about again in this run.
    settled: Mutex<HashSet<BatchKey>>,
    /// Receipts the relay offered that were refused (by SHA-256), each reported once.
    refused_receipts: Mutex<HashSet<String>>,
    /// The keys of batches this catalogue recorded under an earlier signing key, by name: a
    /// batch keeps its key (its id at the relay) when the edge's key changes.
    earlier_keys: HashMap<String, BatchKey>,
}

/// The batches the catalogue recorded under a signing key other than `key` (none under
/// `key`), by name: a batch sent or cancelled before a key rotation stays what it was,
/// instead of being taken for a new batch under the new key's id and sent again.
fn earlier_keys(catalog: &Catalog, key: &EdgeKey) -> HashMap<String, BatchKey> {
    let rows = catalog.batches().unwrap_or_default();
    let rows: Vec<_> = rows
        .into_iter()
        .filter(|r| r.role == forte_catalog::Role::Edge)
        .collect();
    let current: HashSet<&str> = rows
        .iter()
        .filter(|r| r.batch_key == batch_id(key, &r.name))
        .map(|r| r.name.as_str())
        .collect();
    let mut earlier = HashMap::new();
    for row in &rows {
        if !current.contains(row.name.as_str()) {
            earlier
                .entry(row.name.clone())
                .or_insert_with(|| row.batch_key.clone());
        }
    }
    earlier
}

impl JobQueue for Edge<'_> {
    fn next(&self) -> Option<PrepareJob> {
        let mut job = self.queue.next()?;
        self.cut_for_the_end(&mut job);
        let key = self.batch_key(&job.batch);
        let mut flights = self.in_flight.lock();
        if let Some(flight) = flights.get_mut(&key).filter(|f| f.started_at.is_none()) {
            let now = now_us();
            flight.started_at = Some(now);
            let (files, bytes) = (flight.report.files as u64, flight.bytes);
            self.record_batch(&key, &flight.name, files, bytes, BatchState::Sending);
            note(
                "a stage",
                self.setup.catalog.stage(&key, Stage::Send, now, None),
            );
        }
        Some(job)
    }
}

impl<'a> Edge<'a> {
    pub fn new(setup: EdgeSetup<'a>) -> Self {
        let earlier_keys = earlier_keys(setup.catalog, &setup.settings.key);
        Self {
            queue: BatchQueue::new(setup.policy.clone()),
            setup,
            batch_of: Mutex::default(),
            in_flight: Mutex::default(),
            finished: Mutex::default(),
            refused_as_held: Mutex::default(),
            settled: Mutex::default(),
            refused_receipts: Mutex::default(),
            earlier_keys,
        }
    }

    /// The batch's key: the one the catalogue recorded it under, if that was with an earlier
    /// signing key; else derived from this one.
    fn batch_key(&self, name: &str) -> BatchKey {
        match self.earlier_keys.get(name) {
            Some(key) => key.clone(),
            None => batch_id(&self.setup.settings.key, name),
        }
    }

    /// Cuts `job` into smaller parts if it is among the last of a queue that will get no more
    /// ([`tuner::tail`]). An object resuming from parts at the relay keeps their size; a
    /// bundle is one part.
    fn cut_for_the_end(&self, job: &mut PrepareJob) {
        if job.part_size.is_some() || !job.members.is_empty() || !self.queue.is_closed() {
            return;
        }
        let prepare = &self.setup.settings.prepare;
        let after = self.queue.totals().bytes;
        let uploads = prepare.sink.limit();
        job.part_size =
            tuner::tail::tail_part_size(job.source.size, after, uploads, prepare.part_size);
    }

    /// No batch will be admitted any more: a pass ends when the queue is empty.
    pub fn close(&self) {
        self.queue.close();
    }

    /// Batches may be admitted again, for another pass.
    pub fn reopen(&self) {
        self.queue.reopen();
    }

    /// The reports of the batches finished since the last call, in the order they finished.
    pub fn take_finished(&self) -> Vec<SendReport> {
        std::mem::take(&mut *self.finished.lock())
    }

    /// The objects that carry a batch's `files`: each file under its derived id, small ones in
    /// bundles, those the catalogue records in a bundle in that bundle again while all its
    /// members are here. The same files always give the same objects, so a later run
    /// (resuming, cancelling, deleting what was delivered, sending late files) finds them at
    /// the relay.
    /// `rows` are the batch's files in the catalogue, read once by the caller.
    fn objects(&self, batch: &str, files: Vec<SourceFile>, rows: &[FileRow]) -> Vec<PrepareJob> {
        let settings = self.setup.settings;
        // A batch recorded under an earlier signing key keeps its files' ids, found by path
        // and size: ids derived with this key would be new objects, sent again.
        let mut recorded: HashMap<(&str, u64), ObjectId> = HashMap::new();
        if self.earlier_keys.contains_key(batch) {
            for r in rows {
                if let Ok(id) = r.object_id.parse() {
                    recorded.insert((r.path.as_str(), r.size as u64), id);
                }
            }
        }
        let jobs: Vec<PrepareJob> = files
            .into_iter()
            .map(|source| {
                let id = match recorded.get(&(source.path.as_str(), source.size)) {
                    Some(&id) => id,
                    None => object_id(&settings.key, batch, &source),
                };
                PrepareJob::new(source, id, batch)
            })
            .collect();
        let carriers: HashMap<ObjectId, ObjectId> = rows
            .iter()
            .filter_map(|row| {
                Some((
                    row.object_id.parse().ok()?,
                    row.carrier.as_deref()?.parse().ok()?,
                ))
            })
            .collect();
        // Its bundles too: the recorded bundle of exactly these members.
        let mut recorded_bundles: HashMap<ObjectId, Vec<ObjectId>> = HashMap::new();
        if !recorded.is_empty() {
            for (member, bundle) in &carriers {
                recorded_bundles.entry(*bundle).or_default().push(*member);
            }
        }
        let recorded_bundle = |members: &[ObjectId]| {
            let mut members = members.to_vec();
            members.sort();
            recorded_bundles.iter().find_map(|(bundle, held)| {
                let mut held = held.clone();
                held.sort();
                (held == members).then_some(*bundle)
            })
        };
        let bundle_id = |members: &[ObjectId]| {
            recorded_bundle(members).unwrap_or_else(|| bundle_id(&settings.key, batch, members))
        };
        let earlier = |id| carriers.get(&id).copied();
        let (mut objects, rest) = bundle_as_before(jobs, &earlier, &bundle_id);
        objects.extend(bundle_small(rest, settings.bundle, &bundle_id));
        objects
    }

    /// Reports a failure of the batch named `batch` (of its `file`, if only that file failed;
    /// of the inbox's listing when `batch` is empty) through the failure hook.
    pub fn fail(&self, batch: &str, file: Option<&str>, error: &str) {
        let id = if batch.is_empty() {
            String::new()
        } else {
            self.batch_key(batch).batch().to_owned()
        };
        self.setup.failures.report(&Failure {
            site: self.setup.site.name(),
            batch,
            batch_id: &id,
            file,
            error,
        });
    }

    /// The batch named `batch` (the inbox's listing when empty) succeeded: sent, cancelled or
    /// deleted under the core's receipt; the hook is told it cleared if it was failing.
    pub fn clear(&self, batch: &str) {
        let id = if batch.is_empty() {
            String::new()
        } else {
            self.batch_key(batch).batch().to_owned()
        };
        let site = self.setup.site.name();
        self.setup.failures.cleared(site, &id, batch);
    }

    /// Records the state of one file of `carrier` (its own object, or its bundle), under the
    /// file's own id, with why when it is not the obvious step.
    fn record_file(
        &self,
        key: &BatchKey,
        carrier: ObjectId,
        (source, id): (&SourceFile, ObjectId),
        state: FileState,
        detail: Option<&str>,
    ) {
        let (object, bundle) = (id.to_string(), (carrier != id).then(|| carrier.to_string()));
        let file = FileRecord::new(key, &object, &source.path, source.size, state);
        let carrier = bundle.as_deref();
        let file = FileRecord {
            detail,
            carrier,
            ..file
        };
        note("a file", self.setup.catalog.file_state(&file));
    }

    /// Records a file the relay reports delivered as acknowledged, once, and sealed before that
    /// if the catalogue does not say so (`was`): the run that sealed it was killed before it
    /// could record it, and the relay delivers only what was sealed.
    fn record_acknowledged_file(
        &self,
        key: &BatchKey,
        carrier: ObjectId,
        file: (&SourceFile, ObjectId),
        was: Option<FileState>,
    ) {
        if !matches!(was, Some(FileState::Sealed | FileState::Acknowledged)) {
            let sealed = Some(SEALED_EARLIER);
            self.record_file(key, carrier, file, FileState::Sealed, sealed);
        }
        if was != Some(FileState::Acknowledged) {
            let acked = Some(ACKNOWLEDGED);
            self.record_file(key, carrier, file, FileState::Acknowledged, acked);
        }
    }

    /// Records a batch's state and totals (the batch's, not this run's).
    fn record_batch(&self, key: &BatchKey, name: &str, files: u64, bytes: u64, state: BatchState) {
        let totals = Totals { files, bytes };
        self.record_batch_as(key, name, totals, state, None, None);
    }

    /// [`Edge::record_batch`], with when the batch `arrived` if known (a batch recorded for the
    /// first time gets that as its creation time, which its latency counts from) and what the
    /// change was about (`detail`: a failed batch's error, in its lineage).
    fn record_batch_as(
        &self,
        key: &BatchKey,
        name: &str,
        Totals { files, bytes }: Totals,
        state: BatchState,
        arrived: Option<i64>,
        detail: Option<&str>,
    ) {
        let record = BatchRecord {
            key,
            name,
            files,
            bytes,
            state,
            arrived,
            detail,
        };
        note("a batch", self.setup.catalog.batch_state(&record));
    }
}
