//! Any change to packed objects makes unpack refuse, name the file and part, and leave the
//! destination untouched.

use std::path::{Path, PathBuf};

use crate::common::*;
use forte_format::seal::encrypt;
use forte_format::{
    EdgeKey, Inventory, Kind, Manifest, ObjectId, Recipients, FORMAT, FORMAT_V1, INVENTORY_FILE,
};

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

impl Forger {
    /// Re-signs the archive's inventory so that it lists `manifest` as it is now: only the
    /// check under test can then catch what the manifest claims.
    fn relist(&self, packed: &Path, manifest: &Manifest) {
        let path = packed.join(INVENTORY_FILE);
        let mut inventory = Inventory::open(&self.open(&path), &self.trusted).unwrap();
        for entry in &mut inventory.objects {
            if entry.id == manifest.id {
                *entry = forte_format::InventoryEntry::of(manifest);
            }
        }
        std::fs::write(&path, inventory.seal(&self.key, &self.recipients)).unwrap();
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
    let truncated = format!("has {} bytes, the manifest says {len}", len - 1);
    f.refused(&packed, &["multi.bin", "part 2", &truncated]);

    // A part with bytes appended: its first `len` bytes still hash right, so only its length
    // can tell.
    let (packed, object) = f.copy("extended", "multi.bin");
    let part = object.join("part-000002.zst.age");
    let mut bytes = std::fs::read(&part).unwrap();
    bytes.push(0);
    std::fs::write(&part, bytes).unwrap();
    let extended = format!("has {} bytes, the manifest says {len}", len + 1);
    f.refused(&packed, &["multi.bin", "part 2", &extended]);

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
    // The archive's inventory is opened first, and is refused for the same reason.
    f.refused(
        &packed,
        &["not among the trusted edge keys", "inventory.age"],
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
            members: vec![],
            site: String::new(),
            batch_time: 0,
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

// The checks after decryption: each case below passes every earlier check (the ciphertext
// hashes and the AEAD are intact, the manifest and inventory are correctly signed), so only the
// named check can catch it.

#[test]
fn a_signed_manifest_with_a_wrong_raw_part_hash_is_caught_after_decompression() {
    let f = fixture();
    let forger = Forger::new(&f.keys);
    let (packed, object) = f.copy("raw-part-hash", "multi.bin");
    let manifest = forger.rewrite_manifest(&object, |m| m.parts[1].raw_sha256 = "0".repeat(64));
    forger.relist(&packed, &manifest);
    f.refused(&packed, &["multi.bin", "part 1", "raw SHA-256 mismatch"]);
}

#[test]
fn a_signed_manifest_with_a_wrong_whole_file_hash_is_caught_after_assembly() {
    let f = fixture();
    let forger = Forger::new(&f.keys);
    let (packed, object) = f.copy("whole-file-hash", "multi.bin");
    let manifest = forger.rewrite_manifest(&object, |m| m.sha256 = "0".repeat(64));
    forger.relist(&packed, &manifest);
    f.refused(&packed, &["multi.bin", "whole-file SHA-256 mismatch"]);
}

#[test]
fn a_signed_manifest_with_a_shorter_length_is_caught_by_the_decompressed_length() {
    let f = fixture();
    let forger = Forger::new(&f.keys);
    let (packed, object) = f.copy("raw-length", "notes/other.txt");
    // One 13-byte part declared as 12: the frame decompresses to more than the manifest
    // allows. Hashes are of the first 12 bytes, so nothing else would notice.
    let manifest = forger.rewrite_manifest(&object, |m| {
        let short = &b"a small file\n"[..12];
        let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(short));
        m.size = 12;
        m.parts[0].raw_length = 12;
        m.parts[0].raw_sha256.clone_from(&sha);
        m.sha256 = sha;
    });
    forger.relist(&packed, &manifest);
    f.refused(
        &packed,
        &[
            "notes/other.txt",
            "part 0",
            "not a valid zstd frame of 12 bytes",
        ],
    );
}

#[test]
fn a_part_of_equal_length_from_elsewhere_is_caught_by_its_ciphertext_hash() {
    // The same zstd frame sealed again (as a replayed earlier upload would be) to exactly the
    // part's length (age's header varies in length, so seal until one matches): the length
    // check cannot see it, the AEAD and the raw hash would accept it, and only the ciphertext
    // hash names it, before anything is decrypted.
    let f = fixture();
    let forger = Forger::new(&f.keys);
    let (packed, object) = f.copy("equal-length", "multi.bin");
    let part = object.join("part-000001.zst.age");
    let length = std::fs::metadata(&part).unwrap().len() as usize;
    let frame = forger.open(&part);
    let forged = (0..10_000)
        .map(|_| {
            let mut sealed = Vec::new();
            encrypt(&forger.recipients.0, &frame, &mut sealed);
            sealed
        })
        .find(|sealed| sealed.len() == length)
        .expect("an age file of the part's length");
    std::fs::write(&part, forged).unwrap();
    f.refused(
        &packed,
        &["multi.bin", "part 1", "ciphertext SHA-256 mismatch"],
    );
}

// The archive's signed inventory: objects removed, added or replaced as a whole are caught,
// though every remaining manifest verifies.

#[test]
fn a_removed_object_is_caught_by_the_inventory() {
    let f = fixture();
    let (packed, object) = f.copy("removed-object", "notes/other.txt");
    std::fs::remove_dir_all(&object).unwrap();
    f.refused(
        &packed,
        &[
            "notes/other.txt",
            "listed in the signed inventory",
            "missing",
        ],
    );
}

#[test]
fn an_object_from_another_archive_of_the_same_edge_is_caught_by_the_inventory() {
    let f = fixture();
    let src = f.root.join("other-src");
    write(&src.join("injected.txt"), b"not part of the archive\n");
    let other = f.root.join("other-archive");
    pack(&f.keys, &src, &other);
    let (packed, _) = f.copy("injected-object", "multi.bin");
    let foreign = object_for(&f.keys, &other, "injected.txt");
    copy_dir(&foreign, &packed.join(foreign.file_name().unwrap()));
    f.refused(
        &packed,
        &[
            "injected.txt",
            "not in the signed inventory",
            "another batch or archive",
        ],
    );
}

#[test]
fn an_older_copy_of_an_object_is_caught_by_the_inventory() {
    // A correctly signed manifest for the same object id that says something else (an earlier
    // version of the file): the inventory names what this archive holds.
    let f = fixture();
    let forger = Forger::new(&f.keys);
    let (packed, object) = f.copy("replayed-object", "notes/other.txt");
    for part in std::fs::read_dir(&object).unwrap() {
        let part = part.unwrap().path();
        if part.file_name().unwrap() != "manifest.age" {
            std::fs::remove_file(part).unwrap();
        }
    }
    forger.rewrite_manifest(&object, |m| {
        m.kind = Kind::Dir;
        m.size = 0;
        m.parts.clear();
        m.sha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".into();
    });
    f.refused(
        &packed,
        &[
            "notes/other.txt",
            "differs from the signed inventory",
            "replayed",
        ],
    );
}

#[test]
fn a_removed_inventory_is_caught_by_the_manifests_format() {
    let f = fixture();
    let (packed, _) = f.copy("no-inventory", "multi.bin");
    std::fs::remove_file(packed.join(INVENTORY_FILE)).unwrap();
    f.refused(
        &packed,
        &["inventory is missing", "nothing proves the set complete"],
    );
}

#[test]
fn an_inventory_from_another_archive_or_edge_is_caught() {
    let f = fixture();
    // Another archive of the same edge: its inventory lists other objects.
    let other = f.root.join("other-inventory");
    pack(&f.keys, &f.root.join("src").join("notes"), &other);
    let (packed, _) = f.copy("foreign-inventory", "multi.bin");
    std::fs::copy(other.join(INVENTORY_FILE), packed.join(INVENTORY_FILE)).unwrap();
    f.refused(&packed, &["multi.bin", "not in the signed inventory"]);
    // An inventory signed by an untrusted key.
    let intruder = keygen(&f.root.join("intruder"));
    let forger = Forger::new(&f.keys);
    let (packed, _) = f.copy("untrusted-inventory", "multi.bin");
    let inventory = Inventory::open(
        &forger.open(&f.pristine.join(INVENTORY_FILE)),
        &forger.trusted,
    )
    .unwrap();
    let sealed = inventory.seal(
        &EdgeKey::load(&intruder.edge_key).unwrap(),
        &forger.recipients,
    );
    std::fs::write(packed.join(INVENTORY_FILE), sealed).unwrap();
    f.refused(
        &packed,
        &["inventory.age", "not among the trusted edge keys"],
    );
}

#[test]
fn archives_from_before_inventories_restore_with_a_warning() {
    // Format 1 had no inventory: such an archive restores, and unpack says what is unproven.
    let f = fixture();
    let forger = Forger::new(&f.keys);
    let packed = f.root.join("format-1");
    let id = ObjectId::random();
    let manifest = Manifest {
        format: FORMAT_V1.into(),
        id,
        batch: String::new(),
        path: "old-empty-dir".into(),
        kind: Kind::Dir,
        size: 0,
        mode: 0o755,
        mtime_s: 0,
        mtime_ns: 0,
        sha256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".into(),
        part_size: 1 << 24,
        parts: vec![],
        members: vec![],
        site: String::new(),
        batch_time: 0,
    };
    let object = packed.join(id.to_string());
    std::fs::create_dir_all(&object).unwrap();
    forger.seal(&manifest.sign(&forger.key), &object.join("manifest.age"));
    let dest = f.root.join("dest-format-1");
    let out = run(&unpack_args(&f.keys, &packed, &dest));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("carries no signed inventory"), "{stderr}");
    assert!(dest.join("old-empty-dir").is_dir());
}

/// A part's compressed stream may be at most raw + raw/64 + 1 MiB bytes (zstd's worst case with
/// room to spare): one byte more is refused as it is decrypted, before any decompression,
/// however correctly it is signed; exactly at the bound it restores. The stream is padded to
/// the size under test with a zstd skippable frame, which decoders ignore.
#[test]
fn a_part_decrypting_past_its_bound_is_refused_before_decompression() {
    let raw = sample_bytes(200, 21);
    let bound = 200 + 200 / 64 + (1 << 20);
    for (size, refused) in [(bound, false), (bound + 1, true)] {
        let f = fixture();
        let src = f.root.join("src-200");
        write(&src.join("reading.bin"), &raw);
        let packed = f.root.join(format!("packed-{size}"));
        pack(&f.keys, &src, &packed);
        let object = object_for(&f.keys, &packed, "reading.bin");
        let mut stream = zstd::bulk::compress(&raw, 3).unwrap();
        let skippable = size - stream.len() - 8;
        stream.extend_from_slice(&0x184D_2A50u32.to_le_bytes());
        stream.extend_from_slice(&(skippable as u32).to_le_bytes());
        stream.resize(size, 0);
        let forger = Forger::new(&f.keys);
        let part = object.join("part-000000.zst.age");
        forger.seal(&stream, &part);
        let sealed = std::fs::read(&part).unwrap();
        let manifest = forger.rewrite_manifest(&object, |m| {
            m.parts[0].ciphertext_sha256 =
                hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&sealed));
            m.parts[0].ciphertext_length = sealed.len() as u64;
        });
        forger.relist(&packed, &manifest);
        let dest = f.root.join(format!("dest-{size}"));
        let out = run(&unpack_args(&f.keys, &packed, &dest));
        let stderr = String::from_utf8_lossy(&out.stderr);
        if refused {
            assert!(!out.status.success());
            let expected = format!("decrypts to more than the {bound} bytes allowed");
            assert!(
                stderr.contains(&expected) && stderr.contains("reading.bin"),
                "{stderr}"
            );
            assert!(is_empty_dir(&dest));
        } else {
            assert!(out.status.success(), "{stderr}");
            assert_eq!(std::fs::read(dest.join("reading.bin")).unwrap(), raw);
        }
    }
}

/// Correctly signed manifests whose paths clash, one file's path being the directory of
/// another's, are refused before anything is restored.
#[test]
fn a_path_that_is_a_file_in_one_object_and_a_directory_in_another_is_refused() {
    let f = fixture();
    let src = f.root.join("src-clash");
    write(&src.join("a"), b"a file\n");
    write(&src.join("b/c"), b"another file\n");
    let packed = f.root.join("packed-clash");
    pack_unbundled(&f.keys, &src, &packed);
    let forger = Forger::new(&f.keys);
    let object = object_for(&f.keys, &packed, "b/c");
    let manifest = forger.rewrite_manifest(&object, |m| m.path = "a/c".into());
    forger.relist(&packed, &manifest);
    f.refused(
        &packed,
        &["a is a file in one object and a directory of a/c in another"],
    );
}
