//! `forte pack`: a file or a tree sealed into a directory of objects (an archive), offline.

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::Output;
use forte_daemon::settings::{self, Config, EdgeFlags};
use forte_daemon::units::human;
use forte_edge::pack::{pack, Summary};

#[derive(clap::Args)]
pub struct Args {
    /// A file or a directory tree to pack [per run].
    src: PathBuf,
    /// Output directory: one `<object-id>/` directory per file [per run].
    #[arg(long, value_name = "DIR")]
    to: PathBuf,
    #[command(flatten)]
    edge: EdgeFlags,
    /// Batch name recorded in every manifest [per run].
    #[arg(long, default_value = "")]
    batch: String,
    /// Print what would be packed (the files after the filters, and what they leave out and
    /// why) and write nothing [per run].
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    output: Output,
}

pub fn run(args: Args, config: &Config) -> Result<bool> {
    if args.dry_run {
        let plan = forte_edge::dry_run::plan(&args.src, "", &args.edge.filter(config)?)?;
        match args.output.json {
            true => println!("{}", serde_json::to_string_pretty(&plan)?),
            false => println!("{}dry run: nothing was written", plan.text("")),
        }
        return Ok(true);
    }
    let edge = settings::edge(&args.edge, config)?;
    let summary = pack(&args.src, &args.to, &args.batch, edge, args.output.quiet)?;
    report(&summary, &args.to, args.output.json)?;
    Ok(summary.failed == 0)
}

fn report(s: &Summary, to: &Path, json: bool) -> Result<()> {
    for r in &s.rejected {
        tracing::warn!("skipped {}: {}", r.path.display(), r.reason);
    }
    for o in s.objects.iter().filter(|o| o.error.is_some()) {
        tracing::warn!(
            "failed {}: {}",
            o.path,
            o.error.as_deref().unwrap_or_default()
        );
    }
    if json {
        println!("{}", serde_json::to_string_pretty(s)?);
        return Ok(());
    }
    println!(
        "packed {} of {} ({} files, {} empty directories; {}) into {} objects ({} bundles of small files) in {} in {:.2} s: {:.1} MB/s, ratio {:.2}, {} sealed",
        s.files + s.directories - s.failed,
        s.files + s.directories,
        s.files,
        s.directories,
        human(s.raw_bytes),
        s.stored_objects,
        s.bundles,
        to.display(),
        s.seconds,
        s.raw_mb_per_s,
        s.ratio,
        human(s.sealed_bytes),
    );
    if s.failed > 0 {
        tracing::warn!("{} file(s) failed; their objects were removed", s.failed);
    }
    Ok(())
}
