//! A part arriving at the relay: written to the spool as it comes and hashed on the way, its
//! declared length charged to the site's quota before a byte of it is read. It is kept only
//! when every declared byte arrived and they hash to what the edge said; until then nothing
//! the relay serves changes, and an upload dropped half-way leaves neither file nor charge.
//!
//! So a part costs the relay the few chunks in flight between the connection and the disk,
//! whatever its size, and a site over its quota is refused at once instead of after its body.

use std::fs::File;
use std::io::{Read, Write};
use std::path::PathBuf;

use forte_format::ObjectId;
use sha2::{Digest, Sha256};

use super::keys::{part_key, part_record, record_key};
use super::{Result, Store, StoreError, Stored};
use crate::api::{ObjectState, PartRef};

/// Bytes a site has been charged for an upload not kept yet: given back when dropped unkept.
struct Charge<'s> {
    store: &'s Store,
    site: String,
    bytes: i64,
}

impl Charge<'_> {
    /// The charged bytes are now held: they stay counted.
    fn keep(mut self) {
        self.bytes = 0;
    }
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        if self.bytes != 0 {
            self.store.quota.add(&self.site, -self.bytes);
        }
    }
}

/// A spooled body's file, removed when dropped unless it was kept.
struct Spooled {
    file: Option<File>,
    path: PathBuf,
}

impl Drop for Spooled {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A part the relay holds, as its record says, and whether the part's bytes hash to it.
struct HeldPart {
    part: PartRef,
    intact: bool,
}

/// One part being received; see the module's documentation.
pub struct PartUpload<'s> {
    store: &'s Store,
    site: String,
    id: ObjectId,
    index: u32,
    sha256: String,
    declared: u64,
    /// `None` when it replaces a part held, whose difference is charged when it is kept.
    charge: Option<Charge<'s>>,
    spooled: Spooled,
    hasher: Sha256,
    received: u64,
}

impl Store {
    /// Starts receiving part `index` of object `id`, `declared` bytes whose ciphertext SHA-256
    /// must be `sha256`: charges them to the site's quota (refused at once if they do not fit,
    /// unless the relay holds this very part already) and opens a file for them in the spool.
    pub fn begin_part(
        &self,
        site: &str,
        id: ObjectId,
        index: u32,
        sha256: &str,
        declared: u64,
    ) -> Result<PartUpload<'_>> {
        let what = format!("part {index} of object {id}");
        let charge = match self.charge(site, declared as i64) {
            Ok(()) => Some(Charge {
                store: self,
                site: site.to_string(),
                bytes: declared as i64,
            }),
            // A part replacing one held (a retry, a torn part) counts only the difference,
            // charged when it is kept: it is read if that difference fits now.
            Err(full @ (StoreError::Full(_) | StoreError::NoRoom(_))) => {
                let Some(held) = self.recorded(site, id, index, &what)? else {
                    return Err(full);
                };
                let difference = declared as i64 - held.length as i64;
                if self.charge(site, difference).is_err() {
                    return Err(full);
                }
                self.quota.add(site, -difference);
                None
            }
            Err(e) => return Err(e),
        };
        let key = part_key(site, id, index);
        let dir = self.backend.spool_dir(&key);
        std::fs::create_dir_all(&dir).map_err(|e| StoreError::io(&what, &dir, e))?;
        let mut suffix = [0u8; 8];
        getrandom::getrandom(&mut suffix).map_err(|e| StoreError::Io(e.to_string()))?;
        let path = dir.join(format!("{}.part", hex::encode(suffix)));
        let file = File::create_new(&path).map_err(|e| StoreError::io(&what, &path, e))?;
        Ok(PartUpload {
            store: self,
            site: site.to_string(),
            id,
            index,
            sha256: sha256.to_string(),
            declared,
            charge,
            spooled: Spooled {
                file: Some(file),
                path,
            },
            hasher: Sha256::new(),
            received: 0,
        })
    }

    /// Stores a part given whole: [`Store::begin_part`], its bytes, [`PartUpload::finish`].
    pub fn put_part(
        &self,
        site: &str,
        id: ObjectId,
        index: u32,
        sha256: &str,
        body: &[u8],
    ) -> Result<Stored> {
        let mut upload = self.begin_part(site, id, index, sha256, body.len() as u64)?;
        upload.write(body)?;
        upload.finish()
    }

    /// Part `index` of an object as its record says, held or not.
    fn recorded(
        &self,
        site: &str,
        id: ObjectId,
        index: u32,
        what: &str,
    ) -> Result<Option<PartRef>> {
        let record = self.backend.get(&record_key(site, id, index), what)?;
        Ok(record.and_then(|r| part_record(index, &r)))
    }

    /// Part `index` of an object as its record says, and whether the part held hashes to it
    /// (read as a stream: a part may be a GiB).
    fn held_part(
        &self,
        site: &str,
        id: ObjectId,
        index: u32,
        what: &str,
    ) -> Result<Option<HeldPart>> {
        let Some(part) = self.recorded(site, id, index, what)? else {
            return Ok(None);
        };
        let Some((mut reader, length)) = self.backend.open(&part_key(site, id, index), what)?
        else {
            return Ok(None);
        };
        let mut hasher = Sha256::new();
        let mut buffer = vec![0u8; 1 << 20];
        loop {
            match reader.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => hasher.update(&buffer[..n]),
                Err(e) => return Err(StoreError::Io(format!("{what}: {e}"))),
            }
        }
        let intact = length == part.length && hex::encode(hasher.finalize()) == part.sha256;
        Ok(Some(HeldPart { part, intact }))
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
}

impl<'s> PartUpload<'s> {
    fn what(&self) -> String {
        format!("part {} of object {}", self.index, self.id)
    }

    /// Takes the next bytes of the body.
    pub fn write(&mut self, chunk: &[u8]) -> Result<()> {
        if self.received + chunk.len() as u64 > self.declared {
            return Err(StoreError::Invalid(format!(
                "{}: more than the {} bytes declared; nothing stored",
                self.what(),
                self.declared
            )));
        }
        self.hasher.update(chunk);
        let file = self.spooled.file.as_mut().expect("open until finished");
        if let Err(e) = file.write_all(chunk) {
            return Err(StoreError::io(&self.what(), &self.spooled.path, e));
        }
        self.received += chunk.len() as u64;
        Ok(())
    }

    /// The site the part is for.
    pub fn site(&self) -> &str {
        &self.site
    }

    /// The object the part is of.
    pub fn id(&self) -> ObjectId {
        self.id
    }

    /// The part as the seal lists it once kept.
    pub fn part_ref(&self) -> PartRef {
        PartRef {
            index: self.index,
            sha256: self.sha256.clone(),
            length: self.declared,
        }
    }

    /// Keeps the part, if complete and as the edge said, holding the object's lock.
    pub fn finish(self) -> Result<Stored> {
        let (store, site, id) = (self.store, self.site.clone(), self.id);
        store.object_locks.of(&site, id).hold(|| self.finish_held())
    }

    /// [`PartUpload::finish`], the object's lock held: its record written create-only (which
    /// tells whether the part was held before), then the part, then a look for a tombstone.
    pub(super) fn finish_held(mut self) -> Result<Stored> {
        let what = self.what();
        if self.received != self.declared {
            return Err(StoreError::Invalid(format!(
                "{what}: the body ended after {} of {} bytes; nothing stored",
                self.received, self.declared
            )));
        }
        let found = hex::encode(self.hasher.clone().finalize());
        if found != self.sha256 {
            return Err(StoreError::Invalid(format!(
                "{what}: ciphertext SHA-256 mismatch (header {}, body {found}); nothing stored",
                self.sha256
            )));
        }
        let Some(charge) = self.charge.take() else {
            return self.finish_again(&what);
        };
        let record = format!("{} {}\n", self.sha256, self.declared);
        let recorded = self.store.backend.put_new(
            &record_key(&self.site, self.id, self.index),
            record.as_bytes(),
            &what,
        );
        match recorded {
            Ok(true) => self.keep(charge, &what),
            Ok(false) => {
                drop(charge);
                self.finish_again(&what)
            }
            Err(e) => Err(self.store.no_room_unless_waiting_if_full(e)),
        }
    }

    /// A part with a record already: a retry, a part torn by a crash, or other bytes (refused
    /// if the object is sealed).
    fn finish_again(self, what: &str) -> Result<Stored> {
        let (store, site, id, index) = (self.store, self.site.as_str(), self.id, self.index);
        let previous = store.held_part(site, id, index, what)?;
        if let Some(HeldPart { part: p, intact }) = &previous {
            // A crash between rename and flush can leave a record whose part is not what it
            // says: trust a held part only after hashing it again (this happens on retries).
            if p.sha256 == self.sha256 && p.length == self.declared && *intact {
                store.backend.flush(what)?;
                store.refuse_if_delivered(site, id, what)?;
                return Ok(Stored::AlreadyHeld);
            }
            // Other bytes for a sealed object's part would break the seal, which lists the
            // held part's hash: an edge that did not ask first (a new catalogue) is told.
            if store.is_sealed(site, id)? {
                return Err(StoreError::Held(
                    ObjectState::Complete,
                    format!("object {id} is sealed already: its part {index} is not replaced"),
                ));
            }
        }
        // A part that replaces a held one (a torn part, or new bytes) counts only the
        // difference, in the check as in the charge.
        let bytes =
            self.declared as i64 - previous.as_ref().map_or(0, |held| held.part.length as i64);
        store.charge(site, bytes)?;
        let charge = Charge {
            store,
            site: site.to_string(),
            bytes,
        };
        let record = format!("{} {}\n", self.sha256, self.declared);
        let recorded = store
            .backend
            .put(&record_key(site, id, index), record.as_bytes(), what);
        if let Err(e) = recorded {
            return Err(store.no_room_unless_waiting_if_full(e));
        }
        self.keep(charge, what)
    }

    /// Writes the part, whose record is written and whose bytes are `charge`d.
    fn keep(mut self, charge: Charge<'s>, what: &str) -> Result<Stored> {
        let (store, site, id) = (self.store, self.site.as_str(), self.id);
        drop(self.spooled.file.take());
        let kept =
            store
                .backend
                .put_file(&part_key(site, id, self.index), &self.spooled.path, what);
        if let Err(e) = kept {
            return Err(store.no_room_unless_waiting_if_full(e));
        }
        charge.keep();
        store.refuse_if_delivered(site, id, what)?;
        Ok(Stored::New)
    }
}
