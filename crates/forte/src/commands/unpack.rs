use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::Result;
use forte_format::{Identities, TrustedEdges};
use forte_pipeline::StageSnapshot;
use forte_restore::{Delivered, DirSource, Existing, Restore, RestoreConfig};
use serde::Serialize;

use super::{mb_per_s, Output};
use crate::config::{required, Config};
use crate::progress::with_progress;
use crate::units::human;

#[derive(clap::Args)]
pub struct Args {
    /// Directory of packed objects (the output of `forte pack`).
    dir: PathBuf,
    /// Destination directory; files appear only after everything verified.
    #[arg(long, value_name = "DEST")]
    to: PathBuf,
    #[command(flatten)]
    open: OpenArgs,
    /// Replace files that already exist at the destination.
    #[arg(long)]
    overwrite: bool,
    #[command(flatten)]
    output: Output,
}

#[derive(Serialize)]
struct Summary<'a> {
    command: &'static str,
    delivered: &'a Delivered,
    seconds: f64,
    raw_mb_per_s: f64,
    stages: Vec<StageSnapshot>,
}

/// The keys and knobs that open objects at the core; shared by `unpack` and `pull`.
#[derive(clap::Args)]
pub struct OpenArgs {
    /// age identity file of the core (core.key) [config: keys.identity].
    #[arg(long, value_name = "FILE")]
    identity: Option<PathBuf>,
    /// Trusted edge public key (edge.pub); repeat for several edges [config: keys.trust].
    #[arg(long, value_name = "FILE")]
    trust: Vec<PathBuf>,
    /// CPU budget [config: prepare.cpu] [default: all cores].
    #[arg(long)]
    cpu: Option<usize>,
    /// Files written to the destination at once [default: 2].
    #[arg(long, value_name = "N")]
    writers: Option<usize>,
}

impl OpenArgs {
    /// The core's identities, the trusted edge keys, and restore settings, from flags over
    /// the configuration.
    pub fn load(&self, config: &Config) -> Result<(Identities, TrustedEdges, RestoreConfig)> {
        let identity = required(
            self.identity.clone(),
            config.keys.identity.clone(),
            "no identity: pass --identity core.key or set keys.identity in the config file",
        )?;
        let trust = if self.trust.is_empty() {
            config.keys.trust.clone()
        } else {
            self.trust.clone()
        };
        if trust.is_empty() {
            anyhow::bail!(
                "no trusted edge key: pass --trust edge.pub or set keys.trust in the config file"
            );
        }
        let mut settings = RestoreConfig::for_this_machine();
        if let Some(cpu) = self.cpu.or(config.prepare.cpu) {
            settings.cpu = cpu.max(1);
            settings.parts_in_flight = settings.cpu + 4;
        }
        if let Some(writers) = self.writers {
            settings.writers = writers.max(1);
        }
        Ok((
            Identities::load(&identity)?,
            TrustedEdges::load(&trust)?,
            settings,
        ))
    }
}

pub fn run(args: Args, config: &Config) -> Result<bool> {
    let (identities, trusted, mut settings) = args.open.load(config)?;
    if args.overwrite {
        settings.existing = Existing::Overwrite;
    }
    let started = Instant::now();
    let (delivered, restore_stages) = unpack(
        &args.dir,
        &args.to,
        settings,
        &identities,
        &trusted,
        args.output.quiet,
    )?;
    let seconds = started.elapsed().as_secs_f64();
    if !delivered.inventory {
        eprintln!(
            "warning: {} carries no signed inventory (packed by a forte before object format 2): every file was verified, but nothing proves that no object was removed from or added to the archive",
            args.dir.display()
        );
    }
    if args.output.json {
        let summary = Summary {
            command: "unpack",
            delivered: &delivered,
            seconds,
            raw_mb_per_s: mb_per_s(delivered.bytes, seconds),
            stages: restore_stages,
        };
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        println!(
            "restored {} files and {} empty directories ({}) into {} in {:.2} s: {:.1} MB/s, all verified{}",
            delivered.files,
            delivered.directories,
            human(delivered.bytes),
            args.to.display(),
            seconds,
            mb_per_s(delivered.bytes, seconds),
            if delivered.inventory {
                ", and exactly the archive's signed inventory"
            } else {
                ""
            }
        );
    }
    Ok(true)
}

/// Restores `dir` into `to`, all or nothing; used by `unpack` and `demo`.
pub fn unpack(
    dir: &Path,
    to: &Path,
    settings: RestoreConfig,
    identities: &Identities,
    trusted: &TrustedEdges,
    quiet: bool,
) -> Result<(Delivered, Vec<StageSnapshot>)> {
    let restore = Restore::new(settings, identities, trusted);
    let total = dir_size(dir);
    let delivered = with_progress(
        total,
        quiet,
        || {
            let t = &restore.totals;
            (
                t.sealed_bytes.load(Ordering::Relaxed),
                format!("restored {}", human(t.raw_bytes.load(Ordering::Relaxed))),
            )
        },
        || {
            restore.run(
                &DirSource {
                    root: dir.to_path_buf(),
                },
                to,
                &|m| m.path.clone(),
            )
        },
    )?;
    Ok((delivered, restore.pipeline.snapshot()))
}

/// Bytes under `dir`, one level of object directories deep: the progress bar's total.
fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_dir(e.path()).ok())
        .flat_map(|files| files.flatten())
        .filter_map(|f| f.metadata().ok())
        .map(|m| m.len())
        .sum()
}
