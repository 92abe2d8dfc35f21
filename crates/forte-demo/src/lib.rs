//! `forte demo`: the whole path on generated sample data, narrated: offline pack/unpack, then
//! the running binary as relay, sender and puller on loopback, then the catalogue and the KPIs.
//! Every step is a `forte` command, printed as a user would type it and then run.
//!
//! The modules: `shell` (printing and running a command), `offline` (keys, sample data, pack,
//! unpack, compare), `network` (tokens, a relay, send, pull, compare, status, report), `data`
//! (the generated sample data and the digest of a tree that compares it).

mod data;
mod network;
mod offline;
mod shell;

use std::path::Path;

use anyhow::{bail, Context, Result};

/// The file that marks a directory as made by the demo, so that a second run may replace it.
const MARKER: &str = ".forte-demo";

/// The demo's edge site.
const SITE: &str = "demo-site";

/// Runs the whole demo in `root` (replaced if an earlier demo made it), saying each step on
/// stdout with the command that does it. The steps run the current executable, which must be
/// `forte`.
pub fn run(root: &Path) -> Result<bool> {
    let root = shell::from_here(root);
    fresh_demo_dir(&root)?;
    let forte = shell::Forte::new()?;
    let keys = offline::offline(&forte, &root)?;
    network::network(&forte, &root, &keys)?;
    println!(
        "what next: docs/install.md sets this up for real, one role per machine (edge, DMZ relay, core): \
         which keys and tokens go where, the firewall, systemd units and configuration files; \
         `forte <command> --help` documents every flag"
    );
    Ok(true)
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
