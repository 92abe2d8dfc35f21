//! `forte status`'s work: what a catalogue knows, printed as text or JSON. The overview of its
//! batches (stages, site tasks, files, recent failures), its utilisation samples, or one
//! file's lineage.

use anyhow::Result;
use forte_catalog::{
    format_utc, BatchCount, BatchRow, BatchState, Catalog, Event, Failure, FileRow, FileState,
    Filter, PartRow, StageRow, TaskOutcome, TaskRunRow,
};
use serde::Serialize;

use crate::human;

/// What `forte status` shows.
pub enum View<'a> {
    /// A summary of the batches in a window by site and state, then the latest of them with
    /// their stages, tasks and files, then the recent failures.
    Overview(&'a Window),
    /// The resource utilisation samples in a window.
    Usage(&'a Window),
    /// One file's lineage: a path in its batch, or its delivered path.
    Lineage(&'a str),
}

/// Which batches (or samples) a view reads: every bound is the caller's, resolved once.
#[derive(Debug, Clone, Default)]
pub struct Window {
    /// Of this site only.
    pub site: Option<String>,
    /// The batch of exactly this name.
    pub batch: Option<String>,
    /// Changed at or after this time (µs since the epoch).
    pub since: Option<i64>,
    /// Changed at or before this time (µs since the epoch).
    pub until: Option<i64>,
    /// At most this many batches in detail.
    pub limit: i64,
}

impl Window {
    fn filter(&self, limit: Option<i64>) -> Filter {
        Filter {
            site: self.site.clone(),
            batch: self.batch.clone(),
            since: self.since,
            until: self.until,
            limit,
            ..Filter::default()
        }
    }

    /// The window as the operator reads it: `since 2026-12-01 10:00:00.000 UTC, of site a`.
    fn text(&self) -> String {
        let mut parts = vec![];
        if let Some(since) = self.since {
            parts.push(format!("since {}", format_utc(since)));
        }
        if let Some(until) = self.until {
            parts.push(format!("until {}", format_utc(until)));
        }
        if let Some(site) = &self.site {
            parts.push(format!("of site {site}"));
        }
        if let Some(batch) = &self.batch {
            parts.push(format!("named {batch}"));
        }
        if parts.is_empty() {
            "of all time".into()
        } else {
            parts.join(", ")
        }
    }
}

/// Prints `view` of `catalog`, as JSON when `json`.
pub fn show(catalog: &Catalog, view: View, json: bool) -> Result<()> {
    match view {
        View::Lineage(path) => lineage(catalog, path, json),
        View::Usage(window) => usage(catalog, window, json),
        View::Overview(window) => {
            let overview = Overview::read(catalog, window)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&overview)?);
                Ok(())
            } else {
                overview.print(catalog, window)
            }
        }
    }
}

#[derive(Serialize)]
struct Lineage {
    /// The name of the batch the file belongs to (a path may be in several).
    batch: String,
    file: FileRow,
    parts: Vec<PartRow>,
    events: Vec<Event>,
}

fn usage(catalog: &Catalog, window: &Window, json: bool) -> Result<()> {
    let until = window.until.unwrap_or(i64::MAX);
    let rows: Vec<_> = catalog
        .usage_of(None, window.since.unwrap_or(0))?
        .into_iter()
        .filter(|u| u.at <= until)
        .collect();
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{:<28} {:<27} {:>6} {:>11} {:>12} {:>12} {:>12} {:>12}",
        "node", "time", "cpu %", "memory", "disk read/s", "disk write/s", "net rx/s", "net tx/s"
    );
    for u in rows {
        let b = |v: f64| human(v.max(0.0) as u64);
        println!(
            "{:<28} {:<27} {:>6.1} {:>11} {:>12} {:>12} {:>12} {:>12}",
            u.node,
            format_utc(u.at),
            u.cpu_percent,
            human(u.memory_used.max(0) as u64),
            b(u.disk_read_bps),
            b(u.disk_write_bps),
            b(u.net_rx_bps),
            b(u.net_tx_bps)
        );
    }
    Ok(())
}

/// The overview of a window: what `status --json` prints, and the text view reads.
#[derive(Serialize)]
struct Overview {
    since: Option<i64>,
    until: Option<i64>,
    /// The window's batches by site, role and state.
    summary: Vec<BatchCount>,
    /// How many batches the window holds.
    matched: i64,
    /// The latest of them (at most the limit), newest change first.
    batches: Vec<Batch>,
    failures: Vec<Failure>,
}

// The shape of the API's one batch (docs/api.md): the batch's row under `batch`, so that
// its count of files and the list of them are not both `files`.
#[derive(Serialize)]
struct Batch {
    batch: BatchRow,
    stages: Vec<StageRow>,
    files: Vec<FileRow>,
}

impl Overview {
    fn read(catalog: &Catalog, window: &Window) -> Result<Self> {
        let summary = catalog.batch_counts(&window.filter(None))?;
        let batches: Vec<Batch> = catalog
            .batches_matching(&window.filter(Some(window.limit)))?
            .into_iter()
            .map(|b| {
                Ok(Batch {
                    stages: catalog.stages(&b.batch_key)?,
                    files: catalog.files(&b.batch_key)?,
                    batch: b,
                })
            })
            .collect::<Result<_>>()?;
        // Of the batches shown when the window names a site or a batch; else the latest.
        let failures = if window.site.is_some() || window.batch.is_some() {
            let mut failures = vec![];
            for b in &batches {
                failures.extend(catalog.failures(Some(&b.batch.batch_key), 3)?);
            }
            failures
        } else {
            catalog.failures(None, 10)?
        };
        Ok(Self {
            since: window.since,
            until: window.until,
            matched: summary.iter().map(|c| c.batches).sum(),
            summary,
            batches,
            failures,
        })
    }

    fn print(&self, catalog: &Catalog, window: &Window) -> Result<()> {
        println!("catalogue {}", catalog.url());
        println!("batches {}:", window.text());
        if self.summary.is_empty() {
            println!("  none (--since 30d, or --since 2026-01-01, looks further back)");
        } else {
            print_summary(&self.summary);
        }
        if self.matched > self.batches.len() as i64 {
            println!(
                "the {} latest of {} (--limit, --site, --batch, --since and --until show others):",
                self.batches.len(),
                self.matched
            );
        }
        for b in &self.batches {
            print_batch(catalog, &b.batch, &b.stages, &b.files)?;
        }
        if !self.failures.is_empty() {
            println!("recent failures:");
            for a in &self.failures {
                let part = a.part.map(|p| format!(" part {p}")).unwrap_or_default();
                let what = a
                    .object_id
                    .clone()
                    .unwrap_or_else(|| a.batch_key.to_string());
                println!("  {} {}{}: {}", a.task, what, part, a.error);
            }
        }
        Ok(())
    }
}

/// The summary table: one line per site, role and state, then the totals.
fn print_summary(counts: &[BatchCount]) {
    println!(
        "  {:<20} {:<5} {:<12} {:>8} {:>10} {:>11}",
        "site", "role", "state", "batches", "files", "bytes"
    );
    for c in counts {
        let site = if c.site.is_empty() { "-" } else { &c.site };
        println!(
            "  {:<20} {:<5} {:<12} {:>8} {:>10} {:>11}",
            site,
            c.role.as_str(),
            c.state.as_str(),
            c.batches,
            c.files,
            human(c.bytes.max(0) as u64)
        );
    }
    let sum = |f: fn(&BatchCount) -> i64| counts.iter().map(f).sum::<i64>();
    println!(
        "  {:<39} {:>8} {:>10} {:>11}",
        "total",
        sum(|c| c.batches),
        sum(|c| c.files),
        human(sum(|c| c.bytes).max(0) as u64)
    );
}

/// One batch: its line, its stages, its site tasks, why it was refused or quarantined, and
/// its files.
fn print_batch(
    catalog: &Catalog,
    b: &BatchRow,
    stages: &[StageRow],
    files: &[FileRow],
) -> Result<()> {
    println!(
        "{:<5} {:<24} {:<12} {:>5} files {:>11}  {}  {}",
        b.role,
        if b.site.is_empty() {
            b.name.clone()
        } else {
            format!("{}/{}", b.site, b.name)
        },
        b.state,
        b.files,
        human(b.bytes.max(0) as u64),
        format_utc(b.updated_at),
        b.batch_key
    );
    for st in stages {
        let end = st.ended_at.map_or("running".to_string(), format_utc);
        let took = st
            .ended_at
            .map(|e| format!(" ({:.2} s)", (e - st.started_at) as f64 / 1e6))
            .unwrap_or_default();
        println!(
            "        stage {:<8} {} → {end}{took}",
            st.stage,
            format_utc(st.started_at)
        );
    }
    print_task_runs(&catalog.task_runs(Some(&b.batch_key))?);
    if matches!(b.state, BatchState::Quarantined | BatchState::Refused) {
        if let Some(why) = catalog.failures(Some(&b.batch_key), 1)?.first() {
            println!("        why: {}", why.error);
        }
    }
    print_excluded(catalog, files)?;
    for f in files.iter().filter(|f| f.state != FileState::Excluded) {
        println!(
            "        {:<12} {:>11}  {}",
            f.state,
            human(f.size.max(0) as u64),
            f.delivered_to.as_deref().unwrap_or(&f.path)
        );
    }
    Ok(())
}

/// The files of a batch the edge's filter left out, each with the rule or bound that did.
fn print_excluded(catalog: &Catalog, files: &[FileRow]) -> Result<()> {
    let excluded: Vec<&FileRow> = files
        .iter()
        .filter(|f| f.state == FileState::Excluded)
        .collect();
    if excluded.is_empty() {
        return Ok(());
    }
    let bytes: i64 = excluded.iter().map(|f| f.size.max(0)).sum();
    println!(
        "        excluded: {} files ({}), left out by the filter: never sent, never deleted",
        excluded.len(),
        human(bytes as u64)
    );
    for f in excluded {
        let lineage = catalog.lineage(&f.object_id)?;
        let why = lineage.iter().rev().find_map(|e| e.detail.as_deref());
        println!(
            "        {:<12} {:>11}  {}  ({})",
            f.state,
            human(f.size.max(0) as u64),
            f.path,
            why.unwrap_or("filter")
        );
    }
    Ok(())
}

/// One line per site task that ran on a batch: its tries by outcome, and the time they waited
/// for a slot and ran.
fn print_task_runs(runs: &[TaskRunRow]) {
    let mut tasks: Vec<&str> = Vec::new();
    for run in runs {
        if !tasks.contains(&run.task.as_str()) {
            tasks.push(&run.task);
        }
    }
    for task in tasks {
        let mine: Vec<&TaskRunRow> = runs.iter().filter(|r| r.task == task).collect();
        let mut outcomes: Vec<String> = Vec::new();
        for outcome in [
            TaskOutcome::Passed,
            TaskOutcome::Refused,
            TaskOutcome::Crashed,
            TaskOutcome::TimedOut,
            TaskOutcome::Changed,
        ] {
            let n = mine.iter().filter(|r| r.outcome == outcome).count();
            if n > 0 {
                outcomes.push(format!("{n} {outcome}"));
            }
        }
        let seconds =
            |f: fn(&TaskRunRow) -> i64| mine.iter().map(|r| f(r)).sum::<i64>() as f64 / 1e6;
        println!(
            "        task  {task:<14} {} tries ({}); waited {:.2} s, ran {:.2} s",
            mine.len(),
            outcomes.join(", "),
            seconds(|r| r.started_at - r.queued_at),
            seconds(|r| r.ended_at - r.started_at)
        );
    }
}

fn lineage(catalog: &Catalog, path: &str, json: bool) -> Result<()> {
    let files = files_named(catalog, path)?;
    if files.is_empty() {
        anyhow::bail!(
            "the catalogue {} knows no file at {path}: give its path in its batch (logs/can.csv), BATCH/PATH, or the path it was delivered to",
            catalog.url()
        );
    }
    let lineages: Vec<Lineage> = files
        .into_iter()
        .map(|file| {
            Ok(Lineage {
                batch: catalog
                    .batch(&file.batch_key)?
                    .map(|b| b.name)
                    .unwrap_or_default(),
                parts: catalog.parts(&file.object_id)?,
                events: catalog.lineage(&file.object_id)?,
                file,
            })
        })
        .collect::<Result<_>>()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&lineages)?);
        return Ok(());
    }
    lineages.iter().for_each(print_lineage);
    Ok(())
}

/// The files `path` names: a path in its batch, `BATCH/PATH`, or a delivered path (as
/// recorded, or as given relative to here).
fn files_named(catalog: &Catalog, path: &str) -> Result<Vec<FileRow>> {
    let files = catalog.files_at(path)?;
    if !files.is_empty() {
        return Ok(files);
    }
    let absolute = std::fs::canonicalize(path)
        .ok()
        .and_then(|p| p.to_str().map(str::to_owned));
    if let Some(absolute) = &absolute {
        let files = catalog.files_at(absolute)?;
        if !files.is_empty() {
            return Ok(files);
        }
    }
    // A delivered path is recorded under its destination (site/batch/path): the path as the
    // user copied it (dest/site/batch/path, or absolute) ends with it.
    let whole = absolute.as_deref().unwrap_or(path);
    let parts: Vec<&str> = whole.split('/').collect();
    for start in 1..parts.len() {
        let tail = parts[start..].join("/");
        let files: Vec<FileRow> = catalog
            .files_at(&tail)?
            .into_iter()
            .filter(|f| f.delivered_to.as_deref() == Some(tail.as_str()))
            .collect();
        if !files.is_empty() {
            return Ok(files);
        }
    }
    let Some((batch, in_batch)) = path.split_once('/') else {
        return Ok(vec![]);
    };
    let named = Filter {
        batch: Some(batch.to_string()),
        ..Filter::default()
    };
    let keys: std::collections::HashSet<_> = catalog
        .batches_matching(&named)?
        .into_iter()
        .map(|b| b.batch_key)
        .collect();
    Ok(catalog
        .files_at(in_batch)?
        .into_iter()
        .filter(|f| keys.contains(&f.batch_key))
        .collect())
}

/// A file: its batch, object, size, state, hash, bundle and delivered path, then its events.
fn print_lineage(l: &Lineage) {
    let f = &l.file;
    println!(
        "batch {}: {} (object {}, {}), now {}",
        l.batch,
        f.path,
        f.object_id,
        human(f.size.max(0) as u64),
        f.state
    );
    if let Some(sha) = &f.raw_sha256 {
        println!("  sha256 {sha}");
    }
    if let Some(bundle) = &f.carrier {
        println!("  travels in bundle {bundle}");
    }
    if let Some(to) = &f.delivered_to {
        println!("  delivered to {to}");
    }
    for e in &l.events {
        let part = e.part.map(|p| format!(" part {p}")).unwrap_or_default();
        let detail = e
            .detail
            .as_deref()
            .map(|d| format!(": {d}"))
            .unwrap_or_default();
        println!("  {}  {}{part}{detail}", format_utc(e.at), e.state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forte_catalog::{BatchKey, BatchRecord};

    /// The summary counts every batch of the window, by site and state; the detail shows the
    /// latest up to the limit; a site, a name or a bound narrows both.
    #[test]
    fn the_overview_counts_its_window_and_details_the_latest() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path().join("c.sqlite").to_str().unwrap()).unwrap();
        let batches = [
            ("a", "run-1", BatchState::Delivered),
            ("a", "run-2", BatchState::Delivered),
            ("b", "run-1", BatchState::Failed),
        ];
        for (site, name, state) in batches {
            let key = BatchKey::core(site, format!("{site}{name}"));
            let record = BatchRecord {
                key: &key,
                name,
                files: 2,
                bytes: 10,
                state,
                arrived: None,
                detail: None,
            };
            catalog.batch_state(&record).unwrap();
        }
        let all = Window {
            since: Some(0),
            limit: 2,
            ..Window::default()
        };
        let overview = Overview::read(&catalog, &all).unwrap();
        let summary: Vec<_> = overview
            .summary
            .iter()
            .map(|c| (c.site.as_str(), c.state, c.batches, c.files))
            .collect();
        assert_eq!(
            summary,
            [
                ("a", BatchState::Delivered, 2, 4),
                ("b", BatchState::Failed, 1, 2)
            ]
        );
        assert_eq!((overview.matched, overview.batches.len()), (3, 2));
        // The latest change first: b's run-1 was recorded last.
        assert_eq!(overview.batches[0].batch.site, "b");

        let of_a = Window {
            site: Some("a".into()),
            ..all.clone()
        };
        assert_eq!(Overview::read(&catalog, &of_a).unwrap().matched, 2);
        let named = Window {
            batch: Some("run-1".into()),
            since: None,
            ..all.clone()
        };
        let named = Overview::read(&catalog, &named).unwrap();
        assert_eq!(named.matched, 2);
        assert!(named.batches.iter().all(|b| b.batch.name == "run-1"));
        let later = Window {
            since: Some(forte_catalog::now_us() + 1_000_000),
            ..all.clone()
        };
        let later = Overview::read(&catalog, &later).unwrap();
        assert_eq!((later.matched, later.batches.len()), (0, 0));
        let earlier = Window {
            until: Some(1),
            ..all
        };
        assert_eq!(Overview::read(&catalog, &earlier).unwrap().matched, 0);
    }
}
