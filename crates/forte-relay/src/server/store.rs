//! The relay's disk: ciphertext objects in the pack layout, plus the relay's own small records.
//!
//! ```text
//! STORE/sites/<site>/objects/<id>/manifest.age, part-NNNNNN.zst.age   (as `forte pack` writes)
//! STORE/sites/<site>/meta/<id>/part-NNNNNN.sha256   "<sha256> <length>": the part is held
//! STORE/sites/<site>/meta/<id>/sealed.json          the object is complete (a ReadyObject)
//! STORE/sites/<site>/batches/<batch>.json           the batch is sealed: its object ids
//! STORE/sites/<site>/batches/<batch>.inventory.age  its sealed inventory, for the core
//! STORE/sites/<site>/batches/<batch>.acking.json    objects being acknowledged together
//! STORE/sites/<site>/acked/<id>                     the core acknowledged delivery
//! STORE/sites/<site>/tmp/                           bodies being written
//! ```
//!
//! Every write goes to `tmp/` and is renamed into place; then the file system is flushed with a
//! group commit (one `syncfs` shared by all uploads waiting at that moment) before the relay
//! answers. A part's record is written before the part, and a part counts as held only when
//! both exist. A crash before the flush may leave a record or part that is not what it claims:
//! the edge was not answered, retries, and the relay re-hashes a held part before trusting it
//! on a retry; whatever slipped through is caught by the core's ciphertext check.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use forte_format::{part_file_name, ObjectId, MANIFEST_FILE};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use crate::api::{ObjectState, ObjectStatus, PartRef, ReadyObject};

/// Why a store operation was refused.
#[derive(Debug)]
pub enum StoreError {
    NotFound(String),
    /// The request contradicts what is stored (missing parts at seal, delivered object).
    Conflict(String),
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

pub struct Store {
    root: PathBuf,
    group_sync: forte_fs::GroupSync,
    quota: Option<u64>,
    /// Bytes held per site, for the quota; rebuilt from disk at start.
    usage: Mutex<HashMap<String, u64>>,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn record_name(index: u32) -> String {
    format!("part-{index:06}.sha256")
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}

impl Store {
    /// The store at `root` as it is, for reading and for operators' commands, without the
    /// clean-up a serving relay does at start (which would disturb one running on it).
    pub fn inspect(root: &Path) -> anyhow::Result<Self> {
        anyhow::ensure!(
            root.join("sites").is_dir(),
            "{} is not a relay store (it has no sites/ directory): give the directory `forte relay --store` uses",
            root.display()
        );
        Ok(Self {
            root: root.to_path_buf(),
            group_sync: forte_fs::GroupSync::new(root),
            quota: None,
            usage: Mutex::default(),
        })
    }

    pub fn open(root: &Path, quota: Option<u64>) -> anyhow::Result<Self> {
        let sites = root.join("sites");
        std::fs::create_dir_all(&sites)
            .map_err(|e| anyhow::anyhow!("cannot create relay store {}: {e}", sites.display()))?;
        let mut usage = HashMap::new();
        let mut site_names = Vec::new();
        for entry in std::fs::read_dir(&sites)?.flatten() {
            let site = entry.file_name().to_string_lossy().into_owned();
            usage.insert(site.clone(), dir_bytes(&entry.path().join("objects")));
            let _ = std::fs::remove_dir_all(entry.path().join("tmp"));
            site_names.push(site);
        }
        let store = Self {
            root: root.to_path_buf(),
            group_sync: forte_fs::GroupSync::new(root),
            quota,
            usage: Mutex::new(usage),
        };
        // Batch acknowledgements a stop interrupted are finished before anything is served.
        for site in &site_names {
            for (batch, ids) in store.acking(site) {
                store.ack_batch(site, &batch, &ids).map_err(|e| {
                    anyhow::anyhow!(
                        "cannot finish acknowledging batch {batch} of site {site}: {e:?}"
                    )
                })?;
            }
        }
        Ok(store)
    }

    fn site(&self, site: &str) -> PathBuf {
        self.root.join("sites").join(site)
    }

    fn object_dir(&self, site: &str, id: ObjectId) -> PathBuf {
        self.site(site).join("objects").join(id.to_string())
    }

    fn meta_dir(&self, site: &str, id: ObjectId) -> PathBuf {
        self.site(site).join("meta").join(id.to_string())
    }

    fn acked(&self, site: &str, id: ObjectId) -> PathBuf {
        self.site(site).join("acked").join(id.to_string())
    }

    /// Writes `bytes` durably at `target`: temp file in the site's tmp/, fsync, rename, fsync
    /// of the target directory.
    fn write_durably(&self, site: &str, target: &Path, bytes: &[u8], what: &str) -> Result<()> {
        let tmp_dir = self.site(site).join("tmp");
        let dir = target.parent().expect("targets live in a directory");
        for d in [&tmp_dir, &dir.to_path_buf()] {
            std::fs::create_dir_all(d).map_err(|e| StoreError::io(what, d, e))?;
        }
        let mut suffix = [0u8; 8];
        getrandom::getrandom(&mut suffix).map_err(|e| StoreError::Io(e.to_string()))?;
        let tmp = tmp_dir.join(hex::encode(suffix));
        let written = forte_fs::create_with(&tmp, bytes);
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(StoreError::io(what, &tmp, e));
        }
        std::fs::rename(&tmp, target).map_err(|e| StoreError::io(what, target, e))?;
        // One flush of the file system covers the data and both directory entries, shared
        // with every other upload waiting at the same moment.
        self.group_sync
            .sync()
            .map_err(|e| StoreError::Io(format!("{what}: cannot flush to disk: {e:#}")))
    }

    /// The parts of an object the relay holds: record and file both present.
    fn held_parts(&self, site: &str, id: ObjectId) -> Vec<PartRef> {
        let meta = self.meta_dir(site, id);
        let objects = self.object_dir(site, id);
        let mut parts: Vec<PartRef> = std::fs::read_dir(&meta)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let index: u32 = name
                    .strip_prefix("part-")?
                    .strip_suffix(".sha256")?
                    .parse()
                    .ok()?;
                let text = std::fs::read_to_string(e.path()).ok()?;
                let (sha256, length) = text.trim().split_once(' ')?;
                let length = length.parse().ok()?;
                objects
                    .join(part_file_name(index))
                    .exists()
                    .then(|| PartRef {
                        index,
                        sha256: sha256.to_string(),
                        length,
                    })
            })
            .collect();
        parts.sort_by_key(|p| p.index);
        parts
    }

    fn add_usage(&self, site: &str, delta: i64) {
        let mut usage = self.usage.lock();
        let used = usage.entry(site.to_string()).or_default();
        *used = used.saturating_add_signed(delta);
    }

    pub fn put_part(
        &self,
        site: &str,
        id: ObjectId,
        index: u32,
        sha256: &str,
        body: &[u8],
    ) -> Result<Stored> {
        if self.acked(site, id).exists() {
            return Err(StoreError::Conflict(format!(
                "object {id} was already delivered"
            )));
        }
        let previous = self
            .held_parts(site, id)
            .into_iter()
            .find(|p| p.index == index);
        if let Some(p) = &previous {
            // A crash between rename and flush can leave a record whose part is not what it
            // says: trust a held part only after hashing it again (this happens on retries).
            let path = self.object_dir(site, id).join(part_file_name(index));
            let intact = std::fs::read(&path)
                .is_ok_and(|held| hex::encode(Sha256::digest(&held)) == p.sha256);
            if p.sha256 == sha256 && p.length == body.len() as u64 && intact {
                self.group_sync.sync().map_err(|e| {
                    StoreError::Io(format!("part {index} of object {id}: cannot flush: {e:#}"))
                })?;
                return Ok(Stored::AlreadyHeld);
            }
        }
        let found = hex::encode(Sha256::digest(body));
        if found != sha256 {
            return Err(StoreError::Invalid(format!(
                "part {index} of object {id}: ciphertext SHA-256 mismatch (header {sha256}, body {found}); nothing stored"
            )));
        }
        // A part that replaces a held one (a torn part, or new bytes) counts only the
        // difference, in the check as in the charge.
        let size = body.len() as i64 - previous.as_ref().map_or(0, |p| p.length as i64);
        self.charge(site, size)?;
        let what = format!("part {index} of object {id}");
        let stored = self
            .write_durably(
                site,
                &self.meta_dir(site, id).join(record_name(index)),
                format!("{sha256} {}\n", body.len()).as_bytes(),
                &what,
            )
            .and_then(|()| {
                self.write_durably(
                    site,
                    &self.object_dir(site, id).join(part_file_name(index)),
                    body,
                    &what,
                )
            });
        if stored.is_err() {
            self.add_usage(site, -size);
        }
        if let Err(StoreError::Full(why)) = stored {
            return Err(self.no_room_unless_waiting(&["*".to_string()], why));
        }
        stored?;
        Ok(Stored::New)
    }

    /// Counts `size` more bytes against the site before they are written, under one lock, so
    /// uploads arriving together cannot all pass the quota check on the same figure.
    fn charge(&self, site: &str, size: i64) -> Result<()> {
        let Some(quota) = self.quota else {
            self.add_usage(site, size);
            return Ok(());
        };
        let mut usage = self.usage.lock();
        let used = usage.entry(site.to_string()).or_default();
        if used.saturating_add_signed(size) > quota {
            let held = *used;
            drop(usage);
            return Err(self.no_room_unless_waiting(
                &[site.to_string()],
                format!("site {site} is at its quota ({held} of {quota} bytes held)"),
            ));
        }
        *used = used.saturating_add_signed(size);
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
        if self.acked(site, id).exists() {
            return Ok(ObjectStatus {
                state: ObjectState::Delivered,
                parts: vec![],
            });
        }
        if !self.meta_dir(site, id).exists() {
            return Err(StoreError::NotFound(format!(
                "object {id} is not at the relay"
            )));
        }
        let state = if self.meta_dir(site, id).join("sealed.json").exists() {
            ObjectState::Complete
        } else {
            ObjectState::Open
        };
        Ok(ObjectStatus {
            state,
            parts: self.held_parts(site, id),
        })
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
        if self.acked(site, id).exists() {
            return Err(StoreError::Conflict(format!(
                "object {id} was already delivered"
            )));
        }
        for (i, p) in parts.iter().enumerate() {
            if p.index as usize != i {
                return Err(StoreError::Invalid(format!(
                    "part list of object {id} is not in order at {i}"
                )));
            }
        }
        let held = self.held_parts(site, id);
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
        let what = format!("manifest of object {id}");
        self.write_durably(
            site,
            &self.object_dir(site, id).join(MANIFEST_FILE),
            manifest,
            &what,
        )?;
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
        self.write_durably(
            site,
            &self.meta_dir(site, id).join("sealed.json"),
            &record,
            &what,
        )
    }

    fn batch_record(&self, site: &str, batch: &str) -> PathBuf {
        self.site(site)
            .join("batches")
            .join(format!("{batch}.json"))
    }

    fn inventory_record(&self, site: &str, batch: &str) -> PathBuf {
        self.site(site)
            .join("batches")
            .join(format!("{batch}.inventory.age"))
    }

    /// Declares a batch complete: every listed object must be sealed or already delivered.
    /// The sealed inventory, opaque to the relay, is stored before the batch record, so a
    /// sealed batch offered to the core always has the inventory it was sealed with.
    pub fn seal_batch(
        &self,
        site: &str,
        batch: &str,
        objects: &[ObjectId],
        inventory: Option<&[u8]>,
    ) -> Result<()> {
        let missing = self.unsealed(site, objects);
        if !missing.is_empty() {
            return Err(StoreError::Conflict(format!(
                "batch {batch} cannot be sealed: objects {missing:?} are not sealed"
            )));
        }
        let what = format!("batch {batch}");
        let inventory_path = self.inventory_record(site, batch);
        match inventory {
            Some(sealed) => self.write_durably(site, &inventory_path, sealed, &what)?,
            None => match std::fs::remove_file(&inventory_path) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io(&what, &inventory_path, e)),
            },
        }
        let record = serde_json::to_vec(objects).expect("serialises");
        self.write_durably(site, &self.batch_record(site, batch), &record, &what)
    }

    /// Those of `objects` neither sealed nor delivered.
    pub fn unsealed(&self, site: &str, objects: &[ObjectId]) -> Vec<String> {
        objects
            .iter()
            .filter(|id| {
                !self.meta_dir(site, **id).join("sealed.json").exists()
                    && !self.acked(site, **id).exists()
            })
            .map(ToString::to_string)
            .collect()
    }

    /// The sealed inventory of a sealed batch; `None` if it was sealed without one.
    pub fn read_inventory(&self, site: &str, batch: &str) -> Result<Option<Vec<u8>>> {
        if !self.batch_record(site, batch).exists() {
            return Err(StoreError::NotFound(format!(
                "batch {batch} of site {site} is not sealed"
            )));
        }
        let path = self.inventory_record(site, batch);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::io("inventory", &path, e)),
        }
    }

    /// Objects of sealed batches of the given sites, oldest first; with `open`, also the
    /// sealed objects of batches not sealed yet.
    pub fn ready(&self, sites: &[String], open: bool) -> Vec<ReadyObject> {
        let all_sites: Vec<String> = if sites.iter().any(|s| s == "*") {
            std::fs::read_dir(self.root.join("sites"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        } else {
            sites.to_vec()
        };
        // Each batch record read once per listing, not once per object.
        let mut batches: HashMap<(String, String), Option<Vec<ObjectId>>> = HashMap::new();
        // Objects of a batch being acknowledged are gone from the listing all at once.
        let leaving: std::collections::HashSet<(String, ObjectId)> = all_sites
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
            .flat_map(|site| {
                std::fs::read_dir(self.site(site).join("meta"))
                    .into_iter()
                    .flatten()
                    .flatten()
            })
            .filter_map(|e| std::fs::read(e.path().join("sealed.json")).ok())
            .filter_map(|bytes| serde_json::from_slice::<ReadyObject>(&bytes).ok())
            // A delivered object is never offered again: if its data reappears (put back by
            // whoever can write the store, replaying it), it is garbage, and goes.
            .filter(|o| {
                let delivered = self.acked(&o.site, o.id).exists();
                if delivered {
                    let _ =
                        self.remove_object(&o.site, o.id, "removal of a delivered object put back");
                }
                !delivered
            })
            .filter(|o| !leaving.contains(&(o.site.clone(), o.id)))
            .filter_map(|mut o| {
                let members = batches
                    .entry((o.site.clone(), o.batch.clone()))
                    .or_insert_with(|| {
                        std::fs::read(self.batch_record(&o.site, &o.batch))
                            .ok()
                            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
                    });
                o.batch_sealed = members.as_ref().is_some_and(|ids| ids.contains(&o.id));
                (o.batch_sealed || open).then_some(o)
            })
            .collect();
        ready.sort_by(|a, b| (a.sealed_at, &a.batch, a.id).cmp(&(b.sealed_at, &b.batch, b.id)));
        ready
    }

    pub fn read_manifest(&self, site: &str, id: ObjectId) -> Result<Vec<u8>> {
        if !self.meta_dir(site, id).join("sealed.json").exists() {
            return Err(StoreError::NotFound(format!(
                "object {id} of site {site} is not complete"
            )));
        }
        let path = self.object_dir(site, id).join(MANIFEST_FILE);
        std::fs::read(&path).map_err(|e| StoreError::io("manifest", &path, e))
    }

    pub fn read_part(&self, site: &str, id: ObjectId, index: u32) -> Result<Vec<u8>> {
        let path = self.object_dir(site, id).join(part_file_name(index));
        std::fs::read(&path).map_err(|e| match e.kind() {
            ErrorKind::NotFound => {
                StoreError::NotFound(format!("part {index} of object {id} is not at the relay"))
            }
            _ => StoreError::io("part", &path, e),
        })
    }

    /// Delivery acknowledged: delete the object, keep a tombstone so the edge can learn it.
    /// Only through [`Store::ack_batch`], so a batch never loses some of its objects.
    fn ack(&self, site: &str, id: ObjectId) -> Result<()> {
        if self.acked(site, id).exists() {
            return Ok(());
        }
        if !self.meta_dir(site, id).join("sealed.json").exists() {
            return Err(StoreError::NotFound(format!(
                "object {id} of site {site} is not complete"
            )));
        }
        let what = format!("acknowledgement of object {id}");
        self.write_durably(
            site,
            &self.acked(site, id),
            &now().to_string().into_bytes(),
            &what,
        )?;
        self.remove_object(site, id, &what).map(drop)
    }

    /// Deletes an object's data and records; returns the bytes freed.
    fn remove_object(&self, site: &str, id: ObjectId, what: &str) -> Result<u64> {
        let dir = self.object_dir(site, id);
        let freed = dir_bytes(&dir);
        for d in [dir, self.meta_dir(site, id)] {
            match std::fs::remove_dir_all(&d) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io(what, &d, e)),
            }
        }
        self.add_usage(site, -(freed as i64));
        Ok(freed)
    }

    /// Sites with anything stored.
    fn sites(&self) -> Vec<String> {
        let mut sites: Vec<String> = std::fs::read_dir(self.root.join("sites"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        sites.sort();
        sites
    }

    /// The objects of one site not delivered yet: id, the batch it was sealed into (`None`
    /// while open), bytes held, and when it last changed (seconds since the epoch).
    fn held_objects(&self, site: &str) -> Vec<(ObjectId, Option<String>, u64, u64)> {
        std::fs::read_dir(self.site(site).join("meta"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let id: ObjectId = e.file_name().to_str()?.parse().ok()?;
                let batch = std::fs::read(e.path().join("sealed.json"))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<ReadyObject>(&b).ok())
                    .map(|o| o.batch);
                let changed = std::fs::read_dir(e.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter_map(|f| f.metadata().ok()?.modified().ok())
                    .chain(e.metadata().ok().and_then(|m| m.modified().ok()))
                    .max()
                    .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_secs());
                Some((id, batch, dir_bytes(&self.object_dir(site, id)), changed))
            })
            .collect()
    }

    /// What the relay holds, per site and batch, for operators (`forte relay-store list`).
    pub fn holdings(&self) -> Vec<Holding> {
        let mut out: Vec<Holding> = Vec::new();
        for site in self.sites() {
            for (_, batch, bytes, changed) in self.held_objects(&site) {
                let sealed = batch
                    .as_ref()
                    .is_some_and(|b| self.batch_record(&site, b).exists());
                let key = (site.clone(), batch.clone());
                match out
                    .iter_mut()
                    .find(|h| (h.site.clone(), h.batch.clone()) == key)
                {
                    Some(h) => {
                        h.objects += 1;
                        h.bytes += bytes;
                        h.oldest = h.oldest.min(changed);
                        h.newest = h.newest.max(changed);
                    }
                    None => out.push(Holding {
                        site: site.clone(),
                        batch,
                        batch_sealed: sealed,
                        objects: 1,
                        bytes,
                        oldest: changed,
                        newest: changed,
                    }),
                }
            }
        }
        out.sort_by(|a, b| (&a.site, &a.batch).cmp(&(&b.site, &b.batch)));
        out
    }

    /// Cancels a batch at the relay: deletes those of `ids` (open or sealed, not delivered),
    /// and the batch's seal and inventory, so the core never gets it. What was delivered
    /// stays delivered. Returns the objects and bytes removed.
    pub fn cancel(&self, site: &str, batch: &str, ids: &[ObjectId]) -> Result<(usize, u64)> {
        let what = format!("cancellation of batch {batch}");
        for path in [
            self.batch_record(site, batch),
            self.inventory_record(site, batch),
        ] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io(&what, &path, e)),
            }
        }
        let (mut objects, mut bytes) = (0, 0);
        for id in ids.iter().filter(|id| !self.acked(site, **id).exists()) {
            if self.meta_dir(site, *id).exists() || self.object_dir(site, *id).exists() {
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
            .held_objects(site)
            .into_iter()
            .filter(|(_, b, _, _)| b.as_deref() == Some(batch))
            .map(|(id, ..)| id)
            .collect();
        self.cancel(site, batch, &ids)
    }

    /// Deletes open objects (never sealed) unchanged for `older_than`: uploads an edge
    /// abandoned. Returns the objects and bytes removed.
    pub fn expire_open(&self, older_than: std::time::Duration) -> Result<(usize, u64)> {
        let cutoff = now().saturating_sub(older_than.as_secs());
        let (mut objects, mut bytes) = (0, 0);
        for site in self.sites() {
            for (id, batch, _, changed) in self.held_objects(&site) {
                if batch.is_none() && changed < cutoff {
                    bytes += self.remove_object(&site, id, "expiry of an abandoned upload")?;
                    objects += 1;
                }
            }
        }
        Ok((objects, bytes))
    }

    fn acking_record(&self, site: &str, batch: &str) -> PathBuf {
        self.site(site)
            .join("batches")
            .join(format!("{batch}.acking.json"))
    }

    /// Batch acknowledgements under way at one site: batch id → its objects.
    fn acking(&self, site: &str) -> Vec<(String, Vec<ObjectId>)> {
        std::fs::read_dir(self.site(site).join("batches"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let batch = name.strip_suffix(".acking.json")?.to_string();
                let ids = serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()?;
                Some((batch, ids))
            })
            .collect()
    }

    /// Delivery of a whole batch acknowledged: its objects are recorded first, so that none
    /// of them is listed any more even if the relay stops half-way, then each is deleted
    /// (tombstones kept, as for [`Store::ack`]). Idempotent.
    pub fn ack_batch(&self, site: &str, batch: &str, ids: &[ObjectId]) -> Result<()> {
        let unknown: Vec<String> = ids
            .iter()
            .filter(|id| {
                !self.acked(site, **id).exists()
                    && !self.meta_dir(site, **id).join("sealed.json").exists()
            })
            .map(ToString::to_string)
            .collect();
        if !unknown.is_empty() {
            return Err(StoreError::NotFound(format!(
                "batch {batch} of site {site}: objects {unknown:?} are not complete"
            )));
        }
        let record = self.acking_record(site, batch);
        let what = format!("acknowledgement of batch {batch}");
        self.write_durably(
            site,
            &record,
            &serde_json::to_vec(ids).expect("serialises"),
            &what,
        )?;
        for id in ids {
            self.ack(site, *id)?;
        }
        std::fs::remove_file(&record).map_err(|e| StoreError::io(&what, &record, e))
    }

    /// A damaged part reported by the core: drop it and reopen the object, so the edge
    /// uploads the part again and re-seals.
    pub fn reject(&self, site: &str, id: ObjectId, index: u32) -> Result<()> {
        let meta = self.meta_dir(site, id);
        let part = self.object_dir(site, id).join(part_file_name(index));
        let length = std::fs::metadata(&part).map_or(0, |m| m.len());
        for path in [
            meta.join("sealed.json"),
            meta.join(record_name(index)),
            part,
        ] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io("rejected part", &path, e)),
            }
        }
        self.add_usage(site, -(length as i64));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
