//! The restore pipeline's stages: read, verify the ciphertext, decrypt, decompress and verify,
//! assemble each file in order in the staging directory.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{bail, Context, Result};
use forte_format::seal::{decrypt, sha256_hex};
use forte_pipeline::{queue, Budget, Charge, Emit, StageSpec, Weigh};
use sha2::{Digest, Sha256};

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
    /// Relative path at the destination, from the layout.
    pub(crate) target: String,
    pub(crate) staged: PathBuf,
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

impl Restore<'_> {
    pub(crate) fn stage_all(
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
                StageSpec::io("read", self.config.readers),
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
                StageSpec::cpu("verify_ciphertext", cpu),
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
                StageSpec::cpu("decrypt", cpu),
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
                StageSpec::cpu("decompress", cpu),
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

pub(crate) fn create_staged(path: &Path) -> Result<File> {
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
