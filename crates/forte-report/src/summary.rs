//! `forte report`'s work: the KPIs of every batch and of the run, read from one or more
//! catalogues, the verdict against a nominal rate, the link's use, and the charts. Printing
//! them is [`crate::print`]'s.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use forte_catalog::{Catalog, TuningSample, UsageRow};
use serde::Serialize;

use crate::chart::{timeline_svg, tuning_svg, utilisation_svg, write_svg_and_png, TimeAxis};
use crate::kpi::{self, BatchKpi, BatchRecords, LinkUse, NodeLatency, ReportWindow, RunKpi};

/// What `forte report` says, as its JSON prints it.
#[derive(Serialize)]
pub struct Report {
    pub batches: Vec<BatchKpi>,
    pub run: Option<RunKpi>,
    pub verdict: Option<String>,
    pub link: Option<LinkUse>,
    /// Per node: its parts' latency from read to sink.
    pub item_latency: Vec<NodeLatency>,
}

/// What to report besides the KPIs.
pub struct Options<'a> {
    /// The data rate the site must sustain, in bytes per second: a verdict on the capacity.
    pub nominal_rate: Option<f64>,
    /// The edge's link rate in bytes per second: how busy the link was while batches waited.
    pub link_rate: Option<f64>,
    /// Where to write the charts, if anywhere.
    pub charts: Option<Charts<'a>>,
    /// The batches (and samples) reported on.
    pub window: ReportWindow,
}

/// The charts to write: timeline, utilisation and (when a send tuned itself) tuning.
pub struct Charts<'a> {
    pub dir: &'a Path,
    pub title: &'a str,
    /// The tuner's shortest interval, named in the tuning chart's title.
    pub tuning_interval: Duration,
}

/// A report, and whether the catalogues held a send's tuning samples (so a tuning chart).
pub struct Reported {
    pub report: Report,
    pub tuned: bool,
}

/// Every row the report is computed from, over all catalogues, usage and tuning in time order.
struct Rows {
    batches: Vec<BatchRecords>,
    usage: Vec<UsageRow>,
    tuning: Vec<TuningSample>,
}

impl Rows {
    fn read(catalogs: &[&Catalog], window: &ReportWindow) -> Result<Rows> {
        let mut rows = Rows {
            batches: Vec::new(),
            usage: Vec::new(),
            tuning: Vec::new(),
        };
        let since = window.since.unwrap_or(0);
        let until = window.until.unwrap_or(i64::MAX);
        for c in catalogs {
            rows.batches.extend(kpi::batch_rows(c, window)?);
            rows.usage.extend(c.usage_of(None, since)?);
            rows.tuning.extend(c.tuning_samples(since)?);
        }
        if let Some(site) = &window.site {
            rows.batches = kpi::of_site(rows.batches, site);
        }
        rows.usage.retain(|u| u.at <= until);
        rows.tuning.retain(|t| t.at <= until);
        rows.usage.sort_by_key(|u| u.at);
        rows.tuning.sort_by_key(|t| t.at);
        Ok(rows)
    }
}

/// The report over `catalogs` (joined: with separate SQLite files per node, the edge's and the
/// core's), its charts written first if asked for.
pub fn report(catalogs: &[&Catalog], options: &Options) -> Result<Reported> {
    let rows = Rows::read(catalogs, &options.window)?;
    let batches = kpi::batches(&rows.batches);
    let run = kpi::run(&batches);
    let verdict = match (options.nominal_rate, &run) {
        (Some(per_second), Some(run)) => Some(kpi::verdict(
            run.daily_capacity_bytes,
            per_second * 86_400.0,
        )),
        _ => None,
    };
    let link = options
        .link_rate
        .and_then(|rate| kpi::link_use(&batches, &rows.usage, rate));
    let item_latency = run
        .as_ref()
        .map_or_else(Vec::new, |run| kpi::item_latency(run, &rows.usage));
    if let Some(charts) = &options.charts {
        write_charts(charts, &batches, &rows)?;
    }
    let report = Report {
        batches,
        run,
        verdict,
        link,
        item_latency,
    };
    Ok(Reported {
        report,
        tuned: !rows.tuning.is_empty(),
    })
}

/// timeline.svg/.png, utilisation.svg/.png and, when a send tuned itself, tuning.svg/.png.
fn write_charts(charts: &Charts, batches: &[BatchKpi], rows: &Rows) -> Result<()> {
    let dir = charts.dir;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create chart directory {}", dir.display()))?;
    // One clock-time axis for every chart, so a moment is at the same place on each.
    let time = TimeAxis::of_report(batches, &rows.usage, &rows.tuning);
    let title = format!("{}: batch timeline", charts.title);
    write_svg_and_png(
        &timeline_svg(&title, batches, time),
        &dir.join("timeline.svg"),
    )?;
    let title = format!("{}: utilisation (1 Hz samples)", charts.title);
    write_svg_and_png(
        &utilisation_svg(&title, &rows.usage, time),
        &dir.join("utilisation.svg"),
    )?;
    if !rows.tuning.is_empty() {
        let title = format!(
            "{}: tuning (intervals of {} s or more)",
            charts.title,
            charts.tuning_interval.as_secs()
        );
        write_svg_and_png(
            &tuning_svg(&title, &rows.tuning, time),
            &dir.join("tuning.svg"),
        )?;
    }
    Ok(())
}
