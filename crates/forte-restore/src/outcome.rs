//! What a restore reports: its live totals, what it delivered, and why it refused.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;

use forte_format::{Manifest, ObjectId};
use serde::Serialize;

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
    /// The earlier versions of files that this delivery replaced, each kept.
    pub replaced: Vec<Replaced>,
}

impl Delivered {
    /// Nothing delivered.
    pub fn nothing() -> Self {
        Self {
            files: 0,
            already: 0,
            directories: 0,
            bytes: 0,
            placed: Vec::new(),
            inventory: false,
            replaced: Vec::new(),
        }
    }
}

/// An earlier version of a file, replaced by a newer instance of its batch and kept.
#[derive(Debug, Clone, Serialize)]
pub struct Replaced {
    /// Its path under the destination (the layout's), where the new version now is.
    pub target: String,
    /// The SHA-256 of the bytes replaced.
    pub sha256: String,
    /// Where they are kept.
    pub kept_as: PathBuf,
    /// The file that replaced it.
    pub by: ObjectId,
}

/// One object in place at the destination.
#[derive(Debug, Clone, Serialize)]
pub struct Placed {
    pub id: ObjectId,
    /// The object that carried it: its own id, or its bundle's.
    pub carrier: ObjectId,
    /// Its path in the batch (the manifest's).
    pub path: String,
    /// Its path under the destination (the layout's).
    pub target: String,
    pub size: u64,
    pub sha256: String,
    /// A file, or an (empty) directory sent as an object of its own.
    pub kind: forte_format::Kind,
    /// Found in place from an earlier delivery rather than written now.
    pub already: bool,
    /// Each part's raw and ciphertext SHA-256, as verified.
    pub parts: Vec<(u32, String, String)>,
}

impl Placed {
    pub(crate) fn new(m: &Manifest, carrier: ObjectId, target: &str, already: bool) -> Self {
        Self {
            id: m.id,
            carrier,
            path: m.path.clone(),
            target: target.to_string(),
            size: m.size,
            sha256: m.sha256.clone(),
            kind: m.kind,
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
