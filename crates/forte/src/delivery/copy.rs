//! The second copy (`pull --copy-to`): a directory, or an S3-compatible bucket. Every file of a
//! batch is there, whole and verified, before the relay is told it may delete the batch.

use std::path::{Path, PathBuf};

use anyhow::Result;
use forte_restore::{replicate, Placed};

use forte_bucket::{Bucket, Credentials};

use crate::s3::BucketCopy;

pub enum SecondCopy {
    Dir(PathBuf),
    Bucket(BucketCopy),
}

impl SecondCopy {
    /// `DIR`, or `s3://BUCKET/PREFIX` (opened, and its credentials checked, now).
    pub fn open(text: &str, credentials: &Credentials) -> Result<Self> {
        if Bucket::is_url(text) {
            BucketCopy::open(text, credentials).map(Self::Bucket)
        } else {
            Ok(Self::Dir(PathBuf::from(text)))
        }
    }

    /// Copies the `placed` files from `dest`; returns how many were copied (those already
    /// there, identical, are not).
    pub fn replicate(&self, dest: &Path, placed: &[Placed]) -> Result<usize> {
        match self {
            Self::Dir(copy) => replicate(dest, copy, placed),
            Self::Bucket(bucket) => bucket.replicate(dest, placed),
        }
    }
}
