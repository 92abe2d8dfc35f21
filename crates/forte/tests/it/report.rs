//! `forte report` on a real run: batch latency split into queueing and processing per task,
//! the order a queue policy imposes, and the charts.

use crate::common::site::*;
use crate::common::*;

/// A large batch that sorts (and so arrives) first, then a small one; sent in one pass with
/// `policy`, then pulled. Returns the site and the report as JSON.
fn run_with(policy: &str) -> (Site, serde_json::Value) {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    for i in 0..4 {
        write(
            &inbox.join(format!("a-large/bags/{i}.bag")),
            &sample_bytes(2 << 20, i),
        );
    }
    write(&inbox.join("a-large/.ready"), b"");
    write(&inbox.join("b-small/log.txt"), &sample_bytes(100_000, 9));
    write(&inbox.join("b-small/.ready"), b"");
    ok(&site.send(&["--policy", policy, "--cpu", "1", "-q"]));
    ok(&site.pull());
    let report = ok(&site.report(args!["--format", "json"]));
    (site, crate::common::strict_json(&report))
}

fn batch<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["batches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == name)
        .unwrap_or_else(|| panic!("no batch {name} in {report}"))
}

fn send_started(report: &serde_json::Value, name: &str) -> i64 {
    batch(report, name)["stages"][0]["started"]
        .as_i64()
        .unwrap()
}

#[test]
fn latency_is_queueing_plus_processing_per_task() {
    let (_site, report) = run_with("fifo");
    for name in ["a-large", "b-small"] {
        let b = batch(&report, name);
        let stages = b["stages"].as_array().unwrap();
        assert_eq!(
            stages
                .iter()
                .map(|s| s["stage"].as_str().unwrap())
                .collect::<Vec<_>>(),
            ["send", "pull"]
        );
        let latency = b["latency_s"].as_f64().unwrap();
        let sum = b["queueing_s"].as_f64().unwrap() + b["processing_s"].as_f64().unwrap();
        assert!((latency - sum).abs() < 1e-3, "{name}: {latency} != {sum}");
        let end = stages[1]["ended"].as_i64().unwrap();
        let arrived = b["arrived"].as_i64().unwrap();
        assert!((latency - (end - arrived) as f64 / 1e6).abs() < 1e-3);
        assert!(b["sealed_bytes"].as_u64().unwrap() > 0);
    }
    let run = &report["run"];
    assert_eq!(run["delivered"], 2);
    assert_eq!(
        run["raw_bytes"].as_u64().unwrap(),
        4 * (2 << 20) + 100_000,
        "every raw byte of both batches"
    );
    let rate = run["rate_mb_s"].as_f64().unwrap();
    let capacity = run["capacity_mb_s"].as_f64().unwrap();
    let daily = run["daily_capacity_bytes"].as_f64().unwrap();
    // The capacity is over busy time, the offered load over the whole span.
    assert!((daily - capacity * 1e6 * 86_400.0).abs() < 1.0);
    assert!(
        capacity >= rate,
        "capacity {capacity} below the offered load {rate}"
    );
    let offered = run["offered_bytes_per_day"].as_f64().unwrap();
    assert!((offered - rate * 1e6 * 86_400.0).abs() < 1.0);
}

#[test]
fn latency_counts_from_the_batchs_arrival_not_from_when_it_was_found() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    write(&inbox.join("late/log.txt"), &sample_bytes(100_000, 3));
    let marker = inbox.join("late/.ready");
    write(&marker, b"");
    // It arrived a minute before the sender looked.
    let arrived = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(&marker)
        .unwrap()
        .set_modified(arrived)
        .unwrap();
    ok(&site.send(&["-q"]));
    ok(&site.pull());
    let report: serde_json::Value =
        crate::common::strict_json(&ok(&site.report(args!["--format", "json"])));
    let b = batch(&report, "late");
    let arrived_us = arrived
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    assert!(
        (b["arrived"].as_i64().unwrap() - arrived_us).abs() < 1_000,
        "arrived {} µs, the marker says {arrived_us}",
        b["arrived"]
    );
    let latency = b["latency_s"].as_f64().unwrap();
    assert!(
        latency >= 60.0,
        "latency {latency} s from a batch a minute old"
    );
    // The minute before it was found is queueing, not processing.
    let queued = b["queueing_s"].as_f64().unwrap();
    assert!(queued >= 59.0, "queueing {queued} s");
}

#[test]
fn fifo_serves_the_first_arrival_and_sjf_the_smallest() {
    let (_fifo_site, fifo) = run_with("fifo");
    assert!(send_started(&fifo, "a-large") < send_started(&fifo, "b-small"));
    let (_sjf_site, sjf) = run_with("sjf");
    assert!(send_started(&sjf, "b-small") < send_started(&sjf, "a-large"));
}

#[test]
fn report_prints_the_verdict_and_writes_charts() {
    let (site, _) = run_with("sjf-aging");
    let charts = site.root.join("charts");
    let text = ok(&site.report(args![
        "--nominal-rate",
        "3.36TB/day",
        "--charts",
        &charts,
        "--title",
        "test run"
    ]));
    assert!(text.contains("R_P, pipeline rate: "), "{text}");
    assert_eq!(unexplained(&text), Vec::<String>::new(), "{text}");
    assert!(
        text.contains("verdict: sustainable") || text.contains("verdict: NOT sustainable"),
        "{text}"
    );
    assert!(text.contains("3.36 TB/day nominal"), "{text}");
    // Each end's parts' latency from read to sink, from its utilisation samples.
    for role in ["edge", "core"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("part latency from read to sink at {role}@")))
            .unwrap_or_else(|| panic!("no {role} latency in {text}"));
        assert!(
            line.contains(" ms, p87 ") && line.contains(" parts)"),
            "{line}"
        );
    }
    for chart in ["timeline", "utilisation"] {
        let svg = std::fs::read_to_string(charts.join(format!("{chart}.svg"))).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        let png = std::fs::read(charts.join(format!("{chart}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{chart}.png is a PNG");
    }
    let timeline = std::fs::read_to_string(charts.join("timeline.svg")).unwrap();
    assert!(timeline.contains("a-large") && timeline.contains("b-small"));

    let csv = ok(&site.report(args!["--format", "csv"]));
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].starts_with("batch,site,raw_bytes,sealed_bytes,arrived_us,q_send_s"));
    assert_eq!(lines.len(), 3, "{csv}");

    let bad = fails(&args![
        "--catalog",
        &site.edge_catalog,
        "report",
        "--nominal-rate",
        "lots"
    ]);
    assert!(bad.contains("\"lots\" is not a rate"), "{bad}");
}

/// One batch of five compressible files, sent and pulled, then `send` run again one-shot
/// (everything is at the relay, acknowledged): returns the site and the edge's batch as
/// `forte status --json` shows it after the first send and after the re-run.
fn sent_then_sent_again() -> (Site, serde_json::Value, serde_json::Value) {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    for i in 0..5 {
        write(
            &inbox.join(format!("run-1/bags/{i}.bag")),
            &sample_bytes(600_000, i),
        );
    }
    write(&inbox.join("run-1/.ready"), b"");
    let edge_batch = |site: &Site| {
        let status: serde_json::Value =
            crate::common::strict_json(&site.status(&site.edge_catalog, &["--json"]));
        status["batches"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["batch"]["name"] == "run-1")
            .cloned()
            .unwrap_or_else(|| panic!("no batch run-1 in {status:#}"))
    };
    ok(&site.send(&["-q"]));
    let first = edge_batch(&site);
    ok(&site.pull());
    std::thread::sleep(std::time::Duration::from_millis(50));
    ok(&site.send(&["-q"]));
    let out = ok(&site.pull());
    assert!(out.contains("nothing waiting"), "{out}");
    ok(&site.send(&["-q"]));
    let again = edge_batch(&site);
    (site, first, again)
}

/// A one-shot `send` re-run over batches the core already has does not rewrite them: the
/// batch keeps its file count, its bytes and its send stage, and `forte report` its raw
/// bytes, its ratio and its place in the timeline.
#[test]
fn re_running_send_does_not_rewrite_the_batch() {
    let (site, first, again) = sent_then_sent_again();
    let raw = 5 * 600_000;
    assert_eq!(
        (&again["batch"]["bytes"], &again["batch"]["state"]),
        (&serde_json::json!(raw), &serde_json::json!("sent")),
        "{again:#}"
    );
    assert_eq!(
        again["stages"], first["stages"],
        "the send stage was rewritten"
    );
    // `status` prints the batch's own row: its file count and size.
    let text = site.status(&site.edge_catalog, &[]);
    let row = text
        .lines()
        .find(|l| l.starts_with("edge") && l.contains("run-1"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        row.contains("    5 files") && row.contains("2.86 MiB"),
        "{row}\n{text}"
    );

    let report: serde_json::Value =
        crate::common::strict_json(&ok(&site.report(args!["--format", "json"])));
    let b = batch(&report, "run-1");
    assert_eq!(b["raw_bytes"].as_u64().unwrap(), raw, "{b:#}");
    let stages: Vec<&str> = b["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
    assert_eq!(stages, ["send", "pull"], "{b:#}");
    let run = &report["run"];
    assert_eq!(run["delivered"], 1, "{run:#}");
    assert_eq!(run["raw_bytes"].as_u64().unwrap(), raw, "{run:#}");
    let ratio = run["compression_ratio"].as_f64().unwrap();
    assert!(ratio >= 1.0, "compressible data, ratio {ratio}: {run:#}");
}

/// The edge learns that the core acknowledged a batch on any run, not only as a daemon: a
/// one-shot `send` that finds its files delivered records them as acknowledged, once.
#[test]
fn a_one_shot_send_learns_the_acknowledgements() {
    let (site, _, again) = sent_then_sent_again();
    let files = again["files"].as_array().unwrap();
    assert_eq!(files.len(), 5, "{again:#}");
    for f in files {
        assert_eq!(f["state"], "acknowledged", "{f:#}");
    }
    let lineage = site.status(&site.edge_catalog, &["--file", "bags/0.bag"]);
    assert_eq!(
        lineage.matches("UTC  acknowledged").count(),
        1,
        "recorded once over two re-runs: {lineage}"
    );
    assert_eq!(
        lineage.matches("UTC  discovered").count(),
        1,
        "re-runs do not add to the lineage: {lineage}"
    );
}

/// The symbols (FORTE §2.2's) that `text` uses without their words beside them: each token
/// written like one (a letter, `_`, letters) must be named and explained on a line of its own,
/// `SYMBOL, NAME: MEANING`.
fn unexplained(text: &str) -> Vec<String> {
    let mut missing: Vec<String> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|t| {
            t.split_once('_').is_some_and(|(head, tail)| {
                head.len() == 1
                    && head.chars().all(|c| c.is_ascii_alphabetic())
                    && !tail.is_empty()
                    && tail.chars().all(|c| c.is_ascii_alphabetic())
            })
        })
        .filter(|symbol| {
            !text
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{symbol}, ")) && l.contains(": "))
        })
        .map(str::to_owned)
        .collect();
    missing.sort();
    missing.dedup();
    missing
}

/// The operator's run (issue 46): a batch sent and pulled, then a file that appears in its
/// directory seconds after it was sent, sent as a follow-up into the same batch and pulled.
/// The batch's KPIs and the run's daily capacity stay those of its first delivery (within
/// 10 % of the report before the follow-up); the file is listed as a late arrival, with how
/// late it came and how long it then took; every symbol printed has its words beside it.
#[test]
fn a_follow_up_file_is_a_late_arrival_and_does_not_stretch_its_batch() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    for i in 0..4 {
        write(
            &inbox.join(format!("run-1/bags/{i}.bag")),
            &sample_bytes(2 << 20, i),
        );
    }
    write(&inbox.join("run-1/.ready"), b"");
    ok(&site.send(&["-q"]));
    ok(&site.pull());
    let json = |site: &Site| -> serde_json::Value {
        crate::common::strict_json(&ok(&site.report(args!["--format", "json"])))
    };
    let before = json(&site);
    let first_send = &batch(&before, "run-1")["stages"][0];
    let send_s = (first_send["ended"].as_i64().unwrap() - first_send["started"].as_i64().unwrap())
        as f64
        / 1e6;
    assert!(send_s < 1.0, "the batch's own send took {send_s} s");
    // Found by the next send, 2.5 s after the batch was sent: lateness from the catalogue's
    // record of its discovery (a file's own times are not recorded), so a real wait.
    std::thread::sleep(std::time::Duration::from_millis(2_500));
    write(
        &inbox.join("run-1/bags/late.bag"),
        &sample_bytes(100_000, 7),
    );
    let sent = ok(&site.send(&["-q"]));
    assert!(sent.contains("sent 1 of 5 files (4 sent before"), "{sent}");
    ok(&site.pull());
    assert!(site.root.join("dest/site-a/run-1/bags/late.bag").exists());

    let after = json(&site);
    let daily = |r: &serde_json::Value| r["run"]["daily_capacity_bytes"].as_f64().unwrap();
    let (without, with) = (daily(&before), daily(&after));
    eprintln!(
        "daily capacity without the late file {:.4} TB/day, with it {:.4} TB/day",
        without / 1e12,
        with / 1e12
    );
    assert!(
        (with - without).abs() <= 0.1 * without,
        "daily capacity {with} with the late file, {without} without it: {after:#}"
    );
    let b = batch(&after, "run-1");
    let (was, now) = (batch(&before, "run-1"), b);
    for i in 0..2 {
        let span = |b: &serde_json::Value| {
            let s = &b["stages"][i];
            (s["ended"].as_i64().unwrap() - s["started"].as_i64().unwrap()) as f64 / 1e6
        };
        assert!(
            (span(now) - span(was)).abs() < 0.1,
            "stage {i} took {} s before the follow-up, {} s after: {b:#}",
            span(was),
            span(now)
        );
    }
    assert_eq!(b["raw_bytes"].as_u64().unwrap(), 4 * (2 << 20), "{b:#}");
    let late = b["late"].as_array().unwrap();
    assert_eq!(late.len(), 1, "{b:#}");
    assert_eq!(late[0]["path"], "bags/late.bag");
    let after_sent = late[0]["after_sent_s"].as_f64().unwrap();
    assert!(
        after_sent >= 2.5,
        "found {after_sent} s after the send: {b:#}"
    );
    let took = late[0]["delivered_in_s"].as_f64().unwrap();
    assert!(took < after_sent, "delivered in {took} s: {b:#}");
    assert_eq!(after["run"]["late_files"], 1, "{after:#}");

    let text = ok(&site.report(args!["--nominal-rate", "3.36TB/day"]));
    let line = text
        .lines()
        .find(|l| l.contains("bags/late.bag of run-1 arrived "))
        .unwrap_or_else(|| panic!("no late arrival in {text}"));
    assert!(
        line.contains(" s after its batch was sent, delivered in ") && line.ends_with(" s"),
        "{line}"
    );
    assert!(text.contains("late arrivals: "), "{text}");
    assert_eq!(unexplained(&text), Vec::<String>::new(), "{text}");
    for words in [
        "R_P, pipeline rate: bytes delivered per second from the first send to the last delivery",
        "l_b, batch latency: ",
        "R_b, batch rate: ",
        "q_relay, waiting at the relay: ",
    ] {
        assert!(text.contains(words), "{words} in {text}");
    }
}
