//! `forte report`: the pipeline's KPIs (FORTE §2.2) from the catalogues, with a per-batch
//! timeline, utilisation charts and, when a send tuned itself, its tuning timeline.

use std::path::PathBuf;

use anyhow::{Context, Result};
use forte_catalog::{TuningSample, UsageRow};
use forte_report::chart::{timeline_svg, tuning_svg, utilisation_svg, write_svg_and_png, TimeAxis};
use forte_report::kpi::{self, BatchKpi, LinkUse, NodeLatency, RunKpi};
use serde::Serialize;

use forte_daemon::record::{self, Catalog};
use forte_daemon::units::{human, parse_rate};
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
    /// edge's as --catalog and the core's here. One shared PostgreSQL catalogue needs none.
    #[arg(long = "with", value_name = "URL")]
    with: Vec<String>,
    /// Output format of the numbers.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Write timeline.svg/.png and utilisation.svg/.png into this directory, and tuning.svg/.png
    /// (goodput, uploads in flight and zstd level per interval) when a send tuned itself.
    #[arg(long, value_name = "DIR")]
    charts: Option<PathBuf>,
    /// Title of the charts.
    #[arg(long, default_value = "forte")]
    title: String,
    /// The data rate the site must sustain, e.g. 3.36TB/day (the papers' use case): prints
    /// whether the run's daily capacity does.
    #[arg(long, value_name = "RATE")]
    nominal_rate: Option<String>,
    /// The edge's link rate, e.g. 65MB (per second): reports how busy the link was while
    /// batches waited for it.
    #[arg(long, value_name = "RATE")]
    link_rate: Option<String>,
}

#[derive(Serialize)]
struct Report {
    batches: Vec<BatchKpi>,
    run: Option<RunKpi>,
    verdict: Option<String>,
    link: Option<LinkUse>,
    /// Per node: its parts' latency from read to sink.
    item_latency: Vec<NodeLatency>,
}

pub fn run(args: Args, catalog: &Catalog) -> Result<bool> {
    let rate = |flag: &str, text: &Option<String>| -> Result<Option<f64>> {
        text.as_deref()
            .map(|t| parse_rate(t).map_err(|e| anyhow::anyhow!("--{flag}: {e}")))
            .transpose()
    };
    let nominal = rate("nominal-rate", &args.nominal_rate)?;
    let link_rate = rate("link-rate", &args.link_rate)?;
    let mut catalogs = vec![];
    for url in &args.with {
        catalogs.push(record::open(Some(url.clone()))?);
    }
    let mut rows: Vec<kpi::BatchRecords> = Vec::new();
    let mut usage: Vec<UsageRow> = Vec::new();
    let mut tuning: Vec<TuningSample> = Vec::new();
    for c in std::iter::once(catalog).chain(&catalogs) {
        rows.extend(kpi::batch_rows(c)?);
        usage.extend(c.usage_of(None)?);
        tuning.extend(c.tuning_samples()?);
    }
    usage.sort_by_key(|u| u.at);
    tuning.sort_by_key(|t| t.at);
    let batches = kpi::batches(&rows);
    let run = kpi::run(&batches);
    let verdict = match (nominal, &run) {
        (Some(per_second), Some(run)) => Some(kpi::verdict(
            run.daily_capacity_bytes,
            per_second * 86_400.0,
        )),
        _ => None,
    };
    let link = link_rate.and_then(|rate| kpi::link_use(&batches, &usage, rate));
    let item_latency = run
        .as_ref()
        .map_or_else(Vec::new, |run| kpi::item_latency(run, &usage));
    if let Some(dir) = &args.charts {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create chart directory {}", dir.display()))?;
        // One clock-time axis for every chart, so a moment is at the same place on each.
        let time = TimeAxis::of_report(&batches, &usage, &tuning);
        let title = format!("{}: batch timeline", args.title);
        write_svg_and_png(
            &timeline_svg(&title, &batches, time),
            &dir.join("timeline.svg"),
        )?;
        let title = format!("{}: utilisation (1 Hz samples)", args.title);
        write_svg_and_png(
            &utilisation_svg(&title, &usage, time),
            &dir.join("utilisation.svg"),
        )?;
        if !tuning.is_empty() {
            let title = format!(
                "{}: tuning (intervals of {} s or more)",
                args.title,
                PROBE.as_secs()
            );
            write_svg_and_png(&tuning_svg(&title, &tuning, time), &dir.join("tuning.svg"))?;
        }
    }
    let report = Report {
        batches,
        run,
        verdict,
        link,
        item_latency,
    };
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Format::Csv => print_csv(&report.batches),
        Format::Text => print_text(&report),
    }
    if let Some(dir) = &args.charts {
        if args.format == Format::Text {
            let tuned = if tuning.is_empty() { "" } else { ", tuning" };
            println!(
                "charts: {} (timeline, utilisation{tuned}; .svg and .png)",
                dir.display()
            );
        }
    }
    Ok(true)
}

/// Seconds queued before and spent in each task: q_send, t_send, q_pull, t_pull.
fn task_times(b: &BatchKpi) -> [Option<f64>; 4] {
    let of = |i: usize| b.stages.get(i);
    [
        of(0).map(|s| s.queueing_s()),
        of(0).map(|s| s.processing_s()),
        of(1).map(|s| s.queueing_s()),
        of(1).map(|s| s.processing_s()),
    ]
}

fn print_csv(batches: &[BatchKpi]) {
    println!("batch,raw_bytes,sealed_bytes,arrived_us,q_send_s,t_send_s,q_pull_s,t_pull_s,latency_s,queueing_share,rate_mb_s");
    let opt = |v: Option<f64>| v.map(|v| format!("{v:.3}")).unwrap_or_default();
    for b in batches {
        let [qs, ts, qp, tp] = task_times(b);
        println!(
            "{},{},{},{},{},{},{},{},{},{},{}",
            b.name,
            b.raw_bytes,
            b.sealed_bytes,
            b.arrived,
            opt(qs),
            opt(ts),
            opt(qp),
            opt(tp),
            opt(b.latency_s),
            opt(b.queueing_share()),
            opt(b.rate_mb_s)
        );
    }
}

/// The site's tasks per batch: each one's time queued and running, and its share of l_b.
fn print_tasks(batches: &[BatchKpi]) {
    if batches.iter().all(|b| b.tasks.is_empty()) {
        return;
    }
    println!();
    println!("site tasks (at the edge inside t_send, at the core inside t_pull; share of l_b from the task's first queueing to its end):");
    println!(
        "{:<16} {:<18} {:<5} {:>6} {:>9} {:>8} {:>13}",
        "batch", "task", "at", "tries", "queued s", "ran s", "share of l_b"
    );
    for b in batches {
        for t in &b.tasks {
            println!(
                "{:<16} {:<18} {:<5} {:>6} {:>9.2} {:>8.2} {:>13}",
                b.name,
                t.task,
                t.role,
                t.tries,
                t.queueing_s(),
                t.processing_s(),
                t.share_of_latency
                    .map_or("-".into(), |s| format!("{:.1} %", 100.0 * s))
            );
        }
    }
}

fn print_text(r: &Report) {
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    println!(
        "{:<16} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>9}",
        "batch",
        "raw",
        "q_send",
        "t_send",
        "q_relay",
        "t_pull",
        "l_b s",
        "queued",
        "queue %",
        "R_b MB/s"
    );
    for b in &r.batches {
        let [qs, ts, qp, tp] = task_times(b);
        println!(
            "{:<16} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8.1} {:>7} {:>9}",
            b.name,
            human(b.raw_bytes),
            opt(qs),
            opt(ts),
            opt(qp),
            opt(tp),
            opt(b.latency_s),
            b.queueing_s,
            b.queueing_share()
                .map_or("-".into(), |s| format!("{:.0}", 100.0 * s)),
            opt(b.rate_mb_s)
        );
    }
    print_tasks(&r.batches);
    let Some(run) = &r.run else {
        println!("no batch delivered yet: no pipeline KPIs");
        return;
    };
    println!();
    println!(
        "run: {} of {} batches delivered, {} raw as {} on the wire (compression ratio {:.2})",
        run.delivered,
        run.batches,
        human(run.raw_bytes),
        human(run.sealed_bytes),
        run.compression_ratio
    );
    println!(
        "R_P = {:.1} MB/s over {:.1} s (the offered load: {:.2} TB/day); batch latency mean {:.1} s, max {:.1} s",
        run.rate_mb_s,
        run.seconds,
        run.offered_bytes_per_day / 1e12,
        run.mean_latency_s,
        run.max_latency_s
    );
    println!(
        "daily capacity: {:.1} MB/s over the {:.1} s a batch was being sent or pulled × 86 400 s = {:.2} TB/day",
        run.capacity_mb_s,
        run.busy_seconds,
        run.daily_capacity_bytes / 1e12
    );
    if let Some(v) = &r.verdict {
        println!("verdict: {v}");
    }
    for n in &r.item_latency {
        let l = &n.latency;
        println!(
            "part latency from read to sink at {}: p50 {:.0} ms, p87 {:.0} ms, p99 {:.0} ms ({} parts)",
            n.node, l.p50_ms, l.p87_ms, l.p99_ms, l.items
        );
    }
    if let Some(l) = &r.link {
        println!(
            "link while batches waited ({} one-second samples): ≥ 90 % of {:.1} MB/s in {:.0} % of them; min {:.0} %, median {:.0} %, mean {:.0} %",
            l.samples,
            l.link_rate_bytes_s / 1e6,
            100.0 * l.share_at_90_percent,
            100.0 * l.min_share_of_link,
            100.0 * l.median_share_of_link,
            100.0 * l.mean_share_of_link
        );
    }
}
