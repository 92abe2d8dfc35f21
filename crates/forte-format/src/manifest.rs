//! The per-file manifest: what it holds, its canonical JSON form, and its signature.
//!
//! The signed bytes are a context string followed by the manifest's canonical JSON (RFC 8785
//! style: object keys sorted, no white space, integers only) without its `signature` member.
//! Verification re-derives those bytes from the parsed document, so a reader in any language
//! with a JCS library can check a signature without our code.

use base64::Engine;
use ed25519_dalek::{Signature, Signer, VerifyingKey};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::bundle::{validate_members, Member};
use crate::keys::{edge_key_id, EdgeKey, TrustedEdges};
use crate::object::ObjectId;

/// The `format` member of the manifests this forte writes, for every kind: version 4, which
/// names the site the object was sealed for and the time its batch arrived at the edge, so that
/// nothing the core files it under comes from the relay's records.
pub const FORMAT: &str = "forte-object/4";

/// The `format` of version-1 manifests, written before inventories existed. They are still
/// read; a set of them restores with a warning that nothing proves it complete.
pub const FORMAT_V1: &str = "forte-object/1";

/// The `format` of version-2 manifests (files and directories, always listed in a signed
/// inventory of their batch or archive, [`crate::Inventory`]), still read.
pub const FORMAT_V2: &str = "forte-object/2";

/// The `format` of a version-3 manifest: a bundle ([`Kind::Bundle`]) before version 4, still
/// read.
pub const FORMAT_V3: &str = "forte-object/3";

/// Prefixed to the canonical JSON before signing, so an edge key's signature over a manifest
/// can never be taken for a signature over anything else (an inventory has its own context).
/// Unchanged in version 2: the signed `format` member tells the versions apart.
const SIGNING_CONTEXT: &[u8] = b"forte-object/1 manifest\n";

/// The only codec of format v1.
pub const CODEC_ZSTD: &str = "zstd";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    File,
    /// A directory, recorded so that empty directories survive the trip. It has no parts.
    Dir,
    /// Many small files in one tar stream of one part ([`crate::bundle`]); `members` lists them.
    Bundle,
}

/// One part: a slice of the file's raw bytes, compressed as one zstd frame and encrypted as one
/// age file named `part-NNNNNN.zst.age`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartEntry {
    pub index: u32,
    pub raw_offset: u64,
    pub raw_length: u64,
    pub raw_sha256: String,
    pub ciphertext_length: u64,
    pub ciphertext_sha256: String,
    pub codec: String,
    pub level: i32,
}

/// Everything the core needs to restore and verify one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub id: ObjectId,
    /// The batch the file belongs to; empty for `forte pack`.
    pub batch: String,
    /// Relative path, `/`-separated, validated by [`validate_path`].
    pub path: String,
    pub kind: Kind,
    pub size: u64,
    /// Unix permission bits (`mode & 0o777`).
    pub mode: u32,
    /// Modification time: seconds since the Unix epoch and the nanoseconds within.
    pub mtime_s: i64,
    pub mtime_ns: u32,
    /// SHA-256 of the whole file's raw bytes, lower-case hex.
    pub sha256: String,
    pub part_size: u64,
    pub parts: Vec<PartEntry>,
    /// A bundle's files, in the order of their data in its stream; empty for other kinds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<Member>,
    /// The site the object was sealed for (format 4; empty for `forte pack`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub site: String,
    /// When its batch arrived at the edge (its ready marker's time), seconds since the Unix
    /// epoch (format 4; 0 for `forte pack`): the time the core's layout files it under.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub batch_time: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// Why a manifest was refused.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("is not a JSON object: {0}")]
    NotJson(String),
    #[error("has format {0:?}; this forte reads {FORMAT:?}, {FORMAT_V3:?}, {FORMAT_V2:?} and {FORMAT_V1:?} only")]
    UnsupportedFormat(String),
    #[error("has no valid signature member: {0}")]
    Unsigned(String),
    #[error("signature does not verify: the manifest was altered or signed by another key")]
    BadSignature,
    #[error("is signed by edge key {0}, which is not among the trusted edge keys (--trust)")]
    UntrustedSigner(String),
    #[error("is malformed: {0}")]
    Invalid(String),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignatureMember {
    alg: String,
    key: String,
    sig: String,
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// The canonical bytes of a JSON value: serde_json's map is ordered by key and its compact
/// output has no white space, which together with integer-only numbers is RFC 8785.
fn canonical(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).expect("a JSON value always serialises")
}

fn signed_message(context: &[u8], unsigned: &Value) -> Vec<u8> {
    let mut message = context.to_vec();
    message.extend_from_slice(&canonical(unsigned));
    message
}

/// The `signature` member: `key`'s Ed25519 signature over `message`.
fn signature_member(message: &[u8], key: &EdgeKey) -> SignatureMember {
    SignatureMember {
        alg: "ed25519".into(),
        key: edge_key_id(&key.0.verifying_key()),
        sig: b64().encode(key.0.sign(message).to_bytes()),
    }
}

/// The signed, canonical JSON document of `document` (a JSON object): its members plus a
/// `signature` member over `context` ‖ its canonical JSON. Shared by manifests and inventories.
pub(crate) fn sign_document(document: &impl Serialize, context: &[u8], key: &EdgeKey) -> Vec<u8> {
    let mut value = serde_json::to_value(document).expect("a document always serialises");
    let member = signature_member(&signed_message(context, &value), key);
    value
        .as_object_mut()
        .expect("a signed document is a JSON object")
        .insert(
            "signature".into(),
            serde_json::to_value(member).expect("serialises"),
        );
    canonical(&value)
}

/// [`sign_document`] for a document already in canonical form whose members all sort before
/// `signature` but the serialised members `after` (`,"site":"…"`, which sort after it), given
/// as the signed message (`context` ‖ the document): the same bytes, without building a JSON
/// tree or copying the document, so that a batch's inventory of 100 000 files is not held
/// several times over while it is signed.
pub(crate) fn sign_canonical(
    mut message: Vec<u8>,
    context: &[u8],
    key: &EdgeKey,
    after: &[u8],
) -> Vec<u8> {
    assert!(
        message.starts_with(context),
        "the message starts with its context"
    );
    let member = serde_json::to_vec(&signature_member(&message, key)).expect("serialises");
    message.drain(..context.len());
    let closing = message.pop();
    assert_eq!(closing, Some(b'}'), "a signed document is a JSON object");
    assert!(
        message.ends_with(after),
        "the members after the signature end the document"
    );
    message.truncate(message.len() - after.len());
    message.reserve_exact(member.len() + after.len() + 16);
    message.extend_from_slice(b",\"signature\":");
    message.extend_from_slice(&member);
    message.extend_from_slice(after);
    message.push(b'}');
    message
}

/// A signed document whose signature checked out: its members without the signature, and the
/// key that signed it.
pub(crate) struct Opened {
    pub(crate) value: Value,
    pub(crate) signer: VerifyingKey,
}

/// Parses a document signed by [`sign_document`] whose `format` is one of `formats`, checks
/// its signature against the trusted edge keys, and returns it without the signature, with the
/// key that signed it. Nothing of an unverified document is ever returned.
pub(crate) fn open_document(
    document: &[u8],
    formats: &[&str],
    context: &[u8],
    trusted: &TrustedEdges,
) -> Result<Opened, ManifestError> {
    open_signed(document, formats, context, |key| trusted.trusts(key))
}

/// [`open_document`] with any test of the signing key: `trusted` says whether it is one of
/// the keys this reader accepts (edge keys for manifests, core keys for receipts).
pub(crate) fn open_signed(
    document: &[u8],
    formats: &[&str],
    context: &[u8],
    trusted: impl Fn(&VerifyingKey) -> bool,
) -> Result<Opened, ManifestError> {
    let mut value: Value =
        serde_json::from_slice(document).map_err(|e| ManifestError::NotJson(e.to_string()))?;
    let object = value
        .as_object_mut()
        .ok_or_else(|| ManifestError::NotJson("top level is not an object".into()))?;
    match object.get("format") {
        Some(Value::String(f)) if formats.contains(&f.as_str()) => {}
        Some(Value::String(f)) => return Err(ManifestError::UnsupportedFormat(f.clone())),
        _ => return Err(ManifestError::Invalid("no format member".into())),
    }
    let member = object
        .remove("signature")
        .ok_or_else(|| ManifestError::Unsigned("missing".into()))?;
    let member: SignatureMember =
        serde_json::from_value(member).map_err(|e| ManifestError::Unsigned(e.to_string()))?;
    if member.alg != "ed25519" {
        return Err(ManifestError::Unsigned(format!(
            "unknown alg {:?}",
            member.alg
        )));
    }
    let key = decode_fixed::<32>(&member.key)
        .and_then(|k| VerifyingKey::from_bytes(&k).ok())
        .ok_or_else(|| ManifestError::Unsigned("key is not an Ed25519 public key".into()))?;
    let sig = decode_fixed::<64>(&member.sig)
        .map(|s| Signature::from_bytes(&s))
        .ok_or_else(|| ManifestError::Unsigned("sig is not 64 base64 bytes".into()))?;
    key.verify_strict(&signed_message(context, &value), &sig)
        .map_err(|_| ManifestError::BadSignature)?;
    if !trusted(&key) {
        return Err(ManifestError::UntrustedSigner(member.key));
    }
    Ok(Opened { value, signer: key })
}

impl Manifest {
    /// The signed, canonical JSON document: this manifest plus a `signature` member.
    pub fn sign(&self, key: &EdgeKey) -> Vec<u8> {
        sign_document(self, SIGNING_CONTEXT, key)
    }

    /// Whether a signed inventory lists this object (every manifest of version 2): a set of
    /// objects holding such a manifest but no inventory has lost its inventory.
    pub fn listed_in_inventory(&self) -> bool {
        self.format != FORMAT_V1
    }

    /// The site and batch time the edge signed in this manifest (format 4), or `None` for an
    /// older one, which names neither (its inventory still binds it to a site).
    pub fn signed_origin(&self) -> Option<(&str, i64)> {
        (self.format == FORMAT).then_some((self.site.as_str(), self.batch_time))
    }

    /// Parses a signed manifest, checks its signature against the trusted edge keys and
    /// validates its structure. Nothing of an unverified manifest is ever returned.
    pub fn open(document: &[u8], trusted: &TrustedEdges) -> Result<Self, ManifestError> {
        let formats = [FORMAT, FORMAT_V1, FORMAT_V2, FORMAT_V3];
        let Opened { value, .. } = open_document(document, &formats, SIGNING_CONTEXT, trusted)?;
        let manifest: Manifest =
            serde_json::from_value(value).map_err(|e| ManifestError::Invalid(e.to_string()))?;
        manifest.validate().map_err(ManifestError::Invalid)?;
        Ok(manifest)
    }

    /// Checks the invariants a reader relies on: a safe relative path, and parts that tile the
    /// file exactly in order.
    pub fn validate(&self) -> Result<(), String> {
        validate_path(&self.path)?;
        check_hex(&self.sha256, "sha256")?;
        if self.mtime_ns >= 1_000_000_000 {
            return Err(format!(
                "mtime_ns {} is not below one second",
                self.mtime_ns
            ));
        }
        self.validate_format_and_origin()?;
        if self.kind != Kind::Bundle && !self.members.is_empty() {
            return Err("only a bundle has members".into());
        }
        if self.kind == Kind::Dir {
            return if self.size == 0 && self.parts.is_empty() {
                Ok(())
            } else {
                Err("a directory has size 0 and no parts".into())
            };
        }
        self.validate_parts()?;
        if self.kind == Kind::Bundle {
            if self.parts.len() != 1 {
                return Err("a bundle is one part".into());
            }
            validate_members(&self.members, self.size)?;
        }
        Ok(())
    }

    /// Whether the format version allows this kind of object, and the site and batch time it
    /// names (only format 4 names them).
    fn validate_format_and_origin(&self) -> Result<(), String> {
        // Before version 4, a bundle was version 3 and nothing else was.
        let kinds_of_format = match self.format.as_str() {
            FORMAT_V3 => self.kind == Kind::Bundle,
            FORMAT => true,
            _ => self.kind != Kind::Bundle,
        };
        if !kinds_of_format {
            return Err(format!(
                "a {:?} object with format {:?}",
                self.kind, self.format
            ));
        }
        if self.format != FORMAT && (!self.site.is_empty() || self.batch_time != 0) {
            return Err(format!(
                "format {:?} names no site and no batch time",
                self.format
            ));
        }
        if !self.site.is_empty() {
            crate::check_site_name(&self.site).map_err(|e| format!("site: {e}"))?;
        }
        if self.batch_time < 0 {
            return Err(format!("batch_time {} is before 1970", self.batch_time));
        }
        Ok(())
    }

    /// Whether the parts of a file or bundle tile it exactly in order, each with its hashes.
    fn validate_parts(&self) -> Result<(), String> {
        if self.part_size == 0 {
            return Err("part_size is 0".into());
        }
        let expected_parts = self.size.div_ceil(self.part_size);
        if self.parts.len() as u64 != expected_parts {
            return Err(format!(
                "{} parts listed, but size {} in parts of {} needs {expected_parts}",
                self.parts.len(),
                self.size,
                self.part_size
            ));
        }
        let mut offset = 0u64;
        for (i, part) in self.parts.iter().enumerate() {
            let expected_len = self.part_size.min(self.size - offset);
            if part.index as usize != i
                || part.raw_offset != offset
                || part.raw_length != expected_len
            {
                return Err(format!(
                    "part {i} has index {}, offset {}, length {}; expected index {i}, offset {offset}, length {expected_len}",
                    part.index, part.raw_offset, part.raw_length
                ));
            }
            if part.codec != CODEC_ZSTD {
                return Err(format!(
                    "part {i} has codec {:?}; v1 knows only zstd",
                    part.codec
                ));
            }
            check_hex(&part.raw_sha256, "raw_sha256")?;
            // A file of one part is that part: both hashes must agree, and readers may rely
            // on it to hash such files once.
            if self.parts.len() == 1 && part.raw_sha256 != self.sha256 {
                return Err("a one-part file's sha256 differs from its part's raw_sha256".into());
            }
            check_hex(&part.ciphertext_sha256, "ciphertext_sha256")?;
            offset += expected_len;
        }
        Ok(())
    }

    /// How messages name this object: its path, or a bundle's first files.
    pub fn describe(&self) -> String {
        const SHOWN: usize = 3;
        if self.kind != Kind::Bundle {
            return self.path.clone();
        }
        let names: Vec<&str> = self
            .members
            .iter()
            .take(SHOWN)
            .map(|m| m.path.as_str())
            .collect();
        let more = self.members.len().saturating_sub(SHOWN);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        format!(
            "bundle of {} ({}{more})",
            self.members.len(),
            names.join(", ")
        )
    }

    /// What the core delivers of this object: itself, or each member of a bundle as the
    /// manifest it would have had as an object of its own (without parts: its bytes are in the
    /// bundle's).
    pub fn files(&self) -> Vec<Manifest> {
        if self.kind != Kind::Bundle {
            return vec![self.clone()];
        }
        self.members
            .iter()
            .map(|m| Manifest {
                // A member is a file of its bundle's version: format 2 inside a version-3 one.
                format: if self.format == FORMAT_V3 {
                    FORMAT_V2.into()
                } else {
                    self.format.clone()
                },
                id: m.id,
                batch: self.batch.clone(),
                path: m.path.clone(),
                kind: Kind::File,
                size: m.size,
                mode: m.mode,
                mtime_s: m.mtime_s,
                mtime_ns: m.mtime_ns,
                sha256: m.sha256.clone(),
                part_size: self.part_size,
                parts: Vec::new(),
                members: Vec::new(),
                site: self.site.clone(),
                batch_time: self.batch_time,
            })
            .collect()
    }
}

fn decode_fixed<const N: usize>(text: &str) -> Option<[u8; N]> {
    b64().decode(text).ok()?.try_into().ok()
}

pub(crate) fn check_hex(s: &str, what: &str) -> Result<(), String> {
    if s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(())
    } else {
        Err(format!("{what} {s:?} is not 64 lower-case hex digits"))
    }
}

/// Accepts only relative, normalised, `/`-separated paths: no empty, `.` or `..` components, no
/// leading `/`, no NUL, at most 4096 bytes with components of at most 255. Anything else could
/// write outside the destination.
pub fn validate_path(path: &str) -> Result<(), String> {
    if path.is_empty() || path.len() > 4096 {
        return Err(format!("path {path:?} is empty or longer than 4096 bytes"));
    }
    if path.starts_with('/') || path.contains('\0') {
        return Err(format!("path {path:?} is absolute or contains NUL"));
    }
    for component in path.split('/') {
        if component.is_empty() || component == "." || component == ".." || component.len() > 255 {
            return Err(format!(
                "path {path:?} has an empty, '.', '..' or over-long component"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;

    fn key(seed: u8) -> EdgeKey {
        EdgeKey(SigningKey::from_bytes(&[seed; 32]))
    }

    fn trusted(k: &EdgeKey) -> TrustedEdges {
        TrustedEdges::any_site(vec![k.0.verifying_key()])
    }

    fn sample() -> Manifest {
        let h = "ab".repeat(32);
        Manifest {
            format: FORMAT.into(),
            id: ObjectId::random(),
            batch: String::new(),
            path: "dir/ünïcode file.bin".into(),
            kind: Kind::File,
            size: 10,
            mode: 0o644,
            mtime_s: 1_700_000_000,
            mtime_ns: 5,
            sha256: h.clone(),
            part_size: 8,
            parts: (0..2)
                .map(|i| PartEntry {
                    index: i,
                    raw_offset: 8 * i as u64,
                    raw_length: if i == 0 { 8 } else { 2 },
                    raw_sha256: h.clone(),
                    ciphertext_length: 100,
                    ciphertext_sha256: h.clone(),
                    codec: CODEC_ZSTD.into(),
                    level: 3,
                })
                .collect(),
            members: Vec::new(),
            site: "site-a".into(),
            batch_time: 1_700_000_100,
        }
    }

    // Fuzzing the parser that every untrusted byte from the relay reaches first. Cases per
    // property: PROPTEST_CASES (256 by default in `cargo test`; the soak runs far more).
    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any bytes at all: an error, never a panic.
            #[test]
            fn arbitrary_bytes_are_refused(doc in proptest::collection::vec(any::<u8>(), 0..2048)) {
                prop_assert!(Manifest::open(&doc, &trusted(&key(1))).is_err());
            }

            /// A signed manifest with bytes flipped, cut or inserted anywhere: refused, or (if
            /// the change did not alter the JSON value) exactly the original.
            #[test]
            fn mutated_manifests_are_refused(
                at in any::<prop::sample::Index>(),
                byte in any::<u8>(),
                how in 0..3u8,
            ) {
                let k = key(1);
                let m = sample();
                let mut doc = m.sign(&k);
                crate::mutate(&mut doc, at, byte, how);
                if let Ok(opened) = Manifest::open(&doc, &trusted(&k)) {
                    prop_assert_eq!(opened, m);
                }
            }

            /// Correctly signed manifests with any path: accepted only if the path is a safe
            /// relative one (no `..`, no absolute or empty components, no NUL).
            #[test]
            fn signed_hostile_paths_never_escape(path in "[a-z./\\\\\x00]{0,12}|(\\.\\./)+[a-z]{1,3}|/[a-z]{1,5}") {
                let k = key(1);
                let mut m = sample();
                m.path = path.clone();
                let doc = m.sign(&k);
                if Manifest::open(&doc, &trusted(&k)).is_ok() {
                    prop_assert!(!path.starts_with('/') && !path.contains('\0'), "{:?}", path);
                    prop_assert!(
                        path.split('/').all(|c| !c.is_empty() && c != ".." && c != "."),
                        "{:?}",
                        path
                    );
                }
            }
        }
    }

    #[test]
    fn signed_manifest_opens_and_is_canonical() {
        let k = key(1);
        let m = sample();
        let doc = m.sign(&k);
        assert_eq!(Manifest::open(&doc, &trusted(&k)).unwrap(), m);
        let text = String::from_utf8(doc).unwrap();
        assert!(
            text.starts_with(
                "{\"batch\":\"\",\"batch_time\":1700000100,\"format\":\"forte-object/4\",\"id\":"
            ),
            "{text}"
        );
        assert!(
            !text.contains(' ') || text.contains("ünïcode file"),
            "{text}"
        );
    }

    #[test]
    fn altered_or_foreign_manifests_are_refused() {
        let k = key(1);
        let doc = String::from_utf8(sample().sign(&k)).unwrap();
        let altered = doc.replace("\"size\":10", "\"size\":11");
        assert!(matches!(
            Manifest::open(altered.as_bytes(), &trusted(&k)),
            Err(ManifestError::BadSignature)
        ));
        let other = key(2);
        let e = Manifest::open(sample().sign(&other).as_slice(), &trusted(&k)).unwrap_err();
        assert!(matches!(e, ManifestError::UntrustedSigner(_)), "{e}");
        let unsigned = serde_json::to_vec(&sample()).unwrap();
        assert!(matches!(
            Manifest::open(&unsigned, &trusted(&k)),
            Err(ManifestError::Unsigned(_))
        ));
    }

    #[test]
    fn signed_but_malformed_manifests_are_refused() {
        let k = key(1);
        let mut m = sample();
        m.path = "../etc/passwd".into();
        let e = Manifest::open(&m.sign(&k), &trusted(&k))
            .unwrap_err()
            .to_string();
        assert!(e.contains("..") && e.contains("malformed"), "{e}");
        let mut m = sample();
        m.parts.swap(0, 1);
        let e = Manifest::open(&m.sign(&k), &trusted(&k))
            .unwrap_err()
            .to_string();
        assert!(e.contains("part 0 has index 1"), "{e}");
    }

    #[test]
    fn a_one_part_file_hash_must_be_its_part_hash() {
        let k = key(1);
        let mut m = sample();
        m.size = 8;
        m.parts.truncate(1);
        m.sha256 = "cd".repeat(32);
        let e = Manifest::open(&m.sign(&k), &trusted(&k))
            .unwrap_err()
            .to_string();
        assert!(e.contains("one-part"), "{e}");
        m.sha256 = m.parts[0].raw_sha256.clone();
        assert!(Manifest::open(&m.sign(&k), &trusted(&k)).is_ok());
    }

    fn refused(m: &Manifest, needle: &str) {
        let k = key(1);
        let e = Manifest::open(&m.sign(&k), &trusted(&k))
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "expected {needle:?} in {e}");
    }

    #[test]
    fn only_known_formats_open_and_only_format_1_is_not_listed_in_an_inventory() {
        let k = key(1);
        let mut m = sample();
        assert!(m.listed_in_inventory());
        (m.site, m.batch_time) = (String::new(), 0);
        m.format = FORMAT_V2.into();
        assert!(Manifest::open(&m.sign(&k), &trusted(&k))
            .unwrap()
            .listed_in_inventory());
        m.format = FORMAT_V1.into();
        let opened = Manifest::open(&m.sign(&k), &trusted(&k)).unwrap();
        assert!(!opened.listed_in_inventory());
        m.format = "forte-object/9".into();
        assert!(matches!(
            Manifest::open(&m.sign(&k), &trusted(&k)),
            Err(ManifestError::UnsupportedFormat(f)) if f == "forte-object/9"
        ));
        // An inventory's format is not a manifest's.
        m.format = crate::INVENTORY_FORMAT.into();
        assert!(matches!(
            Manifest::open(&m.sign(&k), &trusted(&k)),
            Err(ManifestError::UnsupportedFormat(_))
        ));
    }

    /// Format 4 signs the site and the batch's time; older formats name neither, and a
    /// manifest that claims an older format cannot carry them (they would go unread).
    #[test]
    fn only_format_4_names_a_site_and_a_batch_time() {
        let k = key(1);
        let m = sample();
        let opened = Manifest::open(&m.sign(&k), &trusted(&k)).unwrap();
        assert_eq!(opened.signed_origin(), Some(("site-a", 1_700_000_100)));
        for old in [FORMAT_V1, FORMAT_V2] {
            let mut older = m.clone();
            older.format = old.into();
            let refused = Manifest::open(&older.sign(&k), &trusted(&k)).unwrap_err();
            assert!(refused.to_string().contains("names no site"), "{refused}");
            (older.site, older.batch_time) = (String::new(), 0);
            let opened = Manifest::open(&older.sign(&k), &trusted(&k)).unwrap();
            assert_eq!(opened.signed_origin(), None);
        }
        let mut bad = m.clone();
        bad.site = "../other".into();
        let refused = Manifest::open(&bad.sign(&k), &trusted(&k)).unwrap_err();
        assert!(refused.to_string().contains("site:"), "{refused}");
        let mut bad = m.clone();
        bad.batch_time = -1;
        assert!(Manifest::open(&bad.sign(&k), &trusted(&k)).is_err());
        // A bundle is format 4 now, or 3 as before; a file is never 3.
        let mut file = m;
        file.format = FORMAT_V3.into();
        (file.site, file.batch_time) = (String::new(), 0);
        assert!(Manifest::open(&file.sign(&k), &trusted(&k)).is_err());
    }

    /// A bundle's members are files of its own format, with its site and batch time; a
    /// version-3 bundle's members are version 2.
    #[test]
    fn a_bundles_members_carry_its_origin() {
        let member = crate::member("x");
        let mut bundle = sample();
        (bundle.kind, bundle.members) = (Kind::Bundle, vec![member]);
        let files = bundle.files();
        assert_eq!(files[0].signed_origin(), Some(("site-a", 1_700_000_100)));
        bundle.format = FORMAT_V3.into();
        (bundle.site, bundle.batch_time) = (String::new(), 0);
        let files = bundle.files();
        assert_eq!(
            (files[0].format.as_str(), files[0].signed_origin()),
            (FORMAT_V2, None)
        );
    }

    #[test]
    fn a_directory_has_no_size_and_no_parts() {
        let mut m = sample();
        m.kind = Kind::Dir;
        m.size = 5;
        m.parts.clear();
        refused(&m, "a directory has size 0 and no parts");
        let mut m = sample();
        m.kind = Kind::Dir;
        m.size = 0;
        refused(&m, "a directory has size 0 and no parts");
        m.parts.clear();
        assert!(m.validate().is_ok());
    }

    #[test]
    fn each_part_needs_its_own_offset_and_length() {
        let mut m = sample();
        m.parts[1].raw_offset = 7;
        refused(&m, "part 1 has index 1, offset 7, length 2");
        let mut m = sample();
        m.parts[1].raw_length = 3;
        refused(&m, "part 1 has index 1, offset 8, length 3");
    }

    #[test]
    fn hashes_are_64_lower_case_hex_digits() {
        for bad in [
            "xyz".to_string(),
            "AB".repeat(32),
            "ab".repeat(31),
            "g".repeat(64),
        ] {
            let mut m = sample();
            m.sha256.clone_from(&bad);
            refused(&m, "is not 64 lower-case hex digits");
        }
    }

    #[test]
    fn path_limits_are_exact() {
        assert!(validate_path("").is_err());
        let at_limit: String = format!("{}bb", "a/".repeat(2047));
        assert_eq!(at_limit.len(), 4096);
        assert!(validate_path(&at_limit).is_ok());
        assert!(
            validate_path(&format!("{at_limit}c")).is_err(),
            "4097 bytes"
        );
        assert!(validate_path(&"c".repeat(255)).is_ok());
        assert!(validate_path(&"c".repeat(256)).is_err());
    }

    #[test]
    fn paths_escaping_the_destination_are_invalid() {
        for bad in [
            "",
            "/etc/passwd",
            "a/../b",
            "a//b",
            "./a",
            "a/",
            "..",
            "a\0b",
        ] {
            assert!(validate_path(bad).is_err(), "{bad:?}");
        }
        for good in ["a", "a/b/c", "ünï/ cödé ", "..a/b..", ".hidden"] {
            assert!(validate_path(good).is_ok(), "{good:?}");
        }
    }
}
