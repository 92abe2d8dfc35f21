use std::path::PathBuf;

use anyhow::Result;
use forte_format::keys::{edge_key_id, generate};
use forte_format::{EdgeKey, Recipients};

#[derive(clap::Args)]
pub struct Args {
    /// Directory to write core.key, core.pub (the core's age pair), edge.key, edge.pub (an
    /// edge's signing pair) and receipt.key, receipt.pub (the core's receipt-signing pair) into [per run].
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
    let receipts = EdgeKey::load(&paths.receipt_key)?;
    println!(
        "receipt key    {}  (secret: the core signs custody receipts with it; pull --receipt-key)",
        paths.receipt_key.display()
    );
    println!(
        "receipt public {}  {}  (send --receipt-pub: deletes sources only under its receipts)",
        paths.receipt_pub.display(),
        edge_key_id(&receipts.0.verifying_key())
    );
    Ok(true)
}
