//! Sealing: an object sealed into a batch once its parts are held (its manifest and sealed
//! record written under its lock), a one-part object kept and sealed at once, and a batch
//! sealed once every object of it is sealed or delivered (its inventory kept first).

use std::collections::HashSet;

use forte_format::{ObjectId, MANIFEST_FILE};
use parking_lot::Mutex;

use super::keys::{batch_key, inventory_key, object_key, sealed_key};
use super::{at_once, now, PartUpload, Result, Store, StoreError, Stored};
use crate::api::{ObjectState, PartRef, ReadyObject};

impl Store {
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
        self.object_locks
            .of(site, id)
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
        let (site, id) = (upload.site().to_string(), upload.id());
        self.object_locks.of(&site, id).hold(|| {
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
        self.quota.add(site, manifest.len() as i64);
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

    /// The objects the batch's current seal lists; none if it has none.
    pub(super) fn batch_members(&self, site: &str, batch: &str) -> Vec<ObjectId> {
        let record = self.backend.get(&batch_key(site, batch), "batch record");
        record
            .ok()
            .flatten()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    /// Removes the objects an earlier seal of the batch listed (`before`) that its new seal
    /// (`now`) leaves out and the core has not taken: its edge superseded them with a later
    /// instance (a file changed before the core pulled the batch), so nothing would ever
    /// acknowledge them, and they would wait at the relay for good.
    fn remove_superseded(
        &self,
        site: &str,
        batch: &str,
        before: &[ObjectId],
        now: &[ObjectId],
    ) -> Result<()> {
        let what = format!("removal of objects batch {batch} no longer holds");
        for id in before.iter().filter(|id| !now.contains(id)) {
            if !self.is_acked(site, *id)? {
                let bytes = self.remove_object(site, *id, &what)?;
                tracing::info!(batch, object = %id, bytes, "object of a superseded instance removed");
            }
        }
        Ok(())
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
        let before = self.batch_members(site, batch);
        let record = serde_json::to_vec(objects).expect("serialises");
        self.backend.put(&batch_key(site, batch), &record, &what)?;
        self.remove_superseded(site, batch, &before, objects)
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
}
