//! Steps 1 to 5: keys, sample data packed and unpacked without a network, then compared.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use crate::data::{tree_digest, write_sample};
use crate::shell::{words, Forte};
use crate::SITE;

/// The demo's key files, as `forte keygen --core` and `--edge SITE` name them.
pub(crate) struct Keys {
    pub core_key: PathBuf,
    pub core_pub: PathBuf,
    pub receipt_key: PathBuf,
    pub receipt_pub: PathBuf,
    pub edge_key: PathBuf,
    pub edge_pub: PathBuf,
}

/// Steps 1 to 5: keys, sample data packed and unpacked without a network, then compared.
pub(crate) fn offline(forte: &Forte, root: &Path) -> Result<Keys> {
    let dir = root.join("keys");
    println!("1. keys: the core's (age, to decrypt; receipts, to sign) on the core, the site's (Ed25519, to sign) at the edge");
    forte.run(&words!["keygen", "--core", "--dir", &dir])?;
    forte.run(&words!["keygen", "--edge", SITE, "--dir", &dir])?;
    let keys = Keys {
        core_key: dir.join("core.key"),
        core_pub: dir.join("core.pub"),
        receipt_key: dir.join("receipt.key"),
        receipt_pub: dir.join("receipt.pub"),
        edge_key: dir.join(format!("{SITE}.key")),
        edge_pub: dir.join(format!("{SITE}.pub")),
    };
    let (sample, packed, restored) = (
        root.join("sample"),
        root.join("packed"),
        root.join("restored"),
    );
    let bytes = write_sample(&sample)?;
    println!(
        "2. sample data: {:.1} MB of one vehicle's recordings in {} (float32 signals, a CAN log, camera frames)",
        bytes as f64 / 1e6,
        sample.display()
    );
    println!("3. pack: one pass (hash, zstd -3, age, hash) into objects, encrypted to the core, signed by the site");
    forte.run(&words![
        "pack",
        &sample,
        "--to",
        &packed,
        "--recipient",
        &keys.core_pub,
        "--sign",
        &keys.edge_key
    ])?;
    println!("4. unpack: verify ciphertext hashes, the site's signature, AEAD and raw hashes, then restore all or nothing");
    let trust = format!("{SITE}={}", keys.edge_pub.display());
    forte.run(&words![
        "unpack",
        &packed,
        "--to",
        &restored,
        "--identity",
        &keys.core_key,
        "--trust",
        trust
    ])?;
    let before = tree_digest(&sample)?;
    if before != tree_digest(&restored)? {
        bail!("restored tree differs from the sample: this is a bug, please report it");
    }
    println!(
        "5. compare: all {} entries identical to the source (SHA-256 of every file, mtimes, empty directories); \
         without forte: age -d -i {} {}/<id>/part-000000.zst.age | zstd -d | head",
        before.len(),
        keys.core_key.display(),
        packed.display()
    );
    Ok(keys)
}
