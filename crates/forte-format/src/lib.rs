//! The forte object format, version 2 (specified in `docs/format.md`).
//!
//! A packed file is a directory named by an opaque [`ObjectId`] holding `manifest.age` and
//! `part-000000.zst.age`, `part-000001.zst.age`, …: each part one zstd frame of a slice of the
//! file, encrypted as one age file. The manifest lists every part's offsets and hashes, is signed
//! with the edge's Ed25519 key and then age-encrypted. Everything here is readable with stock
//! `age` and `zstd`; this crate is the one place that knows the layout. Every batch and archive
//! also carries a signed, encrypted [`Inventory`] of its objects, so that a set missing an
//! object, or holding a foreign or replayed one, is refused (version 2; version-1 sets, which
//! have none, still restore).

pub mod bundle;
pub mod inventory;
pub mod keys;
pub mod manifest;
pub mod object;
pub mod receipt;
pub mod seal;

pub use bundle::Member;
pub use inventory::{
    Instance, Inventory, InventoryEntry, Superseded, INVENTORY_FILE, INVENTORY_FORMAT,
    INVENTORY_FORMAT_V1, INVENTORY_FORMAT_V2,
};
pub use keys::{
    check_site_name, EdgeKey, Identities, ReceiptKey, Recipients, TrustSpec, TrustedCores,
    TrustedEdges,
};
pub use manifest::{
    Kind, Manifest, ManifestError, PartEntry, FORMAT, FORMAT_V1, FORMAT_V2, FORMAT_V3,
};
pub use object::{part_file_name, ObjectId, MANIFEST_FILE};
pub use receipt::{Outcome, Receipt, ReceiptFile};

/// A bundle member named `path` of 3 bytes, for tests.
#[cfg(test)]
fn member(path: &str) -> bundle::Member {
    bundle::Member {
        id: ObjectId::random(),
        path: path.into(),
        size: 3,
        mode: 0o644,
        mtime_s: 0,
        mtime_ns: 0,
        offset: 512,
        sha256: "ab".repeat(32),
    }
}

/// A signed document with one byte flipped (`how` 0), cut at a byte (1) or a byte inserted
/// (2) at `at`: what the parsers' fuzzing properties give them.
#[cfg(test)]
fn mutate(doc: &mut Vec<u8>, at: proptest::sample::Index, byte: u8, how: u8) {
    let i = at.index(doc.len());
    match how {
        0 => doc[i] ^= byte.max(1),
        1 => doc.truncate(i),
        _ => doc.insert(i, byte),
    }
}
