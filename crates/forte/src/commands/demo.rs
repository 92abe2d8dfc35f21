//! `forte demo`: the whole path on generated sample data, narrated: offline pack/unpack, then
//! this binary as relay, sender and puller on loopback.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context, Result};
use forte_catalog::Role;
use forte_format::keys::{generate, KeyPaths};
use forte_format::{EdgeKey, Identities, Recipients};
use forte_prepare::{BundleLimits, PrepareConfig};
use forte_restore::RestoreConfig;
use sha2::{Digest, Sha256};

use forte_core::unpack::unpack;
use forte_daemon::settings::{CoreSettings, EdgeSettings};
use forte_daemon::units::human;
use forte_edge::pack::pack;

#[derive(clap::Args)]
pub struct Args {
    /// Working directory for the demo; replaced if an earlier demo made it.
    #[arg(long, default_value = "demo-out")]
    dir: PathBuf,
}

const MARKER: &str = ".forte-demo";

pub fn run(args: Args) -> Result<bool> {
    let root = &args.dir;
    fresh_demo_dir(root)?;
    let keys = root.join("keys");
    println!(
        "1. keygen: core age key pair and edge Ed25519 key pair in {}",
        keys.display()
    );
    let paths = generate(&keys)?;
    offline(root, &paths)?;
    network(root, &paths)
}

/// Makes `root` empty, refusing a directory that an earlier demo did not make.
fn fresh_demo_dir(root: &Path) -> Result<()> {
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
    Ok(())
}

/// Steps 2 to 5: sample data packed and unpacked without a network, then compared.
fn offline(root: &Path, paths: &KeyPaths) -> Result<()> {
    let (sample, packed, restored) = (
        root.join("sample"),
        root.join("packed"),
        root.join("restored"),
    );
    let bytes = write_sample(&sample)?;
    println!(
        "2. sample data: {} of sensor recordings in {}",
        human(bytes),
        sample.display()
    );

    let edge = EdgeSettings {
        recipients: Recipients::load(&paths.core_pub)?,
        key: EdgeKey::load(&paths.edge_key)?,
        prepare: PrepareConfig::for_this_machine(),
        bundle: BundleLimits::DEFAULT,
    };
    let summary = pack(&sample, &packed, "sample", edge, true)?;
    println!(
        "3. pack: {} files and {} empty directories in one pass (hash, zstd -{}, age, hash) into {} objects ({} bundles of small files) in {}: {:.1} MB/s, ratio {:.2}",
        summary.files,
        summary.directories,
        summary.level,
        summary.stored_objects,
        summary.bundles,
        packed.display(),
        summary.raw_mb_per_s,
        summary.ratio
    );
    if summary.failed > 0 {
        bail!("{} files failed to pack", summary.failed);
    }

    let core = CoreSettings {
        identities: Identities::load(&paths.core_key)?,
        trusted: forte_daemon::settings::TrustedKeys::load(vec![
            forte_format::TrustSpec::any_site(&paths.edge_pub),
        ])?,
        restore: RestoreConfig::for_this_machine(),
    };
    let (delivered, _) = unpack(&packed, &restored, core, true)?;
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
    Ok(())
}

/// Steps 6 to 12, the network path on loopback: this binary as relay, sender and puller.
fn network(root: &Path, keys: &KeyPaths) -> Result<bool> {
    let inbox = root.join("inbox");
    let bytes = write_batches(&inbox)?;
    println!(
        "6. inbox: 14 batches A–N sized like the FORTE test set (scaled to {}), bag files and logs, in {}",
        human(bytes),
        inbox.display()
    );
    let me = std::env::current_exe().context("finding the forte binary")?;
    let mut relay = start_relay(root, &me)?;
    let result = relay_address(&mut relay).and_then(|(url, fingerprint)| {
        println!(
            "7. relay: {url} (HTTPS, self-signed certificate pinned by sha256 {}…)",
            &fingerprint[..16]
        );
        let demo = Loopback {
            me: &me,
            root,
            url,
            fingerprint,
        };
        demo.send_and_pull(keys, &inbox)
    });
    let _ = relay.kill();
    let _ = relay.wait();
    result?;
    println!(
        "11. catalogues: `forte --catalog {0}/core-catalog.sqlite status` lists every batch and file; \
         `… status --file mine-site/batch-A/vehicle.log` prints its lineage",
        root.display()
    );
    println!(
        "12. KPIs: `forte --catalog {0}/edge-catalog.sqlite report --with {0}/core-catalog.sqlite \
         --nominal-rate 3.36TB/day --charts {0}/charts` splits each batch's latency into queueing and \
         processing per task and draws its timeline",
        root.display()
    );
    Ok(true)
}

/// Writes the relay's tokens (one edge, one core) and starts `forte relay` on a free port.
fn start_relay(root: &Path, me: &Path) -> Result<Child> {
    let tokens = root.join("relay-tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[token]]\ntoken = \"{EDGE_TOKEN}\"\nrole = \"edge\"\nsite = \"mine-site\"\n\
             [[token]]\ntoken = \"{CORE_TOKEN}\"\nrole = \"core\"\nsites = [\"*\"]\n"
        ),
    )?;
    std::fs::write(root.join("edge.token"), EDGE_TOKEN)?;
    std::fs::write(root.join("core.token"), CORE_TOKEN)?;
    Command::new(me)
        .args(["relay", "--listen", "127.0.0.1:0", "--store"])
        .arg(root.join("relay"))
        .arg("--tokens")
        .arg(&tokens)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the relay")
}

/// This binary, and the relay it started, as the demo's edge and core see them.
struct Loopback<'a> {
    me: &'a Path,
    root: &'a Path,
    url: String,
    fingerprint: String,
}

impl Loopback<'_> {
    /// Steps 8 to 10: send the inbox, pull it, and compare what arrived.
    fn send_and_pull(&self, keys: &KeyPaths, inbox: &Path) -> Result<()> {
        println!("8. send: each batch in one pass, straight to the relay, the uploads in flight tuned to the link");
        self.forte(
            Role::Edge,
            "send",
            &["-q".as_ref(), inbox.as_os_str()],
            |c| {
                c.arg("--recipient")
                    .arg(&keys.core_pub)
                    .arg("--sign")
                    .arg(&keys.edge_key)
                    .arg("--receipt-pub")
                    .arg(&keys.receipt_pub);
            },
        )?;
        let delivered = self.root.join("dest");
        println!("9. pull: verify, decrypt, deliver each batch atomically under {{site}}/{{batch}}/{{path}}, acknowledge");
        self.forte(Role::Core, "pull", &["-q".as_ref()], |c| {
            c.arg("--to")
                .arg(&delivered)
                .arg("--identity")
                .arg(&keys.core_key)
                .arg("--trust")
                .arg(format!("mine-site={}", keys.edge_pub.display()))
                .arg("--receipt-key")
                .arg(&keys.receipt_key);
        })?;
        let sent = tree_digest(inbox)?
            .into_iter()
            .filter(|(path, _)| !path.ends_with("/.ready"))
            .collect::<BTreeMap<_, _>>();
        let arrived = tree_digest(&delivered.join("mine-site"))?;
        if sent != arrived {
            bail!("delivered files differ from the inbox: this is a bug, please report it");
        }
        let left = std::fs::read_dir(self.root.join("relay/sites/mine-site/objects"))?.count();
        if left > 0 {
            bail!("the relay still holds {left} objects after acknowledgement: this is a bug");
        }
        println!(
            "10. compare: all {} files of 14 batches arrived identical (SHA-256, mtimes); the relay kept nothing after acknowledgement",
            arrived.len()
        );
        Ok(())
    }

    /// Runs `forte COMMAND` as `role` (its own catalogue and token) against the relay.
    fn forte(
        &self,
        role: Role,
        command: &str,
        args: &[&std::ffi::OsStr],
        role_args: impl FnOnce(&mut Command),
    ) -> Result<()> {
        let mut c = Command::new(self.me);
        c.arg("--catalog")
            .arg(self.root.join(format!("{}-catalog.sqlite", role.as_str())))
            .arg(command)
            .args(args)
            .args([
                "--relay",
                &self.url,
                "--relay-fingerprint",
                &self.fingerprint,
            ])
            .arg("--token-file")
            .arg(self.root.join(format!("{}.token", role.as_str())));
        role_args(&mut c);
        let status = c.status()?;
        anyhow::ensure!(status.success(), "{command} failed");
        Ok(())
    }
}

const EDGE_TOKEN: &str = "demo-edge-token-not-secret";
const CORE_TOKEN: &str = "demo-core-token-not-secret";

/// Reads the relay's first lines for its URL and certificate fingerprint.
fn relay_address(relay: &mut Child) -> Result<(String, String)> {
    let stdout = relay.stdout.take().context("relay output")?;
    let mut lines = BufReader::new(stdout).lines();
    let (mut url, mut fingerprint) = (None, None);
    while url.is_none() || fingerprint.is_none() {
        let line = lines
            .next()
            .context("the relay stopped before it was listening")??;
        if let Some(u) = line.strip_prefix("relay listening on ") {
            url = Some(u.to_string());
        }
        if let Some(i) = line.find("sha256 fingerprint ") {
            fingerprint = Some(line[i + 19..].trim_end_matches(')').to_string());
        }
    }
    std::thread::spawn(move || for _ in lines {});
    Ok((url.expect("set"), fingerprint.expect("set")))
}

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
fn write_batches(inbox: &Path) -> Result<u64> {
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
