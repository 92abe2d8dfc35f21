//! Opening the manifests of a source's objects: decrypt, verify the signature, match the id.

use anyhow::{bail, Result};
use forte_format::seal::decrypt;
use forte_format::{Identities, Inventory, Manifest, TrustedEdges};

use crate::object_source::{ObjectRef, ObjectSource};
use crate::outcome::{Problem, RestoreFailure};

/// The most bytes of a sealed manifest read or decrypted: its part entries take about 260 bytes
/// each, so this holds some 500 000 parts (an 8 TiB file in 16 MiB parts; larger files need
/// larger parts). It bounds what an untrusted `manifest.age` can make the core hold before
/// its signature is checked, [`MANIFESTS_AT_ONCE`] at a time: 1 GiB at most, where 1 GiB a
/// manifest let a relay hold 7 GB of the core's memory with eight grown manifests.
pub(crate) const MAX_MANIFEST_BYTES: u64 = 128 << 20;

/// The most bytes of a sealed inventory read or decrypted: some 1.5 million files in a batch.
pub(crate) const MAX_INVENTORY_BYTES: u64 = 256 << 20;

/// Decrypts and verifies a sealed inventory (`inventory.age`): it must decrypt with the core's
/// identity and carry a valid signature of a trusted edge.
pub fn open_inventory(
    sealed: &[u8],
    identities: &Identities,
    trusted: &TrustedEdges,
) -> Result<Inventory> {
    let document = decrypt(&identities.0, sealed, MAX_INVENTORY_BYTES)
        .map_err(|e| anyhow::anyhow!("inventory.age: {e}"))?;
    Inventory::open(&document, trusted).map_err(|e| anyhow::anyhow!("inventory.age: inventory {e}"))
}

/// An object whose manifest decrypted, verified and matched its name.
#[derive(Debug)]
pub struct Object {
    pub at: ObjectRef,
    pub manifest: Manifest,
}

/// Manifests read and opened at the same time: from a relay each is a request that waits a
/// round trip (and on a bucket relay two bucket requests), which one after another kept a pull
/// of 149 objects from a bucket relay waiting most of a second on loopback.
const MANIFESTS_AT_ONCE: usize = 8;

/// Opens every object of `source`, [`MANIFESTS_AT_ONCE`] at a time. Fails listing every
/// object that cannot be trusted; a source with one bad object yields no objects at all.
pub fn open_objects(
    source: &dyn ObjectSource,
    identities: &Identities,
    trusted: &TrustedEdges,
) -> Result<Vec<Object>> {
    let listed = source.list()?;
    let per_thread = listed.len().div_ceil(MANIFESTS_AT_ONCE).max(1);
    let opened: Vec<Result<Manifest, Opening>> = std::thread::scope(|s| {
        let threads: Vec<_> = listed
            .chunks(per_thread)
            .map(|some| {
                s.spawn(move || {
                    some.iter()
                        .map(|at| open_object(source, at, identities, trusted))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().expect("opening manifests panicked"))
            .collect()
    });
    let mut objects = Vec::new();
    let mut problems = Vec::new();
    for (at, opened) in listed.into_iter().zip(opened) {
        match opened {
            Ok(manifest) => objects.push(Object { at, manifest }),
            Err(Opening { damaged, error }) => problems.push(Problem {
                object: at.id,
                part: None,
                damaged,
                message: format!("object {} ({}): {error:#}", at.id, at.place),
            }),
        }
    }
    if !problems.is_empty() {
        return Err(UntrustedObjects(RestoreFailure { problems }).into());
    }
    Ok(objects)
}

/// Why an object's manifest could not be opened: it could not be read, or what was read is not
/// what the edge sealed (`damaged`: it does not decrypt, verify or name its object).
struct Opening {
    damaged: bool,
    error: anyhow::Error,
}

/// Objects whose manifests cannot be trusted: nothing of the set is restored. A
/// [`RestoreFailure`] whose problems name each object (no part), damaged or unreadable.
#[derive(Debug)]
pub struct UntrustedObjects(pub RestoreFailure);

impl std::fmt::Display for UntrustedObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "nothing was restored; {} object(s) cannot be trusted:",
            self.0.problems.len()
        )?;
        for p in &self.0.problems {
            write!(f, "\n  {}", p.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for UntrustedObjects {}

fn open_object(
    source: &dyn ObjectSource,
    at: &ObjectRef,
    identities: &Identities,
    trusted: &TrustedEdges,
) -> Result<Manifest, Opening> {
    let sealed = source
        .manifest(at, MAX_MANIFEST_BYTES)
        .map_err(|error| Opening {
            damaged: false,
            error,
        })?;
    check_manifest(at, &sealed, identities, trusted)
        .and_then(|manifest| {
            source
                .check(at, &manifest)
                .map_err(|e| anyhow::anyhow!("{} (object {}): {e:#}", manifest.path, at.id))?;
            Ok(manifest)
        })
        .map_err(|error| Opening {
            damaged: true,
            error,
        })
}

/// Decrypts and verifies one sealed manifest, which must name the object it was found as.
fn check_manifest(
    at: &ObjectRef,
    sealed: &[u8],
    identities: &Identities,
    trusted: &TrustedEdges,
) -> Result<Manifest> {
    let document = decrypt(&identities.0, sealed, MAX_MANIFEST_BYTES)
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
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use forte_format::ObjectId;

    use super::*;
    use crate::object_source::PartError;

    /// A source whose manifests are slow to come: each request waits (up to a second) for
    /// another to be in flight beside it, and counts the most seen at once.
    #[derive(Default)]
    struct SlowManifests {
        in_flight: AtomicUsize,
        most: AtomicUsize,
    }

    impl ObjectSource for SlowManifests {
        fn list(&self) -> Result<Vec<ObjectRef>> {
            let at = |_| ObjectRef {
                id: ObjectId::random(),
                place: "test".into(),
            };
            Ok((0..4).map(at).collect())
        }

        fn manifest(&self, _object: &ObjectRef, _max_len: u64) -> Result<Vec<u8>> {
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(1);
            while self.most.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            bail!("not a manifest")
        }

        fn part(&self, _: &ObjectRef, _: u32, _: u64) -> Result<Vec<u8>, PartError> {
            unreachable!("no part is read before the manifests are open")
        }

        fn inventory(&self, _max_len: u64) -> Result<Option<Vec<u8>>> {
            Ok(None)
        }
    }

    #[test]
    fn manifests_are_read_several_at_once_and_every_bad_one_is_named() {
        let source = SlowManifests::default();
        let identities = Identities(Vec::new());
        let err = open_objects(&source, &identities, &TrustedEdges::default()).unwrap_err();
        assert!(
            source.most.load(Ordering::SeqCst) >= 2,
            "one manifest at a time"
        );
        let text = format!("{err:#}");
        assert!(text.contains("4 object(s) cannot be trusted"), "{text}");
        assert_eq!(text.matches("not a manifest").count(), 4, "{text}");
    }
}
