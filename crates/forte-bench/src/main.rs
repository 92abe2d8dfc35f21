//! `forte-bench`: the developers' measurements of forte against its baselines, run side by side
//! in one invocation so the ratios hold on a noisy machine. Not part of the shipped `forte`
//! binary, which keeps only what users run on their own data (`forte bench compress`, the zstd
//! levels); this binary carries the dependencies only these measurements need (arrow's
//! ArrowWriter, gzip, lz4, bzip2). See docs/benchmarks.md.

mod claims;
mod compress;
mod ingest;
mod ingest_contenders;
mod wanem;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "forte-bench",
    version,
    about = "Developers' measurements of forte against its baselines (not part of the forte binary)",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
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
    /// A packet-level WAN between two network namespaces over TUN devices: round trip, loss
    /// (independent or in bursts), link rate and queue, for TCP to meet (root).
    Wanem(wanem::WanEm),
}

fn main() -> ExitCode {
    let result = match Cli::parse().what {
        What::Compress(b) => compress::run(b),
        What::Ingest(b) => ingest::run(b),
        What::Claims(b) => claims::run(b),
        What::Wanem(b) => wanem::run(b),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
