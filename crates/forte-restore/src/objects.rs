//! Opening the manifests of a source's objects: decrypt, verify the signature, match the id.

use anyhow::{bail, Result};
use forte_format::seal::decrypt;
use forte_format::{Identities, Inventory, Manifest, TrustedEdges};

use crate::object_source::{ObjectRef, ObjectSource};

/// Larger than the manifest of a 100 TiB file in 16 MiB parts; bounds what an untrusted
/// `manifest.age` can make us allocate before its signature is checked.
pub(crate) const MAX_MANIFEST_BYTES: u64 = 1 << 30;

/// Decrypts and verifies a sealed inventory (`inventory.age`): it must decrypt with the core's
/// identity and carry a valid signature of a trusted edge.
pub fn open_inventory(
    sealed: &[u8],
    identities: &Identities,
    trusted: &TrustedEdges,
) -> Result<Inventory> {
    let document = decrypt(&identities.0, sealed, MAX_MANIFEST_BYTES)
        .map_err(|e| anyhow::anyhow!("inventory.age: {e}"))?;
    Inventory::open(&document, trusted).map_err(|e| anyhow::anyhow!("inventory.age: inventory {e}"))
}

/// An object whose manifest decrypted, verified and matched its name.
#[derive(Debug)]
pub struct Object {
    pub at: ObjectRef,
    pub manifest: Manifest,
}

/// Opens every object of `source`. Fails listing every object that cannot be trusted; a
/// source with one bad object yields no objects at all.
pub fn open_objects(
    source: &dyn ObjectSource,
    identities: &Identities,
    trusted: &TrustedEdges,
) -> Result<Vec<Object>> {
    let mut objects = Vec::new();
    let mut errors = Vec::new();
    for at in source.list()? {
        match open_object(source, &at, identities, trusted) {
            Ok(manifest) => objects.push(Object { at, manifest }),
            Err(e) => errors.push(format!("object {} ({}): {e:#}", at.id, at.place)),
        }
    }
    if !errors.is_empty() {
        bail!(
            "nothing was restored; {} object(s) cannot be trusted:\n  {}",
            errors.len(),
            errors.join("\n  ")
        );
    }
    Ok(objects)
}

fn open_object(
    source: &dyn ObjectSource,
    at: &ObjectRef,
    identities: &Identities,
    trusted: &TrustedEdges,
) -> Result<Manifest> {
    let sealed = source.manifest(at, MAX_MANIFEST_BYTES)?;
    let document = decrypt(&identities.0, &sealed, MAX_MANIFEST_BYTES)
        .map_err(|e| anyhow::anyhow!("manifest.age: {e}"))?;
    let manifest = Manifest::open(&document, trusted)
        .map_err(|e| anyhow::anyhow!("manifest.age: manifest {e}"))?;
    if manifest.id != at.id {
        bail!(
            "manifest.age belongs to object {} ({}): manifests were moved between objects",
            manifest.id,
            manifest.path
        );
    }
    source
        .check(at, &manifest)
        .map_err(|e| anyhow::anyhow!("{} (object {}): {e:#}", manifest.path, at.id))?;
    Ok(manifest)
}
