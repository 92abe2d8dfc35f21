//! The sink of `forte send`: sealed parts and manifests go straight from the prepare pipeline to
//! the relay, over as many connections as the sink has workers. Nothing is spooled to disk.

use std::collections::{BTreeMap, HashMap};

use anyhow::Result;
use forte_catalog::{
    BatchKey, Catalog, FileRecord, FileState, PartHashes, PartRow, PartState, Task,
};
use forte_format::{Manifest, ObjectId};
use forte_prepare::{FileOutcome, HeldPart, Sink};
use forte_relay::api::{ObjectState, PartRef};
use forte_relay::client::{RelayClient, RelayError};
use parking_lot::Mutex;

use forte_daemon::record::note;
use forte_daemon::retry::{Operation, Retry};

pub struct UploadSink<'a> {
    pub client: &'a RelayClient,
    /// Each object's batch: the batch's catalogue key, whose id the relay groups objects by.
    /// Objects of several batches flow through one pass, so the link never idles between
    /// batches.
    pub batch_of: &'a Mutex<HashMap<ObjectId, BatchKey>>,
    pub retry: Retry,
    pub catalog: &'a Catalog,
    /// Sealed bytes uploaded so far, per object.
    pub sealed: Mutex<HashMap<ObjectId, u64>>,
    /// Told of every object whose last request (the one that seals it) is about to start.
    pub on_final: &'a (dyn Fn(&Manifest) + Sync),
    /// Told of every finished object (its files' outcomes) with its sealed bytes.
    pub on_done: &'a (dyn Fn(&[FileOutcome], u64) + Sync),
    /// Told of every object whose upload or seal the relay refused because it held the object
    /// already (sealed or delivered), before its outcome.
    pub on_held: &'a (dyn Fn(ObjectId) + Sync),
    /// Told of every part (its object and ciphertext SHA-256) before it is sent.
    pub on_sending: &'a (dyn Fn(ObjectId, &str) + Sync),
}

impl UploadSink<'_> {
    fn batch(&self, id: ObjectId) -> BatchKey {
        let batch_of = self.batch_of.lock();
        // Every object is admitted to a batch before it is sent; should one not be, its
        // records go under an empty key rather than stopping the transfer (as before the
        // key was typed).
        let batch = batch_of.get(&id).cloned();
        batch.unwrap_or_else(|| BatchKey::edge(String::new()))
    }

    fn count(&self, id: ObjectId, bytes: usize) {
        let mut sealed = self.sealed.lock();
        *sealed.entry(id).or_default() += bytes as u64;
    }

    fn attempt<T>(
        &self,
        task: Task,
        id: ObjectId,
        part: Option<u32>,
        op: impl FnOnce() -> Result<T, RelayError>,
    ) -> Result<T, RelayError> {
        forte_daemon::record::attempt(self.catalog, task, &self.batch(id), id, part, op)
    }

    /// A request about object `id` (`what`), retried and each attempt recorded; a refusal
    /// because the relay holds the object already is told to `on_held`.
    fn request<T>(
        &self,
        what: &str,
        About { task, id, part }: About,
        op: impl Fn() -> Result<T, RelayError>,
    ) -> Result<T, RelayError> {
        let done = self
            .retry
            .run(task.into(), what, || self.attempt(task, id, part, &op));
        if done.as_ref().is_err_and(|e| e.held.is_some()) {
            (self.on_held)(id);
        }
        done
    }
}

impl UploadSink<'_> {
    /// Records `part` in `state`, with its ciphertext and the part size its object was cut at
    /// (which a later run resumes the object at).
    fn record_part(&self, state: PartState, part: &OutgoingPart<'_>) {
        let hashes = PartHashes {
            ciphertext_sha256: Some(part.sha256),
            ciphertext_length: Some(part.sealed.len() as u64),
            part_size: Some(part.part_size),
            ..PartHashes::default()
        };
        let object = part.id.to_string();
        let batch = self.batch(part.id);
        note(
            "a part's state",
            self.catalog
                .part_state(&batch, &object, part.index, state, &hashes),
        );
    }

    /// Records a part about to be sent and waits for the record to be committed: once the
    /// relay may hold the part, this catalogue knows the size it was cut at, without which a
    /// later run cannot resume from it (it sends it again).
    fn record_sending(&self, part: &OutgoingPart<'_>) {
        self.record_part(PartState::Sending, part);
        note("a part about to be sent", self.catalog.flush());
    }

    /// Records an uploaded part and counts its bytes.
    fn record_uploaded(&self, part: &OutgoingPart<'_>) {
        self.record_part(PartState::Uploaded, part);
        self.count(part.id, part.sealed.len());
        forte_daemon::monitor::part_sent(part.id, part.index);
    }

    /// Records a sealed object: its parts, and its file (a bundle: each of its files).
    fn record_sealed(&self, manifest: &Manifest, batch: &BatchKey, sealed: &[u8]) {
        self.count(manifest.id, sealed.len());
        let object = manifest.id.to_string();
        for p in &manifest.parts {
            let hashes = PartHashes {
                raw_sha256: Some(&p.raw_sha256),
                ..PartHashes::default()
            };
            note(
                "a sealed part",
                self.catalog
                    .part_state(batch, &object, p.index, PartState::Sealed, &hashes),
            );
        }
        // A bundle's files are recorded each under its own id, as if sent alone.
        for file in manifest.files() {
            let id = file.id.to_string();
            let file = FileRecord {
                raw_sha256: Some(&file.sha256),
                ..FileRecord::new(batch, &id, &file.path, file.size, FileState::Sealed)
            };
            note("a sealed file", self.catalog.file_state(&file));
        }
    }
}

impl Sink for UploadSink<'_> {
    fn prepared(&self, id: ObjectId, index: u32, raw_len: u64, sealed_len: u64) {
        forte_daemon::monitor::part_prepared(&self.batch(id), id, index, raw_len, sealed_len);
    }

    fn put_part(
        &self,
        id: ObjectId,
        index: u32,
        part_size: u64,
        sealed: &[u8],
        sha256: &str,
    ) -> Result<()> {
        let what = format!("upload of part {index} of object {id}");
        (self.on_sending)(id, sha256);
        let part = OutgoingPart {
            id,
            index,
            part_size,
            sealed,
            sha256,
        };
        self.record_sending(&part);
        let about = About {
            task: Task::Upload,
            id,
            part: Some(index),
        };
        self.request(&what, about, || {
            forte_daemon::monitor::part_sending(id, index);
            self.client.put_part(id, index, sealed, sha256)
        })?;
        self.record_uploaded(&part);
        Ok(())
    }

    fn put_object(
        &self,
        manifest: &Manifest,
        part: &[u8],
        sha256: &str,
        sealed_manifest: &[u8],
    ) -> Result<()> {
        let (id, batch) = (manifest.id, self.batch(manifest.id));
        (self.on_final)(manifest);
        let what = format!("upload and seal of object {id} ({})", manifest.describe());
        (self.on_sending)(id, sha256);
        let about = About {
            task: Task::Upload,
            id,
            part: Some(0),
        };
        self.request(&what, about, || {
            forte_daemon::monitor::part_sending(id, 0);
            self.client
                .put_whole(id, batch.batch(), part, sha256, sealed_manifest)
        })?;
        self.record_uploaded(&OutgoingPart {
            id,
            index: 0,
            part_size: manifest.part_size,
            sealed: part,
            sha256,
        });
        self.record_sealed(manifest, &batch, sealed_manifest);
        Ok(())
    }

    fn put_manifest(&self, manifest: &Manifest, sealed: &[u8]) -> Result<()> {
        let parts: Vec<PartRef> = manifest
            .parts
            .iter()
            .map(|p| PartRef {
                index: p.index,
                sha256: p.ciphertext_sha256.clone(),
                length: p.ciphertext_length,
            })
            .collect();
        let what = format!("seal of object {} ({})", manifest.id, manifest.path);
        let batch = self.batch(manifest.id);
        (self.on_final)(manifest);
        let about = About {
            task: Task::Seal,
            id: manifest.id,
            part: None,
        };
        self.request(&what, about, || {
            self.client
                .seal(manifest.id, batch.batch(), parts.clone(), sealed)
        })?;
        self.record_sealed(manifest, &batch, sealed);
        Ok(())
    }

    fn done(&self, outcomes: &[FileOutcome]) {
        // A failed file's parts already at the relay stay there unsealed: the next run of send
        // resumes them.
        let object = outcomes.first().map(|o| o.object);
        let bytes = object.and_then(|id| self.sealed.lock().remove(&id));
        (self.on_done)(outcomes, bytes.unwrap_or(0));
    }
}

/// A sealed part on its way to the relay: its object, index, the raw bytes per part its object
/// was cut at, its ciphertext and the ciphertext's SHA-256.
struct OutgoingPart<'a> {
    id: ObjectId,
    index: u32,
    part_size: u64,
    sealed: &'a [u8],
    sha256: &'a str,
}

/// What a request to the relay is, as its attempts are recorded: the task, the object, and
/// the part if it carries one.
#[derive(Clone, Copy)]
struct About {
    task: Task,
    id: ObjectId,
    part: Option<u32>,
}

/// What the relay already has of an object, for resuming.
pub enum AtRelay {
    /// Nothing: prepare and send everything.
    Nothing,
    /// Some parts: send the rest.
    Parts(BTreeMap<u32, HeldPart>),
    /// Sealed and waiting for pull: nothing to send, but still one of the batch's objects.
    Sealed,
    /// Delivered to the core and acknowledged: no longer anything the batch offers.
    Delivered,
}

/// The parts of an object the relay holds that a run may resume from, and the part size they
/// were cut at, at which the object is cut again.
#[derive(Debug, Default)]
pub struct Resume {
    pub held: BTreeMap<u32, HeldPart>,
    pub part_size: Option<u64>,
}

/// What of `held`, the parts of object `id` the relay holds, a run may resume from: the parts
/// this catalogue recorded uploading with these very bytes (the same ciphertext SHA-256) and
/// the part size the object was cut at then. An object is not always cut at the configured
/// size (the last of a queue go in smaller parts), and a held part reused at another size
/// would be another range of the file, which the core refuses. A part with no such record (a
/// crash between the relay storing it and the record, another catalogue, a catalogue from
/// before part sizes were recorded) is sent again.
pub fn resumable(catalog: &Catalog, id: ObjectId, held: BTreeMap<u32, HeldPart>) -> Resume {
    if held.is_empty() {
        return Resume::default();
    }
    let recorded = match catalog.parts(&id.to_string()) {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(object = %id, "parts at the relay sent again: cannot read their records: {e:#}");
            return Resume::default();
        }
    };
    // Each held part's recorded size, if its record names these very bytes: one look-up
    // each, however many parts the object has.
    let recorded: HashMap<i64, &PartRow> = recorded.iter().map(|r| (r.index, r)).collect();
    let cut_at = |index: u32, part: &HeldPart| {
        let row = recorded.get(&i64::from(index))?;
        let same_bytes = row.ciphertext_sha256.as_deref() == Some(&part.ciphertext_sha256);
        same_bytes.then_some(row.part_size)?.map(|size| size as u64)
    };
    let held: Vec<(u32, HeldPart, Option<u64>)> = held
        .into_iter()
        .map(|(index, part)| {
            let size = cut_at(index, &part);
            (index, part, size)
        })
        .collect();
    let part_size = held.iter().find_map(|&(_, _, size)| size);
    let all = held.len();
    let resumable: BTreeMap<u32, HeldPart> = held
        .into_iter()
        .filter(|(_, _, size)| size.is_some() && *size == part_size)
        .map(|(index, part, _)| (index, part))
        .collect();
    if resumable.len() < all {
        tracing::info!(
            object = %id,
            "{} of {all} parts at the relay have no record of being cut at {}: sent again",
            all - resumable.len(),
            part_size.map_or("a known size".to_string(), |s| format!("{s} bytes per part")),
        );
    }
    Resume {
        held: resumable,
        part_size,
    }
}

/// What the relay holds of each of `ids` (one request per thousand ids).
pub fn at_relay(
    client: &RelayClient,
    retry: &Retry,
    ids: &[ObjectId],
) -> Result<HashMap<ObjectId, AtRelay>> {
    let mut known = retry.run(
        Operation::Status,
        &format!("status of {} objects", ids.len()),
        || client.statuses(ids),
    )?;
    Ok(ids
        .iter()
        .map(|id| {
            let found = match known.remove(id) {
                None => AtRelay::Nothing,
                Some(s) if s.state == ObjectState::Open => AtRelay::Parts(
                    s.parts
                        .into_iter()
                        .map(|p| {
                            (
                                p.index,
                                HeldPart {
                                    ciphertext_sha256: p.sha256,
                                    ciphertext_length: p.length,
                                },
                            )
                        })
                        .collect(),
                ),
                Some(s) if s.state == ObjectState::Delivered => AtRelay::Delivered,
                Some(_) => AtRelay::Sealed,
            };
            (*id, found)
        })
        .collect())
}
