//! The core's acknowledgements: a delivered batch recorded as being acknowledged (so none of
//! its objects is offered again, even if the relay stops half-way), its objects' tombstones
//! written and their data deleted, and the core's receipt for it kept for the edge.

use std::collections::HashSet;

use forte_format::ObjectId;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::keys::{acked_key, acking_key, batch_key, inventory_key, receipts_key, site_key};
use super::{at_once, now, Result, Store, StoreError};

/// The most receipts a batch keeps at the relay, and the most bytes of one: receipts are
/// small, and whoever may acknowledge must not fill the store with them.
pub const MAX_RECEIPTS_PER_BATCH: usize = 64;
pub const MAX_RECEIPT_BYTES: usize = 64 << 20;

/// A batch acknowledgement under way (`<batch>.acking.json`): the batch and its objects.
pub(super) struct Acking {
    pub(super) batch: String,
    pub(super) ids: Vec<ObjectId>,
}

impl Store {
    /// Batch acknowledgements under way at one site.
    pub(super) fn acking(&self, site: &str) -> Vec<Acking> {
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
                let ids = serde_json::from_slice(&bytes).ok()?;
                Some(Acking { batch, ids })
            })
            .collect()
    }

    /// Delivery of a whole batch acknowledged ([`Store::finish_ack`]). The acknowledgement
    /// must name every object the batch's seal lists: one naming fewer (a core that was
    /// offered the batch while one of its objects was hidden from the listing, or listed it
    /// before its edge sealed it again) would delete the seal and leave the others behind,
    /// offered to nobody and held for good. It is refused, and the core lists the batch again.
    pub fn ack_batch(
        &self,
        site: &str,
        batch: &str,
        ids: &[ObjectId],
        receipt: Option<&[u8]>,
    ) -> Result<()> {
        let named: HashSet<&ObjectId> = ids.iter().collect();
        let left_out: Vec<String> = self
            .batch_members(site, batch)
            .iter()
            .filter(|id| !named.contains(id))
            .map(ToString::to_string)
            .collect();
        if !left_out.is_empty() {
            return Err(StoreError::Conflict(format!(
                "batch {batch} of site {site}: its seal lists objects {left_out:?} this acknowledgement does not name (hidden from the listing the core was offered, or sealed since): nothing was deleted; the core lists the batch again and acknowledges it whole"
            )));
        }
        self.finish_ack(site, batch, ids, receipt)
    }

    /// Its objects are recorded first, so that none of them is listed any more even if the
    /// relay stops half-way; then each gets a tombstone (create-only: kept so the edge can
    /// learn what was delivered, and written once however many relays acknowledge) and their
    /// data and records are deleted together. Idempotent: an acknowledgement a stop
    /// interrupted is finished with it.
    pub(super) fn finish_ack(
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
}
