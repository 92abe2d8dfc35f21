//! Finishing: each file's outcome booked to its batch, and a batch sealed at the relay, with its
//! signed inventory, beside its last uploads (or once they are all there).

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::thread::Scope;
use std::time::Duration;

use forte_catalog::{now_us, BatchKey, BatchState, FileRecord, FileState, Role, Stage};
use forte_format::{Instance, Inventory, InventoryEntry, Manifest, ObjectId};
use forte_prepare::{FileOutcome, Prepare};

use super::asked::{Asked, HeldBefore};
use super::{EarlySeal, Edge, InFlight, SendReport, Totals};
use crate::tuner::Tuning;
use crate::upload::UploadSink;
use forte_daemon::progress::{prepare_with_progress, DashboardEta};
use forte_daemon::record::note;
use forte_daemon::retry::Operation;

/// How long the relay may wait for a batch's last objects when it is sealed beside them: a
/// link that takes longer has the batch sealed again once they are all there.
const EARLY_SEAL_WAIT: Duration = Duration::from_secs(10);

impl Edge<'_> {
    /// Books one finished object's files (sent or failed) to its batch, and finishes the
    /// batch when it was the last.
    fn object_done(&self, outcomes: &[FileOutcome], sealed_bytes: u64) {
        let Some(object) = outcomes.first().map(|o| o.object) else {
            return;
        };
        let Some(batch_key) = self.batch_of.lock().remove(&object) else {
            return;
        };
        let mut flights = self.in_flight.lock();
        let Some(flight) = flights.get_mut(&batch_key) else {
            return;
        };
        flight.report.sealed_bytes += sealed_bytes;
        // Not a failure in a batch sent without asking: it is sent again, planned from what
        // the relay holds. A batch planned from the relay's answer fails with what it said.
        let held = self.refused_as_held.lock().remove(&object);
        if held && flight.asked.is_some() {
            flight.held_before = true;
        } else {
            for outcome in outcomes {
                self.book_outcome(&batch_key, flight, outcome);
            }
        }
        flight.pending -= 1;
        flight.pending_files -= outcomes.len();
        flight.pending_bytes.remove(&object);
        if flight.pending == 0 {
            let flight = flights.remove(&batch_key).expect("looked up above");
            drop(flights);
            self.finish(&batch_key, flight);
        }
    }

    /// An object's last request is starting: its files are listed for the batch's inventory.
    /// Once every object of the batch is this far and every file listed, with nothing failed,
    /// the batch is sealed on a thread of `scope`, beside the uploads still crossing the link:
    /// the relay waits for them, and the seal does not cost a round trip after the last one.
    fn object_final<'s>(&'s self, manifest: &Manifest, scope: &'s Scope<'s, '_>) {
        let Some(batch_key) = self.batch_of.lock().get(&manifest.id).cloned() else {
            return;
        };
        let mut flights = self.in_flight.lock();
        let Some(flight) = flights.get_mut(&batch_key) else {
            return;
        };
        let entries = InventoryEntry::of_files(manifest);
        flight.unlisted_files = flight.unlisted_files.saturating_sub(entries.len());
        flight.entries.extend(entries);
        flight.unsealed = flight.unsealed.saturating_sub(1);
        if let Some(seal) = seal_beside(&batch_key, flight) {
            drop(flights);
            scope.spawn(move || self.send_seal_beside(seal));
        }
    }

    /// A part of object `id` is about to be sent: noted for the relay's answer about a new
    /// batch, if it has not come yet.
    fn sending(&self, id: ObjectId, sha256: &str) {
        let Some(batch_key) = self.batch_of.lock().get(&id).cloned() else {
            return;
        };
        let asked = self
            .in_flight
            .lock()
            .get(&batch_key)
            .and_then(|f| f.asked.clone());
        if let Some(asked) = asked {
            asked.sending(sha256);
        }
    }

    /// Sends a batch seal beside the batch's last uploads; its answer goes to the flight.
    pub(super) fn send_seal_beside(&self, seal: SealBeside) {
        let SealBeside {
            batch_key,
            name,
            members,
            entries,
            answer_to,
        } = seal;
        let inventory = match self.sealed_inventory(&batch_key, &name, entries) {
            Ok(inventory) => inventory,
            Err(e) => {
                // The flight may be gone (the batch failed meanwhile): nobody waits for it.
                let _ = answer_to.send(EarlySeal::NoInventory(e));
                return;
            }
        };
        let wait = Some(EARLY_SEAL_WAIT);
        let answer = self
            .setup
            .client
            .seal_batch(batch_key.batch(), &members, &inventory, wait);
        // The flight may be gone (the batch failed meanwhile): nobody waits for the answer.
        let _ = answer_to.send(EarlySeal::Sent { answer, inventory });
    }

    /// The batch's inventory, signed and sealed, naming this site and the batch instance: the
    /// one recorded for the same content (sealed again after a refused seal, or for a relay
    /// that lost it), else a fresh one with the site's next sequence number.
    fn sealed_inventory(
        &self,
        batch_key: &BatchKey,
        name: &str,
        entries: Vec<InventoryEntry>,
    ) -> Result<Vec<u8>, String> {
        let mut inventory = Inventory::new(name, Instance::default(), entries);
        let site = self
            .setup
            .site
            .get(self.setup.client)
            .map_err(|e| format!("{e:#}"))?;
        let row = self
            .setup
            .catalog
            .edge_instance(batch_key, site, &inventory.content(), || {
                ObjectId::random().to_string()
            })
            .map_err(|e| format!("{e:#}"))?;
        inventory.set_instance(signed_instance(row));
        let settings = self.setup.settings;
        Ok(inventory.seal(&settings.key, &settings.recipients))
    }

    /// Gives up at the relay the open uploads of files of `batch` that changed while they
    /// were read (`abandoned`): their parts go now, not at the relay's expiry. Only open
    /// objects are removed, so nothing sealed or delivered is touched.
    fn abandon_at_relay(&self, batch: &str, abandoned: &[ObjectId]) {
        if abandoned.is_empty() {
            return;
        }
        match self.setup.client.abandon_open(abandoned) {
            Ok(dropped) => tracing::info!(
                "batch {batch}: the relay dropped {} open upload(s) ({} bytes) of files that changed while they were read; they go again as later versions",
                dropped.objects,
                dropped.bytes
            ),
            Err(e) => tracing::warn!("batch {batch}: cannot give up the uploads of files that changed while they were read ({e}); the relay removes them at its expiry of open uploads"),
        }
    }

    /// Books one file's outcome to its batch's flight: sent, or its failure.
    fn book_outcome(&self, batch_key: &BatchKey, flight: &mut InFlight, outcome: &FileOutcome) {
        let report = &mut flight.report;
        match &outcome.error {
            None => {
                report.sent += 1;
                report.raw_bytes += outcome.size;
            }
            Some(e) => {
                if outcome.changed_while_read() && outcome.object == outcome.id {
                    flight.abandoned.push(outcome.id);
                }
                let report = &mut flight.report;
                self.fail(&report.batch, Some(&outcome.path), e);
                let object = outcome.id.to_string();
                let (path, size) = (&outcome.path, outcome.size);
                let file = FileRecord::new(batch_key, &object, path, size, FileState::Failed);
                let file = FileRecord {
                    detail: Some(e),
                    ..file
                };
                note("a failed file", self.setup.catalog.file_state(&file));
                report.errors.push(format!("{}: {e}", outcome.path));
                report.failed += 1;
            }
        }
    }

    /// Seals a batch whose every file is at the relay (only a whole batch is offered to the
    /// core) and records how it ended.
    pub(super) fn finish(&self, batch_key: &BatchKey, flight: InFlight) {
        let InFlight {
            mut report,
            bytes,
            members,
            entries,
            early_seal,
            admitted,
            started_at,
            asked,
            held_before,
            abandoned,
            ..
        } = flight;
        report.seconds = admitted.elapsed().as_secs_f64();
        self.abandon_at_relay(&report.batch, &abandoned);
        self.take_relays_answer(&mut report, asked, held_before);
        if report.send_again {
            // Queued again, so that a later scan sends it if this run does not.
            let files = report.files as u64;
            self.record_batch(batch_key, &report.batch, files, bytes, BatchState::Queued);
            self.finished.lock().push(report);
            return;
        }
        // A batch whose every object was delivered before has nothing left to offer.
        if report.failed == 0 && !members.is_empty() {
            let seal = Seal {
                members: &members,
                entries,
                early_seal,
            };
            self.seal_at_relay(batch_key, &mut report, seal);
        }
        self.record_ended(batch_key, report, bytes, started_at);
    }

    /// Books the relay's answer about a batch sent before it was asked (`asked`), or that it
    /// refused an object as held before (`held_before`): the batch is sent again if the relay
    /// held some of it; a relay that could not be asked fails it.
    fn take_relays_answer(
        &self,
        report: &mut SendReport,
        asked: Option<Arc<Asked>>,
        held_before: bool,
    ) {
        match asked.map(|a| a.wait()) {
            _ if held_before => report.send_again = true,
            Some(HeldBefore::Some) => report.send_again = true,
            // Only if nothing else failed: a relay that cannot be asked refused the uploads too.
            Some(HeldBefore::Unknown(error)) if report.failed == 0 => {
                self.fail(&report.batch, None, &error);
                report.errors.push(error);
                report.failed += 1;
            }
            Some(HeldBefore::Nothing | HeldBefore::Unknown(_)) | None => {}
        }
    }

    /// Seals the batch at the relay, unless it was sealed beside its last uploads; a seal that
    /// fails fails the batch.
    fn seal_at_relay(&self, batch_key: &BatchKey, report: &mut SendReport, seal: Seal<'_>) {
        let Seal {
            members,
            entries,
            early_seal,
        } = seal;
        let inventory = match early_seal.map(|answer| answer.recv()) {
            Some(Ok(EarlySeal::Sent { answer: Ok(()), .. })) => Ok(None),
            // Not sealed beside the last uploads (a relay that does not wait, or one of
            // them retried for longer than the relay waited): sealed now, as they are all
            // there.
            Some(Ok(EarlySeal::Sent { inventory, .. })) => Ok(Some(inventory)),
            Some(Ok(EarlySeal::NoInventory(e))) => Err(e),
            // Its entries went with it; the next run seals the batch.
            Some(Err(_)) => Err("the thread sealing it stopped without an answer".to_string()),
            // The entries go as soon as they are sealed: at 100 000 files they are tens of
            // MB.
            None => self
                .sealed_inventory(batch_key, &report.batch, entries)
                .map(Some),
        };
        let what = format!("seal of batch {}", report.batch);
        let sealed = inventory.and_then(|inventory| {
            inventory.map_or(Ok(()), |sealed| {
                self.setup
                    .retry
                    .run(Operation::Seal, &what, || {
                        self.setup
                            .client
                            .seal_batch(batch_key.batch(), members, &sealed, None)
                    })
                    .map_err(|e| e.to_string())
            })
        });
        if let Err(e) = sealed {
            let error = format!("cannot seal the batch at the relay: {e}");
            self.fail(&report.batch, None, &error);
            report.errors.push(error);
            report.failed += 1;
        }
    }

    /// Records how the batch ended (its totals, `bytes` the raw bytes of all its files) and,
    /// for a run that sent files since `started_at`, its send stage; tells and keeps `report`.
    fn record_ended(
        &self,
        batch_key: &BatchKey,
        report: SendReport,
        bytes: u64,
        started_at: Option<i64>,
    ) {
        let state = if report.failed == 0 {
            BatchState::Sent
        } else {
            BatchState::Failed
        };
        forte_daemon::monitor::batch_done(Role::Edge, state);
        forte_daemon::monitor::batch_ended(batch_key);
        if state == BatchState::Sent {
            self.clear(&report.batch);
        }
        // The batch's totals, not this run's: a re-run that finds its files at the relay
        // sends none of them, and the batch is no smaller for it.
        let totals = Totals {
            files: report.files as u64,
            bytes,
        };
        let error = report.errors.first().map(String::as_str);
        self.record_batch_as(batch_key, &report.batch, totals, state, None, error);
        // Only a run that sent files did the send stage: one that found them all at the relay
        // leaves the stage as the run that sent them recorded it.
        if let Some(started_at) = started_at {
            note(
                "a stage",
                self.setup
                    .catalog
                    .stage(batch_key, Stage::Send, started_at, Some(now_us())),
            );
        }
        if let Some(print) = self.setup.on_finished {
            print(&report);
        }
        self.finished.lock().push(report);
    }

    /// After a prepare pass ended early (a sink failure stops it): every batch still queued
    /// or unfinished fails, to be admitted again by a later scan or run.
    fn abandon_unfinished(&self) {
        while let Some(job) = self.queue.take_any() {
            self.batch_of.lock().remove(&job.id);
        }
        let flights: Vec<(BatchKey, InFlight)> = self.in_flight.lock().drain().collect();
        for (key, mut flight) in flights {
            let error = format!(
                "{} files not sent: an earlier failure stopped the pass",
                flight.pending_files
            );
            flight.report.failed += flight.pending_files;
            self.fail(&flight.report.batch, None, &error);
            flight.report.errors.push(error);
            self.finish(&key, flight);
        }
    }

    /// Sends until the queue is closed and empty, each batch sealed as it completes.
    pub fn send_queued(&self, quiet: bool) {
        let edge = self.setup.settings;
        let prepare = Prepare::new(edge.prepare.clone(), &edge.recipients, &edge.key);
        std::thread::scope(|early_seals| {
            let sink = UploadSink {
                client: self.setup.client,
                batch_of: &self.batch_of,
                retry: self.setup.retry,
                catalog: self.setup.catalog,
                sealed: Default::default(),
                on_final: &|manifest| self.object_final(manifest, early_seals),
                on_done: &|outcomes, sealed| self.object_done(outcomes, sealed),
                on_held: &|id| {
                    self.refused_as_held.lock().insert(id);
                },
                on_sending: &|id, sha256| self.sending(id, sha256),
            };
            let queued = self.queue.totals();
            let (files, bytes) = (queued.items, queued.bytes);
            let publish = || {
                // Everything admitted and not finished: queued, being prepared, or uploading
                // (and waiting for a relay that does not answer).
                let flights = self.in_flight.lock();
                let files = flights.values().map(|f| f.pending_files).sum();
                let bytes = flights
                    .values()
                    .flat_map(|f| f.pending_bytes.values())
                    .sum();
                forte_daemon::monitor::queue(Role::Edge, flights.len(), files, bytes);
                forte_daemon::monitor::zstd_level(prepare.totals.level.load(Ordering::Relaxed));
            };
            let tuning = self.setup.tune.then(|| Tuning {
                client: self.setup.client,
                catalog: self.setup.catalog,
                prepare: &prepare,
                gate: &edge.prepare.sink,
                queued,
                part_size: edge.prepare.part_size,
            });
            std::thread::scope(|tuner| {
                let (stop_tuning, tuning_stopped) = std::sync::mpsc::channel::<()>();
                if let Some(tuning) = &tuning {
                    tuner.spawn(move || tuning.run(tuning_stopped));
                }
                forte_daemon::monitor::while_running(
                    Role::Edge,
                    &prepare.pipeline,
                    publish,
                    || {
                        // The bar's ETA is the dashboard's, read from the catalogue.
                        let eta = (!quiet).then(|| {
                            let order = self.setup.policy.eta_order();
                            let part_size = edge.prepare.part_size;
                            DashboardEta::new(self.setup.catalog, Role::Edge, part_size, order)
                        });
                        prepare_with_progress(&prepare, files, bytes, quiet, eta.as_ref(), || {
                            prepare.run_from(self, &sink)
                        })
                    },
                );
                drop(stop_tuning);
            });
            self.abandon_unfinished();
        });
    }
}

/// What sealing a finished batch at the relay needs of its flight.
struct Seal<'m> {
    /// Every object of the batch not yet delivered.
    members: &'m [ObjectId],
    /// The inventory entries of its files, unless they went with a seal beside the last
    /// uploads.
    entries: Vec<InventoryEntry>,
    /// The answer to the seal sent beside the last uploads, if one was.
    early_seal: Option<Receiver<EarlySeal>>,
}

/// A batch seal to send beside the batch's last uploads.
pub(super) struct SealBeside {
    batch_key: BatchKey,
    name: String,
    members: Vec<ObjectId>,
    entries: Vec<InventoryEntry>,
    answer_to: Sender<EarlySeal>,
}

/// The flight's seal, taken when it may go beside the last uploads: every object's last
/// request started, every file listed, nothing failed, not taken before, and for a batch new
/// to the catalogue the relay said it held none of it sealed or delivered (the answer usually
/// comes long before the last upload; if not, it sends the seal when it comes).
pub(super) fn seal_beside(batch_key: &BatchKey, flight: &mut InFlight) -> Option<SealBeside> {
    let listed = flight.unsealed == 0 && flight.unlisted_files == 0;
    if !listed || flight.report.failed > 0 || flight.early_seal.is_some() || flight.held_before {
        return None;
    }
    if let Some(asked) = &flight.asked {
        if asked.get() != Some(HeldBefore::Nothing) {
            return None;
        }
    }
    let (answer_to, answer) = std::sync::mpsc::channel();
    flight.early_seal = Some(answer);
    Some(SealBeside {
        batch_key: batch_key.clone(),
        name: flight.name.clone(),
        members: flight.members.clone(),
        entries: std::mem::take(&mut flight.entries),
        answer_to,
    })
}

/// The instance as the inventory signs it, from the edge's record of it.
fn signed_instance(row: forte_catalog::InstanceRow) -> Instance {
    let history = row.history;
    let supersedes = history.supersedes.into_iter();
    Instance {
        site: row.site,
        id: row.instance,
        epoch: history.epoch,
        epoch_from: history.epoch_from as u64,
        sequence: row.sequence as u64,
        sealed_at: row.sealed_at,
        generation: history.generation as u64,
        supersedes: supersedes
            .map(|e| forte_format::Superseded {
                content: e.content,
                instance: e.instance,
                sequence: e.sequence as u64,
            })
            .collect(),
    }
}
