//! Pack then unpack gives back a byte-identical tree, with mtimes and modes, for every shape of
//! input: empty files and directories, part boundaries, a file over 1 GiB, unicode and deep paths.

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;

use crate::common::*;

const MIB: usize = 1 << 20;

#[test]
fn round_trip_is_byte_identical() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let keys = keygen(&tmp.path().join("keys"));

    write(&src.join("empty.bin"), b"");
    std::fs::create_dir_all(src.join("empty-dir")).unwrap();
    std::fs::create_dir_all(src.join("nested/also-empty")).unwrap();
    write(&src.join("one-byte"), b"x");
    write(&src.join("parts/exactly-16MiB"), &sample_bytes(16 * MIB, 1));
    write(
        &src.join("parts/16MiB-plus-1"),
        &sample_bytes(16 * MIB + 1, 2),
    );
    write(
        &src.join("parts/16MiB-minus-1"),
        &sample_bytes(16 * MIB - 1, 3),
    );
    write(
        &src.join("Ünïcødé/日本語のファイル 名.txt"),
        "データ ✓\n".repeat(1000).as_bytes(),
    );
    let deep = (0..40)
        .map(|i| format!("level-{i:02}"))
        .collect::<Vec<_>>()
        .join("/");
    write(&src.join(&deep).join("deep.txt"), b"deep inside\n");
    write(&src.join("spaces and 'quotes' \"too\""), b"odd name\n");
    let private = src.join("private.key");
    write(&private, b"secret\n");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();

    // Over 1 GiB: mostly zeros (cheap to compress in CI) with distinct data every 64 MiB, so
    // a misplaced part would be caught.
    let big = src.join("big/over-1GiB.bin");
    std::fs::create_dir_all(big.parent().unwrap()).unwrap();
    let mut f = std::fs::File::create(&big).unwrap();
    f.set_len((1u64 << 30) + 12345).unwrap();
    for i in 0..17u64 {
        f.seek(SeekFrom::Start(i * 64 * MIB as u64 + i * 977))
            .unwrap();
        f.write_all(&sample_bytes(MIB, 100 + i)).unwrap();
    }
    drop(f);

    let packed = tmp.path().join("packed");
    pack(&keys, &src, &packed);
    let restored = tmp.path().join("restored");
    ok(&unpack_args(&keys, &packed, &restored));

    let (before, after) = (tree(&src), tree(&restored));
    assert_eq!(before.len(), 12, "{before:#?}");
    assert_eq!(before, after);

    // The big file really went through as 65 parts.
    let object = object_for(&keys, &packed, "big/over-1GiB.bin");
    let manifest = manifest_json(&keys, &object);
    assert_eq!(manifest["parts"].as_array().unwrap().len(), 65);
    let size = std::fs::metadata(&big).unwrap().len();
    assert!(size > 1 << 30);
    assert_eq!(manifest["size"], size);
}

#[test]
fn a_single_file_packs_under_its_own_name() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = keygen(&tmp.path().join("keys"));
    let file = tmp.path().join("reading.csv");
    write(&file, &sample_bytes(3 * MIB, 9));
    let packed = tmp.path().join("packed");
    let out = ok(&args![
        "pack",
        &file,
        "--to",
        &packed,
        "--recipient",
        &keys.core_pub,
        "--sign",
        &keys.edge_key,
        "--part-size",
        "1MiB",
        "--json",
    ]);
    let summary: serde_json::Value = crate::common::strict_json(&out);
    assert_eq!(summary["files"], 1);
    assert_eq!(summary["raw_bytes"], 3 * MIB);
    let stages: Vec<_> = summary["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        stages,
        [
            "read",
            "hash",
            "compress",
            "encrypt",
            "hash_ciphertext",
            "seal",
            "sink"
        ]
    );
    let restored = tmp.path().join("restored");
    let mut unpack = unpack_args(&keys, &packed, &restored);
    unpack.push("--json".into());
    let summary: serde_json::Value = crate::common::strict_json(&ok(&unpack));
    assert_eq!(
        std::fs::read(restored.join("reading.csv")).unwrap(),
        std::fs::read(&file).unwrap()
    );
    // Each stage counts the bytes it was given and passed on: the file's raw size in, its
    // sealed parts as read, its raw size again out of decompression and into assembly.
    let sealed: u64 = objects(&packed)
        .iter()
        .flat_map(|o| std::fs::read_dir(o).unwrap())
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with("part-"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    let flow: Vec<(String, u64, u64, u64)> = summary["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let n = |k: &str| s[k].as_u64().unwrap();
            (
                s["name"].as_str().unwrap().to_owned(),
                n("items_in"),
                n("bytes_in"),
                n("bytes_out"),
            )
        })
        .collect();
    let by_name = |name: &str| flow.iter().find(|s| s.0 == name).unwrap().clone();
    let raw = 3 * MIB as u64;
    let delivered = &summary["delivered"];
    assert_eq!(
        (
            &delivered["files"],
            &delivered["bytes"],
            &delivered["directories"]
        ),
        (
            &serde_json::json!(1),
            &serde_json::json!(raw),
            &serde_json::json!(0)
        ),
        "{delivered}"
    );
    assert_eq!(by_name("read"), ("read".into(), 1, raw, sealed), "{flow:?}");
    assert_eq!(by_name("verify_ciphertext").2, sealed, "{flow:?}");
    assert_eq!(by_name("decompress").3, raw, "{flow:?}");
    assert_eq!(by_name("assemble").1, 3, "three parts assembled: {flow:?}");
    assert_eq!(by_name("assemble").2, raw, "{flow:?}");
}

#[test]
fn unpack_refuses_to_overwrite_unless_told() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = keygen(&tmp.path().join("keys"));
    let src = tmp.path().join("src");
    write(&src.join("a.txt"), b"new contents\n");
    let packed = tmp.path().join("packed");
    pack(&keys, &src, &packed);
    let dest = tmp.path().join("dest");
    write(&dest.join("a.txt"), b"old\n");
    let err = fails(&unpack_args(&keys, &packed, &dest));
    assert!(
        err.contains(
            "a.txt already exists; nothing was restored (pass --overwrite to replace files)"
        ),
        "{err}"
    );
    assert_eq!(std::fs::read(dest.join("a.txt")).unwrap(), b"old\n");
    let mut args = unpack_args(&keys, &packed, &dest);
    args.push("--overwrite".into());
    ok(&args);
    assert_eq!(
        std::fs::read(dest.join("a.txt")).unwrap(),
        b"new contents\n"
    );
}

/// What is already at the destination is checked before anything is restored: a directory
/// where a directory goes is fine (a second `--overwrite` run), a directory where a file goes
/// is refused with or without `--overwrite`, which replaces only files.
#[test]
fn a_directory_in_the_way_of_a_file_is_refused_up_front() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = keygen(&tmp.path().join("keys"));
    let src = tmp.path().join("src");
    write(&src.join("x/data.bin"), b"data\n");
    std::fs::create_dir_all(src.join("empty")).unwrap();
    let packed = tmp.path().join("packed");
    pack(&keys, &src, &packed);
    let dest = tmp.path().join("dest");
    let mut overwrite = unpack_args(&keys, &packed, &dest);
    overwrite.push("--overwrite".into());
    let mut first = unpack_args(&keys, &packed, &dest);
    first.push("--json".into());
    let summary: serde_json::Value = crate::common::strict_json(&ok(&first));
    let delivered = &summary["delivered"];
    assert_eq!(
        (&delivered["files"], &delivered["directories"]),
        (&serde_json::json!(1), &serde_json::json!(1)),
        "{delivered}"
    );
    ok(&overwrite);
    assert!(dest.join("empty").is_dir());
    assert_eq!(std::fs::read(dest.join("x/data.bin")).unwrap(), b"data\n");

    std::fs::remove_file(dest.join("x/data.bin")).unwrap();
    std::fs::create_dir(dest.join("x/data.bin")).unwrap();
    for args in [unpack_args(&keys, &packed, &dest), overwrite] {
        let err = fails(&args);
        assert!(
            err.contains("data.bin already exists and is a directory, where a file is to go"),
            "{err}"
        );
        assert!(dest.join("x/data.bin").is_dir(), "nothing was touched");
    }
}

/// An archive directory holds object directories and its inventory, nothing else: a stray
/// file, or a file named like an object, is named and nothing is restored.
#[test]
fn anything_but_objects_in_an_archive_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = keygen(&tmp.path().join("keys"));
    let src = tmp.path().join("src");
    write(&src.join("a.txt"), b"contents\n");
    let packed = tmp.path().join("packed");
    pack(&keys, &src, &packed);
    for stray in ["notes.txt", "0123456789abcdef0123456789abcdef"] {
        let path = packed.join(stray);
        write(&path, b"not an object\n");
        let dest = tmp.path().join(format!("dest-{stray}"));
        let err = fails(&unpack_args(&keys, &packed, &dest));
        assert!(
            err.contains("is not only object directories")
                && err.contains(&path.display().to_string()),
            "{err}"
        );
        assert!(is_empty_dir(&dest));
        std::fs::remove_file(&path).unwrap();
    }
}

/// A file that changes while `pack` reads it (its mtime, or its size) fails, named in the
/// error, and no object of it is written; the other files are packed. The change is made once
/// `pack` has written a few parts of the large file (so it was listed and is being read), and
/// long before its last part is read (at most two parts are in flight); should the pack still
/// win the race, it is tried again.
#[test]
fn a_file_changed_while_being_read_fails_and_is_not_packed() {
    for (case, change) in [
        (
            "mtime",
            (|p: &std::path::Path| {
                let later = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
                std::fs::File::options()
                    .write(true)
                    .open(p)
                    .unwrap()
                    .set_modified(later)
                    .unwrap();
            }) as fn(&std::path::Path),
        ),
        ("append", |p: &std::path::Path| {
            std::fs::File::options()
                .append(true)
                .open(p)
                .unwrap()
                .write_all(b"one more line\n")
                .unwrap();
        }),
    ] {
        changed_while_read(case, change);
    }
}

fn changed_while_read(case: &str, change: fn(&std::path::Path)) {
    let tmp = tempfile::tempdir().unwrap();
    let keys = keygen(&tmp.path().join("keys"));
    let src = tmp.path().join("src");
    write(&src.join("steady.txt"), b"this file does not change\n");
    let big = src.join("growing.bin");
    let part_files = |dir: &std::path::Path| -> usize {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|o| std::fs::read_dir(o.path()).into_iter().flatten().flatten())
            .filter(|f| f.file_name().to_string_lossy().starts_with("part-"))
            .count()
    };
    for attempt in 0..5 {
        write(&big, &sample_bytes(64 * MIB, attempt));
        let packed = tmp.path().join(format!("packed-{attempt}"));
        let child = forte()
            .args(args![
                "--catalog",
                tmp.path().join("catalog.sqlite"),
                "pack",
                &src,
                "--to",
                &packed,
                "--recipient",
                &keys.core_pub,
                "--sign",
                &keys.edge_key,
                "--part-size",
                "1MiB",
                "--cpu",
                "1",
                "--parts-in-flight",
                "2",
                "--level",
                "9",
                "-q",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Parts of the large file are being written: it was listed and is being read.
        let started = std::time::Instant::now();
        while part_files(&packed) < 4 && started.elapsed().as_secs() < 60 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        change(&big);
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        if out.status.success() {
            eprintln!("{case}, attempt {attempt}: pack succeeded (did it read the whole file before the change?)");
            continue;
        }
        assert_eq!(out.status.code(), Some(1), "{case}: {stderr}");
        assert!(
            stderr.contains("growing.bin") && stderr.contains("changed while being read"),
            "{case}: the error names the file: {stdout}\n{stderr}"
        );
        // Nothing of the changed file is left: not its manifest, not its parts.
        let left = objects(&packed);
        let paths: Vec<String> = left
            .iter()
            .map(|o| {
                assert!(
                    o.join("manifest.age").exists(),
                    "{case}: {} holds parts without a manifest",
                    o.display()
                );
                manifest_json(&keys, o)["path"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(
            paths,
            ["steady.txt"],
            "{case}: only the unchanged file is packed\n{stderr}"
        );
        return;
    }
    panic!(
        "{case}: pack succeeded 5 times although the file changed each time after 4 of its 64 \
         parts were written, with at most 2 in flight: the change was not detected"
    );
}
