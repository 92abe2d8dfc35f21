//! `forte keygen`: the key pairs of one role. `--core` on the core (its age pair, which edges
//! encrypt to, and its receipt-signing pair, which edges check before deleting); `--edge SITE`
//! on an edge (its signing pair, which the core trusts for that site). Without either, all
//! of them in one directory, for a trial on one machine.

use std::path::{Path, PathBuf};

use anyhow::Result;
use forte_format::keys::{edge_key_id, generate_set, Generated, KeySet};
use forte_format::{EdgeKey, Recipients};

#[derive(clap::Args)]
pub struct Args {
    /// Directory to write the keys into; existing key files are never overwritten [per run].
    #[arg(long, value_name = "KEYS")]
    dir: PathBuf,
    /// The core's keys: core.key, core.pub (age: edges encrypt to core.pub) and receipt.key,
    /// receipt.pub (custody receipts: edges delete only under them) [per run].
    #[arg(long, conflicts_with = "edge")]
    core: bool,
    /// One edge's signing pair, SITE.key and SITE.pub: the core trusts SITE.pub for SITE only
    /// (--trust SITE=SITE.pub) [per run].
    #[arg(long, value_name = "SITE", value_parser = site_name)]
    edge: Option<String>,
}

/// A site's name as the relay's tokens file and its paths allow it.
pub fn site_name(text: &str) -> Result<String, String> {
    match forte_relay::api::valid_site(text) {
        true => Ok(text.to_owned()),
        false => Err(format!("{text:?} is not a site name: 1 to 64 letters, digits, '.', '-' or '_', not starting with '.'")),
    }
}

pub fn run(args: Args) -> Result<bool> {
    let set = match (args.core, args.edge) {
        (true, _) => KeySet::Core,
        (false, Some(site)) => KeySet::Edge { site },
        (false, None) => KeySet::All,
    };
    let made = generate_set(&args.dir, &set)?;
    print_made(&made, &set)?;
    Ok(true)
}

fn print_made(made: &Generated, set: &KeySet) -> Result<()> {
    if let Some((key, public)) = &made.core {
        let recipient = Recipients::load(public)?;
        println!(
            "core identity  {}  (secret: the core's only; pull --identity)",
            key.display()
        );
        println!(
            "core recipient {}  {}  (every edge: send --recipient)",
            public.display(),
            recipient.0[0]
        );
    }
    if let Some((key, public)) = &made.receipt {
        println!(
            "receipt key    {}  (secret: the core's only; pull --receipt-key)",
            key.display()
        );
        println!("receipt public {}  {}  (every edge: send --receipt-pub, to delete only under the core's receipts)", public.display(), key_id(key)?);
    }
    if let Some((key, public)) = &made.edge {
        let site = match set {
            KeySet::Edge { site } => site.as_str(),
            _ => "SITE",
        };
        println!(
            "edge key       {}  (secret: this edge's only; send --sign)",
            key.display()
        );
        println!(
            "edge public    {}  {}  (the core: --trust {site}={})",
            public.display(),
            key_id(key)?,
            public.display()
        );
    }
    Ok(())
}

/// The short id of a signing key, as the core logs it.
fn key_id(secret: &Path) -> Result<String> {
    Ok(edge_key_id(&EdgeKey::load(secret)?.0.verifying_key()))
}
