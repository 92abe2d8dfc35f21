//! Any change to packed objects makes unpack refuse, name the file and part, and leave the
//! destination untouched.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use forte_format::seal::encrypt;
use forte_format::{EdgeKey, Kind, Manifest, ObjectId, Recipients, FORMAT};

struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    keys: Keys,
    pristine: PathBuf,
}

/// Packs a three-part file and a small one (1 MiB parts keep the test quick).
fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let keys = keygen(&root.join("keys"));
    let src = root.join("src");
    write(&src.join("multi.bin"), &sample_bytes((5 << 20) / 2, 11));
    write(&src.join("notes/other.txt"), b"a small file\n");
    let pristine = root.join("pristine");
    ok(&args![
        "pack",
        &src,
        "--to",
        &pristine,
        "--recipient",
        &keys.core_pub,
        "--sign",
        &keys.edge_key,
        "--part-size",
        "1MiB",
        "-q",
    ]);
    Fixture {
        _tmp: tmp,
        root,
        keys,
        pristine,
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

impl Fixture {
    /// A fresh copy of the packed objects, and the object directory of `path` in it.
    fn copy(&self, name: &str, path: &str) -> (PathBuf, PathBuf) {
        let packed = self.root.join(name);
        copy_dir(&self.pristine, &packed);
        let object = object_for(&self.keys, &packed, path);
        (packed, object)
    }

    /// Unpacks, expecting refusal with every one of `needles` in the message and nothing at
    /// the destination.
    fn refused(&self, packed: &Path, needles: &[&str]) -> String {
        let dest = self.root.join(format!(
            "dest-{}",
            packed.file_name().unwrap().to_string_lossy()
        ));
        let err = fails(&unpack_args(&self.keys, packed, &dest));
        for needle in needles {
            assert!(err.contains(needle), "expected {needle:?} in:\n{err}");
        }
        assert!(
            is_empty_dir(&dest),
            "the destination is not empty after a refused unpack"
        );
        err
    }
}

fn flip_byte(path: &Path, offset: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = offset.min(bytes.len() - 1);
    bytes[at] ^= 0x01;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn pristine_objects_unpack() {
    let f = fixture();
    let dest = f.root.join("dest");
    ok(&unpack_args(&f.keys, &f.pristine, &dest));
    assert_eq!(tree(&dest).len(), 2);
}

#[test]
fn a_flipped_byte_anywhere_in_a_part_is_caught() {
    let f = fixture();
    for (case, part, offset) in [
        ("head", 0, 5),
        ("middle", 1, 400_000),
        ("tail", 2, usize::MAX),
    ] {
        let (packed, object) = f.copy(&format!("flip-{case}"), "multi.bin");
        flip_byte(&object.join(format!("part-{part:06}.zst.age")), offset);
        f.refused(
            &packed,
            &[
                "multi.bin",
                &format!("part {part}"),
                "ciphertext SHA-256 mismatch",
            ],
        );
    }
}

#[test]
fn a_flipped_byte_in_a_manifest_is_caught() {
    let f = fixture();
    for (case, offset) in [("header", 40), ("body", 300), ("tag", usize::MAX)] {
        let (packed, object) = f.copy(&format!("manifest-{case}"), "notes/other.txt");
        flip_byte(&object.join("manifest.age"), offset);
        let id = object.file_name().unwrap().to_str().unwrap();
        f.refused(&packed, &[id, "manifest.age"]);
    }
}

#[test]
fn truncated_missing_and_extra_parts_are_caught() {
    let f = fixture();
    let (packed, object) = f.copy("truncated", "multi.bin");
    let part = object.join("part-000002.zst.age");
    let len = std::fs::metadata(&part).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&part)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
    f.refused(&packed, &["multi.bin", "part 2", "truncated"]);

    let (packed, object) = f.copy("missing", "multi.bin");
    std::fs::remove_file(object.join("part-000001.zst.age")).unwrap();
    f.refused(&packed, &["multi.bin", "part 1", "cannot read"]);

    let (packed, object) = f.copy("extra", "multi.bin");
    std::fs::copy(
        object.join("part-000000.zst.age"),
        object.join("part-000003.zst.age"),
    )
    .unwrap();
    f.refused(&packed, &["multi.bin", "unexpected", "part-000003.zst.age"]);
}

#[test]
fn swapped_parts_are_caught() {
    let f = fixture();
    let (packed, object) = f.copy("swapped", "multi.bin");
    let (a, b) = (
        object.join("part-000000.zst.age"),
        object.join("part-000001.zst.age"),
    );
    let tmp = object.join("swap");
    std::fs::rename(&a, &tmp).unwrap();
    std::fs::rename(&b, &a).unwrap();
    std::fs::rename(&tmp, &b).unwrap();
    f.refused(&packed, &["multi.bin", "part 0", "replaced"]);
}

#[test]
fn a_part_from_another_file_is_caught() {
    let f = fixture();
    let (packed, object) = f.copy("foreign-part", "multi.bin");
    let other = object_for(&f.keys, &packed, "notes/other.txt");
    std::fs::copy(
        other.join("part-000000.zst.age"),
        object.join("part-000001.zst.age"),
    )
    .unwrap();
    f.refused(&packed, &["multi.bin", "part 1"]);
}

#[test]
fn manifests_moved_between_objects_are_caught() {
    let f = fixture();
    let (packed, object) = f.copy("moved", "multi.bin");
    let other = object_for(&f.keys, &packed, "notes/other.txt");
    std::fs::copy(other.join("manifest.age"), object.join("manifest.age")).unwrap();
    f.refused(&packed, &["manifests were moved"]);
}

#[test]
fn another_edge_key_is_not_trusted() {
    let f = fixture();
    let intruder = keygen(&f.root.join("intruder"));
    let packed = f.root.join("foreign");
    ok(&args![
        "pack",
        f.root.join("src"),
        "--to",
        &packed,
        "--recipient",
        &f.keys.core_pub,
        "--sign",
        &intruder.edge_key,
        "-q",
    ]);
    f.refused(
        &packed,
        &["not among the trusted edge keys", "manifest.age"],
    );
}

#[test]
fn the_wrong_core_identity_cannot_decrypt() {
    let f = fixture();
    let other = keygen(&f.root.join("other-core"));
    let dest = f.root.join("dest");
    let err = fails(&args![
        "unpack",
        &f.pristine,
        "--to",
        &dest,
        "--identity",
        &other.core_key,
        "--trust",
        &f.keys.edge_pub,
        "-q",
    ]);
    assert!(
        err.contains("not decryptable with the given identity"),
        "{err}"
    );
    assert!(is_empty_dir(&dest));
}

#[test]
fn signed_manifests_with_escaping_paths_are_refused() {
    let f = fixture();
    let key = EdgeKey::load(&f.keys.edge_key).unwrap();
    let recipients = Recipients::load(&f.keys.core_pub).unwrap();
    for (case, path) in [
        ("dotdot", "../escaped"),
        ("absolute", "/tmp/escaped"),
        ("inner", "a/../../b"),
    ] {
        let packed = f.root.join(format!("evil-{case}"));
        let id = ObjectId::random();
        let manifest = Manifest {
            format: FORMAT.into(),
            id,
            batch: String::new(),
            path: path.into(),
            kind: Kind::Dir,
            size: 0,
            mode: 0o755,
            mtime_s: 0,
            mtime_ns: 0,
            sha256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".into(),
            part_size: 1 << 24,
            parts: vec![],
        };
        let mut sealed = Vec::new();
        encrypt(&recipients.0, &manifest.sign(&key), &mut sealed);
        let object = packed.join(id.to_string());
        std::fs::create_dir_all(&object).unwrap();
        std::fs::write(object.join("manifest.age"), sealed).unwrap();
        f.refused(&packed, &["malformed", path]);
        assert!(!f.root.join("escaped").exists());
    }
}
