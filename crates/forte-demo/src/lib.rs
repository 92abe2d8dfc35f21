//! `forte demo`: the whole path on generated sample data, narrated: offline pack/unpack, then
//! the running binary as relay, sender and puller on loopback.
//!
//! The modules: `offline` (keys, sample data, pack, unpack, compare), `network` (the inbox, a
//! relay started from the running binary, send, pull, compare), `data` (the generated sample
//! data and the digest of a tree that compares it).

mod data;
mod network;
mod offline;

use std::path::Path;

use anyhow::{bail, Context, Result};
use forte_format::keys::generate;

/// The file that marks a directory as made by the demo, so that a second run may replace it.
const MARKER: &str = ".forte-demo";

/// Runs the whole demo in `root` (replaced if an earlier demo made it), saying each step on
/// stdout. The network steps run the current executable, which must be `forte`.
pub fn run(root: &Path) -> Result<bool> {
    fresh_demo_dir(root)?;
    let keys = root.join("keys");
    println!(
        "1. keygen: core age key pair and edge Ed25519 key pair in {}",
        keys.display()
    );
    let paths = generate(&keys)?;
    offline::offline(root, &paths)?;
    network::network(root, &paths)
}

/// Makes `root` empty, refusing a directory that an earlier demo did not make.
fn fresh_demo_dir(root: &Path) -> Result<()> {
    if root.exists() {
        if !root.join(MARKER).exists() {
            bail!(
                "{} exists and was not made by `forte demo`; choose another --dir",
                root.display()
            );
        }
        std::fs::remove_dir_all(root)
            .with_context(|| format!("cannot clear {}", root.display()))?;
    }
    std::fs::create_dir_all(root).with_context(|| format!("cannot create {}", root.display()))?;
    std::fs::write(root.join(MARKER), "made by forte demo\n")?;
    Ok(())
}
