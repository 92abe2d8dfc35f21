//! One module per subcommand. Each `run` returns `Ok(true)` on full success, `Ok(false)` when
//! it finished but some items failed (already reported), and `Err` when it could not run.

pub mod bench;
pub mod completions;
pub mod config;
pub mod dashboard;
pub mod demo;
pub mod ingest;
pub mod keygen;
pub mod man;
pub mod pack;
pub mod pull;
pub mod receipts;
pub mod relay;
pub mod relay_store;
pub mod report;
pub mod send;
pub mod status;
pub mod token;
pub mod unpack;

/// Output flags shared by the long-running commands.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct Output {
    /// Print a JSON summary on stdout instead of text [per run].
    #[arg(long)]
    pub json: bool,
    /// No progress bar [per run].
    #[arg(long, short)]
    pub quiet: bool,
}

/// Prints `value` as JSON with `--json`, else `text`.
pub fn print_as(
    json: bool,
    value: &impl serde::Serialize,
    text: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    match json {
        true => println!("{}", serde_json::to_string_pretty(value)?),
        false => print!("{}", text()),
    }
    Ok(())
}
