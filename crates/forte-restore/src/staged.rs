//! Objects verified and written to a staging directory, not yet visible at the destination.

use std::sync::Arc;

use anyhow::{bail, Result};
use forte_format::{Inventory, InventoryEntry, ObjectId};

use crate::outcome::{Placed, Problem, RestoreFailure};
use crate::stages::Job;

/// Objects verified and written to a staging directory, not yet visible at the destination.
#[derive(Default)]
pub struct Staged {
    pub(crate) jobs: Vec<Arc<Job>>,
    /// Found already in place (with [`Existing::KeepIdentical`]).
    pub(crate) found: Vec<Placed>,
}

impl Staged {
    /// Keeps only what objects of `ids` carry: staged ahead of a batch's seal, an object its
    /// seal left out (of an instance its edge superseded) is not part of the batch.
    pub fn keep_only(&mut self, ids: &std::collections::HashSet<ObjectId>) {
        self.jobs.retain(|j| ids.contains(&j.object.manifest.id));
        self.found.retain(|p| ids.contains(&p.carrier));
    }

    /// The targets of the staged files that something already holds at `dest`: what
    /// committing them would replace (other versions; identical files were found in place).
    pub fn in_the_way(&self, dest: &std::path::Path) -> Vec<String> {
        let files = self.jobs.iter().flat_map(|j| &j.files);
        files
            .filter(|f| f.manifest.kind == forte_format::Kind::File)
            .filter(|f| std::fs::symlink_metadata(dest.join(&f.target)).is_ok())
            .map(|f| f.target.clone())
            .collect()
    }

    /// Every object staged or found in place.
    pub fn ids(&self) -> impl Iterator<Item = ObjectId> + '_ {
        let staged = self.jobs.iter().map(|j| j.object.manifest.id);
        staged.chain(self.found.iter().map(|p| p.id))
    }

    /// Adds what a later [`Restore::stage`] call into the same staging directory staged.
    pub fn extend(&mut self, more: Staged) {
        self.jobs.extend(more.jobs);
        self.found.extend(more.found);
    }

    /// Fails unless the staged objects are exactly those of `inventory`, or, without one,
    /// unless every object predates inventories (version 1): a version-2 object without an
    /// inventory means the inventory was removed on the way.
    pub(crate) fn check_complete(&self, inventory: Option<&Inventory>) -> Result<()> {
        let Some(inventory) = inventory else {
            if let Some(job) = self
                .jobs
                .iter()
                .find(|j| j.object.manifest.listed_in_inventory())
            {
                let m = &job.object.manifest;
                bail!(
                    "nothing was restored: {} (object {}) belongs to a set with a signed inventory, but the inventory is missing; it was removed on the way, so nothing proves the set complete",
                    m.path,
                    m.id
                );
            }
            return Ok(());
        };
        let present: Vec<InventoryEntry> = self
            .jobs
            .iter()
            .flat_map(|j| &j.files)
            .map(|f| InventoryEntry::of(&f.manifest))
            .chain(self.found.iter().map(|p| InventoryEntry {
                id: p.id,
                path: p.path.clone(),
                size: p.size,
                sha256: p.sha256.clone(),
            }))
            .collect();
        let problems: Vec<Problem> = inventory
            .differences(&present)
            .into_iter()
            .map(|(object, message)| Problem {
                object,
                part: None,
                damaged: false,
                message,
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(RestoreFailure { problems }.into())
        }
    }
}
