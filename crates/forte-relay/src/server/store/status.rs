//! What the relay holds of an object: whether it is sealed or delivered, the parts it holds
//! (record and part both present), and its status as the edge asks for it, one object at a
//! time or many from listings of the whole site.

use std::collections::{HashMap, HashSet};

use forte_format::{part_file_name, ObjectId};

use super::keys::{
    acked_key, meta_key, object_key, part_record, record_index, sealed_key, site_key, SEALED_RECORD,
};
use super::{Entry, Result, Store, StoreError};
use crate::api::{ObjectState, ObjectStatus, PartRef};

/// Status queries of at least this many ids are answered from listings of the whole site.
const STATUSES_LISTED_FROM: usize = 8;

/// The names of an object's records (`part-N.sha256`, `sealed.json`) and of its bodies
/// (parts, manifest).
struct ObjectNames {
    records: Vec<String>,
    bodies: HashSet<String>,
}

/// A site's records and bodies (parts, manifests), from listings of the site: by object id.
pub(super) struct Listed {
    pub(super) records: HashMap<ObjectId, Vec<Entry>>,
    pub(super) bodies: HashMap<ObjectId, Vec<Entry>>,
}

impl Store {
    pub(super) fn is_acked(&self, site: &str, id: ObjectId) -> Result<bool> {
        self.backend.exists(&acked_key(site, id), "acknowledgement")
    }

    pub(super) fn is_sealed(&self, site: &str, id: ObjectId) -> Result<bool> {
        self.backend.exists(&sealed_key(site, id), "sealed record")
    }

    /// The parts of an object the relay holds: record and part both present.
    pub(super) fn held_parts(&self, site: &str, id: ObjectId) -> Result<Vec<PartRef>> {
        let names = self.names_of(site, id)?;
        self.parts_among(site, id, &names)
    }

    /// The names of an object's records and of its bodies (parts, manifest).
    fn names_of(&self, site: &str, id: ObjectId) -> Result<ObjectNames> {
        let what = format!("parts of object {id}");
        let records = self.backend.children(&meta_key(site, id), &what)?;
        let bodies = self.backend.children(&object_key(site, id), &what)?;
        Ok(ObjectNames {
            records,
            bodies: bodies.into_iter().collect(),
        })
    }

    /// The parts of an object among the `names` of its records and bodies: those with both,
    /// each as its record says, in order.
    fn parts_among(&self, site: &str, id: ObjectId, names: &ObjectNames) -> Result<Vec<PartRef>> {
        let what = format!("parts of object {id}");
        let mut parts = Vec::new();
        for name in &names.records {
            let Some(index) = record_index(name) else {
                continue;
            };
            if !names.bodies.contains(&part_file_name(index)) {
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

    /// An object's status from the `names` of its records and bodies; `None` when it is not
    /// `present` at the relay (an object reopened by a rejection may have no record left, but
    /// its manifest).
    fn status_among(
        &self,
        site: &str,
        id: ObjectId,
        names: &ObjectNames,
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
        let state = if names.records.iter().any(|n| n == SEALED_RECORD) {
            ObjectState::Complete
        } else {
            ObjectState::Open
        };
        let parts = self.parts_among(site, id, names)?;
        Ok(Some(ObjectStatus { state, parts }))
    }

    /// The site's records and bodies (parts, manifests), each object's by its id: two
    /// listings, for questions about many objects at once.
    pub(super) fn listed_by_object(&self, site: &str, what: &str) -> Result<Listed> {
        let mut listed = Listed {
            records: HashMap::new(),
            bodies: HashMap::new(),
        };
        for (under, by_id) in [
            ("meta", &mut listed.records),
            ("objects", &mut listed.bodies),
        ] {
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

    pub fn status(&self, site: &str, id: ObjectId) -> Result<ObjectStatus> {
        let names = self.names_of(site, id)?;
        // In a directory an object's emptied directories still count, as they always did.
        let what = "object status";
        let present = !names.records.is_empty()
            || !names.bodies.is_empty()
            || self.backend.any_under(&meta_key(site, id), what)?
            || self.backend.any_under(&object_key(site, id), what)?;
        self.status_among(site, id, &names, present)?
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
        let Listed { records, bodies } = self.listed_by_object(site, &what)?;
        let names = |listed: Option<&Vec<Entry>>| -> Vec<String> {
            listed
                .into_iter()
                .flatten()
                .map(|e| e.name().to_string())
                .collect()
        };
        let mut found = HashMap::new();
        for &id in ids {
            let held = ObjectNames {
                records: names(records.get(&id)),
                bodies: names(bodies.get(&id)).into_iter().collect(),
            };
            // Listings show keys only: an object whose directories a rejection emptied reads
            // as absent here, and as open with no parts alone; the edge sends it whole either way.
            let present = !held.records.is_empty() || !held.bodies.is_empty();
            let status = self.status_among(site, id, &held, present)?;
            if let Some(status) = status {
                found.insert(id, status);
            }
        }
        Ok(found)
    }
}
