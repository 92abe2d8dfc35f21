//! The relay's store: ciphertext objects in the pack layout, plus the relay's own small records,
//! in a directory or an S3-compatible bucket (the [`Backend`]), under the same keys:
//!
//! ```text
//! sites/<site>/objects/<id>/manifest.age, part-NNNNNN.zst.age   (as `forte pack` writes)
//! sites/<site>/meta/<id>/part-NNNNNN.sha256   "<sha256> <length>": the part is held
//! sites/<site>/meta/<id>/sealed.json          the object is complete (a ReadyObject)
//! sites/<site>/batches/<batch>.json           the batch is sealed: its object ids
//! sites/<site>/batches/<batch>.inventory.age  its sealed inventory, for the core
//! sites/<site>/batches/<batch>.acking.json    objects being acknowledged together
//! sites/<site>/acked/<id>                     the core acknowledged delivery (create-only)
//! sites/<site>/tmp/                           bodies being written (directory only)
//! ```
//!
//! Every write is durable before the relay answers (see the backends). A part's record is
//! written before the part, and a part counts as held only when both exist. A crash before a
//! directory's flush may leave a record or part that is not what it claims: the edge was not
//! answered, retries, and the relay re-hashes a held part before trusting it on a retry;
//! whatever slipped through is caught by the core's ciphertext check.
//!
//! Several relays may share one bucket: what one relay learns from another is read from the
//! bucket each time (the only things kept in memory are the quota's running figures and the
//! sealed records already read, checked against each listing's ETags).
//!
//! Which file holds which job (the types that keep state of their own have a file each, and
//! `Store` is made of them; its methods are grouped by job):
//!
//! - `mod.rs`: the [`Store`], what it is made of and opening it; [`StoreError`]
//! - `location.rs`: where a store is ([`Location`]) and the backend kept there
//! - `backend.rs`, `dir.rs`, `bucket.rs`: how a directory or a bucket keeps a key
//! - `keys.rs`: the keys above, and part records read back
//! - `locks.rs`: `ObjectLocks`, one lock per object being written or sealed
//! - `quota.rs`: `Quota`, the bytes each site holds; charging them, and what a full store says
//! - `sealed_records.rs`: `SealedRecords`, sealed records read before, by listed version
//! - `status.rs`: what the relay holds of an object (`status`, `statuses`, held parts)
//! - `upload.rs`: a part arriving (`begin_part`, [`PartUpload`], `put_part`)
//! - `seal.rs`: objects and batches sealed (`seal`, `put_whole`, `seal_batch`)
//! - `ready.rs`: what the core is offered and reads (`ready`, manifests, parts, inventories)
//! - `ack.rs`: the core's acknowledgements and its receipts (`ack_batch`, `receipts`)
//! - `removal.rs`: what goes undelivered: cancelled, expired, rejected (`cancel`,
//!   `expire_open`, `reject`)
//! - `holdings.rs`: what the relay holds per site and batch, for operators (`holdings`)

mod ack;
mod backend;
mod bucket;
mod dir;
mod holdings;
mod keys;
mod location;
mod locks;
mod quota;
mod ready;
mod removal;
mod seal;
mod sealed_records;
mod status;
mod upload;

use std::io::ErrorKind;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use forte_format::ObjectId;

use crate::api::ObjectState;
use ack::Acking;
pub use ack::{MAX_RECEIPTS_PER_BATCH, MAX_RECEIPT_BYTES};
pub use backend::{Backend, Entry, Reader};
pub use holdings::Holding;
use location::backend_at;
pub use location::Location;
use locks::ObjectLocks;
use quota::Quota;
use sealed_records::SealedRecords;
pub use upload::PartUpload;

/// Why a store operation was refused.
#[derive(Debug)]
pub enum StoreError {
    NotFound(String),
    /// The request contradicts what is stored (missing parts at seal).
    Conflict(String),
    /// An upload or seal for an object the relay holds already in `state` (sealed, or
    /// delivered and acknowledged), which it must not replace.
    Held(ObjectState, String),
    /// The request itself is wrong (hash mismatch, bad part list).
    Invalid(String),
    /// Quota or disk full, with batches waiting for the core, whose pull frees space.
    Full(String),
    /// Quota or disk full with nothing the core can pull: every byte held belongs to batches
    /// not sealed yet, so waiting cannot help (a batch larger than the space, or several
    /// unsealed batches that together fill it).
    NoRoom(String),
    Io(String),
}

impl StoreError {
    fn io(what: &str, path: &Path, e: std::io::Error) -> Self {
        if e.raw_os_error() == Some(28) || e.kind() == ErrorKind::StorageFull {
            return StoreError::Full(format!("relay disk full while writing {what}"));
        }
        StoreError::Io(format!("{what}: {}: {e}", path.display()))
    }
}

type Result<T> = std::result::Result<T, StoreError>;

/// What a part upload did.
#[derive(Debug, PartialEq, Eq)]
pub enum Stored {
    New,
    AlreadyHeld,
}

pub struct Store {
    backend: Box<dyn Backend>,
    /// The bytes each site holds, for its quota.
    quota: Quota,
    /// Sealed records read from a bucket before: one listed again unchanged is not read again.
    sealed_records: SealedRecords,
    /// One lock per object being written or sealed.
    object_locks: ObjectLocks,
}

impl Store {
    /// The store at `location` as it is, for reading and for operators' commands, without the
    /// clean-up a serving relay does at start (which would disturb one running on it).
    pub fn inspect(location: impl Into<Location>) -> anyhow::Result<Self> {
        Ok(Self::over(backend_at(&location.into(), true)?, None))
    }

    pub fn open(location: impl Into<Location>, quota: Option<u64>) -> anyhow::Result<Self> {
        let backend = backend_at(&location.into(), false)?;
        let store = Self::over(backend, quota);
        let sites = store.sites().map_err(|e| anyhow::anyhow!("{e:?}"))?;
        for site in &sites {
            store
                .count_usage(site)
                .map_err(|e| anyhow::anyhow!("cannot read what site {site} holds: {e:?}"))?;
        }
        // Batch acknowledgements a stop interrupted are finished before anything is served.
        for site in &sites {
            for Acking { batch, ids } in store.acking(site) {
                store.finish_ack(site, &batch, &ids, None).map_err(|e| {
                    anyhow::anyhow!(
                        "cannot finish acknowledging batch {batch} of site {site}: {e:?}"
                    )
                })?;
            }
        }
        Ok(store)
    }

    fn over(backend: Box<dyn Backend>, quota: Option<u64>) -> Self {
        Self {
            backend,
            quota: Quota::new(quota),
            sealed_records: SealedRecords::default(),
            object_locks: ObjectLocks::default(),
        }
    }

    /// Where the store is: its directory, or `s3://BUCKET/PREFIX`.
    pub fn location(&self) -> String {
        self.backend.location()
    }

    /// The TLS identity (certificate and key, PEM) kept in the store, for relays sharing a
    /// bucket to present one certificate: the first relay stores the one `generate` makes
    /// (create-only: of two starting at once, one wins), every other one reads it.
    pub fn shared_identity(
        &self,
        generate: impl FnOnce() -> anyhow::Result<Vec<u8>>,
    ) -> anyhow::Result<Vec<u8>> {
        const KEY: &str = "tls/identity.pem";
        let what = "the relay's TLS identity";
        let read = || -> anyhow::Result<Option<Vec<u8>>> {
            self.backend
                .get(KEY, what)
                .map_err(|e| anyhow::anyhow!("cannot read {what}: {e:?}"))
        };
        if let Some(pem) = read()? {
            return Ok(pem);
        }
        let pem = generate()?;
        let stored = self
            .backend
            .put_new(KEY, &pem, what)
            .map_err(|e| anyhow::anyhow!("cannot store {what}: {e:?}"))?;
        if stored {
            return Ok(pem);
        }
        read()?.ok_or_else(|| anyhow::anyhow!("{what} vanished from the store"))
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Objects of one batch looked at or acknowledged at the same time: to a bucket each look or
/// tombstone is a request that waits for an answer (149 objects one after another kept a pull
/// waiting on about 1 200 of them).
const AT_ONCE: usize = 8;

/// Runs `each` for every id, [`AT_ONCE`] threads sharing them; the first error.
fn at_once(ids: &[ObjectId], each: impl Fn(ObjectId) -> Result<()> + Sync) -> Result<()> {
    let per_thread = ids.len().div_ceil(AT_ONCE).max(1);
    std::thread::scope(|s| {
        let threads: Vec<_> = ids
            .chunks(per_thread)
            .map(|some| s.spawn(|| some.iter().try_for_each(|&id| each(id))))
            .collect();
        threads
            .into_iter()
            .try_for_each(|t| t.join().expect("an acknowledgement thread panicked"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::PathBuf;
    use std::sync::Arc;

    use parking_lot::Mutex;
    use sha2::{Digest, Sha256};

    use dir::DirBackend;

    /// A directory whose backend counts the calls made to it, by method: what a bucket would
    /// be sent, each call a request (a deletion under many prefixes one listing each and one
    /// bulk deletion).
    #[derive(Clone)]
    struct Counting {
        dir: Arc<DirBackend>,
        calls: Arc<Mutex<HashMap<&'static str, usize>>>,
    }

    impl Counting {
        fn call(&self, method: &'static str) {
            *self.calls.lock().entry(method).or_default() += 1;
        }

        /// The calls counted since the last take, sorted by method.
        fn take(&self) -> Vec<(&'static str, usize)> {
            let mut calls: Vec<_> = std::mem::take(&mut *self.calls.lock())
                .into_iter()
                .collect();
            calls.sort();
            calls
        }
    }

    impl Backend for Counting {
        fn put(&self, key: &str, bytes: &[u8], what: &str) -> Result<()> {
            self.call("put");
            self.dir.put(key, bytes, what)
        }
        fn put_new(&self, key: &str, bytes: &[u8], what: &str) -> Result<bool> {
            self.call("put_new");
            self.dir.put_new(key, bytes, what)
        }
        fn spool_dir(&self, key: &str) -> PathBuf {
            self.dir.spool_dir(key)
        }
        fn put_file(&self, key: &str, spooled: &Path, what: &str) -> Result<()> {
            self.call("put");
            self.dir.put_file(key, spooled, what)
        }
        fn get(&self, key: &str, what: &str) -> Result<Option<Vec<u8>>> {
            self.call("get");
            self.dir.get(key, what)
        }
        fn open(&self, key: &str, what: &str) -> Result<Option<Reader>> {
            self.call("get");
            self.dir.open(key, what)
        }
        fn exists(&self, key: &str, what: &str) -> Result<bool> {
            self.call("exists");
            self.dir.exists(key, what)
        }
        fn any_under(&self, prefix: &str, what: &str) -> Result<bool> {
            self.call("any_under");
            self.dir.any_under(prefix, what)
        }
        fn delete(&self, key: &str, what: &str) -> Result<()> {
            self.call("delete");
            self.dir.delete(key, what)
        }
        fn delete_under(&self, prefixes: &[String], what: &str) -> Result<Vec<Entry>> {
            self.call("delete_under");
            self.dir.delete_under(prefixes, what)
        }
        fn list(&self, prefix: &str, what: &str) -> Result<Vec<Entry>> {
            self.call("list");
            self.dir.list(prefix, what)
        }
        fn children(&self, prefix: &str, what: &str) -> Result<Vec<String>> {
            self.call("children");
            self.dir.children(prefix, what)
        }
        fn flush(&self, what: &str) -> Result<()> {
            self.dir.flush(what)
        }
        fn location(&self) -> String {
            self.dir.location()
        }
        fn shared(&self) -> bool {
            true
        }
    }

    #[test]
    fn a_new_object_costs_a_bucket_five_requests_a_manifest_one_and_a_batchs_acknowledgement_one_deletion(
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let counting = Counting {
            dir: Arc::new(DirBackend::new(tmp.path())),
            calls: Arc::default(),
        };
        let store = Store::over(Box::new(counting.clone()), None);
        let ids: Vec<ObjectId> = (0..10).map(|_| ObjectId::random()).collect();
        for (i, &id) in ids.iter().enumerate() {
            let body = format!("ciphertext of object {i}").into_bytes();
            let sha256 = hex::encode(Sha256::digest(&body));
            let mut part = store
                .begin_part("s", id, 0, &sha256, body.len() as u64)
                .unwrap();
            part.write(&body).unwrap();
            let stored = store.put_whole(part, "b", b"manifest");
            assert_eq!(stored.unwrap(), Stored::New);
        }
        // Each: its part's record (create-only), the part, a look for a tombstone, its
        // manifest and its sealed record.
        let each = [("exists", 10), ("put", 30), ("put_new", 10)];
        assert_eq!(counting.take(), each);
        store.seal_batch("s", "b", &ids, None).unwrap();
        counting.take();
        // The core reads each manifest: one request each.
        for &id in &ids {
            assert_eq!(store.read_manifest("s", id).unwrap(), b"manifest");
        }
        assert_eq!(counting.take(), [("get", 10)]);
        store.ack_batch("s", "b", &ids, None).unwrap();
        // The batch's seal read (the acknowledgement must name all it lists), each object's
        // sealed record looked at and its tombstone written; the acknowledgement record
        // written, all the objects deleted at once, then the batch's three records.
        let ack = [
            ("delete", 3),
            ("delete_under", 1),
            ("exists", 10),
            ("get", 1),
            ("put", 1),
            ("put_new", 10),
        ];
        assert_eq!(counting.take(), ack);
        assert!(store
            .statuses("s", &ids)
            .unwrap()
            .values()
            .all(|s| s.state == ObjectState::Delivered));
        let left = counting.dir.list("sites/s/objects", "test").unwrap();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_full_disk_is_full_and_any_other_io_error_names_the_file() {
        let path = Path::new("/store/sites/s/tmp/0123");
        // ENOSPC, as Linux reports it.
        let e = StoreError::io("part 3", path, std::io::Error::from_raw_os_error(28));
        assert!(
            matches!(&e, StoreError::Full(m) if m == "relay disk full while writing part 3"),
            "{e:?}"
        );
        // The kind alone, without an OS error number (as a wrapped or non-Linux error has it).
        let e = StoreError::io("part 3", path, std::io::Error::from(ErrorKind::StorageFull));
        assert!(matches!(&e, StoreError::Full(_)), "{e:?}");
        let e = StoreError::io("part 3", path, std::io::Error::from_raw_os_error(21));
        assert!(
            matches!(&e, StoreError::Io(m)
                if m == "part 3: /store/sites/s/tmp/0123: Is a directory (os error 21)"),
            "{e:?}"
        );
    }
}
