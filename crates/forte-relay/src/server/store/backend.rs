//! Where the store's records and bodies live: a directory, or an S3-compatible bucket. Both
//! hold the same keys (`sites/<site>/objects/<id>/part-000000.zst.age`, …); the store above
//! knows what the keys mean, a backend only how to keep them.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::{Result, StoreError};

/// A stored body being read, and its length.
pub type Reader = (Box<dyn Read + Send>, u64);

/// One stored record or body.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its key under the store's root (`sites/…`).
    pub key: String,
    pub size: u64,
    /// When it was last written, in seconds since the epoch.
    pub modified: u64,
    /// What changes whenever its contents do (a bucket's ETag), for caching what was read;
    /// `None` where reading again is as cheap (a directory).
    pub version: Option<String>,
}

impl Entry {
    /// The last segment of the key.
    pub fn name(&self) -> &str {
        self.key.rsplit('/').next().unwrap_or(&self.key)
    }
}

/// How the store keeps its keys. Every write is durable when it returns: the relay answers an
/// upload only after that.
pub trait Backend: Send + Sync {
    /// Stores `bytes` at `key`, replacing what is there.
    fn put(&self, key: &str, bytes: &[u8], what: &str) -> Result<()>;
    /// Stores `bytes` at `key` only if nothing is there; whether it did. Two relays writing the
    /// same key at once: exactly one of them does.
    fn put_new(&self, key: &str, bytes: &[u8], what: &str) -> Result<bool>;
    /// The local directory where a body bound for `key` is written while it arrives, before
    /// [`Backend::put_file`] keeps it: on the file system of its target where there is one.
    fn spool_dir(&self, key: &str) -> PathBuf;
    /// Stores the complete file at `spooled` (in [`Backend::spool_dir`]) at `key`, replacing
    /// what is there; the file is gone afterwards, kept or not.
    fn put_file(&self, key: &str, spooled: &Path, what: &str) -> Result<()>;
    /// What is at `key`, `None` if nothing.
    fn get(&self, key: &str, what: &str) -> Result<Option<Vec<u8>>>;
    /// What is at `key` as a stream, for bodies too large to hold: `None` if nothing.
    fn open(&self, key: &str, what: &str) -> Result<Option<Reader>>;
    fn exists(&self, key: &str, what: &str) -> Result<bool>;
    /// Whether anything is under `prefix/` (a directory, even empty, counts).
    fn any_under(&self, prefix: &str, what: &str) -> Result<bool>;
    /// Removes `key`; nothing there is fine.
    fn delete(&self, key: &str, what: &str) -> Result<()>;
    /// Removes everything under each of `prefixes` (`prefix/`); returns what it removed.
    /// Many at once cost a bucket one listing each, gone together, and one bulk deletion.
    fn delete_under(&self, prefixes: &[String], what: &str) -> Result<Vec<Entry>>;
    /// Every entry under `prefix/`, at any depth.
    fn list(&self, prefix: &str, what: &str) -> Result<Vec<Entry>>;
    /// The names directly under `prefix/`: entries, and prefixes with entries below them.
    fn children(&self, prefix: &str, what: &str) -> Result<Vec<String>>;
    /// Makes durable what was written before (a retried part found already held, which the
    /// crash of an earlier attempt may have left unflushed).
    fn flush(&self, what: &str) -> Result<()>;
    /// Where the store is, for operators' messages.
    fn location(&self) -> String;
    /// Whether other relays may write the same store at the same time.
    fn shared(&self) -> bool;
}

pub(crate) fn io_error(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(format!("{what}: {e}"))
}
