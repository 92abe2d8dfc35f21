//! `forte report`: the pipeline's KPIs (FORTE §2.2) from the catalogues, with a per-batch
//! timeline, utilisation charts and, when a send tuned itself, its tuning timeline. The work
//! is `forte_report::summary::report`; this parses, calls it and prints.

use std::path::PathBuf;

use anyhow::Result;
use forte_report::kpi::ReportWindow;
use forte_report::print;
use forte_report::summary::{report, Charts, Options};

use forte_daemon::record::{self, Catalog};
use forte_daemon::units::{parse_moment, parse_rate};
use forte_edge::tuner::climb::PROBE;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Text,
    Json,
    Csv,
}

#[derive(clap::Args)]
pub struct Args {
    /// Further catalogues to join (repeatable): with separate SQLite files per node, give the
    /// edge's as --catalog and the core's here. One shared PostgreSQL catalogue needs none [config: report.with].
    #[arg(long = "with", value_name = "URL")]
    with: Vec<String>,
    /// Output format of the numbers [per run].
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Write timeline.svg/.png and utilisation.svg/.png into this directory, and tuning.svg/.png
    /// (goodput, uploads in flight and zstd level per interval) when a send tuned itself [per run].
    #[arg(long, value_name = "DIR")]
    charts: Option<PathBuf>,
    /// Title of the charts [per run].
    #[arg(long, default_value = "forte")]
    title: String,
    /// The data rate the site must sustain, e.g. 3.36TB/day (the papers' use case): prints
    /// whether the run's daily capacity does [config: report.nominal_rate].
    #[arg(long, value_name = "RATE")]
    nominal_rate: Option<String>,
    /// The edge's link rate, e.g. 65MB (per second): reports how busy the link was while
    /// batches waited for it [config: report.link_rate].
    #[arg(long, value_name = "RATE")]
    link_rate: Option<String>,
    /// Only the batches changed at or after this moment: an age (1d, 12h, 2w) or a date
    /// (2026-12-01, local time, or RFC 3339). Default: all of history [per run].
    #[arg(long, value_parser = parse_moment, value_name = "WHEN")]
    since: Option<i64>,
    /// Only the batches changed at or before this moment (as --since) [per run].
    #[arg(long, value_parser = parse_moment, value_name = "WHEN")]
    until: Option<i64>,
    /// Only this site's batches (the core's rows of it, and the edge's of the same batches)
    /// [per run].
    #[arg(long)]
    site: Option<String>,
}

/// A rate flag in bytes per second, if given.
fn rate(flag: &str, text: &Option<String>) -> Result<Option<f64>> {
    text.as_deref()
        .map(|t| parse_rate(t).map_err(|e| anyhow::anyhow!("--{flag}: {e}")))
        .transpose()
}

pub fn run(args: Args, catalog: &Catalog) -> Result<bool> {
    let options = Options {
        nominal_rate: rate("nominal-rate", &args.nominal_rate)?,
        link_rate: rate("link-rate", &args.link_rate)?,
        charts: args.charts.as_deref().map(|dir| Charts {
            dir,
            title: &args.title,
            tuning_interval: PROBE,
        }),
        window: ReportWindow {
            since: args.since,
            until: args.until,
            site: args.site,
        },
    };
    let others = args
        .with
        .iter()
        .map(|url| record::open(Some(url.clone()), record::Use::Read))
        .collect::<Result<Vec<_>>>()?;
    let catalogs: Vec<&Catalog> = std::iter::once(catalog).chain(&others).collect();
    let reported = report(&catalogs, &options)?;
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&reported.report)?),
        Format::Csv => print::csv(&reported.report.batches),
        Format::Text => print!("{}", print::text(&reported.report)),
    }
    if let (Some(dir), Format::Text) = (&args.charts, args.format) {
        let tuned = if reported.tuned { ", tuning" } else { "" };
        println!(
            "charts: {} (timeline, utilisation{tuned}; .svg and .png)",
            dir.display()
        );
    }
    Ok(true)
}
