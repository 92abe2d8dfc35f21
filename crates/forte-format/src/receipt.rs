//! The custody receipt: the core's signed word that it delivered a batch instance and keeps
//! it durably, file by file. The edge deletes a source file only under a receipt that verifies
//! with a core key it trusts (`receipt.pub`) and lists the file with the SHA-256 its bytes still
//! have, so the relay's word alone never deletes anything.
//!
//! A receipt crosses the relay in the clear (the edge has no key to decrypt with), so it names
//! files by their object ids, sizes and SHA-256, never by path: the relay learns no more than
//! it already holds. The edge maps ids to paths from its own catalogue; an auditor with the
//! edge's records and `receipt.pub` checks the chain of custody without trusting the core's
//! catalogue (`forte receipts`).

use ed25519_dalek::VerifyingKey;
use serde::{Deserialize, Serialize};

use crate::keys::{check_site_name, EdgeKey, TrustedCores};
use crate::manifest::{check_hex, open_signed, sign_document, ManifestError, Opened};
use crate::object::ObjectId;

/// The value of every receipt's `format` member.
pub const RECEIPT_FORMAT: &str = "forte-receipt/1";

/// Prefixed to the canonical JSON before signing: a receipt's signature can never be taken
/// for a manifest's or an inventory's (the core's key signs nothing else, but the context
/// makes that hold even for a key used twice).
const SIGNING_CONTEXT: &[u8] = b"forte-receipt/1\n";

/// How the core keeps the batch: promoted to its destination, or quarantined by a site task
/// (kept with the reason). Either way it holds durably every file the receipt lists; a
/// quarantined batch's receipt lists only the files the quarantine holds as verified (a task
/// may have changed others). Or refused: a later version of a batch whose earlier files the
/// core keeps instead (`pull.on_changed = "keep-first"`); it lists no file, so nothing is
/// deleted on its word, and the edge reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Delivered,
    Quarantined,
    Refused,
}

/// One file as the core verified and keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiptFile {
    /// The file's object id (a bundle member's own id), as in the edge's catalogue.
    pub id: ObjectId,
    pub size: u64,
    /// The raw SHA-256 the core verified, lower-case hex.
    pub sha256: String,
}

/// The core's signed statement about one delivered batch instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Receipt {
    pub format: String,
    /// The site, from the edge's signed inventory.
    pub site: String,
    /// The batch instance (the inventory's `instance`) and its sequence number at the site.
    pub instance: String,
    pub sequence: u64,
    pub outcome: Outcome,
    /// Every file of the instance, sorted by id.
    pub files: Vec<ReceiptFile>,
    /// Where the core keeps it: its destination (a directory or a bucket URL).
    pub destination: String,
    /// The core worker that delivered it.
    pub worker: String,
    /// When it was kept, microseconds since the Unix epoch.
    pub delivered_at: i64,
    /// The key that signed it, once opened; never part of the document.
    #[serde(skip)]
    pub signer: Option<VerifyingKey>,
}

impl Receipt {
    /// A receipt over `files` (sorted here).
    pub fn new(
        (site, instance, sequence): (&str, &str, u64),
        outcome: Outcome,
        mut files: Vec<ReceiptFile>,
        (destination, worker): (&str, &str),
        delivered_at: i64,
    ) -> Self {
        files.sort_by_key(|f| f.id);
        files.dedup_by_key(|f| f.id);
        Self {
            format: RECEIPT_FORMAT.into(),
            site: site.into(),
            instance: instance.into(),
            sequence,
            outcome,
            files,
            destination: destination.into(),
            worker: worker.into(),
            delivered_at,
            signer: None,
        }
    }

    /// The signed, canonical JSON document.
    pub fn sign(&self, key: &EdgeKey) -> Vec<u8> {
        sign_document(self, SIGNING_CONTEXT, key)
    }

    /// Parses a signed receipt, checks its signature against the trusted core keys and
    /// validates it. Nothing of an unverified receipt is returned.
    /// Whoever reads a receipt from the relay bounds it first (the client's JSON answers).
    pub fn open(document: &[u8], trusted: &TrustedCores) -> Result<Self, ManifestError> {
        let opened = open_signed(document, &[RECEIPT_FORMAT], SIGNING_CONTEXT, |k| {
            trusted.trusts(k)
        })
        .map_err(|e| match e {
            ManifestError::UntrustedSigner(key) => ManifestError::Invalid(format!(
                "signed by core key {key}, which is not among the trusted receipt keys (--receipt-pub)"
            )),
            e => e,
        })?;
        let Opened { value, signer } = opened;
        let mut receipt: Receipt =
            serde_json::from_value(value).map_err(|e| ManifestError::Invalid(e.to_string()))?;
        receipt.signer = Some(signer);
        check_site_name(&receipt.site).map_err(ManifestError::Invalid)?;
        receipt
            .instance
            .parse::<ObjectId>()
            .map_err(|e| ManifestError::Invalid(format!("instance: {e}")))?;
        for f in &receipt.files {
            check_hex(&f.sha256, "sha256").map_err(ManifestError::Invalid)?;
        }
        if receipt.files.windows(2).any(|w| w[0].id >= w[1].id) {
            return Err(ManifestError::Invalid(
                "files are not sorted by id, or one is listed twice".into(),
            ));
        }
        Ok(receipt)
    }

    /// The file with `id`, if the receipt lists it.
    pub fn file(&self, id: ObjectId) -> Option<&ReceiptFile> {
        self.files
            .binary_search_by_key(&id, |f| f.id)
            .ok()
            .map(|i| &self.files[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;

    fn key(seed: u8) -> EdgeKey {
        EdgeKey(SigningKey::from_bytes(&[seed; 32]))
    }

    fn receipt() -> Receipt {
        let files = vec![
            ReceiptFile {
                id: ObjectId::random(),
                size: 3,
                sha256: "ab".repeat(32),
            },
            ReceiptFile {
                id: ObjectId::random(),
                size: 0,
                sha256: "cd".repeat(32),
            },
        ];
        let instance = ObjectId::random().to_string();
        Receipt::new(
            ("mine-7", &instance, 4),
            Outcome::Delivered,
            files,
            ("/archive", "core-1:42"),
            1_700_000_000_000_000,
        )
    }

    #[test]
    fn a_receipt_opens_only_with_a_trusted_core_key_and_unaltered() {
        let (core, other) = (key(1), key(2));
        let r = receipt();
        let signed = r.sign(&core);
        let trusted = TrustedCores(vec![core.0.verifying_key()]);
        let opened = Receipt::open(&signed, &trusted).unwrap();
        assert_eq!(opened.signer, Some(core.0.verifying_key()));
        assert_eq!(
            Receipt {
                signer: None,
                ..opened.clone()
            },
            r
        );
        assert!(opened.file(r.files[0].id).is_some());
        assert!(opened.file(ObjectId::random()).is_none());

        let untrusted = TrustedCores(vec![other.0.verifying_key()]);
        let e = Receipt::open(&signed, &untrusted).unwrap_err().to_string();
        assert!(e.contains("not among the trusted receipt keys"), "{e}");

        let text = String::from_utf8(signed).unwrap();
        for (from, to) in [
            ("mine-7", "mine-8"),
            ("\"sequence\":4", "\"sequence\":5"),
            (&"ab".repeat(32), &"ef".repeat(32)),
            ("delivered\"", "quarantined\""),
        ] {
            let altered = text.replace(from, to);
            assert_ne!(altered, text);
            assert!(
                matches!(
                    Receipt::open(altered.as_bytes(), &trusted),
                    Err(ManifestError::BadSignature)
                ),
                "{from} → {to}"
            );
        }
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any bytes at all: an error, never a panic.
            #[test]
            fn arbitrary_bytes_are_refused(doc in proptest::collection::vec(any::<u8>(), 0..2048)) {
                let trusted = TrustedCores(vec![key(1).0.verifying_key()]);
                prop_assert!(Receipt::open(&doc, &trusted).is_err());
            }

            /// A signed receipt with a byte flipped, cut or inserted anywhere: refused, or (if
            /// the change left the same JSON value) exactly what was signed.
            #[test]
            fn mutated_receipts_are_refused(
                at in any::<prop::sample::Index>(),
                byte in any::<u8>(),
                how in 0..3u8,
            ) {
                let k = key(1);
                let trusted = TrustedCores(vec![k.0.verifying_key()]);
                let r = receipt();
                let mut doc = r.sign(&k);
                crate::mutate(&mut doc, at, byte, how);
                if let Ok(opened) = Receipt::open(&doc, &trusted) {
                    prop_assert_eq!(Receipt { signer: None, ..opened }, r);
                }
            }
        }
    }

    #[test]
    fn the_core_trusts_the_receipt_key_keygen_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let paths = crate::keys::generate(dir.path()).unwrap();
        let core = EdgeKey::load(&paths.receipt_key).unwrap();
        let trusted = TrustedCores::load(std::slice::from_ref(&paths.receipt_pub)).unwrap();
        assert!(trusted.trusts(&core.0.verifying_key()));
        assert!(Receipt::open(&receipt().sign(&core), &trusted).is_ok());
        let edge = EdgeKey::load(&paths.edge_key).unwrap();
        assert!(
            !trusted.trusts(&edge.0.verifying_key()),
            "the edge's key is another"
        );
        let e = TrustedCores::load(std::slice::from_ref(&paths.core_pub)).unwrap_err();
        assert!(e.to_string().contains("receipt.pub"), "{e}");
    }

    #[test]
    fn an_edge_signature_is_not_a_receipt_signature() {
        // The same key signs an inventory-shaped document; the contexts differ.
        let k = key(1);
        let r = receipt();
        let as_inventory = sign_document(&r, b"forte-inventory/1\n", &k);
        let trusted = TrustedCores(vec![k.0.verifying_key()]);
        assert!(matches!(
            Receipt::open(&as_inventory, &trusted),
            Err(ManifestError::BadSignature)
        ));
    }
}
