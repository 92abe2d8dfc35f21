//! `forte bench compress`: every zstd level on the user's own files, to choose `--level` for
//! their data and link. The work is `forte_edge::level_sweep`; the developers' measurements
//! (gzip, lz4 and bzip2 beside zstd, ingest, catalogue claims) are the `forte-bench` binary.

use anyhow::Result;
use forte_edge::level_sweep::{self, Options};

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
    Compress(Options),
}

pub fn run(args: Args) -> Result<bool> {
    let What::Compress(options) = args.what;
    level_sweep::run_and_print(&options, level_sweep::zstd_levels())
}
