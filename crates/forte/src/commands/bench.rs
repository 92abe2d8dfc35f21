//! `forte bench compress`: every zstd level on the user's own files, to choose `--level` for
//! their data and link. The work is `forte_edge::level_sweep`; the developers' measurements
//! (gzip, lz4 and bzip2 beside zstd, ingest, catalogue claims) are the `forte-bench` binary.

use std::path::PathBuf;

use anyhow::Result;
use forte_daemon::units::{parse_rate, parse_size};
use forte_edge::level_sweep::{self, Options, Sweep};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Every zstd level on your files, run in parallel parts as forte runs them: speed, ratio,
    /// the end-to-end rate each would give over your link, the Pareto front, and a recommended
    /// level.
    Compress(Compress),
}

#[derive(clap::Args)]
struct Compress {
    /// Files or directories to sample (directories are walked; symlinks are not followed).
    #[arg(required = true, value_name = "SAMPLE")]
    samples: Vec<PathBuf>,
    /// The link the data will cross, for the predicted end-to-end rate (e.g. 65MB, 520mbit).
    #[arg(long, default_value = "65MB", value_parser = parse_rate)]
    link: f64,
    /// Bytes to measure on, taken in evenly spread 1 MiB slices of the files; `all` for all.
    #[arg(long, default_value = "64MiB")]
    sample_size: String,
    /// Raw bytes per part, compressed independently as forte does.
    #[arg(long, default_value = "16MiB", value_parser = parse_size)]
    part_size: u64,
    /// Threads compressing parts (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Write the speed-vs-ratio chart as DIR/compress.svg and DIR/compress.png.
    #[arg(long, value_name = "DIR")]
    plot: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<bool> {
    let What::Compress(b) = args.what;
    let options = Options {
        samples: b.samples,
        link: b.link,
        sample_size: b.sample_size,
        part_size: b.part_size,
        threads: b.threads,
    };
    let sweep = Sweep::run(&options, level_sweep::zstd_levels(), |line| {
        eprintln!("{line}")
    })?;
    print!("{}", sweep.table());
    println!("\n{}", sweep.recommendation());
    if let Some(dir) = &b.plot {
        let path = sweep.chart(dir)?;
        println!("chart: {} and compress.png", path.display());
    }
    Ok(true)
}
