//! Helpers shared by the relay's test binaries (`relay`, over HTTPS, and `store`, direct).

use forte_relay::api::PartRef;
use sha2::{Digest, Sha256};

/// The hex SHA-256 of `bytes`, as the protocol names a part.
pub fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The seal's entry for part `index` holding `bytes`.
pub fn part(index: u32, bytes: &[u8]) -> PartRef {
    PartRef {
        index,
        sha256: sha(bytes),
        length: bytes.len() as u64,
    }
}
