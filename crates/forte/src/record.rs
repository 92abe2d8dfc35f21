//! Writing to the catalogue from the transfer paths.
//!
//! A catalogue write that fails is reported on stderr and the transfer goes on: losing a
//! record is bad, but stopping the data (and so risking the data) for it would be worse. The
//! data's own safety never depends on the catalogue: the relay deletes only on acknowledgement,
//! and every byte is verified against the signed manifest.

use std::path::PathBuf;

use anyhow::Result;
pub use forte_catalog::Catalog;

/// Opens the catalogue the user named, or the default SQLite file.
pub fn open(url: Option<String>) -> Result<Catalog> {
    let url = url.unwrap_or_else(|| default_path().display().to_string());
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
    task: &str,
    batch_key: &str,
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
        batch_key,
        object_id: Some(&object),
        part,
        started_at,
        ended_at: forte_catalog::now_us(),
        error: error.as_deref(),
    };
    note("an attempt", catalog.attempt(&record));
    result
}
