//! What happens to a batch after it was sent: a late file sends it again, a cancelled batch is
//! skipped, and acknowledged files are deleted at the source, one by one.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use anyhow::{Context, Result};
use forte_catalog::{BatchRow, BatchState, FileRow, Role};
use forte_format::{Kind, ObjectId, Receipt, ReceiptFile};
use forte_prepare::{discover, SourceFile};

use super::inbox::{marker_time_us, prune_empty_dirs, Batch, READY_MARKER};
use super::{batch_id, object_id, Edge};
use crate::record::note;
use crate::transfer::retry::Operation;
use crate::units::human;

impl Edge<'_> {
    /// Whether a ready batch has anything to send: it was never sent, its last send failed, or
    /// files appeared in it after it was sent (they go as a follow-up, sealed into the same
    /// batch). Said once per batch and scan when it is a follow-up.
    pub fn needs_sending(&self, batch: &Batch) -> bool {
        let batch_key = batch_id(&self.setup.settings.key, &batch.name);
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
        let Ok(mut found) = discover(&batch.dir) else {
            return false;
        };
        let rows = self.setup.catalog.files(&batch_key).unwrap_or_default();
        drop_emptied_dirs(&mut found.files, &rows);
        let known: HashSet<String> = rows.into_iter().map(|f| f.object_id).collect();
        let late: Vec<&str> = found
            .files
            .iter()
            .filter(|f| f.path != READY_MARKER)
            .filter(|f| {
                !known.contains(&object_id(&self.setup.settings.key, &batch.name, f).to_string())
            })
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

    /// Whether a batch was cancelled (`send --cancel`) or refused by an edge task, and its
    /// ready marker not touched since: that state, to skip it.
    pub fn held_back(&self, batch: &Batch) -> Option<BatchState> {
        let row = self
            .setup
            .catalog
            .batch(&batch_id(&self.setup.settings.key, &batch.name))
            .ok()
            .flatten();
        row.filter(|b| matches!(b.state, BatchState::Cancelled | BatchState::Refused))
            .filter(|b| marker_time_us(&batch.dir).is_none_or(|t| t <= b.updated_at))
            .map(|b| b.state)
    }

    /// Cancels batches of the inbox at the relay (`send --cancel`): deletes what the relay holds
    /// of each that the core has not taken, and records them as cancelled so that later runs
    /// skip them. The source files are not touched.
    pub fn cancel(&self, inbox: &Path, names: &[String]) -> Result<bool> {
        let mut ok = true;
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
            let batch_key = batch_id(&self.setup.settings.key, name);
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
                    println!(
                        "batch {name}: cancelled; the relay deleted {} objects ({}); the source is untouched (touch {}/{READY_MARKER} to send it again)",
                        cancelled.objects,
                        human(cancelled.bytes),
                        dir.display()
                    );
                }
                Err(e) => {
                    let error = format!("cannot cancel the batch at the relay: {e}");
                    self.setup.failures.report(name, None, &error);
                    ok = false;
                }
            }
        }
        Ok(ok)
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
        let sent: Vec<BatchRow> = batches
            .into_iter()
            .filter(|b| b.role == Role::Edge && b.state == BatchState::Sent)
            .filter(|b| !self.in_flight.lock().contains_key(&b.batch_key))
            .collect();
        let mut carriers: HashMap<ObjectId, Vec<usize>> = HashMap::new();
        for (i, b) in sent.iter().enumerate() {
            let Ok(rows) = self.setup.catalog.files(&b.batch_key) else {
                continue;
            };
            let acknowledged = |r: &FileRow| r.state == forte_catalog::FileState::Acknowledged;
            for r in rows.iter().filter(|r| !acknowledged(r)) {
                if let Ok(id) = r.at_relay().parse() {
                    carriers.entry(id).or_default().push(i);
                }
            }
        }
        if carriers.is_empty() {
            return;
        }
        let ids: Vec<ObjectId> = carriers.keys().copied().collect();
        let Ok(known) = self.setup.client.statuses(&ids) else {
            return;
        };
        // Sealed or delivered is where a sent batch's objects belong; unknown (dropped) or
        // open again (a part or manifest the core found damaged, dropped by the relay) is lost.
        let held = |id: &ObjectId| {
            known.get(id).is_some_and(|s| {
                matches!(
                    s.state,
                    forte_relay::api::ObjectState::Complete
                        | forte_relay::api::ObjectState::Delivered
                )
            })
        };
        let mut lost: HashMap<usize, usize> = HashMap::new();
        let mut not_delivered: HashSet<usize> = HashSet::new();
        for (id, batches) in &carriers {
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
        // Every object delivered, says the relay: the core's receipt must say so too, or the
        // acknowledgement was not the core's (forged, or a core without a receipt key).
        for (i, b) in sent.iter().enumerate() {
            if not_delivered.contains(&i) || self.unreceipted.lock().contains(&b.batch_key) {
                continue;
            }
            let Some(receipted) = self.verified_receipts(b) else {
                continue;
            };
            self.unreceipted.lock().insert(b.batch_key.clone());
            if receipted.is_empty() {
                let error = "the relay says the core acknowledged this batch, but no receipt signed by the core (--receipt-pub) says so: its sources are kept; the relay may have lost it or forged the acknowledgement, or the core signs no receipts (pull --receipt-key)";
                self.setup.failures.report(&b.name, None, error);
            }
        }
        for (i, objects) in lost {
            let b = &sent[i];
            let error = format!(
                "the relay no longer holds {objects} object(s) of this batch, sealed and not yet received by the core: sending them again"
            );
            self.setup.failures.report(&b.name, None, &error);
            let (files, bytes) = (b.files as u64, b.bytes as u64);
            self.record_batch_as(
                &b.batch_key,
                &b.name,
                (files, bytes),
                BatchState::Failed,
                (None, Some(&error)),
            );
        }
        note("a lost batch", self.setup.catalog.flush());
    }

    /// Deletes, in every sent batch, each source file that a custody receipt of the core lists
    /// with the SHA-256 its bytes still have (`still_as_delivered`), and nothing else: a file that was skipped, failed, changed or appeared later
    /// stays, with its batch directory. A batch left with only files that can never be sent is
    /// reported once, through the failure hook.
    pub fn delete_acknowledged(&self, inbox: &Path) {
        let Ok(batches) = self.setup.catalog.batches() else {
            return;
        };
        for b in batches
            .into_iter()
            .filter(|b| b.role == Role::Edge && b.state == BatchState::Sent)
        {
            if !self.in_flight.lock().contains_key(&b.batch_key) {
                self.delete_batch(&inbox.join(&b.name), &b);
            }
        }
    }

    /// Deletes what the core acknowledged of one sent batch, in `dir`, and the batch directory
    /// once nothing else is left in it.
    fn delete_batch(&self, dir: &Path, b: &BatchRow) {
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
        // Each file with its own id and the object that carries it at the relay: the one the
        // catalogue recorded (its bundle as sent, though some members may be deleted since),
        // else the one it would travel in now. A bundle is delivered whole or not at all.
        let carried: Vec<(SourceFile, ObjectId, ObjectId)> = self
            .objects(&b.name, sources, &rows)
            .iter()
            .flat_map(|j| {
                j.files().into_iter().map(|(f, id)| {
                    let row = recorded.get(id.to_string().as_str());
                    let carrier = row.and_then(|r| r.at_relay().parse().ok());
                    (f.clone(), id, carrier.unwrap_or(j.id))
                })
            })
            .collect();
        // Only the core's signed receipts say what it keeps: the relay's word (its tombstones,
        // its answers) never deletes a source.
        let Some(receipted) = self.verified_receipts(b) else {
            return;
        };
        let delivered = |source: &SourceFile, id: &ObjectId| {
            receipted
                .get(id)
                .is_some_and(|listed| still_as_delivered(source, listed))
        };
        // The acknowledgement is kept before the source goes: a sender killed after deleting
        // a file could never record it again.
        let carried: Vec<(SourceFile, ObjectId, ObjectId, bool)> = carried
            .into_iter()
            .map(|(source, id, carrier)| {
                let ok = delivered(&source, &id);
                (source, id, carrier, ok)
            })
            .collect();
        for (source, id, carrier, _) in carried.iter().filter(|c| c.3) {
            let was = recorded.get(id.to_string().as_str()).map(|r| r.state);
            self.record_acknowledged_file(&b.batch_key, *carrier, (source, *id), was);
        }
        if let Err(e) = self.setup.catalog.flush() {
            eprintln!("warning: batch {}: nothing deleted until the catalogue records the acknowledgements: {e:#}", b.name);
            return;
        }
        let never_sent = found
            .rejected
            .iter()
            .map(|(p, why)| format!("{}: never sent ({why})", p.display()));
        let Deletion {
            deleted,
            mut kept,
            waiting,
        } = delete_delivered(&files_of(carried));
        kept.extend(never_sent);
        prune_empty_dirs(dir);
        let only_marker = std::fs::read_dir(dir)
            .map(|mut d| d.all(|e| e.is_ok_and(|e| e.file_name() == READY_MARKER)))
            .unwrap_or(false);
        let (files_n, bytes) = (b.files as u64, b.bytes as u64);
        // Only the marker left means nothing waits for an acknowledgement any more, and no
        // file was written into the batch since the scan.
        if kept.is_empty() && only_marker {
            match std::fs::remove_dir_all(dir) {
                Ok(()) => {
                    let deleted = BatchState::SourceDeleted;
                    self.record_batch(&b.batch_key, &b.name, files_n, bytes, deleted);
                    println!("batch {}: acknowledged by the core; source deleted", b.name);
                }
                Err(e) => {
                    let error = format!("cannot delete {}: {e}", dir.display());
                    self.setup.failures.report(&b.name, None, &error);
                }
            }
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
            self.setup.failures.report(&b.name, None, &error);
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
            let receipt = match Receipt::open(&document, trusted) {
                Ok(r) if r.site == site => r,
                Ok(r) => {
                    let error = format!("the relay offered a receipt of site {} for this site's batch: ignored (a relay swapping receipts?)", r.site);
                    self.setup.failures.report(&b.name, None, &error);
                    continue;
                }
                Err(e) => {
                    let error = format!("the relay offered a receipt that does not verify ({e}): ignored, nothing deleted on its word");
                    self.setup.failures.report(&b.name, None, &error);
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
            listed.extend(receipt.files.into_iter().map(|f| (f.id, f)));
        }
        Some(listed)
    }
}

/// Each file with whether the core's receipt covers it as it is now.
fn files_of(carried: Vec<(SourceFile, ObjectId, ObjectId, bool)>) -> Vec<(SourceFile, bool)> {
    carried
        .into_iter()
        .map(|(f, _, _, delivered)| (f, delivered))
        .collect()
}

/// Whether `source` is still the file the core's receipt lists: a directory is; a file when its
/// size is the receipt's and its bytes, read now, hash to the receipt's SHA-256, and nothing
/// about it (device, inode, size, mtime, ctime) changed while they were read. Its object id,
/// which the receipt is looked up by, already binds its path, size and mtime when it was read;
/// the hash is what catches a file rewritten with its size and mtime kept (`cp -p`, `rsync
/// -t`, `tar x`). Hashing always, not only when the metadata moved: metadata can be set back,
/// and at SHA-NI speed the read costs about a second per 1.7 GB (docs/benchmarks.md).
fn still_as_delivered(source: &SourceFile, listed: &ReceiptFile) -> bool {
    if source.kind == Kind::Dir {
        return true;
    }
    if source.size != listed.size {
        return false;
    }
    let identity = |m: &std::fs::Metadata| {
        use std::os::unix::fs::MetadataExt;
        (
            m.dev(),
            m.ino(),
            m.size(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
        )
    };
    let Ok(before) = std::fs::symlink_metadata(&source.local) else {
        return false;
    };
    if !before.is_file() {
        return false;
    }
    let Ok(sha256) = forte_format::seal::sha256_file(&source.local) else {
        return false;
    };
    let after = std::fs::symlink_metadata(&source.local);
    sha256 == listed.sha256 && after.is_ok_and(|a| identity(&a) == identity(&before))
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

/// Deletes each of `files` marked delivered, and nothing else: files first, then directories
/// deepest first, so a delivered directory goes only once what it held is gone.
fn delete_delivered(files: &[(SourceFile, bool)]) -> Deletion {
    let mut order: Vec<&(SourceFile, bool)> = files.iter().collect();
    order.sort_by_key(|(f, _)| (f.kind == Kind::Dir, std::cmp::Reverse(f.path.len())));
    let mut done = Deletion {
        deleted: 0,
        kept: Vec::new(),
        waiting: 0,
    };
    for (file, delivered) in order {
        if !delivered {
            done.waiting += 1;
            continue;
        }
        let removed = match file.kind {
            Kind::File | Kind::Bundle => std::fs::remove_file(&file.local),
            Kind::Dir => std::fs::remove_dir(&file.local),
        };
        match removed {
            Ok(()) => done.deleted += 1,
            Err(e) => done
                .kept
                .push(format!("{}: cannot delete: {e}", file.local.display())),
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

    /// Each file marked delivered when `delivered` says so of its id.
    fn marked(
        files: &[(SourceFile, ObjectId)],
        delivered: impl Fn(&ObjectId) -> bool,
    ) -> Vec<(SourceFile, bool)> {
        files
            .iter()
            .map(|(f, id)| (f.clone(), delivered(id)))
            .collect()
    }

    fn listed(bytes: &[u8]) -> ReceiptFile {
        ReceiptFile {
            id: ObjectId::random(),
            size: bytes.len() as u64,
            sha256: forte_format::seal::sha256_hex(bytes),
        }
    }

    /// A file rewritten after it was read, with new bytes of the same size and its
    /// nanosecond mtime set back (`cp -p`, `rsync -t`, `tar x`): the same object id, so the
    /// receipt is found, but not the bytes the core keeps. It stays.
    #[test]
    fn a_file_rewritten_with_its_size_and_mtime_kept_is_not_as_delivered() {
        let (dir, files) = batch();
        let one = &files.iter().find(|(f, _)| f.path == "a/one").unwrap().0;
        assert!(still_as_delivered(one, &listed(b"1")));
        assert!(!still_as_delivered(one, &listed(b"2")), "other bytes");
        assert!(!still_as_delivered(one, &listed(b"11")), "another size");
        let path = dir.path().join("a/one");
        let mtime =
            filetime::FileTime::from_last_modification_time(&std::fs::metadata(&path).unwrap());
        std::fs::write(&path, b"X").unwrap();
        filetime::set_file_mtime(&path, mtime).unwrap();
        let again = discover(dir.path())
            .unwrap()
            .files
            .into_iter()
            .find(|f| f.path == "a/one")
            .unwrap();
        assert_eq!(
            (again.size, again.mtime_s, again.mtime_ns),
            (one.size, one.mtime_s, one.mtime_ns)
        );
        assert!(!still_as_delivered(&again, &listed(b"1")));
        std::fs::remove_file(&path).unwrap();
        assert!(!still_as_delivered(one, &listed(b"1")), "gone");
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
