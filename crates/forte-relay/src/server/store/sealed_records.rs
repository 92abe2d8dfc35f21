//! The sealed records read from a bucket before, by key, with the version (ETag) they were
//! listed with: one listed again with the same version need not be read again.

use std::collections::{HashMap, HashSet};

use parking_lot::Mutex;

use crate::api::ReadyObject;

/// A sealed record as it was read, and the version it was listed with then.
#[derive(Clone)]
struct Cached {
    version: String,
    object: ReadyObject,
}

/// See the module's documentation.
#[derive(Default)]
pub(super) struct SealedRecords {
    by_key: Mutex<HashMap<String, Cached>>,
}

impl SealedRecords {
    /// The record at `key` as read before, if it was read at the `listed` version.
    pub(super) fn current(&self, key: &str, listed: Option<&String>) -> Option<ReadyObject> {
        let known = self.by_key.lock().get(key).cloned();
        match (known, listed) {
            (Some(Cached { version, object }), Some(listed)) if version == *listed => Some(object),
            _ => None,
        }
    }

    /// Keeps the record at `key`, read at `version`.
    pub(super) fn keep(&self, key: String, version: String, object: ReadyObject) {
        self.by_key.lock().insert(key, Cached { version, object });
    }

    /// Forgets the records at `keys` (their objects gone, or reopened).
    pub(super) fn forget(&self, keys: impl IntoIterator<Item = String>) {
        let mut by_key = self.by_key.lock();
        for key in keys {
            by_key.remove(&key);
        }
    }

    /// Forgets the records under `prefix` whose keys are not among `listed`: one put back
    /// later is read again.
    pub(super) fn forget_unlisted(&self, prefix: &str, listed: &HashSet<&str>) {
        self.by_key
            .lock()
            .retain(|key, _| !key.starts_with(prefix) || listed.contains(key.as_str()));
    }
}
