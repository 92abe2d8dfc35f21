//! Packed objects are standard files: stock `age`, `zstd` and `openssl` read them without forte.

use std::process::Stdio;

use crate::common::*;

#[test]
fn stock_age_and_zstd_restore_every_part() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = keygen(&tmp.path().join("keys"));
    let file = tmp.path().join("src/recording.bin");
    let original = sample_bytes(40 << 20, 7); // three parts of 16 MiB
    write(&file, &original);
    let packed = tmp.path().join("packed");
    pack(&keys, &file, &packed);

    let objects = objects(&packed);
    assert_eq!(objects.len(), 1);
    let manifest = manifest_json(&keys, &objects[0]);
    assert_eq!(manifest["path"], "recording.bin");
    assert_eq!(manifest["format"], "forte-object/4");
    let parts = manifest["parts"].as_array().unwrap();
    assert_eq!(parts.len(), 3);

    let mut joined = Vec::new();
    for i in 0..parts.len() {
        let part = objects[0].join(format!("part-{i:06}.zst.age"));
        let mut age = tool("age")
            .arg("-d")
            .arg("-i")
            .arg(&keys.core_key)
            .arg(&part)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let zstd = tool("zstd")
            .args(["-d", "-q", "-c"])
            .stdin(age.stdout.take().unwrap())
            .output()
            .unwrap();
        assert!(
            age.wait().unwrap().success(),
            "age -d on {}",
            part.display()
        );
        assert!(
            zstd.status.success(),
            "zstd -d on {}: {}",
            part.display(),
            String::from_utf8_lossy(&zstd.stderr)
        );
        joined.extend_from_slice(&zstd.stdout);
    }
    assert!(
        joined == original,
        "age -d | zstd -d of the parts, concatenated, differs from the source"
    );

    let sha = String::from_utf8(stdout_of(tool("sha256sum").arg(&file))).unwrap();
    assert_eq!(
        manifest["sha256"].as_str().unwrap(),
        sha.split_whitespace().next().unwrap()
    );
}

#[test]
fn keys_are_standard_formats() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = keygen(&tmp.path().join("keys"));
    // The age identity gives the recipient we wrote.
    let recipient = stdout_of(tool("age-keygen").arg("-y").arg(&keys.core_key));
    assert_eq!(recipient, std::fs::read(&keys.core_pub).unwrap());
    // The edge key is PKCS#8 Ed25519 whose public half is edge.pub.
    let public = stdout_of(
        tool("openssl")
            .args(["pkey", "-pubout", "-in"])
            .arg(&keys.edge_key),
    );
    assert_eq!(public, std::fs::read(&keys.edge_pub).unwrap());
}

#[test]
fn files_encrypted_by_stock_age_to_core_pub_are_not_mistaken_for_objects() {
    // A relay or attacker holding only core.pub can encrypt anything to the core, but cannot
    // sign as the edge: such a manifest is refused.
    let tmp = tempfile::tempdir().unwrap();
    let keys = keygen(&tmp.path().join("keys"));
    let packed = tmp.path().join("packed");
    let object = packed.join("0123456789abcdef0123456789abcdef");
    std::fs::create_dir_all(&object).unwrap();
    let forged = tmp.path().join("forged.json");
    write(&forged, br#"{"format":"forte-object/1","path":"evil.sh"}"#);
    let status = tool("age")
        .arg("-R")
        .arg(&keys.core_pub)
        .arg("-o")
        .arg(object.join("manifest.age"))
        .arg(&forged)
        .status()
        .unwrap();
    assert!(status.success());
    let dest = tmp.path().join("dest");
    let err = fails(&unpack_args(&keys, &packed, &dest));
    assert!(
        err.contains("0123456789abcdef0123456789abcdef") && err.contains("no valid signature"),
        "{err}"
    );
    assert!(is_empty_dir(&dest));
}
