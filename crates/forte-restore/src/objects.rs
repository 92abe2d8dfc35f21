//! Finding packed objects in a directory and opening their manifests.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use forte_format::seal::decrypt;
use forte_format::{part_file_name, Identities, Manifest, ObjectId, TrustedEdges, MANIFEST_FILE};

/// Larger than the manifest of a 100 TiB file in 16 MiB parts; bounds what an untrusted
/// `manifest.age` can make us allocate before its signature is checked.
const MAX_MANIFEST_BYTES: u64 = 1 << 30;

/// An object directory whose manifest decrypted, verified and matched its name.
#[derive(Debug)]
pub struct Object {
    pub dir: PathBuf,
    pub manifest: Manifest,
}

/// Opens every object under `root`. Fails listing every object that cannot be trusted; a
/// directory with one bad object yields no objects at all.
pub fn open_objects(
    root: &Path,
    identities: &Identities,
    trusted: &TrustedEdges,
) -> Result<Vec<Object>> {
    let mut entries = std::fs::read_dir(root)
        .with_context(|| format!("cannot list {}", root.display()))?
        .collect::<std::io::Result<Vec<_>>>()
        .with_context(|| format!("cannot list {}", root.display()))?;
    entries.sort_by_key(|e| e.file_name());
    let mut objects = Vec::new();
    let mut errors = Vec::new();
    for entry in entries {
        let dir = entry.path();
        match open_object(&dir, identities, trusted) {
            Ok(object) => objects.push(object),
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    if !errors.is_empty() {
        bail!(
            "nothing was restored; {} object(s) in {} cannot be trusted:\n  {}",
            errors.len(),
            root.display(),
            errors.join("\n  ")
        );
    }
    if objects.is_empty() {
        bail!("{} holds no packed objects", root.display());
    }
    Ok(objects)
}

fn open_object(dir: &Path, identities: &Identities, trusted: &TrustedEdges) -> Result<Object> {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let id: ObjectId = name
        .parse()
        .map_err(|e| anyhow::anyhow!("{}: not an object directory: {e}", dir.display()))?;
    if !dir.is_dir() {
        bail!("{}: not an object directory", dir.display());
    }
    let path = dir.join(MANIFEST_FILE);
    let mut sealed = Vec::new();
    std::fs::File::open(&path)
        .and_then(|f| f.take(MAX_MANIFEST_BYTES).read_to_end(&mut sealed))
        .with_context(|| format!("object {id}: incomplete, cannot read {}", path.display()))?;
    let document = decrypt(&identities.0, &sealed, MAX_MANIFEST_BYTES)
        .map_err(|e| anyhow::anyhow!("object {id}: {}: {e}", path.display()))?;
    let manifest = Manifest::open(&document, trusted)
        .map_err(|e| anyhow::anyhow!("object {id}: {}: manifest {e}", path.display()))?;
    if manifest.id != id {
        bail!(
            "object {id}: {} belongs to object {} ({}): manifests were moved between objects",
            path.display(),
            manifest.id,
            manifest.path
        );
    }
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
        let file = entry.file_name();
        let file = file.to_string_lossy();
        let known = file == MANIFEST_FILE
            || (0..manifest.parts.len() as u32).any(|i| part_file_name(i) == file);
        if !known {
            bail!(
                "{} (object {id}): unexpected {} in the object directory (manifest lists {} parts)",
                manifest.path,
                entry.path().display(),
                manifest.parts.len()
            );
        }
    }
    Ok(Object {
        dir: dir.to_path_buf(),
        manifest,
    })
}
