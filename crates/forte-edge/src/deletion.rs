//! What happens to a batch after it was sent: a late file sends it again, a cancelled batch is
//! skipped, and acknowledged files are deleted at the source, one by one.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::SystemTime;

use anyhow::{Context, Result};
use forte_catalog::{BatchRow, BatchState, FileRow, Role};
use forte_format::{Kind, ObjectId, Receipt, ReceiptFile, TrustedCores};
use forte_fs::FileIdentity;
use forte_prepare::{discover, SourceFile};
use forte_relay::api::ObjectStatus;

use super::inbox::{marker_time_us, prune_empty_dirs, Batch, READY_MARKER};
use super::{object_id, Edge, Totals};
use forte_daemon::record::note;
use forte_daemon::retry::Operation;
use forte_daemon::units::human;

/// What `send --cancel` did to one batch.
#[derive(Debug, serde::Serialize)]
pub struct Cancelled {
    pub batch: String,
    /// Objects and bytes the relay deleted of it.
    pub objects: usize,
    pub bytes: u64,
    /// Its directory in the inbox, untouched.
    pub source: std::path::PathBuf,
    /// Why the relay did not cancel it (already reported through the failure hook).
    pub error: Option<String>,
}

impl Cancelled {
    /// One line for people.
    pub fn text(&self) -> String {
        match &self.error {
            None => format!(
                "batch {}: cancelled; the relay deleted {} objects ({}); the source is untouched (touch {}/{READY_MARKER} to send it again)\n",
                self.batch,
                self.objects,
                human(self.bytes),
                self.source.display()
            ),
            Some(e) => format!("batch {}: not cancelled: {e}\n", self.batch),
        }
    }
}

impl Edge<'_> {
    /// Whether a ready batch has anything to send: it was never sent, its last send failed, or
    /// files appeared in it after it was sent (they go as a follow-up, sealed into the same
    /// batch). Said once per batch and scan when it is a follow-up.
    pub fn needs_sending(&self, batch: &Batch) -> bool {
        let batch_key = self.batch_key(&batch.name);
        if self.held_back(batch).is_some() {
            return false;
        }
        let state = self
            .setup
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
        recover_deleting(&batch.dir);
        let Ok(mut found) = discover(&batch.dir) else {
            return false;
        };
        let rows = self.setup.catalog.files(&batch_key).unwrap_or_default();
        drop_emptied_dirs(&mut found.files, &rows);
        // A batch sent under an earlier signing key: its files' ids cannot be derived again,
        // so a file is known by its path and size.
        let earlier = self.earlier_keys.contains_key(&batch.name);
        let by_path: HashSet<(String, u64)> = rows
            .iter()
            .map(|f| (f.path.clone(), f.size as u64))
            .collect();
        let known: HashSet<String> = rows.into_iter().map(|f| f.object_id).collect();
        let (filter, now) = (&self.setup.settings.filter, SystemTime::now());
        let late: Vec<&str> = found
            .files
            .iter()
            .filter(|f| f.path != READY_MARKER)
            .filter(|f| filter.excludes_file(f, &batch.name, now).is_none())
            .filter(|f| match earlier {
                true => !by_path.contains(&(f.path.clone(), f.size)),
                false => !known
                    .contains(&object_id(&self.setup.settings.key, &batch.name, f).to_string()),
            })
            .map(|f| f.path.as_str())
            .collect();
        if late.is_empty() {
            return false;
        }
        tracing::info!("batch {}: {} file(s) appeared or changed after it was sent ({}); sending them as a follow-up",
            batch.name,
            late.len(),
            late.join(", ")
        );
        true
    }

    /// Whether a batch was cancelled (`send --cancel`) or refused by an edge task, and its
    /// ready marker not touched since: that state, to skip it.
    pub fn held_back(&self, batch: &Batch) -> Option<BatchState> {
        let row = self
            .setup
            .catalog
            .batch(&self.batch_key(&batch.name))
            .ok()
            .flatten();
        row.filter(|b| matches!(b.state, BatchState::Cancelled | BatchState::Refused))
            .filter(|b| marker_time_us(&batch.dir).is_none_or(|t| t <= b.updated_at))
            .map(|b| b.state)
    }

    /// Cancels batches of the inbox at the relay (`send --cancel`): deletes what the relay holds
    /// of each that the core has not taken, and records them as cancelled so that later runs
    /// skip them. The source files are not touched.
    pub fn cancel(&self, inbox: &Path, names: &[String]) -> Result<Vec<Cancelled>> {
        let mut done = Vec::new();
        for name in names {
            let dir = inbox.join(name);
            let found = discover(&dir).with_context(|| {
                format!("cannot cancel batch {name}: cannot read {}", dir.display())
            })?;
            let total = found.total_bytes();
            let files: Vec<SourceFile> = found
                .files
                .into_iter()
                .filter(|f| f.path != READY_MARKER)
                .collect();
            let file_count = files.len() as u64;
            let batch_key = self.batch_key(name);
            let rows = self.setup.catalog.files(&batch_key).unwrap_or_default();
            let objects = self.objects(name, files, &rows);
            let ids: Vec<ObjectId> = objects.iter().map(|j| j.id).collect();
            let what = format!("cancellation of batch {name}");
            match self.setup.retry.run(Operation::Cancel, &what, || {
                self.setup.client.cancel_batch(batch_key.batch(), &ids)
            }) {
                Ok(cancelled) => {
                    let (files, bytes) = (file_count, total);
                    self.record_batch(&batch_key, name, files, bytes, BatchState::Cancelled);
                    self.clear(name);
                    done.push(Cancelled {
                        batch: name.clone(),
                        objects: cancelled.objects,
                        bytes: cancelled.bytes,
                        source: dir,
                        error: None,
                    });
                }
                Err(e) => {
                    let error = format!("cannot cancel the batch at the relay: {e}");
                    self.fail(name, None, &error);
                    done.push(Cancelled {
                        batch: name.clone(),
                        objects: 0,
                        bytes: 0,
                        source: dir,
                        error: Some(error),
                    });
                }
            }
        }
        Ok(done)
    }

    /// Asks the relay about every batch this edge sent that the core has not given a receipt
    /// for, in one round of status queries, and marks for sending again each batch of which
    /// the relay no longer knows an object (neither holds nor delivered it: a relay that lost
    /// or dropped it). The next scan admits it again, asking the relay what it holds, and
    /// uploads and seals what is missing (the same content is the same instance, so a core
    /// that has it already takes it as a replay).
    pub fn find_lost(&self) {
        let Ok(batches) = self.setup.catalog.batches() else {
            return;
        };
        let sent = self.sent_not_settled(batches);
        let carriers = self.carriers_not_acknowledged(&sent);
        if carriers.is_empty() {
            return;
        }
        let ids: Vec<ObjectId> = carriers.keys().copied().collect();
        let Ok(known) = self.setup.client.statuses(&ids) else {
            return;
        };
        let Whereabouts {
            lost,
            not_delivered,
        } = whereabouts(&carriers, &known);
        self.settle_delivered(&sent, &not_delivered);
        self.send_lost_again(&sent, lost);
        note("a lost batch", self.setup.catalog.flush());
    }

    /// The batches this edge sent that are not in flight now, nor settled in this run.
    fn sent_not_settled(&self, batches: Vec<BatchRow>) -> Vec<BatchRow> {
        batches
            .into_iter()
            .filter(|b| b.role == Role::Edge && b.state == BatchState::Sent)
            .filter(|b| !self.in_flight.lock().contains_key(&b.batch_key))
            // Delivered, as far as the relay can tell: asked about once per run, not at every
            // pass for as long as the catalogue keeps it.
            .filter(|b| !self.settled.lock().contains(&b.batch_key))
            .collect()
    }

    /// The objects that carry the files of `sent` not recorded acknowledged, each with the
    /// batches (indices into `sent`) whose files it carries.
    fn carriers_not_acknowledged(&self, sent: &[BatchRow]) -> HashMap<ObjectId, Vec<usize>> {
        let mut carriers: HashMap<ObjectId, Vec<usize>> = HashMap::new();
        for (i, b) in sent.iter().enumerate() {
            let Ok(rows) = self.setup.catalog.files(&b.batch_key) else {
                continue;
            };
            let acknowledged = |r: &FileRow| r.state == forte_catalog::FileState::Acknowledged;
            // An excluded file was never sent: the relay holding none of it is no loss.
            let acknowledged =
                |r: &FileRow| acknowledged(r) || r.state == forte_catalog::FileState::Excluded;
            // A version of a file that failed (it changed while it was read) and was sent
            // again as a later version under another id: never sealed, so not lost either.
            let failed = forte_catalog::FileState::Failed;
            let sent_since: HashSet<&str> = rows
                .iter()
                .filter(|r| r.state != failed)
                .map(|r| r.path.as_str())
                .collect();
            let replaced = |r: &FileRow| r.state == failed && sent_since.contains(r.path.as_str());
            for r in rows.iter().filter(|r| !acknowledged(r) && !replaced(r)) {
                if let Ok(id) = r.at_relay().parse() {
                    carriers.entry(id).or_default().push(i);
                }
            }
        }
        carriers
    }

    /// Every object delivered, says the relay: the core's receipt must say so too, or the
    /// acknowledgement was not the core's (forged, or a core without a receipt key). Then
    /// the batch is settled for this run.
    fn settle_delivered(&self, sent: &[BatchRow], not_delivered: &HashSet<usize>) {
        for (i, b) in sent.iter().enumerate() {
            if not_delivered.contains(&i) {
                continue;
            }
            let receipted = match self.setup.receipts {
                Some(_) => match self.verified_receipts(b) {
                    Some(receipted) => Some(receipted),
                    // The relay could not be asked: again at the next pass.
                    None => continue,
                },
                None => None,
            };
            self.settled.lock().insert(b.batch_key.clone());
            if receipted.is_some_and(|r| r.is_empty()) {
                let error = "the relay says the core acknowledged this batch, but no receipt signed by the core (--receipt-pub) says so: its sources are kept; the relay may have lost it or forged the acknowledgement, or the core signs no receipts (pull --receipt-key)";
                self.fail(&b.name, None, error);
            }
        }
    }

    /// Reports each batch of `sent` the relay `lost` objects of and records it failed, so that
    /// the next scan admits it again.
    fn send_lost_again(&self, sent: &[BatchRow], lost: HashMap<usize, usize>) {
        for (i, objects) in lost {
            let b = &sent[i];
            let error = format!(
                "the relay no longer holds {objects} object(s) of this batch, sealed and not yet received by the core: sending them again"
            );
            self.fail(&b.name, None, &error);
            let totals = Totals {
                files: b.files as u64,
                bytes: b.bytes as u64,
            };
            let failed = BatchState::Failed;
            self.record_batch_as(&b.batch_key, &b.name, totals, failed, None, Some(&error));
        }
    }

    /// Deletes, in every sent batch, each source file that a custody receipt of the core lists
    /// with the SHA-256 its bytes still have (`remove_if_as_delivered`), and nothing else: a file that was skipped, failed, changed or appeared later
    /// stays, with its batch directory. A batch left with only files that can never be sent is
    /// reported once, through the failure hook.
    pub fn delete_acknowledged(&self, inbox: &Path) {
        let Ok(batches) = self.setup.catalog.batches() else {
            return;
        };
        // A batch whose sources were kept (a file could not be deleted, say) is tried again
        // once its ready marker is newer than that record: the operator fixed it and said so.
        let again = |b: &BatchRow| {
            b.state == BatchState::SourceKept
                && marker_time_us(&inbox.join(&b.name)).is_some_and(|t| t > b.updated_at)
        };
        for b in batches
            .into_iter()
            .filter(|b| b.role == Role::Edge && (b.state == BatchState::Sent || again(b)))
        {
            if !self.in_flight.lock().contains_key(&b.batch_key) {
                self.delete_batch(&inbox.join(&b.name), &b);
            }
        }
    }

    /// Deletes what the core acknowledged of one sent batch, in `dir`, and the batch directory
    /// once nothing else is left in it.
    fn delete_batch(&self, dir: &Path, b: &BatchRow) {
        recover_deleting(dir);
        let Ok(found) = discover(dir) else { return };
        let sources: Vec<SourceFile> = found
            .files
            .into_iter()
            .filter(|f| f.path != READY_MARKER)
            .collect();
        let Ok(rows) = self.setup.catalog.files(&b.batch_key) else {
            return;
        };
        let recorded: HashMap<&str, &FileRow> =
            rows.iter().map(|r| (r.object_id.as_str(), r)).collect();
        let mut carried = self.carried(b, sources, &rows, &recorded);
        // Only the core's signed receipts say what it keeps: the relay's word (its tombstones,
        // its answers) never deletes a source.
        let Some(receipted) = self.verified_receipts(b) else {
            return;
        };
        // The acknowledgement is kept before the source goes: a sender killed after deleting
        // a file could never record it again. Whether the file is still what the core keeps is
        // checked as it is removed (`remove_if_as_delivered`).
        for c in &mut carried {
            c.listed = receipted.get(&c.id).cloned();
        }
        if !self.record_acknowledged(b, &carried, &recorded) {
            return;
        }
        // What the filter leaves out now stays: it waits for no receipt and is never deleted,
        // even a file sent before the filter changed (its receipt is recorded above; the
        // operator excluding it says: leave it alone).
        let (filter, now) = (&self.setup.settings.filter, SystemTime::now());
        let before = carried.len();
        carried.retain(|c| filter.excludes_file(&c.source, &b.name, now).is_none());
        let excluded = before - carried.len();
        let never_sent = found
            .rejected
            .iter()
            .map(|(p, why)| format!("{}: never sent ({why})", p.display()));
        let mut done = delete_delivered(&files_of(carried));
        done.kept.extend(never_sent);
        prune_empty_dirs(dir);
        self.after_deletion(dir, b, done, excluded);
    }

    /// Each file of batch `b` (`sources`) with its own id and the object that carries it at the
    /// relay: the one the catalogue recorded (its bundle as sent, though some members may be
    /// deleted since), else the one it would travel in now. A bundle is delivered whole or not
    /// at all.
    fn carried(
        &self,
        b: &BatchRow,
        sources: Vec<SourceFile>,
        rows: &[FileRow],
        recorded: &HashMap<&str, &FileRow>,
    ) -> Vec<Carried> {
        self.objects(&b.name, sources, rows)
            .iter()
            .flat_map(|j| {
                j.files().into_iter().map(|(f, id)| {
                    let row = recorded.get(id.to_string().as_str());
                    let carrier = row.and_then(|r| r.at_relay().parse().ok());
                    Carried {
                        source: f.clone(),
                        id,
                        carrier: carrier.unwrap_or(j.id),
                        listed: None,
                    }
                })
            })
            .collect()
    }

    /// Records acknowledged every file of `carried` a receipt lists, and makes it durable:
    /// whether the files may be deleted now.
    fn record_acknowledged(
        &self,
        b: &BatchRow,
        carried: &[Carried],
        recorded: &HashMap<&str, &FileRow>,
    ) -> bool {
        for c in carried.iter().filter(|c| c.listed.is_some()) {
            let was = recorded.get(c.id.to_string().as_str()).map(|r| r.state);
            self.record_acknowledged_file(&b.batch_key, c.carrier, (&c.source, c.id), was);
        }
        if let Err(e) = self.setup.catalog.flush() {
            tracing::warn!(
                "batch {}: nothing deleted until the catalogue records the acknowledgements: {e:#}",
                b.name
            );
            return false;
        }
        true
    }

    /// After deleting what was acknowledged of batch `b` (`done`): removes its directory if only
    /// the ready marker is left, or records and reports what is kept for good.
    fn after_deletion(&self, dir: &Path, b: &BatchRow, done: Deletion, excluded: usize) {
        let Deletion {
            deleted,
            kept,
            waiting,
        } = done;
        let only_marker = std::fs::read_dir(dir)
            .map(|mut d| d.all(|e| e.is_ok_and(|e| e.file_name() == READY_MARKER)))
            .unwrap_or(false);
        let (files_n, bytes) = (b.files as u64, b.bytes as u64);
        // Only the marker left means nothing waits for an acknowledgement any more, and no
        // file was written into the batch since the scan. The marker goes, then the directory
        // only if empty: a file written meanwhile keeps it.
        if kept.is_empty() && only_marker {
            let removed = std::fs::remove_file(dir.join(READY_MARKER))
                .or_else(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => Ok(()),
                    _ => Err(e),
                })
                .and_then(|()| std::fs::remove_dir(dir));
            match removed {
                Ok(()) => {
                    let deleted = BatchState::SourceDeleted;
                    self.record_batch(&b.batch_key, &b.name, files_n, bytes, deleted);
                    self.clear(&b.name);
                    tracing::info!("batch {}: acknowledged by the core; source deleted", b.name);
                }
                Err(e) => {
                    let error = format!("cannot delete {}: {e}", dir.display());
                    self.fail(&b.name, None, &error);
                }
            }
        } else if waiting == 0 && kept.is_empty() && excluded > 0 {
            // Everything sent is acknowledged and deleted; the excluded files stay, on purpose.
            let kept_state = BatchState::SourceKept;
            self.record_batch(&b.batch_key, &b.name, files_n, bytes, kept_state);
            tracing::info!("batch {}: acknowledged by the core; {deleted} sent file(s) deleted, {excluded} excluded file(s) kept (forte status lists them)", b.name);
        } else if waiting == 0 && !kept.is_empty() {
            // Everything sendable is acknowledged and deleted; what is left never will be.
            let kept_state = BatchState::SourceKept;
            self.record_batch(&b.batch_key, &b.name, files_n, bytes, kept_state);
            let error = format!(
                "{deleted} acknowledged file(s) deleted; {} kept in {} and not deleted: {}",
                kept.len(),
                dir.display(),
                kept.join("; ")
            );
            self.fail(&b.name, None, &error);
        }
    }
}

impl Edge<'_> {
    /// Every file the core's receipts for batch `b` list, by object id: only receipts that
    /// verify with a trusted core key (`--receipt-pub`) and name this site count, and each
    /// such receipt is kept in the catalogue for audit. `None` when the relay cannot be asked.
    fn verified_receipts(&self, b: &BatchRow) -> Option<HashMap<ObjectId, ReceiptFile>> {
        let trusted = self.setup.receipts.as_ref()?;
        let site = self.setup.site.get(self.setup.client).ok()?;
        let documents = self.setup.client.receipts(b.batch_key.batch()).ok()?;
        let mut listed = HashMap::new();
        for document in documents {
            let refused = |why: String| {
                let digest = forte_format::seal::sha256_hex(&document);
                if self.refused_receipts.lock().insert(digest) {
                    self.fail(&b.name, None, &why);
                }
            };
            let receipt = match receipt_for(&document, trusted, site) {
                Ok(receipt) => receipt,
                Err(why) => {
                    refused(why);
                    continue;
                }
            };
            let text = String::from_utf8_lossy(&document);
            note(
                "a receipt",
                self.setup
                    .catalog
                    .keep_receipt(&receipt.site, &receipt.instance, &text),
            );
            if receipt.outcome == forte_format::Outcome::Refused {
                // Said once per refusal: the core keeps the version it delivered before.
                let digest = format!("refusal {}", forte_format::seal::sha256_hex(&document));
                if self.refused_receipts.lock().insert(digest) {
                    let why = format!("the core refused instance {} (sequence {}) of this batch, a later version of files it delivered before: it keeps the first version (pull.on_changed = \"keep-first\"); the changed files stay here, and nothing is deleted on that receipt", receipt.instance, receipt.sequence);
                    self.fail(&b.name, None, &why);
                }
            }
            listed.extend(receipt.files.into_iter().map(|f| (f.id, f)));
        }
        Some(listed)
    }
}

/// The receipt in `document` if it verifies with a trusted core key and names `site`; else
/// why it is ignored.
fn receipt_for(document: &[u8], trusted: &TrustedCores, site: &str) -> Result<Receipt, String> {
    match Receipt::open(document, trusted) {
        Ok(r) if r.site == site => Ok(r),
        Ok(r) => Err(format!("the relay offered a receipt of site {} for this site's batch: ignored (a relay swapping receipts?)", r.site)),
        Err(e) => Err(format!("the relay offered a receipt that does not verify ({e}): ignored, nothing deleted on its word")),
    }
}

/// A source file of a sent batch, and what deleting it depends on.
struct Carried {
    source: SourceFile,
    /// The file's own object id, which the core's receipt lists it by.
    id: ObjectId,
    /// The object that carries it at the relay: its own, or its bundle.
    carrier: ObjectId,
    /// What the core's receipt lists for it, if it lists it.
    listed: Option<ReceiptFile>,
}

/// Each file with what the core's receipt lists for it, if it lists it.
fn files_of(carried: Vec<Carried>) -> Vec<(SourceFile, Option<ReceiptFile>)> {
    carried.into_iter().map(|c| (c.source, c.listed)).collect()
}

/// Where the relay says the objects of sent batches are.
struct Whereabouts {
    /// By batch (its index), how many of its objects the relay no longer holds.
    lost: HashMap<usize, usize>,
    /// The batches (their indices) with an object the relay has not delivered.
    not_delivered: HashSet<usize>,
}

/// Where the `carriers` of sent batches are, by what the relay `known` of them.
fn whereabouts(
    carriers: &HashMap<ObjectId, Vec<usize>>,
    known: &HashMap<ObjectId, ObjectStatus>,
) -> Whereabouts {
    // Sealed or delivered is where a sent batch's objects belong; unknown (dropped) or
    // open again (a part or manifest the core found damaged, dropped by the relay) is lost.
    let held = |id: &ObjectId| {
        known.get(id).is_some_and(|s| {
            matches!(
                s.state,
                forte_relay::api::ObjectState::Complete | forte_relay::api::ObjectState::Delivered
            )
        })
    };
    let mut lost: HashMap<usize, usize> = HashMap::new();
    let mut not_delivered: HashSet<usize> = HashSet::new();
    for (id, batches) in carriers {
        let delivered = known
            .get(id)
            .is_some_and(|s| s.state == forte_relay::api::ObjectState::Delivered);
        if !delivered {
            not_delivered.extend(batches);
        }
        if !held(id) {
            for i in batches {
                *lost.entry(*i).or_default() += 1;
            }
        }
    }
    Whereabouts {
        lost,
        not_delivered,
    }
}

/// Removes `source` only if it is still the file the core's receipt lists. It is first renamed
/// to a hidden name beside it, atomically, so nothing a writer puts at its path from then on is
/// touched (a file replaced by `mv` after a check and before an unlink by path was deleted
/// unsent). The renamed file is then checked through its own descriptor: a regular file of the
/// receipt's size whose bytes hash to the receipt's SHA-256, its device, inode, size, mtime and
/// ctime unchanged while read, and the hidden name still naming it; only then is it unlinked.
/// Otherwise it is renamed back, never over a file written at its path since (then it is kept
/// as `NAME.forte-kept`). Its object id, which the receipt is looked up by, binds its path,
/// size and mtime when it was read; the hash is what catches a file rewritten with its size and
/// mtime kept (`cp -p`, `rsync -t`, `tar x`). Hashing always, not only when the metadata moved:
/// mtime can be set back by any writer, and ctime's granularity (a kernel tick) lets a rewrite
/// within one tick keep it; it costs about a second per GB (docs/benchmarks/log/2026-11.md).
fn remove_if_as_delivered(source: &SourceFile, listed: &ReceiptFile) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = &source.local;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let hidden = path.with_file_name(format!(".{name}.forte-deleting-{}", ObjectId::random()));
    std::fs::rename(path, &hidden).map_err(|e| format!("cannot delete: {e}"))?;
    let checked = (|| -> std::io::Result<bool> {
        // Not blocking: a FIFO put at the path would otherwise hold the open until a writer
        // came (a regular file reads the same either way).
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&hidden)?;
        let before = file.metadata()?;
        if !before.is_file() || before.len() != listed.size {
            return Ok(false);
        }
        let sha256 = forte_format::seal::sha256_of(&mut file)?;
        let after = file.metadata()?;
        let named = std::fs::symlink_metadata(&hidden)?;
        Ok(sha256 == listed.sha256
            && FileIdentity::of(&after) == FileIdentity::of(&before)
            && FileIdentity::of(&named) == FileIdentity::of(&before))
    })();
    if checked.unwrap_or(false) {
        return std::fs::remove_file(&hidden).map_err(|e| format!("cannot delete: {e}"));
    }
    let kept = match rename_no_replace(&hidden, path) {
        Ok(()) => path.clone(),
        Err(_) => {
            let aside = path.with_file_name(format!("{name}.forte-kept"));
            match rename_no_replace(&hidden, &aside) {
                Ok(()) => aside,
                Err(_) => hidden,
            }
        }
    };
    Err(format!(
        "changed after it was sent (its bytes are not those the core keeps); kept as {}; give it a new modification time (touch) to send it again",
        kept.display()
    ))
}

/// The marker of a file being deleted: `.NAME.forte-deleting-ID`.
const DELETING: &str = ".forte-deleting-";

/// Puts back, under `dir`, every file a sender killed in `remove_if_as_delivered` left under
/// its hidden name: at its own name if nothing is there, else beside it as `NAME.forte-kept`.
/// Then it is what it was before the deletion began (kept, or deleted at the next pass), never
/// a new file to send.
pub(super) fn recover_deleting(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            recover_deleting(&path);
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(original) = name
            .strip_prefix('.')
            .and_then(|n| n.rsplit_once(DELETING))
            .filter(|(_, id)| id.parse::<ObjectId>().is_ok())
            .map(|(original, _)| original.to_string())
        else {
            continue;
        };
        let back = dir.join(&original);
        if rename_no_replace(&path, &back).is_err() {
            let _ = rename_no_replace(&path, &dir.join(format!("{original}.forte-kept")));
        }
    }
}

/// Renames `from` to `to` unless something is at `to` already (`renameat2` with
/// `RENAME_NOREPLACE`): a file put back never replaces one written since.
fn rename_no_replace(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes());
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: two NUL-terminated paths that live across the call; no memory is shared.
    // The system call, not libc's wrapper: musl (the static builds) has none.
    let done = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if done == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Drops from a sent batch's `files` the empty directories that held files it sent (`rows`):
/// what deleting acknowledged files leaves when the sender is killed before it prunes them.
/// They are not new content, and the next deletion prunes them.
pub(super) fn drop_emptied_dirs(files: &mut Vec<SourceFile>, rows: &[FileRow]) {
    let held_sent_files: HashSet<&str> = rows
        .iter()
        .flat_map(|row| {
            let path = row.path.as_str();
            path.match_indices('/').map(move |(end, _)| &path[..end])
        })
        .collect();
    files.retain(|f| f.kind != Kind::Dir || !held_sent_files.contains(f.path.as_str()));
}

/// What deleting one batch's acknowledged files did.
#[derive(Debug, PartialEq)]
struct Deletion {
    deleted: usize,
    /// Files that could not be deleted, with why.
    kept: Vec<String>,
    /// Files the core has not acknowledged yet.
    waiting: usize,
}

/// Deletes each of `files` that a receipt lists, and nothing else: files first (each only if
/// still as delivered, `remove_if_as_delivered`), then directories deepest first, so a delivered
/// directory goes only once what it held is gone.
fn delete_delivered(files: &[(SourceFile, Option<ReceiptFile>)]) -> Deletion {
    let mut order: Vec<&(SourceFile, Option<ReceiptFile>)> = files.iter().collect();
    order.sort_by_key(|(f, _)| (f.kind == Kind::Dir, std::cmp::Reverse(f.path.len())));
    let mut done = Deletion {
        deleted: 0,
        kept: Vec::new(),
        waiting: 0,
    };
    for (file, listed) in order {
        let Some(listed) = listed else {
            done.waiting += 1;
            continue;
        };
        let removed = match file.kind {
            Kind::File | Kind::Bundle => remove_if_as_delivered(file, listed),
            Kind::Dir => {
                std::fs::remove_dir(&file.local).map_err(|e| format!("cannot delete: {e}"))
            }
        };
        match removed {
            Ok(()) => done.deleted += 1,
            Err(e) => done.kept.push(format!("{}: {e}", file.local.display())),
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use forte_catalog::FileState;

    /// A batch directory: `a/one`, `a/two` and `b` (a directory), as discovery finds them.
    fn batch() -> (tempfile::TempDir, Vec<(SourceFile, ObjectId)>) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a")).unwrap();
        std::fs::create_dir_all(dir.path().join("b")).unwrap();
        std::fs::write(dir.path().join("a/one"), b"1").unwrap();
        std::fs::write(dir.path().join("a/two"), b"2").unwrap();
        let files = discover(dir.path())
            .unwrap()
            .files
            .into_iter()
            .map(|f| {
                let id = ObjectId::derive(b"test", &[f.path.as_bytes()]);
                (f, id)
            })
            .collect();
        (dir, files)
    }

    /// A sender killed between deleting a directory's acknowledged files and pruning it
    /// leaves it empty: not something new to send. An empty directory that never held a sent
    /// file is.
    #[test]
    fn directories_emptied_by_deletion_are_not_new_content() {
        let (dir, _) = batch();
        std::fs::remove_file(dir.path().join("a/one")).unwrap();
        std::fs::remove_file(dir.path().join("a/two")).unwrap();
        let mut found = discover(dir.path()).unwrap().files;
        let sent = |path: &str| FileRow {
            object_id: path.into(),
            batch_key: forte_catalog::BatchKey::edge("batch"),
            path: path.into(),
            size: 1,
            raw_sha256: None,
            delivered_to: None,
            state: FileState::Acknowledged,
            updated_at: 0,
            carrier: None,
        };
        drop_emptied_dirs(&mut found, &[sent("a/one"), sent("a/two")]);
        let left: Vec<&str> = found.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(left, ["b"]);
    }

    /// Each file with a receipt entry of its bytes as they are when `delivered` says so of
    /// its id.
    fn marked(
        files: &[(SourceFile, ObjectId)],
        delivered: impl Fn(&ObjectId) -> bool,
    ) -> Vec<(SourceFile, Option<ReceiptFile>)> {
        let entry = |(f, id): &(SourceFile, ObjectId)| {
            let bytes = std::fs::read(&f.local).unwrap_or_default();
            let listed = ReceiptFile {
                id: *id,
                ..listed(&bytes)
            };
            (f.clone(), delivered(id).then_some(listed))
        };
        files.iter().map(entry).collect()
    }

    fn listed(bytes: &[u8]) -> ReceiptFile {
        ReceiptFile {
            id: ObjectId::random(),
            size: bytes.len() as u64,
            sha256: forte_format::seal::sha256_hex(bytes),
        }
    }

    fn one(dir: &Path) -> SourceFile {
        discover(dir)
            .unwrap()
            .files
            .into_iter()
            .find(|f| f.path == "a/one")
            .unwrap()
    }

    /// A file rewritten after it was read, with new bytes of the same size and its
    /// nanosecond mtime set back (`cp -p`, `rsync -t`, `tar x`): the same object id, so the
    /// receipt is found, but not the bytes the core keeps. It stays, named, where it was.
    #[test]
    fn a_file_rewritten_with_its_size_and_mtime_kept_is_not_deleted() {
        let (dir, _) = batch();
        let path = dir.path().join("a/one");
        let read = one(dir.path());
        for other in [&b"2"[..], b"11"] {
            let e = remove_if_as_delivered(&read, &listed(other)).unwrap_err();
            assert!(e.contains("changed after it was sent"), "{e}");
            assert_eq!(std::fs::read(&path).unwrap(), b"1", "kept in place");
        }
        let meta = std::fs::metadata(&path).unwrap();
        let mtime = filetime::FileTime::from_last_modification_time(&meta);
        std::fs::write(&path, b"X").unwrap();
        filetime::set_file_mtime(&path, mtime).unwrap();
        let again = one(dir.path());
        assert_eq!(
            (again.size, again.mtime_s, again.mtime_ns),
            (read.size, read.mtime_s, read.mtime_ns)
        );
        assert!(remove_if_as_delivered(&again, &listed(b"1")).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"X");
        let hidden: Vec<_> = std::fs::read_dir(dir.path().join("a"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .collect();
        assert!(hidden.is_empty(), "nothing left under a hidden name");
        remove_if_as_delivered(&again, &listed(b"X")).expect("its own bytes: deleted");
        assert!(!path.exists());
        assert!(
            remove_if_as_delivered(&again, &listed(b"X")).is_err(),
            "gone"
        );
    }

    /// A sender killed while checking a file leaves it under its hidden name; the next pass
    /// puts it back (beside a file written at its name since), so it is never taken for a new
    /// file and sent again under that name.
    #[test]
    fn a_file_left_being_deleted_is_put_back() {
        let (dir, _) = batch();
        let a = dir.path().join("a");
        let hidden = |n: &str| a.join(format!(".{n}{DELETING}{}", ObjectId::random()));
        std::fs::rename(a.join("one"), hidden("one")).unwrap();
        std::fs::rename(a.join("two"), hidden("two")).unwrap();
        std::fs::write(a.join("two"), b"new").unwrap();
        std::fs::write(a.join(".not-ours.forte-deleting-x"), b"?").unwrap();
        recover_deleting(dir.path());
        assert_eq!(std::fs::read(a.join("one")).unwrap(), b"1");
        assert_eq!(std::fs::read(a.join("two")).unwrap(), b"new");
        assert_eq!(std::fs::read(a.join("two.forte-kept")).unwrap(), b"2");
        let mut left: Vec<String> = std::fs::read_dir(&a)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [".not-ours.forte-deleting-x", "one", "two", "two.forte-kept"]
        );
    }

    /// A file put back after a failed check never replaces one written at its path since:
    /// it is kept beside it.
    #[test]
    fn a_file_put_back_never_replaces_one_written_since() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("from"), dir.path().join("to"));
        std::fs::write(&from, b"old").unwrap();
        std::fs::write(&to, b"new").unwrap();
        assert!(rename_no_replace(&from, &to).is_err());
        assert_eq!(std::fs::read(&to).unwrap(), b"new");
        std::fs::remove_file(&to).unwrap();
        rename_no_replace(&from, &to).unwrap();
        assert_eq!(std::fs::read(&to).unwrap(), b"old");
    }

    /// A receipt counts only if a trusted core key signed it and it names this site.
    #[test]
    fn only_a_trusted_receipt_of_this_site_counts() {
        let dir = tempfile::tempdir().unwrap();
        let keys = forte_format::keys::generate(dir.path()).unwrap();
        let core = forte_format::EdgeKey::load(&keys.receipt_key).unwrap();
        let other = forte_format::EdgeKey::load(&keys.edge_key).unwrap();
        let trusted = TrustedCores(vec![core.0.verifying_key()]);
        let receipt = |site: &str, key: &forte_format::EdgeKey| {
            Receipt::new(
                (site, &ObjectId::random().to_string(), 1),
                forte_format::Outcome::Delivered,
                Vec::new(),
                ("/archive", "worker"),
                0,
            )
            .sign(key)
        };
        assert!(receipt_for(&receipt("site-a", &core), &trusted, "site-a").is_ok());
        let why = receipt_for(&receipt("site-b", &core), &trusted, "site-a").unwrap_err();
        assert!(why.contains("a receipt of site site-b"), "{why}");
        let why = receipt_for(&receipt("site-a", &other), &trusted, "site-a").unwrap_err();
        assert!(why.contains("does not verify"), "{why}");
    }

    /// A FIFO put at a sent file's path does not hold the deletion up (it waited for a
    /// writer before), and is put back, not deleted.
    #[test]
    fn a_fifo_in_place_of_a_sent_file_is_kept_without_waiting() {
        use std::os::unix::fs::FileTypeExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let source = SourceFile {
            local: path.clone(),
            path: "f".into(),
            kind: Kind::File,
            size: 0,
            mode: 0o644,
            mtime_s: 0,
            mtime_ns: 0,
        };
        let listed = ReceiptFile {
            id: ObjectId::random(),
            size: 0,
            sha256: forte_format::seal::sha256_hex(b""),
        };
        let why = remove_if_as_delivered(&source, &listed).unwrap_err();
        assert!(why.contains("changed after it was sent"), "{why}");
        assert!(std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_fifo());
    }

    fn id_of(files: &[(SourceFile, ObjectId)], path: &str) -> ObjectId {
        files.iter().find(|(f, _)| f.path == path).unwrap().1
    }

    #[test]
    fn only_delivered_files_are_deleted_and_the_rest_wait() {
        let (dir, files) = batch();
        let one = id_of(&files, "a/one");
        let done = delete_delivered(&marked(&files, |id| *id == one));
        assert!(!dir.path().join("a/one").exists());
        assert!(dir.path().join("a/two").exists() && dir.path().join("b").is_dir());
        let waiting = files.len() - 1;
        let expected = Deletion {
            deleted: 1,
            kept: vec![],
            waiting,
        };
        assert_eq!(done, expected);
    }

    /// An empty directory is an object of its own and goes like a file; a directory that
    /// held files is left, empty, for `prune_empty_dirs`.
    #[test]
    fn everything_delivered_is_deleted_including_empty_directories() {
        let (dir, files) = batch();
        let done = delete_delivered(&marked(&files, |_| true));
        assert_eq!((done.deleted, done.waiting), (3, 0), "{done:?}");
        assert!(done.kept.is_empty(), "{done:?}");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["a"]);
        prune_empty_dirs(dir.path());
        assert!(!dir.path().join("a").exists());
    }

    #[test]
    fn a_file_that_cannot_be_deleted_is_kept_and_named() {
        let (dir, files) = batch();
        std::fs::remove_file(dir.path().join("a/two")).unwrap();
        let done = delete_delivered(&marked(&files, |_| true));
        assert_eq!(done.kept.len(), 1, "{done:?}");
        assert!(done.kept[0].contains("a/two: cannot delete"), "{done:?}");
    }

    /// An empty directory sent with its batch, then a late file written into it and sent as
    /// a follow-up: both acknowledged, the file goes first so that the directory can go.
    #[test]
    fn a_delivered_directory_goes_after_the_delivered_files_inside_it() {
        let (dir, mut files) = batch();
        std::fs::write(dir.path().join("b/late"), b"3").unwrap();
        let late = discover(dir.path())
            .unwrap()
            .files
            .into_iter()
            .find(|f| f.path == "b/late")
            .unwrap();
        files.push((late, ObjectId::derive(b"test", &[b"b/late"])));
        let done = delete_delivered(&marked(&files, |_| true));
        assert!(done.kept.is_empty(), "{done:?}");
        assert_eq!((done.deleted, done.waiting), (4, 0), "{done:?}");
        assert!(!dir.path().join("b").exists());
    }
}
