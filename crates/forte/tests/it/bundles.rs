//! Small files travel in bundles: a bundle is standard (age, zstd and tar recover it), and any
//! change to one, even by someone holding the edge's key, makes the core refuse the whole set,
//! naming the file.

use std::path::{Path, PathBuf};

use crate::common::*;
use forte_format::seal::sha256_hex;
use forte_format::{Kind, Manifest};

struct Packed {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    keys: Keys,
    src: PathBuf,
    packed: PathBuf,
}

/// Packs small files in nested directories, one with a path too long for a plain tar header,
/// and one large file that travels alone.
fn packed() -> Packed {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let keys = keygen(&root.join("keys"));
    let src = root.join("src");
    for i in 0..40u64 {
        write(
            &src.join(format!("logs/{:02}/run-{i}.csv", i % 4)),
            &sample_bytes(100 + 997 * i as usize, i),
        );
    }
    write(&src.join("empty.txt"), b"");
    let long = format!("{}/{}.txt", "deep".repeat(40), "name".repeat(30));
    write(&src.join(long), b"a long path\n");
    write(&src.join("large.bin"), &sample_bytes(3 << 20, 99));
    let packed = root.join("packed");
    pack(&keys, &src, &packed);
    Packed {
        _tmp: tmp,
        root,
        keys,
        src,
        packed,
    }
}

impl Packed {
    /// The one bundle object of the archive.
    fn bundle(&self) -> PathBuf {
        let bundles: Vec<PathBuf> = objects(&self.packed)
            .into_iter()
            .filter(|o| manifest_json(&self.keys, o)["kind"] == "bundle")
            .collect();
        assert_eq!(bundles.len(), 1, "expected one bundle");
        bundles[0].clone()
    }

    fn refused(&self, needles: &[&str]) {
        let dest = self.root.join("dest");
        let err = fails(&unpack_args(&self.keys, &self.packed, &dest));
        for needle in needles {
            assert!(err.contains(needle), "expected {needle:?} in:\n{err}");
        }
        assert!(is_empty_dir(&dest), "something was delivered:\n{err}");
    }
}

#[test]
fn a_bundle_is_recovered_with_age_zstd_and_tar_alone() {
    let p = packed();
    let bundle = p.bundle();
    let manifest = manifest_json(&p.keys, &bundle);
    assert_eq!(manifest["format"], "forte-object/4");
    let members = manifest["members"].as_array().unwrap();
    assert_eq!(
        members.len(),
        42,
        "40 logs, the empty file and the long path"
    );
    // Two objects: the bundle and the large file, which travels alone.
    assert_eq!(objects(&p.packed).len(), 2);

    let out = p.root.join("by-hand");
    std::fs::create_dir_all(&out).unwrap();
    let part = bundle.join("part-000000.zst.age");
    let script = format!(
        "age -d -i '{}' '{}' | zstd -d -q | tar -x -C '{}'",
        p.keys.core_key.display(),
        part.display(),
        out.display()
    );
    for needed in ["age", "zstd", "tar"] {
        tool(needed); // fails (in CI) or names the missing tool
    }
    let status = std::process::Command::new("bash")
        .args(["-o", "pipefail", "-c", &script])
        .status()
        .unwrap();
    assert!(status.success(), "age | zstd | tar failed");
    // tar keeps whole seconds of the modification time; compare contents.
    let contents = |root: &Path| -> std::collections::BTreeMap<String, String> {
        let mut t = tree(root);
        t.remove("large.bin");
        t.into_iter()
            .map(|(path, info)| (path, info.split(' ').next().unwrap().to_string()))
            .collect()
    };
    assert_eq!(contents(&out), contents(&p.src));
    // Each member's listed hash is the hash of the file tar extracted.
    for m in members {
        let path = m["path"].as_str().unwrap();
        let bytes = std::fs::read(out.join(path)).unwrap();
        assert_eq!(m["sha256"], sha256_hex(&bytes), "{path}");
        assert_eq!(m["size"], bytes.len() as u64, "{path}");
    }
    // And forte restores all of it, large file included.
    let dest = p.root.join("dest");
    ok(&unpack_args(&p.keys, &p.packed, &dest));
    assert_eq!(tree(&dest), tree(&p.src));
}

#[test]
fn a_flipped_byte_in_a_bundle_names_its_files_and_delivers_nothing() {
    let p = packed();
    let part = p.bundle().join("part-000000.zst.age");
    let len = std::fs::metadata(&part).unwrap().len() as usize;
    let mut bytes = std::fs::read(&part).unwrap();
    bytes[len / 2] ^= 1;
    std::fs::write(&part, bytes).unwrap();
    p.refused(&[
        "bundle of 42 (",
        "logs/00/run-0.csv",
        "ciphertext SHA-256 mismatch",
    ]);
}

/// What only a holder of the edge's and the core's keys could do: rewrite a bundle's tar stream
/// and sign a manifest whose hashes match the new stream, its member list unchanged.
impl Forger {
    /// Replaces the bundle's stream by `edit(members, stream)` and re-signs its manifest.
    fn rewrite(&self, bundle: &Path, edit: impl FnOnce(&Manifest, &mut Vec<u8>)) {
        let manifest_path = bundle.join("manifest.age");
        let mut manifest = Manifest::open(&self.open(&manifest_path), &self.trusted).unwrap();
        assert_eq!(manifest.kind, Kind::Bundle);
        let part = bundle.join("part-000000.zst.age");
        let mut stream = zstd::decode_all(&self.open(&part)[..]).unwrap();
        edit(&manifest, &mut stream);
        let sealed = self.sealed(&zstd::encode_all(&stream[..], 3).unwrap());
        std::fs::write(&part, &sealed).unwrap();
        let entry = &mut manifest.parts[0];
        entry.raw_sha256 = sha256_hex(&stream);
        entry.ciphertext_sha256 = sha256_hex(&sealed);
        entry.ciphertext_length = sealed.len() as u64;
        manifest.sha256 = entry.raw_sha256.clone();
        self.seal(&manifest.sign(&self.key), &manifest_path);
    }
}

/// The byte range of member `i`'s header and data (padded) in the stream.
fn entry_range(m: &Manifest, i: usize) -> std::ops::Range<usize> {
    let member = &m.members[i];
    let start = member.offset - forte_format::bundle::header_len(&member.path);
    let end = member.offset + forte_format::bundle::padded(member.size);
    start as usize..end as usize
}

#[test]
fn a_member_dropped_from_the_stream_is_named_and_nothing_is_delivered() {
    let p = packed();
    let forger = Forger::new(&p.keys);
    let mut dropped = String::new();
    forger.rewrite(&p.bundle(), |m, stream| {
        // The fifth member's entry goes; zeros at the end keep the stream's length.
        let range = entry_range(m, 4);
        dropped = m.members[4].path.clone();
        let len = range.len();
        stream.drain(range);
        let end = stream.len() - 1024;
        stream.splice(end..end, std::iter::repeat_n(0, len));
    });
    p.refused(&[&dropped, "tar header for this file is not the manifest's"]);
}

#[test]
fn members_reordered_in_the_stream_are_named_and_nothing_is_delivered() {
    let p = packed();
    let forger = Forger::new(&p.keys);
    let mut first = String::new();
    forger.rewrite(&p.bundle(), |m, stream| {
        // The first two entries swap places; the manifest still lists them in the old order.
        let (a, b) = (entry_range(m, 0), entry_range(m, 1));
        first = m.members[0].path.clone();
        let swapped = [&stream[b.clone()], &stream[a.clone()]].concat();
        stream.splice(a.start..b.end, swapped);
    });
    p.refused(&[&first, "tar header for this file is not the manifest's"]);
}

#[test]
fn a_member_whose_bytes_differ_from_its_hash_is_named() {
    let p = packed();
    let forger = Forger::new(&p.keys);
    let mut changed = String::new();
    forger.rewrite(&p.bundle(), |m, stream| {
        let member = &m.members[7];
        changed = member.path.clone();
        stream[member.offset as usize] ^= 1;
    });
    p.refused(&[&changed, "SHA-256 mismatch in the bundle"]);
}

#[test]
fn bundles_can_be_turned_off() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = keygen(&tmp.path().join("keys"));
    let src = tmp.path().join("src");
    for i in 0..5 {
        write(&src.join(format!("f{i}")), b"small");
    }
    let packed = tmp.path().join("packed");
    pack_unbundled(&keys, &src, &packed);
    assert_eq!(objects(&packed).len(), 5);
}
