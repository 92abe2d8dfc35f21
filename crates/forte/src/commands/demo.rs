//! `forte demo`: the whole foundation on generated sample data, narrated.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use forte_format::keys::generate;
use forte_format::{EdgeKey, Identities, Recipients, TrustedEdges};
use forte_prepare::PrepareConfig;
use forte_restore::RestoreConfig;
use sha2::{Digest, Sha256};

use crate::units::human;

#[derive(clap::Args)]
pub struct Args {
    /// Working directory for the demo; replaced if an earlier demo made it.
    #[arg(long, default_value = "demo-out")]
    dir: PathBuf,
}

const MARKER: &str = ".forte-demo";

pub fn run(args: Args) -> Result<bool> {
    let root = &args.dir;
    if root.exists() {
        if !root.join(MARKER).exists() {
            bail!(
                "{} exists and was not made by `forte demo`; choose another --dir",
                root.display()
            );
        }
        std::fs::remove_dir_all(root)
            .with_context(|| format!("cannot clear {}", root.display()))?;
    }
    std::fs::create_dir_all(root).with_context(|| format!("cannot create {}", root.display()))?;
    std::fs::write(root.join(MARKER), "made by forte demo\n")?;
    let (keys, sample, packed, restored) = (
        root.join("keys"),
        root.join("sample"),
        root.join("packed"),
        root.join("restored"),
    );

    println!(
        "1. keygen: core age key pair and edge Ed25519 key pair in {}",
        keys.display()
    );
    let paths = generate(&keys)?;

    let bytes = write_sample(&sample)?;
    println!(
        "2. sample data: {} of sensor recordings in {}",
        human(bytes),
        sample.display()
    );

    let recipients = Recipients::load(&paths.core_pub)?;
    let key = EdgeKey::load(&paths.edge_key)?;
    let summary = super::pack::pack(
        &sample,
        &packed,
        PrepareConfig::for_this_machine(),
        &recipients,
        &key,
        true,
    )?;
    println!(
        "3. pack: {} files and {} empty directories in one pass (hash, zstd -{}, age, hash) into {} objects in {}: {:.1} MB/s, ratio {:.2}",
        summary.files,
        summary.directories,
        summary.level,
        summary.files + summary.directories - summary.failed,
        packed.display(),
        summary.raw_mb_per_s,
        summary.ratio
    );
    if summary.failed > 0 {
        bail!("{} files failed to pack", summary.failed);
    }

    let identities = Identities::load(&paths.core_key)?;
    let trusted = TrustedEdges::load(std::slice::from_ref(&paths.edge_pub))?;
    let (delivered, _) = super::unpack::unpack(
        &packed,
        &restored,
        RestoreConfig::for_this_machine(),
        &identities,
        &trusted,
        true,
    )?;
    println!(
        "4. unpack: verified ciphertext hashes, signatures, AEAD and raw hashes; restored {} files and {} empty directories into {}",
        delivered.files,
        delivered.directories,
        restored.display()
    );

    let before = tree_digest(&sample)?;
    let after = tree_digest(&restored)?;
    if before != after {
        bail!("restored tree differs from the sample: this is a bug, please report it");
    }
    println!(
        "5. compare: all {} entries identical to the source (SHA-256 of every file, mtimes, empty directories)",
        before.len()
    );
    println!(
        "   try: age -d -i {} {}/<id>/part-000000.zst.age | zstd -d | head",
        paths.core_key.display(),
        packed.display()
    );
    Ok(true)
}

/// A small xorshift generator: deterministic sample data without a dependency.
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn write_sample(root: &Path) -> Result<u64> {
    let run = root.join("truck-017").join("2026-11-21T06-00");
    std::fs::create_dir_all(run.join("logs"))?;
    std::fs::create_dir_all(run.join("calibration-pending"))?;
    let deep = run.join("bags/front/lidar/left/segment-0001");
    std::fs::create_dir_all(&deep)?;
    let mut noise = Noise(0x5eed_f00d);
    let mut total = 0u64;

    // 40 MiB of float32 vibration samples: three parts at the default part size.
    let mut samples = Vec::with_capacity(40 << 20);
    for i in 0..(10 << 20) {
        let t = i as f32 / 25_600.0;
        let v = (t * 50.0 * std::f32::consts::TAU).sin() + (noise.next() % 1000) as f32 / 20_000.0;
        samples.extend_from_slice(&v.to_le_bytes());
    }
    total += write(&run.join("vibration.f32"), &samples)?;

    let mut csv = String::from("time_ms,speed_kmh,rpm,coolant_c\n");
    for i in 0..200_000u64 {
        let n = noise.next();
        csv.push_str(&format!(
            "{},{},{},{}\n",
            i * 10,
            30 + n % 20,
            1200 + n % 800,
            80 + n % 7
        ));
    }
    total += write(&run.join("signals.csv"), csv.as_bytes())?;
    total += write(
        &run.join("logs/système-ünïcode.log"),
        "démarrage ok\n".repeat(5000).as_bytes(),
    )?;
    total += write(
        &deep.join("scan.bin"),
        &(0..300_000).map(|_| noise.next() as u8).collect::<Vec<_>>(),
    )?;
    total += write(&run.join("empty.marker"), b"")?;
    total += write(&run.join("one-byte"), b"x")?;
    Ok(total)
}

fn write(path: &Path, bytes: &[u8]) -> Result<u64> {
    std::fs::File::create(path)
        .and_then(|mut f| f.write_all(bytes))
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(bytes.len() as u64)
}

/// Relative path → SHA-256 and mtime of every file, and a marker for every empty directory.
pub fn tree_digest(root: &Path) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    walk(root, root, &mut out)?;
    out.remove(MARKER);
    Ok(out)
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) -> Result<()> {
    let mut empty = true;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        empty = false;
        let path = entry.path();
        let rel = path.strip_prefix(root)?.to_string_lossy().into_owned();
        let meta = entry.metadata()?;
        if meta.is_dir() {
            walk(root, &path, out)?;
        } else {
            let digest = hex::encode(Sha256::digest(std::fs::read(&path)?));
            let mtime = meta
                .modified()?
                .duration_since(std::time::UNIX_EPOCH)?
                .as_nanos();
            out.insert(rel, format!("{digest} {mtime}"));
        }
    }
    if empty && dir != root {
        out.insert(
            dir.strip_prefix(root)?.to_string_lossy().into_owned(),
            "dir".into(),
        );
    }
    Ok(())
}
