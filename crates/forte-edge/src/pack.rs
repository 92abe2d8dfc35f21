//! `pack`: a tree packed into a directory of sealed objects with a signed inventory, offline.
//! The network path (`send`) streams the same objects through the relay instead; `unpack`
//! (forte-core) restores such a directory.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime};

use anyhow::{bail, Context, Result};
use forte_daemon::progress::prepare_with_progress;
use forte_daemon::settings::EdgeSettings;
use forte_daemon::units::{mb_per_s, ratio};
use forte_format::{Inventory, Kind, ObjectId};
use forte_pipeline::Reading;
use forte_prepare::{
    bundle_small, discover, DirSink, Discovery, Excluded, FileOutcome, Filter, Prepare, PrepareJob,
};
use serde::Serialize;

/// What a pack did; `pack --json` prints it.
#[derive(Serialize)]
pub struct Summary {
    pub command: &'static str,
    /// Regular files, and empty directories, each one object.
    pub files: usize,
    pub directories: usize,
    pub failed: usize,
    /// Objects written: one per file or directory, or per bundle of small files.
    pub stored_objects: usize,
    pub bundles: usize,
    pub raw_bytes: u64,
    pub compressed_bytes: u64,
    pub sealed_bytes: u64,
    pub ratio: f64,
    pub seconds: f64,
    pub raw_mb_per_s: f64,
    pub cpu: usize,
    pub part_size: u64,
    pub level: i32,
    #[serde(flatten)]
    pub pipeline: Reading,
    pub rejected: Vec<Rejected>,
    /// Files the filter left out, with the rule or bound that did.
    pub excluded: Vec<Excluded>,
    pub objects: Vec<FileOutcome>,
}

#[derive(Serialize)]
pub struct Rejected {
    pub path: PathBuf,
    pub reason: String,
}

/// Discovers and packs `src` into the new archive directory `to`, refusing an output inside
/// the source or already in use.
pub fn pack(
    src: &Path,
    to: &Path,
    batch: &str,
    edge: EdgeSettings,
    quiet: bool,
) -> Result<Summary> {
    refuse_output_inside_source(src, to)?;
    refuse_used_output(to)?;
    let EdgeSettings {
        recipients,
        key,
        prepare: settings,
        bundle,
        filter,
    } = edge;
    let (found, excluded) = discover_filtered(src, &filter)?;
    let total = found.total_bytes();
    let sink = DirSink::create(to)?;
    let (cpu, part_size, level) = (settings.cpu, settings.part_size, settings.level);
    let prepare = Prepare::new(settings, &recipients, &key);
    let started = Instant::now();
    let files = found.files.len();
    let jobs: Vec<PrepareJob> = found
        .files
        .into_iter()
        .map(|source| PrepareJob::new(source, ObjectId::random(), batch))
        .collect();
    let jobs = bundle_small(jobs, bundle, &|_| ObjectId::random());
    let outcomes = prepare_with_progress(&prepare, files, total, quiet, None, || {
        prepare.run(jobs, &sink)
    });
    // The inventory lists exactly the objects stored: those of failed files were removed.
    // An archive names no site: it is restored by whoever holds it, not filed by a relay.
    let instance = forte_format::Instance::new("", 0, forte_catalog::now_us());
    let entries = outcomes
        .iter()
        .filter_map(|o| o.inventory_entry())
        .collect();
    let inventory = Inventory::new(batch, instance, entries);
    sink.put_inventory(&inventory.seal(&key, &recipients))?;
    sink.finish()?;
    let seconds = started.elapsed().as_secs_f64();
    // Each stored object once, and whether it is a bundle (its files have ids of their own).
    let stored: std::collections::BTreeSet<(ObjectId, bool)> = outcomes
        .iter()
        .filter(|o| o.error.is_none())
        .map(|o| (o.object, o.object != o.id))
        .collect();
    let t = &prepare.totals;
    let raw_bytes = t.raw_bytes.load(Ordering::Relaxed);
    let compressed_bytes = t.compressed_bytes.load(Ordering::Relaxed);
    Ok(Summary {
        command: "pack",
        files: outcomes.iter().filter(|o| o.kind == Kind::File).count(),
        directories: outcomes.iter().filter(|o| o.kind == Kind::Dir).count(),
        failed: outcomes.iter().filter(|o| o.error.is_some()).count(),
        stored_objects: stored.len(),
        bundles: stored.iter().filter(|&&(_, bundled)| bundled).count(),
        raw_bytes,
        compressed_bytes,
        sealed_bytes: t.sealed_bytes.load(Ordering::Relaxed),
        ratio: ratio(raw_bytes, compressed_bytes),
        seconds,
        raw_mb_per_s: mb_per_s(raw_bytes, seconds),
        cpu,
        part_size,
        level,
        pipeline: prepare.pipeline.reading(),
        rejected: found
            .rejected
            .into_iter()
            .map(|(path, reason)| Rejected { path, reason })
            .collect(),
        excluded,
        objects: outcomes,
    })
}

/// The files of `src` the filter takes, and those it leaves out (paths relative to `src`).
fn discover_filtered(src: &Path, filter: &Filter) -> Result<(Discovery, Vec<Excluded>)> {
    let mut found = discover(src)?;
    let excluded = filter.apply(&mut found, "", SystemTime::now());
    Ok((found, excluded))
}

/// An archive is one directory: its inventory lists exactly the objects in it, so objects of
/// an earlier pack in the same directory would make it unrestorable.
fn refuse_used_output(to: &Path) -> Result<()> {
    let used = match std::fs::read_dir(to) {
        Ok(mut entries) => entries.next().is_some(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(e).with_context(|| format!("cannot read output {}", to.display())),
    };
    if used {
        bail!(
            "output {} is not empty: each archive needs a directory of its own (its signed inventory lists exactly the objects in it); choose a new or empty directory",
            to.display()
        );
    }
    Ok(())
}

fn refuse_output_inside_source(src: &Path, to: &Path) -> Result<()> {
    let src = src
        .canonicalize()
        .with_context(|| format!("cannot read source {}", src.display()))?;
    let mut probe = to.to_path_buf();
    // The output may not exist yet: check its nearest existing ancestor.
    while !probe.exists() {
        if !probe.pop() {
            return Ok(());
        }
    }
    let to_real = probe
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", to.display()))?;
    if to_real.starts_with(&src) && src.is_dir() {
        bail!(
            "output {} is inside the source {}; choose an output directory outside it",
            to.display(),
            src.display()
        );
    }
    Ok(())
}
