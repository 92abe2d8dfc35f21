//! Delivering a sealed batch: what was fetched ahead plus the rest, checked against the edge's
//! signed inventory, committed all or nothing, copied to the second destination, acknowledged
//! whole at the relay, and every step recorded.

use std::path::{Path, PathBuf};

use anyhow::Result;
use forte_catalog::FileState::{self, Acknowledged, Delivered};
use forte_catalog::Stage;
use forte_catalog::{now_us, BatchKey, BatchRecord, BatchState, FileRecord, PartHashes, PartState};
use forte_format::ObjectId;
use forte_relay::api::ReadyObject;
use forte_restore::{Restore, RestoreFailure, UntrustedObjects};

use super::ahead::{Ahead, PullStart, Taken};
use super::copy::clear_scratch;
use super::custody::{Instance, Replayed};
use super::landing::BatchNamed;
use super::lease::{Held, LeaseLost};
use super::{batch_key_of, sealed_bytes, Core, DeliveryReport};
use crate::download::RelaySource;
use forte_daemon::record::note;
use forte_daemon::retry::Operation;
use forte_daemon::settings::OnChanged;
use forte_daemon::tasks::{Point, Refusal};

/// Where the earlier versions of files replaced by a later instance of their batch are kept,
/// under the destination (on its file system, so keeping one is a second name, not a copy),
/// at their own relative paths.
pub const REPLACED_DIR: &str = ".forte-replaced";

/// One sealed batch being delivered: its key, where the relay keeps it, what it is.
struct Sealed<'o> {
    key: BatchKey,
    objects: &'o [ReadyObject],
}

impl Sealed<'_> {
    fn site(&self) -> &str {
        &self.objects[0].site
    }

    /// The batch's id at the relay.
    fn id(&self) -> &str {
        &self.objects[0].batch
    }

    /// The batch as its tasks are told of it, by its `name`.
    fn named<'a>(&'a self, name: &'a str) -> BatchNamed<'a> {
        BatchNamed {
            key: &self.key,
            site: self.site(),
            name,
        }
    }

    /// The report of the batch before anything of it is delivered.
    fn new_report(&self) -> DeliveryReport {
        DeliveryReport {
            site: self.site().to_owned(),
            batch: self.id().to_owned(),
            objects: self.objects.len(),
            delivered_files: 0,
            already_delivered: 0,
            bytes: 0,
            seconds: 0.0,
            error: None,
            rejected_parts: Vec::new(),
            quarantined: None,
            after_delivery: Vec::new(),
            replay: None,
        }
    }
}

/// What committing a batch learned of it, kept whether or not the commit succeeded.
#[derive(Default)]
struct Learned {
    /// The batch's name, found in its verified manifests.
    name: Option<String>,
    /// Its instance, from its signed inventory once custody was checked (`None` for a batch
    /// sealed before inventories named their instance).
    instance: Option<Instance>,
}

/// A batch committed: what was delivered, the lease (which the acknowledgement needs), and the
/// landing directory if it landed for its core tasks.
struct Committed {
    delivered: forte_restore::Delivered,
    held: Held,
    landed: Option<PathBuf>,
    /// With `pull.on_changed = "keep-first"`, the targets a later version of the batch would
    /// have replaced: then nothing was committed, and the instance is refused.
    refused: Vec<String>,
}

/// A committed batch's verified files, and the lease that must still hold when they are
/// recorded and acknowledged.
struct Verified {
    delivered: forte_restore::Delivered,
    held: Held,
}

/// A landed batch that a core task refused: where the quarantine keeps it, and why.
struct Quarantine {
    kept: PathBuf,
    refusals: Vec<Refusal>,
}

/// A committed batch after the site's core tasks.
enum Checked {
    /// In the destination: it did not land, or its tasks passed and it was promoted.
    InPlace(Verified),
    /// A task refused it: it is in the quarantine.
    Quarantined {
        verified: Verified,
        quarantine: Quarantine,
    },
}

impl Core<'_> {
    /// Delivers one sealed batch, all or nothing, and acknowledges it at the relay. `None` when
    /// another worker holds the batch, or took it over from this one: it delivers it.
    pub fn pull_batch(
        &self,
        restore: &Restore,
        objects: Vec<ReadyObject>,
    ) -> Option<DeliveryReport> {
        let batch = Sealed {
            key: batch_key_of(&objects),
            objects: &objects,
        };
        let Taken { start, ahead } = self.take_ahead(&batch.key, &objects)?;
        let mut report = batch.new_report();
        self.record_batch(&batch, &report.batch, BatchState::Pulling, None);
        let mut learned = Learned::default();
        let result = ahead.and_then(|ahead| self.commit(restore, &batch, ahead, &mut learned));
        if let Some(name) = learned.name {
            report.batch = name;
        }
        let instance = learned.instance;
        let supersedes = instance.as_ref().is_some_and(Instance::supersedes_earlier);
        let result = match result {
            Ok(committed) if !committed.refused.is_empty() => {
                self.refuse_later_version(&batch, &mut report, committed, instance.as_ref());
                // Its row keeps saying how the first version was kept.
                return Some(self.end(&batch, report, start, false));
            }
            result => result,
        };
        // Landed: the site's tasks decide between promotion and quarantine.
        let result = result
            .and_then(|committed| self.check_landed(&batch, &report.batch, committed, supersedes));
        let result = match result {
            Ok(Checked::Quarantined {
                verified,
                quarantine,
            }) => {
                let instance = instance.as_ref();
                self.keep_quarantined(&batch, &mut report, verified, quarantine, instance);
                return Some(self.end(&batch, report, start, true));
            }
            Ok(Checked::InPlace(verified)) => Ok(verified),
            Err(e) => Err(e),
        };
        // The second copy must exist before the relay may delete anything.
        let result = result.and_then(|verified| {
            self.replicate(&verified.delivered, supersedes)?;
            Ok(verified)
        });
        let result = result.and_then(|verified| {
            verified.held.check("recording and acknowledging it")?;
            Ok(verified)
        });
        match result {
            Ok(verified) => {
                self.record_and_acknowledge(&batch, &mut report, verified, instance.as_ref())?
            }
            Err(e) => return self.not_delivered(&batch, report, start, e, instance.as_ref()),
        }
        Some(self.end(&batch, report, start, true))
    }

    /// The bucket that is the destination, then the second copy: each holds every file,
    /// verified, before anything is acknowledged; a later version of the batch (`supersedes`)
    /// replaces the earlier files there too, each kept.
    fn replicate(&self, delivered: &forte_restore::Delivered, supersedes: bool) -> Result<()> {
        let may_replace = supersedes && self.setup.on_changed == OnChanged::Replace;
        for copy in self.setup.into_bucket.iter().chain(&self.setup.copy_to) {
            copy.replicate(self.setup.dest, &delivered.placed, may_replace)?;
        }
        if self.setup.into_bucket.is_some() {
            clear_scratch(self.setup.dest, &delivered.placed);
        }
        Ok(())
    }

    /// Records a verified batch delivered, keeps its instance with the core's receipt, and
    /// acknowledges it at the relay; then runs the tasks that follow delivery. `None` when the
    /// lease was lost meanwhile (said on stderr): the worker that took the batch over delivers
    /// it.
    fn record_and_acknowledge(
        &self,
        batch: &Sealed<'_>,
        report: &mut DeliveryReport,
        verified: Verified,
        instance: Option<&Instance>,
    ) -> Option<()> {
        let Verified { delivered, held } = verified;
        if !delivered.inventory {
            tracing::warn!("batch {} of {} carries no signed inventory (sealed by an edge before object format 2): every file was verified, but nothing proves that the relay offered all of them",
                report.batch,
                batch.site()
            );
        }
        report.delivered_files = delivered.files;
        report.already_delivered = delivered.already;
        report.bytes = delivered.bytes;
        // What was delivered is in the catalogue before the relay may forget the batch:
        // a puller killed after the acknowledgement could never record it again.
        self.record_delivered(&batch.key, &delivered, &held.signature());
        self.record_batch(batch, &report.batch, BatchState::Delivered, None);
        let outcome = forte_format::Outcome::Delivered;
        let kept = self.keep(batch, &held, instance, outcome, &delivered.placed);
        report.error = match kept {
            Ok(receipt) => self
                .acknowledge(batch, &report.batch, &delivered, receipt.as_deref())
                .err(),
            Err(e) if e.downcast_ref::<LeaseLost>().is_some() => {
                tracing::warn!("{e}");
                return None;
            }
            Err(e) => Some(format!("delivered, but not acknowledged: {e:#}")),
        };
        if report.error.is_none() {
            held.delivered();
            report.after_delivery = self.check_delivered(batch, &report.batch, &delivered);
        }
        Some(())
    }

    /// Ends a batch that was not delivered, for `e`: `None` when the lease was lost (said on
    /// stderr: the worker that took the batch over delivers it); a batch delivered before is
    /// acknowledged ([`Core::acknowledge_replayed`]); any other failure is recorded, with the
    /// damaged parts reported to the relay.
    fn not_delivered(
        &self,
        batch: &Sealed<'_>,
        mut report: DeliveryReport,
        start: PullStart,
        e: anyhow::Error,
        instance: Option<&Instance>,
    ) -> Option<DeliveryReport> {
        if e.downcast_ref::<LeaseLost>().is_some() {
            tracing::warn!("{e}");
            return None;
        }
        if e.downcast_ref::<Replayed>().is_some() {
            let replayed = e.downcast::<Replayed>().expect("checked above");
            return Some(self.acknowledge_replayed(batch, report, start, replayed));
        }
        if let Some(failure) = e.downcast_ref::<RestoreFailure>() {
            self.record_failure(batch, failure, &mut report);
        }
        // Manifests that do not open are the relay's copies gone bad only if the
        // batch's inventory opened with the same keys (else the keys are wrong).
        if let Some(untrusted) = e.downcast_ref::<UntrustedObjects>() {
            if instance.is_some() {
                self.record_failure(batch, &untrusted.0, &mut report);
            }
        }
        report.error = Some(format!("{e:#}"));
        Some(self.end(batch, report, start, true))
    }

    /// Acknowledges at the relay a batch whose instance was delivered before (`replayed`), with
    /// the receipt kept then, and ends it.
    fn acknowledge_replayed(
        &self,
        batch: &Sealed<'_>,
        mut report: DeliveryReport,
        start: PullStart,
        replayed: Replayed,
    ) -> DeliveryReport {
        let receipt = replayed.known.receipt.as_deref().map(str::as_bytes);
        // This very instance of this very batch, delivered before by this catalogue: what it
        // delivered is what is acknowledged, not what the relay lists now (an object of another batch it lists
        // under this one would be deleted with it, withheld for good).
        let this_delivery = replayed.superseded.is_none() && replayed.known.batch_key == batch.key;
        let carriers = this_delivery
            .then(|| self.delivered_carriers(&batch.key, &replayed.known))
            .flatten();
        let listed: Vec<ObjectId> = batch.objects.iter().map(|o| o.id).collect();
        let ids = carriers.as_deref().unwrap_or(&listed);
        report.error = self
            .acknowledge_objects(batch, &report.batch, ids, receipt)
            .err()
            .map(|e| format!("{replayed}; but {e}"));
        report.replay = Some(replayed.to_string());
        tracing::warn!(
            "batch {} of site {}: {replayed}",
            report.batch,
            batch.site()
        );
        // This very batch, kept before (its acknowledgement did not reach the relay):
        // its row already says how it was kept, under its name. Recorded again it
        // turned a quarantined batch into a delivered one, named by its key. Its files
        // are acknowledged now.
        let record = replayed.known.batch_key != batch.key;
        if !record && report.error.is_none() {
            self.learn_acknowledged(&batch.key, "acknowledged by a later pull");
        }
        self.end(batch, report, start, record)
    }

    /// Records how the batch ended (its row only if `record`), and its pull stage.
    fn end(
        &self,
        batch: &Sealed<'_>,
        mut report: DeliveryReport,
        start: PullStart,
        record: bool,
    ) -> DeliveryReport {
        report.seconds = start.started.elapsed().as_secs_f64();
        let state = report.outcome();
        self.backoff.after(&batch.key, state == BatchState::Failed);
        if record {
            self.record_batch(batch, &report.batch, state, report.error.as_deref());
        }
        let ended = Some(now_us());
        let stage = self
            .setup
            .catalog
            .stage(&batch.key, Stage::Pull, start.started_at, ended);
        note("a stage", stage);
        report
    }

    /// Runs the site's core tasks on a batch that landed in its landing directory
    /// (`committed.landed`, named `name`); promotes it when they all pass, or moves it to the
    /// quarantine: where it is and why. A batch that did not land is in place already.
    fn check_landed(
        &self,
        batch: &Sealed<'_>,
        name: &str,
        committed: Committed,
        supersedes: bool,
    ) -> Result<Checked> {
        let Committed {
            delivered,
            held,
            landed,
            ..
        } = committed;
        let verified = Verified { delivered, held };
        let Some(dir) = landed else {
            return Ok(Checked::InPlace(verified));
        };
        let landing = self
            .landing
            .expect("a batch lands only with a landing zone");
        self.record_batch(batch, name, BatchState::Checking, None);
        let who = batch.named(name);
        let placed = &verified.delivered.placed;
        let refusals = landing.check(Point::Core, who, &dir, placed, self.setup.catalog);
        if refusals.is_empty() {
            verified.held.check("promoting it")?;
            let mut verified = verified;
            let replace = self.replaced_dir(supersedes);
            let replaced = landing.promote(&dir, self.setup.dest, replace.as_deref())?;
            let delivered = &mut verified.delivered;
            delivered
                .replaced
                .extend(replaced_files(&delivered.placed, replaced));
            return Ok(Checked::InPlace(verified));
        }
        let kept = landing.quarantine(&dir, batch.site(), batch.id(), &refusals)?;
        let quarantine = Quarantine { kept, refusals };
        Ok(Checked::Quarantined {
            verified,
            quarantine,
        })
    }

    /// A batch a task refused is kept in quarantine, durably: its files are recorded failed
    /// with the reasons, and the relay may delete it.
    fn keep_quarantined(
        &self,
        batch: &Sealed<'_>,
        report: &mut DeliveryReport,
        verified: Verified,
        quarantine: Quarantine,
        instance: Option<&Instance>,
    ) {
        let Verified { delivered, held } = verified;
        let Quarantine { kept, refusals } = quarantine;
        let reasons: Vec<String> = refusals.iter().map(ToString::to_string).collect();
        let error = format!("quarantined in {}: {}", kept.display(), reasons.join("; "));
        for p in delivered.placed.iter().filter(|p| !p.already) {
            let object = p.id.to_string();
            let file = FileRecord {
                raw_sha256: Some(&p.sha256),
                detail: Some(&error),
                ..FileRecord::new(&batch.key, &object, &p.path, p.size, FileState::Failed)
            };
            note("a quarantined file", self.setup.catalog.file_state(&file));
        }
        // A task that changed the batch left other bytes than those verified in the
        // quarantine: the receipt lists only the files it still holds as verified, so the
        // edge keeps the sources of the others (they exist nowhere else once the relay forgets
        // the batch).
        let still_verified = held_as_verified(&kept, &delivered.placed);
        report.quarantined = Some(kept);
        // Recorded before the relay may forget the batch, as a delivered one is.
        let state = BatchState::Quarantined;
        self.record_batch(batch, &report.batch, state, Some(&error));
        let outcome = forte_format::Outcome::Quarantined;
        let acknowledged = match self.keep(batch, &held, instance, outcome, &still_verified) {
            Ok(receipt) => self
                .acknowledge_at_relay(batch, &report.batch, receipt.as_deref())
                .map_err(|e| format!("quarantined, but {e}")),
            Err(e) => Err(format!("quarantined, but not acknowledged: {e:#}")),
        };
        report.error = Some(match acknowledged {
            Ok(()) => {
                held.delivered();
                error
            }
            Err(e) => format!("{error}; {e}"),
        });
    }

    /// Refuses a later version of a batch whose earlier files stay (`pull.on_changed =
    /// "keep-first"`), once and explicitly: a signed receipt of outcome `refused` listing no
    /// file is kept and given with the acknowledgement, so the relay drops the instance, a
    /// replay of it is known, and the edge reports it and deletes nothing on its word.
    fn refuse_later_version(
        &self,
        batch: &Sealed<'_>,
        report: &mut DeliveryReport,
        committed: Committed,
        instance: Option<&Instance>,
    ) {
        let Committed { held, refused, .. } = committed;
        let why = format!(
            "refused: this later version of batch {} would replace {} file(s) delivered before ({}); pull.on_changed = \"keep-first\" keeps the first version",
            report.batch,
            refused.len(),
            refused.join(", ")
        );
        let outcome = forte_format::Outcome::Refused;
        let acknowledged = match self.keep(batch, &held, instance, outcome, &[]) {
            Ok(receipt) => self
                .acknowledge_at_relay(batch, &report.batch, receipt.as_deref())
                .map_err(|e| format!("refused, but {e}")),
            Err(e) => Err(format!("refused, but not acknowledged: {e:#}")),
        };
        report.error = Some(match acknowledged {
            Ok(()) => {
                held.delivered();
                format!("{why}: acknowledged with a signed refusal, which the edge reports")
            }
            Err(e) => format!("{why}; {e}"),
        });
    }

    /// Makes what was delivered durable in the catalogue before the relay may forget the
    /// batch: its files' records, and its instance with the signed receipt (over the files
    /// `kept`), which is returned for the acknowledgement. The error says what is missing.
    fn keep(
        &self,
        batch: &Sealed<'_>,
        held: &Held,
        instance: Option<&Instance>,
        outcome: forte_format::Outcome,
        kept: &[forte_restore::Placed],
    ) -> Result<Option<Vec<u8>>> {
        self.setup
            .catalog
            .flush()
            .map_err(|e| e.context("the catalogue must record it first"))?;
        match instance {
            Some(instance) => self.keep_instance(&batch.key, held, instance, outcome, kept),
            None => Ok(None),
        }
    }

    /// Runs the tasks that follow delivery on the delivered batch: what they reported.
    fn check_delivered(
        &self,
        batch: &Sealed<'_>,
        name: &str,
        delivered: &forte_restore::Delivered,
    ) -> Vec<String> {
        let Some(landing) = self.landing else {
            return Vec::new();
        };
        let who = batch.named(name);
        landing
            .check(
                Point::Delivered,
                who,
                self.setup.dest,
                &delivered.placed,
                self.setup.catalog,
            )
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// Stages what was not fetched ahead and commits the whole batch, provided the relay
    /// listed exactly the objects of the edge's signed inventory and this worker still holds
    /// the batch: into the destination, or with core tasks into its landing directory. Sets
    /// what it `learned`: the batch's name, found in its verified manifests, and its instance.
    /// Returns what was delivered, the lease, which the acknowledgement needs, and the landing
    /// directory if it landed.
    fn commit(
        &self,
        restore: &Restore,
        batch: &Sealed<'_>,
        mut ahead: Ahead,
        learned: &mut Learned,
    ) -> Result<Committed> {
        let held = ahead.held.take().expect("a batch being delivered is held");
        let inventory = restore.inventory(&RelaySource {
            client: self.setup.client,
            retry: super::DOWNLOAD_RETRY,
            catalog: self.setup.catalog,
            batch_key: &batch.key,
            objects: batch.objects.to_vec(),
        })?;
        // Before anything is staged or placed: the site it goes under, and whether it is new,
        // come from what its edge signed.
        learned.instance = self.check_custody(&batch.key, batch.site(), inventory.as_ref())?;
        // Only what the batch's seal lists: fetched ahead, an earlier instance's object may be
        // staged too.
        let sealed: std::collections::HashSet<_> = batch.objects.iter().map(|o| o.id).collect();
        ahead.staged.keep_only(&sealed);
        let rest = ahead.not_staged(batch.objects.to_vec());
        if !rest.is_empty() {
            let more = self.stage(restore, rest, &batch.key, &mut ahead);
            learned.name.clone_from(&ahead.name);
            ahead.staged.extend(more?);
        }
        learned.name.clone_from(&ahead.name);
        held.check("placing its files")?;
        let landed = match self.landing {
            Some(landing) if !landing.tasks.at(Point::Core).is_empty() => {
                Some(landing.clear(batch.site(), batch.id())?)
            }
            _ => None,
        };
        // A later version of the batch replaces the files of earlier ones, each kept; or, to
        // keep the first version, is refused whole.
        let supersedes = learned
            .instance
            .as_ref()
            .is_some_and(Instance::supersedes_earlier);
        if supersedes && self.setup.on_changed == OnChanged::KeepFirst {
            let refused = ahead.staged.in_the_way(self.setup.dest);
            if !refused.is_empty() {
                return Ok(Committed {
                    delivered: forte_restore::Delivered::nothing(),
                    held,
                    landed,
                    refused,
                });
            }
        }
        let replace = self.replaced_dir(supersedes);
        let delivered = restore.commit(
            std::mem::take(&mut ahead.staged),
            &ahead.staging,
            landed.as_deref().unwrap_or(self.setup.dest),
            inventory.as_ref(),
            replace.as_deref(),
        )?;
        Ok(Committed {
            delivered,
            held,
            landed,
            refused: Vec::new(),
        })
    }

    /// Where the files a batch replaces are kept, if it may replace any: a later version of
    /// its batch (`supersedes`).
    fn replaced_dir(&self, supersedes: bool) -> Option<PathBuf> {
        supersedes.then(|| self.setup.dest.join(REPLACED_DIR))
    }

    /// Records the batch's state, with its totals as the relay listed them, and what the
    /// change was about (a failed batch's error).
    fn record_batch(
        &self,
        batch: &Sealed<'_>,
        name: &str,
        state: BatchState,
        detail: Option<&str>,
    ) {
        let record = BatchRecord {
            key: &batch.key,
            name,
            files: batch.objects.len() as u64,
            bytes: sealed_bytes(batch.objects),
            state,
            arrived: None,
            detail,
        };
        note("a batch", self.setup.catalog.batch_state(&record));
    }

    /// Records every delivered file and its verified parts; `by` names the worker in each
    /// file's lineage.
    fn record_delivered(&self, key: &BatchKey, delivered: &forte_restore::Delivered, by: &str) {
        let again = format!("already in place from an earlier pull; {by}");
        for p in &delivered.placed {
            let object = p.id.to_string();
            for (index, raw, sealed) in &p.parts {
                let hashes = PartHashes {
                    raw_sha256: Some(raw),
                    ciphertext_sha256: Some(sealed),
                    ..Default::default()
                };
                let part = self.setup.catalog.part_state(
                    key,
                    &object,
                    *index,
                    PartState::Verified,
                    &hashes,
                );
                note("a verified part", part);
            }
            let carrier = (p.carrier != p.id).then(|| p.carrier.to_string());
            let replacing = delivered.replaced.iter().find(|r| r.by == p.id);
            let replaced = replacing.map(|r| {
                format!(
                    "{by}; replaced the earlier version (SHA-256 {}), kept as {}",
                    r.sha256,
                    r.kept_as.display()
                )
            });
            let file = FileRecord {
                carrier: carrier.as_deref(),
                raw_sha256: Some(&p.sha256),
                delivered_to: Some(&p.target),
                detail: Some(match (&replaced, p.already) {
                    (Some(replaced), _) => replaced,
                    (None, true) => &again,
                    (None, false) => by,
                }),
                ..FileRecord::new(key, &object, &p.path, p.size, Delivered)
            };
            note("a delivered file", self.setup.catalog.file_state(&file));
        }
        self.record_replaced(key, &delivered.replaced);
    }

    /// Records each earlier version the delivery replaced as such, in its own lineage, with
    /// where it is kept.
    fn record_replaced(&self, key: &BatchKey, replaced: &[forte_restore::Replaced]) {
        if replaced.is_empty() {
            return;
        }
        let rows = self.setup.catalog.files(key).unwrap_or_default();
        for r in replaced {
            tracing::info!(
                "{}: replaced by a later version of its batch; the earlier version (SHA-256 {}) is kept as {}",
                r.target,
                r.sha256,
                r.kept_as.display()
            );
            let earlier = rows.iter().filter(|f| {
                f.delivered_to.as_deref() == Some(r.target.as_str())
                    && f.object_id != r.by.to_string()
                    && matches!(f.state, Delivered | Acknowledged)
            });
            for f in earlier {
                let detail = format!(
                    "replaced by object {} at {}; kept as {}",
                    r.by,
                    r.target,
                    r.kept_as.display()
                );
                let file = FileRecord {
                    raw_sha256: f.raw_sha256.as_deref(),
                    delivered_to: Some(&r.target),
                    detail: Some(&detail),
                    ..FileRecord::new(
                        key,
                        &f.object_id,
                        &f.path,
                        f.size as u64,
                        FileState::Replaced,
                    )
                };
                note("a replaced file", self.setup.catalog.file_state(&file));
            }
        }
    }

    /// Acknowledges the whole batch at the relay, which never lists it again with some of its
    /// objects gone (its inventory would rightly refuse that), and records it. A batch
    /// delivered but not acknowledged is found in place, and acknowledged, by the next pull.
    fn acknowledge(
        &self,
        batch: &Sealed<'_>,
        name: &str,
        delivered: &forte_restore::Delivered,
        receipt: Option<&[u8]>,
    ) -> Result<(), String> {
        self.acknowledge_at_relay(batch, name, receipt)
            .map_err(|e| format!("delivered, but {e}"))?;
        for p in &delivered.placed {
            let object = p.id.to_string();
            let file = FileRecord::new(&batch.key, &object, &p.path, p.size, Acknowledged);
            note("an acknowledgement", self.setup.catalog.file_state(&file));
        }
        Ok(())
    }

    /// Tells the relay it may delete the whole batch, handing it the core's receipt for the
    /// edge.
    fn acknowledge_at_relay(
        &self,
        batch: &Sealed<'_>,
        name: &str,
        receipt: Option<&[u8]>,
    ) -> Result<(), String> {
        let ids: Vec<_> = batch.objects.iter().map(|o| o.id).collect();
        self.acknowledge_objects(batch, name, &ids, receipt)
    }

    /// Tells the relay it may delete batch `batch` of objects `ids` (every one its seal
    /// lists, or it refuses).
    fn acknowledge_objects(
        &self,
        batch: &Sealed<'_>,
        name: &str,
        ids: &[ObjectId],
        receipt: Option<&[u8]>,
    ) -> Result<(), String> {
        let (client, site, id) = (self.setup.client, batch.site(), batch.id());
        self.setup
            .retry
            .run(
                Operation::Acknowledge,
                &format!("acknowledgement of batch {name}"),
                || client.ack_batch(site, id, ids, receipt),
            )
            .map_err(|e| format!("the acknowledgement failed: {e}"))
    }

    /// Records the failed parts of a refused batch and reports the damaged ones to the relay,
    /// which drops them for the sender to upload again.
    fn record_failure(
        &self,
        batch: &Sealed<'_>,
        failure: &RestoreFailure,
        report: &mut DeliveryReport,
    ) {
        // Problems of the batch's set of objects (its inventory) name no part.
        for p in &failure.problems {
            let Some(part) = p.part else { continue };
            let state = if p.damaged {
                PartState::Damaged
            } else {
                PartState::Failed
            };
            let object = p.object.to_string();
            let recorded = self.setup.catalog.part_state(
                &batch.key,
                &object,
                part,
                state,
                &Default::default(),
            );
            note("a failed part", recorded);
        }
        for p in failure.problems.iter().filter(|p| p.damaged) {
            let (rejected, what) = match p.part {
                Some(part) => (
                    self.setup.client.reject(batch.site(), p.object, part),
                    format!("object {} part {part}", p.object),
                ),
                None => (
                    self.setup.client.reject_manifest(batch.site(), p.object),
                    format!("object {} manifest", p.object),
                ),
            };
            match rejected {
                Ok(()) => report.rejected_parts.push(what),
                Err(e) => tracing::warn!("could not report damaged {what}: {e}"),
            }
        }
    }
}

/// The earlier versions a promotion replaced (`replaced`: each path under the destination
/// and where it is kept), each with the file of `placed` that took its place.
fn replaced_files(
    placed: &[forte_restore::Placed],
    replaced: Vec<(PathBuf, PathBuf)>,
) -> Vec<forte_restore::Replaced> {
    replaced
        .into_iter()
        .filter_map(|(target, kept_as)| {
            let by = placed.iter().find(|p| Path::new(&p.target) == target)?;
            Some(forte_restore::Replaced {
                target: by.target.clone(),
                sha256: forte_format::seal::sha256_file(&kept_as).unwrap_or_default(),
                kept_as,
                by: by.id,
            })
        })
        .collect()
}

/// The files of `placed` that the quarantined batch at `kept` still holds as verified (size
/// and SHA-256, and no other name for its bytes; a directory as a directory), or held in place
/// before.
fn held_as_verified(kept: &Path, placed: &[forte_restore::Placed]) -> Vec<forte_restore::Placed> {
    let holds = |p: &forte_restore::Placed| {
        let path = kept.join(&p.target);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            return false;
        };
        match p.kind {
            forte_format::Kind::Dir => meta.is_dir(),
            _ => {
                // Another name for its bytes (a task's hard link) could change them later.
                meta.is_file()
                    && std::os::unix::fs::MetadataExt::nlink(&meta) == 1
                    && meta.len() == p.size
                    && forte_format::seal::sha256_file(&path).is_ok_and(|h| h == p.sha256)
            }
        }
    };
    placed
        .iter()
        .filter(|p| p.already || holds(p))
        .cloned()
        .collect()
}
