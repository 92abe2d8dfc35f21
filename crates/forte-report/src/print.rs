//! `forte report`'s text and CSV: a table of the batches, what its symbols mean, the late
//! arrivals, the site's tasks, and the run's KPIs.

use std::fmt::Write;

use crate::human;
use crate::kpi::{BatchKpi, RunKpi};
use crate::summary::Report;
use crate::words::{self, KPIS, L_B, R_P};

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
    println!("batch,site,raw_bytes,sealed_bytes,arrived_us,q_send_s,t_send_s,q_pull_s,t_pull_s,latency_s,queueing_share,rate_mb_s");
    let opt = |v: Option<f64>| v.map(|v| format!("{v:.3}")).unwrap_or_default();
    for b in batches {
        let [qs, ts, qp, tp] = task_times(b);
        println!(
            "{},{},{},{},{},{},{},{},{},{},{},{}",
            b.name,
            b.site,
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
fn tasks(out: &mut String, batches: &[BatchKpi]) {
    if batches.iter().all(|b| b.tasks.is_empty()) {
        return;
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "site tasks (at the edge inside t_send, at the core inside t_pull; share of l_b from the task's first queueing to its end):");
    let _ = writeln!(
        out,
        "{:<16} {:<18} {:<5} {:>6} {:>9} {:>8} {:>13}",
        "batch", "task", "at", "tries", "queued s", "ran s", "share of l_b"
    );
    for b in batches {
        for t in &b.tasks {
            let _ = writeln!(
                out,
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

/// The report as text: the batches, what the symbols mean, the late arrivals, the batches'
/// tasks, then the run's KPIs.
pub fn text(r: &Report) -> String {
    let mut out = String::new();
    batch_table(&mut out, &r.batches);
    glossary(&mut out);
    late_arrivals(&mut out, &r.batches);
    tasks(&mut out, &r.batches);
    let Some(run) = &r.run else {
        let _ = writeln!(out, "no batch delivered yet: no pipeline KPIs");
        return out;
    };
    run_kpis(&mut out, run);
    if let Some(v) = &r.verdict {
        let _ = writeln!(out, "verdict: {v}");
    }
    for n in &r.item_latency {
        let l = &n.latency;
        let _ = writeln!(
            out,
            "part latency from read to sink at {}: p50 {:.0} ms, p87 {:.0} ms, p99 {:.0} ms ({} parts)",
            n.node, l.p50_ms, l.p87_ms, l.p99_ms, l.items
        );
    }
    if let Some(l) = &r.link {
        let _ = writeln!(
            out,
            "link while batches waited ({} one-second samples): ≥ 90 % of {:.1} MB/s in {:.0} % of them; min {:.0} %, median {:.0} %, mean {:.0} %",
            l.samples,
            l.link_rate_bytes_s / 1e6,
            100.0 * l.share_at_90_percent,
            100.0 * l.min_share_of_link,
            100.0 * l.median_share_of_link,
            100.0 * l.mean_share_of_link
        );
    }
    out
}

/// Each symbol of the table and the run, named and explained, and the figures in words.
fn glossary(out: &mut String) {
    let _ = writeln!(out, "where (FORTE §2.2's symbols):");
    for k in KPIS {
        let _ = writeln!(out, "  {}", k.line());
    }
    let _ = writeln!(
        out,
        "  queued: seconds queued, q_send + q_relay; queue %: their share of l_b"
    );
    let _ = writeln!(out, "  {}", words::DAILY_CAPACITY);
}

/// Each file that came to a batch after it was sent: when, and how long it then took.
fn late_arrivals(out: &mut String, batches: &[BatchKpi]) {
    let late: Vec<String> = batches
        .iter()
        .flat_map(|b| b.late.iter().map(|f| f.sentence(&b.name)))
        .collect();
    if late.is_empty() {
        return;
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "{}:", words::LATE_ARRIVALS);
    for line in late {
        let _ = writeln!(out, "  {line}");
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.1}"))
}

/// One line per batch: its size, time queued and spent in each task, latency and rate.
fn batch_table(out: &mut String, batches: &[BatchKpi]) {
    let _ = writeln!(
        out,
        "{:<16} {:<12} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>9}",
        "batch",
        "site",
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
        let _ = writeln!(
            out,
            "{:<16} {:<12} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8.1} {:>7} {:>9}",
            b.name,
            if b.site.is_empty() { "-" } else { &b.site },
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
fn run_kpis(out: &mut String, run: &RunKpi) {
    let _ = writeln!(out);
    let late = match run.late_files {
        0 => String::new(),
        n => format!(
            "; {n} late file{} ({}) left out",
            if n == 1 { "" } else { "s" },
            human(run.late_bytes)
        ),
    };
    let _ = writeln!(
        out,
        "run: {} of {} batches delivered, {} raw as {} on the wire (compression ratio {:.2}){late}",
        run.delivered,
        run.batches,
        human(run.raw_bytes),
        human(run.sealed_bytes),
        run.compression_ratio
    );
    let _ = writeln!(
        out,
        "{}, {}: {:.1} MB/s over the {:.1} s from the first send to the last delivery (the offered load: {:.2} TB/day); {}, {}: mean {:.1} s, max {:.1} s",
        R_P.symbol,
        R_P.name,
        run.rate_mb_s,
        run.seconds,
        run.offered_bytes_per_day / 1e12,
        L_B.symbol,
        L_B.name,
        run.mean_latency_s,
        run.max_latency_s
    );
    let _ = writeln!(
        out,
        "daily capacity: {:.1} MB/s over the {:.1} s a batch was being sent or pulled × 86 400 s = {:.2} TB/day",
        run.capacity_mb_s,
        run.busy_seconds,
        run.daily_capacity_bytes / 1e12
    );
}

#[cfg(test)]
mod tests {
    use forte_catalog::Stage;

    use super::*;
    use crate::kpi::{self, LateFile, StageSpan};

    fn report() -> Report {
        let span = |stage, queued_from, started, ended| StageSpan {
            stage,
            queued_from,
            started,
            ended,
        };
        let batch = BatchKpi {
            name: "run-1".into(),
            site: "site-a".into(),
            batch_id: "b1".into(),
            files: 4,
            raw_bytes: 8_000_000,
            sealed_bytes: 8_000_000,
            arrived: 0,
            stages: vec![
                span(Stage::Send, 0, 100_000, 300_000),
                span(Stage::Pull, 300_000, 400_000, 700_000),
            ],
            tasks: vec![],
            latency_s: Some(0.7),
            queueing_s: 0.2,
            processing_s: 0.5,
            rate_mb_s: Some(8.0 / 0.7),
            late: vec![LateFile {
                path: "bags/late.bag".into(),
                object_id: "o".into(),
                bytes: 100_000,
                found: 2_800_000,
                after_sent_s: 2.5,
                delivered: Some(2_950_000),
                delivered_in_s: Some(0.15),
            }],
        };
        let run = kpi::run(std::slice::from_ref(&batch));
        Report {
            batches: vec![batch],
            run,
            verdict: Some(kpi::verdict(1e12, 3.36e12)),
            link: None,
            item_latency: vec![],
        }
    }

    #[test]
    fn every_symbol_printed_has_its_words_beside_it() {
        let text = text(&report());
        assert_eq!(
            crate::words::unexplained(&text),
            Vec::<String>::new(),
            "{text}"
        );
        for k in KPIS {
            assert!(text.contains(k.symbol), "{} is not used: {text}", k.symbol);
        }
        assert!(
            text.contains("R_P, pipeline rate: bytes delivered per second from the first send to the last delivery"),
            "{text}"
        );
        assert!(
            text.contains("R_P, pipeline rate: 13.3 MB/s over the 0.6 s"),
            "{text}"
        );
    }

    #[test]
    fn a_late_file_is_its_own_line() {
        let text = text(&report());
        assert!(
            text.contains("  bags/late.bag of run-1 arrived 2.5 s after its batch was sent, delivered in 0.1 s\n"),
            "{text}"
        );
        assert!(
            text.contains("; 1 late file (97.66 KiB) left out"),
            "{text}"
        );
    }
}
