//! Where sealed parts and manifests go.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use forte_format::{part_file_name, Manifest, ObjectId, INVENTORY_FILE, MANIFEST_FILE};

use crate::FileOutcome;

/// The end of the prepare path. Parts of one file arrive in any order and from several threads;
/// the manifest arrives after every part of its file was accepted. Then [`Sink::done`] says
/// how the file ended; the stored parts of a file that failed must not be mistaken for a
/// complete object.
pub trait Sink: Sync {
    /// Part `index` of object `id`, cut at `part_size` raw bytes per part; `sha256` is the
    /// hex SHA-256 of `sealed`, already computed by the pipeline.
    fn put_part(
        &self,
        id: ObjectId,
        index: u32,
        part_size: u64,
        sealed: &[u8],
        sha256: &str,
    ) -> Result<()>;
    fn put_manifest(&self, manifest: &Manifest, sealed: &[u8]) -> Result<()>;
    /// A one-part object whole, its only part (`part`, SHA-256 `sha256`) with its manifest: a
    /// sink that can store both at once (the relay, in one request) saves a round trip.
    fn put_object(
        &self,
        manifest: &Manifest,
        part: &[u8],
        sha256: &str,
        sealed_manifest: &[u8],
    ) -> Result<()> {
        self.put_part(manifest.id, 0, manifest.part_size, part, sha256)?;
        self.put_manifest(manifest, sealed_manifest)
    }
    /// Told of each part once it is sealed and before it goes to the sink: its raw and sealed
    /// lengths (a sender counts what it has ready for the link with them).
    fn prepared(&self, _id: ObjectId, _index: u32, _raw_len: u64, _sealed_len: u64) {}
    /// Called once per object, after its manifest was stored or once it failed, with the
    /// outcome of its file (a bundle: of each of its files; all share `object` and error).
    fn done(&self, outcomes: &[FileOutcome]);
}

/// Writes objects as directories `<id>/` under one output directory, the on-disk layout of the
/// object format. An object is complete once `manifest.age` exists: it is renamed into place
/// after its parts are written. [`DirSink::finish`] makes everything durable with one
/// `syncfs`, far cheaper than an fsync per file when there are many small ones.
pub struct DirSink {
    root: PathBuf,
}

impl DirSink {
    pub fn create(root: &Path) -> Result<Self> {
        std::fs::create_dir_all(root)
            .with_context(|| format!("cannot create output directory {}", root.display()))?;
        Ok(Self {
            root: root.to_path_buf(),
        })
    }

    fn object_dir(&self, id: ObjectId) -> PathBuf {
        self.root.join(id.to_string())
    }

    /// Stores the archive's sealed inventory (`inventory.age`), renamed into place like a
    /// manifest; [`DirSink::finish`] makes it durable with the objects.
    pub fn put_inventory(&self, sealed: &[u8]) -> Result<()> {
        let temp = self.root.join(format!(".{INVENTORY_FILE}.partial"));
        write_file(&temp, sealed)?;
        let done = self.root.join(INVENTORY_FILE);
        std::fs::rename(&temp, &done)
            .with_context(|| format!("cannot rename into {}", done.display()))
    }

    /// Flushes everything written to stable storage.
    pub fn finish(&self) -> Result<()> {
        forte_fs::syncfs(&self.root)
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    forte_fs::create_with(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

impl Sink for DirSink {
    fn put_part(
        &self,
        id: ObjectId,
        index: u32,
        _part_size: u64,
        sealed: &[u8],
        _sha256: &str,
    ) -> Result<()> {
        let dir = self.object_dir(id);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        write_file(&dir.join(part_file_name(index)), sealed)
    }

    fn put_manifest(&self, manifest: &Manifest, sealed: &[u8]) -> Result<()> {
        let dir = self.object_dir(manifest.id);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let temp = dir.join(".manifest.age.partial");
        write_file(&temp, sealed)?;
        let done = dir.join(MANIFEST_FILE);
        std::fs::rename(&temp, &done)
            .with_context(|| format!("cannot rename into {}", done.display()))
    }

    fn done(&self, outcomes: &[FileOutcome]) {
        if let Some(failed) = outcomes.iter().find(|o| o.error.is_some()) {
            // Best effort: an object without manifest.age is incomplete whether or not this
            // works.
            let _ = std::fs::remove_dir_all(self.object_dir(failed.object));
        }
    }
}
