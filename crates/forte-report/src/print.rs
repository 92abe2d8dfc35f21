//! `forte report`'s text and CSV on stdout: a table of the batches, the site's tasks, and the
//! run's KPIs.

use crate::human;
use crate::kpi::{BatchKpi, RunKpi};
use crate::summary::Report;

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

/// One CSV line per batch, under a header.
pub fn csv(batches: &[BatchKpi]) {
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
fn tasks(batches: &[BatchKpi]) {
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

/// The report as text: the batches, their tasks, then the run's KPIs.
pub fn text(r: &Report) {
    batch_table(&r.batches);
    tasks(&r.batches);
    let Some(run) = &r.run else {
        println!("no batch delivered yet: no pipeline KPIs");
        return;
    };
    run_kpis(run);
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

fn opt(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.1}"))
}

/// One line per batch: its size, time queued and spent in each task, latency and rate.
fn batch_table(batches: &[BatchKpi]) {
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
    for b in batches {
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
}

/// The run: what was delivered, R_P, the offered load and the daily capacity.
fn run_kpis(run: &RunKpi) {
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
}
