//! The core's restore path: verify, decrypt, decompress, verify again, then deliver atomically.
//!
//! ```text
//! read ─▶ verify_ciphertext ─▶ decrypt ─▶ decompress ─▶ assemble (in order, whole-file hash)
//! ```
//!
//! Every byte is checked three times before anything becomes visible: the ciphertext SHA-256
//! against the signed manifest before decryption, the AEAD during decryption, and the raw
//! SHA-256 of each part and of the whole file after decompression. Files are assembled in a
//! staging directory inside the destination (same file system, so the final rename is atomic)
//! and only moved into place when *every* object verified; any failure removes the staging
//! directory and leaves the destination as it was.
//!
//! Modules, like forte-prepare's: `source` (where sealed objects come from), `objects` (opening
//! and checking manifests and the inventory), `stages` (the pipeline above), `staged` (what a
//! staging directory holds, checked against the inventory), `destination` (what is in the way,
//! the atomic commit, the second copy), `config` and `outcome`.

mod config;
mod destination;
mod object_source;
mod objects;
mod outcome;
mod staged;
mod stages;

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use forte_format::manifest::validate_path;
use forte_format::{Identities, Inventory, Manifest, TrustedEdges};
use forte_pipeline::{Budget, Pipeline};

use destination::{check_destination, commit};
use stages::{PlannedFile, PlannedObject};

pub use config::{Existing, RestoreConfig};
pub use destination::{keep_earlier_version, new_staging, remove_stale_staging, replicate};
pub use object_source::{DirSource, ObjectRef, ObjectSource, PartError};
pub use objects::{open_inventory, open_objects, Object, UntrustedObjects};
pub use outcome::{Delivered, Placed, Problem, Replaced, RestoreFailure, Totals};
pub use staged::Staged;

/// Maps a verified manifest to its relative path at the destination.
pub type TargetPath<'a> = &'a (dyn Fn(&Manifest) -> Result<String> + Sync);

/// One restore run.
pub struct Restore<'k> {
    config: RestoreConfig,
    identities: &'k Identities,
    trusted: &'k TrustedEdges,
    pub pipeline: Pipeline,
    pub totals: Arc<Totals>,
}

impl<'k> Restore<'k> {
    pub fn new(
        config: RestoreConfig,
        identities: &'k Identities,
        trusted: &'k TrustedEdges,
    ) -> Self {
        let pipeline = Pipeline::new(Budget::new(config.cpu as u64), config.scheduling);
        Self {
            config,
            identities,
            trusted,
            pipeline,
            totals: Arc::default(),
        }
    }

    /// Restores every object of `source` into `dest`, each at the path `layout` gives it, all
    /// or nothing, and only if they are exactly the objects of the source's signed inventory.
    /// On failure the error lists every problem found, each naming the file, object and part;
    /// a [`RestoreFailure`] when the problems are in the objects' bytes or their set.
    pub fn run(
        &self,
        source: &dyn ObjectSource,
        dest: &Path,
        layout: TargetPath<'_>,
    ) -> Result<Delivered> {
        let inventory = self.inventory(source)?;
        let staging = new_staging(dest)?;
        let result = self
            .stage(source, dest, layout, &staging)
            .and_then(|staged| self.commit(staged, &staging, dest, inventory.as_ref(), None));
        let _ = std::fs::remove_dir_all(&staging);
        result
    }

    /// The source's inventory, decrypted and verified; `None` if it has none.
    pub fn inventory(&self, source: &dyn ObjectSource) -> Result<Option<Inventory>> {
        source
            .inventory(objects::MAX_INVENTORY_BYTES)?
            .map(|sealed| open_inventory(&sealed, self.identities, self.trusted))
            .transpose()
    }

    /// Verifies every object of `source` and writes it into `staging` (from [`new_staging`]),
    /// making nothing visible at `dest`: the first half of [`Restore::run`]. Objects of one
    /// delivery can be staged in several calls as they become available, then moved into
    /// place together with [`Restore::commit`].
    pub fn stage(
        &self,
        source: &dyn ObjectSource,
        dest: &Path,
        layout: TargetPath<'_>,
        staging: &Path,
    ) -> Result<Staged> {
        let opened = open_objects(source, self.identities, self.trusted)?;
        let mut placed = Vec::with_capacity(opened.len());
        for object in opened {
            let mut files = Vec::new();
            for file in object.manifest.files() {
                let target = layout(&file).with_context(|| {
                    format!("object {}, file {}", object.manifest.id, file.path)
                })?;
                validate_path(&target).map_err(|e| {
                    anyhow::anyhow!("the layout puts {} at an unsafe path: {e}", file.path)
                })?;
                files.push(PlannedFile {
                    manifest: file,
                    target,
                });
            }
            placed.push(PlannedObject { object, files });
        }
        let all: Vec<&PlannedFile> = placed.iter().flat_map(|p| &p.files).collect();
        let already = check_destination(&all, dest, self.config.existing)?;
        let found: Vec<Placed> = placed
            .iter()
            .flat_map(|planned| {
                let carrier = planned.object.manifest.id;
                planned
                    .files
                    .iter()
                    .filter(|f| already.contains(&f.manifest.id))
                    .map(move |f| Placed::new(&f.manifest, carrier, &f.target, true))
            })
            .collect();
        for planned in &mut placed {
            planned.files.retain(|f| !already.contains(&f.manifest.id));
        }
        placed.retain(|p| !p.files.is_empty());
        let jobs = self.stage_all(source, placed, staging)?;
        Ok(Staged { jobs, found })
    }

    /// Moves everything staged in `staging` into place at `dest`: the second half of
    /// [`Restore::run`]. First the staged objects must be exactly those of `inventory` (see
    /// [`Restore::inventory`]); otherwise nothing moves. With `replace`, a file at a target
    /// with other contents (another version of it: the caller knows the batch may replace it)
    /// is kept under that directory and replaced; without, it refuses the batch.
    pub fn commit(
        &self,
        staged: Staged,
        staging: &Path,
        dest: &Path,
        inventory: Option<&Inventory>,
        replace: Option<&Path>,
    ) -> Result<Delivered> {
        staged.check_complete(inventory)?;
        let mut delivered = commit(staged, staging, dest, self.config.existing, replace)?;
        delivered.inventory = inventory.is_some();
        Ok(delivered)
    }
}
