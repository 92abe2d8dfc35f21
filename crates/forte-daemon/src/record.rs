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

/// What a command does with its catalogue: it decides the default file, and whether a file
/// that is not there may be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// `send`: writes the edge's records (default `edge.sqlite`).
    Edge,
    /// `pull`: writes the core's records (default `core.sqlite`).
    Core,
    /// `status`, `report`, `receipts`, `dashboard`: read what `send` or `pull` wrote, and so
    /// never make a catalogue (a mistyped path would otherwise show an empty one).
    Read,
}

/// Opens the catalogue the user named, or the default file of this use: each role on a host
/// its own (`~/.local/state/forte/edge.sqlite`, `core.sqlite`), so an edge and a core on one
/// machine do not share one by accident.
pub fn open(url: Option<String>, usage: Use) -> Result<Catalog> {
    let url = match url {
        Some(url) if url.trim().is_empty() => bail!(
            "--catalog is empty: give a file (catalog.sqlite) or a postgres:// URL, or leave it out for the default in {}",
            state_dir().display()
        ),
        Some(url) if usage == Use::Read && forte_catalog::sqlite_path(&url).is_some_and(|p| !p.exists()) => bail!(
            "no catalogue at {url}: status, report, receipts and dashboard read the catalogue send or pull keeps (--catalog or `catalog` in the config file); check the path"
        ),
        Some(url) => url,
        None => default_path(usage)?.display().to_string(),
    };
    Catalog::open(&url)
}

/// Opens, to read only, the catalogue a command of this use would write (a dry run): `None`
/// when it does not exist, as nothing was recorded yet. Creates nothing, not even the default
/// catalogue's directory ([`Catalog::open_read_only`]).
pub fn open_read_only(url: Option<String>, usage: Use) -> Result<Option<Catalog>> {
    let url = match url {
        Some(url) if url.trim().is_empty() => bail!("--catalog is empty"),
        Some(url) => url,
        None => {
            let dir = state_dir();
            let name = match usage {
                Use::Core => "core.sqlite",
                Use::Edge | Use::Read => "edge.sqlite",
            };
            match [dir.join(name), dir.join("catalog.sqlite")]
                .into_iter()
                .find(|p| p.exists())
            {
                Some(path) => path.display().to_string(),
                None => return Ok(None),
            }
        }
    };
    Catalog::open_read_only(&url)
}

/// The default catalogue of a use; for a reader, the one a writer on this host made.
fn default_path(usage: Use) -> Result<PathBuf> {
    let dir = state_dir();
    // Before catalogues were per role every command shared this one: keep using it.
    let shared = dir.join("catalog.sqlite");
    let own = |name: &str| {
        let path = dir.join(name);
        if !path.exists() && shared.exists() {
            return Ok(shared.clone());
        }
        std::fs::create_dir_all(&dir).with_context(|| {
            format!("cannot create the catalogue's directory {}", dir.display())
        })?;
        Ok(path)
    };
    match usage {
        Use::Edge => own("edge.sqlite"),
        Use::Core => own("core.sqlite"),
        Use::Read => {
            let found: Vec<PathBuf> = ["edge.sqlite", "core.sqlite", "catalog.sqlite"]
                .iter()
                .map(|name| dir.join(name))
                .filter(|p| p.exists())
                .collect();
            match found.as_slice() {
                [one] => Ok(one.clone()),
                [] => bail!(
                    "no catalogue in {}: send and pull make theirs there on their first run; give --catalog for one elsewhere",
                    dir.display()
                ),
                several => bail!(
                    "{} catalogues in {}: give --catalog {} (or another)",
                    several.len(),
                    dir.display(),
                    several[0].display()
                ),
            }
        }
    }
}

/// Where the default catalogues live: `$XDG_STATE_HOME/forte`, else `~/.local/state/forte`.
fn state_dir() -> PathBuf {
    let xdg = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty());
    match (xdg, std::env::var_os("HOME")) {
        (Some(state), _) => PathBuf::from(state).join("forte"),
        (None, Some(home)) => PathBuf::from(home).join(".local/state/forte"),
        (None, None) => PathBuf::from("."),
    }
}

/// Reports a failed catalogue write and carries on.
pub fn note(what: &str, result: Result<()>) {
    if let Err(e) = result {
        tracing::warn!("catalogue: cannot record {what}: {e:#}");
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
            tracing::warn!("no utilisation samples: {e:#}");
            None
        }
    }
}
