//! Writing to the catalogue from the transfer paths.
//!
//! A catalogue write that fails is reported on stderr and the transfer goes on: losing a
//! record is bad, but stopping the data (and so risking the data) for it would be worse. The
//! data's own safety never depends on the catalogue: the relay deletes only on acknowledgement,
//! and every byte is verified against the signed manifest.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
pub use forte_catalog::Catalog;
use forte_catalog::{BatchKey, Role, Task};

/// Opens the catalogue the user named, or the default SQLite file.
pub fn open(url: Option<String>) -> Result<Catalog> {
    let url = match url {
        Some(url) if url.trim().is_empty() => bail!(
            "--catalog is empty: give a file (catalog.sqlite) or a postgres:// URL, or leave it out for {}",
            default_path().display()
        ),
        Some(url) => url,
        // The default location is made on first use; a path the user gave must exist.
        None => {
            let path = default_path();
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).with_context(|| {
                    format!("cannot create the catalogue's directory {}", dir.display())
                })?;
            }
            path.display().to_string()
        }
    };
    Catalog::open(&url)
}

fn default_path() -> PathBuf {
    match std::env::var_os("HOME") {
        Some(home) => PathBuf::from(home).join(".local/state/forte/catalog.sqlite"),
        None => PathBuf::from("forte-catalog.sqlite"),
    }
}

/// Reports a failed catalogue write and carries on.
pub fn note(what: &str, result: Result<()>) {
    if let Err(e) = result {
        eprintln!("warning: catalogue: cannot record {what}: {e:#}");
    }
}

/// Runs one try of a task on an object, recording it (with its error, if any) in the catalogue.
pub fn attempt<T, E: std::fmt::Display>(
    catalog: &Catalog,
    task: Task,
    batch: &BatchKey,
    object: forte_format::ObjectId,
    part: Option<u32>,
    op: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    let started_at = forte_catalog::now_us();
    let result = op();
    let error = result.as_ref().err().map(ToString::to_string);
    let object = object.to_string();
    let record = forte_catalog::Attempt {
        task,
        batch,
        object_id: Some(&object),
        part,
        started_at,
        ended_at: forte_catalog::now_us(),
        error: error.as_deref(),
    };
    note("an attempt", catalog.attempt(&record));
    result
}

/// This machine in a role, as the catalogue names it: `role@host`.
pub fn node(role: Role) -> String {
    format!("{role}@{}", forte_usage::host_name())
}

/// Samples this machine's utilisation once a second into the catalogue while the returned
/// sampler lives (FORTE's 1 Hz CPU, memory, disk and network measurements), as `role@host`.
pub fn sample_usage(catalog: &Catalog, role: Role) -> Option<forte_usage::Sampler> {
    let node = node(role);
    let recorder = catalog.usage_recorder()?;
    let record = move |s: forte_usage::Sample| {
        recorder.record(forte_catalog::UsageRow {
            node: node.clone(),
            at: forte_catalog::now_us(),
            seconds: s.seconds,
            cpu_percent: s.cpu_percent,
            memory_used: s.memory_used_bytes as i64,
            disk_read_bps: s.disk_read_bytes_per_sec,
            disk_write_bps: s.disk_write_bytes_per_sec,
            net_rx_bps: s.net_rx_bytes_per_sec,
            net_tx_bps: s.net_tx_bytes_per_sec,
            own_cpu_percent: s.own_cpu_percent,
            own_memory: s.own_memory_bytes as i64,
            item_latency: crate::monitor::item_latency(role),
        })
    };
    match forte_usage::Sampler::start(std::time::Duration::from_secs(1), record) {
        Ok(sampler) => Some(sampler),
        Err(e) => {
            eprintln!("warning: no utilisation samples: {e:#}");
            None
        }
    }
}
