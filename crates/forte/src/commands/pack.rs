use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use forte_format::{EdgeKey, Inventory, Kind, Recipients};
use forte_pipeline::StageSnapshot;
use forte_prepare::{discover, DirSink, FileOutcome, Prepare, PrepareConfig, PrepareJob};
use serde::Serialize;

use super::{mb_per_s, ratio, Output};
use crate::config::{check_level, required, Config, Level};
use crate::progress::prepare_with_progress;
use crate::units::{human, parse_size};

#[derive(clap::Args)]
pub struct Args {
    /// A file or a directory tree to pack.
    src: PathBuf,
    /// Output directory: one `<object-id>/` directory per file.
    #[arg(long, value_name = "DIR")]
    to: PathBuf,
    #[command(flatten)]
    seal: SealArgs,
    #[command(flatten)]
    prepare: PrepareArgs,
    /// Batch name recorded in every manifest.
    #[arg(long, default_value = "")]
    batch: String,
    #[command(flatten)]
    output: Output,
}

/// The keys that seal objects; shared by `pack` and `send`.
#[derive(clap::Args)]
pub struct SealArgs {
    /// age recipient file of the core (core.pub) [config: keys.recipient].
    #[arg(long, value_name = "FILE")]
    recipient: Option<PathBuf>,
    /// Ed25519 signing key of this edge (edge.key) [config: keys.sign].
    #[arg(long, value_name = "FILE")]
    sign: Option<PathBuf>,
}

impl SealArgs {
    pub fn load(&self, config: &Config) -> Result<(Recipients, EdgeKey)> {
        let recipient = required(
            self.recipient.clone(),
            config.keys.recipient.clone(),
            "no recipient: pass --recipient core.pub or set keys.recipient in the config file",
        )?;
        let sign = required(
            self.sign.clone(),
            config.keys.sign.clone(),
            "no signing key: pass --sign edge.key or set keys.sign in the config file",
        )?;
        Ok((Recipients::load(&recipient)?, EdgeKey::load(&sign)?))
    }
}

/// Knobs of the prepare pass; shared by `pack` and `send`.
#[derive(clap::Args)]
pub struct PrepareArgs {
    /// Raw bytes per part [config: prepare.part_size] [default: 16MiB].
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    part_size: Option<u64>,
    /// zstd level, or auto: adapted between 1 and 9 to whichever of CPU and link is slower
    /// [config: prepare.level] [default: 3].
    #[arg(long, allow_negative_numbers = true, value_name = "LEVEL|auto")]
    level: Option<Level>,
    /// CPU budget: workers computing at once [config: prepare.cpu] [default: all cores].
    #[arg(long)]
    cpu: Option<usize>,
    /// Parts held in memory at once [config: prepare.parts_in_flight] [default: cpu + 4].
    #[arg(long)]
    parts_in_flight: Option<usize>,
}

/// What `pack --json` prints.
#[derive(Serialize)]
pub struct Summary {
    pub command: &'static str,
    /// Regular files, and empty directories, each one object.
    pub files: usize,
    pub directories: usize,
    pub failed: usize,
    pub raw_bytes: u64,
    pub compressed_bytes: u64,
    pub sealed_bytes: u64,
    pub ratio: f64,
    pub seconds: f64,
    pub raw_mb_per_s: f64,
    pub cpu: usize,
    pub part_size: u64,
    pub level: i32,
    pub stages: Vec<StageSnapshot>,
    pub rejected: Vec<Rejected>,
    pub objects: Vec<FileOutcome>,
}

#[derive(Serialize)]
pub struct Rejected {
    pub path: PathBuf,
    pub reason: String,
}

impl PrepareArgs {
    /// Settings from flags over the configuration over the machine's defaults.
    pub fn settings(&self, config: &Config) -> Result<PrepareConfig> {
        let mut p = PrepareConfig::for_this_machine();
        let c = &config.prepare;
        if let Some(size) = self.part_size.or(c.part_size.map(|s| s.0)) {
            if size == 0 || size > 1 << 31 {
                bail!("part size {size} is out of range (1 byte to 2 GiB; default 16MiB)");
            }
            p.part_size = size;
        }
        match self.level.or(c.level) {
            Some(Level::Fixed(level)) => {
                check_level(level)?;
                p.level = level;
            }
            Some(Level::Auto) => p.adapt = Some(Level::AUTO_BOUNDS),
            None => {}
        }
        if let Some(cpu) = self.cpu.or(c.cpu) {
            p.cpu = cpu.max(1);
            p.parts_in_flight = p.cpu + 4;
            p.sink_workers = p.cpu.max(2);
        }
        if let Some(n) = self.parts_in_flight.or(c.parts_in_flight) {
            p.parts_in_flight = n.max(1);
        }
        Ok(p)
    }
}

fn refuse_output_inside_source(src: &Path, to: &Path) -> Result<()> {
    let src = src
        .canonicalize()
        .with_context(|| format!("cannot read source {}", src.display()))?;
    let mut probe = to.to_path_buf();
    // The output may not exist yet: check its nearest existing ancestor.
    while !probe.exists() {
        if !probe.pop() {
            return Ok(());
        }
    }
    let to_real = probe
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", to.display()))?;
    if to_real.starts_with(&src) && src.is_dir() {
        bail!(
            "output {} is inside the source {}; choose an output directory outside it",
            to.display(),
            src.display()
        );
    }
    Ok(())
}

pub fn run(args: Args, config: &Config) -> Result<bool> {
    let settings = args.prepare.settings(config)?;
    let (recipients, key) = args.seal.load(config)?;
    refuse_output_inside_source(&args.src, &args.to)?;
    let summary = pack(
        &args.src,
        &args.to,
        &args.batch,
        settings,
        &recipients,
        &key,
        args.output.quiet,
    )?;
    report(&summary, &args.to, args.output.json)?;
    Ok(summary.failed == 0)
}

/// Discovers and packs `src` into `to`; used by `pack` and `demo`.
#[allow(clippy::too_many_arguments)]
pub fn pack(
    src: &Path,
    to: &Path,
    batch: &str,
    settings: PrepareConfig,
    recipients: &Recipients,
    key: &EdgeKey,
    quiet: bool,
) -> Result<Summary> {
    refuse_used_output(to)?;
    let found = discover(src)?;
    let total = found.total_bytes();
    let sink = DirSink::create(to)?;
    let (cpu, part_size, level) = (settings.cpu, settings.part_size, settings.level);
    let prepare = Prepare::new(settings, recipients, key);
    let started = Instant::now();
    let jobs: Vec<PrepareJob> = found
        .files
        .into_iter()
        .map(|source| PrepareJob {
            batch: batch.to_string(),
            ..PrepareJob::fresh(source)
        })
        .collect();
    let outcomes = prepare_with_progress(&prepare, jobs.len(), total, quiet, || {
        prepare.run(jobs, &sink)
    });
    // The inventory lists exactly the objects stored: those of failed files were removed.
    let inventory = Inventory::new(
        batch,
        outcomes
            .iter()
            .filter_map(|o| o.inventory_entry())
            .collect(),
    );
    sink.put_inventory(&inventory.seal(key, recipients))?;
    sink.finish()?;
    let seconds = started.elapsed().as_secs_f64();
    let t = &prepare.totals;
    let raw_bytes = t.raw_bytes.load(Ordering::Relaxed);
    let compressed_bytes = t.compressed_bytes.load(Ordering::Relaxed);
    Ok(Summary {
        command: "pack",
        files: outcomes.iter().filter(|o| o.kind == Kind::File).count(),
        directories: outcomes.iter().filter(|o| o.kind == Kind::Dir).count(),
        failed: outcomes.iter().filter(|o| o.error.is_some()).count(),
        raw_bytes,
        compressed_bytes,
        sealed_bytes: t.sealed_bytes.load(Ordering::Relaxed),
        ratio: ratio(raw_bytes, compressed_bytes),
        seconds,
        raw_mb_per_s: mb_per_s(raw_bytes, seconds),
        cpu,
        part_size,
        level,
        stages: prepare.pipeline.snapshot(),
        rejected: found
            .rejected
            .into_iter()
            .map(|(path, reason)| Rejected { path, reason })
            .collect(),
        objects: outcomes,
    })
}

/// An archive is one directory: its inventory lists exactly the objects in it, so objects of
/// an earlier pack in the same directory would make it unrestorable.
fn refuse_used_output(to: &Path) -> Result<()> {
    let used = match std::fs::read_dir(to) {
        Ok(mut entries) => entries.next().is_some(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(e).with_context(|| format!("cannot read output {}", to.display())),
    };
    if used {
        bail!(
            "output {} is not empty: each archive needs a directory of its own (its signed inventory lists exactly the objects in it); choose a new or empty directory",
            to.display()
        );
    }
    Ok(())
}

fn report(s: &Summary, to: &Path, json: bool) -> Result<()> {
    for r in &s.rejected {
        eprintln!("skipped {}: {}", r.path.display(), r.reason);
    }
    for o in s.objects.iter().filter(|o| o.error.is_some()) {
        eprintln!(
            "failed {}: {}",
            o.path,
            o.error.as_deref().unwrap_or_default()
        );
    }
    if json {
        println!("{}", serde_json::to_string_pretty(s)?);
        return Ok(());
    }
    println!(
        "packed {} of {} objects ({} files, {} empty directories; {}) into {} in {:.2} s: {:.1} MB/s, ratio {:.2}, {} sealed",
        s.files + s.directories - s.failed,
        s.files + s.directories,
        s.files,
        s.directories,
        human(s.raw_bytes),
        to.display(),
        s.seconds,
        s.raw_mb_per_s,
        s.ratio,
        human(s.sealed_bytes),
    );
    if s.failed > 0 {
        eprintln!("{} file(s) failed; their objects were removed", s.failed);
    }
    Ok(())
}
