//! `forte status`: what the catalogue knows. The work is `forte_report::status::show`; this
//! parses, resolves the window once and calls it.

use anyhow::Result;
use forte_catalog::Catalog;
use forte_daemon::units::parse_moment;
use forte_report::status::{show, View, Window};
use forte_view::model::{day_ago, hour_ago};

#[derive(clap::Args)]
pub struct Args {
    /// Show one file's lineage, from discovery to delivery: a path in its batch, or its
    /// delivered path under the destination [per run].
    #[arg(long, value_name = "PATH", conflicts_with_all = ["usage", "site", "batch", "since", "until", "limit"])]
    file: Option<String>,
    /// Show the resource utilisation samples (CPU, memory, disk, network: 1 s for the last
    /// day, then 1-min and 1-h rollups) of the last hour, or of --since/--until, instead
    /// [per run].
    #[arg(long, conflicts_with_all = ["site", "batch", "limit"])]
    usage: bool,
    /// Only this site's batches (at the core: the site that sent them) [per run].
    #[arg(long)]
    site: Option<String>,
    /// Only the batch of this name, whatever its age (unless --since is given) [per run].
    #[arg(long, value_name = "NAME")]
    batch: Option<String>,
    /// Batches changed at or after this moment: an age (1d, 12h, 2w) or a date (2026-12-01,
    /// local time, or RFC 3339). Default: the last day (--usage: the last hour) [per run].
    #[arg(long, value_parser = parse_moment, value_name = "WHEN")]
    since: Option<i64>,
    /// Batches changed at or before this moment (as --since) [per run].
    #[arg(long, value_parser = parse_moment, value_name = "WHEN")]
    until: Option<i64>,
    /// Show at most this many batches in detail, the latest first; the summary counts them
    /// all [per run].
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i64).range(0..=100_000))]
    limit: i64,
    /// Print JSON instead of text [per run].
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args, catalog: &Catalog) -> Result<bool> {
    // The usage of the last hour, the batches of the last day (the dashboard's defaults); a
    // batch asked for by name is wanted whatever its age.
    let back = match (args.usage, &args.batch) {
        (true, _) => Some(hour_ago()),
        (false, None) => Some(day_ago()),
        (false, Some(_)) => None,
    };
    let window = Window {
        site: args.site,
        batch: args.batch,
        since: args.since.or(back),
        until: args.until,
        limit: args.limit,
    };
    let view = match &args.file {
        Some(path) => View::Lineage(path),
        None if args.usage => View::Usage(&window),
        None => View::Overview(&window),
    };
    show(catalog, view, args.json)?;
    Ok(true)
}
