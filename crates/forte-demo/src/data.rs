//! The demo's generated data, shaped like real recordings so that it compresses as they do
//! (2–3× at zstd -3): float32 signals of several channels (sines and sensor noise, quantised
//! by a 16-bit ADC), CAN bus logs as `candump -L` writes them, and camera frames (PGM: a
//! smooth scene with pixel noise). A sample tree for the offline steps, an inbox of 14 batches
//! sized like the FORTE test set for the network steps, and the digest of a tree that compares
//! what arrived with what left.

use std::collections::BTreeMap;
use std::fmt::Write as _;
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

/// 14 batches with sizes proportional to the paper's (about 30 MB in all), each a `.ready`
/// marker and, of its bytes, 55 % signals (bag files of up to 2 MB), 30 % CAN log and 15 %
/// camera frames.
pub(crate) fn write_batches(inbox: &Path) -> Result<u64> {
    let mut noise = Noise(0xba7c4);
    let mut total = 0;
    for (b, (name, gb)) in FORTE_BATCHES.into_iter().enumerate() {
        let dir = inbox.join(format!("batch-{name}"));
        std::fs::create_dir_all(dir.join("bags"))?;
        let bytes = (gb * 90_000.0) as usize;
        let (mut left, mut n) = (bytes * 55 / 100, 0);
        while left >= 4 * 6 {
            let bag = signals(&mut noise, left.min(2 << 20), 6, 1000.0);
            total += write(&dir.join(format!("bags/{n:04}.bag")), &bag)?;
            (left, n) = (left - bag.len(), n + 1);
        }
        let start = 1_795_000_000.0 + 3600.0 * b as f64;
        total += write(
            &dir.join("can.log"),
            can_log(&mut noise, bytes * 30 / 100, start).as_bytes(),
        )?;
        let frames = (bytes * 15 / 100).div_ceil(320 * 240);
        if frames > 0 {
            std::fs::create_dir_all(dir.join("camera"))?;
        }
        for f in 0..frames {
            let frame = image(&mut noise, (320, 240), f as f64);
            total += write(&dir.join(format!("camera/{f:04}.pgm")), &frame)?;
        }
        write(&dir.join(".ready"), b"")?;
    }
    Ok(total)
}

/// The offline steps' tree: one vehicle's run, with what trips tools up (a file of several
/// parts, a Unicode name, a deep path, an empty file, an empty directory, a one-byte file).
pub(crate) fn write_sample(root: &Path) -> Result<u64> {
    let run = root.join("truck-017").join("2026-11-21T06-00");
    for dir in ["logs", "calibration-pending", "camera"] {
        std::fs::create_dir_all(run.join(dir))?;
    }
    let deep = run.join("bags/front/lidar/left/segment-0001");
    std::fs::create_dir_all(&deep)?;
    let mut noise = Noise(0x5eed_f00d);
    let mut total = 0u64;
    // 18 MiB of 8-channel vibration at 1 kHz: two parts at the default part size (16 MiB).
    total += write(
        &run.join("imu.f32"),
        &signals(&mut noise, 18 << 20, 8, 1000.0),
    )?;
    let can = can_log(&mut noise, 8 << 20, 1_795_240_800.0);
    total += write(&run.join("can0.log"), can.as_bytes())?;
    for f in 0..4 {
        let frame = image(&mut noise, (640, 480), f as f64);
        total += write(&run.join(format!("camera/front-{f:04}.pgm")), &frame)?;
    }
    total += write(
        &run.join("logs/système-ünïcode.log"),
        "démarrage ok\n".repeat(5000).as_bytes(),
    )?;
    total += write(
        &deep.join("scan.f32"),
        &signals(&mut noise, 300_000, 1, 10.0),
    )?;
    total += write(&run.join("empty.marker"), b"")?;
    total += write(&run.join("one-byte"), b"x")?;
    Ok(total)
}

/// About `bytes` of float32 samples (little-endian, `channels` interleaved, `rate` Hz): each
/// channel two sines and sensor noise of 0.8 LSB, quantised by a 16-bit ADC whose LSB is
/// 2⁻¹² (an accelerometer's ±8 g), as a logger stores what it read.
fn signals(noise: &mut Noise, bytes: usize, channels: usize, rate: f64) -> Vec<u8> {
    let lsb = 1.0 / 4096.0;
    let tau = std::f64::consts::TAU;
    let samples = bytes / (4 * channels);
    let mut out = Vec::with_capacity(samples * channels * 4);
    for i in 0..samples {
        let t = i as f64 / rate;
        for c in 0..channels {
            let (c, f) = (c as f64, 7.0 + 13.0 * c as f64);
            let x = (1.0 + 0.3 * c) * (t * f * tau).sin()
                + 0.2 * (t * 3.1 * f * tau + c).sin()
                + 0.8 * lsb * noise.gauss();
            let code = (x / lsb).round().clamp(-32768.0, 32767.0);
            out.extend_from_slice(&((code * lsb) as f32).to_le_bytes());
        }
    }
    out
}

/// About `bytes` of CAN frames as `candump -L` logs them (`(time) can0 ID#DATA`): six ids
/// sent every 10 ms to 500 ms, their 8 data bytes mostly constant around a wheel speed,
/// counters and a few noisy bits, as on a vehicle bus.
fn can_log(noise: &mut Noise, bytes: usize, start: f64) -> String {
    const IDS: [(u32, u64); 6] = [
        (0x0c4, 1),
        (0x1a0, 1),
        (0x2f1, 2),
        (0x3e9, 5),
        (0x18f, 10),
        (0x7df, 50),
    ];
    let mut out = String::with_capacity(bytes + 64);
    let mut speed = 4000u32;
    for tick in 0u64.. {
        speed = (i64::from(speed) + (noise.next() % 5) as i64 - 2).clamp(0, 20_000) as u32;
        for (k, (id, every)) in IDS.iter().enumerate() {
            if out.len() >= bytes {
                return out;
            }
            if tick % every != 0 {
                continue;
            }
            let [hi, lo] = (speed as u16).to_be_bytes();
            let data: [u8; 8] = match k {
                0 => [hi, lo, 0, 0, (tick & 0x0f) as u8, 0, 0, 0x3c],
                1 => [
                    0x10,
                    (speed / 80) as u8,
                    0x7d,
                    0,
                    0,
                    0,
                    (tick % 16) as u8,
                    0,
                ],
                2 => [0x5a, 0x01, (noise.next() % 4) as u8, 0, 0xff, 0xff, 0, 0],
                3 => [0, 0x58, 0, 0x58, 0, 0x58, 0, (noise.next() % 3) as u8],
                4 => [0x64, 0x23, 0, 0, 0, 0, 0, 0],
                _ => [0x02, 0x01, 0x0c, 0, 0, 0, 0, 0],
            };
            let t = start + tick as f64 * 0.01 + (k as u64 * 180 + noise.next() % 60) as f64 * 1e-6;
            let _ = write!(out, "({t:.6}) can0 {id:03X}#");
            for byte in data {
                let _ = write!(out, "{byte:02X}");
            }
            out.push('\n');
        }
    }
    out
}

/// A camera frame as a binary PGM (8-bit grey): a smooth scene, lit from one side, with the
/// sensor's pixel noise.
fn image(noise: &mut Noise, (w, h): (usize, usize), seed: f64) -> Vec<u8> {
    let mut out = format!("P5\n{w} {h}\n255\n").into_bytes();
    for y in 0..h {
        for x in 0..w {
            let (u, v) = (x as f64 / w as f64, y as f64 / h as f64);
            let scene = 40.0 + 90.0 * u + 60.0 * (3.0 * v + seed).sin().abs();
            out.push((scene + 1.2 * noise.gauss()).round().clamp(0.0, 255.0) as u8);
        }
    }
    out
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

    /// About normal, mean 0 and standard deviation 1 (four uniforms summed).
    fn gauss(&mut self) -> f64 {
        let sum: f64 = (0..4)
            .map(|_| (self.next() >> 11) as f64 / (1u64 << 53) as f64)
            .sum();
        (sum - 2.0) * 3f64.sqrt()
    }
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
