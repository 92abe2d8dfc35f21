//! `forte status`: what the catalogue knows. The work is `forte_report::status::show`; this
//! parses and calls it.

use anyhow::Result;
use forte_catalog::Catalog;
use forte_report::status::{show, View};

#[derive(clap::Args)]
pub struct Args {
    /// Show one file's lineage, from discovery to delivery: a path in its batch, or its
    /// delivered path under the destination [per run].
    #[arg(long, value_name = "PATH")]
    file: Option<String>,
    /// Show the resource utilisation samples (1 Hz: CPU, memory, disk, network) instead [per run].
    #[arg(long, conflicts_with = "file")]
    usage: bool,
    /// Print JSON instead of text [per run].
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args, catalog: &Catalog) -> Result<bool> {
    let view = match &args.file {
        Some(path) => View::Lineage(path),
        None if args.usage => View::Usage,
        None => View::Overview,
    };
    show(catalog, view, args.json)?;
    Ok(true)
}
