//! Bundles: many small files in one object, so that a thousand 4 kB files cost one upload and
//! one seal instead of two thousand round trips.
//!
//! A bundle's raw bytes are a standard POSIX tar stream (ustar headers, a PAX `path` record for
//! a path that does not fit them, and the two zero blocks that end an archive), so that
//! `age -d -i core.key part-000000.zst.age | zstd -d | tar -x` recovers its files with stock
//! tools. The signed manifest lists every member with the offset of its data in that stream and
//! its SHA-256; the core checks each member's SHA-256 and that the tar header before it is
//! exactly the one [`header`] writes for it, so stock `tar` and forte always agree on what a
//! bundle holds.

use serde::{Deserialize, Serialize};

use crate::manifest::{check_hex, validate_path};
use crate::object::ObjectId;

/// One file inside a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Member {
    /// The file's own id: what the catalogue and the inventory know it by.
    pub id: ObjectId,
    /// Relative path, `/`-separated, validated like an object's.
    pub path: String,
    pub size: u64,
    /// Unix permission bits (`mode & 0o777`).
    pub mode: u32,
    pub mtime_s: i64,
    pub mtime_ns: u32,
    /// Where the file's bytes start in the bundle's raw (tar) stream; its header is just before.
    pub offset: u64,
    /// SHA-256 of the file's bytes, lower-case hex.
    pub sha256: String,
}

/// A tar block.
pub const BLOCK: u64 = 512;

/// The two zero blocks that end a tar archive.
pub const END_OF_ARCHIVE: u64 = 2 * BLOCK;

/// `n` rounded up to whole tar blocks.
pub fn padded(n: u64) -> u64 {
    n.div_ceil(BLOCK) * BLOCK
}

/// How many bytes [`header`] writes for a member at `path`: one block, or three when the path
/// needs a PAX record (its header, the record, the file's own header).
pub fn header_len(path: &str) -> u64 {
    match split_ustar(path) {
        Some(_) => BLOCK,
        None => BLOCK + padded(pax_record(path).len() as u64) + BLOCK,
    }
}

/// The bytes one member takes in the stream: its header and its data padded to whole blocks.
pub fn member_len(path: &str, size: u64) -> u64 {
    header_len(path) + padded(size)
}

/// The tar header(s) of a regular file: ustar, with the path in `prefix` and `name` when it
/// fits, else in a PAX extended header before it. Owner 0, no user or group names, the
/// modification time in whole seconds (the manifest keeps the nanoseconds).
pub fn header(path: &str, size: u64, mode: u32, mtime_s: i64) -> Vec<u8> {
    let mtime = mtime_s.max(0) as u64;
    match split_ustar(path) {
        Some(UstarPath { prefix, name }) => ustar(prefix, name, size, mode, mtime, b'0').to_vec(),
        None => {
            let record = pax_record(path);
            let mut out = ustar("", "PaxHeader", record.len() as u64, 0o644, mtime, b'x').to_vec();
            out.extend_from_slice(record.as_bytes());
            out.resize(padded(out.len() as u64) as usize, 0);
            let short = truncated(path);
            out.extend_from_slice(&ustar("", short, size, mode, mtime, b'0'));
            out
        }
    }
}

/// Checks the members of a bundle whose raw stream is `size` bytes: valid unique paths, valid
/// hashes, and each member's header and data inside the stream, in order, without overlap.
pub fn validate_members(members: &[Member], size: u64) -> Result<(), String> {
    if members.is_empty() {
        return Err("a bundle has no members".into());
    }
    let mut end = 0u64;
    let mut paths = std::collections::HashSet::new();
    for m in members {
        validate_path(&m.path)?;
        check_hex(&m.sha256, "member sha256")?;
        if !paths.insert(m.path.as_str()) {
            return Err(format!("member {} is listed twice", m.path));
        }
        if m.mtime_ns >= 1_000_000_000 {
            return Err(format!(
                "member {}: mtime_ns is not below one second",
                m.path
            ));
        }
        let start = m.offset.checked_sub(header_len(&m.path));
        if m.offset % BLOCK != 0 || start.is_none_or(|s| s < end) {
            return Err(format!(
                "member {} starts at {}, which is not where the next tar entry's data can be (after byte {end})",
                m.path, m.offset
            ));
        }
        end = m.offset + padded(m.size);
    }
    if end + END_OF_ARCHIVE != size {
        return Err(format!(
            "the members end at byte {end}, but a tar stream of {size} bytes ends its members at {}",
            size.saturating_sub(END_OF_ARCHIVE)
        ));
    }
    Ok(())
}

/// Checks a bundle's raw `stream` against its verified `members` (see [`validate_members`]):
/// before each member exactly the header [`header`] writes for it, after it zero padding, at
/// the end the two zero blocks, and each member's bytes hashing to its SHA-256. So stock `tar`
/// extracts exactly the files, paths and bytes the manifest lists. A mismatch names the member.
pub fn check_stream(members: &[Member], stream: &[u8]) -> Result<(), String> {
    let mut at = 0usize;
    for m in members {
        let header = header(&m.path, m.size, m.mode, m.mtime_s);
        let start = m.offset as usize - header.len();
        let end = (m.offset + m.size) as usize;
        if stream.len() < end + END_OF_ARCHIVE as usize {
            return Err(format!(
                "{}: the bundle ends before this member does",
                m.path
            ));
        }
        if stream[at..start].iter().any(|&b| b != 0) || stream[start..m.offset as usize] != header {
            return Err(format!(
                "{}: the bundle's tar header for this file is not the manifest's (members dropped, reordered or renamed)",
                m.path
            ));
        }
        let found = crate::seal::sha256_hex(&stream[m.offset as usize..end]);
        if found != m.sha256 {
            return Err(format!(
                "{}: SHA-256 mismatch in the bundle (manifest {}, bundle {found})",
                m.path, m.sha256
            ));
        }
        at = end;
    }
    if stream[at..].iter().any(|&b| b != 0) {
        let last = members.last().map_or("", |m| m.path.as_str());
        return Err(format!(
            "the bundle has more than zero padding and the end of the archive after its last member, {last}"
        ));
    }
    Ok(())
}

/// A path as a ustar header's two fields hold it: `prefix`, then `/`, then `name`.
struct UstarPath<'a> {
    prefix: &'a str,
    name: &'a str,
}

/// `path` as ustar's `prefix` and `name`, when it fits them.
fn split_ustar(path: &str) -> Option<UstarPath<'_>> {
    if path.len() <= 100 {
        return Some(UstarPath {
            prefix: "",
            name: path,
        });
    }
    // The split is at a '/': prefix at most 155 bytes, name at most 100 and not empty.
    path.match_indices('/')
        .map(|(i, _)| UstarPath {
            prefix: &path[..i],
            name: &path[i + 1..],
        })
        .find(|p| p.prefix.len() <= 155 && p.name.len() <= 100 && !p.name.is_empty())
}

/// The PAX record `"<len> path=<path>\n"`, whose length counts its own digits.
fn pax_record(path: &str) -> String {
    let body = format!(" path={path}\n");
    let mut len = body.len() + 1;
    while len.to_string().len() + body.len() != len {
        len += 1;
    }
    format!("{len}{body}")
}

/// The last 100 bytes of a long path, cut at a character boundary: what readers without PAX see.
fn truncated(path: &str) -> &str {
    let mut start = path.len().saturating_sub(100);
    while !path.is_char_boundary(start) {
        start += 1;
    }
    &path[start..]
}

fn ustar(prefix: &str, name: &str, size: u64, mode: u32, mtime: u64, kind: u8) -> [u8; 512] {
    let mut h = [0u8; 512];
    let mut put = |at: usize, bytes: &[u8]| h[at..at + bytes.len()].copy_from_slice(bytes);
    put(0, name.as_bytes());
    put(100, format!("{:07o}\0", mode & 0o777).as_bytes());
    put(108, b"0000000\0");
    put(116, b"0000000\0");
    put(124, format!("{size:011o}\0").as_bytes());
    put(
        136,
        format!("{:011o}\0", mtime.min(0o77777777777)).as_bytes(),
    );
    put(148, b"        ");
    put(156, &[kind]);
    put(257, b"ustar\0");
    put(263, b"00");
    put(345, prefix.as_bytes());
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_lengths_match_what_is_written() {
        let long_dir = "d".repeat(150);
        let paths = [
            "a".to_string(),
            "x".repeat(100),
            format!("{long_dir}/{}", "f".repeat(90)),
            "y".repeat(120),
            format!("{}/ü", "é".repeat(200)),
        ];
        for path in &paths {
            let h = header(path, 5, 0o644, 1_700_000_000);
            assert_eq!(h.len() as u64, header_len(path), "{path}");
            assert_eq!(h.len() % 512, 0);
        }
    }

    #[test]
    fn pax_records_count_their_own_length() {
        for n in [1, 80, 89, 90, 91, 995, 996, 4000] {
            let r = pax_record(&"p".repeat(n));
            let (len, _) = r.split_once(' ').unwrap();
            assert_eq!(len.parse::<usize>().unwrap(), r.len());
        }
    }

    #[test]
    fn members_must_tile_the_stream() {
        let m = |path: &str, offset, size| Member {
            id: ObjectId::random(),
            path: path.into(),
            size,
            mode: 0o644,
            mtime_s: 0,
            mtime_ns: 0,
            offset,
            sha256: "ab".repeat(32),
        };
        let ok = [m("a", 512, 10), m("b", 1536, 512)];
        assert_eq!(validate_members(&ok, 2048 + 1024), Ok(()));
        let overlap = [m("a", 512, 1000), m("b", 1536, 10)];
        assert!(validate_members(&overlap, 2048 + 1024).is_err());
        let twice = [m("a", 512, 10), m("a", 1536, 10)];
        assert!(validate_members(&twice, 2048 + 1024)
            .unwrap_err()
            .contains("twice"));
        assert!(validate_members(&ok, 4096).is_err());
        assert!(validate_members(&[], 1024).is_err());
    }
}
