//! Admitting batches to the queue: their files discovered, the relay asked what it holds, what
//! an earlier run sent booked as such.
//!
//! A batch this catalogue has no record of is sent without waiting for the relay's answer: at
//! 100 ms that round trip was an eighth of sending 3 000 small files. The relay is asked beside
//! its first uploads instead ([`Edge::ask_relay`]), and the batch is sealed only once the
//! answer says it held none of it sealed or delivered; if it did (a run this catalogue does
//! not know of, under a new catalogue), the batch is not sealed but sent again after asking,
//! and the relay refuses to replace what it had sealed meanwhile.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use anyhow::{Context, Result};
use forte_catalog::{now_us, BatchKey, BatchRow, BatchState, FileRecord, FileRow, FileState};
use forte_format::{InventoryEntry, ObjectId};
use forte_prepare::{
    discover, Compressibility, Discovery, Excluded, Origin, PrepareJob, SourceFile,
};
use forte_relay::client::OpeningConnections;

use super::asked::{Asked, HeldBefore};
use super::deletion::drop_emptied_dirs;
use super::inbox::{arrival_us, Batch, READY_MARKER};
use super::seal::seal_beside;
use super::{object_id, Edge, InFlight, Totals, SEALED_EARLIER};
use crate::upload::{at_relay, resumable, AtRelay, Resume};
use forte_daemon::record::note;
use forte_daemon::retry::Operation;

/// What the relay already has of the batches' files, and what this catalogue knows of a
/// batch's files from earlier runs, so that what a re-run learns is recorded once.
struct Known<'r> {
    at_relay: &'r mut HashMap<ObjectId, AtRelay>,
    files: HashMap<String, FileRow>,
}

/// Batches discovered at the same time (each walks its directory and reads its catalogue rows).
const DISCOVERED_AT_ONCE: usize = 8;

/// A batch discovered: the objects that carry its files, before the relay is asked about them.
struct Discovered {
    batch_key: BatchKey,
    flight: InFlight,
    jobs: Vec<PrepareJob>,
    /// The batch's files in the catalogue.
    rows: Vec<FileRow>,
    /// The catalogue recorded the batch before this run: the relay may hold some of it.
    known: bool,
    /// How well its objects will compress, for the ETA (`forte_prepare::probe`).
    probed: Vec<Compressibility>,
}

/// The objects that carry a discovered batch's files (its jobs), and its files' rows in the
/// catalogue.
#[derive(Default)]
struct Objects {
    jobs: Vec<PrepareJob>,
    rows: Vec<FileRow>,
}

/// A batch planned: its flight, and the jobs that send what the relay lacks of it.
struct Planned {
    batch_key: BatchKey,
    flight: InFlight,
    jobs: Vec<(PrepareJob, u64)>,
    probed: Vec<Compressibility>,
}

/// New batches admitted without asking the relay: [`Edge::ask_relay`] asks it about their
/// objects while they are sent. Dropped unasked, their seals learn that they were not.
#[must_use = "the batches' seals wait until the relay was asked about them"]
#[derive(Default)]
pub struct Unasked(Vec<NotAsked>);

/// A new batch admitted without asking the relay about its objects.
struct NotAsked {
    batch_key: BatchKey,
    /// Where the relay's answer goes, which the batch's seal waits for.
    asked: Arc<Asked>,
    /// The batch's objects, to ask about.
    ids: Vec<ObjectId>,
}

impl Drop for Unasked {
    fn drop(&mut self) {
        for batch in &self.0 {
            batch
                .asked
                .set(HeldBefore::Unknown("the relay was not asked".into()));
        }
    }
}

impl Edge<'_> {
    /// Queues every batch not already in flight: discovers its files, asks the relay what it
    /// holds of those this catalogue knows, and records the batch as queued (its arrival). A
    /// batch with nothing left to send is finished at once. The batches new to this catalogue
    /// are returned for [`Edge::ask_relay`], which their seals wait for. Run it beside
    /// [`Edge::opening_connections`]: the batches are discovered while the connections open.
    pub fn admit(&self, batches: &[Batch]) -> Unasked {
        if batches.is_empty() {
            return Unasked::default();
        }
        self.discover_and_plan(batches)
    }

    /// Announces the upload workers' connections, which uploads wait for from now on; open
    /// them on another thread. At 200 ms, each worker opening its own when the pass started
    /// left the link idle for another round trip.
    pub fn opening_connections(&self) -> OpeningConnections<'_> {
        let workers = self.setup.settings.prepare.sink.limit();
        self.setup.client.opening_connections(workers)
    }

    /// Asks the relay what it held of the objects of new batches, sent meanwhile: the answer
    /// lets their seals go, or has them sent again.
    pub fn ask_relay(&self, mut unasked: Unasked) {
        let batches = std::mem::take(&mut unasked.0);
        if batches.is_empty() {
            return;
        }
        let ids: Vec<ObjectId> = batches.iter().flat_map(|b| b.ids.clone()).collect();
        let (client, what) = (
            self.setup.client,
            format!("status of {} objects", ids.len()),
        );
        let found = self
            .setup
            .retry
            .run(Operation::Status, &what, || client.statuses(&ids));
        for NotAsked {
            batch_key,
            asked,
            ids,
        } in batches
        {
            let held = match &found {
                Ok(found) => {
                    let held = |id| found.get(id).is_some_and(|s| asked.held_before(s));
                    if ids.iter().any(held) {
                        HeldBefore::Some
                    } else {
                        HeldBefore::Nothing
                    }
                }
                Err(e) => HeldBefore::Unknown(format!("cannot ask the relay what it holds: {e:#}")),
            };
            // Answered under the flights' lock, so that the batch's seal goes exactly once:
            // beside its last uploads as usual, or now if they all started before the answer.
            let mut flights = self.in_flight.lock();
            asked.set(held);
            let seal = flights
                .get_mut(&batch_key)
                .and_then(|flight| seal_beside(&batch_key, flight));
            drop(flights);
            if let Some(seal) = seal {
                self.send_seal_beside(seal);
            }
        }
    }

    /// Discovers `batches`, plans and queues them.
    fn discover_and_plan(&self, batches: &[Batch]) -> Unasked {
        let discovered: Vec<(&Batch, Discovered)> = batches
            .chunks(DISCOVERED_AT_ONCE)
            .flat_map(|some| {
                std::thread::scope(|s| {
                    let discovering: Vec<_> = some
                        .iter()
                        .map(|b| s.spawn(|| self.discover_batch(b)))
                        .collect();
                    let found = discovering
                        .into_iter()
                        .map(|d| d.join().expect("discovering a batch panicked"));
                    some.iter().zip(found).collect::<Vec<_>>()
                })
            })
            .filter_map(|(batch, found)| Some((batch, found?)))
            .collect();
        // A new batch is in the catalogue before any of its bytes leave: a run killed after its
        // first uploads leaves a batch the next run knows, and asks about first, rather than
        // sending again what the relay holds. (Its files' rows follow; waiting for 10 000 of
        // them cost more than the round trip saved.)
        if discovered.iter().any(|(_, d)| !d.known) {
            if let Err(e) = self.setup.catalog.flush() {
                tracing::warn!(
                    "the catalogue did not record the batches before they were sent: {e:#}"
                );
            }
        }
        // Asking the relay what it holds costs a round trip: every known batch's objects are
        // asked about at once (at 200 ms, 14 batches asking one after another kept the link
        // idle for 2.8 s, eight at a time still for 0.4 s), new batches' not at all. The
        // batches are then queued in inbox order, the order the policy sees them arrive in.
        let known = |d: &Discovered| d.known;
        let ids: Vec<ObjectId> = discovered
            .iter()
            .filter(|(_, d)| known(d))
            .flat_map(|(_, d)| d.jobs.iter().map(|j| j.id))
            .collect();
        let mut at_relay = if ids.is_empty() {
            Ok(HashMap::new())
        } else {
            at_relay(self.setup.client, &self.setup.retry, &ids)
                .map_err(|e| format!("cannot ask the relay what it holds: {e:#}"))
        };
        let mut unasked = Unasked::default();
        let mut planned = Vec::new();
        for (batch, mut found) in discovered {
            if known(&found) || found.jobs.is_empty() {
                let plan = self.plan(found, at_relay.as_mut().map_err(|e| e.as_str()));
                planned.push((batch, plan));
                continue;
            }
            let ids: Vec<ObjectId> = found.jobs.iter().map(|j| j.id).collect();
            let mut nothing = ids.iter().map(|&id| (id, AtRelay::Nothing)).collect();
            let asked = Arc::new(Asked::default());
            found.flight.asked = Some(asked.clone());
            unasked.0.push(NotAsked {
                batch_key: found.batch_key.clone(),
                asked,
                ids,
            });
            planned.push((batch, self.plan(found, Ok(&mut nothing))));
        }
        for (batch, plan) in planned {
            self.enqueue(batch, plan);
        }
        unasked
    }

    /// Discovers the files of a batch not in flight and the objects that carry them.
    fn discover_batch(&self, batch: &Batch) -> Option<Discovered> {
        let Batch { name, dir } = batch;
        let batch_key = self.batch_key(name);
        if self.in_flight.lock().contains_key(&batch_key) {
            return None;
        }
        let mut flight = InFlight::new(name, Instant::now());
        // Unless the catalogue says for sure that it never recorded the batch, it is known.
        let catalogued = self.setup.catalog.batch(&batch_key);
        let known = !matches!(catalogued, Ok(None));
        let catalogued = catalogued.as_ref().ok().and_then(Option::as_ref);
        let objects = match discover(dir) {
            Ok(found) => self.admit_found(&batch_key, batch, found, catalogued, &mut flight)?,
            Err(e) => {
                let error = format!("{e:#}");
                self.fail(name, None, &error);
                flight.report.errors.push(error);
                flight.report.failed += 1;
                Objects::default()
            }
        };
        let Objects { jobs, rows } = objects;
        // Read here, in the discovering threads, not in the queue's: some 10 ms a batch.
        let probed = forte_prepare::probe(&jobs);
        Some(Discovered {
            batch_key,
            flight,
            jobs,
            known: known || !rows.is_empty(),
            rows,
            probed,
        })
    }

    /// The objects of a batch whose files were `found`, the batch recorded queued (`catalogued`:
    /// its row from an earlier run); `None` when its edge tasks refused it.
    fn admit_found(
        &self,
        batch_key: &BatchKey,
        batch: &Batch,
        mut found: Discovery,
        catalogued: Option<&BatchRow>,
        flight: &mut InFlight,
    ) -> Option<Objects> {
        found.files.retain(|f| f.path != READY_MARKER);
        let filter = &self.setup.settings.filter;
        let excluded = filter.apply(&mut found, &batch.name, SystemTime::now());
        let state = catalogued.map(|r| r.state);
        if self.refused_by_tasks(batch_key, batch, &found, state) {
            return None;
        }
        let rows = self.setup.catalog.files(batch_key).unwrap_or_default();
        drop_emptied_dirs(&mut found.files, &rows);
        let arrived = self.record_queued(batch_key, batch, &found, flight);
        self.record_excluded(batch_key, &batch.name, &excluded);
        // What the writer records as the batch's arrival, once, for every run to sign.
        let created = catalogued.map(|row| row.created_at);
        let arrived_us = created.unwrap_or_else(|| arrived.map_or(now_us(), |a| a.min(now_us())));
        let jobs = self.jobs_signed(&batch.name, found.files, &rows, arrived_us, flight);
        Some(Objects { jobs, rows })
    }

    /// Whether the site's edge tasks refused the batch (`state`: as the catalogue has it): then
    /// it is recorded refused, with why, and reported.
    fn refused_by_tasks(
        &self,
        batch_key: &BatchKey,
        batch: &Batch,
        found: &Discovery,
        state: Option<BatchState>,
    ) -> bool {
        let Some(why) = self.refused_at_edge(batch_key, batch, &found.files, state) else {
            return false;
        };
        let Batch { name, dir } = batch;
        let totals = Totals {
            files: found.files.len() as u64,
            bytes: found.total_bytes(),
        };
        let (arrived, refused) = (arrival_us(dir), Some(why.as_str()));
        self.record_batch_as(
            batch_key,
            name,
            totals,
            BatchState::Refused,
            arrived,
            refused,
        );
        self.fail(name, None, &why);
        true
    }

    /// Records each file the filter left out as excluded, with the rule or bound that did: the
    /// batch's record says what was not sent and why (`forte status`).
    fn record_excluded(&self, batch_key: &BatchKey, name: &str, excluded: &[Excluded]) {
        let key = &self.setup.settings.key;
        for x in excluded {
            let id = object_id(key, name, &x.file).to_string();
            let state = FileState::Excluded;
            let mut record = FileRecord::new(batch_key, &id, &x.file.path, x.size, state);
            record.detail = Some(&x.reason);
            note("an excluded file", self.setup.catalog.file_state(&record));
        }
    }

    /// Records the batch queued, with its totals and when it arrived (returned, if known);
    /// its totals and the files discovery skipped go to the flight.
    fn record_queued(
        &self,
        batch_key: &BatchKey,
        Batch { name, dir }: &Batch,
        found: &Discovery,
        flight: &mut InFlight,
    ) -> Option<i64> {
        let report = &mut flight.report;
        report.files = found.files.len();
        let (files, bytes) = (found.files.len() as u64, found.total_bytes());
        flight.bytes = bytes;
        let arrived = arrival_us(dir);
        let totals = Totals { files, bytes };
        self.record_batch_as(batch_key, name, totals, BatchState::Queued, arrived, None);
        report.errors.extend(
            found
                .rejected
                .iter()
                .map(|(p, why)| format!("skipped {}: {why}", p.display())),
        );
        arrived
    }

    /// The jobs that send the batch's `files`, each signed with this site and the batch's
    /// arrival (`arrived_us`); none when the relay gives this edge's token to another site
    /// (the batch fails before anything of it is prepared).
    fn jobs_signed(
        &self,
        name: &str,
        files: Vec<SourceFile>,
        rows: &[FileRow],
        arrived_us: i64,
        flight: &mut InFlight,
    ) -> Vec<PrepareJob> {
        match self.setup.site.get(self.setup.client) {
            Ok(site) => {
                let origin = Origin {
                    site: site.to_string(),
                    batch_time: arrived_us.div_euclid(1_000_000),
                };
                let objects = self.objects(name, files, rows);
                let jobs = objects
                    .into_iter()
                    .map(|job| job.from_origin(origin.clone()));
                jobs.collect()
            }
            Err(e) => {
                let error = format!("{e:#}");
                self.fail(name, None, &error);
                flight.report.errors.push(error);
                flight.report.failed += flight.report.files;
                Vec::new()
            }
        }
    }

    /// Queues a planned batch, or finishes it at once if nothing is left to send.
    fn enqueue(&self, batch: &Batch, planned: Planned) {
        let Planned {
            batch_key,
            mut flight,
            jobs,
            mut probed,
        } = planned;
        flight.pending = jobs.len();
        flight.unsealed = jobs.len();
        flight.unlisted_files = flight.pending_files;
        if jobs.is_empty() {
            self.finish(&batch_key, flight);
            return;
        }
        let sending: HashSet<ObjectId> = jobs.iter().map(|(job, _)| job.id).collect();
        probed.retain(|object| sending.contains(&object.id));
        forte_daemon::monitor::batch_probed(&batch_key, &probed);
        let ready = batch.dir.join(READY_MARKER);
        let priority = self.setup.policy.priority_of(&batch.name, Some(&ready));
        self.in_flight.lock().insert(batch_key, flight);
        self.queue.admit(Instant::now(), priority, jobs);
    }

    /// Plans a discovered batch: the jobs that send what the relay lacks of it (`at_relay`,
    /// or why the relay could not be asked); what it holds already is booked to the batch's
    /// flight.
    fn plan(
        &self,
        discovered: Discovered,
        at_relay: Result<&mut HashMap<ObjectId, AtRelay>, &str>,
    ) -> Planned {
        let Discovered {
            batch_key,
            mut flight,
            jobs,
            rows,
            probed,
            ..
        } = discovered;
        let at_relay = match at_relay {
            Ok(at) => at,
            Err(error) => {
                if !jobs.is_empty() {
                    self.fail(&flight.name, None, error);
                    flight.report.errors.push(error.to_string());
                    flight.report.failed += flight.report.files;
                }
                return Planned {
                    batch_key,
                    flight,
                    jobs: Vec::new(),
                    probed: Vec::new(),
                };
            }
        };
        let mut known = Known {
            at_relay,
            files: rows.into_iter().map(|f| (f.object_id.clone(), f)).collect(),
        };
        let mut planned = Vec::new();
        for mut job in jobs {
            if let Some(resume) = self.book(&batch_key, &job, &mut known, &mut flight) {
                self.batch_of.lock().insert(job.id, batch_key.clone());
                flight.members.push(job.id);
                flight.pending_files += job.members.len().max(1);
                job.held = resume.held;
                job.part_size = resume.part_size;
                let size = job.source.size;
                flight.pending_bytes.insert(job.id, job.file_bytes());
                planned.push((job, size));
            }
        }
        Planned {
            batch_key,
            flight,
            jobs: planned,
            probed,
        }
    }

    /// Records a discovered object's files and what the relay has of it; returns the parts it
    /// holds that the object resumes from when it is still to be sent, `None` when it is not
    /// (delivered, or sealed by an earlier run: then booked to the flight as such).
    fn book(
        &self,
        batch_key: &BatchKey,
        job: &PrepareJob,
        known: &mut Known,
        flight: &mut InFlight,
    ) -> Option<Resume> {
        let files = job.files();
        let record = |source: &SourceFile, id: ObjectId, state, detail: Option<&str>| {
            self.record_file(batch_key, job.id, (source, id), state, detail);
        };
        for &(source, id) in &files {
            record(source, id, FileState::Discovered, None);
        }
        let earlier = |id: ObjectId| known.files.get(&id.to_string());
        match known.at_relay.remove(&job.id)? {
            AtRelay::Delivered => {
                // The relay reports it delivered: the core acknowledged it.
                for &(source, id) in &files {
                    let was = earlier(id).map(|f| f.state);
                    self.record_acknowledged_file(batch_key, job.id, (source, id), was);
                }
                flight.report.already_at_relay += files.len();
                None
            }
            AtRelay::Sealed => {
                flight.report.already_at_relay += files.len();
                flight.members.push(job.id);
                for &(source, id) in &files {
                    // An earlier run killed between the relay's seal and its own record of it
                    // left the file short of sealed in the lineage.
                    let state = earlier(id).map(|f| f.state);
                    if !matches!(state, Some(FileState::Sealed | FileState::Acknowledged)) {
                        record(source, id, FileState::Sealed, Some(SEALED_EARLIER));
                    }
                    let recorded = earlier(id).and_then(|f| f.raw_sha256.clone());
                    match sealed_entry(source, id, recorded) {
                        Ok(entry) => flight.entries.push(entry),
                        Err(e) => {
                            let error = format!("{e:#}");
                            let path = Some(source.path.as_str());
                            self.fail(&flight.name, path, &error);
                            flight.report.errors.push(error);
                            flight.report.failed += 1;
                        }
                    }
                }
                None
            }
            AtRelay::Nothing => Some(Resume::default()),
            AtRelay::Parts(held) => Some(resumable(self.setup.catalog, job.id, held)),
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
