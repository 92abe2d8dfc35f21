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
