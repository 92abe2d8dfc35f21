//! `forte status`'s work: what a catalogue knows, printed as text or JSON. The overview of its
//! batches (stages, site tasks, files, recent failures), its utilisation samples, or one
//! file's lineage.

use anyhow::Result;
use forte_catalog::{
    format_utc, BatchRow, BatchState, Catalog, Event, FileRow, FileState, PartRow, StageRow,
    TaskOutcome, TaskRunRow,
};
use serde::Serialize;

use crate::human;

/// What `forte status` shows.
pub enum View<'a> {
    /// Every batch with its stages, tasks and files, then the recent failures.
    Overview,
    /// The resource utilisation samples.
    Usage,
    /// One file's lineage: a path in its batch, or its delivered path.
    Lineage(&'a str),
}

/// Prints `view` of `catalog`, as JSON when `json`.
pub fn show(catalog: &Catalog, view: View, json: bool) -> Result<()> {
    match view {
        View::Lineage(path) => lineage(catalog, path, json),
        View::Usage => usage(catalog, json),
        View::Overview if json => overview_json(catalog),
        View::Overview => overview_text(catalog),
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

fn usage(catalog: &Catalog, json: bool) -> Result<()> {
    let rows = catalog.usage_of(None, 0)?;
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

fn overview_json(catalog: &Catalog) -> Result<()> {
    #[derive(Serialize)]
    // The shape of the API's one batch (docs/api.md): the batch's row under `batch`, so that
    // its count of files and the list of them are not both `files`.
    struct Batch {
        batch: BatchRow,
        stages: Vec<StageRow>,
        files: Vec<FileRow>,
    }
    let full: Vec<Batch> = catalog
        .batches()?
        .into_iter()
        .map(|b| {
            Ok(Batch {
                stages: catalog.stages(&b.batch_key)?,
                files: catalog.files(&b.batch_key)?,
                batch: b,
            })
        })
        .collect::<Result<_>>()?;
    println!("{}", serde_json::to_string_pretty(&full)?);
    Ok(())
}

fn overview_text(catalog: &Catalog) -> Result<()> {
    let batches = catalog.batches()?;
    println!("catalogue {}", catalog.url());
    if batches.is_empty() {
        println!("no batches yet");
    }
    for b in &batches {
        print_batch(catalog, b)?;
    }
    let failures = catalog.failures(None, 10)?;
    if !failures.is_empty() {
        println!("recent failures:");
        for a in failures {
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

/// One batch: its line, its stages, its site tasks, why it was refused or quarantined, and
/// its files.
fn print_batch(catalog: &Catalog, b: &BatchRow) -> Result<()> {
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
    for st in catalog.stages(&b.batch_key)? {
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
    let files = catalog.files(&b.batch_key)?;
    print_excluded(catalog, &files)?;
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
    let names: std::collections::HashMap<_, _> = catalog
        .batches()?
        .into_iter()
        .map(|b| (b.batch_key, b.name))
        .collect();
    let files = files_named(catalog, path, &names)?;
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
                batch: names.get(&file.batch_key).cloned().unwrap_or_default(),
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
fn files_named(
    catalog: &Catalog,
    path: &str,
    names: &std::collections::HashMap<forte_catalog::BatchKey, String>,
) -> Result<Vec<FileRow>> {
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
    Ok(catalog
        .files_at(in_batch)?
        .into_iter()
        .filter(|f| names.get(&f.batch_key).is_some_and(|n| n == batch))
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
