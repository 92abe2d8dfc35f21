//! `forte man DIR` (hidden): the manual pages, generated from the CLI definition
//! (clap_mangen): `forte.1` and one `forte-SUB.1` per visible subcommand (nested ones as
//! `forte-bench-compress.1`). `dist/release.sh` runs it to put them in the .deb.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap_mangen::Man;

#[derive(clap::Args)]
pub struct Args {
    /// Directory to write the pages into (created if missing) [per run].
    #[arg(value_name = "DIR")]
    dir: PathBuf,
}

/// `cli` is the whole CLI (`Cli::command()`), handed over by main.rs.
pub fn run(args: Args, cli: clap::Command) -> Result<bool> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let mut cli = cli.disable_help_subcommand(true);
    // Building names each subcommand `forte-SUB` (its page) and `forte SUB` (its synopsis).
    cli.build();
    let source = format!("forte {}", cli.get_version().unwrap_or_default());
    let written = write_pages(&cli, &args.dir, &source)
        .with_context(|| format!("writing the manual pages into {}", args.dir.display()))?;
    eprintln!("{written} manual pages in {}", args.dir.display());
    Ok(true)
}

/// The page of `cmd` and of each of its visible subcommands, recursively; how many.
fn write_pages(cmd: &clap::Command, dir: &Path, source: &str) -> std::io::Result<usize> {
    let mut written = 0;
    for sub in cmd.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        written += write_pages(sub, dir, source)?;
    }
    Man::new(cmd.clone())
        .source(source)
        .manual("forte manual")
        .generate_to(dir)?;
    Ok(written + 1)
}
