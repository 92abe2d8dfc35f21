//! The inventory of a batch or an archive: the complete list of its objects, signed by the edge
//! and encrypted to the core like a manifest.
//!
//! A manifest proves that one object is what the edge sealed; only the inventory proves that a
//! set of objects is the whole set. Without it a relay (or anyone with access to an archive)
//! could drop an object, add one from another batch signed by the same edge, or offer an older
//! copy of one, and every remaining manifest would still verify. The core delivers a batch, and
//! `unpack` restores an archive, only when the verified objects match the inventory exactly.

use ed25519_dalek::VerifyingKey;
use serde::{Deserialize, Serialize};

use crate::keys::{check_site_name, EdgeKey, Recipients, TrustedEdges};
use crate::manifest::ManifestError;
use crate::manifest::{check_hex, open_document, sign_canonical, validate_path, Manifest, Opened};
use crate::object::ObjectId;

/// The `format` member of the inventories this forte writes: version 3, which names the site,
/// the batch instance, its sequence number in the edge's epoch, its seal time, and its place in
/// the batch's history (its generation and the instances it supersedes).
pub const INVENTORY_FORMAT: &str = "forte-inventory/3";

/// The `format` of version-2 inventories: site, instance, sequence and seal time, but no epoch
/// and no history. Still read; such an instance is ordered among a batch's by its seal time.
pub const INVENTORY_FORMAT_V2: &str = "forte-inventory/2";

/// The `format` of version-1 inventories, which name none of those. Still read: an archive
/// restores with a warning; a batch pulled from a relay only under a site whose keys are not
/// bound to sites (nothing in it proves its site), never recorded against replays.
pub const INVENTORY_FORMAT_V1: &str = "forte-inventory/1";

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
    epoch: &'a str,
    epoch_from: u64,
    format: &'a str,
    generation: u64,
    instance: &'a str,
    objects: Vec<CanonicalEntry<'a>>,
    sealed_at: i64,
    sequence: u64,
    site: &'a str,
    #[serde(skip_serializing_if = "<[Superseded]>::is_empty")]
    supersedes: &'a [Superseded],
}

/// An earlier instance of the same batch that this one replaces, as the edge recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Superseded {
    /// Its content digest ([`Inventory::content`]).
    pub content: String,
    /// Its instance id.
    pub instance: String,
    /// Its sequence number, in the same epoch: replaced, not dropped, so no gap.
    pub sequence: u64,
}

#[derive(Serialize)]
struct CanonicalEntry<'a> {
    id: ObjectId,
    path: &'a str,
    sha256: &'a str,
    size: u64,
}

/// Which batch instance an inventory seals, signed with it: the site it belongs to, an id of
/// its own, its place in the site's sequence of seals and when the edge sealed it, and its
/// place in the batch's own history. What the core files a batch under, how it tells a batch
/// from a replay of one it delivered, and how it orders two instances of one batch.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Instance {
    /// The site, as the edge's own configuration names it; empty for `forte pack`.
    pub site: String,
    /// 32 random hex digits, fresh for every seal of new content (a follow-up is a new one).
    pub id: String,
    /// The edge's sequence numbers: 32 random hex digits chosen at its catalogue's first seal.
    /// A catalogue replaced starts a new epoch, so its numbers never collide with the old ones.
    pub epoch: String,
    /// The first sequence number of the epoch (1 for a new catalogue).
    pub epoch_from: u64,
    /// The site's sequence number of this seal, from `epoch_from` (0 for `forte pack`).
    pub sequence: u64,
    /// When the edge sealed it, microseconds since the Unix epoch.
    pub sealed_at: i64,
    /// Its place in the batch's history within the epoch: 1 for the first instance, one more
    /// for each instance that supersedes the one before.
    pub generation: u64,
    /// The earlier instances of the batch in the epoch, oldest first (`generation` − 1 of them).
    pub supersedes: Vec<Superseded>,
}

impl Instance {
    /// A fresh first instance of `site` with its sequence number, sealed now, in an epoch of
    /// its own.
    pub fn new(site: &str, sequence: u64, sealed_at: i64) -> Self {
        Self {
            site: site.to_string(),
            id: crate::ObjectId::random().to_string(),
            epoch: crate::ObjectId::random().to_string(),
            epoch_from: sequence.min(1),
            sequence,
            sealed_at,
            generation: 1,
            supersedes: Vec::new(),
        }
    }
}

/// Every object of one batch (or archive), sorted by id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Inventory {
    pub format: String,
    /// The batch's name, as in its manifests; empty for `forte pack` without `--batch`.
    pub batch: String,
    /// The site the batch belongs to (version 2; empty in version 1 and for `forte pack`).
    #[serde(default)]
    pub site: String,
    /// The batch instance's id: 32 hex digits (version 2; empty in version 1).
    #[serde(default)]
    pub instance: String,
    /// The site's sequence number of this instance (version 2; 0 in version 1 and for pack).
    #[serde(default)]
    pub sequence: u64,
    /// When the edge sealed it, microseconds since the Unix epoch (version 2).
    #[serde(default)]
    pub sealed_at: i64,
    /// The epoch of `sequence` (version 3; empty before).
    #[serde(default)]
    pub epoch: String,
    /// The epoch's first sequence number (version 3; 0 before).
    #[serde(default)]
    pub epoch_from: u64,
    /// The instance's place in its batch's history (version 3; 0 before).
    #[serde(default)]
    pub generation: u64,
    /// The earlier instances it replaces, oldest first (version 3; empty before). Absent from
    /// the document when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supersedes: Vec<Superseded>,
    pub objects: Vec<InventoryEntry>,
    /// The key that signed it, once opened; never part of the document.
    #[serde(skip)]
    pub signer: Option<VerifyingKey>,
}

impl Inventory {
    pub fn new(batch: &str, instance: Instance, mut objects: Vec<InventoryEntry>) -> Self {
        objects.sort_by_key(|o| o.id);
        objects.dedup_by_key(|o| o.id);
        Self {
            format: INVENTORY_FORMAT.into(),
            batch: batch.to_string(),
            site: instance.site,
            instance: instance.id,
            sequence: instance.sequence,
            sealed_at: instance.sealed_at,
            epoch: instance.epoch,
            epoch_from: instance.epoch_from,
            generation: instance.generation,
            supersedes: instance.supersedes,
            objects,
            signer: None,
        }
    }

    /// A digest of its objects (SHA-256 over each id, size, hash and path, in id order): the
    /// same content, the same digest, whatever the instance.
    pub fn content(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for o in &self.objects {
            h.update(o.id.to_string());
            h.update(o.size.to_be_bytes());
            h.update(o.sha256.as_bytes());
            h.update((o.path.len() as u64).to_be_bytes());
            h.update(o.path.as_bytes());
        }
        hex::encode(h.finalize())
    }

    /// Whether it names its site and instance (version 2): only then can the core bind it to
    /// a site and tell it from a replay.
    pub fn names_its_instance(&self) -> bool {
        self.format != INVENTORY_FORMAT_V1
    }

    /// Whether it names its epoch and its place in the batch's history (version 3).
    pub fn names_its_history(&self) -> bool {
        self.format == INVENTORY_FORMAT
    }

    /// Sets which instance it seals: the site, id, sequence, seal time and history.
    pub fn set_instance(&mut self, instance: Instance) {
        self.site = instance.site;
        self.instance = instance.id;
        self.epoch = instance.epoch;
        self.epoch_from = instance.epoch_from;
        self.sequence = instance.sequence;
        self.sealed_at = instance.sealed_at;
        self.generation = instance.generation;
        self.supersedes = instance.supersedes;
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
            epoch: &self.epoch,
            epoch_from: self.epoch_from,
            format: &self.format,
            generation: self.generation,
            instance: &self.instance,
            sealed_at: self.sealed_at,
            sequence: self.sequence,
            site: &self.site,
            supersedes: &self.supersedes,
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
        // `site` and `supersedes` (when not empty) sort after `signature`: they end the
        // document.
        let mut after = b",\"site\":".to_vec();
        serde_json::to_writer(&mut after, &self.site).expect("a string serialises");
        if !self.supersedes.is_empty() {
            after.extend_from_slice(b",\"supersedes\":");
            serde_json::to_writer(&mut after, &self.supersedes).expect("a list serialises");
        }
        sign_canonical(message, SIGNING_CONTEXT, key, &after)
    }

    /// Parses a signed inventory (decrypted), checks its signature against the trusted edge
    /// keys and validates it. Whether its signer may sign for its site is the caller's to ask
    /// ([`TrustedEdges::may_sign_for`] with [`Inventory::signer`]): an archive has no site.
    pub fn open(document: &[u8], trusted: &TrustedEdges) -> Result<Self, ManifestError> {
        let formats = [INVENTORY_FORMAT, INVENTORY_FORMAT_V2, INVENTORY_FORMAT_V1];
        let Opened { value, signer } = open_document(document, &formats, SIGNING_CONTEXT, trusted)?;
        let mut inventory: Inventory =
            serde_json::from_value(value).map_err(|e| ManifestError::Invalid(e.to_string()))?;
        inventory.signer = Some(signer);
        if inventory.names_its_instance() {
            if !inventory.site.is_empty() {
                check_site_name(&inventory.site).map_err(ManifestError::Invalid)?;
            }
            inventory
                .instance
                .parse::<ObjectId>()
                .map_err(|e| ManifestError::Invalid(format!("instance: {e}")))?;
        } else if !inventory.site.is_empty() || !inventory.instance.is_empty() {
            return Err(ManifestError::Invalid(
                "a version-1 inventory names no site or instance".into(),
            ));
        }
        check_history(&inventory).map_err(ManifestError::Invalid)?;
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

/// A version-3 inventory's history must be one the edge could have written: an epoch id, a
/// generation one more than the instances it supersedes, each of them earlier in the same
/// epoch. Before version 3 it names none of these.
fn check_history(inventory: &Inventory) -> Result<(), String> {
    if !inventory.names_its_history() {
        let none = inventory.epoch.is_empty()
            && inventory.epoch_from == 0
            && inventory.generation == 0
            && inventory.supersedes.is_empty();
        return match none {
            true => Ok(()),
            false => Err(format!(
                "a {} inventory names no epoch or history",
                inventory.format
            )),
        };
    }
    inventory
        .epoch
        .parse::<ObjectId>()
        .map_err(|e| format!("epoch: {e}"))?;
    if inventory.generation != inventory.supersedes.len() as u64 + 1 {
        return Err(format!(
            "generation {} with {} superseded instance(s): it must be one more",
            inventory.generation,
            inventory.supersedes.len()
        ));
    }
    if inventory.sequence < inventory.epoch_from {
        return Err(format!(
            "sequence {} before its epoch's first, {}",
            inventory.sequence, inventory.epoch_from
        ));
    }
    for s in &inventory.supersedes {
        s.instance
            .parse::<ObjectId>()
            .map_err(|e| format!("superseded instance: {e}"))?;
        check_hex(&s.content, "superseded content")?;
        if s.instance == inventory.instance
            || s.sequence >= inventory.sequence
            || s.sequence < inventory.epoch_from
        {
            return Err(format!(
                "superseded instance {} (sequence {}) is not an earlier one of this epoch",
                s.instance, s.sequence
            ));
        }
    }
    Ok(())
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
            site(),
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

    fn site() -> Instance {
        Instance::new("mine-7", 12, 1_700_000_000_000_000)
    }

    /// What was signed, without the signer that opening adds.
    fn unsigned(inventory: Inventory) -> Inventory {
        Inventory {
            signer: None,
            ..inventory
        }
    }

    /// The same objects give the same digest whatever the instance; another object, path,
    /// size or hash another one.
    #[test]
    fn the_content_digest_follows_the_objects_only() {
        let (a, b) = (entry("a"), entry("b"));
        let one = Inventory::new("x", site(), vec![a.clone(), b.clone()]);
        let again = Inventory::new("y", Instance::new("z", 1, 2), vec![b.clone(), a.clone()]);
        assert_eq!(one.content(), again.content());
        assert_eq!(one.content().len(), 64);
        for other in [
            vec![a.clone()],
            vec![
                a.clone(),
                InventoryEntry {
                    size: 4,
                    ..b.clone()
                },
            ],
            vec![
                a.clone(),
                InventoryEntry {
                    path: "c".into(),
                    ..b.clone()
                },
            ],
            vec![
                a.clone(),
                InventoryEntry {
                    sha256: "cd".repeat(32),
                    ..b.clone()
                },
            ],
        ] {
            assert_ne!(Inventory::new("x", site(), other).content(), one.content());
        }
    }

    /// A bundle's inventory entries are its members, each with its own id; any other object
    /// is its own entry.
    #[test]
    fn a_bundle_is_listed_by_its_members() {
        let member = crate::member;
        let mut m = Manifest {
            format: crate::FORMAT.into(),
            id: ObjectId::random(),
            batch: String::new(),
            path: "f".into(),
            kind: crate::Kind::File,
            size: 3,
            mode: 0o644,
            mtime_s: 0,
            mtime_ns: 0,
            sha256: "cd".repeat(32),
            part_size: 8,
            parts: Vec::new(),
            members: Vec::new(),
            site: String::new(),
            batch_time: 0,
        };
        let own = InventoryEntry::of_files(&m);
        assert_eq!((own.len(), own[0].id), (1, m.id));
        m.kind = crate::Kind::Bundle;
        m.members = vec![member("x"), member("y/z")];
        let listed = InventoryEntry::of_files(&m);
        let ids: Vec<ObjectId> = listed.iter().map(|e| e.id).collect();
        assert_eq!(ids, [m.members[0].id, m.members[1].id]);
        assert_eq!(listed[1].path, "y/z");
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any bytes at all: an error, never a panic.
            #[test]
            fn arbitrary_bytes_are_refused(doc in proptest::collection::vec(any::<u8>(), 0..2048)) {
                let trusted = TrustedEdges::any_site(vec![key(1).0.verifying_key()]);
                prop_assert!(Inventory::open(&doc, &trusted).is_err());
            }

            /// A signed inventory with a byte flipped, cut or inserted anywhere: refused, or
            /// (if the change left the same JSON value) exactly what was signed, with its
            /// site, instance, sequence and seal time.
            #[test]
            fn mutated_inventories_are_refused(
                at in any::<prop::sample::Index>(),
                byte in any::<u8>(),
                how in 0..3u8,
            ) {
                let k = key(1);
                let trusted = TrustedEdges::any_site(vec![k.0.verifying_key()]);
                let inventory = Inventory::new("b", site(), vec![entry("a"), entry("b/c")]);
                let mut doc = inventory.sign(&k);
                crate::mutate(&mut doc, at, byte, how);
                if let Ok(opened) = Inventory::open(&doc, &trusted) {
                    prop_assert_eq!(unsigned(opened), inventory);
                }
            }

            /// Signed inventories naming any site: opened only if the name is one a relay
            /// would take for a directory (letters, digits, `.`, `_`, `-`, not `.` first).
            #[test]
            fn signed_hostile_site_names_are_refused(name in "[a-z./\\\x00 \"-]{0,10}|\\.\\.") {
                let k = key(1);
                let trusted = TrustedEdges::any_site(vec![k.0.verifying_key()]);
                let mut instance = site();
                instance.site = name.clone();
                let doc = Inventory::new("b", instance, vec![entry("a")]).sign(&k);
                if Inventory::open(&doc, &trusted).is_ok() {
                    prop_assert!(name.is_empty() || check_site_name(&name).is_ok(), "{:?}", name);
                    prop_assert!(!name.contains('/') && !name.starts_with('.'), "{:?}", name);
                }
            }

            /// Any `--trust` text parses to a site and a path or is refused, never panics; a
            /// site it names is a valid site name.
            #[test]
            fn trust_specs_parse_or_are_refused(text in "\\PC{0,40}") {
                if let Ok(spec) = text.parse::<crate::TrustSpec>() {
                    if let Some(site) = spec.site {
                        prop_assert!(check_site_name(&site).is_ok());
                    }
                }
            }
        }
    }

    #[test]
    fn the_site_instance_sequence_and_seal_time_are_signed() {
        let k = key(1);
        let trusted = TrustedEdges::any_site(vec![k.0.verifying_key()]);
        let inventory = Inventory::new("b", site(), vec![entry("a")]);
        let signed = String::from_utf8(inventory.sign(&k)).unwrap();
        let opened = Inventory::open(signed.as_bytes(), &trusted).unwrap();
        assert_eq!(opened.signer, Some(k.0.verifying_key()));
        assert_eq!(
            (opened.site.as_str(), opened.sequence, opened.sealed_at),
            ("mine-7", 12, 1_700_000_000_000_000)
        );
        assert_eq!(opened.instance, inventory.instance);
        let other_instance = ObjectId::random().to_string();
        for (from, to) in [
            ("\"site\":\"mine-7\"", "\"site\":\"mine-8\""),
            ("\"sequence\":12", "\"sequence\":13"),
            (
                "\"sealed_at\":1700000000000000",
                "\"sealed_at\":1700000000000001",
            ),
            (inventory.instance.as_str(), other_instance.as_str()),
        ] {
            let altered = signed.replace(from, to);
            assert_ne!(altered, signed, "{from}");
            assert!(
                matches!(
                    Inventory::open(altered.as_bytes(), &trusted),
                    Err(ManifestError::BadSignature)
                ),
                "{from} → {to}"
            );
        }
    }

    /// An instance that supersedes another: its epoch, generation and the instances it
    /// replaces are signed, and a history the edge could not have written is refused.
    fn second_generation() -> Inventory {
        let mut instance = site();
        instance.generation = 2;
        instance.supersedes = vec![Superseded {
            content: "ef".repeat(32),
            instance: ObjectId::random().to_string(),
            sequence: 11,
        }];
        Inventory::new("b", instance, vec![entry("a")])
    }

    #[test]
    fn the_epoch_generation_and_superseded_instances_are_signed() {
        let k = key(1);
        let trusted = TrustedEdges::any_site(vec![k.0.verifying_key()]);
        let inventory = second_generation();
        let signed = String::from_utf8(inventory.sign(&k)).unwrap();
        assert!(
            signed.ends_with("]}"),
            "supersedes ends the document: {signed}"
        );
        let opened = Inventory::open(signed.as_bytes(), &trusted).unwrap();
        assert!(opened.names_its_history());
        assert_eq!(unsigned(opened), inventory);
        let other = ObjectId::random().to_string();
        for (from, to) in [
            ("\"generation\":2", "\"generation\":3"),
            ("\"sequence\":11", "\"sequence\":10"),
            (inventory.epoch.as_str(), other.as_str()),
            (inventory.supersedes[0].instance.as_str(), other.as_str()),
        ] {
            let altered = signed.replace(from, to);
            assert_ne!(altered, signed, "{from}");
            assert!(
                matches!(
                    Inventory::open(altered.as_bytes(), &trusted),
                    Err(ManifestError::BadSignature)
                ),
                "{from} → {to}"
            );
        }
    }

    #[test]
    fn a_history_the_edge_could_not_have_written_is_refused() {
        let k = key(1);
        let trusted = TrustedEdges::any_site(vec![k.0.verifying_key()]);
        let good = second_generation();
        let mut wrong_generation = good.clone();
        wrong_generation.generation = 3;
        let mut later = good.clone();
        later.supersedes[0].sequence = 12;
        let mut itself = good.clone();
        itself.supersedes[0].instance = good.instance.clone();
        let mut superseded_before_epoch = good.clone();
        superseded_before_epoch.epoch_from = 12;
        let mut before_epoch = Inventory::new("b", site(), vec![entry("a")]);
        before_epoch.epoch_from = 13;
        let mut no_epoch = good.clone();
        no_epoch.epoch.clear();
        // A version-2 document naming any one member of a history is not one an edge wrote.
        let v2 = |change: fn(&mut Inventory)| {
            let mut v2 = Inventory::new("b", site(), vec![entry("a")]);
            v2.format = INVENTORY_FORMAT_V2.into();
            (v2.epoch, v2.epoch_from, v2.generation) = (String::new(), 0, 0);
            change(&mut v2);
            v2
        };
        for (why, forged) in [
            ("generation", wrong_generation),
            ("superseded later", later),
            ("supersedes itself", itself),
            ("superseded before its epoch", superseded_before_epoch),
            ("sequence before its epoch", before_epoch),
            ("no epoch", no_epoch),
            ("version 2 with an epoch", v2(|i| i.epoch = "0a".repeat(16))),
            ("version 2 with an epoch's start", v2(|i| i.epoch_from = 1)),
            ("version 2 with a generation", v2(|i| i.generation = 1)),
            (
                "version 2 with superseded instances",
                v2(|i| i.supersedes = second_generation().supersedes),
            ),
        ] {
            assert!(
                matches!(
                    Inventory::open(&sign(&forged, &k), &trusted),
                    Err(ManifestError::Invalid(_))
                ),
                "{why}"
            );
        }
    }

    /// The edge's own limits are taken: a superseded number at its epoch's first, a sequence
    /// at it; and setting an instance sets every member of it.
    #[test]
    fn a_history_at_its_epochs_first_number_opens() {
        let k = key(1);
        let trusted = TrustedEdges::any_site(vec![k.0.verifying_key()]);
        let mut at_first = second_generation();
        at_first.epoch_from = 11;
        let opened = Inventory::open(&sign(&at_first, &k), &trusted).unwrap();
        assert_eq!(unsigned(opened), at_first);
        let mut first = Inventory::new("b", site(), vec![entry("a")]);
        first.epoch_from = first.sequence;
        Inventory::open(&sign(&first, &k), &trusted).unwrap();
        let mut set = Inventory::new("b", Instance::default(), vec![entry("a")]);
        let wanted = second_generation();
        set.set_instance(Instance {
            site: wanted.site.clone(),
            id: wanted.instance.clone(),
            epoch: wanted.epoch.clone(),
            epoch_from: wanted.epoch_from,
            sequence: wanted.sequence,
            sealed_at: wanted.sealed_at,
            generation: wanted.generation,
            supersedes: wanted.supersedes.clone(),
        });
        set.objects = wanted.objects.clone();
        assert_eq!(set, wanted);
    }

    /// Batches sealed by an edge before version 3 still open, with no epoch or history.
    #[test]
    fn a_version_2_inventory_opens_without_a_history() {
        #[derive(Serialize)]
        struct V2<'a> {
            format: &'a str,
            batch: &'a str,
            site: &'a str,
            instance: &'a str,
            sequence: u64,
            sealed_at: i64,
            objects: Vec<InventoryEntry>,
        }
        let k = key(1);
        let trusted = TrustedEdges::any_site(vec![k.0.verifying_key()]);
        let instance = ObjectId::random().to_string();
        let v2 = V2 {
            format: INVENTORY_FORMAT_V2,
            batch: "b",
            site: "mine-7",
            instance: &instance,
            sequence: 4,
            sealed_at: 5,
            objects: vec![entry("a")],
        };
        let opened = Inventory::open(&sign_document(&v2, SIGNING_CONTEXT, &k), &trusted).unwrap();
        assert!(opened.names_its_instance() && !opened.names_its_history());
        assert_eq!(
            (opened.sequence, opened.generation, opened.epoch.as_str()),
            (4, 0, "")
        );
    }

    #[test]
    fn a_key_bound_to_a_site_may_sign_for_that_site_only() {
        let dir = tempfile::tempdir().unwrap();
        let paths = crate::keys::generate(dir.path()).unwrap();
        let spec = |text: String| text.parse::<crate::TrustSpec>().unwrap();
        let edge = EdgeKey::load(&paths.edge_key).unwrap().0.verifying_key();
        let bound = TrustedEdges::load(&[
            spec(format!("s1={}", paths.edge_pub.display())),
            spec(format!("s2={}", paths.edge_pub.display())),
        ])
        .unwrap();
        assert!(bound.may_sign_for(&edge, "s1") && bound.may_sign_for(&edge, "s2"));
        assert!(!bound.may_sign_for(&edge, "s3") && !bound.may_sign_for(&edge, ""));
        assert!(bound.unbound().is_empty());
        let any = TrustedEdges::load(&[spec(paths.edge_pub.display().to_string())]).unwrap();
        assert!(any.may_sign_for(&edge, "s3"));
        assert_eq!(any.unbound().len(), 1);
        let stranger = key(9).0.verifying_key();
        assert!(!any.may_sign_for(&stranger, "s1"));
        let bad = "../x=edge.pub".parse::<crate::TrustSpec>().unwrap();
        assert_eq!(bad.site, None, "a path with a slash before = is a path");
        assert!("bad site=edge.pub".parse::<crate::TrustSpec>().is_err());
    }

    /// Archives and batches sealed before version 2 still open, naming no site or instance.
    #[test]
    fn a_version_1_inventory_opens_and_names_no_instance() {
        #[derive(Serialize)]
        struct V1<'a> {
            format: &'a str,
            batch: &'a str,
            objects: Vec<InventoryEntry>,
        }
        let k = key(1);
        let trusted = TrustedEdges::any_site(vec![k.0.verifying_key()]);
        let v1 = V1 {
            format: INVENTORY_FORMAT_V1,
            batch: "b",
            objects: vec![entry("a")],
        };
        let opened = Inventory::open(&sign_document(&v1, SIGNING_CONTEXT, &k), &trusted).unwrap();
        assert!(!opened.names_its_instance());
        assert_eq!((opened.site.as_str(), opened.instance.as_str()), ("", ""));
        // A version-1 document claiming a site or an instance is not one this forte wrote.
        let mut forged = Inventory::new("b", site(), vec![entry("a")]);
        forged.format = INVENTORY_FORMAT_V1.into();
        let mut instance_only = forged.clone();
        instance_only.site.clear();
        let mut site_only = forged.clone();
        site_only.instance.clear();
        for forged in [forged, instance_only, site_only] {
            assert!(matches!(
                Inventory::open(&sign(&forged, &k), &trusted),
                Err(ManifestError::Invalid(_))
            ));
        }
    }

    #[test]
    fn a_signed_inventory_opens_only_with_a_trusted_key_and_unaltered() {
        let k = key(1);
        let trusted = TrustedEdges::any_site(vec![k.0.verifying_key()]);
        let inventory = Inventory::new("b", site(), vec![entry("a"), entry("b/c")]);
        let signed = sign(&inventory, &k);
        assert_eq!(
            unsigned(Inventory::open(&signed, &trusted).unwrap()),
            inventory
        );
        let other = TrustedEdges::any_site(vec![key(2).0.verifying_key()]);
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
        let inventory = Inventory::new("b", site(), vec![entry("a")]);
        let sealed = inventory.clone().seal(&k, &recipients);
        let document = crate::seal::decrypt(&[identity], &sealed, 1 << 20).unwrap();
        let trusted = TrustedEdges::any_site(vec![k.0.verifying_key()]);
        assert_eq!(
            unsigned(Inventory::open(&document, &trusted).unwrap()),
            inventory
        );
    }

    #[test]
    fn a_manifest_signature_is_not_an_inventory_signature() {
        // The same key signs both; the contexts differ, so neither passes for the other.
        let k = key(1);
        let trusted = TrustedEdges::any_site(vec![k.0.verifying_key()]);
        let inventory = Inventory::new("b", site(), vec![entry("a")]);
        let as_manifest = sign_document(&inventory, b"forte-object/1 manifest\n", &k);
        assert!(matches!(
            Inventory::open(&as_manifest, &trusted),
            Err(ManifestError::BadSignature)
        ));
    }

    #[test]
    fn differences_name_missing_injected_and_replayed_objects() {
        let (a, b, c) = (entry("a"), entry("b"), entry("c"));
        let inventory = Inventory::new("batch-1", site(), vec![a.clone(), b.clone()]);
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
        let trusted = TrustedEdges::any_site(vec![k.0.verifying_key()]);
        let mut inventory = Inventory::new("b", site(), vec![entry("a"), entry("b")]);
        inventory.objects.reverse();
        let signed = sign(&inventory, &k);
        assert!(matches!(
            Inventory::open(&signed, &trusted),
            Err(ManifestError::Invalid(_))
        ));
        let unsafe_path = Inventory::new("b", site(), vec![entry("../a")]);
        assert!(matches!(
            Inventory::open(&sign(&unsafe_path, &k), &trusted),
            Err(ManifestError::Invalid(_))
        ));
    }
}
