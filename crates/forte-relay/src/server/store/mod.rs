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

mod backend;
mod bucket;
mod dir;
mod upload;

use std::collections::{HashMap, HashSet};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use forte_bucket::{Bucket, Credentials};
use forte_format::{part_file_name, ObjectId, MANIFEST_FILE};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use crate::api::{ObjectState, ObjectStatus, PartRef, ReadyObject};
pub use backend::{Backend, Entry, Reader};
use bucket::BucketBackend;
use dir::DirBackend;
pub use upload::PartUpload;

/// Where a relay's store is: a directory, or `s3://BUCKET/PREFIX` with the credentials for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    Dir(PathBuf),
    Bucket {
        url: String,
        credentials: Credentials,
    },
}

impl Location {
    /// `s3://…` is a bucket, with `credentials` over the environment's; anything else a directory.
    pub fn parse(text: &str, credentials: Credentials) -> Self {
        if Bucket::is_url(text) {
            Self::Bucket {
                url: text.to_string(),
                credentials,
            }
        } else {
            Self::Dir(PathBuf::from(text))
        }
    }
}

impl From<&Path> for Location {
    fn from(dir: &Path) -> Self {
        Self::Dir(dir.to_path_buf())
    }
}

impl From<PathBuf> for Location {
    fn from(dir: PathBuf) -> Self {
        Self::Dir(dir)
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Dir(dir) => write!(f, "{}", dir.display()),
            Self::Bucket { url, .. } => f.write_str(url),
        }
    }
}

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

/// What the relay holds of one batch of one site (`batch` is `None` for objects not sealed
/// yet, whose batch the relay cannot know).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Holding {
    pub site: String,
    pub batch: Option<String>,
    /// The edge sealed the batch: it is waiting for the core.
    pub batch_sealed: bool,
    pub objects: usize,
    pub bytes: u64,
    /// Seconds since the epoch of the oldest and newest change among its objects.
    pub oldest: u64,
    pub newest: u64,
}

/// One object the relay holds, not delivered yet.
struct HeldObject {
    id: ObjectId,
    /// The batch it was sealed into; `None` while open.
    batch: Option<String>,
    bytes: u64,
    /// When it last changed, in seconds since the epoch.
    changed: u64,
}

pub struct Store {
    backend: Box<dyn Backend>,
    quota: Option<u64>,
    /// Bytes held per site, for the quota; rebuilt from the store at start.
    usage: Mutex<HashMap<String, u64>>,
    /// When each site's bytes were last counted from a shared bucket.
    counted: Mutex<HashMap<String, std::time::Instant>>,
    /// Sealed records read from a bucket before, by key, with the version (ETag) they were
    /// listed with: one listed again with the same version need not be read again.
    sealed_records: Mutex<HashMap<String, (String, ReadyObject)>>,
    /// One lock per object being written or sealed: a seal checks the parts held and writes
    /// its record with no part of the object written in between, so parts and manifest never
    /// disagree (in this process; relays sharing a bucket rely on create-only records).
    object_locks: Mutex<HashMap<ObjectKey, Arc<Mutex<()>>>>,
}

/// An object of a site, as a lock is kept for it.
type ObjectKey = (String, ObjectId);

/// The lock of one object, held while a part of it is written or it is sealed; dropped from
/// the map by the last holder.
struct ObjectGuard<'s> {
    store: &'s Store,
    key: ObjectKey,
    lock: Arc<Mutex<()>>,
}

impl Store {
    fn lock_object(&self, site: &str, id: ObjectId) -> ObjectGuard<'_> {
        let key = (site.to_string(), id);
        let lock = self
            .object_locks
            .lock()
            .entry(key.clone())
            .or_default()
            .clone();
        ObjectGuard {
            store: self,
            key,
            lock,
        }
    }
}

impl ObjectGuard<'_> {
    /// Runs `f` holding the object's lock.
    fn hold<T>(&self, f: impl FnOnce() -> T) -> T {
        let _held = self.lock.lock();
        f()
    }
}

impl Drop for ObjectGuard<'_> {
    fn drop(&mut self) {
        let mut locks = self.store.object_locks.lock();
        // The map's own reference and this guard's: nobody else waits for it.
        if Arc::strong_count(&self.lock) == 2 {
            locks.remove(&self.key);
        }
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

/// An object's records and its bodies, from listings of a site: by object id.
type ListedByObject = (HashMap<ObjectId, Vec<Entry>>, HashMap<ObjectId, Vec<Entry>>);

/// Status queries of at least this many ids are answered from listings of the whole site.
const STATUSES_LISTED_FROM: usize = 8;

/// The part index a record's name (`part-N.sha256`) names.
fn record_index(name: &str) -> Option<u32> {
    name.strip_prefix("part-")?
        .strip_suffix(".sha256")?
        .parse()
        .ok()
}

/// A part's record (`SHA256 LENGTH`), if it reads as one.
fn part_record(index: u32, record: &[u8]) -> Option<PartRef> {
    let text = std::str::from_utf8(record).ok()?;
    let (sha256, length) = text.trim().split_once(' ')?;
    Some(PartRef {
        index,
        sha256: sha256.to_string(),
        length: length.parse().ok()?,
    })
}

fn record_name(index: u32) -> String {
    format!("part-{index:06}.sha256")
}

/// Where part `index` of an object is kept.
fn part_key(site: &str, id: ObjectId, index: u32) -> String {
    format!("{}/{}", object_key(site, id), part_file_name(index))
}

/// Where the record of part `index` of an object is kept.
fn record_key(site: &str, id: ObjectId, index: u32) -> String {
    format!("{}/{}", meta_key(site, id), record_name(index))
}

const SEALED_RECORD: &str = "sealed.json";

/// How old a site's byte count from a shared bucket may be when a quota is checked.
const RECOUNT_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

fn site_key(site: &str) -> String {
    format!("sites/{site}")
}

fn object_key(site: &str, id: ObjectId) -> String {
    format!("sites/{site}/objects/{id}")
}

fn meta_key(site: &str, id: ObjectId) -> String {
    format!("sites/{site}/meta/{id}")
}

fn sealed_key(site: &str, id: ObjectId) -> String {
    format!("sites/{site}/meta/{id}/{SEALED_RECORD}")
}

fn acked_key(site: &str, id: ObjectId) -> String {
    format!("sites/{site}/acked/{id}")
}

fn batch_key(site: &str, batch: &str) -> String {
    format!("sites/{site}/batches/{batch}.json")
}

fn inventory_key(site: &str, batch: &str) -> String {
    format!("sites/{site}/batches/{batch}.inventory.age")
}

/// Where the core's receipts for a batch are kept: one per delivered instance, named by the
/// receipt's SHA-256, so a receipt given again (a replay acknowledged) is kept once.
fn receipts_key(site: &str, batch: &str) -> String {
    format!("sites/{site}/receipts/{batch}")
}

/// The most receipts a batch keeps at the relay, and the most bytes of one: receipts are
/// small, and whoever may acknowledge must not fill the store with them.
pub const MAX_RECEIPTS_PER_BATCH: usize = 64;
pub const MAX_RECEIPT_BYTES: usize = 64 << 20;

fn acking_key(site: &str, batch: &str) -> String {
    format!("sites/{site}/batches/{batch}.acking.json")
}

/// The backend at `location`; a directory is created unless `inspect`.
fn backend_at(location: &Location, inspect: bool) -> anyhow::Result<Box<dyn Backend>> {
    Ok(match location {
        Location::Dir(root) => {
            let sites = root.join("sites");
            if inspect {
                anyhow::ensure!(
                    sites.is_dir(),
                    "{} is not a relay store (it has no sites/ directory): give the directory `forte relay --store` uses",
                    root.display()
                );
            } else {
                std::fs::create_dir_all(&sites).map_err(|e| {
                    anyhow::anyhow!("cannot create relay store {}: {e}", sites.display())
                })?;
            }
            let dir = DirBackend::new(root);
            if !inspect {
                dir.remove_tmp();
            }
            Box::new(dir)
        }
        Location::Bucket { url, credentials } => {
            Box::new(BucketBackend::new(Bucket::open(url, credentials)?))
        }
    })
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
            for (batch, ids) in store.acking(site) {
                store.ack_batch(site, &batch, &ids, None).map_err(|e| {
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
            quota,
            usage: Mutex::default(),
            counted: Mutex::default(),
            sealed_records: Mutex::default(),
            object_locks: Mutex::default(),
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

    fn is_acked(&self, site: &str, id: ObjectId) -> Result<bool> {
        self.backend.exists(&acked_key(site, id), "acknowledgement")
    }

    fn is_sealed(&self, site: &str, id: ObjectId) -> Result<bool> {
        self.backend.exists(&sealed_key(site, id), "sealed record")
    }

    /// The parts of an object the relay holds: record and part both present.
    fn held_parts(&self, site: &str, id: ObjectId) -> Result<Vec<PartRef>> {
        let (records, bodies) = self.names_of(site, id)?;
        self.parts_among(site, id, &records, &bodies)
    }

    /// The names of an object's records and of its bodies (parts, manifest).
    fn names_of(&self, site: &str, id: ObjectId) -> Result<(Vec<String>, HashSet<String>)> {
        let what = format!("parts of object {id}");
        let records = self.backend.children(&meta_key(site, id), &what)?;
        let bodies = self.backend.children(&object_key(site, id), &what)?;
        Ok((records, bodies.into_iter().collect()))
    }

    /// The parts of an object among the names of its `records` and `bodies`: those with both,
    /// each as its record says, in order.
    fn parts_among(
        &self,
        site: &str,
        id: ObjectId,
        records: &[String],
        bodies: &HashSet<String>,
    ) -> Result<Vec<PartRef>> {
        let what = format!("parts of object {id}");
        let mut parts = Vec::new();
        for name in records {
            let Some(index) = record_index(name) else {
                continue;
            };
            if !bodies.contains(&part_file_name(index)) {
                continue;
            }
            let record = self
                .backend
                .get(&format!("{}/{name}", meta_key(site, id)), &what)?;
            parts.extend(record.and_then(|r| part_record(index, &r)));
        }
        parts.sort_by_key(|p| p.index);
        Ok(parts)
    }

    /// An object's status from the names of its `records` and `bodies`; `None` when it is not
    /// `present` at the relay (an object reopened by a rejection may have no record left, but
    /// its manifest).
    fn status_among(
        &self,
        site: &str,
        id: ObjectId,
        records: &[String],
        bodies: &HashSet<String>,
        present: bool,
    ) -> Result<Option<ObjectStatus>> {
        if self.is_acked(site, id)? {
            let parts = Vec::new();
            let state = ObjectState::Delivered;
            return Ok(Some(ObjectStatus { state, parts }));
        }
        if !present {
            return Ok(None);
        }
        let state = if records.iter().any(|n| n == SEALED_RECORD) {
            ObjectState::Complete
        } else {
            ObjectState::Open
        };
        let parts = self.parts_among(site, id, records, bodies)?;
        Ok(Some(ObjectStatus { state, parts }))
    }

    /// The site's records and bodies (parts, manifests), each object's by its id: two
    /// listings, for questions about many objects at once.
    fn listed_by_object(&self, site: &str, what: &str) -> Result<ListedByObject> {
        let mut listed = (HashMap::new(), HashMap::new());
        for (under, by_id) in [("meta", &mut listed.0), ("objects", &mut listed.1)] {
            let under = format!("{}/{under}", site_key(site));
            for e in self.backend.list(&under, what)? {
                let id = e
                    .key
                    .strip_prefix(&under)
                    .and_then(|k| k.trim_start_matches('/').split('/').next()?.parse().ok());
                if let Some(id) = id {
                    by_id.entry(id).or_insert_with(Vec::new).push(e);
                }
            }
        }
        Ok(listed)
    }

    fn add_usage(&self, site: &str, delta: i64) {
        let mut usage = self.usage.lock();
        let used = usage.entry(site.to_string()).or_default();
        *used = used.saturating_add_signed(delta);
    }

    /// A full store met while writing: see [`Store::no_room_unless_waiting`].
    fn no_room_unless_waiting_if_full(&self, e: StoreError) -> StoreError {
        match e {
            StoreError::Full(why) => self.no_room_unless_waiting(&["*".to_string()], why),
            e => e,
        }
    }

    /// After a part was written: if the object was delivered (its tombstone written before,
    /// or meanwhile by another relay on the same bucket, whose deletion may have run before
    /// the part was written), what was written goes and the upload is refused.
    fn refuse_if_delivered(&self, site: &str, id: ObjectId, what: &str) -> Result<()> {
        if self.is_acked(site, id)? {
            self.remove_object(site, id, what)?;
            return Err(StoreError::Held(
                ObjectState::Delivered,
                format!("object {id} was already delivered"),
            ));
        }
        Ok(())
    }
    /// Counts `size` more bytes against the site before they are written, under one lock, so
    /// uploads arriving together cannot all pass the quota check on the same figure.
    fn charge(&self, site: &str, size: i64) -> Result<()> {
        let Some(quota) = self.quota else {
            self.add_usage(site, size);
            return Ok(());
        };
        self.recount_if_shared(site)?;
        let mut usage = self.usage.lock();
        let used = usage.entry(site.to_string()).or_default();
        if used.saturating_add_signed(size) > quota {
            let held = *used;
            drop(usage);
            return Err(self.no_room_unless_waiting(
                &[site.to_string()],
                // Over the quota with this upload, not necessarily at it before.
                if held < quota {
                    format!("{size} bytes do not fit in site {site}'s quota: {held} of {quota} bytes held, {} free", quota - held)
                } else {
                    format!("site {site} is at its quota ({held} of {quota} bytes held)")
                },
            ));
        }
        *used = used.saturating_add_signed(size);
        Ok(())
    }

    /// Relays sharing a bucket each count their own uploads: the site's figure is taken again
    /// from the bucket when it is older than [`RECOUNT_AFTER`], so what the others stored or
    /// freed counts too (uploads under way in this relay meanwhile are counted once written).
    fn recount_if_shared(&self, site: &str) -> Result<()> {
        if !self.backend.shared() {
            return Ok(());
        }
        let due = {
            let mut counted = self.counted.lock();
            let last = counted.get(site).copied();
            let due = last.is_none_or(|at| at.elapsed() >= RECOUNT_AFTER);
            if due {
                counted.insert(site.to_string(), std::time::Instant::now());
            }
            due
        };
        if due {
            self.count_usage(site)?;
        }
        Ok(())
    }

    /// Sets the site's figure for the quota to the bytes its objects hold in the store.
    fn count_usage(&self, site: &str) -> Result<()> {
        let held = self
            .backend
            .list(&format!("{}/objects", site_key(site)), "usage")?;
        let bytes = held.iter().map(|e| e.size).sum();
        self.usage.lock().insert(site.to_string(), bytes);
        Ok(())
    }

    /// A full store is worth waiting for only while the core has sealed batches to pull of
    /// `sites` (`*` for all): pulling them frees space. Otherwise nothing will, and the sender
    /// must be told at once what to do.
    fn no_room_unless_waiting(&self, sites: &[String], why: String) -> StoreError {
        if !self.ready(sites, false).is_empty() {
            return StoreError::Full(format!("{why}; retry after the core has pulled"));
        }
        StoreError::NoRoom(format!(
            "{why}, and nothing in it is waiting for the core: all of it belongs to batches not sealed yet, so no pull can free space. A batch larger than the relay's space can never be sealed there: raise the relay's --quota-per-site or its disk, cancel the batch (`forte send INBOX --cancel BATCH` at the edge, or `forte relay-store cancel` at the relay), or split it into smaller batches"
        ))
    }

    pub fn status(&self, site: &str, id: ObjectId) -> Result<ObjectStatus> {
        let (records, bodies) = self.names_of(site, id)?;
        // In a directory an object's emptied directories still count, as they always did.
        let what = "object status";
        let present = !records.is_empty()
            || !bodies.is_empty()
            || self.backend.any_under(&meta_key(site, id), what)?
            || self.backend.any_under(&object_key(site, id), what)?;
        self.status_among(site, id, &records, &bodies, present)?
            .ok_or_else(|| StoreError::NotFound(format!("object {id} is not at the relay")))
    }

    /// The status of each of `ids` the relay holds or delivered ([`Store::status`] of each).
    /// Many are answered from one listing of the site's records and one of its bodies: asked
    /// one by one, an object not at the relay cost a bucket three requests (its tombstone and
    /// two listings), and a new batch is asked about whole.
    pub fn statuses(
        &self,
        site: &str,
        ids: &[ObjectId],
    ) -> Result<HashMap<ObjectId, ObjectStatus>> {
        if ids.len() < STATUSES_LISTED_FROM {
            let each = ids
                .iter()
                .filter_map(|&id| Some((id, self.status(site, id).ok()?)));
            return Ok(each.collect());
        }
        let what = format!("status of objects of site {site}");
        let (records, bodies) = self.listed_by_object(site, &what)?;
        let names = |listed: Option<&Vec<Entry>>| -> Vec<String> {
            listed
                .into_iter()
                .flatten()
                .map(|e| e.name().to_string())
                .collect()
        };
        let mut found = HashMap::new();
        for &id in ids {
            let held_records = names(records.get(&id));
            let held_bodies: HashSet<String> = names(bodies.get(&id)).into_iter().collect();
            // Listings show keys only: an object whose directories a rejection emptied reads
            // as absent here, and as open with no parts alone; the edge sends it whole either way.
            let present = !held_records.is_empty() || !held_bodies.is_empty();
            let status = self.status_among(site, id, &held_records, &held_bodies, present)?;
            if let Some(status) = status {
                found.insert(id, status);
            }
        }
        Ok(found)
    }

    /// Seals object `id` of `batch`: its `parts` (in order, each held as listed) and its
    /// sealed `manifest`.
    pub fn seal(
        &self,
        site: &str,
        id: ObjectId,
        batch: &str,
        parts: &[PartRef],
        manifest: &[u8],
    ) -> Result<()> {
        self.lock_object(site, id)
            .hold(|| self.seal_held(site, id, batch, parts, manifest))
    }

    /// [`Store::seal`], the object's lock held.
    fn seal_held(
        &self,
        site: &str,
        id: ObjectId,
        batch: &str,
        parts: &[PartRef],
        manifest: &[u8],
    ) -> Result<()> {
        if self.is_acked(site, id)? {
            return Err(StoreError::Held(
                ObjectState::Delivered,
                format!("object {id} was already delivered"),
            ));
        }
        for (i, p) in parts.iter().enumerate() {
            if p.index as usize != i {
                return Err(StoreError::Invalid(format!(
                    "part list of object {id} is not in order at {i}"
                )));
            }
        }
        let held = self.held_parts(site, id)?;
        let missing: Vec<u32> = parts
            .iter()
            .filter(|p| !held.contains(p))
            .map(|p| p.index)
            .collect();
        if !missing.is_empty() {
            return Err(StoreError::Conflict(format!(
                "object {id} cannot be sealed: parts {missing:?} are missing or differ"
            )));
        }
        self.write_seal(site, id, batch, parts, manifest)
    }

    /// Keeps a one-part object's part, `upload`, and seals it into `batch` with its sealed
    /// `manifest`. The part just stored is the whole list: nothing is read back.
    pub fn put_whole(
        &self,
        upload: PartUpload<'_>,
        batch: &str,
        manifest: &[u8],
    ) -> Result<Stored> {
        let (site, id) = (upload.object().0.to_string(), upload.object().1);
        self.lock_object(&site, id).hold(|| {
            let parts = [upload.part_ref()];
            let stored = upload.finish_held()?;
            self.write_seal(&site, id, batch, &parts, manifest)?;
            Ok(stored)
        })
    }

    /// Writes the manifest and sealed record of an object whose `parts` are held.
    fn write_seal(
        &self,
        site: &str,
        id: ObjectId,
        batch: &str,
        parts: &[PartRef],
        manifest: &[u8],
    ) -> Result<()> {
        let what = format!("manifest of object {id}");
        let manifest_key = format!("{}/{MANIFEST_FILE}", object_key(site, id));
        self.backend.put(&manifest_key, manifest, &what)?;
        self.add_usage(site, manifest.len() as i64);
        let ready = ReadyObject {
            site: site.to_string(),
            id,
            batch: batch.to_string(),
            parts: parts.to_vec(),
            sealed_at: now(),
            batch_sealed: false,
        };
        let record = serde_json::to_vec(&ready).expect("serialises");
        self.backend.put(&sealed_key(site, id), &record, &what)
    }

    /// Declares a batch complete: every listed object must be sealed or already delivered.
    pub fn seal_batch(
        &self,
        site: &str,
        batch: &str,
        objects: &[ObjectId],
        inventory: Option<&[u8]>,
    ) -> Result<()> {
        let missing = self.unsealed(site, objects);
        if !missing.is_empty() {
            let missing: Vec<String> = missing.iter().map(ToString::to_string).collect();
            return Err(StoreError::Conflict(format!(
                "batch {batch} cannot be sealed: objects {missing:?} are not sealed"
            )));
        }
        self.write_batch_seal(site, batch, objects, inventory)
    }

    /// Declares complete a batch whose `objects` were all found sealed or delivered
    /// ([`Store::unsealed`] found none missing). The sealed inventory, opaque to the relay, is
    /// stored before the batch record, so a sealed batch offered to the core always has the
    /// inventory it was sealed with.
    pub fn write_batch_seal(
        &self,
        site: &str,
        batch: &str,
        objects: &[ObjectId],
        inventory: Option<&[u8]>,
    ) -> Result<()> {
        // A seal retried after the core took the batch (its answer lost): nothing to offer,
        // and no record to leave behind.
        let mut delivered = true;
        for id in objects {
            delivered &= self.is_acked(site, *id)?;
            if !delivered {
                break;
            }
        }
        if delivered && !objects.is_empty() {
            return Ok(());
        }
        let what = format!("batch {batch}");
        let inventory_at = inventory_key(site, batch);
        match inventory {
            Some(sealed) => self.backend.put(&inventory_at, sealed, &what)?,
            None => self.backend.delete(&inventory_at, &what)?,
        }
        let record = serde_json::to_vec(objects).expect("serialises");
        self.backend.put(&batch_key(site, batch), &record, &what)
    }

    /// Those of `objects` neither sealed nor delivered (or that cannot be told now), looked
    /// at several at once.
    pub fn unsealed(&self, site: &str, objects: &[ObjectId]) -> Vec<ObjectId> {
        let missing = Mutex::new(Vec::new());
        let _ = at_once(objects, |id| {
            let sealed = matches!(self.is_sealed(site, id), Ok(true))
                || matches!(self.is_acked(site, id), Ok(true));
            if !sealed {
                missing.lock().push(id);
            }
            Ok(())
        });
        // In the batch's order, for messages.
        let missing: HashSet<ObjectId> = missing.into_inner().into_iter().collect();
        objects
            .iter()
            .filter(|id| missing.contains(id))
            .copied()
            .collect()
    }

    /// The sealed inventory of a sealed batch; `None` if it was sealed without one.
    pub fn read_inventory(&self, site: &str, batch: &str) -> Result<Option<Vec<u8>>> {
        if !self
            .backend
            .exists(&batch_key(site, batch), "batch record")?
        {
            return Err(StoreError::NotFound(format!(
                "batch {batch} of site {site} is not sealed"
            )));
        }
        self.backend.get(&inventory_key(site, batch), "inventory")
    }

    /// The sealed records of one site's objects, read once each (see `sealed_records`); an
    /// object delivered but put back (by whoever can write the store, replaying it) is garbage,
    /// and goes.
    fn sealed_objects(&self, site: &str) -> Vec<ReadyObject> {
        let listed = match self
            .backend
            .list(&format!("{}/meta", site_key(site)), "listing")
        {
            Ok(listed) => listed,
            Err(e) => {
                tracing::error!("cannot list the objects of site {site}: {e:?}");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for entry in listed.iter().filter(|e| e.name() == SEALED_RECORD) {
            let known = self.sealed_records.lock().get(&entry.key).cloned();
            let object = match (known, &entry.version) {
                (Some((version, o)), Some(listed)) if version == *listed => o,
                _ => {
                    let read = self.backend.get(&entry.key, "sealed record").ok().flatten();
                    let Some(o) = read.and_then(|b| serde_json::from_slice::<ReadyObject>(&b).ok())
                    else {
                        continue;
                    };
                    if matches!(self.is_acked(&o.site, o.id), Ok(true)) {
                        let _ = self.remove_object(
                            &o.site,
                            o.id,
                            "removal of a delivered object put back",
                        );
                        continue;
                    }
                    if let Some(version) = &entry.version {
                        let mut records = self.sealed_records.lock();
                        records.insert(entry.key.clone(), (version.clone(), o.clone()));
                    }
                    o
                }
            };
            out.push(object);
        }
        // Records gone from the listing are forgotten: one put back later is read again, and
        // checked against the tombstones.
        let site_prefix = format!("{}/", site_key(site));
        let listed_keys: HashSet<&str> = listed.iter().map(|e| e.key.as_str()).collect();
        self.sealed_records
            .lock()
            .retain(|key, _| !key.starts_with(&site_prefix) || listed_keys.contains(key.as_str()));
        out
    }

    /// Objects of sealed batches of the given sites, oldest first; with `open`, also the
    /// sealed objects of batches not sealed yet.
    pub fn ready(&self, sites: &[String], open: bool) -> Vec<ReadyObject> {
        let all_sites: Vec<String> = if sites.iter().any(|s| s == "*") {
            self.sites().unwrap_or_default()
        } else {
            sites.to_vec()
        };
        // Each batch record read once per listing, not once per object.
        let mut batches: HashMap<(String, String), Option<Vec<ObjectId>>> = HashMap::new();
        // Objects of a batch being acknowledged are gone from the listing all at once.
        let leaving: HashSet<(String, ObjectId)> = all_sites
            .iter()
            .flat_map(|site| {
                self.acking(site)
                    .into_iter()
                    .flat_map(|(_, ids)| ids)
                    .map(|id| (site.clone(), id))
            })
            .collect();
        let mut ready: Vec<ReadyObject> = all_sites
            .iter()
            .flat_map(|site| self.sealed_objects(site))
            .filter(|o| !leaving.contains(&(o.site.clone(), o.id)))
            .filter_map(|mut o| {
                let members = batches
                    .entry((o.site.clone(), o.batch.clone()))
                    .or_insert_with(|| {
                        self.backend
                            .get(&batch_key(&o.site, &o.batch), "batch record")
                            .ok()
                            .flatten()
                            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
                    });
                o.batch_sealed = members.as_ref().is_some_and(|ids| ids.contains(&o.id));
                (o.batch_sealed || open).then_some(o)
            })
            .collect();
        ready.sort_by(|a, b| (a.sealed_at, &a.batch, a.id).cmp(&(b.sealed_at, &b.batch, b.id)));
        ready
    }

    /// An object's sealed manifest, written when the object was sealed. It is not checked
    /// that the object is still sealed (a bucket request more per object pulled): the core
    /// asks only for objects listed as sealed, and a manifest outliving its seal (a part
    /// rejected since, a seal interrupted) is the edge's signed manifest all the same, which
    /// the core verifies; the parts it names are what is missing then.
    pub fn read_manifest(&self, site: &str, id: ObjectId) -> Result<Vec<u8>> {
        let manifest_key = format!("{}/{MANIFEST_FILE}", object_key(site, id));
        self.backend.get(&manifest_key, "manifest")?.ok_or_else(|| {
            StoreError::NotFound(format!("object {id} of site {site} is not complete"))
        })
    }

    /// Part `index` of an object, to be read as a stream, and its length.
    pub fn open_part(&self, site: &str, id: ObjectId, index: u32) -> Result<Reader> {
        let key = part_key(site, id, index);
        self.backend.open(&key, "part")?.ok_or_else(|| {
            StoreError::NotFound(format!("part {index} of object {id} is not at the relay"))
        })
    }

    /// Deletes an object's data and records; returns the bytes freed.
    fn remove_object(&self, site: &str, id: ObjectId, what: &str) -> Result<u64> {
        self.remove_objects(site, &[id], what)
    }

    /// Deletes the data and records of objects `ids`, all in one deletion; returns the bytes
    /// of data freed.
    fn remove_objects(&self, site: &str, ids: &[ObjectId], what: &str) -> Result<u64> {
        let prefixes: Vec<String> = ids
            .iter()
            .flat_map(|&id| [object_key(site, id), meta_key(site, id)])
            .collect();
        let removed = self.backend.delete_under(&prefixes, what)?;
        let data = format!("{}/objects/", site_key(site));
        let freed: u64 = removed
            .iter()
            .filter(|e| e.key.starts_with(&data))
            .map(|e| e.size)
            .sum();
        let mut sealed_records = self.sealed_records.lock();
        for &id in ids {
            sealed_records.remove(&sealed_key(site, id));
        }
        drop(sealed_records);
        self.add_usage(site, -(freed as i64));
        Ok(freed)
    }

    /// Sites with anything stored.
    fn sites(&self) -> Result<Vec<String>> {
        let mut sites = self.backend.children("sites", "listing of sites")?;
        sites.sort();
        Ok(sites)
    }

    /// The objects of one site not delivered yet.
    fn held_objects(&self, site: &str) -> Result<Vec<HeldObject>> {
        let what = format!("objects of site {site}");
        let (records, bodies) = self.listed_by_object(site, &what)?;
        let mut held = Vec::new();
        for (id, records) in records {
            let mut o = HeldObject {
                id,
                batch: None,
                bytes: 0,
                changed: 0,
            };
            for e in records {
                o.changed = o.changed.max(e.modified);
                if e.name() == SEALED_RECORD {
                    o.batch = self
                        .backend
                        .get(&e.key, &what)?
                        .and_then(|b| serde_json::from_slice::<ReadyObject>(&b).ok())
                        .map(|r| r.batch);
                }
            }
            // Its records say when it last changed: each part's is written with the part.
            o.bytes = bodies.get(&id).into_iter().flatten().map(|e| e.size).sum();
            held.push(o);
        }
        Ok(held)
    }

    /// What the relay holds, per site and batch, for operators (`forte relay-store list`).
    pub fn holdings(&self) -> Result<Vec<Holding>> {
        let mut out: Vec<Holding> = Vec::new();
        for site in self.sites()? {
            for o in self.held_objects(&site)? {
                let sealed = match &o.batch {
                    Some(b) => self.backend.exists(&batch_key(&site, b), "batch record")?,
                    None => false,
                };
                let key = (site.clone(), o.batch.clone());
                match out
                    .iter_mut()
                    .find(|h| (h.site.clone(), h.batch.clone()) == key)
                {
                    Some(h) => {
                        h.objects += 1;
                        h.bytes += o.bytes;
                        h.oldest = h.oldest.min(o.changed);
                        h.newest = h.newest.max(o.changed);
                    }
                    None => out.push(Holding {
                        site: site.clone(),
                        batch: o.batch,
                        batch_sealed: sealed,
                        objects: 1,
                        bytes: o.bytes,
                        oldest: o.changed,
                        newest: o.changed,
                    }),
                }
            }
        }
        out.sort_by(|a, b| (&a.site, &a.batch).cmp(&(&b.site, &b.batch)));
        Ok(out)
    }

    /// Cancels a batch at the relay: deletes those of `ids` (open or sealed, not delivered),
    /// and the batch's seal and inventory, so the core never gets it. What was delivered
    /// stays delivered. Returns the objects and bytes removed.
    pub fn cancel(&self, site: &str, batch: &str, ids: &[ObjectId]) -> Result<(usize, u64)> {
        let what = format!("cancellation of batch {batch}");
        for key in [batch_key(site, batch), inventory_key(site, batch)] {
            self.backend.delete(&key, &what)?;
        }
        let (mut objects, mut bytes) = (0, 0);
        for id in ids {
            if self.is_acked(site, *id)? {
                continue;
            }
            if self.backend.any_under(&meta_key(site, *id), &what)?
                || self.backend.any_under(&object_key(site, *id), &what)?
            {
                bytes += self.remove_object(site, *id, &what)?;
                objects += 1;
            }
        }
        Ok((objects, bytes))
    }

    /// Cancels a batch by the relay's batch id alone (`forte relay-store cancel`): every
    /// object sealed into it. Open objects carry no batch yet; they expire
    /// ([`Store::expire_open`]) or are cancelled by the edge, which knows their ids.
    pub fn cancel_sealed(&self, site: &str, batch: &str) -> Result<(usize, u64)> {
        let ids: Vec<ObjectId> = self
            .held_objects(site)?
            .into_iter()
            .filter(|o| o.batch.as_deref() == Some(batch))
            .map(|o| o.id)
            .collect();
        self.cancel(site, batch, &ids)
    }

    /// Deletes open objects (never sealed) unchanged for `older_than`: uploads an edge
    /// abandoned. Returns the objects and bytes removed.
    pub fn expire_open(&self, older_than: std::time::Duration) -> Result<(usize, u64)> {
        let cutoff = now().saturating_sub(older_than.as_secs());
        let (mut objects, mut bytes) = (0, 0);
        for site in self.sites()? {
            for o in self.held_objects(&site)? {
                if o.batch.is_none() && o.changed < cutoff {
                    bytes += self.remove_object(&site, o.id, "expiry of an abandoned upload")?;
                    objects += 1;
                }
            }
        }
        Ok((objects, bytes))
    }

    /// Batch acknowledgements under way at one site: batch id → its objects.
    fn acking(&self, site: &str) -> Vec<(String, Vec<ObjectId>)> {
        let under = format!("{}/batches", site_key(site));
        self.backend
            .children(&under, "acknowledgements")
            .unwrap_or_default()
            .into_iter()
            .filter_map(|name| {
                let batch = name.strip_suffix(".acking.json")?.to_string();
                let bytes = self
                    .backend
                    .get(&format!("{under}/{name}"), "acknowledgement")
                    .ok()??;
                Some((batch, serde_json::from_slice(&bytes).ok()?))
            })
            .collect()
    }

    /// Delivery of a whole batch acknowledged: its objects are recorded first, so that none
    /// of them is listed any more even if the relay stops half-way; then each gets a tombstone
    /// (create-only: kept so the edge can learn what was delivered, and written once however
    /// many relays acknowledge) and their data and records are deleted together. Idempotent.
    pub fn ack_batch(
        &self,
        site: &str,
        batch: &str,
        ids: &[ObjectId],
        receipt: Option<&[u8]>,
    ) -> Result<()> {
        let unknown = Mutex::new(Vec::new());
        at_once(ids, |id| {
            // Sealed, or acknowledged before (by this relay or another, whose deletion may
            // not have finished).
            if !self.is_sealed(site, id)? && !self.is_acked(site, id)? {
                unknown.lock().push(id.to_string());
            }
            Ok(())
        })?;
        let unknown = unknown.into_inner();
        if !unknown.is_empty() {
            return Err(StoreError::NotFound(format!(
                "batch {batch} of site {site}: objects {unknown:?} are not complete"
            )));
        }
        let what = format!("acknowledgement of batch {batch}");
        // The receipt is kept before anything is deleted: an edge must never find its batch
        // gone and no receipt for it.
        if let Some(receipt) = receipt {
            self.keep_receipt(site, batch, receipt, &what)?;
        }
        let record = acking_key(site, batch);
        let ids_json = serde_json::to_vec(ids).expect("serialises");
        self.backend.put(&record, &ids_json, &what)?;
        at_once(ids, |id| {
            let stamp = now().to_string();
            self.backend
                .put_new(&acked_key(site, id), stamp.as_bytes(), &what)
                .map(drop)
        })?;
        self.remove_objects(site, ids, &what)?;
        // The batch is delivered: its seal and inventory go with its objects (the tombstones
        // stay, for the edge to learn what was delivered).
        for key in [batch_key(site, batch), inventory_key(site, batch)] {
            self.backend.delete(&key, &what)?;
        }
        self.backend.delete(&record, &what)
    }

    fn keep_receipt(&self, site: &str, batch: &str, receipt: &[u8], what: &str) -> Result<()> {
        if receipt.len() > MAX_RECEIPT_BYTES {
            return Err(StoreError::Invalid(format!(
                "a receipt of {} bytes is larger than {MAX_RECEIPT_BYTES}",
                receipt.len()
            )));
        }
        let dir = receipts_key(site, batch);
        let name = format!("{dir}/{}.json", hex::encode(Sha256::digest(receipt)));
        if self.backend.list(&dir, what)?.len() >= MAX_RECEIPTS_PER_BATCH
            && !self.backend.exists(&name, what)?
        {
            return Err(StoreError::Invalid(format!(
                "batch {batch} of site {site} holds {MAX_RECEIPTS_PER_BATCH} receipts already"
            )));
        }
        self.backend.put(&name, receipt, what)
    }

    /// The receipts kept for one of a site's batches, as the core gave them (unverified: the
    /// edge checks each with the core's key).
    pub fn receipts(&self, site: &str, batch: &str) -> Result<Vec<Vec<u8>>> {
        let what = "receipts";
        let mut receipts = Vec::new();
        for entry in self.backend.list(&receipts_key(site, batch), what)? {
            if let Some(bytes) = self.backend.get(&entry.key, what)? {
                receipts.push(bytes);
            }
        }
        Ok(receipts)
    }

    /// A damaged manifest reported by the core: drop it and reopen the object, so the edge
    /// seals it again (its parts stay; the edge sends only the manifest).
    pub fn reject_manifest(&self, site: &str, id: ObjectId) -> Result<()> {
        let what = "rejected manifest";
        let manifest = format!("{}/{MANIFEST_FILE}", object_key(site, id));
        let length = self
            .backend
            .list(&object_key(site, id), what)?
            .iter()
            .find(|e| e.key == manifest)
            .map_or(0, |e| e.size);
        for key in [sealed_key(site, id), manifest] {
            self.backend.delete(&key, what)?;
        }
        self.sealed_records.lock().remove(&sealed_key(site, id));
        self.add_usage(site, -(length as i64));
        Ok(())
    }

    /// A damaged part reported by the core: drop it and reopen the object, so the edge
    /// uploads the part again and re-seals.
    pub fn reject(&self, site: &str, id: ObjectId, index: u32) -> Result<()> {
        let what = "rejected part";
        let part = part_key(site, id, index);
        let length = self
            .backend
            .list(&object_key(site, id), what)?
            .iter()
            .find(|e| e.key == part)
            .map_or(0, |e| e.size);
        let record = record_key(site, id, index);
        for key in [sealed_key(site, id), record, part] {
            self.backend.delete(&key, what)?;
        }
        self.sealed_records.lock().remove(&sealed_key(site, id));
        self.add_usage(site, -(length as i64));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

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
        // Each object's sealed record looked at and its tombstone written; the acknowledgement
        // record written, all the objects deleted at once, then the batch's three records.
        let ack = [
            ("delete", 3),
            ("delete_under", 1),
            ("exists", 10),
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
