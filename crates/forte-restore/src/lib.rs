//! The core's restore path: verify, decrypt, decompress, verify again, then deliver atomically.
//!
//! ```text
//! read ─▶ verify_ciphertext ─▶ decrypt ─▶ decompress ─▶ assemble (in order, whole-file hash)
//! ```
//!
//! Every byte is checked three times before anything becomes visible: the ciphertext SHA-256
//! against the signed manifest before decryption, the AEAD during decryption, and the raw
//! SHA-256 of each part and of the whole file after decompression. Files are assembled in a
//! staging directory inside the destination (same file system, so the final rename is atomic)
//! and only moved into place when *every* object verified; any failure removes the staging
//! directory and leaves the destination as it was.

mod objects;
mod source;

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{bail, Context, Result};
use forte_format::manifest::validate_path;
use forte_format::seal::{decrypt, sha256_file, sha256_hex};
use forte_format::{Identities, Inventory, InventoryEntry, Kind, Manifest, ObjectId, TrustedEdges};
use forte_pipeline::{queue, Budget, Charge, Emit, Pipeline, Weigh, Work};
use serde::Serialize;
use sha2::{Digest, Sha256};

pub use objects::{open_inventory, open_objects, Object};
pub use source::{DirSource, ObjectRef, ObjectSource, PartError};

/// Knobs of the restore path.
#[derive(Debug, Clone)]
pub struct RestoreConfig {
    pub cpu: usize,
    /// Parts between being read and being written; bounds memory as in the prepare path.
    pub parts_in_flight: usize,
    /// What to do about files that already exist at the destination.
    pub existing: Existing,
    /// Objects read at once: 1 for a local disk; more for a remote source, where each read
    /// is a round trip (one object's parts are always read in order).
    pub readers: usize,
    /// Files written to the destination at once.
    pub writers: usize,
}

/// Files already at the destination. In every mode a directory where a file is to go (or a
/// file, link or device where a directory is to go) refuses the whole restore, and the
/// message says to move it away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    /// Refuse the whole restore; the message points to `--overwrite` (`unpack`).
    Refuse,
    /// Replace them (`unpack --overwrite`).
    Overwrite,
    /// Keep a file whose SHA-256 equals the manifest's (an earlier delivery whose
    /// acknowledgement was lost); refuse others, saying to move them away (`pull`, which has
    /// no `--overwrite`).
    KeepIdentical,
}

impl RestoreConfig {
    pub fn for_this_machine() -> Self {
        let cpu = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            cpu,
            parts_in_flight: cpu + 4,
            existing: Existing::Refuse,
            readers: 1,
            writers: 2,
        }
    }
}

/// Running totals, readable while the restore works.
#[derive(Debug, Default, Serialize)]
pub struct Totals {
    pub files_done: AtomicU64,
    pub raw_bytes: AtomicU64,
    pub sealed_bytes: AtomicU64,
}

/// What a successful restore delivered.
#[derive(Debug, Serialize)]
pub struct Delivered {
    pub files: usize,
    /// Files found already in place, identical (with [`Existing::KeepIdentical`]).
    pub already: usize,
    pub directories: usize,
    pub bytes: u64,
    /// Every object now in place at the destination, delivered now or found identical.
    pub placed: Vec<Placed>,
    /// Whether the objects were checked against a signed inventory; `false` only for a set
    /// of version-1 objects, written before inventories existed.
    pub inventory: bool,
}

/// One object in place at the destination.
#[derive(Debug, Clone, Serialize)]
pub struct Placed {
    pub id: ObjectId,
    /// Its path in the batch (the manifest's).
    pub path: String,
    /// Its path under the destination (the layout's).
    pub target: String,
    pub size: u64,
    pub sha256: String,
    /// Found in place from an earlier delivery rather than written now.
    pub already: bool,
    /// Each part's raw and ciphertext SHA-256, as verified.
    pub parts: Vec<(u32, String, String)>,
}

impl Placed {
    fn new(m: &Manifest, target: &str, already: bool) -> Self {
        Self {
            id: m.id,
            path: m.path.clone(),
            target: target.to_string(),
            size: m.size,
            sha256: m.sha256.clone(),
            already,
            parts: m
                .parts
                .iter()
                .map(|p| (p.index, p.raw_sha256.clone(), p.ciphertext_sha256.clone()))
                .collect(),
        }
    }
}

/// One problem found while restoring, with where it is.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    pub object: ObjectId,
    pub part: Option<u32>,
    /// The stored copy is wrong (its bytes fail a check), as opposed to unreadable.
    pub damaged: bool,
    pub message: String,
}

/// A restore that delivered nothing, and why.
#[derive(Debug)]
pub struct RestoreFailure {
    pub problems: Vec<Problem>,
}

impl std::fmt::Display for RestoreFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "nothing was restored to the destination; {} problem(s):",
            self.problems.len()
        )?;
        for p in &self.problems {
            write!(f, "\n  {}", p.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for RestoreFailure {}

/// Maps a verified manifest to its relative path at the destination.
pub type Layout<'a> = &'a (dyn Fn(&Manifest) -> String + Sync);

/// Objects verified and written to a staging directory, not yet visible at the destination.
#[derive(Default)]
pub struct Staged {
    jobs: Vec<Arc<Job>>,
    /// Found already in place (with [`Existing::KeepIdentical`]).
    found: Vec<Placed>,
}

impl Staged {
    /// Every object staged or found in place.
    pub fn ids(&self) -> impl Iterator<Item = ObjectId> + '_ {
        let staged = self.jobs.iter().map(|j| j.object.manifest.id);
        staged.chain(self.found.iter().map(|p| p.id))
    }

    /// Adds what a later [`Restore::stage`] call into the same staging directory staged.
    pub fn extend(&mut self, more: Staged) {
        self.jobs.extend(more.jobs);
        self.found.extend(more.found);
    }

    /// Fails unless the staged objects are exactly those of `inventory`, or, without one,
    /// unless every object predates inventories (version 1): a version-2 object without an
    /// inventory means the inventory was removed on the way.
    fn check_complete(&self, inventory: Option<&Inventory>) -> Result<()> {
        let Some(inventory) = inventory else {
            if let Some(job) = self
                .jobs
                .iter()
                .find(|j| j.object.manifest.listed_in_inventory())
            {
                let m = &job.object.manifest;
                bail!(
                    "nothing was restored: {} (object {}) belongs to a set with a signed inventory, but the inventory is missing; it was removed on the way, so nothing proves the set complete",
                    m.path,
                    m.id
                );
            }
            return Ok(());
        };
        let present: Vec<InventoryEntry> = self
            .jobs
            .iter()
            .map(|j| InventoryEntry::of(&j.object.manifest))
            .chain(self.found.iter().map(|p| InventoryEntry {
                id: p.id,
                path: p.path.clone(),
                size: p.size,
                sha256: p.sha256.clone(),
            }))
            .collect();
        let problems: Vec<Problem> = inventory
            .differences(&present)
            .into_iter()
            .map(|(object, message)| Problem {
                object,
                part: None,
                damaged: false,
                message,
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(RestoreFailure { problems }.into())
        }
    }
}

/// Creates a fresh staging directory on `dest`'s file system, for [`Restore::stage`].
pub fn new_staging(dest: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dest)
        .with_context(|| format!("cannot create destination {}", dest.display()))?;
    tempdir_in(dest)
}

/// One restore run.
pub struct Restore<'k> {
    config: RestoreConfig,
    identities: &'k Identities,
    trusted: &'k TrustedEdges,
    pub pipeline: Pipeline,
    pub totals: Arc<Totals>,
}

/// Assembly state of one file in the staging directory.
struct Assembly {
    file: Option<File>,
    next: u32,
    /// Parts that arrived before their predecessors, with their in-flight slots.
    pending: BTreeMap<u32, (Vec<u8>, Charge)>,
    whole: Sha256,
}

struct Job {
    object: Object,
    /// Relative path at the destination, from the layout.
    target: String,
    staged: PathBuf,
    assembly: Mutex<Assembly>,
}

impl Weigh for Job {
    fn weight(&self) -> u64 {
        self.object.manifest.size
    }
}

struct Piece {
    job: Arc<Job>,
    index: u32,
    /// Sealed bytes, then compressed, then raw.
    data: Vec<u8>,
    /// This piece's share of the memory budget, held until it is written.
    charge: Charge,
}

impl Weigh for Piece {
    fn weight(&self) -> u64 {
        self.data.len() as u64
    }
}

impl Piece {
    fn problem(&self, damaged: bool, what: impl std::fmt::Display) -> Problem {
        let m = &self.job.object.manifest;
        Problem {
            object: m.id,
            part: Some(self.index),
            damaged,
            message: format!("{} (object {}), part {}: {what}", m.path, m.id, self.index),
        }
    }
}

impl<'k> Restore<'k> {
    pub fn new(
        config: RestoreConfig,
        identities: &'k Identities,
        trusted: &'k TrustedEdges,
    ) -> Self {
        let pipeline = Pipeline::new(Budget::new(config.cpu as u64));
        Self {
            config,
            identities,
            trusted,
            pipeline,
            totals: Arc::default(),
        }
    }

    /// Restores every object of `source` into `dest`, each at the path `layout` gives it, all
    /// or nothing, and only if they are exactly the objects of the source's signed inventory.
    /// On failure the error lists every problem found, each naming the file, object and part;
    /// a [`RestoreFailure`] when the problems are in the objects' bytes or their set.
    pub fn run(
        &self,
        source: &dyn ObjectSource,
        dest: &Path,
        layout: Layout<'_>,
    ) -> Result<Delivered> {
        let inventory = self.inventory(source)?;
        let staging = new_staging(dest)?;
        let result = self
            .stage(source, dest, layout, &staging)
            .and_then(|staged| self.commit(staged, &staging, dest, inventory.as_ref()));
        let _ = std::fs::remove_dir_all(&staging);
        result
    }

    /// The source's inventory, decrypted and verified; `None` if it has none.
    pub fn inventory(&self, source: &dyn ObjectSource) -> Result<Option<Inventory>> {
        source
            .inventory(objects::MAX_MANIFEST_BYTES)?
            .map(|sealed| open_inventory(&sealed, self.identities, self.trusted))
            .transpose()
    }

    /// Verifies every object of `source` and writes it into `staging` (from [`new_staging`]),
    /// making nothing visible at `dest`: the first half of [`Restore::run`]. Objects of one
    /// delivery can be staged in several calls as they become available, then moved into
    /// place together with [`Restore::commit`].
    pub fn stage(
        &self,
        source: &dyn ObjectSource,
        dest: &Path,
        layout: Layout<'_>,
        staging: &Path,
    ) -> Result<Staged> {
        let opened = open_objects(source, self.identities, self.trusted)?;
        let mut placed = Vec::with_capacity(opened.len());
        for object in opened {
            let target = layout(&object.manifest);
            validate_path(&target).map_err(|e| {
                anyhow::anyhow!(
                    "the layout puts {} at an unsafe path: {e}",
                    object.manifest.path
                )
            })?;
            placed.push((object, target));
        }
        let already = check_destination(&placed, dest, self.config.existing)?;
        let found: Vec<Placed> = placed
            .iter()
            .filter(|(object, _)| already.contains(&object.manifest.id))
            .map(|(object, target)| Placed::new(&object.manifest, target, true))
            .collect();
        placed.retain(|(object, _)| !already.contains(&object.manifest.id));
        let jobs = self.stage_all(source, placed, staging)?;
        Ok(Staged { jobs, found })
    }

    /// Moves everything staged in `staging` into place at `dest`: the second half of
    /// [`Restore::run`]. First the staged objects must be exactly those of `inventory` (see
    /// [`Restore::inventory`]); otherwise nothing moves.
    pub fn commit(
        &self,
        staged: Staged,
        staging: &Path,
        dest: &Path,
        inventory: Option<&Inventory>,
    ) -> Result<Delivered> {
        staged.check_complete(inventory)?;
        let mut delivered = commit(staged, staging, dest)?;
        delivered.inventory = inventory.is_some();
        Ok(delivered)
    }

    fn stage_all(
        &self,
        source: &dyn ObjectSource,
        objects: Vec<(Object, String)>,
        staging: &Path,
    ) -> Result<Vec<Arc<Job>>> {
        let jobs: Vec<Arc<Job>> = objects
            .into_iter()
            .map(|(object, target)| {
                Arc::new(Job {
                    staged: staging.join(object.manifest.id.to_string()),
                    target,
                    object,
                    assembly: Mutex::new(Assembly {
                        file: None,
                        next: 0,
                        pending: BTreeMap::new(),
                        whole: Sha256::new(),
                    }),
                })
            })
            .collect();
        let errors: Mutex<Vec<Problem>> = Mutex::default();
        let stop = OnceLock::<()>::new();
        let fail = |error: Problem| {
            let _ = stop.set(());
            errors.lock().unwrap_or_else(|e| e.into_inner()).push(error);
        };

        let in_flight = self.config.parts_in_flight.max(1);
        // Sealed parts are about their raw size or smaller; charging the raw length bounds
        // the decompressed copies too.
        let memory = Budget::new(in_flight as u64 * max_part_size(&jobs));
        let cpu = self.config.cpu.max(1);
        let (jobs_tx, jobs_rx) = queue::<Arc<Job>>(64);
        let (read_tx, read_rx) = queue::<Piece>(2);
        let (verified_tx, verified_rx) = queue::<Piece>(cpu);
        let (decrypted_tx, decrypted_rx) = queue::<Piece>(cpu);
        let (raw_tx, raw_rx) = queue::<Piece>(cpu);
        let p = &self.pipeline;
        std::thread::scope(|s| {
            p.stage(
                s,
                "read",
                Work::Io,
                self.config.readers,
                jobs_rx,
                read_tx,
                |job, emit| {
                    if stop.get().is_none() {
                        if let Err(e) = read_parts(source, &job, &memory, &stop, emit) {
                            fail(e);
                        }
                    }
                },
            );
            p.stage(
                s,
                "verify_ciphertext",
                Work::Cpu,
                cpu,
                read_rx,
                verified_tx,
                |piece, emit| match verify_ciphertext(&piece) {
                    Ok(()) => {
                        emit.send(piece);
                    }
                    Err(e) => fail(piece.problem(true, e)),
                },
            );
            p.stage(
                s,
                "decrypt",
                Work::Cpu,
                cpu,
                verified_rx,
                decrypted_tx,
                |mut piece, emit| {
                    let entry = &piece.job.object.manifest.parts[piece.index as usize];
                    let bound = entry.raw_length + entry.raw_length / 64 + (1 << 20);
                    match decrypt(&self.identities.0, &piece.data, bound) {
                        Ok(compressed) => {
                            self.totals
                                .sealed_bytes
                                .fetch_add(piece.data.len() as u64, Ordering::Relaxed);
                            piece.data = compressed;
                            emit.send(piece);
                        }
                        Err(e) => fail(piece.problem(true, format!("cannot decrypt: {e}"))),
                    }
                },
            );
            p.stage(
                s,
                "decompress",
                Work::Cpu,
                cpu,
                decrypted_rx,
                raw_tx,
                |mut piece, emit| match decompress_and_verify(&piece) {
                    Ok(raw) => {
                        piece.data = raw;
                        emit.send(piece);
                    }
                    Err(e) => fail(piece.problem(true, e)),
                },
            );
            p.sink(s, "assemble", self.config.writers.max(1), raw_rx, |piece| {
                let (id, index) = (piece.job.object.manifest.id, piece.index);
                let path = piece.job.object.manifest.path.clone();
                if let Err(e) = self.assemble(piece) {
                    fail(Problem {
                        object: id,
                        part: Some(index),
                        damaged: false,
                        message: format!("{path} (object {id}), part {index}: {e:#}"),
                    });
                }
            });
            for job in &jobs {
                if stop.get().is_some() || jobs_tx.send(job.clone()).is_err() {
                    break;
                }
            }
            drop(jobs_tx);
        });

        let problems = errors.into_inner().unwrap_or_else(|e| e.into_inner());
        if !problems.is_empty() {
            return Err(RestoreFailure { problems }.into());
        }
        Ok(jobs)
    }

    /// Writes parts to the staged file in order, hashing the whole file as it goes; parts that
    /// come early wait in memory (bounded by the in-flight slots they hold).
    fn assemble(&self, piece: Piece) -> Result<()> {
        let job = piece.job.clone();
        let manifest = &job.object.manifest;
        let mut asm = job.assembly.lock().unwrap_or_else(|e| e.into_inner());
        asm.pending.insert(piece.index, (piece.data, piece.charge));
        while let Some((data, _charge)) = {
            let next = asm.next;
            asm.pending.remove(&next)
        } {
            if asm.file.is_none() {
                asm.file = Some(create_staged(&job.staged)?);
            }
            // A one-part file's hash is its part's, already verified (Manifest::validate
            // guarantees they are equal): no second pass over the bytes.
            if manifest.parts.len() > 1 {
                asm.whole.update(&data);
            }
            forte_fs::write_in_slices(asm.file.as_mut().expect("created above"), &data)
                .with_context(|| format!("cannot write {}", job.staged.display()))?;
            asm.next += 1;
            self.totals
                .raw_bytes
                .fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        if asm.next as usize == manifest.parts.len() {
            let found = hex::encode(std::mem::take(&mut asm.whole).finalize());
            if manifest.parts.len() > 1 && found != manifest.sha256 {
                bail!(
                    "whole-file SHA-256 mismatch: manifest says {}, restored bytes hash to {found}",
                    manifest.sha256
                );
            }
            asm.file = None;
            self.totals.files_done.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

fn create_staged(path: &Path) -> Result<File> {
    File::create(path).with_context(|| format!("cannot create staging file {}", path.display()))
}

/// The `read` stage: reads every sealed part of an object in order.
fn read_parts(
    source: &dyn ObjectSource,
    job: &Arc<Job>,
    memory: &Arc<Budget>,
    stop: &OnceLock<()>,
    emit: &mut Emit<'_, Piece>,
) -> Result<(), Problem> {
    let manifest = &job.object.manifest;
    for entry in &manifest.parts {
        let charge = emit.waiting(|| memory.charge(entry.raw_length.max(MIN_CHARGE)));
        if stop.get().is_some() {
            return Ok(());
        }
        let problem = |damaged, what: String| Problem {
            object: manifest.id,
            part: Some(entry.index),
            damaged,
            message: format!(
                "{} (object {}), part {}: {what}",
                manifest.path, manifest.id, entry.index
            ),
        };
        let data = source
            .part(&job.object.at, entry.index, entry.ciphertext_length)
            .map_err(|e| match e {
                PartError::Damaged(what) => problem(true, what),
                PartError::Unavailable(what) => problem(false, what),
            })?;
        if !emit.send(Piece {
            job: job.clone(),
            index: entry.index,
            data,
            charge,
        }) {
            return Ok(());
        }
    }
    Ok(())
}

/// The least a piece charges the memory budget.
const MIN_CHARGE: u64 = 4096;

/// The largest part among the objects: the memory budget's unit.
fn max_part_size(jobs: &[Arc<Job>]) -> u64 {
    jobs.iter()
        .flat_map(|j| j.object.manifest.parts.iter().map(|p| p.raw_length))
        .max()
        .unwrap_or(1)
        .max(1)
}

fn verify_ciphertext(piece: &Piece) -> Result<(), String> {
    let expected = &piece.job.object.manifest.parts[piece.index as usize].ciphertext_sha256;
    let found = sha256_hex(&piece.data);
    if &found != expected {
        return Err(format!(
            "ciphertext SHA-256 mismatch (manifest {expected}, file {found}): the part was altered, replaced or swapped"
        ));
    }
    Ok(())
}

fn decompress_and_verify(piece: &Piece) -> Result<Vec<u8>, String> {
    let entry = &piece.job.object.manifest.parts[piece.index as usize];
    let raw = zstd::bulk::decompress(&piece.data, entry.raw_length as usize)
        .map_err(|e| format!("not a valid zstd frame of {} bytes: {e}", entry.raw_length))?;
    if raw.len() as u64 != entry.raw_length {
        return Err(format!(
            "decompresses to {} bytes, manifest says {}",
            raw.len(),
            entry.raw_length
        ));
    }
    let found = sha256_hex(&raw);
    if found != entry.raw_sha256 {
        return Err(format!(
            "raw SHA-256 mismatch (manifest {}, restored {found})",
            entry.raw_sha256
        ));
    }
    Ok(raw)
}

/// Refuses before any work if two objects claim one path or a target exists (as `existing`
/// says), so a long restore cannot fail at its very end for a reason known at the start.
/// Returns the objects already in place (with [`Existing::KeepIdentical`]).
fn check_destination(
    objects: &[(Object, String)],
    dest: &Path,
    existing: Existing,
) -> Result<std::collections::HashSet<ObjectId>> {
    let mut seen: BTreeMap<&str, &Object> = BTreeMap::new();
    for (object, target) in objects {
        if let Some(other) = seen.insert(target, object) {
            bail!(
                "objects {} and {} both restore to {target}; refusing to choose",
                other.manifest.id,
                object.manifest.id
            );
        }
    }
    let mut already = std::collections::HashSet::new();
    for (path, object) in &seen {
        let target = dest.join(path);
        let m = &object.manifest;
        let is_dir = m.kind == Kind::Dir;
        match (std::fs::symlink_metadata(&target), existing) {
            (Err(_), _) => {}
            (Ok(meta), _) if is_dir && meta.is_dir() => {}
            (Ok(meta), Existing::Overwrite) if meta.is_file() && !is_dir => {}
            (Ok(meta), Existing::KeepIdentical)
                if meta.is_file() && meta.len() == m.size && file_sha256(&target)? == m.sha256 =>
            {
                already.insert(m.id);
            }
            (Ok(meta), existing) => {
                let found = if meta.is_file() {
                    "a file"
                } else if meta.is_dir() {
                    "a directory"
                } else if meta.file_type().is_symlink() {
                    "a symbolic link"
                } else {
                    "a special file"
                };
                let wanted = if is_dir { "a directory" } else { "a file" };
                let target = target.display();
                match existing {
                    Existing::Refuse if meta.is_file() && !is_dir => bail!(
                        "{target} already exists; nothing was restored (pass --overwrite to replace files)"
                    ),
                    // Only a file with other contents gets here: identical ones are kept.
                    Existing::KeepIdentical if meta.is_file() && !is_dir => bail!(
                        "{target} already exists with other contents than the delivered file; \
                         nothing of this batch was delivered (existing files are never replaced: \
                         move {target} away, or choose another --to or --layout, and pull again)"
                    ),
                    Existing::KeepIdentical => bail!(
                        "{target} already exists and is {found}, where {wanted} is to go; nothing \
                         of this batch was delivered (move it away and pull again)"
                    ),
                    Existing::Refuse | Existing::Overwrite => bail!(
                        "{target} already exists and is {found}, where {wanted} is to go; nothing \
                         was restored (move it away and try again; --overwrite replaces only files)"
                    ),
                }
            }
        }
        // A file cannot also be the parent directory of another restored path.
        let prefix = format!("{path}/");
        if !is_dir {
            if let Some((child, _)) = seen.range(prefix.as_str()..).next() {
                if child.starts_with(&prefix) {
                    bail!("{path} is a file in one object and a directory of {child} in another");
                }
            }
        }
    }
    Ok(already)
}

fn file_sha256(path: &Path) -> Result<String> {
    sha256_file(path).with_context(|| format!("cannot read {}", path.display()))
}

/// Copies delivered files from `dest` to a second destination `copy` under the same relative
/// paths (FORTE's archive and analysts' copies), each atomically: a hidden temporary name in
/// the target directory, flushed, then renamed. A file already there with the same SHA-256 is
/// kept; a different one is an error and nothing is overwritten. Returns the files copied.
pub fn replicate(dest: &Path, copy: &Path, placed: &[Placed]) -> Result<usize> {
    let mut copied = 0;
    for p in placed {
        let (from, to) = (dest.join(&p.target), copy.join(&p.target));
        if to.exists() {
            if file_sha256(&to)? == p.sha256 {
                continue;
            }
            bail!(
                "{} exists with other contents; refusing to overwrite it",
                to.display()
            );
        }
        let dir = to.parent().unwrap_or(copy);
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let temp = dir.join(format!(".forte-copy-{}-{}", std::process::id(), p.id));
        // fs::copy keeps the permission bits; the modification time is set like the original's.
        std::fs::copy(&from, &temp)
            .and_then(|_| {
                let mtime =
                    filetime::FileTime::from_last_modification_time(&std::fs::metadata(&from)?);
                filetime::set_file_mtime(&temp, mtime)?;
                File::open(&temp)?.sync_all()
            })
            .with_context(|| format!("cannot copy {} to {}", from.display(), temp.display()))?;
        std::fs::rename(&temp, &to)
            .with_context(|| format!("cannot move {} into place", to.display()))?;
        copied += 1;
    }
    if copied > 0 {
        forte_fs::syncfs(copy)?;
    }
    Ok(copied)
}

/// Removes staging directories left in `dest` by a restore that was killed. Call only when no
/// other restore writes to `dest`.
pub fn remove_stale_staging(dest: &Path) -> Result<usize> {
    let mut removed = 0;
    let Ok(entries) = std::fs::read_dir(dest) else {
        return Ok(0);
    };
    for entry in entries.flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(".forte-staging-")
        {
            std::fs::remove_dir_all(entry.path()).with_context(|| {
                format!(
                    "cannot remove stale staging directory {}",
                    entry.path().display()
                )
            })?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// A fresh staging directory inside the destination.
fn tempdir_in(dest: &Path) -> Result<PathBuf> {
    for attempt in 0..100u32 {
        let path = dest.join(format!(".forte-staging-{}-{attempt}", std::process::id()));
        match std::fs::create_dir(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("cannot create staging directory in {}", dest.display())
                })
            }
        }
    }
    bail!(
        "cannot find a free staging directory name in {}",
        dest.display()
    )
}

fn set_times_and_mode(path: &Path, m: &Manifest) -> Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(m.mode & 0o777))
        .with_context(|| format!("cannot set the mode of {}", path.display()))?;
    let mtime = filetime::FileTime::from_unix_time(m.mtime_s, m.mtime_ns);
    filetime::set_symlink_file_times(path, mtime, mtime)
        .with_context(|| format!("cannot set the modification time of {}", path.display()))
}

/// Moves every verified file from staging into place. The staged data is flushed to disk first,
/// so a crash during the renames leaves whole files, never torn ones.
fn commit(staged: Staged, staging: &Path, dest: &Path) -> Result<Delivered> {
    let Staged { jobs, found } = staged;
    // Staged in several calls, two objects could still claim one path.
    let mut targets = std::collections::HashSet::new();
    for job in &jobs {
        if !targets.insert(job.target.as_str()) {
            bail!(
                "two objects claim {}: {} and another; nothing was delivered",
                job.target,
                job.object.manifest.path
            );
        }
    }
    let mut delivered = Delivered {
        files: 0,
        already: found.len(),
        directories: 0,
        bytes: 0,
        placed: found,
        inventory: false,
    };
    for job in &jobs {
        let m = &job.object.manifest;
        if m.kind == Kind::File {
            if m.parts.is_empty() {
                create_staged(&job.staged)?;
            }
            set_times_and_mode(&job.staged, m)?;
        }
    }
    forte_fs::syncfs(staging)?;
    // Now clean, the delivered bytes need not stay in the page cache.
    for job in jobs.iter().filter(|j| j.object.manifest.kind == Kind::File) {
        if let Ok(file) = File::open(&job.staged) {
            forte_fs::drop_from_cache(&file);
        }
    }
    for job in &jobs {
        let m = &job.object.manifest;
        let target = dest.join(&job.target);
        let parent = target.parent().unwrap_or(dest);
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create directory {}", parent.display()))?;
        match m.kind {
            Kind::File => {
                std::fs::rename(&job.staged, &target).with_context(|| {
                    format!(
                        "cannot move {} into place at {}",
                        job.staged.display(),
                        target.display()
                    )
                })?;
                delivered.files += 1;
                delivered.bytes += m.size;
                delivered.placed.push(Placed::new(m, &job.target, false));
            }
            Kind::Dir => {
                std::fs::create_dir_all(&target)
                    .with_context(|| format!("cannot create directory {}", target.display()))?;
                set_times_and_mode(&target, m)?;
                delivered.directories += 1;
            }
        }
    }
    forte_fs::syncfs(dest)?;
    Ok(delivered)
}
