//! Where sealed objects come from: a directory (`unpack`) or the relay (`pull`).

use std::fs::File;
use std::io::Read;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use forte_format::{part_file_name, Manifest, ObjectId, INVENTORY_FILE, MANIFEST_FILE};

/// An object as a source names it.
#[derive(Debug, Clone)]
pub struct ObjectRef {
    pub id: ObjectId,
    /// Where the object is, for messages and for the source itself (a directory, a relay site).
    pub place: String,
}

/// Why a sealed part could not be had.
#[derive(Debug)]
pub enum PartError {
    /// The bytes are there but wrong (size): the copy at the source is damaged.
    Damaged(String),
    /// The bytes could not be read (missing file, network): perhaps they can be later.
    Unavailable(String),
}

/// A store of sealed objects. Methods are called from several threads at once.
pub trait ObjectSource: Sync {
    /// The objects to restore.
    fn list(&self) -> Result<Vec<ObjectRef>>;
    /// The sealed manifest, at most `max_len` bytes.
    fn manifest(&self, object: &ObjectRef, max_len: u64) -> Result<Vec<u8>>;
    /// A sealed part, which must be exactly `length` bytes.
    fn part(&self, object: &ObjectRef, index: u32, length: u64) -> Result<Vec<u8>, PartError>;
    /// Checks that need the verified manifest (a directory must hold nothing else).
    fn check(&self, _object: &ObjectRef, _manifest: &Manifest) -> Result<()> {
        Ok(())
    }
    /// The sealed inventory of the set (`inventory.age`), at most `max_len` bytes; `None` for
    /// a set written before inventories existed (or one whose inventory was removed, which
    /// its version-2 manifests reveal).
    fn inventory(&self, max_len: u64) -> Result<Option<Vec<u8>>>;
}

/// Objects in a directory, one `<id>/` subdirectory each: the output of `forte pack`, or a
/// relay's store.
pub struct DirSource {
    pub root: PathBuf,
}

impl DirSource {
    fn dir(&self, object: &ObjectRef) -> PathBuf {
        self.root.join(object.id.to_string())
    }
}

impl ObjectSource for DirSource {
    fn list(&self) -> Result<Vec<ObjectRef>> {
        let root = &self.root;
        let mut entries = std::fs::read_dir(root)
            .with_context(|| format!("cannot list {}", root.display()))?
            .collect::<std::io::Result<Vec<_>>>()
            .with_context(|| format!("cannot list {}", root.display()))?;
        entries.sort_by_key(|e| e.file_name());
        let mut objects = Vec::new();
        let mut strangers = Vec::new();
        for entry in entries {
            let path = entry.path();
            if entry.file_name() == INVENTORY_FILE && path.is_file() {
                continue;
            }
            let parsed = entry.file_name().to_str().map(str::parse::<ObjectId>);
            match parsed {
                Some(Ok(id)) if path.is_dir() => objects.push(ObjectRef {
                    id,
                    place: path.display().to_string(),
                }),
                _ => strangers.push(path.display().to_string()),
            }
        }
        if !strangers.is_empty() {
            bail!(
                "nothing was restored; {} is not only object directories (32 hex digits each) and {INVENTORY_FILE}: {}",
                root.display(),
                strangers.join(", ")
            );
        }
        if objects.is_empty() {
            bail!("{} holds no packed objects", root.display());
        }
        Ok(objects)
    }

    fn inventory(&self, max_len: u64) -> Result<Option<Vec<u8>>> {
        let path = self.root.join(INVENTORY_FILE);
        let mut sealed = Vec::new();
        match File::open(&path) {
            Ok(f) => f
                .take(max_len)
                .read_to_end(&mut sealed)
                .with_context(|| format!("cannot read {}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        Ok(Some(sealed))
    }

    fn manifest(&self, object: &ObjectRef, max_len: u64) -> Result<Vec<u8>> {
        let path = self.dir(object).join(MANIFEST_FILE);
        let mut sealed = Vec::new();
        File::open(&path)
            .and_then(|f| f.take(max_len).read_to_end(&mut sealed))
            .with_context(|| format!("incomplete, cannot read {}", path.display()))?;
        Ok(sealed)
    }

    fn part(&self, object: &ObjectRef, index: u32, length: u64) -> Result<Vec<u8>, PartError> {
        let path = self.dir(object).join(part_file_name(index));
        let mut data = Vec::with_capacity(length as usize);
        File::open(&path)
            .and_then(|f| f.take(length + 1).read_to_end(&mut data))
            .map_err(|e| PartError::Unavailable(format!("cannot read {}: {e}", path.display())))?;
        if data.len() as u64 != length {
            let actual = std::fs::metadata(&path).map_or(data.len() as u64, |m| m.len());
            return Err(PartError::Damaged(format!(
                "{} has {actual} bytes, the manifest says {length}: truncated, extended or replaced",
                path.display()
            )));
        }
        Ok(data)
    }

    fn check(&self, object: &ObjectRef, manifest: &Manifest) -> Result<()> {
        let dir = self.dir(object);
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("cannot list {}", dir.display()))?
        {
            let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let known = name == MANIFEST_FILE
                || (0..manifest.parts.len() as u32).any(|i| part_file_name(i) == name);
            if !known {
                bail!(
                    "unexpected {} in the object directory (manifest lists {} parts)",
                    entry.path().display(),
                    manifest.parts.len()
                );
            }
        }
        Ok(())
    }
}
