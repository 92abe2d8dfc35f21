//! `forte completions SHELL`: the shell's completion script for every subcommand and flag,
//! generated from the CLI definition (clap_complete), on stdout. The .deb installs the bash,
//! zsh and fish scripts (`dist/release.sh`); anyone else loads one with, for example,
//! `source <(forte completions bash)`.

use anyhow::Result;
use clap_complete::Shell;

#[derive(clap::Args)]
pub struct Args {
    /// The shell to complete for [per run].
    #[arg(value_enum)]
    shell: Shell,
}

/// `cli` is the whole CLI (`Cli::command()`), handed over by main.rs.
pub fn run(args: Args, mut cli: clap::Command) -> Result<bool> {
    clap_complete::generate(args.shell, &mut cli, "forte", &mut std::io::stdout());
    Ok(true)
}
