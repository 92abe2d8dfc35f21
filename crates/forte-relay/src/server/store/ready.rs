//! What the core is offered and reads: the objects of sealed batches, oldest first (each
//! sealed record read once, see [`super::sealed_records`]), their manifests and parts, and a
//! sealed batch's inventory.

use std::collections::{HashMap, HashSet};

use forte_format::{ObjectId, MANIFEST_FILE};

use super::keys::{batch_key, inventory_key, object_key, part_key, site_key, SEALED_RECORD};
use super::{Entry, Reader, Result, Store, StoreError};
use crate::api::ReadyObject;

impl Store {
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
            let known = self
                .sealed_records
                .current(&entry.key, entry.version.as_ref());
            if let Some(object) = known.or_else(|| self.read_sealed(entry)) {
                out.push(object);
            }
        }
        // Records gone from the listing are forgotten: one put back later is read again, and
        // checked against the tombstones.
        let site_prefix = format!("{}/", site_key(site));
        let listed_keys: HashSet<&str> = listed.iter().map(|e| e.key.as_str()).collect();
        self.sealed_records
            .forget_unlisted(&site_prefix, &listed_keys);
        out
    }

    /// The sealed record listed as `entry`, read from the store (and kept in
    /// `sealed_records` with the version it was listed with); `None` if it does not read, or
    /// if its object was delivered (then the object goes).
    fn read_sealed(&self, entry: &Entry) -> Option<ReadyObject> {
        let read = self.backend.get(&entry.key, "sealed record").ok().flatten();
        let o = read.and_then(|b| serde_json::from_slice::<ReadyObject>(&b).ok())?;
        if matches!(self.is_acked(&o.site, o.id), Ok(true)) {
            let _ = self.remove_object(&o.site, o.id, "removal of a delivered object put back");
            return None;
        }
        if let Some(version) = &entry.version {
            self.sealed_records
                .keep(entry.key.clone(), version.clone(), o.clone());
        }
        Some(o)
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
                    .flat_map(|acking| acking.ids)
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
}
