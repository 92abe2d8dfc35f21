//! `forte bench`: measurements that need forte's own internals, run side by side with their
//! baselines in one invocation so the ratios hold on a noisy machine.

mod claims;
mod compress;
mod ingest;
mod ingest_contenders;

use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Every level of zstd, gzip and lz4 (bzip2 with --bzip2) on your files, run in parallel
    /// parts as forte runs them: speed, ratio, the end-to-end rate each would give over your
    /// link, the Pareto front, and a recommended level.
    Compress(compress::CompressBench),
    /// Ingest: compression with and without BYTE_STREAM_SPLIT, throughput on one core against
    /// pyarrow and arrow-rs's ArrowWriter, and how many paper-rate streams run without a gap.
    Ingest(ingest::IngestBench),
    /// Leases: how many batches a catalogue (PostgreSQL, or SQLite) grants per second to core
    /// workers competing for the same batches, each granted exactly once.
    Claims(claims::ClaimsBench),
}

pub fn run(args: Args) -> Result<bool> {
    match args.what {
        What::Compress(b) => compress::run(b),
        What::Ingest(b) => ingest::run(b),
        What::Claims(b) => claims::run(b),
    }
}
