//! Names on disk: object directories, the manifest, and part files.

use std::fmt;
use std::str::FromStr;

/// The manifest's file name inside an object directory.
pub const MANIFEST_FILE: &str = "manifest.age";

/// The file name of part `index` inside an object directory.
pub fn part_file_name(index: u32) -> String {
    format!("part-{index:06}.zst.age")
}

/// The opaque name of an object directory: 128 random bits in lower-case hex. It tells the relay
/// nothing about the file; the manifest repeats it so that a manifest cannot be moved to
/// another object's directory unnoticed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId([u8; 16]);

impl ObjectId {
    /// An id derived from a secret and some names: the same inputs give the same id, and
    /// without the secret nobody can tell which names an id stands for.
    pub fn derive(secret: &[u8], names: &[&[u8]]) -> Self {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(b"forte object id\n");
        h.update((secret.len() as u64).to_be_bytes());
        h.update(secret);
        for name in names {
            h.update((name.len() as u64).to_be_bytes());
            h.update(name);
        }
        let digest = h.finalize();
        Self(digest[..16].try_into().expect("16 of 32 bytes"))
    }

    pub fn random() -> Self {
        let mut bytes = [0u8; 16];
        getrandom::getrandom(&mut bytes).expect("the operating system's random source failed");
        Self(bytes)
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl FromStr for ObjectId {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut bytes = [0u8; 16];
        if s.len() != 32 || s.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(format!(
                "{s:?} is not an object id (32 lower-case hex digits)"
            ));
        }
        hex::decode_to_slice(s, &mut bytes)
            .map_err(|_| format!("{s:?} is not an object id (32 lower-case hex digits)"))?;
        Ok(Self(bytes))
    }
}

impl serde::Serialize for ObjectId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ObjectId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_reject_other_names() {
        let id = ObjectId::random();
        assert_eq!(id.to_string().parse::<ObjectId>().unwrap(), id);
        for bad in [
            "",
            "..",
            "ABCDEF0123456789abcdef0123456789",
            "0123",
            "g123456789abcdef0123456789abcdef",
        ] {
            assert!(bad.parse::<ObjectId>().is_err(), "{bad}");
        }
        assert_eq!(part_file_name(7), "part-000007.zst.age");
    }
}
