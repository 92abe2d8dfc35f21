//! The second copy (`pull --copy-to`): a directory, or an S3-compatible bucket; and a bucket as
//! the destination itself (`pull --to s3://…`), fed from a scratch directory. Every file of a
//! batch is there, whole and verified, before the relay is told it may delete the batch.

use std::path::{Path, PathBuf};

use anyhow::Result;
use forte_restore::{replicate, Placed};

use forte_bucket::{Bucket, Credentials};

use crate::bucket_writer::BucketWriter;

pub enum Replica {
    Dir(PathBuf),
    Bucket(BucketWriter),
}

impl Replica {
    /// `DIR`, or `s3://BUCKET/PREFIX` (opened, and its credentials checked, now).
    pub fn open(text: &str, credentials: &Credentials) -> Result<Self> {
        if Bucket::is_url(text) {
            BucketWriter::open(text, credentials).map(Self::Bucket)
        } else {
            Ok(Self::Dir(PathBuf::from(text)))
        }
    }

    /// Copies the `placed` files from `dest`; returns how many were copied (those already
    /// there, identical, are not). With `may_replace` (a later version of their batch), other
    /// contents there are kept under `.forte-replaced/` of the copy first, then replaced.
    pub fn replicate(&self, dest: &Path, placed: &[Placed], may_replace: bool) -> Result<usize> {
        match self {
            Self::Dir(copy) => {
                let keep_in = copy.join(crate::deliver::REPLACED_DIR);
                replicate(dest, copy, placed, may_replace.then_some(keep_in.as_path()))
            }
            Self::Bucket(bucket) => bucket.replicate(dest, placed, may_replace),
        }
    }
}

/// Removes the `placed` files from the scratch directory `dest` once the bucket that is the
/// destination holds them, and the directories they leave empty. What cannot be removed stays,
/// said on stderr: the bucket has it, and a later delivery of the same file replaces it.
pub fn clear_scratch(dest: &Path, placed: &[Placed]) {
    for p in placed {
        let file = dest.join(&p.target);
        if let Err(e) = std::fs::remove_file(&file) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(
                    "cannot remove {} from the scratch directory: {e}",
                    file.display()
                );
            }
            continue;
        }
        // Emptied parents go too, up to the scratch directory itself.
        let mut dir = file.parent();
        while let Some(d) = dir.filter(|d| *d != dest) {
            if std::fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
    }
}
