//! The inventory of a batch or an archive: the complete list of its objects, signed by the edge
//! and encrypted to the core like a manifest.
//!
//! A manifest proves that one object is what the edge sealed; only the inventory proves that a
//! set of objects is the whole set. Without it a relay (or anyone with access to an archive)
//! could drop an object, add one from another batch signed by the same edge, or offer an older
//! copy of one, and every remaining manifest would still verify. The core delivers a batch, and
//! `unpack` restores an archive, only when the verified objects match the inventory exactly.

use serde::{Deserialize, Serialize};

use crate::keys::{EdgeKey, Recipients, TrustedEdges};
use crate::manifest::ManifestError;
use crate::manifest::{check_hex, open_document, sign_canonical, validate_path, Manifest};
use crate::object::ObjectId;

/// The value of every inventory's `format` member.
pub const INVENTORY_FORMAT: &str = "forte-inventory/1";

/// The inventory's file name at the root of an archive (`forte pack --to DIR`).
pub const INVENTORY_FILE: &str = "inventory.age";

/// Prefixed to the canonical JSON before signing: an inventory's signature can never be taken
/// for a manifest's, nor the other way round.
const SIGNING_CONTEXT: &[u8] = b"forte-inventory/1\n";

/// One object of the set, as its manifest describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InventoryEntry {
    pub id: ObjectId,
    pub path: String,
    pub size: u64,
    /// The whole file's raw SHA-256, as in its manifest.
    pub sha256: String,
}

impl InventoryEntry {
    pub fn of(manifest: &Manifest) -> Self {
        Self {
            id: manifest.id,
            path: manifest.path.clone(),
            size: manifest.size,
            sha256: manifest.sha256.clone(),
        }
    }

    /// The entries of what an object delivers ([`Manifest::files`]): itself, or each member of
    /// a bundle, without building a manifest per member.
    pub fn of_files(manifest: &Manifest) -> Vec<Self> {
        if manifest.kind != crate::Kind::Bundle {
            return vec![Self::of(manifest)];
        }
        let entry = |m: &crate::bundle::Member| Self {
            id: m.id,
            path: m.path.clone(),
            size: m.size,
            sha256: m.sha256.clone(),
        };
        manifest.members.iter().map(entry).collect()
    }
}

/// An inventory's members in sorted key order: serde_json writes this struct as RFC 8785
/// canonical JSON (its keys sorted, no white space, integers only).
#[derive(Serialize)]
struct Canonical<'a> {
    batch: &'a str,
    format: &'a str,
    objects: Vec<CanonicalEntry<'a>>,
}

#[derive(Serialize)]
struct CanonicalEntry<'a> {
    id: ObjectId,
    path: &'a str,
    sha256: &'a str,
    size: u64,
}

/// Every object of one batch (or archive), sorted by id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Inventory {
    pub format: String,
    /// The batch's name, as in its manifests; empty for `forte pack` without `--batch`.
    pub batch: String,
    pub objects: Vec<InventoryEntry>,
}

impl Inventory {
    pub fn new(batch: &str, mut objects: Vec<InventoryEntry>) -> Self {
        objects.sort_by_key(|o| o.id);
        objects.dedup_by_key(|o| o.id);
        Self {
            format: INVENTORY_FORMAT.into(),
            batch: batch.to_string(),
            objects,
        }
    }

    /// Signed with the edge's key, then encrypted to the core: what is stored beside the
    /// objects (`inventory.age`). The relay sees only its length. Consumed, so that the list
    /// is gone before the encrypted copy is made.
    pub fn seal(self, key: &EdgeKey, recipients: &Recipients) -> Vec<u8> {
        let signed = self.sign(key);
        drop(self);
        let mut sealed = Vec::with_capacity(crate::seal::encrypted_len(signed.len()));
        crate::seal::encrypt(&recipients.0, &signed, &mut sealed);
        sealed
    }

    /// The signed, canonical JSON document, as [`sign_document`] writes it, without the JSON
    /// tree it builds (about 1 kB per object).
    fn sign(&self, key: &EdgeKey) -> Vec<u8> {
        let canonical = Canonical {
            batch: &self.batch,
            format: &self.format,
            objects: self
                .objects
                .iter()
                .map(|o| CanonicalEntry {
                    id: o.id,
                    path: &o.path,
                    sha256: &o.sha256,
                    size: o.size,
                })
                .collect(),
        };
        // Room for the whole message at once: growing it would copy it, doubling its size.
        let members: usize = self.objects.iter().map(|o| o.path.len() + 160).sum();
        let mut message = Vec::with_capacity(SIGNING_CONTEXT.len() + members + 1024);
        message.extend_from_slice(SIGNING_CONTEXT);
        serde_json::to_writer(&mut message, &canonical).expect("an inventory always serialises");
        sign_canonical(message, SIGNING_CONTEXT, key)
    }

    /// Parses a signed inventory (decrypted), checks its signature against the trusted edge
    /// keys and validates it.
    pub fn open(document: &[u8], trusted: &TrustedEdges) -> Result<Self, ManifestError> {
        let value = open_document(document, &[INVENTORY_FORMAT], SIGNING_CONTEXT, trusted)?;
        let inventory: Inventory =
            serde_json::from_value(value).map_err(|e| ManifestError::Invalid(e.to_string()))?;
        for o in &inventory.objects {
            validate_path(&o.path).map_err(ManifestError::Invalid)?;
            check_hex(&o.sha256, "sha256").map_err(ManifestError::Invalid)?;
        }
        if inventory.objects.windows(2).any(|w| w[0].id >= w[1].id) {
            return Err(ManifestError::Invalid(
                "objects are not sorted by id, or one is listed twice".into(),
            ));
        }
        Ok(inventory)
    }

    /// Compares the objects present (each from its verified manifest) with this inventory.
    /// Returns one message per difference, naming the object and its path: listed but missing,
    /// present but not listed (injected, or from another batch or archive), or present with
    /// another path, size or hash than listed (an older copy replayed). Empty when they match.
    pub fn differences<'a>(
        &self,
        present: impl IntoIterator<Item = &'a InventoryEntry>,
    ) -> Vec<(ObjectId, String)> {
        let mut problems = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for p in present {
            if !seen.insert(p.id) {
                continue;
            }
            match self.objects.binary_search_by_key(&p.id, |o| o.id) {
                Err(_) => problems.push((p.id, format!(
                    "object {} ({}) is not in the signed inventory of batch {:?}: injected, or from another batch or archive",
                    p.id, p.path, self.batch
                ))),
                Ok(i) if self.objects[i] != *p => {
                    let listed = &self.objects[i];
                    problems.push((p.id, format!(
                        "object {} ({}) differs from the signed inventory of batch {:?} (listed: {} of {} bytes, SHA-256 {}; present: {} of {} bytes, SHA-256 {}): an older copy replayed",
                        p.id, p.path, self.batch, listed.path, listed.size, listed.sha256, p.path, p.size, p.sha256
                    )))
                }
                Ok(_) => {}
            }
        }
        for o in self.objects.iter().filter(|o| !seen.contains(&o.id)) {
            problems.push((o.id, format!(
                "object {} ({}, {} bytes) is listed in the signed inventory of batch {:?} but missing: dropped on the way",
                o.id, o.path, o.size, self.batch
            )));
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::sign_document;
    use ed25519_dalek::SigningKey;

    fn key(seed: u8) -> EdgeKey {
        EdgeKey(SigningKey::from_bytes(&[seed; 32]))
    }

    #[test]
    fn the_signed_document_is_byte_for_byte_the_generic_signers() {
        let inventory = Inventory::new(
            "batch \"quoted\" ünï/\u{1}",
            vec![
                entry("a/b.txt"),
                entry("ü \\ \"x\".bin"),
                entry("tab\there"),
            ],
        );
        let k = key(3);
        let generic = sign_document(&inventory, SIGNING_CONTEXT, &k);
        assert_eq!(
            String::from_utf8(inventory.sign(&k)).unwrap(),
            String::from_utf8(generic).unwrap()
        );
    }

    fn entry(path: &str) -> InventoryEntry {
        InventoryEntry {
            id: ObjectId::random(),
            path: path.into(),
            size: 3,
            sha256: "ab".repeat(32),
        }
    }

    fn sign(inventory: &Inventory, k: &EdgeKey) -> Vec<u8> {
        sign_document(inventory, SIGNING_CONTEXT, k)
    }

    #[test]
    fn a_signed_inventory_opens_only_with_a_trusted_key_and_unaltered() {
        let k = key(1);
        let trusted = TrustedEdges(vec![k.0.verifying_key()]);
        let inventory = Inventory::new("b", vec![entry("a"), entry("b/c")]);
        let signed = sign(&inventory, &k);
        assert_eq!(Inventory::open(&signed, &trusted).unwrap(), inventory);
        let other = TrustedEdges(vec![key(2).0.verifying_key()]);
        assert!(matches!(
            Inventory::open(&signed, &other),
            Err(ManifestError::UntrustedSigner(_))
        ));
        let altered = String::from_utf8(signed)
            .unwrap()
            .replace("\"b/c\"", "\"b/d\"");
        assert!(matches!(
            Inventory::open(altered.as_bytes(), &trusted),
            Err(ManifestError::BadSignature)
        ));
    }

    #[test]
    fn a_sealed_inventory_decrypts_to_the_signed_document() {
        let k = key(1);
        let identity = age::x25519::Identity::generate();
        let recipients = Recipients(vec![identity.to_public()]);
        let inventory = Inventory::new("b", vec![entry("a")]);
        let sealed = inventory.clone().seal(&k, &recipients);
        let document = crate::seal::decrypt(&[identity], &sealed, 1 << 20).unwrap();
        let trusted = TrustedEdges(vec![k.0.verifying_key()]);
        assert_eq!(Inventory::open(&document, &trusted).unwrap(), inventory);
    }

    #[test]
    fn a_manifest_signature_is_not_an_inventory_signature() {
        // The same key signs both; the contexts differ, so neither passes for the other.
        let k = key(1);
        let trusted = TrustedEdges(vec![k.0.verifying_key()]);
        let inventory = Inventory::new("b", vec![entry("a")]);
        let as_manifest = sign_document(&inventory, b"forte-object/1 manifest\n", &k);
        assert!(matches!(
            Inventory::open(&as_manifest, &trusted),
            Err(ManifestError::BadSignature)
        ));
    }

    #[test]
    fn differences_name_missing_injected_and_replayed_objects() {
        let (a, b, c) = (entry("a"), entry("b"), entry("c"));
        let inventory = Inventory::new("batch-1", vec![a.clone(), b.clone()]);
        assert!(inventory.differences([&a, &b]).is_empty());
        assert!(inventory.differences([&b, &a, &a]).is_empty());

        let missing = inventory.differences([&a]);
        assert_eq!(missing.len(), 1);
        assert!(
            missing[0].0 == b.id && missing[0].1.contains("missing"),
            "{missing:?}"
        );

        let injected = inventory.differences([&a, &b, &c]);
        assert_eq!(injected.len(), 1);
        assert!(
            injected[0].0 == c.id && injected[0].1.contains("not in the signed inventory"),
            "{injected:?}"
        );

        let mut older = b.clone();
        older.sha256 = "cd".repeat(32);
        let replayed = inventory.differences([&a, &older]);
        assert_eq!(replayed.len(), 1);
        assert!(replayed[0].1.contains("replayed"), "{replayed:?}");
        for field in [
            InventoryEntry {
                size: 4,
                ..b.clone()
            },
            InventoryEntry {
                path: "x".into(),
                ..b.clone()
            },
        ] {
            assert_eq!(inventory.differences([&a, &field]).len(), 1);
        }
    }

    #[test]
    fn unsorted_or_unsafe_inventories_are_refused() {
        let k = key(1);
        let trusted = TrustedEdges(vec![k.0.verifying_key()]);
        let mut inventory = Inventory::new("b", vec![entry("a"), entry("b")]);
        inventory.objects.reverse();
        let signed = sign(&inventory, &k);
        assert!(matches!(
            Inventory::open(&signed, &trusted),
            Err(ManifestError::Invalid(_))
        ));
        let unsafe_path = Inventory::new("b", vec![entry("../a")]);
        assert!(matches!(
            Inventory::open(&sign(&unsafe_path, &k), &trusted),
            Err(ManifestError::Invalid(_))
        ));
    }
}
