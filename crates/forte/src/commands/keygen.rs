use std::path::PathBuf;

use anyhow::Result;
use forte_format::keys::{edge_key_id, generate};
use forte_format::{EdgeKey, Recipients};

#[derive(clap::Args)]
pub struct Args {
    /// Directory to write core.key, core.pub, edge.key and edge.pub into.
    #[arg(long, value_name = "KEYS")]
    dir: PathBuf,
}

pub fn run(args: Args) -> Result<bool> {
    let paths = generate(&args.dir)?;
    let recipient = Recipients::load(&paths.core_pub)?;
    let edge = EdgeKey::load(&paths.edge_key)?;
    println!(
        "core identity  {}  (secret: keep it at the core only)",
        paths.core_key.display()
    );
    println!(
        "core recipient {}  {}",
        paths.core_pub.display(),
        recipient.0[0]
    );
    println!(
        "edge key       {}  (secret: keep it at the edge only)",
        paths.edge_key.display()
    );
    println!(
        "edge public    {}  {}",
        paths.edge_pub.display(),
        edge_key_id(&edge.0.verifying_key())
    );
    Ok(true)
}
