//! The restore pipeline's stages: read, verify the ciphertext, decrypt, decompress and verify,
//! assemble each file in order in the staging directory.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use forte_format::seal::{decrypt, sha256_hex};
use forte_format::{bundle, Kind, Manifest, ObjectId};
use forte_pipeline::{queue, Budget, Charge, Emit, Gate, Salvage, Weigh};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use crate::destination::set_staged_times_and_mode;
use crate::{Object, ObjectSource, PartError, Problem, Restore, RestoreFailure};

/// Assembly state of one file in the staging directory.
struct Assembly {
    file: Option<File>,
    next: u32,
    /// Parts that arrived before their predecessors, with their in-flight slots.
    pending: BTreeMap<u32, (Vec<u8>, Charge)>,
    whole: Sha256,
}

pub(crate) struct Job {
    pub(crate) object: Object,
    /// What it delivers: the object's file or directory, or a bundle's files.
    pub(crate) files: Vec<StagedFile>,
    assembly: Mutex<Assembly>,
}

/// A file or directory of an object (see [`Manifest::files`]), and where the layout puts it.
pub(crate) struct PlannedFile {
    pub(crate) manifest: Manifest,
    /// Relative path at the destination.
    pub(crate) target: String,
}

/// An object and those of its files to deliver.
pub(crate) struct PlannedObject {
    pub(crate) object: Object,
    pub(crate) files: Vec<PlannedFile>,
}

/// One file or directory of a job, on its way into place.
pub(crate) struct StagedFile {
    /// Its own manifest, or for a bundle's member the one [`Manifest::files`] gives it.
    pub(crate) manifest: Manifest,
    /// Relative path at the destination, from the layout.
    pub(crate) target: String,
    pub(crate) staged: PathBuf,
    /// The object it travels in: its own, or its bundle.
    pub(crate) carrier: ObjectId,
}

impl Weigh for Job {
    const ITEM: &'static str = "object";

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
    /// When it was read, for its latency to the sink.
    read_at: Instant,
}

impl Weigh for Piece {
    const ITEM: &'static str = "part";

    fn weight(&self) -> u64 {
        self.data.len() as u64
    }

    fn read_at(&self) -> Option<Instant> {
        Some(self.read_at)
    }
}

/// What passes between the computing stages: a piece, or the problem that ended it, which the
/// last stage records.
struct Step(Result<Piece, Problem>);

impl Weigh for Step {
    const ITEM: &'static str = Piece::ITEM;

    fn weight(&self) -> u64 {
        self.0.weight()
    }

    fn read_at(&self) -> Option<Instant> {
        self.0.read_at()
    }
}

/// Which part of which object a piece is.
struct WhichPart {
    job: Arc<Job>,
    index: u32,
}

/// A piece whose worker died goes on as a problem of its object and part.
impl Salvage for Step {
    type Remains = Result<WhichPart, Problem>;

    fn remains(&self) -> Self::Remains {
        match &self.0 {
            Ok(piece) => Ok(WhichPart {
                job: piece.job.clone(),
                index: piece.index,
            }),
            Err(problem) => Err(problem.clone()),
        }
    }

    fn lost(remains: Self::Remains, error: String) -> Self {
        Self(Err(match remains {
            Ok(WhichPart { job, index }) => job.problem(index, false, error),
            Err(problem) => problem,
        }))
    }
}

impl Piece {
    fn problem(&self, damaged: bool, what: impl std::fmt::Display) -> Problem {
        self.job.problem(self.index, damaged, what)
    }
}

impl Job {
    /// A job that delivers the `planned` object's files, staged in `staging`.
    fn new(planned: PlannedObject, staging: &Path) -> Self {
        let PlannedObject { object, files } = planned;
        let files = files
            .into_iter()
            .map(|PlannedFile { manifest, target }| StagedFile {
                staged: staging.join(manifest.id.to_string()),
                carrier: object.manifest.id,
                manifest,
                target,
            })
            .collect();
        Self {
            files,
            object,
            assembly: Mutex::new(Assembly {
                file: None,
                next: 0,
                pending: BTreeMap::new(),
                whole: Sha256::new(),
            }),
        }
    }

    /// A problem with part `index` of this object, named by file (a bundle: its files),
    /// object and part.
    fn problem(&self, index: u32, damaged: bool, what: impl std::fmt::Display) -> Problem {
        let m = &self.object.manifest;
        Problem {
            object: m.id,
            part: Some(index),
            damaged,
            message: format!("{} (object {}), part {index}: {what}", m.describe(), m.id),
        }
    }
}

/// The problems a pass met. The first one stops the pass: nothing more is read, and what is in
/// flight drains.
#[derive(Default)]
struct Problems {
    found: Mutex<Vec<Problem>>,
    stop: OnceLock<()>,
}

impl Problems {
    fn add(&self, problem: Problem) {
        let _ = self.stop.set(());
        self.found.lock().push(problem);
    }

    fn stopped(&self) -> bool {
        self.stop.get().is_some()
    }

    fn into_result(self) -> Result<()> {
        let problems = self.found.into_inner();
        if problems.is_empty() {
            return Ok(());
        }
        Err(RestoreFailure { problems }.into())
    }
}

impl Restore<'_> {
    /// Reads, verifies, decrypts, decompresses and assembles every object into `staging`.
    /// Returns the staged files, or every problem met before the pass stopped.
    pub(crate) fn stage_all(
        &self,
        source: &dyn ObjectSource,
        objects: Vec<PlannedObject>,
        staging: &Path,
    ) -> Result<Vec<Arc<Job>>> {
        let jobs: Vec<Arc<Job>> = objects
            .into_iter()
            .map(|planned| Arc::new(Job::new(planned, staging)))
            .collect();
        let problems = Problems::default();
        let in_flight = self.config.parts_in_flight.max(1);
        // Sealed parts are about their raw size or smaller; charging the raw length bounds
        // the decompressed copies too.
        let memory = Budget::new(in_flight as u64 * max_part_size(&jobs));
        let cpu = self.config.cpu.max(1);
        let (jobs_tx, jobs_rx) = queue::<Arc<Job>>(64);
        let (read_tx, read_rx) = queue::<Step>(2);
        let (verified_tx, verified_rx) = queue::<Step>(cpu);
        let (decrypted_tx, decrypted_rx) = queue::<Step>(cpu);
        let (raw_tx, raw_rx) = queue::<Step>(cpu);
        self.pipeline.run(|s| {
            s.io(
                "read",
                self.config.readers,
                jobs_rx,
                read_tx,
                |job, emit| {
                    if !problems.stopped() {
                        if let Err(e) = read_parts(source, &job, &memory, &problems, emit) {
                            problems.add(e);
                        }
                    }
                },
            );
            s.cpu(
                "verify_ciphertext",
                cpu,
                read_rx,
                verified_tx,
                step(verify_ciphertext),
            );
            let decrypt = step(|piece| self.decrypt_part(piece));
            s.cpu("decrypt", cpu, verified_rx, decrypted_tx, decrypt);
            let decompress = step(decompress_and_verify);
            s.cpu("decompress", cpu, decrypted_rx, raw_tx, decompress);
            let writers = Gate::fixed(self.config.writers);
            s.sink("assemble", writers, raw_rx, |step| {
                if let Err(problem) = step.0.and_then(|piece| self.assemble(piece)) {
                    problems.add(problem);
                }
            });
            for job in &jobs {
                if problems.stopped() || jobs_tx.send(job.clone()).is_err() {
                    break;
                }
            }
            drop(jobs_tx);
        });
        problems.into_result()?;
        Ok(jobs)
    }

    /// The `decrypt` stage: opens the age envelope, refusing one that decrypts past what the
    /// part's raw length can compress to.
    fn decrypt_part(&self, mut piece: Piece) -> Result<Piece, Problem> {
        let entry = &piece.job.object.manifest.parts[piece.index as usize];
        let bound = entry.raw_length + entry.raw_length / 64 + (1 << 20);
        let compressed = decrypt(&self.identities.0, &piece.data, bound)
            .map_err(|e| piece.problem(true, format!("cannot decrypt: {e}")))?;
        self.totals
            .sealed_bytes
            .fetch_add(piece.data.len() as u64, Ordering::Relaxed);
        piece.data = compressed;
        Ok(piece)
    }

    /// The `assemble` stage: [`Restore::write_in_order`], with a failure named by file and part.
    fn assemble(&self, piece: Piece) -> Result<(), Problem> {
        let (job, index) = (piece.job.clone(), piece.index);
        self.write_in_order(piece)
            .map_err(|e| job.problem(index, false, format!("{e:#}")))
    }

    /// Writes parts to the staged file in order, hashing the whole file as it goes; parts that
    /// come early wait in memory (bounded by the in-flight slots they hold).
    fn write_in_order(&self, piece: Piece) -> Result<()> {
        let job = piece.job.clone();
        let manifest = &job.object.manifest;
        if manifest.kind == Kind::Bundle {
            return self.unbundle(&job, &piece.data);
        }
        let staged = &job.files[0].staged;
        let mut asm = job.assembly.lock();
        asm.pending.insert(piece.index, (piece.data, piece.charge));
        while let Some((data, _charge)) = {
            let next = asm.next;
            asm.pending.remove(&next)
        } {
            if asm.file.is_none() {
                asm.file = Some(create_staged(staged)?);
            }
            // A one-part file's hash is its part's, already verified (Manifest::validate
            // guarantees they are equal): no second pass over the bytes.
            if manifest.parts.len() > 1 {
                asm.whole.update(&data);
            }
            forte_fs::write_in_slices(asm.file.as_mut().expect("created above"), &data)
                .with_context(|| format!("cannot write {}", staged.display()))?;
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
            if let Some(file) = asm.file.take() {
                set_staged_times_and_mode(&file, staged, &job.files[0].manifest)?;
                forte_fs::start_writeback(&file);
            }
            self.totals.files_done.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl Restore<'_> {
    /// A bundle's verified tar stream: every member checked against the manifest (header,
    /// padding, SHA-256), then the files to deliver written to staging.
    fn unbundle(&self, job: &Job, stream: &[u8]) -> Result<()> {
        let manifest = &job.object.manifest;
        bundle::check_stream(&manifest.members, stream).map_err(anyhow::Error::msg)?;
        let offsets: std::collections::HashMap<ObjectId, u64> =
            manifest.members.iter().map(|m| (m.id, m.offset)).collect();
        for file in &job.files {
            let m = &file.manifest;
            let at = offsets[&m.id] as usize;
            let mut out = create_staged(&file.staged)?;
            forte_fs::write_in_slices(&mut out, &stream[at..at + m.size as usize])
                .with_context(|| format!("{}: cannot write {}", m.path, file.staged.display()))?;
            set_staged_times_and_mode(&out, &file.staged, m)?;
            forte_fs::start_writeback(&out);
            self.totals.raw_bytes.fetch_add(m.size, Ordering::Relaxed);
            self.totals.files_done.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

pub(crate) fn create_staged(path: &Path) -> Result<File> {
    File::create(path).with_context(|| format!("cannot create staging file {}", path.display()))
}

/// The `read` stage: reads every sealed part of an object in order.
fn read_parts(
    source: &dyn ObjectSource,
    job: &Arc<Job>,
    memory: &Arc<Budget>,
    problems: &Problems,
    emit: &mut Emit<'_, Step>,
) -> Result<(), Problem> {
    let manifest = &job.object.manifest;
    for entry in &manifest.parts {
        emit.wait_for_demand();
        let charge = emit.waiting(|| memory.charge(entry.raw_length.max(MIN_CHARGE)));
        if problems.stopped() {
            return Ok(());
        }
        let problem = |damaged, what| job.problem(entry.index, damaged, what);
        let data = source
            .part(&job.object.at, entry.index, entry.ciphertext_length)
            .map_err(|e| match e {
                PartError::Damaged(what) => problem(true, what),
                PartError::Unavailable(what) => problem(false, what),
            })?;
        if !emit.send(Step(Ok(Piece {
            job: job.clone(),
            index: entry.index,
            data,
            charge,
            read_at: Instant::now(),
        }))) {
            return Ok(());
        }
    }
    Ok(())
}

/// A computing stage's job: `work` on a piece, or the problem that ended it passed on.
fn step(
    work: impl Fn(Piece) -> Result<Piece, Problem> + Send + Sync,
) -> impl Fn(Step, &mut Emit<'_, Step>) + Send + Sync {
    move |step, emit| {
        emit.send(Step(step.0.and_then(&work)));
    }
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

/// The `verify_ciphertext` stage: the sealed part hashes to what the signed manifest says.
fn verify_ciphertext(piece: Piece) -> Result<Piece, Problem> {
    let expected = &piece.job.object.manifest.parts[piece.index as usize].ciphertext_sha256;
    let found = sha256_hex(&piece.data);
    if &found != expected {
        return Err(piece.problem(true, format!(
            "ciphertext SHA-256 mismatch (manifest {expected}, file {found}): the part was altered, replaced or swapped"
        )));
    }
    Ok(piece)
}

/// The `decompress` stage: the part decompresses to exactly its raw length, and those bytes
/// hash to the manifest's raw SHA-256.
fn decompress_and_verify(mut piece: Piece) -> Result<Piece, Problem> {
    let entry = &piece.job.object.manifest.parts[piece.index as usize];
    let raw = zstd::bulk::decompress(&piece.data, entry.raw_length as usize).map_err(|e| {
        let what = format!("not a valid zstd frame of {} bytes: {e}", entry.raw_length);
        piece.problem(true, what)
    })?;
    if raw.len() as u64 != entry.raw_length {
        let what = format!(
            "decompresses to {} bytes, manifest says {}",
            raw.len(),
            entry.raw_length
        );
        return Err(piece.problem(true, what));
    }
    let found = sha256_hex(&raw);
    if found != entry.raw_sha256 {
        let what = format!(
            "raw SHA-256 mismatch (manifest {}, restored {found})",
            entry.raw_sha256
        );
        return Err(piece.problem(true, what));
    }
    piece.data = raw;
    Ok(piece)
}
