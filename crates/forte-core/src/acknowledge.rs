//! Acknowledgement: the relay may delete a batch once the core has delivered it durably (and
//! made the second copy); an acknowledgement lost to a killed puller is given again.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use forte_catalog::FileState::{Acknowledged, Delivered, Replaced};
use forte_catalog::{BatchKey, FileRecord, FileRow};
use forte_format::ObjectId;

use super::Core;
use forte_daemon::record::note;

impl Core<'_> {
    /// Acknowledges again, at the relay, the batches this core's catalogue has delivered but
    /// not acknowledged and the relay no longer lists (the relay took the acknowledgement, and
    /// the puller was killed before recording it), and records the answer. A batch the relay
    /// still lists is left to the pull, which finds its files in place and acknowledges them.
    pub fn confirm_acknowledgements(&self, listed: &HashSet<ObjectId>) {
        // Only the files still waiting for it: a year of acknowledged history is not read.
        let Ok(pending) = self.setup.catalog.delivered_unacknowledged() else {
            return;
        };
        let mut by_batch: BTreeMap<&BatchKey, Vec<&FileRow>> = BTreeMap::new();
        for f in &pending {
            by_batch.entry(&f.batch_key).or_default().push(f);
        }
        for (key, pending) in by_batch {
            let (site, batch) = (key.site(), key.batch());
            let Some(ids) = carriers(&pending) else {
                continue;
            };
            if ids.iter().any(|id| listed.contains(id)) {
                continue;
            }
            let receipt = self.kept_receipt(key);
            if self
                .setup
                .client
                .ack_batch(site, batch, &ids, receipt.as_deref())
                .is_err()
            {
                continue;
            }
            let detail = "acknowledged again after an interrupted pull";
            self.record_acknowledged(key, &pending, detail);
        }
    }

    /// The objects at the relay that carry the files of `instance` this catalogue delivered
    /// as batch `key` (delivered, acknowledged, or replaced by a later version since: not a
    /// later instance's, nor one that failed on the way); `None` if it holds none.
    pub(super) fn delivered_carriers(
        &self,
        key: &BatchKey,
        instance: &forte_catalog::InstanceRow,
    ) -> Option<Vec<ObjectId>> {
        let files = self.setup.catalog.files(key).ok()?;
        let delivered: Vec<&FileRow> = files
            .iter()
            .filter(|f| instance.objects.contains(&f.object_id))
            .filter(|f| matches!(f.state, Delivered | Acknowledged | Replaced))
            .collect();
        carriers(&delivered)
    }

    /// Records as acknowledged the files of a batch this catalogue delivered and the relay
    /// has just acknowledged again (its answer lost before, or refused): the ones still
    /// `delivered` among its rows.
    pub(super) fn learn_acknowledged(&self, key: &BatchKey, detail: &str) {
        let Ok(files) = self.setup.catalog.files(key) else {
            return;
        };
        let pending: Vec<_> = files.iter().filter(|f| f.state == Delivered).collect();
        self.record_acknowledged(key, &pending, detail);
    }

    fn record_acknowledged(&self, key: &BatchKey, pending: &[&FileRow], detail: &str) {
        for f in pending {
            let (path, size) = (&f.path, f.size as u64);
            let file = FileRecord {
                detail: Some(detail),
                ..FileRecord::new(key, &f.object_id, path, size, Acknowledged)
            };
            note("an acknowledgement", self.setup.catalog.file_state(&file));
        }
    }
}

/// The objects that carry `files` at the relay (a bundle's files by the bundle); `None` if
/// there are none, or one is not an object id.
fn carriers(files: &[&FileRow]) -> Option<Vec<ObjectId>> {
    let carriers: BTreeSet<&str> = files.iter().map(|f| f.at_relay()).collect();
    let ids: Option<Vec<ObjectId>> = carriers.iter().map(|id| id.parse().ok()).collect();
    ids.filter(|ids| !ids.is_empty())
}
