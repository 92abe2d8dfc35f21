//! `forte unpack`: an archive verified and restored, all or nothing, offline.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use forte_pipeline::Reading;
use forte_restore::{Delivered, Existing};
use serde::Serialize;

use super::Output;
use forte_core::unpack::unpack;
use forte_daemon::settings::{self, Config, CoreFlags};
use forte_daemon::units::{human, mb_per_s};

#[derive(clap::Args)]
pub struct Args {
    /// Directory of packed objects (the output of `forte pack`) [per run].
    dir: PathBuf,
    /// Destination directory; files appear only after everything verified [per run].
    #[arg(long, value_name = "DEST")]
    to: PathBuf,
    #[command(flatten)]
    core: CoreFlags,
    /// Replace files that already exist at the destination [per run].
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
    #[serde(flatten)]
    pipeline: Reading,
}

pub fn run(args: Args, config: &Config) -> Result<bool> {
    // An archive is not filed under a site by any relay: a key given without a site is
    // trusted for whatever site it signed.
    let mut core = settings::core(&args.core, config, true)?;
    if args.overwrite {
        core.restore.existing = Existing::Overwrite;
    }
    let started = Instant::now();
    let (delivered, pipeline) = unpack(&args.dir, &args.to, core, args.output.quiet)?;
    let seconds = started.elapsed().as_secs_f64();
    if !delivered.inventory {
        tracing::warn!("{} carries no signed inventory (packed by a forte before object format 2): every file was verified, but nothing proves that no object was removed from or added to the archive",
            args.dir.display()
        );
    }
    if args.output.json {
        let summary = Summary {
            command: "unpack",
            delivered: &delivered,
            seconds,
            raw_mb_per_s: mb_per_s(delivered.bytes, seconds),
            pipeline,
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
