//! One module per subcommand. Each `run` returns `Ok(true)` on full success, `Ok(false)` when
//! it finished but some items failed (already reported), and `Err` when it could not run.

pub mod demo;
pub mod keygen;
pub mod pack;
pub mod pull;
pub mod relay;
pub mod send;
pub mod status;
pub mod unpack;

/// Output flags shared by the long-running commands.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct Output {
    /// Print a JSON summary on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

/// `n` in MB/s over `seconds`, in decimal megabytes as storage and links are quoted.
pub fn mb_per_s(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / 1e6 / seconds
    } else {
        0.0
    }
}

/// Raw bytes per compressed byte.
pub fn ratio(raw: u64, compressed: u64) -> f64 {
    if compressed > 0 {
        raw as f64 / compressed as f64
    } else {
        1.0
    }
}
