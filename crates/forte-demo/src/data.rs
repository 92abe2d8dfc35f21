//! The demo's generated data: a sample tree for the offline steps, an inbox of 14 batches
//! sized like the FORTE test set for the network steps, and the digest of a tree that compares
//! what arrived with what left.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use crate::MARKER;

/// Batch sizes of the FORTE test set in GB (A–N), from the thesis' Table 6.5.
const FORTE_BATCHES: [(char, f64); 14] = [
    ('A', 0.9),
    ('B', 2.7),
    ('C', 30.0),
    ('D', 24.3),
    ('E', 5.9),
    ('F', 29.5),
    ('G', 21.2),
    ('H', 27.4),
    ('I', 94.8),
    ('J', 39.7),
    ('K', 43.6),
    ('L', 4.5),
    ('M', 3.1),
    ('N', 9.3),
];

/// 14 batches with sizes proportional to the paper's (about 30 MB in all): bag files of up to
/// 2 MB of noisy float32 signals, plus a text log, and a `.ready` marker.
pub(crate) fn write_batches(inbox: &Path) -> Result<u64> {
    let mut noise = Noise(0xba7c4);
    let mut total = 0;
    for (name, gb) in FORTE_BATCHES {
        let dir = inbox.join(format!("batch-{name}"));
        let mut left = (gb * 90_000.0) as usize;
        let mut n = 0;
        while left > 0 {
            let size = left.min(2 << 20);
            let samples: Vec<u8> = (0..size / 4)
                .flat_map(|i| {
                    ((i as f32 / 40.0).sin() + (noise.next() % 100) as f32 / 5000.0).to_le_bytes()
                })
                .collect();
            std::fs::create_dir_all(dir.join("bags"))?;
            total += write(&dir.join(format!("bags/{n:04}.bag")), &samples)?;
            left -= size;
            n += 1;
        }
        let log: String = (0..2000)
            .map(|i| {
                format!(
                    "t={i} can0 speed={} rpm={}\n",
                    noise.next() % 60,
                    noise.next() % 3000
                )
            })
            .collect();
        total += write(&dir.join("vehicle.log"), log.as_bytes())?;
        write(&dir.join(".ready"), b"")?;
    }
    Ok(total)
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

pub(crate) fn write_sample(root: &Path) -> Result<u64> {
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
