//! What goes from the relay without being delivered: a batch cancelled (by its edge, or by an
//! operator), uploads an edge abandoned (expired), and a damaged part or manifest the core
//! rejected (dropped, and its object reopened for the edge to send again). The bytes freed
//! leave the site's quota.

use forte_format::{ObjectId, MANIFEST_FILE};

use super::keys::{
    batch_key, inventory_key, meta_key, object_key, part_key, record_key, sealed_key, site_key,
};
use super::{now, Result, Store};

impl Store {
    /// Deletes an object's data and records; returns the bytes freed.
    pub(super) fn remove_object(&self, site: &str, id: ObjectId, what: &str) -> Result<u64> {
        self.remove_objects(site, &[id], what)
    }

    /// Deletes the data and records of objects `ids`, all in one deletion; returns the bytes
    /// of data freed.
    pub(super) fn remove_objects(&self, site: &str, ids: &[ObjectId], what: &str) -> Result<u64> {
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
        self.sealed_records
            .forget(ids.iter().map(|&id| sealed_key(site, id)));
        self.quota.add(site, -(freed as i64));
        Ok(freed)
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

    /// Deletes the objects of `ids` that are open (never sealed, nor delivered): uploads the
    /// edge gave up, such as a file that changed while it was read and went again as a later
    /// version under another id. A sealed or delivered object is left as it is. Returns the
    /// objects and bytes removed.
    pub fn abandon_open(&self, site: &str, ids: &[ObjectId]) -> Result<(usize, u64)> {
        let what = "abandoned upload";
        let (mut objects, mut bytes) = (0, 0);
        for (id, status) in self.statuses(site, ids)? {
            if status.state == crate::api::ObjectState::Open {
                bytes += self.remove_object(site, id, what)?;
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
        self.sealed_records.forget([sealed_key(site, id)]);
        self.quota.add(site, -(length as i64));
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
        self.sealed_records.forget([sealed_key(site, id)]);
        self.quota.add(site, -(length as i64));
        Ok(())
    }
}
