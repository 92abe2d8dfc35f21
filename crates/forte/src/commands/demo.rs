//! `forte demo`: the whole path on generated sample data, narrated: keys, offline pack/unpack,
//! then this binary as relay, sender and puller on loopback, then status and report; each step
//! printed as the `forte` command a user would type, then run. The work is `forte_demo::run`;
//! this parses and calls it.

use std::path::PathBuf;

use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {
    /// Working directory for the demo; replaced if an earlier demo made it [per run].
    #[arg(long, default_value = "demo-out")]
    dir: PathBuf,
}

pub fn run(args: Args) -> Result<bool> {
    forte_demo::run(&args.dir)
}
